"""The continuous runtime on a real Spark cluster (``local-cluster[2,2,1024]``: two
executor JVMs of two cores each, so that one can die alone): kill -9 of an executor
JVM, of a Python worker while a checkpoint is in flight, and of the driver followed by
an application restart (RELIABILITY.md, test 1; issue 13).

The job (``tests/spark_jobs/continuous_job.py``) runs as a child driver process: one
source subtask emitting 0..N-1 at a fixed rate, keyed by ``n % 50`` into a running
count at parallelism 3 (four tasks: every slot of the cluster), into a two-phase-commit
file sink, checkpoints every 200 ms. Its channels and coordinator listen on the
machine's address (not loopback: ``local-cluster`` is a cluster to weir), with the job's
secret. The faults, each once a new attempt runs all four tasks and completed a
checkpoint:

1. attempt 0: SIGKILL of the executor JVM that hosts a task (found by walking
   ``/proc`` up from the weir task process to this application's
   ``CoarseGrainedExecutorBackend``). The stage fails; weir waits for the standalone
   worker's replacement executor (the job needs all four slots) and resubmits it;
2. attempt 1: SIGKILL of the Spark Python worker that started a weir task, while a
   checkpoint is in flight (its directory exists, its metadata does not);
3. attempt 2: SIGKILL of the driver (its Python process and its JVM), and the job
   started again at once on a new application with the same checkpoint storage, while
   the killed one's executors and tasks linger: the new driver takes the storage over
   (the killed owner's driver process is gone: ``weir.checkpoint.protocol``) and must
   finish the input; every process of the killed application must end by itself.

Reported and required 0: **L** numbers without an output row, **D** output rows beyond
one per number, **M** keys whose committed (number, count) rows are not their numbers
with counts 1..N/50 or whose checkpointed count is not N/50, out-of-order rows (a
key's number committed after a greater one: the strict-order oracle), **C** retained
checkpoints that fail ``verify()``; and the kills must be the three planned (each
victim alive before and dead after). Takes about a minute on 2 shared cores per
backend; ``make test`` runs RocksDB, ``make soak`` both backends.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

import test_spark_cluster_faults as faults  # type: ignore[import-not-found]
import weir
from procs import descendants
from weir import CheckpointCoordinator, CorruptCheckpointError
from weir.checkpoint.ownership import Lineage
from weir.checkpoint.storage import CheckpointStorage
from weir.connectors import read_stream_sink

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB_PATH = Path(__file__).parent / "spark_jobs" / "continuous_job.py"
MASTER = "local-cluster[2,2,1024]"
N, RATE, KEYS, TASKS = 60_000, 4_000, 50, 4
#: make test runs the RocksDB backend; make soak (WEIR_SOAK=1) both backends
BACKENDS = ["hashmap", "rocksdb"] if os.environ.get("WEIR_SOAK") else ["rocksdb"]


@dataclass
class Paths:
    """What ``faults.Driver`` needs of a job's work directory."""

    work: Path

    @property
    def status(self) -> Path:
        return self.work / "status.json"


def task_processes(driver: faults.Driver) -> set[int]:
    """The weir task processes of ``driver``'s application (named ``weir <task>``)."""
    found = set()
    for pid in descendants(driver.proc.pid):
        with contextlib.suppress(OSError):
            name = Path(f"/proc/{pid}/comm").read_text()
            if name.startswith("weir ") and faults._alive(pid):
                found.add(pid)
    return found


def listening(pid: int) -> set[str]:
    """The IPv4 addresses ``pid`` listens on (its sockets in ``/proc/net/tcp``)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(fields[1].split(":")[0])[::-1]))
    return found


def latest_completed(chk: Path) -> int:
    ids = [int(d.name[4:]) for d in chk.glob("chk-*") if (d / "_metadata").exists()]
    return max(ids, default=0)


def in_flight(chk: Path) -> bool:
    return any(not (d / "_metadata").exists() for d in chk.glob("chk-*"))


def running(driver: faults.Driver, seen: set[int]) -> set[int]:
    """Wait until a new attempt runs all its tasks (none in ``seen``, which gets them)
    and completed a checkpoint; its tasks."""
    chk = driver.paths.work / "chk"
    before = latest_completed(chk)
    tasks: set[int] = driver.wait_for(
        f"an attempt with all {TASKS} tasks",
        lambda: new if len(new := task_processes(driver) - seen) == TASKS else None)
    seen |= tasks
    driver.wait_for("a checkpoint of the new attempt", lambda: latest_completed(chk) > before)
    driver.track()
    return tasks


def kill(driver: faults.Driver, pid: int) -> bool:
    """SIGKILL ``pid`` (a process of this run, alive); whether it died."""
    started = driver.seen[pid]
    assert faults._alive(pid, started), pid
    os.kill(pid, signal.SIGKILL)
    return not faults._wait_dead({pid: started}, 30)


def evaluate(work: Path) -> tuple[int, int, int, int, int]:
    """(L, D, M, C, out of order) of the run in ``work``."""
    out = read_stream_sink(work / "out")  # in the order the sink committed it
    numbers = Counter(r[1] for r in out)
    lost = len(set(range(N)) - set(numbers))
    duplicates = sum(c - 1 for c in numbers.values()) + len(set(numbers) - set(range(N)))
    per_key: dict[int, list[tuple[int, int]]] = {}
    for key, number, count in out:
        per_key.setdefault(key, []).append((number, count))
    # strict order: each key's numbers committed in their order, its counts 1, 2, ...
    disorder = sum(1 for rows in per_key.values()
                   for (a, _), (b, _) in itertools.pairwise(rows) if b < a)
    state = weir.read_state(str(work / "chk")).keyed_state("count", "count")
    held = dict(zip(state["key"], state["value"], strict=True))
    mismatched = sum(
        1 for k in range(KEYS)
        if sorted(per_key.get(k, [])) != [(k + KEYS * i, i + 1) for i in range(N // KEYS)]
        or held.get(k) != N // KEYS)
    corrupt = 0
    for completed in CheckpointCoordinator(work / "chk", clean_up=False).completed_checkpoints:
        try:
            completed.verify()
        except CorruptCheckpointError:
            corrupt += 1
    assert not list((work / "out" / ".pending").iterdir()), "uncommitted transactions"
    return lost, duplicates, mismatched, corrupt, disorder


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_9_executor_python_worker_and_driver(tmp_path: Path, backend: str) -> None:
    paths = Paths(tmp_path)
    args = ["--backend", backend, "--n", str(N), "--rate", str(RATE)]
    first = faults.Driver(paths, 1, [], job_path=JOB_PATH, master=MASTER, args=args,
                          local_ip=None)
    second = None
    kills: Counter[str] = Counter()
    try:
        app = first.wait_for("the session", lambda: first.status().get("app_id"))
        seen: set[int] = set()
        tasks = running(first, seen)
        # off loopback: the tasks with inputs listen on their executor's address
        addresses = set().union(*(listening(p) for p in tasks))
        assert addresses and "127.0.0.1" not in addresses, addresses
        executor = faults._executor_above(next(iter(tasks)), app)
        kills["executor"] += kill(first, executor)

        tasks = running(first, seen)
        first.wait_for("a checkpoint in flight", lambda: in_flight(tmp_path / "chk"))
        worker = faults._stat(next(iter(tasks)))[1]  # the Spark Python worker above it
        assert "python" in os.path.basename(faults._cmdline(worker)[0]), worker
        kills["python_worker"] += kill(first, worker)

        running(first, seen)
        status = first.status()
        jvm, python = int(status["jvm_pid"]), int(status["driver_pid"])
        first.track()
        kills["driver"] += kill(first, jvm) & kill(first, python)
        # a new application at once, while the killed one's processes may linger: it
        # takes the checkpoint storage over (the owner's driver process is gone)
        second = faults.Driver(paths, 2, [], job_path=JOB_PATH, master=MASTER, args=args,
                               local_ip=None)
        # the executors, their Python workers and the weir tasks end by themselves
        left = faults._wait_dead(first.seen, 60)
        assert not left, [faults._cmdline(p) for p in left]
        done = second.finish()
        assert done["restarts"] == 0, done
        second.track()
        assert not faults._wait_dead(second.seen, 60)  # nothing outlives the application
    finally:
        for driver in (first, second):
            if driver is not None:
                driver.clean_up()
    lost, duplicates, mismatched, corrupt, disorder = evaluate(tmp_path)
    print(f"[{backend}] L={lost} D={duplicates} M={mismatched} C={corrupt} "
          f"out-of-order={disorder} | "
          + ", ".join(f"{k} kills={v}" for k, v in sorted(kills.items())))
    assert (lost, duplicates, mismatched, corrupt, disorder) == (0, 0, 0, 0, 0)
    assert kills == Counter(executor=1, python_worker=1, driver=1)
    claims = Lineage(CheckpointStorage(tmp_path / "chk")).claims()
    assert [c.token for c in claims] == [1, 2]  # the new application took over once
    assert claims[1].reason == f"after run {claims[0].query}"
    assert claims[1].source_note == "the storage's state"  # (no restore_from)
