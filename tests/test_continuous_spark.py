"""The continuous runtime on Spark: a job's tasks as one barrier-mode stage of the test
run's SparkSession (``local[2]``): exactly-once output and state, a weir task process
killed with SIGKILL on its executor (the stage is cancelled and resubmitted from the
latest completed checkpoint), a cancelled job that leaves no process behind and frees
its slots, and a job with more tasks than the application has slots refused at once."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import weir
from continuous_helpers import Count, by_value, check_exactly_once
from procs import descendants, parent
from weir.connectors import FileSink, SequenceSource
from weir.connectors.stream import read_stream_sink
from weir.errors import ConfigurationError
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

pytestmark = pytest.mark.spark

KEYS = 50  # (Count's)


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


def environment(tmp_path: Path, n: int, rate: float | None, parallelism: int = 1,
                restarts: int = 0) -> StreamEnvironment:
    env = StreamEnvironment(
        weir.JobConfig(
            tmp_path / "chk",
            parallelism=parallelism,
            max_parallelism=32,
            checkpointing=CheckpointConfig(interval=100),
            restart_strategy=RestartStrategy.fixed_delay(attempts=restarts, delay="0 s"),
        )
    )
    (env.from_source(SequenceSource(n, rate), uid="numbers")
        .key_by(lambda v: v % KEYS)
        .process(Count(), uid="count")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    return env


def check_in_order(out: Path) -> None:
    """With one source subtask, each key's counts follow the numbers."""
    per_key: dict[int, list[int]] = {}
    for key, _, count in sorted(read_stream_sink(out), key=lambda r: r[1]):
        per_key.setdefault(key, []).append(count)
    assert all(counts == list(range(1, len(counts) + 1)) for counts in per_key.values())


def tasks_left(timeout_s: float = 20.0) -> list[str]:
    """Weir task processes started by this process's Spark (named ``weir <task>``,
    below a Spark Python worker below this test process: a test running beside it in
    another process has its own) still alive after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = []
        for pid in descendants(os.getpid()):
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
                spawner = Path(f"/proc/{parent(pid)}/cmdline").read_bytes()
            except OSError:
                continue
            if name.startswith("weir ") and b"pyspark" in spawner:
                left.append(f"{pid} {name}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_a_job_runs_as_a_barrier_stage_exactly_once(spark: Any, tmp_path: Path) -> None:
    n = 20_000
    result = environment(tmp_path, n, None).execute(
        "on-spark", runner="spark", spark=spark, timeout=300)
    assert result.completed and result.restarts == 0
    check_exactly_once(tmp_path, n)
    check_in_order(tmp_path / "out")
    assert tasks_left() == []


def test_a_task_killed_on_its_executor_restarts_the_stage_from_the_checkpoint(
        spark: Any, tmp_path: Path) -> None:
    n = 60_000
    job = environment(tmp_path, n, rate=10_000, restarts=1).execute_async(
        "killed-on-spark", runner="spark", spark=spark, timeout=300)
    deadline = time.monotonic() + 120
    while len(job.checkpoints()) < 3 or not job.tasks():
        assert time.monotonic() < deadline, "no checkpoint completed"
        time.sleep(0.05)
    victim = next(t for t in job.tasks() if t.vertex == "count")
    os.kill(victim.pid, signal.SIGKILL)
    result = job.wait()
    assert result.restarts == 1, result.failures
    assert "count[0]" in result.failures[0]
    check_exactly_once(tmp_path, n)
    check_in_order(tmp_path / "out")
    assert tasks_left() == []  # the killed attempt's other tasks too


def test_a_cancelled_job_leaves_no_task_behind_and_frees_its_slots(
        spark: Any, tmp_path: Path) -> None:
    job = environment(tmp_path, 10_000_000, rate=5_000).execute_async(
        "cancelled-on-spark", runner="spark", spark=spark, timeout=300)
    deadline = time.monotonic() + 120
    while len(job.checkpoints()) < 2:
        assert time.monotonic() < deadline, "no checkpoint completed"
        time.sleep(0.05)
    assert job.cancel().cancelled
    assert tasks_left() == []
    # the slots are free: a job that needs them all runs now
    assert environment(tmp_path / "next", 1_000, None).execute(
        "after-cancel", runner="spark", spark=spark, timeout=120).completed


def test_more_tasks_than_slots_is_refused_at_once(spark: Any, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=r"needs 4 task slots .* has 2"):
        environment(tmp_path, 10, None, parallelism=2).execute(
            "too-big", runner="spark", spark=spark, timeout=60)
    assert time.monotonic() - started < 10


def test_checkpoint_storage_the_executors_do_not_share_is_refused_without_restarts(
        spark: Any, tmp_path: Path) -> None:
    """``memory://`` is a filesystem of each process: the Python workers do not see the
    driver's — as executors on other hosts do not see the driver's local disk."""
    env = environment(tmp_path, 10, None, restarts=3)
    env.checkpoint_storage = "memory://weir-not-shared"
    started = time.monotonic()
    with pytest.raises(ConfigurationError,
                       match=r"checkpoint storage memory://weir-not-shared is not shared"):
        env.execute("not-shared", runner="spark", spark=spark, timeout=120)
    assert time.monotonic() - started < 30  # no restarts, no waiting
    assert tasks_left() == []


class _SinkOnItsOwnHost(FileSink):
    """A FileSink whose directory is a place of each process (``memory://``), as a local
    path of the driver is on a multi-host cluster."""

    def locations(self) -> list[str]:
        return ["memory://weir-sink-not-shared"]


def test_a_sink_path_the_executors_do_not_share_is_refused_without_restarts(
        spark: Any, tmp_path: Path) -> None:
    env = StreamEnvironment(
        weir.JobConfig(
            tmp_path / "chk",
            parallelism=1,
            max_parallelism=32,
            checkpointing=CheckpointConfig(interval=100),
            restart_strategy=RestartStrategy.fixed_delay(attempts=3, delay="0 s"),
        )
    )
    (env.from_source(SequenceSource(10), uid="numbers")
        .key_by(lambda v: v % KEYS).process(Count(), uid="count")
        .sink_to(_SinkOnItsOwnHost(tmp_path / "out"), uid="sink"))
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=r"sink 'sink' writes to "
                       r"memory://weir-sink-not-shared, which is not shared"):
        env.execute("sink-not-shared", runner="spark", spark=spark, timeout=120)
    assert time.monotonic() - started < 30  # no restarts, no waiting
    assert read_stream_sink(tmp_path / "out") == []
    assert tasks_left() == []


@pytest.mark.parametrize(("master", "conf", "limit"), [
    ("local", {}, 1),
    ("local[3]", {}, 3),
    ("local[4, 2]", {}, 4),
    ("local[*]", {}, os.cpu_count()),
    ("local-cluster[2,2,1024]", {}, 4),
    ("local-cluster[2, 4, 1024]", {"spark.task.cpus": "2"}, 4),
    ("yarn", {"spark.executor.instances": "3", "spark.executor.cores": "2"}, 6),
    ("spark://h:7077", {"spark.cores.max": "8"}, 8),
    ("k8s://h", {}, None),
])
def test_the_most_slots_an_application_can_have(master: str, conf: dict[str, str],
                                                 limit: int | None) -> None:
    from weir.runtime.continuous.spark_launcher import _slot_limit

    assert _slot_limit(master, conf) == limit


def test_on_a_local_master_everything_listens_on_loopback(spark: Any) -> None:
    from weir.runtime.continuous.spark_launcher import SparkLauncher

    launcher = SparkLauncher(spark)
    assert launcher.local and launcher.host == "127.0.0.1"
    assert launcher.slots() == 2 == launcher.slot_limit()


def test_runner_and_session_go_together(tmp_path: Path) -> None:
    env = environment(tmp_path, 10, None)
    with pytest.raises(ConfigurationError, match="needs spark="):
        env.execute("x", runner="spark")
    with pytest.raises(ConfigurationError, match="'local' or 'spark'"):
        env.execute("x", runner="yarn")


def test_a_failed_stage_reports_its_tasks_python_error_and_the_fix() -> None:
    from weir.runtime.continuous.spark_launcher import _cause

    spark_error = Exception(
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collect.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure\n"
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was "
        "thrown from the Python worker: Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 1\n'
        "ModuleNotFoundError: No module named 'weir'\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException")
    cause = _cause(spark_error)
    assert cause.startswith("ModuleNotFoundError: No module named 'weir'")
    assert "PYSPARK_PYTHON" in cause
    assert _cause(RuntimeError("slots: none")) == "slots: none"


def test_tasks_lists_a_spark_hosted_task_only_once_it_registered_its_pid() -> None:
    """Before registering, a task on Spark has no pid here (its stage's is 0): listing
    it would hand out a pid that signals this process's own group."""
    import threading
    from types import SimpleNamespace

    from weir.stream import JobClient

    release = threading.Event()
    stage = SimpleNamespace(pid=0, poll=lambda: None)
    job = SimpleNamespace(graph=SimpleNamespace(job="stub"), attempt=0,
                          _procs={("count", 0): stage}, task_pids={},
                          run=lambda timeout_s: release.wait(timeout_s))
    client = JobClient(job, 30)  # type: ignore[arg-type]
    try:
        assert client.tasks() == []
        job.task_pids[("count", 0)] = 4242
        assert [(t.vertex, t.subtask, t.pid) for t in client.tasks()] == [("count", 0, 4242)]
    finally:
        release.set()
