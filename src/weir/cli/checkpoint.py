"""``weir checkpoint list|inspect``: what checkpoints a location holds, and what one
holds (operators, subtasks, key groups, state entries, sizes, states), its files
verified.

``inspect`` prints a summary a person reads (tables that keep every column whole,
whatever the terminal: ``weir.cli.common.wide_console``), or with ``--json`` the whole
detail: per checkpoint found, a JSON object with

==========================  ===========================================================
``url``, ``kind``,          where it is, checkpoint or savepoint, its id, and the
``checkpoint_id``,          format version of its metadata
``format_version``
``triggered``,              when it was triggered and completed (UTC, as the summary
``completed``               shows them) and the same in epoch milliseconds
(``*_timestamp_ms``)
``duration_ms``,            how long it took; bytes and number of the files it
``bytes``, ``files``        references
``state_entries``           keyed-state entries of every operator (below)
``source_positions``        what the runtime recorded of its sources
``operators``               per uid: ``parallelism``, ``max_parallelism``,
                            ``key_groups`` (how many its subtasks hold),
                            ``state_entries``, ``bytes``, ``files`` and ``subtasks``
                            (each: ``subtask``, ``key_groups`` ``[first, last]``,
                            ``keyed`` (``full``, ``rocksdb-incremental``, ``changelog``
                            or null), ``state_entries``, ``bytes``, ``new_bytes``,
                            ``files``, ``sync_ms``, ``async_ms``, ``states``)
``verified``                ``{"files": n, "bad": [messages]}``, null with
                            ``--no-verify``
``metadata``                the checkpoint's ``_metadata`` as weir reads it (every file
                            with its size and SHA-256; ``weir.checkpoint.format``)
==========================  ===========================================================

``state_entries`` counts the keyed-state entries the checkpoint holds, as
``weir.read_state`` returns them: one per key of each value, reducing, aggregating and
list state (a list's elements are one entry), one per (key, user key) of each map
state; timers are not counted (``weir.runtime.checkpointer``, "Entries").
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from weir.cli.common import (
    print_json,
    readable_size,
    readable_time,
    transfer_progress,
    wide_console,
)

__all__ = ["checkpoint_app"]

checkpoint_app = typer.Typer(help="Checkpoints and savepoints.", no_args_is_help=True)

_LOCATION_HELP = ("A checkpoint or savepoint directory, a checkpoint storage root (chk-<id>) "
                  "or a Spark stage's checkpoint_location; a URL fsspec opens.")


@checkpoint_app.command("list")
def checkpoint_list(
    location: Annotated[str, typer.Argument(help=_LOCATION_HELP)],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
) -> None:
    """List the checkpoints in a location: query, operator uids, id, status, completion
    time, end-to-end duration, checkpointed size (uploaded) and state size (a Spark
    checkpoint_location: every stage and query). --json: the statistics of weir ui and
    JobClient.checkpoints(), with each subtask's part.

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
        print_json([row.as_json() for row in rows])
        return
    table = Table(title=f"checkpoints in {escape(location)}")
    for col in ("query", "operators", "id", "status", "completed", "duration",
                "checkpointed", "state size", "files"):
        table.add_column(col, justify="right" if col in ("id", "checkpointed", "state size",
                                                         "files") else "left",
                         overflow="fold")
    for row in rows:
        table.add_row(
            escape(row.query or "-"), escape(", ".join(row.operators) or "-"),
            str(row.checkpoint_id), row.status.value,
            readable_time(row.completed_timestamp_ms),
            "-" if row.end_to_end_duration_ms is None
            else f"{row.end_to_end_duration_ms:.0f} ms",
            "-" if row.checkpointed_size is None else readable_size(row.checkpointed_size),
            "-" if row.state_size is None else readable_size(row.state_size),
            "-" if row.files is None else str(row.files),
        )
    wide_console().print(table)


@checkpoint_app.command("inspect")
def checkpoint_inspect(
    path: Annotated[str, typer.Argument(help=_LOCATION_HELP + " A location: its latest.")],
    verify: Annotated[bool, typer.Option(help="Verify every file's checksum")] = True,
    uid: Annotated[str | None, typer.Option("--uid", help="Only this operator's stage "
                                                          "(of a checkpoint_location).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the whole detail as JSON (a list: one object per "
                       "checkpoint found) instead of the summary.")] = False,
) -> None:
    """Show a checkpoint's or savepoint's id, kind, times, operators (parallelism, max
    parallelism, key groups, state entries, bytes, files), subtasks and states, and
    verify its files. Exits with 1 if a file is missing or corrupt.

    Example: weir checkpoint inspect /data/chk/fraud --uid fraud-detector --json
    """
    from weir.errors import WeirError
    from weir.processor.locate import locate

    console = wide_console()
    try:
        located = locate(path, uid=uid)
    except WeirError as exc:
        wide_console(stderr=True).print(f"[red]cannot read {escape(path)}:[/red] "
                                        f"{escape(str(exc))}")
        raise typer.Exit(1) from None
    seen: dict[str, Any] = {}
    for completed in located.checkpoints.values():
        seen.setdefault(completed.url, completed)
    bad = 0
    docs = []
    for completed in seen.values():
        if not as_json:
            _describe(console, completed)
        problems: list[str] | None = None
        if verify:
            with transfer_progress(f"verifying {completed.url}"):
                problems = _verify(completed)
            bad += len(problems)
            if not as_json:
                _report(console, completed, problems)
        if as_json:
            docs.append(_detail(completed, problems))
    if as_json:
        print_json(docs)
    if bad:
        raise typer.Exit(1)


def _keyed_kind(keyed: Any) -> str | None:
    """The metadata's name of a subtask's keyed-state handle."""
    from weir.checkpoint.format import (
        KeyedChangelogHandle,
        KeyedFullHandle,
        KeyedIncrementalHandle,
    )

    if isinstance(keyed, KeyedIncrementalHandle):
        return "rocksdb-incremental"
    if isinstance(keyed, KeyedChangelogHandle):
        return "changelog"
    if isinstance(keyed, KeyedFullHandle):
        return "full"
    return None


def _keyed_text(keyed: Any) -> str:
    """A subtask's keyed-state handle, for a person."""
    kind = _keyed_kind(keyed)
    if kind == "rocksdb-incremental":
        return f"rocksdb incremental ({len(keyed.shared)} shared SST)"
    if kind == "changelog":
        return (f"changelog (base {readable_size(keyed.base.file.size)}, "
                f"{len(keyed.deltas)} deltas "
                f"{readable_size(sum(d.file.size for d in keyed.deltas))})")
    if kind == "full":
        return f"full ({len(keyed.key_groups)} key groups with data)"
    return "-"


def _states(sub: Any) -> list[str]:
    """A subtask's states: keyed (kind, serializers, TTL), operator and broadcast."""
    states = [f"{m.name}: {m.kind.value} {'/'.join(m.serializers)}{' ttl' if m.ttl else ''}"
              for m in sub.metas.values()]
    states += [f"{n}: operator {mode.value} {ser}"
               for n, (mode, ser) in sub.operator_states.items()]
    states += [f"{n}: broadcast {'/'.join(sers)}" for n, sers in sub.broadcast_states.items()]
    return states


def _operator_totals(op: Any) -> dict[str, int]:
    """An operator's key groups, state entries, bytes and files over its subtasks."""
    return {
        "key_groups": sum(len(s.key_group_range) for s in op.subtasks),
        "state_entries": sum(s.stats.entries for s in op.subtasks),
        "bytes": sum(f.size for s in op.subtasks for f in s.files()),
        "files": sum(len(s.files()) for s in op.subtasks),
    }


def _describe(console: Console, completed: Any) -> None:
    """The summary of one checkpoint: a few lines, a table of its operators, a table of
    each operator's subtasks."""
    meta = completed.metadata
    operators = sorted(meta.operators.items())
    totals = {uid: _operator_totals(op) for uid, op in operators}
    entries = sum(t["state_entries"] for t in totals.values())
    console.print(
        f"[bold]{meta.kind.value} {meta.checkpoint_id}[/bold] at {escape(completed.url)}\n"
        f"format version {meta.format_version}, triggered "
        f"{readable_time(meta.trigger_timestamp_ms)}, completed "
        f"{readable_time(meta.completion_timestamp_ms)}, took {meta.duration_ms:.1f} ms\n"
        f"{readable_size(meta.total_bytes)} in {len(meta.files())} files, "
        f"{len(meta.operators)} operator{'s' if len(meta.operators) != 1 else ''}, "
        f"{entries:,} state entries", highlight=False,
    )
    if meta.source_positions:
        console.print(f"source positions: {escape(json.dumps(dict(meta.source_positions)))}",
                      highlight=False)
    for uid, stage in sorted((meta.source_positions.get("spark_stages") or {}).items()):
        offsets = stage.get("source_offsets")
        if offsets:
            console.print(escape(
                f"operator {uid!r}: state reflects Spark batch {offsets['batch']} of "
                f"{offsets['spark_checkpoint']}; source end offsets "
                f"{json.dumps(offsets['offsets'])}"
            ), highlight=False)
    summary = Table(title="operators", highlight=False)
    for col in ("operator", "parallelism", "max parallelism", "key groups", "state entries",
                "size", "files"):
        summary.add_column(col, justify="left" if col == "operator" else "right",
                           overflow="fold")
    for uid, op in operators:
        total = totals[uid]
        summary.add_row(escape(uid), str(op.parallelism), str(op.max_parallelism),
                        str(total["key_groups"]), f"{total['state_entries']:,}",
                        readable_size(total["bytes"]), str(total["files"]))
    console.print(summary)
    for uid, op in operators:
        table = Table(
            title=escape(f"operator {uid!r}: parallelism {op.parallelism}, "
                         f"max parallelism {op.max_parallelism}"), highlight=False,
        )
        for col in ("subtask", "key groups", "keyed", "state entries", "size", "files",
                    "sync ms", "async ms", "states"):
            table.add_column(col, overflow="fold", justify="right" if col in (
                "state entries", "size", "files", "sync ms", "async ms") else "left")
        for sub in op.subtasks:
            table.add_row(
                str(sub.subtask_index), escape(str(sub.key_group_range)),
                escape(_keyed_text(sub.keyed)), f"{sub.stats.entries:,}",
                readable_size(sum(f.size for f in sub.files())), str(len(sub.files())),
                f"{sub.stats.sync_ms:.1f}", f"{sub.stats.async_ms:.1f}",
                escape("\n".join(_states(sub))) or "-",
            )
        console.print(table)


def _detail(completed: Any, problems: list[str] | None) -> dict[str, Any]:
    """The whole detail of one checkpoint (``--json``; fields in the module doc)."""
    from weir.checkpoint.format import _META_HEADER, encode_metadata

    meta = completed.metadata
    operators = {}
    for uid, op in sorted(meta.operators.items()):
        operators[uid] = {
            "parallelism": op.parallelism, "max_parallelism": op.max_parallelism,
            **_operator_totals(op),
            "subtasks": [{
                "subtask": s.subtask_index,
                "key_groups": [s.key_group_range.start, s.key_group_range.end],
                "keyed": _keyed_kind(s.keyed), "state_entries": s.stats.entries,
                "bytes": sum(f.size for f in s.files()), "new_bytes": s.stats.new_bytes,
                "files": len(s.files()), "sync_ms": s.stats.sync_ms,
                "async_ms": s.stats.async_ms,
                "states": [
                    *({"name": m.name, "scope": "keyed", "kind": m.kind.value,
                       "serializers": list(m.serializers), "ttl": m.ttl}
                      for m in s.metas.values()),
                    *({"name": n, "scope": "operator", "kind": mode.value,
                       "serializers": [ser]}
                      for n, (mode, ser) in sorted(s.operator_states.items())),
                    *({"name": n, "scope": "broadcast", "kind": None,
                       "serializers": list(sers)}
                      for n, sers in sorted(s.broadcast_states.items())),
                ],
            } for s in op.subtasks],
        }
    return {
        "url": completed.url, "kind": meta.kind.value, "checkpoint_id": meta.checkpoint_id,
        "format_version": meta.format_version,
        "triggered": readable_time(meta.trigger_timestamp_ms),
        "completed": readable_time(meta.completion_timestamp_ms),
        "trigger_timestamp_ms": meta.trigger_timestamp_ms,
        "completion_timestamp_ms": meta.completion_timestamp_ms,
        "duration_ms": meta.duration_ms, "bytes": meta.total_bytes,
        "files": len(meta.files()),
        "state_entries": sum(o["state_entries"] for o in operators.values()),
        "source_positions": dict(meta.source_positions),
        "operators": operators,
        "verified": None if problems is None else {"files": len(meta.files()),
                                                   "bad": problems},
        "metadata": json.loads(encode_metadata(meta)[_META_HEADER:]),
    }


def _verify(completed: Any) -> list[str]:
    """Every file's size and checksum checked: what is wrong, one message a file."""
    from weir.errors import WeirError

    problems = []
    for ref in completed.metadata.files():
        try:
            completed.storage.verify(ref)
        except WeirError as exc:
            problems.append(str(exc))
    return problems


def _report(console: Console, completed: Any, problems: list[str]) -> None:
    files = len(completed.metadata.files())
    for problem in problems:
        console.print(f"[red]CORRUPT[/red] {escape(problem)}", highlight=False)
    if problems:
        console.print(f"[red]{len(problems)} of {files} files missing or corrupt[/red]")
    else:
        console.print(f"[green]all {files} files verified (size and SHA-256)[/green]")
