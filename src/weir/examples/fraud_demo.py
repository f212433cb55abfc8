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
import contextlib
import json
import math
import os
import queue
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from weir.examples.fraud import (
    CATEGORY_LIMITS,
    LARGE,
    NEWEST,
    NEWEST_KEPT,
    OPEN_SMALL,
    PER_MERCHANT,
    SMALL,
    SPEND,
    TXN_COUNT,
    WAITING_LARGE,
    WINDOW_MS,
    CardFraudDetector,
)
from weir.examples.fraud_job import (
    PARALLELISM,
    TABLE,
    UID,
    WATERMARK_DELAY,
    WATERMARK_DELAY_MS,
    Paths,
)

Txn = dict[str, Any]
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MAX_DELAY_MS = 20_000  # how late (event time behind arrival) a transaction may arrive
assert MAX_DELAY_MS < WATERMARK_DELAY_MS, "out-of-orderness within the watermark delay: none late"
CATEGORIES = {  # category: (initial limit, typical amount scale)
    "grocery": (600.0, 40.0), "fuel": (300.0, 50.0), "restaurant": (800.0, 35.0),
    "pharmacy": (700.0, 25.0), "electronics": (4_000.0, 150.0), "travel": (4_500.0, 200.0),
    "jewelry": (3_500.0, 120.0), "online-gaming": (400.0, 20.0),
}


# ---------------------------------------------------------------------------- data


@dataclass
class Stream:
    """The generated input, in arrival order, and the rules."""

    events: list[Txn]
    rules: list[list[Txn]]  # one list per rules file
    merchants: dict[str, str]  # merchant -> category


def generate(events: int, cards: int, seed: int = 7) -> Stream:
    """``events`` transactions over ``cards`` cards, deterministic for ``seed``.

    Each transaction arrives at a time ``a`` (increasing) and carries an event time
    ``ts`` in ``[a - 20 s, a]``: the stream is out of order, but never by more than
    the stage's watermark delay (30 s), so no transaction is late. About 0.3% start a
    planted fraud pattern (a small "probe", then a large purchase within the minute; a
    quarter of them arrive large-first); 0.1% are invalid (no card, no amount, a
    negative amount, no event time)."""
    rng = random.Random(seed)
    names = sorted(CATEGORIES)
    merchants = {f"m{i:03d}": names[i % len(names)] for i in range(240)}
    merchant_ids = sorted(merchants)
    arrivals: list[tuple[int, int, Txn]] = []  # (arrival, sequence, txn)

    def add(arrival: int, t: Txn) -> None:
        arrivals.append((arrival, len(arrivals), t))

    def txn(card: str | None, ts: int | None, amount: float | None) -> Txn:
        merchant = rng.choice(merchant_ids)
        return {"card_id": card, "ts": ts, "amount": amount, "merchant": merchant,
                "category": merchants[merchant]}

    def small() -> float:
        return round(rng.uniform(0.01, 0.99), 2)

    now = START_MS
    while len(arrivals) < events:
        now += rng.randint(1, 100)
        card = f"card-{rng.randrange(cards):05d}"
        late = rng.randint(0, 1_500) if rng.random() < 0.95 else rng.randint(0, MAX_DELAY_MS)
        roll = rng.random()
        if roll < 0.001:  # invalid
            kind = rng.randrange(4)
            add(now, txn(None if kind == 0 else card, None if kind == 3 else now - late,
                         None if kind == 1 else (-12.5 if kind == 2 else 20.0)))
        elif roll < 0.004:  # planted: small, then large within the minute
            if rng.random() < 0.75:
                ts_small = now - late
                ts_large = ts_small + rng.randint(3_000, 55_000)
                add(now, txn(card, ts_small, small()))
                add(ts_large + rng.randint(0, 2_000),
                    txn(card, ts_large, round(rng.uniform(600, 5_000), 2)))
            else:  # the large one arrives first, the small one (earlier in event time) after
                add(now, txn(card, now, round(rng.uniform(600, 5_000), 2)))
                add(now + rng.randint(100, 4_000),
                    txn(card, now - rng.randint(3_000, 15_000), small()))
        else:
            t = txn(card, now - late, 0.0)
            r = rng.random()
            if r < 0.005:
                t["amount"] = small()
            elif r < 0.015:
                t["amount"] = round(rng.uniform(501, 3_000), 2)
            else:
                scale = CATEGORIES[t["category"]][1]
                t["amount"] = max(1.0, round(rng.lognormvariate(math.log(scale), 1.0), 2))
            add(now, t)
    arrivals.sort(key=lambda a: (a[0], a[1]))
    ordered: list[Txn] = []
    for arrival, _, t in arrivals[:events]:
        assert t["ts"] is None or 0 <= arrival - t["ts"] <= MAX_DELAY_MS
        t["txn_id"] = f"t{len(ordered):08d}"
        ordered.append(t)
    span = max(t["ts"] for t in ordered if t["ts"] is not None) - START_MS
    rules = [
        [{"category": c, "limit": limit, "effective_from": 0}
         for c, (limit, _) in sorted(CATEGORIES.items())],
        # a fraud wave in online gaming: a lower limit from the middle of the stream on
        [{"category": "online-gaming", "limit": 150.0, "effective_from": START_MS + span // 2}],
        # later: jewelry gets a higher limit, fuel none at all
        [{"category": "jewelry", "limit": 5_000.0, "effective_from": START_MS + 3 * span // 4},
         {"category": "fuel", "limit": None, "effective_from": START_MS + 3 * span // 4}],
    ]
    return Stream(ordered, rules, merchants)


def write_stream(stream: Stream, paths: Paths, files: int) -> None:
    """Drop the events into ``events/`` as ``files`` parquet files (arrival order;
    increasing modification times, which is the order Spark's file source takes them
    in) and the rules into ``rules/`` as JSON lines. Each file is written under a
    hidden name and renamed, so the file source never sees half a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("card_id", pa.string()), ("txn_id", pa.string()), ("ts", pa.timestamp("ms", tz="UTC")),
        ("amount", pa.float64()), ("merchant", pa.string()), ("category", pa.string()),
    ])
    paths.events.mkdir(parents=True)
    paths.rules.mkdir(parents=True)
    base = time.time() - 3_600
    per = -(-len(stream.events) // files)
    for i in range(files):
        chunk = stream.events[i * per : (i + 1) * per]
        table = pa.Table.from_pylist(chunk, schema=schema)
        final = paths.events / f"part-{i:05d}.parquet"
        hidden = paths.events / f".part-{i:05d}.parquet.tmp"
        pq.write_table(table, hidden)
        os.replace(hidden, final)
        os.utime(final, (base + i, base + i))
    for i, rules in enumerate(stream.rules):
        final = paths.rules / f"rules-{i:03d}.json"
        hidden = paths.rules / f".rules-{i:03d}.json.tmp"
        hidden.write_text("".join(json.dumps(r) + "\n" for r in rules))
        os.replace(hidden, final)
        os.utime(final, (base + i, base + i))


# ---------------------------------------------------------------------------- oracle


@dataclass
class CardState:
    """What the detector should hold for one card at the end."""

    count: int = 0
    spend_cents: int = 0
    per_merchant: Counter[str] = field(default_factory=Counter)
    newest: list[list[Any]] = field(default_factory=list)  # [ts, txn_id, amount]
    smalls: list[tuple[int, str]] = field(default_factory=list)
    larges: list[tuple[int, str, float]] = field(default_factory=list)


@dataclass
class Expected:
    """The oracle's answer, computed from the generated stream alone."""

    alerts: dict[tuple[str, str], tuple[Any, ...]]  # (txn_id, rule) -> alert fields
    dead: set[str]
    cards: dict[str, CardState]
    limits: dict[str, list[tuple[int, float | None]]]
    unmatched: set[str]  # large transactions no small one precedes within the minute

    def open_small(self, card: str, watermark: int) -> dict[str, int]:
        """Small transactions whose window the watermark has not closed yet."""
        return {i: ts for ts, i in self.cards[card].smalls if ts + WINDOW_MS > watermark}

    def waiting_large(self, card: str, watermark: int) -> dict[str, tuple[int, float]]:
        """Unmatched large transactions the watermark has not passed yet."""
        return {i: (ts, a) for ts, i, a in self.cards[card].larges
                if i in self.unmatched and ts > watermark}

    def timers(self, watermark: int) -> set[tuple[int, str]]:
        """Event-time timers still pending at ``watermark``."""
        out: set[tuple[int, str]] = set()
        for card in self.cards:
            out |= {(ts + WINDOW_MS, card) for ts in self.open_small(card, watermark).values()}
            out |= {(ts, card) for ts, _ in self.waiting_large(card, watermark).values()}
        return out


def oracle(stream: Stream) -> Expected:
    """The detector's rules in plain Python over the whole stream (no weir, no Spark,
    no notion of batches, arrival order or timers)."""
    versions: dict[str, dict[int, float | None]] = defaultdict(dict)
    for rules in stream.rules:
        for r in rules:
            versions[r["category"]][int(r["effective_from"])] = r["limit"]
    limits = {c: sorted(v.items()) for c, v in versions.items()}

    def limit_in_force(category: str, ts: int) -> float | None:
        found = None
        for effective_from, limit in limits.get(category, []):
            if effective_from <= ts:
                found = limit
        return found

    alerts: dict[tuple[str, str], tuple[Any, ...]] = {}
    dead: set[str] = set()
    cards: dict[str, CardState] = defaultdict(CardState)
    for t in stream.events:
        card, ts, amount = t["card_id"], t["ts"], t["amount"]
        if card is None or ts is None or amount is None or amount <= 0:
            dead.add(t["txn_id"])
            continue
        state = cards[card]
        state.count += 1
        state.spend_cents += round(amount * 100)
        state.per_merchant[t["merchant"]] += 1
        state.newest = sorted([*state.newest, [ts, t["txn_id"], amount]])[-NEWEST_KEPT:]
        limit = limit_in_force(t["category"], ts)
        if limit is not None and amount > limit:
            alerts[(t["txn_id"], "over-category-limit")] = (card, amount, ts)
        if amount < SMALL:
            state.smalls.append((ts, t["txn_id"]))
        elif amount > LARGE:
            state.larges.append((ts, t["txn_id"], amount))
    unmatched: set[str] = set()
    for card, state in cards.items():
        for ts, txn_id, amount in state.larges:
            if any(ts - WINDOW_MS <= s < ts for s, _ in state.smalls):
                alerts[(txn_id, "small-then-large")] = (card, amount, ts)
            else:
                unmatched.add(txn_id)
    return Expected(alerts, dead, dict(cards), limits, unmatched)


# ---------------------------------------------------------------------------- watching


def sink_status(db: Path) -> tuple[list[int], int]:
    """Batch ids the sink committed and the rows they hold (its commit table)."""
    if not db.exists():
        return [], 0
    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            rows = conn.execute(
                "SELECT batch_id, row_count FROM _weir_commits WHERE table_name = ?", (TABLE,)
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:  # not created yet
        return [], 0
    return sorted(int(b) for b, _ in rows), sum(int(n) for _, n in rows)


def staged_rows(db: Path, batch: int) -> int:
    """Rows the sink's tasks staged for ``batch`` (invisible until its commit)."""
    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute(
                "SELECT count(*) FROM _weir_staging WHERE table_name = ? AND batch_id = ?",
                (TABLE, batch),
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return 0
    return int(row[0])


class Checkpoints:
    """Statistics of every completed weir checkpoint, read from the checkpoint
    location while the job runs (only the newest 3 are retained on disk)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen: dict[int, dict[str, Any]] = {}

    def parts(self, batch: int) -> int:
        """Subtasks that have written their state of ``batch``."""
        return len(list(self.root.glob(f"queries/*/chk-{batch}/_parts/*/*.part")))

    def poll(self) -> None:
        from weir import load_checkpoint

        for meta in self.root.glob("queries/*/chk-*/_metadata"):
            cid = int(meta.parent.name.removeprefix("chk-"))
            if cid in self.seen:
                continue
            try:
                m = load_checkpoint(meta.parent.as_uri(), verify=False).metadata
            except Exception:  # pruned while we looked
                continue
            subs = [s for op in m.operators.values() for s in op.subtasks]
            self.seen[cid] = {
                "bytes": m.total_bytes, "files": len(m.files()),
                "new_bytes": sum(s.stats.new_bytes for s in subs),
                "sync_ms": max(s.stats.sync_ms for s in subs),
                "async_ms": max(s.stats.async_ms for s in subs),
                "latency_ms": m.completion_timestamp_ms - m.trigger_timestamp_ms,
            }


@dataclass
class Crash:
    """When to kill the job: during ``batch``, once some subtask has written its weir
    state of it and the sink has not committed it (``"state-written"``), or once the
    sink has committed it and Spark has not yet logged the batch as done
    (``"sink-committed"``: Spark replays it, the sink must not write it twice)."""

    batch: int
    point: str = "state-written"


@dataclass
class JobRun:
    """One start of the Spark job (a child process)."""

    number: int
    log: Path
    spawned: float = 0.0
    startup_s: float | None = None
    batches: dict[int, dict[str, Any]] = field(default_factory=dict)
    finished: dict[str, Any] | None = None
    failed: str | None = None
    killed_in: int | None = None
    wall_s: float = 0.0
    returncode: int | None = None


class View:
    """The progress bar and status line."""

    def __init__(self, progress: Progress, total: int) -> None:
        self.progress = progress
        self.task: TaskID = progress.add_task("", total=total, status="")
        self.events: dict[int, int] = {}  # batch -> events (a replayed batch counts once)

    def update(self, run: JobRun, checkpoints: Checkpoints, sink: tuple[list[int], int]) -> None:
        for batch, line in run.batches.items():
            self.events[batch] = line["events"]
        last = max(run.batches, default=None)
        state = ("finished" if run.finished else "starting Spark" if run.startup_s is None
                 else f"batch {last + 1}" if last is not None else "batch 0")
        self.progress.update(
            self.task, completed=sum(self.events.values()),
            description=f"run {run.number}: events",
            status=f"{state} · {len(checkpoints.seen)} checkpoints · {sink[1]:,} alerts "
                   f"committed",
        )


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the JVM, its Python daemons and workers)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen[str]) -> int:
    """SIGKILL the job and everything it started, at once; how many processes."""
    victims = [proc.pid, *_descendants(proc.pid)]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the job's own process group (a new session)
    for pid in victims:  # and the Python daemons, which make process groups of their own
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in victims[1:]):
        time.sleep(0.05)
    return len(victims)


def run_job(
    paths: Paths, number: int, files_per_trigger: int, view: View, checkpoints: Checkpoints,
    crash: Crash | None, timeout_s: float,
) -> JobRun:
    """Start the job and watch it; with ``crash``, kill it at its point (if that
    batch goes by too quickly to catch, in the next one)."""
    run = JobRun(number, paths.work / f"job-run-{number}.log")
    paths.spark_local.mkdir(exist_ok=True)
    env = dict(os.environ, SPARK_LOCAL_DIRS=str(paths.spark_local), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "weir.examples.fraud_job", "--work", str(paths.work),
           "--files-per-trigger", str(files_per_trigger)]
    lines: queue.Queue[str | None] = queue.Queue()
    with run.log.open("w") as log:
        run.spawned = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                cwd=paths.work, env=env, start_new_session=True)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            _watch(run, proc, lines, paths, view, checkpoints, crash, timeout_s)
        finally:
            if proc.poll() is None:  # interrupted: leave nothing running
                kill_tree(proc)
        run.returncode = proc.wait()
        reader.join(timeout=5)
        while not lines.empty():
            line = lines.get_nowait()
            if line is not None:
                _absorb(run, line)
    run.wall_s = time.perf_counter() - run.spawned
    checkpoints.poll()
    view.update(run, checkpoints, sink_status(paths.sink))
    if run.killed_in is None and run.finished is None and run.failed is None:
        run.failed = f"the job exited with status {run.returncode}"
    return run


def _watch(
    run: JobRun, proc: subprocess.Popen[str], lines: queue.Queue[str | None], paths: Paths,
    view: View, checkpoints: Checkpoints, crash: Crash | None, timeout_s: float,
) -> None:
    sink = sink_status(paths.sink)
    last_sink_poll = 0.0
    eof = False
    while True:
        while True:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            if line is None:
                eof = True
                break
            _absorb(run, line)
        now = time.perf_counter()
        if now - last_sink_poll > 0.3:
            checkpoints.poll()
            sink = sink_status(paths.sink)
            last_sink_poll = now
        view.update(run, checkpoints, sink)
        pause = 0.04
        if crash is not None and checkpoints.parts(crash.batch):
            sink = sink_status(paths.sink)
            spark_done = (paths.spark_checkpoint / "commits" / str(crash.batch)).exists()
            if (crash.point == "state-written" and crash.batch not in sink[0]) or (
                crash.point == "sink-committed" and crash.batch in sink[0] and not spark_done
            ):
                kill_tree(proc)
                run.killed_in = crash.batch
                break
            if spark_done or (crash.point == "state-written" and crash.batch in sink[0]):
                crash.batch += 1  # that batch went by too quickly: the next one
            pause = 0.005 if crash.point == "sink-committed" else pause
        if eof and proc.poll() is not None:
            break
        if now - run.spawned > timeout_s:
            kill_tree(proc)
            run.failed = run.failed or f"timed out after {timeout_s:.0f} s"
            break
        time.sleep(pause)


def _absorb(run: JobRun, line: str) -> None:
    with run.log.with_suffix(".progress.jsonl").open("a") as out:
        out.write(line)
    try:
        doc = json.loads(line)
    except json.JSONDecodeError:
        return  # not one of ours
    kind = doc.get("event")
    if kind == "started":
        run.startup_s = float(doc["startup_s"])
    elif kind == "batch":
        run.batches[int(doc["batch"])] = doc
    elif kind == "finished":
        run.finished = doc
    elif kind == "failed":
        run.failed = str(doc.get("error"))


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ---------------------------------------------------------------------------- verification


@dataclass
class Check:
    """One verified quantity: what the oracle expects and what weir produced."""

    what: str
    expected: int
    got: int
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0

    @property
    def ok(self) -> bool:
        return self.lost == self.duplicated == self.wrong == 0


def check_alerts(paths: Paths, expected: Expected) -> Check:
    """The sink's committed rows against the oracle's alerts."""
    from weir.connectors import read_sqlite_sink

    rows = read_sqlite_sink(str(paths.sink), TABLE)
    counts = Counter((r["txn_id"], r["rule"]) for r in rows)
    values = {(r["txn_id"], r["rule"]): (r["card_id"], r["amount"], r["ts_ms"]) for r in rows}
    wrong = len(set(counts) - set(expected.alerts)) + sum(
        1 for k, v in values.items() if k in expected.alerts and expected.alerts[k] != v
    )
    return Check("alerts in the sink", len(expected.alerts), len(rows),
                 lost=len(set(expected.alerts) - set(counts)),
                 duplicated=sum(n - 1 for n in counts.values()), wrong=wrong)


def check_dead_letters(paths: Paths, expected: Expected) -> Check:
    """The dead-letter files against the oracle's invalid transactions."""
    import weir.spark

    letters = weir.spark.read_dead_letters(paths.weir_state.as_uri())
    counts = Counter(str(d["record"].get("txn_id")) for d in letters)
    return Check("dead letters", len(expected.dead), len(letters),
                 lost=len(expected.dead - set(counts)),
                 duplicated=sum(n - 1 for n in counts.values()),
                 wrong=len(set(counts) - expected.dead))


def state_checks(harness: Any, expected: Expected, watermark: int) -> list[Check]:
    """Every card's state, the broadcast state and the pending timers of ``harness``
    (a :class:`~weir.testing.KeyedBroadcastOperatorHarness` holding every key group)
    against the oracle, given the final ``watermark``."""
    cards = set(expected.cards) | set(harness.keys(TXN_COUNT))
    bad_cards = 0
    for card in cards:
        want = expected.cards.get(card)
        if want is None:
            bad_cards += 1
            continue
        got = (
            harness.state_of(card, TXN_COUNT),
            round((harness.state_of(card, SPEND) or 0) * 100),
            harness.state_of(card, PER_MERCHANT),
            [list(t) for t in harness.state_of(card, NEWEST) or []],
            harness.state_of(card, OPEN_SMALL),
            {k: tuple(v) for k, v in harness.state_of(card, WAITING_LARGE).items()},
        )
        if got != (want.count, want.spend_cents, dict(want.per_merchant), want.newest,
                   expected.open_small(card, watermark),
                   expected.waiting_large(card, watermark)):
            bad_cards += 1
    limits = {c: [tuple(v) for v in vs]
              for c, vs in harness.broadcast_state_of(CATEGORY_LIMITS).items()}
    want_limits = {c: [tuple(v) for v in vs] for c, vs in expected.limits.items()}
    bad_limits = sum(1 for c in set(limits) | set(want_limits)
                     if limits.get(c) != want_limits.get(c))
    timers = set(harness.event_time_timers())
    want_timers = expected.timers(watermark)
    return [
        Check("card state", len(expected.cards), len(cards), wrong=bad_cards),
        Check("broadcast state (limits)", len(want_limits), len(limits), wrong=bad_limits),
        Check("pending event-time timers", len(want_timers), len(timers),
              lost=len(want_timers - timers), wrong=len(timers - want_timers)),
    ]


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
                  f"({batches} batches committed); RocksDB incremental, newest 3 retained")
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
    if args.work:
        work = Path(args.work)
        if work.exists() and any(work.iterdir()):
            console.print(f"[red]{work} is not empty; give a new or empty --work directory[/]")
            return 2
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="weir-fraud-demo-"))
    try:
        return _demo(args, Paths(work), console)
    finally:
        if args.keep:
            console.print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


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

    alerts = check_alerts(paths, expected)
    dead = check_dead_letters(paths, expected)
    state = check_state(paths, expected)
    checks = [alerts, dead, *state.checks]
    table = Table(title="verification against the plain-Python oracle (no weir, no Spark)")
    for col in ("", "oracle", "weir", "lost", "duplicated", "wrong"):
        table.add_column(col, justify="left" if not col else "right")
    for c in checks:
        style = "green" if c.ok else "red"
        table.add_row(c.what, f"{c.expected:,}", f"{c.got:,}", f"[{style}]{c.lost}",
                      f"[{style}]{c.duplicated}", f"[{style}]{c.wrong}")
    console.print(table)
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
    complete = any(paths.weir_state.glob(f"queries/*/chk-{batch}/_metadata"))
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
    console.print(f"[bold red]job run {run.number} failed: {why}[/]")
    console.print(_tail(run.log))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
