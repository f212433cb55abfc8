"""``weir checkpoint list|inspect``: what checkpoints a location holds, and what one
holds (operators, subtasks, key groups, sizes, states), its files verified."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from weir.cli.common import print_json, readable_size, readable_time, transfer_progress

__all__ = ["checkpoint_app"]

checkpoint_app = typer.Typer(help="Checkpoints and savepoints.", no_args_is_help=True)

_LOCATION_HELP = ("A checkpoint or savepoint directory, a checkpoint storage root (chk-<id>) "
                  "or a Spark stage's checkpoint_location; a URL fsspec opens.")


@checkpoint_app.command("list")
def checkpoint_list(
    location: Annotated[str, typer.Argument(help=_LOCATION_HELP)],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
) -> None:
    """List the checkpoints in a location: query, operator uids, id, status, time,
    duration and size (a Spark checkpoint_location: every stage and query).

    Example: weir checkpoint list /data/chk/fraud --json
    """
    from weir.errors import WeirError
    from weir.processor.catalog import list_checkpoints

    try:
        rows = list_checkpoints(location)
    except WeirError as exc:
        Console(stderr=True).print(f"[red]cannot read {location}:[/red] {exc}")
        raise typer.Exit(1) from None
    if as_json:
        print_json(rows)
        return
    table = Table(title=f"checkpoints in {location}")
    for col in ("query", "operators", "id", "status", "completed", "duration", "changed",
                "size", "files"):
        table.add_column(col, justify="right" if col in ("id", "changed", "size", "files")
                         else "left")
    for row in rows:
        table.add_row(
            row["query"] or "-", ", ".join(row["uids"]) or "-", str(row["id"]), row["status"],
            readable_time(row["completed_ms"]),
            "-" if row["duration_ms"] is None else f"{row['duration_ms']:.0f} ms",
            "-" if row["changed_bytes"] is None else readable_size(row["changed_bytes"]),
            "-" if row["bytes"] is None else readable_size(row["bytes"]),
            "-" if row["files"] is None else str(row["files"]),
        )
    Console().print(table)


@checkpoint_app.command("inspect")
def checkpoint_inspect(
    path: Annotated[str, typer.Argument(help=_LOCATION_HELP + " A location: its latest.")],
    verify: Annotated[bool, typer.Option(help="Verify every file's checksum")] = True,
    uid: Annotated[str | None, typer.Option("--uid", help="Only this operator's stage "
                                                          "(of a checkpoint_location).")] = None,
) -> None:
    """Show a checkpoint's or savepoint's operators, subtasks, key groups, sizes and
    states, and verify its files. Exits with 1 if a file is missing or corrupt.

    Example: weir checkpoint inspect /data/chk/fraud --uid fraud-detector
    """
    from weir.errors import WeirError
    from weir.processor.locate import locate

    console = Console()
    try:
        located = locate(path, uid=uid)
    except WeirError as exc:
        console.print(f"[red]cannot read {path}:[/red] {exc}")
        raise typer.Exit(1) from None
    seen: dict[str, Any] = {}
    for completed in located.checkpoints.values():
        seen.setdefault(completed.url, completed)
    bad = 0
    for completed in seen.values():
        _describe(console, completed)
        if verify:
            with transfer_progress(f"verifying {completed.url}"):
                bad += _verify(console, completed)
    if bad:
        raise typer.Exit(1)


def _describe(console: Console, completed: Any) -> None:
    from weir.checkpoint.format import (
        KeyedChangelogHandle,
        KeyedFullHandle,
        KeyedIncrementalHandle,
    )

    meta = completed.metadata
    console.print(
        f"[bold]{meta.kind.value} {meta.checkpoint_id}[/bold] at {completed.url}\n"
        f"format version {meta.format_version}, triggered "
        f"{readable_time(meta.trigger_timestamp_ms)}, took {meta.duration_ms:.1f} ms, "
        f"{readable_size(meta.total_bytes)} in {len(meta.files())} files"
    )
    if meta.source_positions:
        console.print(f"source positions: {json.dumps(dict(meta.source_positions))}")
    for uid, stage in sorted((meta.source_positions.get("spark_stages") or {}).items()):
        offsets = stage.get("source_offsets")
        if offsets:
            console.print(
                f"operator {uid!r}: state reflects Spark batch {offsets['batch']} of "
                f"{offsets['spark_checkpoint']}; source end offsets "
                f"{json.dumps(offsets['offsets'])}"
            )
    for uid, op in sorted(meta.operators.items()):
        table = Table(
            title=f"operator {uid!r}: parallelism {op.parallelism}, "
            f"max parallelism {op.max_parallelism}"
        )
        for col in ("subtask", "key groups", "keyed", "entries", "size", "sync ms",
                    "async ms", "states"):
            table.add_column(col)
        for sub in op.subtasks:
            if isinstance(sub.keyed, KeyedIncrementalHandle):
                keyed = f"rocksdb incremental ({len(sub.keyed.shared)} shared SST)"
            elif isinstance(sub.keyed, KeyedChangelogHandle):
                keyed = (f"changelog (base {sub.keyed.base.file.size} B, "
                         f"{len(sub.keyed.deltas)} deltas "
                         f"{sum(d.file.size for d in sub.keyed.deltas)} B)")
            elif isinstance(sub.keyed, KeyedFullHandle):
                keyed = f"full ({len(sub.keyed.key_groups)} key groups with data)"
            else:
                keyed = "-"
            states = [
                f"{m.name}: {m.kind.value} {'/'.join(m.serializers)}{' ttl' if m.ttl else ''}"
                for m in sub.metas.values()
            ]
            states += [f"{n}: operator {mode.value} {ser}"
                       for n, (mode, ser) in sub.operator_states.items()]
            states += [f"{n}: broadcast {'/'.join(sers)}"
                       for n, sers in sub.broadcast_states.items()]
            table.add_row(
                str(sub.subtask_index), str(sub.key_group_range), keyed,
                str(sub.stats.entries), readable_size(sum(f.size for f in sub.files())),
                f"{sub.stats.sync_ms:.1f}", f"{sub.stats.async_ms:.1f}",
                "\n".join(states) or "-",
            )
        console.print(table)


def _verify(console: Console, completed: Any) -> int:
    from weir.errors import WeirError

    meta = completed.metadata
    bad = 0
    for ref in meta.files():
        try:
            completed.storage.verify(ref)
        except WeirError as exc:
            bad += 1
            console.print(f"[red]CORRUPT[/red] {exc}")
    if bad:
        console.print(f"[red]{bad} of {len(meta.files())} files missing or corrupt[/red]")
    else:
        console.print(f"[green]all {len(meta.files())} files verified (size and SHA-256)"
                      f"[/green]")
    return bad
