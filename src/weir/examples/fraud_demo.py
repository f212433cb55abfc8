"""``make demo``: card fraud detection on Spark with weir, killed in the middle.

1. Write a deterministic card-transaction stream (fixed seed; planted fraud, some
   of it out of order; invalid records) as parquet files into ``events/``, and
   versioned per-category limits as JSON files into ``rules/``.
2. Start the Spark job (:mod:`weir.examples.fraud_job`, ``local[*]``) in a child
   process: a file source with ``maxFilesPerTrigger``, the weir stage
   (:class:`~weir.examples.fraud.CardFraudDetector`: keyed value, list, map and
   reducing state with TTL, event-time timers, broadcast rules, RocksDB, incremental
   checkpoints, dead letters) and the two-phase-commit SQLite sink.
3. ``kill -9`` the job (its driver, JVM and Python workers, all at once) while a
   micro-batch is half done: weir has written its state of the batch, the sink has
   not committed it (``--crash-point sink-committed``: the sink has committed it,
   Spark has not logged it). Start it again with the same Spark checkpoint and weir
   checkpoint location and let it finish.
4. Verify against an oracle computed in plain Python from the generated events
   (no weir, no Spark): alerts in the sink (lost, duplicated, wrong), dead letters,
   and every card's final state, broadcast state and pending timers read from a
   savepoint of the final checkpoint through ``weir.testing``'s harness. Exit 1
   unless every count is zero. The detector's rules are defined on event time and
   no transaction is late, so the oracle needs no notion of batches, arrival order
   or timer firing; only the pending timers and open windows depend on the final
   watermark, which the savepoint records.

``python -m weir.examples.fraud_demo [--events N] [--files F] [--files-per-trigger K]
[--crash-batch B] [--crash-point P] [--work DIR] [--keep]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from weir.examples.fraud import (
    CATEGORY_LIMITS,
    CardFraudDetector,
)
from weir.examples.fraud_job import (
    PARALLELISM,
    TABLE,
    UID,
    WATERMARK_DELAY,
    Paths,
)
from weir.examples.fraud_stream import (
    MAX_DELAY_MS,
    Expected,
    generate,
    oracle,
    write_stream,
)
from weir.examples.fraud_verify import (
    Check,
    check_alerts,
    check_dead_letters,
    in_work_directory,
    state_checks,
    verification_table,
)
from weir.examples.fraud_watch import (
    Checkpoints,
    Crash,
    JobRun,
    View,
    log_tail,
    run_job,
    sink_status,
    staged_rows,
)

# ---------------------------------------------------------------------------- verification


@dataclass
class StateReport:
    """The final state, read from a savepoint, against the oracle."""

    checks: list[Check]
    watermark: int
    savepoint_s: float
    savepoint_bytes: int
    savepoint_files: int


def check_state(paths: Paths, expected: Expected) -> StateReport:
    """Take a savepoint of the final checkpoint, restore it into a test harness (one
    subtask holding every key group) and compare it with the oracle."""
    import weir.spark
    from weir import load_checkpoint
    from weir.testing import KeyedBroadcastOperatorHarness

    started = time.perf_counter()
    url = weir.spark.savepoint(paths.weir_state.as_uri(), (paths.work / "savepoint").as_uri())
    completed = load_checkpoint(url)  # verifies every file's checksum
    savepoint_s = time.perf_counter() - started
    watermark = int(completed.metadata.source_positions["spark"]["watermark"])
    harness = KeyedBroadcastOperatorHarness.restore(
        CardFraudDetector(), lambda txn: txn["card_id"], completed, parallelism=1,
        subtask_index=0, uid=UID, broadcast_state_descriptors=[CATEGORY_LIMITS],
    )
    try:
        checks = state_checks(harness, expected, watermark)
    finally:
        harness.close()
    files = [p for p in (paths.work / "savepoint").rglob("*") if p.is_file()]
    return StateReport(checks, watermark, savepoint_s, sum(p.stat().st_size for p in files),
                       len(files))


# ---------------------------------------------------------------------------- report


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def checkpoint_table(checkpoints: Checkpoints, batches: int, replayed: int | None) -> Table:
    """Median and maximum of what the checkpoints cost."""
    seen = checkpoints.seen
    table = Table(title=f"weir checkpoints: {len(seen)} completed, one per micro-batch "
                  f"({batches} with alerts in the sink); RocksDB incremental, newest 3 retained")
    for col in ("", "median", "max", "total"):
        table.add_column(col, justify="right" if col else "left")

    def row(label: str, key: str, fmt: Any, total: bool = False, skip: int | None = None
            ) -> None:
        values = [s[key] for cid, s in seen.items() if cid != skip]
        if values:
            table.add_row(label, fmt(statistics.median(values)), fmt(max(values)),
                          fmt(sum(values)) if total else "")

    row("state size (files referenced)", "bytes", _size)
    row("uploaded (new SST files, timers)", "new_bytes", _size, total=True)
    row("files", "files", lambda v: f"{v:.0f}")
    row("snapshot: synchronous part, ms", "sync_ms", lambda v: f"{v:,.0f}")
    row("snapshot: upload, ms", "async_ms", lambda v: f"{v:,.0f}")
    row("batch start -> checkpoint complete, ms", "latency_ms", lambda v: f"{v:,.0f}",
        skip=replayed)
    if replayed in seen:
        table.add_row(f"  replayed batch {replayed} (incl. kill and restart)",
                      "", f"{seen[replayed]['latency_ms']:,.0f}", "")
    return table


# ---------------------------------------------------------------------------- main


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m weir.examples.fraud_demo",
        description="Card fraud detection on Spark with weir, killed with SIGKILL in the "
                    "middle and restarted; verified against a plain-Python oracle.")
    parser.add_argument("--events", type=int, default=120_000)
    parser.add_argument("--cards", type=int, default=2_000)
    parser.add_argument("--files", type=int, default=24, help="parquet files to write")
    parser.add_argument("--files-per-trigger", type=int, default=4,
                        help="maxFilesPerTrigger of the file source")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--crash-batch", type=int, default=None,
                        help="kill the job during this batch (default: 40%% of the batches)")
    parser.add_argument("--crash-point", choices=("state-written", "sink-committed"),
                        default="state-written",
                        help="kill once weir wrote the batch's state (before the sink's "
                             "commit), or once the sink committed it (before Spark's)")
    parser.add_argument("--work", default=None,
                        help="work directory (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per job run")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] = ()) -> int:
    """Run the demo; 0 only if every verified count is zero."""
    args = _parse(argv)
    console = Console()
    return in_work_directory(args.work, args.keep, "weir-fraud-demo-", console,
                             lambda work: _demo(args, Paths(work), console))


def _demo(args: argparse.Namespace, paths: Paths, console: Console) -> int:
    t0 = time.perf_counter()
    console.rule("[bold]weir demo: card fraud detection on Spark, kill -9 in the middle")
    stream = generate(args.events, args.cards, args.seed)
    write_stream(stream, paths, args.files)
    batches = -(-args.files // args.files_per_trigger)
    crash_batch = (args.crash_batch if args.crash_batch is not None
                   else max(1, batches * 2 // 5))
    expected = oracle(stream)
    console.print(
        f"[bold]input[/]  {len(stream.events):,} card transactions (seed {args.seed}; "
        f"{args.cards:,} cards; {len(expected.dead)} invalid; out of order by up to "
        f"{MAX_DELAY_MS // 1000} s) as {args.files} parquet files in {paths.events.name}/, "
        f"{sum(map(len, stream.rules))} versioned per-category limits as "
        f"{len(stream.rules)} JSON files in {paths.rules.name}/"
    )
    console.print(
        f"[bold]job[/]    readStream.parquet(maxFilesPerTrigger={args.files_per_trigger}) + "
        f"rules (broadcast) -> weir.spark.process(CardFraudDetector, key_by='card_id', "
        f"parallelism={PARALLELISM}, state_backend='rocksdb', event_time='ts', "
        f"watermark_delay='{WATERMARK_DELAY}') -> writeStream.format('weir-sqlite'); "
        f"local[*], availableNow; ~{batches} micro-batches, kill -9 during batch {crash_batch}"
    )
    checkpoints = Checkpoints(paths.weir_state)
    columns = (TextColumn("{task.description}"), BarColumn(bar_width=20),
               TextColumn("{task.completed:,}/{task.total:,}"), TimeElapsedColumn(),
               TextColumn("{task.fields[status]}"))
    runs: list[JobRun] = []
    with Progress(*columns, console=console) as progress:
        view = View(progress, len(stream.events))
        first = run_job(paths, 1, args.files_per_trigger, view, checkpoints,
                        Crash(crash_batch, args.crash_point), args.timeout)
        runs.append(first)
        if first.killed_in is None:
            progress.stop()
            return _job_failed(console, first, first.failed or (
                "the job finished before it could be killed (raise --events or lower "
                "--crash-batch)"))
        _print_crash(console, paths, first, checkpoints)
        second = run_job(paths, 2, args.files_per_trigger, view, checkpoints, None,
                         args.timeout)
        runs.append(second)
    if second.failed or second.finished is None or not second.batches:
        return _job_failed(console, second, second.failed or "no result")
    replay = first.killed_in
    console.print(
        f"run 2: Spark up in {second.startup_s or 0:.1f} s; batches {min(second.batches)}-"
        f"{max(second.batches)}"
        + (f" (batch {replay} replayed: same offsets, "
           + (f"restored from weir's state of batch {replay - 1})" if replay else "from scratch)")
           if replay in second.batches else "")
        + f"; done {second.wall_s:.1f} s after the restart"
    )
    committed, _ = sink_status(paths.sink)
    console.print(checkpoint_table(checkpoints, len(committed), replay))

    import weir.spark
    from weir.connectors import read_sqlite_sink

    alerts = check_alerts(read_sqlite_sink(str(paths.sink), TABLE), expected)
    dead = check_dead_letters(weir.spark.read_dead_letters(paths.weir_state.as_uri()),
                              expected)
    state = check_state(paths, expected)
    checks = [alerts, dead, *state.checks]
    console.print(verification_table(
        checks, "verification against the plain-Python oracle (no weir, no Spark)"))
    console.print(
        f"final state: savepoint of checkpoint {max(checkpoints.seen, default='?')} "
        f"({_size(state.savepoint_bytes)} in {state.savepoint_files} files, written and "
        f"verified in {state.savepoint_s:.1f} s) restored into weir.testing's harness; final "
        f"watermark {_iso(state.watermark)}"
    )
    for line in _examples(paths):
        console.print(f"  e.g. {line}")
    wall = time.perf_counter() - t0
    done = [b for r in runs for b in r.batches.values()]
    warm = [b for r in runs for i, b in enumerate(sorted(r.batches.values(),
                                                         key=lambda b: b["batch"])) if i]
    batch_s = sum(b["trigger_ms"] for b in done) / 1000
    warm_s = sum(b["trigger_ms"] for b in warm) / 1000
    processed = sum(b["events"] for b in done)
    spark_s = sum(r.wall_s for r in runs)
    n = len(stream.events)
    console.print(
        f"throughput (2 cores): [bold]{sum(b['events'] for b in warm) / max(warm_s, 1e-9):,.0f}"
        f" events/s[/] in micro-batches after each run's first (which starts the Python "
        f"workers); {processed / max(batch_s, 1e-9):,.0f} events/s over all {len(done)} "
        f"committed micro-batches ({processed:,} events, {batch_s:.1f} s); {n / spark_s:,.0f} "
        f"events/s end to end ({spark_s:.1f} s of two job runs incl. Spark start-ups and "
        f"recovery); demo wall time {wall:.1f} s"
    )
    lost = sum(c.lost for c in checks)
    duplicated = sum(c.duplicated for c in checks)
    wrong = alerts.wrong + dead.wrong
    mismatches = sum(c.wrong for c in state.checks)
    ok = lost == duplicated == wrong == mismatches == 0 and len(expected.alerts) > 0
    style = "bold green" if ok else "bold red"
    console.print(
        f"[{style}]lost = {lost}, duplicated = {duplicated}, wrong = {wrong}, state "
        f"mismatches = {mismatches} -> {'OK: exactly once across kill -9' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


def _examples(paths: Paths) -> list[str]:
    """One committed alert of each kind, out-of-order ones first."""
    from weir.connectors import read_sqlite_sink

    rows = read_sqlite_sink(str(paths.sink), TABLE)
    picked: dict[str, dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: ("arrived after" not in r["detail"], r["txn_id"])):
        picked.setdefault(r["rule"], r)
    return [f"{r['card_id']} {r['rule']}: {r['amount']:,.2f} at {_iso(r['ts_ms'])} "
            f"({r['detail']})" for r in picked.values()]


def _print_crash(console: Console, paths: Paths, run: JobRun, checkpoints: Checkpoints) -> None:
    batch = run.killed_in
    assert batch is not None
    committed, rows = sink_status(paths.sink)
    parts = checkpoints.parts(batch)
    complete = any(paths.weir_state.glob(f"stages/*/queries/*/chk-{batch}/_metadata"))
    offsets = (paths.spark_checkpoint / "offsets" / str(batch)).exists()
    spark_done = (paths.spark_checkpoint / "commits" / str(batch)).exists()
    console.print(
        f"[bold red]kill -9[/] the job (driver, JVM and Python workers) during batch {batch}, "
        f"{run.wall_s:.1f} s after it started (Spark up in {run.startup_s or 0:.1f} s):"
    )
    console.print(
        f"  weir: state of batch {batch} written by {parts}/{PARALLELISM} subtasks, "
        f"checkpoint {batch} {'complete' if complete else 'not complete'}\n"
        f"  sink: batches {_ranges(committed)} committed ({rows:,} alerts)"
        + ("" if batch in committed
           else f"; batch {batch}: {staged_rows(paths.sink, batch):,} rows staged, invisible")
        + "\n"
        f"  Spark: offsets of batch {batch} {'logged' if offsets else 'not logged'}, "
        f"batch {'committed' if spark_done else 'not committed'}"
    )
    if not spark_done:
        console.print(
            f"  -> Spark will replay batch {batch} with the same offsets; weir "
            + (f"restores its state of batch {batch - 1} (not the half-written {batch}), "
               if batch else "starts from empty state again, ")
            + ("and the sink, which has the batch already, must not write it again"
               if batch in committed else "and the sink discards the staged rows")
        )
    console.print("restarting with the same Spark checkpoint and weir checkpoint location")


def _ranges(ids: list[int]) -> str:
    if not ids:
        return "(none)"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0])
    return ", ".join(map(str, ids))


def _job_failed(console: Console, run: JobRun, why: str) -> int:
    console.print(f"[bold red]job run {run.number} failed: {escape(why)}[/]")
    console.print(log_tail(run.log), markup=False)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
