"""``weir savepoint create`` and ``weir dead-letters``: the life-cycle commands around a
running job — a savepoint of a location's current state, and the records a job set
aside (either runtime's dead letters, :func:`weir.read_dead_letters`)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from weir.cli.common import print_json, transfer_progress

__all__ = ["dead_letters", "savepoint_app"]

savepoint_app = typer.Typer(help="Savepoints.", no_args_is_help=True)


def savepoint_of(location: str, target: str, uid: str | None) -> str:
    """Write a savepoint of ``location``'s current state into ``target``; its URL. A
    Spark ``checkpoint_location``: every stage's latest completed batch (or ``uid``'s),
    pinned against retention while it is copied; a checkpoint storage root: its latest
    checkpoint; a checkpoint or savepoint directory: that one."""
    from weir.checkpoint.epochs import EpochStore
    from weir.checkpoint.savepoints import write_savepoint
    from weir.checkpoint.storage import CheckpointStorage
    from weir.processor.locate import locate
    from weir.spark import savepoint

    if EpochStore.stage_dirs(CheckpointStorage(location)):
        return savepoint(location, target, uid=uid)
    found = locate(location, uid=uid).checkpoints
    unique = {c.url: c for c in found.values()}
    return write_savepoint(list(unique.values()), target)


@savepoint_app.command("create")
def savepoint_create(
    location: Annotated[str, typer.Argument(help=(
        "A Spark stage's checkpoint_location, a checkpoint storage root or a checkpoint "
        "directory."))],
    target: Annotated[str, typer.Argument(help="A new directory for the savepoint.")],
    uid: Annotated[str | None, typer.Option("--uid", help="Only this operator.")] = None,
) -> None:
    """Write a self-contained, backend-independent savepoint of LOCATION's current state
    (a running Spark query's latest completed batch) into TARGET; restore it with
    process(..., restore_from=TARGET) at any parallelism.

    Example: weir savepoint create /data/chk/fraud /data/savepoints/before-upgrade
    """
    from weir.errors import WeirError

    with transfer_progress(f"writing a savepoint of {location}"):
        try:
            url = savepoint_of(location, target, uid)
        except WeirError as exc:
            Console(stderr=True).print(f"[red]no savepoint:[/red] {exc}")
            raise typer.Exit(1) from None
    typer.echo(url)


def dead_letters(
    location: Annotated[str, typer.Argument(help=(
        "A checkpoint storage: a Spark stage's checkpoint_location or a continuous "
        "job's storage."))],
    since: Annotated[int | None, typer.Option(
        "--since", help="Only batches (micro-batch) or checkpoints (continuous) from this "
                        "id on.")] = None,
    uid: Annotated[str | None, typer.Option("--uid", help="Only this operator.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many rows in the "
                                       "table (--json prints every one).")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
) -> None:
    """Show the records a job set aside, with where (query and batch, or job and
    checkpoint), subtask and reason.

    Records whose function raised one of bad_record_exceptions (both runtimes); on the
    micro-batch runtime also malformed input, records without an event time and late
    records (late_records='dead_letter').

    Example: weir dead-letters /data/chk/fraud --since 120 --json
    """
    from weir.connectors.dead_letters import read_dead_letters

    def wanted(letter: dict[str, Any]) -> bool:
        at = _position(letter)
        return ((since is None or (at is not None and at >= since))
                and (uid is None or letter["uid"] == uid))

    rows = [d for d in read_dead_letters(location) if wanted(d)]
    if as_json:
        print_json(rows)
        return
    table = Table(title=f"{len(rows)} dead letters in {location}"
                  + (f" (the first {limit})" if len(rows) > limit else ""))
    for col in ("operator", "query / job", "batch / checkpoint", "subtask", "reason",
                "record"):
        table.add_column(col, justify="right" if col in ("batch / checkpoint", "subtask")
                         else "left", overflow="fold")
    for d in rows[:limit]:
        where = d["where"]
        run = where.get("query", where.get("job"))
        table.add_row(d["uid"], str(run), str(_position(d)), str(d["subtask"]), d["reason"],
                      json.dumps(d["record"], default=str)[:200])
    Console().print(table)


def _position(letter: dict[str, Any]) -> int | None:
    """The batch (micro-batch) or checkpoint (continuous) of a dead letter."""
    where = letter["where"]
    found = where.get("batch", where.get("checkpoint"))
    return found if isinstance(found, int) else None
