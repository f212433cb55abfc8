"""Fault injection on a real Spark cluster: kill -9 of an executor JVM in the middle of
a batch, and kill -9 of the driver followed by a restart (RELIABILITY.md, test 1),
for both state backends and for a batch function (``KeyedBatchFunction``).

The job (``tests/spark_jobs/fault_job.py``) runs as a *child driver process* on
``local-cluster[2,1,1024]``: a standalone master and worker inside the driver JVM and
two executor JVMs of their own, so that an executor can die alone. (This pytest
process never holds a SparkContext; the rest of the suite shares one ``local[2]``
session.) The driver runs two streaming queries at once over the same input, one
per state backend (``hashmap`` and ``rocksdb``), each with its own weir checkpoint
location, Spark checkpoint and sink: one cluster start-up (~20 s, and ~30 s more for
the executors' first batch on a busy 2-core machine) serves both backends, and a
killed driver hits both mid-batch.

Source: 6 (make soak: 12) JSON-lines files of ``(key, seq, payload, checksum)`` over 200 keys, one
file per micro-batch. The weir stage (parallelism 2) keeps per key a count, a payload
sum and the map of seen seqs, and emits ``(key, seq, count, total, dup, ok)`` per
record into the ``weir-files`` two-phase-commit sink.

Injected faults (the function pauses at a chosen record, writes a marker with its
Python worker's pid and waits for the test to release it):

1. per backend, SIGKILL of the executor JVM whose Python worker is inside batch
   ``k1`` of that backend's query (found by walking ``/proc`` from the marker's pid up
   to the ``CoarseGrainedExecutorBackend`` of *this* application). Spark retries the
   task on the other executor or on the replacement the standalone worker starts;
   the query goes on;
2. SIGKILL of the driver (its Python process and its JVM at once) while both queries
   are paused in batch ``k2``; the executors then exit on their own. The job is
   started again with the same Spark checkpoints and weir checkpoint locations and
   must finish all input.

Then, per backend, against a plain-Python oracle of the failure-free run:

* **L** records without an output row; **D** extra output rows (a (key, seq) again,
  or one that is not in the input);
* **M** keys whose state differs from the oracle: the final state read back from a
  savepoint of the weir checkpoint location (``weir.spark.savepoint`` ->
  ``load_checkpoint`` -> ``KeyedOperatorHarness``), the last output row per key, any
  output row's count/total, or a row flagged ``dup`` (a record reached state twice);
* **C** completed weir checkpoints that are unreadable or fail ``verify()`` (what a
  restore would take), plus a savepoint that cannot be written or loaded.

All four must be 0, and the test checks it injected exactly what it planned: two
executor kills (one per backend's query, each pid alive and of this application
before, dead after) and one driver kill (Python and JVM pids dead).

Seed 0 (the default) kills while the task is paused. Other seeds draw other data,
other batches, sometimes the executor *not* running the paused task, and sometimes
release the pause first and kill 0-1.5 s later (during the state write, the part
publish, the sink's commit or the next batch)::

    WEIR_FAULT_SEEDS=0,1,2,3 .venv/bin/pytest tests/test_spark_cluster_faults.py -s

Each seed takes 1.5-2.5 minutes on 2 shared cores (more when other Spark jobs run).

Also asserted: after the run no checkpoint file is unreferenced by the retained
completed checkpoints (a replay's superseded attempts leave no orphans).
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

from procs import descendants
from weir import CheckpointCoordinator, CheckpointStorage, CorruptCheckpointError, load_checkpoint
from weir.checkpoint.epoch_prior import SUMMARY_FILE
from weir.checkpoint.epochs import SPARK_FILE
from weir.testing import KeyedOperatorHarness

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB_PATH = Path(__file__).parent / "spark_jobs" / "fault_job.py"
MASTER = "local-cluster[2,1,1024]"
#: the stages (queries) of the job: one per state backend, and a batch function's
BACKENDS = ("hashmap", "rocksdb", "batch")
#: make test (seed 0: kills in batches 1, 2, 3 and 4) reads 6 files; make soak 12
FILES = 12 if os.environ.get("WEIR_FAULT_SEEDS") else 6
PER_FILE, KEYS = 400, 200
PAUSE_MAX_S = 180.0  # a pause ends by itself after this long (the test releases it first)
RUN_TIMEOUT_S = 600.0
SEEDS = [int(s) for s in os.environ.get("WEIR_FAULT_SEEDS", "0").split(",") if s.strip()]
T = TypeVar("T")


def _load_job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("weir_fault_job", JOB_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


job = _load_job()


# ------------------------------------------------------------------ /proc


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of ``pid``, or None if it does not exist. Pids wrap
    around (pid_max may be 32768), so a pid is only "the same process" together with
    its start time."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def _started(pid: int) -> int | None:
    stat = _stat(pid)
    return stat[2] if stat is not None else None


def _alive(pid: int, started: int | None = None) -> bool:
    """Whether ``pid`` runs (and, given ``started``, is still that process)."""
    stat = _stat(pid)
    return (stat is not None and stat[0] not in ("Z", "X")
            and (started is None or stat[2] == started))


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _is_executor(pid: int, app_id: str) -> bool:
    cmd = _cmdline(pid)
    return (
        any(a.endswith("CoarseGrainedExecutorBackend") for a in cmd)
        and "--app-id" in cmd and cmd.index("--app-id") + 1 < len(cmd)
        and cmd[cmd.index("--app-id") + 1] == app_id
    )


def _executor_above(pid: int, app_id: str) -> int:
    """The executor JVM of ``app_id`` that ``pid`` (a Python worker) descends from."""
    current = pid
    while current > 1:
        if _is_executor(current, app_id):
            return current
        stat = _stat(current)
        if stat is None:
            break
        current = stat[1]
    raise AssertionError(f"process {pid} is not below an executor of {app_id}")


def _executors(jvm: int, app_id: str) -> list[int]:
    """The live executor JVMs of ``app_id`` (children of the driver JVM ``jvm``)."""
    return [p for p in descendants(jvm) if _is_executor(p, app_id) and _alive(p)]


def _runs_python(executor: int) -> bool:
    """Whether an executor has Python workers, i.e. is registered and has run tasks."""
    return any("python" in os.path.basename(next(iter(_cmdline(p)), ""))
               for p in descendants(executor) if _alive(p))


def _wait_dead(pids: dict[int, int | None], timeout: float) -> set[int]:
    """Wait until every process (pid: start time) is gone; returns those still alive
    at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        alive = {p for p, started in pids.items() if _alive(p, started)}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _kill(pid: int, started: int | None) -> None:
    """SIGKILL ``pid`` if it is still the process that started at ``started``."""
    if started is not None and _alive(pid, started):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------ the child driver


class Driver:
    """One run of the job as a child process (stdout/stderr to files in its work dir)."""

    def __init__(self, paths: Any, run: int, pauses: list[str], *, job_path: Path = JOB_PATH,
                 master: str = MASTER, args: list[str] | None = None,
                 local_ip: str | None = "127.0.0.1") -> None:
        """Start ``job_path`` (``fault_job.py``, or another job with its command line)
        on ``master``; ``args`` replace the backend and pause arguments; ``local_ip``:
        the address Spark binds (``SPARK_LOCAL_IP``; None: Spark's choice, the
        machine's address)."""
        import pyspark

        self.paths = paths
        self.log = paths.work / f"run{run}.out"
        self.err = paths.work / f"run{run}.err"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_SUBMIT")}
        env.update(SPARK_HOME=os.path.dirname(pyspark.__file__), PYSPARK_PYTHON=sys.executable)
        env.pop("SPARK_LOCAL_IP", None)
        if local_ip is not None:
            env["SPARK_LOCAL_IP"] = local_ip
        paths.status.unlink(missing_ok=True)
        cmd = [sys.executable, str(job_path), "--work", str(paths.work), "--master", master,
               *(args if args is not None else [
                   "--backend", ",".join(BACKENDS),
                   *(a for p in pauses for a in ("--pause", p))])]
        with open(self.log, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env,
                                         start_new_session=True)
        self.started = time.monotonic()
        #: every process of this run seen, with its start time (for the clean-up)
        self.seen: dict[int, int | None] = {self.proc.pid: _started(self.proc.pid)}

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.paths.status.read_text()))
        except (OSError, ValueError):
            return {}

    def track(self) -> None:
        for pid in descendants(self.proc.pid):
            self.seen.setdefault(pid, _started(pid))

    def tail(self) -> str:
        out = self.log.read_text(errors="replace")[-2000:]
        err = [ln for ln in self.err.read_text(errors="replace").splitlines()
               if "WARN" not in ln and not ln.startswith("\tat ")]
        return f"--- {self.log.name}:\n{out}\n--- {self.err.name} (tail):\n" + "\n".join(err[-40:])

    def wait_for(self, what: str, ready: Callable[[], T | None]) -> T:
        """Poll ``ready()`` until it returns something; fail if the job ends first."""
        while True:
            value = ready()
            if value:
                return value
            if self.proc.poll() is not None:
                pytest.fail(f"the job exited ({self.proc.returncode}) before {what}\n"
                            f"{self.tail()}")
            if time.monotonic() - self.started > RUN_TIMEOUT_S:
                pytest.fail(f"timed out waiting for {what}\n{self.tail()}")
            self.track()
            time.sleep(0.1)

    def finish(self) -> dict[str, Any]:
        while self.proc.poll() is None:
            self.track()
            if time.monotonic() - self.started > RUN_TIMEOUT_S:
                pytest.fail(f"the job did not finish in {RUN_TIMEOUT_S} s\n{self.tail()}")
            time.sleep(0.5)
        status = self.status()
        assert self.proc.returncode == 0 and status.get("finished"), self.tail()
        return status

    def clean_up(self) -> None:
        """Kill whatever of this run is still alive (only processes it started)."""
        if self.proc.poll() is None:
            self.track()
        for pid, started in self.seen.items():
            _kill(pid, started)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)


# ------------------------------------------------------------------ faults


@dataclass
class Plan:
    """Where and how to inject the faults of one test run."""

    seed: int
    executor_batch: dict[str, int] = field(
        default_factory=lambda: {"hashmap": 1, "rocksdb": 2, "batch": 3})
    kill_other_executor: dict[str, bool] = field(
        default_factory=lambda: dict.fromkeys(BACKENDS, False))
    #: None: kill while paused; else release the pause and kill this many seconds later
    executor_after_release: dict[str, float | None] = field(
        default_factory=lambda: dict.fromkeys(BACKENDS, None))
    driver_batch: int = 4
    driver_after_release: float | None = None

    @classmethod
    def of(cls, seed: int) -> Plan:
        if seed == 0:
            return cls(seed)
        rng = random.Random(seed)
        return cls(
            seed,
            {b: rng.randint(1, 4) for b in BACKENDS},
            {b: rng.random() < 0.3 for b in BACKENDS},
            {b: rng.choice([None, rng.uniform(0, 1.5)]) for b in BACKENDS},
            rng.randint(5, FILES - 4),
            rng.choice([None, rng.uniform(0, 1.0)]),
        )


@dataclass
class Injected:
    executor_kills: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BACKENDS, 0))
    driver_kills: int = 0
    notes: list[str] = field(default_factory=list)


def _pid_in(marker: Path) -> int | None:
    try:
        text = marker.read_text()
    except OSError:
        return None
    return int(text) if text.strip() else None


def _release(marker: Path) -> None:
    marker.with_name(marker.name + ".go").touch()


def _committed(out: Path) -> set[int]:
    if not out.is_dir():
        return set()
    return {int(p.name[6:]) for p in out.iterdir() if p.name.startswith("batch=")}


def kill_executor(driver: Driver, paths: Any, backend: str, record: Any, plan: Plan,
                  got: Injected) -> None:
    """SIGKILL the executor of ``backend``'s paused task (or the other one)."""
    batch = plan.executor_batch[backend]
    marker = paths.marker(backend, record[0], record[1])
    worker = driver.wait_for(f"the pause of {backend} in batch {batch}", lambda: _pid_in(marker))
    paused_at = time.monotonic()
    app_id, jvm = driver.status()["app_id"], int(driver.status()["jvm_pid"])
    try:
        paused: int | None = _executor_above(worker, app_id)
    except AssertionError:  # (other seeds) the other query's kill took this worker too
        paused = None
    target = paused
    if plan.kill_other_executor[backend] or paused is None:
        others = [p for p in _executors(jvm, app_id) if p != paused]
        target = others[0] if others else paused
    assert target is not None, "no executor to kill"
    # Kill only while another executor is up and working: a retry then need not wait
    # for the replacement of an earlier victim (and it is the case this test is about).
    waited = time.monotonic()
    deadline = waited + 120
    while time.monotonic() < deadline and not any(
        _runs_python(p) for p in _executors(jvm, app_id) if p != target
    ):
        driver.track()
        time.sleep(0.2)
    waited = time.monotonic() - waited
    delay = plan.executor_after_release[backend]
    if delay is not None:
        _release(marker)
        time.sleep(delay)
    assert _alive(target) and _is_executor(target, app_id)
    committed = batch in _committed(paths.out(backend))
    victim = {target: _started(target)}
    _kill(target, victim[target])
    dead = not _wait_dead(victim, 30)
    _release(marker)
    got.executor_kills[backend] += int(dead)
    got.notes.append(
        f"{backend}: executor {target} "
        f"({'paused' if target == paused else 'other' if paused else 'paused one gone'}) killed "
        f"{time.monotonic() - paused_at:.1f}s after the pause in batch {batch} began"
        f"{' (released before)' if delay is not None else ''}; "
        f"batch {batch} committed then: {committed}; waited {waited:.0f}s for another "
        f"working executor"
    )


def kill_driver(driver: Driver, paths: Any, record: Any, plan: Plan, got: Injected) -> None:
    """SIGKILL the driver (Python and JVM) while both queries are in the same batch."""
    markers = [paths.marker(b, record[0], record[1]) for b in BACKENDS]
    driver.wait_for(f"both pauses in batch {plan.driver_batch}",
                    lambda: all(_pid_in(m) for m in markers))
    paused_at = time.monotonic()
    if plan.driver_after_release is not None:
        for m in markers:
            _release(m)
        time.sleep(plan.driver_after_release)
    status = driver.status()
    python, jvm = int(status["driver_pid"]), int(status["jvm_pid"])
    assert python == driver.proc.pid and _alive(python) and _alive(jvm)
    driver.track()
    committed = {b: len(_committed(paths.out(b))) for b in BACKENDS}
    _kill(jvm, driver.seen[jvm])
    _kill(python, driver.seen[python])
    driver.proc.wait(timeout=30)
    dead = not _wait_dead({p: driver.seen[p] for p in (python, jvm)}, 30)
    got.driver_kills += int(dead)
    # The executors (and their Python workers) notice that the driver is gone and exit.
    left = _wait_dead(driver.seen, 60)
    got.notes.append(
        f"driver {python} + JVM {jvm} killed {time.monotonic() - paused_at:.1f}s after "
        f"both pauses in batch {plan.driver_batch}"
        f"{' (released before)' if plan.driver_after_release is not None else ''}; "
        f"batches committed: {committed}; processes still alive 60 s later: {len(left)}"
    )


# ------------------------------------------------------------------ the oracle and the checks


Rows = dict[tuple[str, int], tuple[int, int]]
State = dict[str, tuple[int, int, dict[int, int]]]


def oracle(files: list[list[tuple[str, int, int, int]]]) -> tuple[Rows, State]:
    """Per (key, seq) the expected (count, total); per key the final (count, total, seen)."""
    rows: Rows = {}
    state: State = {}
    for chunk in files:
        for key, seq, payload, check in chunk:
            count, total, seen = state.get(key, (0, 0, {}))
            state[key] = (count + 1, total + payload, {**seen, seq: check})
            rows[(key, seq)] = (count + 1, total + payload)
    return rows, state


def unreferenced_files(coordinator: CheckpointCoordinator) -> list[str]:
    """Files of a query's checkpoint directory that no retained completed checkpoint
    references (parts, summaries and ``_spark.json`` aside, and the hash map's changelog
    materializations, ``m<batch>-*``, that no batch used yet: a killed subtask's, the
    last batch's; completion sweeps them MATERIALIZATION_MAX_LAG batches later)."""
    keep = coordinator.referenced_files()
    return [f for f in coordinator.storage.walk_files()
            if f not in keep and "/_parts/" not in f and f != SPARK_FILE
            and not f.endswith(f"/{SUMMARY_FILE}")
            and not re.search(r"/m\d+-[0-9a-f]+\.keyed(\.tmp-[0-9a-f]+)?$", f)]


def check_checkpoints(location: Path) -> tuple[int, int, int, list[str]]:
    """(completed checkpoints, how many of them are corrupt, newest checkpoint id,
    files that no completed checkpoint references, parts aside)."""
    completed = corrupt = 0
    unreferenced: list[str] = []
    newest = -1
    for query in sorted(location.glob("stages/*/queries/*")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an unreadable _metadata is skipped, counted below
            coordinator = CheckpointCoordinator(CheckpointStorage(query.as_uri()),
                                                clean_up=False)
        unreferenced += [f"{query.name[:8]}/{f}" for f in unreferenced_files(coordinator)]
        with_metadata = [d for d in query.iterdir() if (d / "_metadata").exists()]
        corrupt += len(with_metadata) - len(coordinator.completed_checkpoints)
        for checkpoint in coordinator.completed_checkpoints:
            completed += 1
            newest = max(newest, checkpoint.checkpoint_id)
            try:
                checkpoint.verify()
            except CorruptCheckpointError:
                corrupt += 1
    return completed, corrupt, newest, unreferenced


def final_state(location: Path, target: Path) -> State:
    """Every key's (count, total, seen) in a savepoint of the latest completed checkpoint."""
    import weir.spark

    url = weir.spark.savepoint(location.as_uri(), target.as_uri())
    with KeyedOperatorHarness.restore(
        job.Tracker(), job.key_of, load_checkpoint(url), parallelism=1, subtask_index=0,
        uid=job.UID, state_backend="hashmap", max_parallelism=job.MAX_PARALLELISM,
    ) as h:
        return {
            k: (h.state_of(k, job.COUNT), h.state_of(k, job.TOTAL), h.state_of(k, job.SEEN))
            for k in h.keys(job.COUNT)
        }


@dataclass
class Result:
    lost: int
    dups: int
    mismatched: int
    corrupt: int
    complete: bool  # every file one committed batch, the last batch's checkpoint complete
    unreferenced: int  # checkpoint files no completed checkpoint references (orphans)
    detail: str


def evaluate(paths: Any, backend: str, rows_expected: Rows, state_expected: State,
             work: Path, status: dict[str, Any], files: int = FILES) -> Result:
    from weir.connectors import committed_file_batches, read_file_sink

    out = paths.out(backend)
    rows = read_file_sink(str(out))
    seen = collections.Counter((r["key"], r["seq"]) for r in rows)
    lost = len(set(rows_expected) - set(seen))
    dups = sum(n - 1 for n in seen.values())
    unknown = len(set(seen) - set(rows_expected))
    wrong_output = {
        r["key"] for r in rows
        if r["dup"] or not r["ok"]
        or rows_expected.get((r["key"], r["seq"])) != (r["count"], r["total"])
    }
    last: dict[str, tuple[int, int]] = {}
    for r in rows:
        if r["count"] > last.get(r["key"], (0, 0))[0]:
            last[r["key"]] = (r["count"], r["total"])
    wrong_output |= {k for k, (c, t, _) in state_expected.items() if last.get(k) != (c, t)}
    completed, corrupt, newest, unreferenced = check_checkpoints(paths.weir_chk(backend))
    notes = ""
    try:
        state = final_state(paths.weir_chk(backend), work / f"savepoint-{backend}")
    except Exception as exc:  # a savepoint that cannot be written or read is corrupt
        corrupt += 1
        state = {}
        notes = f" savepoint failed: {type(exc).__name__}: {exc}"
    # per key (count, total, seen); a batch function keeps no map of seen seqs
    kept = slice(0, 2) if backend == "batch" else slice(0, 3)
    wrong_state = {k for k in set(state) | set(state_expected)
                   if (state[k][kept] if k in state else None)
                   != (state_expected[k][kept] if k in state_expected else None)}
    batches = committed_file_batches(str(out))
    complete = (batches == list(range(files)) and newest == files - 1
                and status.get(f"last_batch_{backend}") == files - 1)
    detail = (
        f"{backend}: output rows={len(rows)} unknown={unknown} keys with wrong output="
        f"{len(wrong_output)} wrong state={len(wrong_state)} sink batches="
        f"{batches[:1]}..{batches[-1:]} ({len(batches)}) completed checkpoints={completed} "
        f"unreferenced checkpoint files={len(unreferenced)} {unreferenced[:5]} "
        f"newest={newest} last batch={status.get(f'last_batch_{backend}')} "
        f"complete={complete}{notes}"
    )
    return Result(lost, dups + unknown, len(wrong_output | wrong_state), corrupt, complete,
                  len(unreferenced), detail)


# ------------------------------------------------------------------ the test


@pytest.mark.parametrize("seed", SEEDS)
def test_kill_9_executor_and_driver(tmp_path: Path, seed: int) -> None:
    started = time.monotonic()
    plan = Plan.of(seed)
    paths = job.Paths(tmp_path / "job")
    files = job.generate(seed, FILES, PER_FILE, KEYS)
    job.write_input(paths, files)
    rows_expected, state_expected = oracle(files)
    rng = random.Random(seed)
    exec_records = {b: rng.choice(files[plan.executor_batch[b]]) for b in BACKENDS}
    driver_record = rng.choice(files[plan.driver_batch])
    pauses = [
        *(f"{b}:{r[0]}:{r[1]}:{PAUSE_MAX_S}" for b, r in exec_records.items()),
        f"*:{driver_record[0]}:{driver_record[1]}:{PAUSE_MAX_S}",
    ]

    got = Injected()
    first = Driver(paths, 1, pauses)
    try:
        for b in sorted(BACKENDS, key=lambda b: plan.executor_batch[b]):
            kill_executor(first, paths, b, exec_records[b], plan, got)
        kill_driver(first, paths, driver_record, plan, got)
    finally:
        first.clean_up()
    crashed_at = time.monotonic()
    second = Driver(paths, 2, pauses)
    try:
        status = second.finish()
    finally:
        second.clean_up()
    finished_at = time.monotonic()

    results = {b: evaluate(paths, b, rows_expected, state_expected, tmp_path, status)
               for b in BACKENDS}
    report = "\n".join([
        f"seed={seed} records={sum(map(len, files))} run 1 {crashed_at - started:.0f}s, "
        f"run 2 {finished_at - crashed_at:.0f}s (its driver start-up {status.get('startup_s')}s)",
        *(f"  [{b}] L={r.lost} D={r.dups} M={r.mismatched} C={r.corrupt} | "
          f"executor kills={got.executor_kills[b]} driver kills={got.driver_kills}"
          for b, r in results.items()),
        *(f"  {r.detail}" for r in results.values()),
        *(f"  {n}" for n in got.notes),
    ])
    print(report)
    for r in results.values():
        assert (r.lost, r.dups, r.mismatched, r.corrupt) == (0, 0, 0, 0), report
        assert r.complete, report
        assert r.unreferenced == 0, report
    assert got.executor_kills == dict.fromkeys(BACKENDS, 1), report
    assert got.driver_kills == 1, report
