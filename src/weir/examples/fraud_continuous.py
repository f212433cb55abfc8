"""The card fraud pipeline of ``make demo`` on the continuous runtime, with a kill -9.

1. Write the demo's deterministic card-transaction stream (:mod:`.fraud_stream`: fixed
   seed, planted fraud, out-of-order and invalid records) as JSON-lines files into
   ``events/`` (event time ``ts`` in epoch milliseconds) and the versioned
   per-category limits into ``rules/``.
2. Run it as a continuous job (:mod:`weir.stream`, one process per task, barriers
   flowing with the records)::

       FileSource(events) ─ watermarks (30 s) ─ key_by card ─┐
                                                             ├─ CardFraudDetector ─ SqliteSink
       FileSource(rules) ─ broadcast(CATEGORY_LIMITS) ───────┘   (RocksDB)  └─ dead letters

   exactly-once checkpoints every 200 ms, restarts by fixed delay. The detector checks
   limits when the watermark passes a transaction (``limits_at_watermark``): the rules
   and the transactions flow at once here, and the watermark, the minimum over both
   inputs, passes a transaction only once every rule before it has arrived.
3. Once checkpoints have completed, ``kill -9`` one of the detector's task
   processes. The job notices at once, restarts every task from the latest completed
   checkpoint (sources rewound, the sink committing what that checkpoint holds and
   dropping what the killed attempt left open) and runs to the end of its input,
   where event time jumps to the end and every timer fires.
4. Verify against the plain-Python oracle (no weir): alerts in the sink, dead
   letters, and every card's state, the broadcast state and the pending timers read
   from the final checkpoint through ``weir.testing``'s harness. Exit 1 unless every
   count is zero.

``python -m weir.examples.fraud_continuous [--events N] [--cards C] [--files F]
[--seed S] [--kill-after K] [--work DIR] [--keep]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

import weir
from weir.examples.fraud import CATEGORY_LIMITS, CardFraudDetector, InvalidTransaction, Txn
from weir.examples.fraud_job import WATERMARK_DELAY_MS
from weir.examples.fraud_stream import MAX_DELAY_MS, Expected, Stream, generate, oracle
from weir.examples.fraud_verify import (
    Check,
    check_alerts,
    check_dead_letters,
    in_work_directory,
    state_checks,
    verification_table,
)

UID = "fraud-detector"
PARALLELISM = 2
END_OF_TIME = 2**63 - 1  # the watermark a drained end of input leaves


def card_of(txn: Txn) -> str:
    """The key: a transaction without a card is refused (a dead letter)."""
    card = txn.get("card_id")
    if not isinstance(card, str):
        raise InvalidTransaction(f"transaction {txn.get('txn_id')!r} has no card")
    return card


def event_time(txn: Txn) -> int | None:
    """A transaction's event time (None: it has none, and the detector refuses it)."""
    ts = txn.get("ts")
    return int(ts) if isinstance(ts, int | float) else None


def write_files(stream: Stream, work: Path, files: int) -> tuple[Path, Path]:
    """The stream as JSON-lines files in ``events/`` (arrival order, cut into
    ``files``), the rules in ``rules/``; each written hidden and renamed."""
    events, rules = work / "events", work / "rules"
    events.mkdir(parents=True)
    rules.mkdir(parents=True)
    per = -(-len(stream.events) // files)
    batches = [stream.events[i * per:(i + 1) * per] for i in range(files)]
    for directory, prefix, chunks in ((events, "part", batches),
                                      (rules, "rules", stream.rules)):
        for i, chunk in enumerate(chunks):
            hidden = directory / f".{prefix}-{i:05d}.jsonl"
            hidden.write_text("".join(json.dumps(r) + "\n" for r in chunk), encoding="utf-8")
            os.replace(hidden, directory / f"{prefix}-{i:05d}.jsonl")
    return events, rules


def build(work: Path, events: Path, rules: Path) -> Any:
    """The job's environment, with the pipeline declared."""
    from weir.connectors import FileSource, SqliteSink
    from weir.stream import (
        CheckpointConfig,
        RestartStrategy,
        StreamEnvironment,
        WatermarkStrategy,
    )

    env = StreamEnvironment(
        weir.JobConfig(
            work / "checkpoints",
            parallelism=PARALLELISM,
            max_parallelism=128,
            state_backend=weir.RocksDBStateBackend(),
            checkpointing=CheckpointConfig(interval="200 ms"),
            restart_strategy=RestartStrategy.fixed_delay(attempts=3, delay="500 ms"),
        )
    )
    limits = env.from_source(FileSource(rules), uid="rules", parallelism=1)
    (env.from_source(FileSource(events), uid="transactions",
                     watermarks=WatermarkStrategy.bounded_out_of_orderness(
                         WATERMARK_DELAY_MS, event_time))
        .key_by(card_of)
        .connect(limits.broadcast(CATEGORY_LIMITS))
        .process(CardFraudDetector(limits_at_watermark=True), uid=UID,
                 bad_record_exceptions=[InvalidTransaction],
                 dead_letters=SqliteSink(work / "alerts.db", table="dead_letters"))
        .sink_to(SqliteSink(work / "alerts.db", table="alerts"), uid="alerts"))
    return env


def check_state(work: Path, expected: Expected) -> list[Check]:
    """Every card's state, the broadcast state and the timers of the final checkpoint
    (restored into one harness holding every key group) against the oracle."""
    from weir import CheckpointCoordinator, load_checkpoint
    from weir.testing import KeyedBroadcastOperatorHarness

    latest = CheckpointCoordinator(str(work / "checkpoints")).latest()
    assert latest is not None, "the job completed no checkpoint"
    harness = KeyedBroadcastOperatorHarness.restore(
        CardFraudDetector(limits_at_watermark=True), card_of, load_checkpoint(latest.url),
        parallelism=1, subtask_index=0, uid=UID,
        broadcast_state_descriptors=[CATEGORY_LIMITS], allow_non_restored_state=True)
    try:
        return state_checks(harness, expected, END_OF_TIME)
    finally:
        harness.close()


def kill_a_detector(client: Any, checkpoints: int, seed: int) -> tuple[Any, list[Any]] | None:
    """SIGKILL one detector task (picked by ``seed``) once ``checkpoints`` checkpoints
    completed: (the task, the completed checkpoints then), or None if the job ended
    first."""
    from weir.stream import CheckpointStatus

    while not client.done:
        done = [c for c in client.checkpoints() if c.status is CheckpointStatus.COMPLETED]
        detectors = [t for t in client.tasks() if t.vertex == UID]
        if len(done) >= checkpoints and detectors:
            victim = detectors[seed % len(detectors)]
            os.kill(victim.pid, signal.SIGKILL)
            return victim, done
        time.sleep(0.005)
    return None


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m weir.examples.fraud_continuous",
        description="Card fraud detection on weir's continuous runtime, one task "
                    "process killed with SIGKILL mid-run; verified against a "
                    "plain-Python oracle.")
    parser.add_argument("--events", type=int, default=120_000)
    parser.add_argument("--cards", type=int, default=2_000)
    parser.add_argument("--files", type=int, default=24, help="JSON-lines files to write")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--kill-after", type=int, default=3,
                        help="kill once this many checkpoints completed")
    parser.add_argument("--work", default=None,
                        help="work directory (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for the job")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] = ()) -> int:
    """Run the demo; 0 only if every verified count is zero."""
    args = _parse(argv)
    console = Console()
    return in_work_directory(args.work, args.keep, "weir-fraud-cont-", console,
                             lambda work: _demo(args, work.resolve(), console))


def _demo(args: argparse.Namespace, work: Path, console: Console) -> int:
    from weir.connectors import read_sqlite_stream_sink
    from weir.errors import JobFailedError

    t0 = time.perf_counter()
    console.rule("[bold]weir demo: card fraud detection on the continuous runtime, kill -9 "
                 "mid-run")
    stream = generate(args.events, args.cards, args.seed)
    events, rules = write_files(stream, work, args.files)
    expected = oracle(stream)
    console.print(
        f"[bold]input[/]  {len(stream.events):,} card transactions (seed {args.seed}; "
        f"{args.cards:,} cards; {len(expected.dead)} invalid; out of order by up to "
        f"{MAX_DELAY_MS // 1000} s) as {args.files} JSON-lines files, "
        f"{sum(map(len, stream.rules))} versioned limits in {len(stream.rules)} files")
    console.print(
        f"[bold]job[/]    FileSource(events, p={PARALLELISM}) + FileSource(rules, p=1, "
        f"broadcast) -> CardFraudDetector (RocksDB, event time, watermark delay "
        f"{WATERMARK_DELAY_MS // 1000} s) -> SqliteSink (two-phase commit); exactly-once "
        f"checkpoints every 200 ms; one process per task")
    client = build(work, events, rules).execute_async("card-fraud", timeout=args.timeout)
    killed = kill_a_detector(client, args.kill_after, args.seed)
    victim = None
    if killed is not None:
        victim, done = killed
        console.print(
            f"[bold red]kill -9[/] task {victim.vertex}[{victim.subtask}] (pid "
            f"{victim.pid}) {time.perf_counter() - t0:.1f} s in, after {len(done)} "
            f"completed checkpoints (the newest: {done[-1].checkpoint_id})")
    try:
        result = client.wait()
    except JobFailedError as exc:
        console.print(f"[bold red]the job failed: {exc}[/]")
        return 1
    if victim is None:
        console.print("[bold red]the job finished before it could be killed (raise "
                      "--events or lower --kill-after)[/]")
        return 1
    console.print(
        f"restarted {result.restarts}x ({'; '.join(result.failures)}); finished "
        f"{result.duration_s:.1f} s after its start, {len(result.completed)} checkpoints "
        f"completed")

    alerts = check_alerts(read_sqlite_stream_sink(work / "alerts.db", table="alerts"),
                          expected)
    dead = check_dead_letters(
        read_sqlite_stream_sink(work / "alerts.db", table="dead_letters"), expected)
    state = check_state(work, expected)
    checks = [alerts, dead, *state]
    console.print(verification_table(
        checks, "verification against the plain-Python oracle (no weir)"))
    lost = sum(c.lost for c in checks)
    duplicated = sum(c.duplicated for c in checks)
    wrong = alerts.wrong + dead.wrong
    mismatches = sum(c.wrong for c in state)
    ok = (lost == duplicated == wrong == mismatches == 0 and len(expected.alerts) > 0
          and result.restarts == 1)
    style = "bold green" if ok else "bold red"
    console.print(
        f"[{style}]lost = {lost}, duplicated = {duplicated}, wrong = {wrong}, state "
        f"mismatches = {mismatches}, kills = 1, restarts = {result.restarts} -> "
        f"{'OK: exactly once across kill -9' if ok else 'FAILED'}[/] "
        f"(demo wall time {time.perf_counter() - t0:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
