"""What the program that runs a continuous job sees when it fails: the final
:class:`~weir.errors.JobFailedError` (from ``env.execute`` or ``JobClient.wait``) names
the root cause — the user's own exception, raised in a task process — first in its
message and keeps it as ``__cause__`` (rebuilt on the driver: ``isinstance(cause,
KeyError)`` holds), after any number of restarts and when the job's timeout ends the
restarts; and ``execute(timeout=...)`` ends a job that runs longer at about that time
with a :class:`~weir.errors.JobTimeoutError`, its tasks stopped."""

from __future__ import annotations

import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import weir
from weir.connectors import FileSink, SequenceSource
from weir.errors import JobFailedError, JobTimeoutError
from weir.runtime.continuous.master import LocalJob
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


TABLE = {k: k * 10 for k in range(10) if k != 7}


class Lookup(weir.KeyedProcessFunction[int, list[Any]]):
    """Looks each record's key up in TABLE: a KeyError for key 7 (records 7, 17, ...)."""

    def process_element(self, value: int, ctx: Any) -> Any:
        yield [value, TABLE[value % 10]]


class Identity(weir.KeyedProcessFunction[int, list[Any]]):
    """Emits every record: never fails."""

    def process_element(self, value: int, ctx: Any) -> Any:
        yield [value, 0]


class Misconfigured(weir.KeyedProcessFunction[int, list[Any]]):
    """Refuses to open: a ConfigurationError in every task."""

    def open(self, ctx: Any) -> None:
        raise weir.ConfigurationError("threshold must be > 0, got -1")

    def process_element(self, value: int, ctx: Any) -> Any:
        yield [value, 0]


def env_of(tmp_path: Path, function: Any, restart: RestartStrategy, *, n: int = 1_000,
           rate: float | None = None) -> StreamEnvironment:
    env = StreamEnvironment(weir.JobConfig(
        tmp_path / "chk", parallelism=2, max_parallelism=32,
        checkpointing=CheckpointConfig(interval=200), restart_strategy=restart))
    (env.from_source(SequenceSource(n, rate), uid="numbers")
        .key_by(lambda v: v % 10)
        .process(function, uid="lookup")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    return env


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0]


def test_a_key_error_in_the_function_is_the_cause_without_restarts(tmp_path: Path) -> None:
    env = env_of(tmp_path, Lookup(), RestartStrategy.no_restart())
    with pytest.raises(JobFailedError) as info:
        env.execute("lookup", timeout="120 s")
    error = info.value
    assert isinstance(error.__cause__, KeyError)
    assert str(error.__cause__) == "7"  # KeyError(7): as the task's str() of it
    first = _first_line(error)
    assert "KeyError: 7" in first and "lookup[" in first
    assert "no more restarts" in str(error)
    assert "did not finish" not in str(error)
    # the task's traceback goes with the cause (Python prints it below it): from the
    # user's frame on, without the frames of weir's task loop above it
    notes = "\n".join(getattr(error.__cause__, "__notes__", []))
    assert "raised in task lookup[" in notes and "TABLE[value % 10]" in notes
    assert "worker.py" not in notes and "chain.py" not in notes
    assert "Traceback" not in str(error)  # the message is not the wall


def test_the_cause_survives_restarts_and_the_job_client(tmp_path: Path) -> None:
    env = env_of(tmp_path, Lookup(), RestartStrategy.fixed_delay(attempts=2, delay="10 ms"))
    client = env.execute_async("lookup", timeout="120 s")
    with pytest.raises(JobFailedError) as info:
        client.wait(120)
    error = info.value
    assert isinstance(error.__cause__, KeyError), repr(error.__cause__)
    assert "KeyError: 7" in _first_line(error)
    assert "after 2" in str(error)  # restarts


def test_a_configuration_error_in_open_is_the_cause(tmp_path: Path) -> None:
    env = env_of(tmp_path, Misconfigured(), RestartStrategy.fixed_delay(attempts=1, delay="10 ms"))
    with pytest.raises(JobFailedError) as info:
        env.execute("misconfigured", timeout="120 s")
    error = info.value
    assert isinstance(error.__cause__, weir.ConfigurationError), repr(error.__cause__)
    assert isinstance(error.__cause__, weir.WeirError)
    assert "threshold must be > 0, got -1" in str(error.__cause__)
    assert "ConfigurationError: threshold must be > 0" in _first_line(error)


def test_a_timeout_while_restarting_ends_with_the_last_failure_as_the_cause(
    tmp_path: Path
) -> None:
    """Flink's default restarts (exponential delay, unlimited) would go on for ever; the
    timeout ends them at about its time, and the error says why the job was restarting,
    not only that time ran out."""
    timeout = 4.0
    env = env_of(tmp_path, Lookup(), RestartStrategy.exponential_delay(
        initial_backoff="500 ms", max_backoff="60 s", jitter_factor=0.0))
    started = time.monotonic()
    with pytest.raises(JobTimeoutError) as info:
        env.execute("lookup", timeout=timedelta(seconds=timeout))
    took = time.monotonic() - started
    error = info.value
    assert isinstance(error, JobFailedError)
    assert isinstance(error.__cause__, KeyError), repr(error.__cause__)
    assert "KeyError: 7" in _first_line(error)
    assert f"timeout of {timeout:g} s" in _first_line(error)
    assert timeout - 0.5 <= took < timeout + 5, took


def test_a_restart_delay_longer_than_the_timeout_is_cut_short(tmp_path: Path) -> None:
    """The wait before a restart ends with the timeout: a 60 s delay does not hold the
    job past a 3 s timeout."""
    sleeps: list[float] = []
    wait = threading.Event().wait

    def sleep(delay: float) -> Any:
        sleeps.append(delay)
        return wait(delay)

    env = env_of(tmp_path, Lookup(), RestartStrategy.no_restart())
    job = LocalJob(env.job_graph("lookup"), CheckpointConfig(interval=200),
                   restart=RestartStrategy.fixed_delay(attempts=5, delay="60 s"), sleep=sleep)
    started = time.monotonic()
    with pytest.raises(JobTimeoutError) as info:
        job.run(timeout_s=3.0)
    assert time.monotonic() - started < 3.0 + 5
    assert len(sleeps) == 1 and sleeps[0] < 3.0, sleeps
    assert isinstance(info.value.__cause__, KeyError)
    assert "before it could restart (after 0 restart(s))" in _first_line(info.value)


def test_a_job_running_past_its_timeout_is_stopped_with_a_timeout_error(tmp_path: Path) -> None:
    timeout = 3.0
    env = env_of(tmp_path, Identity(), RestartStrategy.no_restart(), n=10**9, rate=200)
    client = env.execute_async("slow", timeout=timedelta(seconds=timeout))
    started = time.monotonic()
    with pytest.raises(JobTimeoutError) as info:
        client.wait(120)
    took = time.monotonic() - started
    message = _first_line(info.value)
    assert "did not finish within its timeout of 3 s" in message
    assert "did not finish in time" not in str(info.value)
    assert timeout - 0.5 <= took < timeout + 5, took
    job = client._job
    assert all(p.poll() is not None for p in job._procs.values())  # cancelled: no process


def test_the_root_cause_is_the_task_that_failed_not_a_neighbour_whose_report_came_first(
) -> None:
    """When a task fails, its upstream neighbour loses its channel and reports that
    (a ChannelError), then closes its control connection; on a busy machine both reach
    the driver before the failed task's own report. The failed task is the cause: the
    close of a task that reported its failure adds nothing."""
    import queue

    from weir.runtime.continuous.processes import root_cause

    channel = {"kind": "failed", "error": "ChannelError: task numbers[1]: the peer closed "
               "the connection", "trace": ""}
    closed = {"kind": "disconnected", "error": "task numbers[1]: the peer closed the "
              "connection"}
    real = {"kind": "failed", "error": "RuntimeError: a real failure", "trace": ""}
    inbox: queue.Queue[Any] = queue.Queue()
    inbox.put((("numbers", 1), closed))
    inbox.put((("picky", 1), real))
    error = root_cause((("numbers", 1), channel), inbox, set(), "job")
    assert str(error).startswith("job 'job': task picky[1] failed: RuntimeError: a real "
                                 "failure (then numbers[1] failed too)"), str(error)
    assert isinstance(error.__cause__, RuntimeError)
