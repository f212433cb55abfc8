"""``weir state show|export``: state in a checkpoint, savepoint or checkpoint location
as a table, JSON or a file (``weir.read_state``; given keys, ``weir.query_state``
reads only their key groups)."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from weir.cli.common import KEYS_HELP, json_default, parse_key, print_json, transfer_progress

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["state_app"]

state_app = typer.Typer(help="State in checkpoints and savepoints.", no_args_is_help=True)


class Scope(enum.Enum):
    """Which kind of state a command reads."""

    KEYED = "keyed"
    OPERATOR = "operator"
    BROADCAST = "broadcast"
    TIMERS = "timers"


class Format(enum.Enum):
    """Export file formats."""

    PARQUET = "parquet"
    CSV = "csv"
    JSONL = "jsonl"


_LOCATION = typer.Argument(help="A checkpoint or savepoint directory, a checkpoint storage "
                           "root or a Spark stage's checkpoint_location.")
_UID = typer.Option("--uid", help="The operator uid.")
_STATE = typer.Option("--state", help="The state's name (not needed for --scope timers).")
_SCOPE = typer.Option("--scope", help="keyed (default), operator, broadcast or timers.")
_CHECKPOINT = typer.Option("--checkpoint-id", help="This checkpoint (batch) instead of the "
                           "latest.")
_QUERY = typer.Option("--query", help="The Spark query whose batch --checkpoint-id is.")


def _read(location: str, uid: str, state: str | None, scope: Scope, keys: list[str],
          checkpoint_id: int | None, query: str | None) -> pd.DataFrame:
    import weir

    if scope is not Scope.TIMERS and not state:
        raise typer.BadParameter("--state is needed", param_hint="--state")
    if keys:
        if scope is not Scope.KEYED:
            raise typer.BadParameter("keys look up keyed state only", param_hint="KEYS")
        assert state is not None
        return weir.query_state(location, uid, state, [parse_key(k) for k in keys],
                                checkpoint_id=checkpoint_id, query=query)
    reader = weir.read_state(location, uid=uid, checkpoint_id=checkpoint_id, query=query)
    if scope is Scope.TIMERS:
        return reader.timers(uid)
    assert state is not None
    read = {Scope.KEYED: reader.keyed_state, Scope.OPERATOR: reader.operator_state,
            Scope.BROADCAST: reader.broadcast_state}[scope]
    return read(uid, state)


def _fail(exc: Exception) -> typer.Exit:
    Console(stderr=True).print(f"[red]{exc}[/red]")
    return typer.Exit(1)


@state_app.command("show")
def state_show(
    location: Annotated[str, _LOCATION],
    uid: Annotated[str, _UID],
    keys: Annotated[list[str] | None, typer.Argument(help=KEYS_HELP + " None: all keys.")
                    ] = None,
    state: Annotated[str | None, _STATE] = None,
    scope: Annotated[Scope, _SCOPE] = Scope.KEYED,
    checkpoint_id: Annotated[int | None, _CHECKPOINT] = None,
    query: Annotated[str | None, _QUERY] = None,
    limit: Annotated[int, typer.Option(help="Rows shown (0: all).")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON records instead.")
                       ] = False,
) -> None:
    """Show a state's rows: of the given keys (reading only their key groups), or all.

    Example: weir state show /data/chk/fraud --uid fraud-detector --state count acct-17
    """
    from weir.errors import WeirError

    try:
        with transfer_progress(f"reading {location}"):
            frame = _read(location, uid, state, scope, keys or [], checkpoint_id, query)
    except WeirError as exc:
        raise _fail(exc) from None
    shown = frame if limit <= 0 else frame.head(limit)
    if as_json:
        print_json(shown.to_dict(orient="records"))
        return
    title = f"{scope.value} state {state!r} of {uid!r}" if state else f"timers of {uid!r}"
    console = Console()
    console.print(f"{title}: {len(frame)} rows" + (
        f", the first {len(shown)} shown (--limit)" if len(shown) < len(frame) else ""))
    table = Table()
    for column in frame.columns:
        table.add_column(str(column))
    for row in shown.itertuples(index=False, name=None):
        table.add_row(*(repr(v) for v in row))
    console.print(table)


@state_app.command("export")
def state_export(
    location: Annotated[str, _LOCATION],
    uid: Annotated[str, _UID],
    output: Annotated[Path, typer.Option("--output", "-o", help="The file to write.")],
    state: Annotated[str | None, _STATE] = None,
    scope: Annotated[Scope, _SCOPE] = Scope.KEYED,
    file_format: Annotated[Format, typer.Option("--format", help="parquet, csv or jsonl.")
                           ] = Format.JSONL,
    checkpoint_id: Annotated[int | None, _CHECKPOINT] = None,
    query: Annotated[str | None, _QUERY] = None,
) -> None:
    """Write a state's rows to a parquet, CSV or JSON-lines file.

    Example: weir state export /data/chk/fraud --uid fraud-detector --state count
    --format parquet -o counts.parquet
    """
    from weir.errors import WeirError

    try:
        with transfer_progress(f"reading {location}"):
            frame = _read(location, uid, state, scope, [], checkpoint_id, query)
    except WeirError as exc:
        raise _fail(exc) from None
    try:
        _write(frame, output, file_format)
    except (ValueError, TypeError, ImportError) as exc:  # a value parquet cannot hold
        raise _fail(ValueError(f"cannot write {output} as {file_format.value}: {exc}; "
                               f"--format jsonl holds any value")) from None
    Console().print(f"wrote {len(frame)} rows to {output}")


def _write(frame: pd.DataFrame, output: Path, file_format: Format) -> None:
    if file_format is Format.PARQUET:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pa.Table.from_pandas(frame, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(str(exc)) from exc
        pq.write_table(table, output)
    elif file_format is Format.CSV:
        frame.to_csv(output, index=False)
    else:
        with open(output, "w") as f:
            for record in frame.to_dict(orient="records"):
                f.write(json.dumps(record, default=json_default) + "\n")

