"""``weir job``: a running continuous job, through its endpoint (``JobClient
.query_address``, loopback by default; the secret from ``--secret`` or
``WEIR_QUERY_SECRET``): task metrics (backpressure), the checkpoint history with each
task's part, and live state queries."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from weir.cli.common import parse_key, print_json, readable_size
from weir.errors import WeirError
from weir.stream import QueryableStateClient

__all__ = ["job_app"]

job_app = typer.Typer(help="A running continuous job, through its endpoint.",
                      no_args_is_help=True)

Address = Annotated[str, typer.Argument(help="the job's endpoint, host:port "
                                             "(JobClient.query_address)")]
Secret = Annotated[str, typer.Option(envvar="WEIR_QUERY_SECRET",
                                     help="the job's query secret (JobClient.query_secret)")]
Json = Annotated[bool, typer.Option("--json", help="print JSON")]


def _client(address: str, secret: str) -> QueryableStateClient:
    try:
        return QueryableStateClient(address, secret)
    except WeirError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _report(address: str, secret: str, which: str, json: bool) -> list[dict[str, Any]] | None:
    """The job's ``metrics`` or ``checkpoints``; printed as JSON (and None) with ``json``."""
    with _client(address, secret) as client:
        rows = client.metrics() if which == "metrics" else client.checkpoints()
    if json:
        print_json(rows)
        return None
    return rows


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


@job_app.command()
def metrics(address: Address, secret: Secret, json: Json = False) -> None:
    """Per task: time backpressured, idle and busy, records in/out per second, buffers
    queued per input channel and waiting per output, watermark.

    Example: weir job metrics 127.0.0.1:40123 --secret $SECRET"""
    rows = _report(address, secret, "metrics", json)
    if rows is None:
        return
    table = Table(title=f"tasks of the job at {address}")
    for col in ("task", "backpressured", "idle", "busy", "in/s", "out/s", "queued in",
                "backlog out", "watermark"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for m in rows:
        table.add_row(f"{m['operator']}[{m['subtask']}]", _pct(m["backpressured"]),
                      _pct(m["idle"]), _pct(m["busy"]), f"{m['records_in_per_s']:,.0f}",
                      f"{m['records_out_per_s']:,.0f}", str(m["input_queued"]),
                      str(m["output_backlog"]),
                      "-" if m["watermark"] is None else str(m["watermark"]))
    Console().print(table)


@job_app.command()
def checkpoints(address: Address, secret: Secret, json: Json = False) -> None:
    """The job's checkpoints: status, duration, size, records in flight stored, the
    longest alignment, and the slowest task's sync / async parts.

    Example: weir job checkpoints 127.0.0.1:40123 --secret $SECRET"""
    rows = _report(address, secret, "checkpoints", json)
    if rows is None:
        return
    table = Table(title=f"checkpoints of the job at {address}")
    for col in ("id", "kind", "status", "duration", "size", "in flight", "alignment",
                "sync (max)", "async (max)"):
        table.add_column(col, justify="right" if col not in ("kind", "status") else "left")

    def ms(value: Any) -> str:
        return "-" if value is None else f"{value:,.0f} ms"

    for c in rows:
        subtasks = c.get("subtasks") or []
        aligns = [s["alignment_ms"] for s in subtasks if s["alignment_ms"] is not None]
        table.add_row(
            str(c["checkpoint_id"]), c["kind"], c["status"], ms(c["end_to_end_duration_ms"]),
            "-" if c["state_size"] is None else readable_size(c["state_size"]),
            readable_size(c["channel_state_bytes"]) if c["channel_state_bytes"] else "-",
            ms(max(aligns) if aligns else None),
            ms(max((s["sync_ms"] for s in subtasks), default=None)),
            ms(max((s["async_ms"] for s in subtasks), default=None)))
    Console().print(table)


@job_app.command()
def query(address: Address, uid: Annotated[str, typer.Argument(help="keyed operator uid")],
          state: Annotated[str, typer.Argument(help="queryable state name")],
          key: Annotated[str, typer.Argument(help="the key (JSON; lists are tuples)")],
          secret: Secret) -> None:
    """The live value of a queryable state for one key (JSON).

    Example: weir job query 127.0.0.1:40123 fraud last-amount '"card-7"' --secret $S"""
    with _client(address, secret) as client:
        try:
            value = client.get(uid, state, parse_key(key))
        except WeirError as exc:
            raise typer.BadParameter(str(exc)) from exc
    print_json(value)
