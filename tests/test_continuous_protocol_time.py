"""Time and configuration in the continuous runtime's protocol.

Time (issue situation 10): checkpoint scheduling decides on a monotonic clock — the
periodic trigger, the minimum pause, the timeout, the queue's age order — and only
stamps each started checkpoint with the wall clock, so stepping the wall clock back or
forward by an hour neither stalls the next checkpoint (and the sink commits after it)
nor expires a pending one. Tested with two injected manual clocks, and with the
scheduler's default clocks under a stepped ``time.time_ns``.

Configuration (issue situation 11): every invalid setting of a job — environment,
operators, graph, ``execute`` arguments — raises ``ConfigurationError`` naming the
value and what is allowed while the job is built, fast, before any task process is
launched (so never as failing tasks restarted until a deadline); and ``execute`` has
no deadline unless given one (Flink's has none).
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from weir.api.checkpointing import CheckpointConfig
from weir.connectors import FileSink, SequenceSource, read_stream_sink
from weir.errors import ConfigurationError
from weir.runtime.continuous import master as master_module
from weir.runtime.continuous import zygote
from weir.runtime.continuous.channels import ChannelConfig
from weir.runtime.continuous.client import JobResult
from weir.runtime.continuous.master import LocalJob
from weir.runtime.continuous.queries import QueryServerConfig
from weir.runtime.continuous.scheduling import (
    AbortedCheckpoint,
    CheckpointFailureReason,
    CheckpointScheduler,
    Decision,
    DroppedRequest,
    RequestKind,
    StartCheckpoint,
)
from weir.runtime.operator_base import StateBackendKind
from weir.stream import RestartStrategy, StreamEnvironment

K = RequestKind
R = CheckpointFailureReason
HOUR_MS = 3_600_000
EPOCH_MS = 1_700_000_000_000  # the wall clock's reading when the monotonic one reads 0
STEPS = pytest.mark.parametrize("step", [-HOUR_MS, HOUR_MS], ids=["back", "forward"])


class Clock:
    """A manual clock in int milliseconds."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Clocks:
    """A monotonic clock and a wall clock that pass time together; only the wall one
    is ever stepped."""

    def __init__(self) -> None:
        self.monotonic, self.wall = Clock(0), Clock(EPOCH_MS)

    def advance(self, ms: int) -> None:
        self.monotonic.now += ms
        self.wall.now += ms

    def step_wall(self, ms: int) -> None:
        self.wall.now += ms


def _started(decisions: list[Decision]) -> list[StartCheckpoint]:
    return [d for d in decisions if isinstance(d, StartCheckpoint)]


def _scheduler(**config: Any) -> tuple[CheckpointScheduler, Clocks]:
    clocks = Clocks()
    return CheckpointScheduler(CheckpointConfig(**config), clocks.monotonic,
                               wall_clock=clocks.wall), clocks


# ------------------------------------------------------------------------------ time


@STEPS
def test_a_wall_clock_step_does_not_move_the_next_periodic_checkpoint(step: int) -> None:
    s, clocks = _scheduler(interval_ms=1_000)
    s.start()
    clocks.advance(400)
    clocks.step_wall(step)
    assert s.next_wakeup_ms() == 1_000 and s.wakeup_delay_ms() == 600
    clocks.advance(599)
    assert s.poll() == []  # (stepped forward: not early)
    clocks.advance(1)  # (stepped back: not an hour late)
    assert s.poll() == [StartCheckpoint(1, K.PERIODIC, EPOCH_MS + 1_000 + step, 1)]
    assert s.completed(1) == []
    clocks.step_wall(-step)  # and back again: the fixed rate goes on
    clocks.advance(1_000)
    assert [(d.checkpoint_id, d.timestamp_ms) for d in _started(s.poll())] == [
        (2, EPOCH_MS + 2_000)]


@STEPS
def test_a_wall_clock_step_does_not_change_whether_a_pending_checkpoint_expires(
        step: int) -> None:
    s, clocks = _scheduler(timeout_ms=60_000, tolerable_failures=5)
    s.request(K.MANUAL)
    assert s.poll() == [StartCheckpoint(1, K.MANUAL, EPOCH_MS, 1)]
    s.request(K.MANUAL)
    assert s.poll() == []  # (waits: max_concurrent 1)
    clocks.advance(10_000)
    clocks.step_wall(step)
    assert s.poll() == [] and set(s.pending) == {1}  # (stepped forward: not expired)
    assert s.wakeup_delay_ms() == 50_000
    assert s.completed(1) == []  # it completes in time
    (second,) = s.poll()
    assert second == StartCheckpoint(2, K.MANUAL, EPOCH_MS + 10_000 + step, 2)
    clocks.advance(59_999)
    assert s.poll() == [] and s.wakeup_delay_ms() == 1
    clocks.advance(1)  # (stepped back: expires on time, not an hour late)
    assert s.poll() == [AbortedCheckpoint(2, K.MANUAL, R.CHECKPOINT_EXPIRED)]
    assert s.consecutive_failures == 1


@STEPS
def test_a_wall_clock_step_does_not_change_the_minimum_pause(step: int) -> None:
    s, clocks = _scheduler(interval_ms=500, min_pause_ms=500)
    s.start()
    clocks.advance(500)
    assert [d.checkpoint_id for d in _started(s.poll())] == [1]
    clocks.advance(400)
    s.completed(1)  # at 900: the pause lasts until 1400
    clocks.step_wall(step)
    clocks.advance(100)
    (dropped,) = s.poll()  # the trigger at 1000 falls in the pause
    assert isinstance(dropped, DroppedRequest)
    assert dropped.reason is R.MINIMUM_TIME_BETWEEN_CHECKPOINTS
    assert s.next_wakeup_ms() == 1_400  # (not moved by the step)
    clocks.advance(399)
    assert s.poll() == []
    clocks.advance(1)
    assert s.poll() == [StartCheckpoint(2, K.PERIODIC, EPOCH_MS + 1_400 + step, 3)]


def test_a_wall_clock_step_back_does_not_reorder_queued_requests() -> None:
    s, clocks = _scheduler()
    s.request(K.MANUAL)
    s.poll()
    older = s.request(K.MANUAL)
    clocks.step_wall(-HOUR_MS)  # a request made "an hour earlier" by the wall clock
    clocks.advance(1)
    newer = s.request(K.MANUAL)
    s.completed(1)
    assert [d.request_id for d in _started(s.poll())] == [older]  # the oldest first
    s.completed(2)
    assert [d.request_id for d in _started(s.poll())] == [newer]


def test_by_default_timing_is_monotonic_and_trigger_timestamps_are_wall_clock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = CheckpointScheduler(CheckpointConfig(interval=60_000, timeout=60_000))
    s.start()
    real_time_ns = time.time_ns
    for step in (HOUR_MS, -HOUR_MS):  # the system's wall clock steps
        monkeypatch.setattr(time, "time_ns", lambda step=step: real_time_ns()
                            + step * 1_000_000)
        delay = s.wakeup_delay_ms()
        assert delay is not None and 50_000 < delay <= 60_000  # the trigger: unmoved
        s.request(K.MANUAL)
        (start,) = s.poll()
        assert isinstance(start, StartCheckpoint)
        assert abs(start.timestamp_ms - (real_time_ns() // 1_000_000 + step)) < 10_000
        assert s.poll() == [] and start.checkpoint_id in s.pending  # not expired
        assert s.completed(start.checkpoint_id) == []


# --------------------------------------------------------------------- configuration


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every task process a test's job tried to launch (none is: the test fails)."""
    calls: list[Any] = []

    def launch(argv: list[str], env: dict[str, str]) -> Any:
        calls.append(argv)
        raise AssertionError(f"a task process was launched: {argv}")

    monkeypatch.setattr(zygote, "launch", launch)
    yield calls
    assert calls == []


def _refused(build: Callable[[], object], *named: str) -> ConfigurationError:
    """``build()`` raises ConfigurationError at once, naming each of ``named``."""
    began = time.monotonic()
    with pytest.raises(ConfigurationError) as info:
        build()
    assert time.monotonic() - began < 2.0  # refused while built, not after restarts
    message = str(info.value)
    for text in named:
        assert text in message, (text, message)
    assert "no more restarts" not in message  # (the error of a job that restarted)
    return info.value


def _env(tmp_path: Path, **settings: Any) -> StreamEnvironment:
    return StreamEnvironment(checkpoint_storage=settings.pop("checkpoint_storage",
                                                             tmp_path / "chk"), **settings)


def _job(tmp_path: Path, **settings: Any) -> StreamEnvironment:
    env = _env(tmp_path, **settings)
    env.from_source(SequenceSource(1_000), uid="numbers").sink_to(
        FileSink(tmp_path / "out"), uid="sink")
    return env


def test_an_unknown_state_backend_is_refused_when_the_environment_is_built(
        tmp_path: Path, launched: list[Any]) -> None:
    _refused(lambda: _env(tmp_path, state_backend="rockdb"),
             "'rockdb'", "'hashmap'", "'rocksdb'")
    # set after the environment was built: refused with the job graph, not in the tasks
    env = _job(tmp_path)
    env.state_backend = "rockdb"
    _refused(lambda: env.execute("typo"), "'rockdb'", "'hashmap'", "'rocksdb'")
    _refused(lambda: env.execute_async("typo"), "'rockdb'")
    assert _env(tmp_path, state_backend=StateBackendKind.ROCKSDB).state_backend == "rocksdb"


@pytest.mark.parametrize(("settings", "named"), [
    ({"parallelism": 0}, ["parallelism=0", "positive int"]),
    ({"parallelism": 2.0}, ["parallelism=2.0", "positive int"]),
    ({"parallelism": True}, ["parallelism=True"]),
    ({"max_parallelism": 0}, ["max_parallelism=0", "[1, 32768]"]),
    ({"max_parallelism": 40_000}, ["max_parallelism=40000", "[1, 32768]"]),
    ({"parallelism": 8, "max_parallelism": 4}, ["parallelism=8 is above max_parallelism=4"]),
    ({"state_backend": None}, ["state_backend None", "'hashmap'", "'rocksdb'"]),
    ({"checkpointing": {"interval_ms": 1_000}},
     ["checkpointing must be a weir.CheckpointConfig", "dict"]),
    ({"restart_strategy": "no_restart"}, ["restart_strategy must be a weir.RestartStrategy"]),
    ({"channels": {"buffer_records": 4}}, ["channels must be a weir.stream.ChannelConfig"]),
    ({"channels": ChannelConfig(buffer_records=1.5)},  # type: ignore[arg-type]
     ["ChannelConfig.buffer_records must be an int >= 1, got 1.5"]),
    ({"channels": ChannelConfig(floating_buffers=True)},
     ["ChannelConfig.floating_buffers must be an int >= 0, got True"]),
    ({"channels": ChannelConfig(buffer_timeout_ms=math.nan)},
     ["ChannelConfig.buffer_timeout_ms", ">= 0", "nan"]),
    ({"channels": ChannelConfig(flush_when_idle="no")},  # type: ignore[arg-type]
     ["ChannelConfig.flush_when_idle must be a bool, got 'no'"]),
    ({"query_server": QueryServerConfig(port=70_000)},
     ["QueryServerConfig.port must be an int in [0, 65535]", "70000"]),
    ({"query_server": QueryServerConfig(port=-1)}, ["QueryServerConfig.port", "-1"]),
    ({"query_server": "127.0.0.1:0"}, ["query_server must be a weir.stream.QueryServerConfig"]),
    ({"checkpoint_storage": ""}, ["checkpoint_storage must be a non-empty path or URL"]),
    ({"checkpoint_storage": 42}, ["checkpoint_storage must be a non-empty path or URL", "42"]),
    ({"checkpoint_storage": "nosuchfs://bucket/chk"},
     ["'nosuchfs://bucket/chk'", "unknown filesystem 'nosuchfs'"]),
    ({"rocksdb_memory": 256}, ["rocksdb_memory must be a weir.RocksDBMemory"]),
])
def test_invalid_environment_settings_are_refused_when_it_is_built(
        tmp_path: Path, launched: list[Any], settings: dict[str, Any], named: list[str]) -> None:
    _refused(lambda: _env(tmp_path, **settings), *named)


@pytest.mark.parametrize(("add", "named"), [
    (lambda env: env.from_source(SequenceSource(1), uid="src", parallelism=0),
     ["operator 'src'", "parallelism=0 must be a positive int"]),
    (lambda env: env.from_source(SequenceSource(1), uid="src", parallelism=-2),
     ["operator 'src'", "parallelism=-2"]),
    (lambda env: env.from_source(SequenceSource(1), uid="src").sink_to(
        FileSink("/nowhere"), uid="out", parallelism=1.5),
     ["operator 'out'", "parallelism=1.5"]),
    (lambda env: env.from_source(SequenceSource(1), uid="src").map(abs).sink_to(
        FileSink("/nowhere"), uid="wide", parallelism=200),
     ["operator 'wide'", "parallelism=200 is above max_parallelism=128"]),
])
def test_invalid_operator_settings_are_refused_when_the_operator_is_added(
        tmp_path: Path, launched: list[Any], add: Callable[[StreamEnvironment], object],
        named: list[str]) -> None:
    env = _env(tmp_path)
    _refused(lambda: add(env), *named)


def test_a_keyed_operator_parallelism_of_zero_is_refused_not_taken_as_the_default(
        tmp_path: Path, launched: list[Any]) -> None:
    from weir.api.functions import KeyedProcessFunction

    class Passing(KeyedProcessFunction[int, int]):
        def process_element(self, value: int, ctx: Any) -> Any:
            yield value

    keyed = _env(tmp_path, parallelism=2).from_source(SequenceSource(1), uid="s").key_by(abs)
    _refused(lambda: keyed.process(Passing(), uid="k", parallelism=0),
             "operator 'k'", "parallelism=0")


@pytest.mark.parametrize(("arguments", "named"), [
    ({"timeout": 0}, ["timeout must be None (no deadline", "got 0"]),
    ({"timeout": -5.0}, ["timeout", "-5.0"]),
    ({"timeout": datetime.timedelta(0)}, ["timeout", "timedelta(0)"]),
    ({"timeout": datetime.timedelta(seconds=-1)}, ["timeout"]),
    ({"timeout": "60"}, ["timeout", "'60'"]),
    ({"timeout": math.nan}, ["timeout", "nan"]),
    ({"timeout": True}, ["timeout", "True"]),
    ({"job_name": ""}, ["a job name must be a non-empty string"]),
    ({"job_name": 7}, ["a job name must be a non-empty string, got 7"]),
    ({"job_name": "a/b"}, ["job name 'a/b' contains ['/']"]),
    ({"job_name": "x\n"}, ["job name 'x\\n'"]),
    ({"restore_from": 42}, ["restore_from must be the path or URL", "42"]),
    ({"allow_non_restored_state": "yes"}, ["allow_non_restored_state must be a bool"]),
    ({"runner": "yarn"}, ["runner must be 'local' or 'spark', got 'yarn'"]),
])
@pytest.mark.parametrize("call", ["execute", "execute_async"])
def test_invalid_execute_arguments_are_refused_before_any_task_starts(
        tmp_path: Path, launched: list[Any], arguments: dict[str, Any], named: list[str],
        call: str) -> None:
    env = _job(tmp_path)
    arguments = dict(arguments)
    name = arguments.pop("job_name", "job")
    _refused(lambda: getattr(env, call)(name, **arguments), *named)


@pytest.mark.parametrize(("change", "named"), [
    ({"state_backend": "rockdb"}, ["job 'g-", "unknown state_backend 'rockdb'"]),
    ({"source_batch": 0}, ["job 'g-", "source_batch must be an int >= 1, got 0"]),
    ({"heartbeat_timeout_s": 0.0}, ["job 'g-", "heartbeat_timeout_s", "> 0, got 0.0"]),
    ({"channel": ChannelConfig(buffer_timeout_ms=math.inf)},
     ["job 'g-", "ChannelConfig.buffer_timeout_ms", "inf"]),
    ({"checkpoint_storage": ""}, ["job 'g-", "checkpoint_storage"]),
])
def test_a_job_graph_with_an_invalid_setting_cannot_be_built(
        tmp_path: Path, launched: list[Any], change: dict[str, Any], named: list[str]) -> None:
    graph = _job(tmp_path).job_graph("g")
    _refused(lambda: dataclasses.replace(graph, **change), *named)


def test_operator_uids_used_twice_are_refused_before_any_task_starts(
        tmp_path: Path, launched: list[Any]) -> None:
    env = _env(tmp_path)
    env.from_source(SequenceSource(1), uid="same").sink_to(FileSink(tmp_path / "o"),
                                                           uid="same")
    _refused(lambda: env.execute("twice"), "operator uids must be unique", "['same']")


# ---------------------------------------------------------------------- no deadline


def test_execute_has_no_deadline_by_default() -> None:
    for call in (StreamEnvironment.execute, StreamEnvironment.execute_async):
        assert inspect.signature(call).parameters["timeout"].default is None


@pytest.mark.parametrize(("arguments", "deadline"), [
    ({}, None), ({"timeout": None}, None), ({"timeout": math.inf}, None),
    ({"timeout": 30}, 30.0), ({"timeout": 0.5}, 0.5),
    ({"timeout": datetime.timedelta(minutes=2)}, 120.0),
])
@pytest.mark.parametrize("call", ["execute", "execute_async"])
def test_execute_hands_the_job_its_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arguments: dict[str, Any],
        deadline: float | None, call: str) -> None:
    seen: list[float] = []

    def run(self: LocalJob, timeout_s: float | None = None) -> JobResult:
        seen.append(timeout_s)
        return JobResult()

    monkeypatch.setattr(LocalJob, "claim", lambda self: None)  # (no storage claimed)
    monkeypatch.setattr(LocalJob, "run", run)
    outcome = getattr(_job(tmp_path), call)("deadline", **arguments)
    if call == "execute_async":
        outcome.wait(60)
    (timeout_s,) = seen
    assert timeout_s == deadline


class _DayPerReading:
    """``time`` as the job's driver sees it: every monotonic reading a day later."""

    def __init__(self) -> None:
        self.days = 0

    def monotonic(self) -> float:
        self.days += 1
        return time.monotonic() + self.days * 86400.0

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_a_job_that_runs_for_days_is_not_ended_by_a_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's monotonic clock moves a day at every reading: with the old default
    deadline (an hour) the job failed at its first wait; with none it finishes."""
    driver_time = _DayPerReading()
    monkeypatch.setattr(master_module, "time", driver_time)
    env = _job(tmp_path, restart_strategy=RestartStrategy.no_restart())
    result = env.execute("days")
    assert driver_time.days >= 3  # the driver saw days go by
    assert result.restarts == 0 and not result.failures and result.completed
    assert sorted(read_stream_sink(tmp_path / "out")) == list(range(1_000))
