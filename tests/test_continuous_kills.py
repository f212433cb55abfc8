"""kill -9 at random points of a continuous job (RELIABILITY.md, test 1), seeded:
each seed kills three task processes — one at a random moment, one while a checkpoint
is in flight (its directory exists, its metadata does not: tasks are aligning,
snapshotting or uploading), one while its sink is committing (between the renames of a
completed checkpoint's transactions) — and the job must end exactly-once.

The job: two source subtasks → ``map`` → ``rebalance`` into a non-keyed function with
operator state (p = 3) → ``key_by`` → a running count per key (keyed state, p = 2,
by seed: RocksDB with changelog checkpoints, the hash map, RocksDB with incremental
native checkpoints; per record, and again as a batch function whose records are
gathered between barriers) → a two-phase-commit file sink that can be made slow to
commit (an ``arm`` file), checkpoints every 50 ms.

Reported per seed, all required 0: **L** numbers without an output row, **D** output
rows beyond one per number, **M** keys whose committed counts are not 1..n/K or whose
checkpointed count differs, **C** retained checkpoints that fail ``verify()``; and the
kills must be the three planned (each victim alive before, dead after, in the window
it was meant for). ``make test`` runs seed 0; ``make soak`` runs 20
(``WEIR_SOAK=1``; or ``WEIR_CONTINUOUS_SEEDS=0,1,...``).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

import weir
from continuous_helpers import BatchCount, by_value
from weir.checkpoint.coordinator import CheckpointCoordinator
from weir.connectors import FileSink, SequenceSource, read_stream_sink
from weir.runtime.continuous.master import LocalJob
from weir.stream import CheckpointConfig, StreamEnvironment

pytestmark = pytest.mark.slow

SEEDS = [int(s) for s in os.environ.get(
    "WEIR_CONTINUOUS_SEEDS", ",".join(map(str, range(20))) if os.environ.get("WEIR_SOAK")
    else "0").split(",") if s.strip()]
N, KEYS = 60_000, 30
COUNT = weir.ValueStateDescriptor[int]("count", weir.IntSerializer())


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


class Count(weir.KeyedProcessFunction[int, list[int]]):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: list[int], ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield [ctx.current_key, value[1], n]


class Tag(weir.ProcessFunction[int, list[int]], weir.CheckpointedFunction):
    """[subtask's running count, number], the count in operator state."""

    def initialize_state(self, ctx: Any) -> None:
        self.state = ctx.operator_state_store.get_list_state(
            weir.ListStateDescriptor[int]("seen", weir.IntSerializer()))
        self.seen = sum(self.state.get()) if ctx.is_restored else 0

    def snapshot_state(self, ctx: Any) -> None:
        self.state.update([self.seen])

    def process_element(self, value: int, ctx: Any) -> Any:
        self.seen += 1
        yield [self.seen, value]


class SlowCommits(FileSink):
    """A FileSink that, while ``<markers>/arm`` exists, announces each transaction's
    commit in ``<markers>/commit-<pid>`` and waits 0.3 s before its rename."""

    def __init__(self, path: Path, markers: Path) -> None:
        super().__init__(path)
        self.markers = str(markers)

    def commit(self, committables: list[Any]) -> None:
        for committable in committables:
            if os.path.exists(os.path.join(self.markers, "arm")):
                Path(self.markers, f"commit-{os.getpid()}").touch()
                time.sleep(0.3)
            super().commit([committable])


def build(tmp_path: Path, backend: str, function: str = "record") -> LocalJob:
    """``backend``: hashmap, rocksdb (changelog checkpoints, the default) or
    rocksdb-incremental (native incremental checkpoints); ``function``: the count per
    record, or as a batch function (records gathered between barriers)."""
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                                           state_backend=backend.removesuffix("-incremental")))
    (env.from_source(SequenceSource(N, 15_000), uid="numbers")
        .map(lambda n: n)
        .rebalance().process(Tag(), uid="tag", parallelism=3)
        .key_by(lambda r: r[1] % KEYS)
        .process(Count() if function == "record" else BatchCount(item=1), uid="count")
        .sink_to(SlowCommits(tmp_path / "out", tmp_path / "markers"), uid="sink"))
    changelog = False if backend.endswith("-incremental") else None
    return LocalJob(env.job_graph("kills"), CheckpointConfig(interval=50, changelog=changelog),
                    restart=weir.RestartStrategy.fixed_delay(attempts=3, delay="0 s"),
                    sleep=lambda s: None)


class Killer:
    """Kills planned by a seed, each in its window; records what it did."""

    def __init__(self, job: LocalJob, tmp_path: Path, rng: random.Random,
                 runner: threading.Thread) -> None:
        self.job, self.tmp, self.rng, self.runner = job, tmp_path, rng, runner
        self.done: list[str] = []
        self.victims: list[str] = []

    def wait(self, what: str, ready: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.runner.is_alive(), f"the job ended before {what}"
            assert time.monotonic() < deadline, f"no {what} in {timeout} s"
            time.sleep(0.002)

    def running(self, attempt: int) -> None:
        """Until attempt ``attempt`` has every task and completed a checkpoint."""
        seen, tasks = len(self.job.result.completed), len(self.job.graph.tasks())
        self.wait(f"attempt {attempt}", lambda: self.job.attempt == attempt and len(
            self.job._procs) == tasks and len(self.job.result.completed) > seen)

    def kill(self, task: tuple[str, int], window: str) -> None:
        proc = self.job._procs[task]
        assert proc.poll() is None, (task, window)
        proc.kill()  # (SIGKILL, from its parent: never a pid another process got since)
        assert proc.wait(10) == -signal.SIGKILL
        self.done.append(f"{window}: {task[0]}[{task[1]}]")
        self.victims.append(f"task {task[0]}[{task[1]}] disappeared")

    def at_random(self, attempt: int) -> None:
        self.running(attempt)
        time.sleep(self.rng.uniform(0, 0.4))
        self.kill(self.rng.choice(sorted(self.job._procs)), "random")

    def in_flight(self, attempt: int) -> None:
        self.running(attempt)
        chk = self.tmp / "chk"

        def pending() -> bool:
            return any(d.name.startswith("chk-") and not (d / "_metadata").exists()
                       for d in chk.iterdir())
        self.wait("a checkpoint in flight", pending)
        self.kill(self.rng.choice(sorted(self.job._procs)), "checkpoint in flight")

    def committing(self, attempt: int) -> None:
        self.running(attempt)
        markers = self.tmp / "markers"
        markers.mkdir(exist_ok=True)
        (markers / "arm").touch()
        try:
            self.wait("a commit", lambda: any(markers.glob("commit-*")))
            pid = int(next(markers.glob("commit-*")).name.split("-")[1])
            task = next(t for t, p in self.job._procs.items() if p.pid == pid)
            self.kill(task, "sink commit")
        finally:
            (markers / "arm").unlink()
            for marker in markers.glob("commit-*"):
                marker.unlink()


@pytest.mark.parametrize("function", ["record", "batch"])
@pytest.mark.parametrize("seed", SEEDS)
def test_kill_9_at_random_points_of_a_continuous_job(tmp_path: Path, seed: int, function: str
                                                     ) -> None:
    rng = random.Random(seed)
    backend = ("rocksdb", "hashmap", "rocksdb-incremental")[(seed + (function == "batch")) % 3]
    job = build(tmp_path, backend, function)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            job.run(timeout_s=180)
        except BaseException as exc:
            errors.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    killer = Killer(job, tmp_path, rng, runner)
    plan = [killer.at_random, killer.in_flight, killer.committing]
    rng.shuffle(plan)
    try:
        for attempt, kill in enumerate(plan):
            kill(attempt)
    finally:
        runner.join(180)
    assert not runner.is_alive() and not errors, errors

    out = read_stream_sink(tmp_path / "out")
    numbers = Counter(r[1] for r in out)
    lost = N - len(set(numbers) & set(range(N)))
    dups = sum(c - 1 for c in numbers.values()) + len(set(numbers) - set(range(N)))
    counts: dict[int, list[int]] = defaultdict(list)
    for key, _, count in out:
        counts[key].append(count)
    per_key = N // KEYS
    wrong = {k for k in range(KEYS) if sorted(counts[k]) != list(range(1, per_key + 1))}
    state = weir.read_state(str(tmp_path / "chk")).keyed_state("count", "count")
    wrong |= {k for k, v in zip(state["key"], state["value"], strict=True) if v != per_key}
    corrupt = 0
    for completed in CheckpointCoordinator(str(tmp_path / "chk")).completed_checkpoints:
        try:
            completed.verify()
        except weir.CorruptCheckpointError:
            corrupt += 1
    report = (f"seed={seed} {backend} {function}: L={lost} D={dups} M={len(wrong)} C={corrupt} "
              f"kills={killer.done} restarts={job.result.restarts} "
              f"failures={job.result.failures}")
    print(report)
    assert (lost, dups, len(wrong), corrupt) == (0, 0, 0, 0), report
    assert len(killer.done) == 3 and job.result.restarts == 3, report
    causes = [f.split(": ", 1)[1].split(":")[0] for f in job.result.failures]
    assert causes == killer.victims, report  # each restart names the killed task
