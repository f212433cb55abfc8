"""A running continuous job through its JobClient (``execute_async``): savepoints while
it runs, stop-with-savepoint (drained or not) and a restore of that savepoint at another
parallelism, cancel (checkpoints deleted or retained, no process left), and the
checkpoint history."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import weir
import weir.testing
from continuous_helpers import completed, wait_for
from weir.checkpoint.coordinator import load_checkpoint
from weir.connectors import FileSink, SequenceSource, read_stream_sink
from weir.stream import (
    CheckpointConfig,
    CheckpointStatus,
    RestartStrategy,
    StreamEnvironment,
    WatermarkStrategy,
)


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


COUNT = weir.ValueStateDescriptor[int]("count", weir.IntSerializer())


class Count(weir.KeyedProcessFunction[int, list[Any]]):
    """A running count per key, and an event-time timer far ahead of each record (it
    fires only when event time jumps to the end: a drained stop)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: int, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        if ctx.timestamp is not None:
            ctx.timer_service.register_event_time_timer(ctx.timestamp + 10**12)
        yield ["record", ctx.current_key, value, n]

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield ["timer", ctx.current_key, timestamp - 10**12, 0]


def job(tmp_path: Path, n: int, *, parallelism: int = 2, rate: float | None = 5_000,
        event_time: bool = False, retain_on_cancel: bool = False,
        out: str = "out") -> StreamEnvironment:
    env = StreamEnvironment(
        weir.JobConfig(
            tmp_path / "chk",
            parallelism=parallelism,
            max_parallelism=32,
            checkpointing=CheckpointConfig(interval=100, retain_on_cancel=retain_on_cancel),
            restart_strategy=RestartStrategy.no_restart(),
        )
    )
    watermarks = (WatermarkStrategy.bounded_out_of_orderness(0, lambda v: v, interval=20)
                  if event_time else None)
    (env.from_source(SequenceSource(n, rate), uid="numbers", watermarks=watermarks)
        .key_by(lambda v: v % 10)
        .process(Count(), uid="count")
        .sink_to(FileSink(tmp_path / out), uid="sink"))
    return env




def test_a_savepoint_while_running_then_stop_with_savepoint_and_resume_at_parallelism_3(
    tmp_path: Path
) -> None:
    n = 40_000
    client = job(tmp_path, n).execute_async("first")
    wait_for(client, "two checkpoints", lambda: completed(client) >= 2)
    running = client.trigger_savepoint(tmp_path / "savepoints")
    assert load_checkpoint(running).metadata.kind.name == "SAVEPOINT"
    again = client.trigger_savepoint(tmp_path / "savepoints")  # a parent: a new directory
    assert again != running and Path(again).parent == Path(running).parent
    assert Path(running).name.startswith("savepoint-first")
    stopped = client.stop_with_savepoint(tmp_path / "savepoints")
    result = client.wait(60)
    assert result.savepoint == stopped and not result.cancelled
    stats = client.checkpoints()
    kinds = {s.location: s.kind for s in stats if s.location}
    assert kinds == {running: "savepoint", again: "savepoint", stopped: "sync_savepoint"}
    done = [s for s in stats if s.status is CheckpointStatus.COMPLETED]
    assert all(s.duration_ms is not None and s.state_size_bytes for s in done)
    first = read_stream_sink(tmp_path / "out")
    assert 0 < len(first) < n  # it stopped before the end
    harness = weir.testing.KeyedOperatorHarness.restore(  # the harness reads it too
        Count(), lambda v: v % 10, load_checkpoint(stopped), parallelism=1, subtask_index=0,
        uid="count", max_parallelism=32, allow_non_restored_state=True)
    last = {r[1]: r[3] for r in sorted(first, key=lambda r: r[3])}
    assert {k: harness.state_of(k, COUNT) for k in range(10)} == last
    harness.close()

    job(tmp_path / "second", n, parallelism=3, rate=None).execute(
        "resumed", restore_from=stopped)
    second = read_stream_sink(tmp_path / "second" / "out")
    values = Counter(r[2] for r in first + second)
    assert values == Counter(range(n))  # every record once across the two jobs
    final = {r[1]: r[3] for r in sorted(second, key=lambda r: r[3])}
    assert final == dict.fromkeys(range(10), n // 10)  # counts went on from the savepoint


def test_stop_with_drain_fires_every_event_time_timer_into_the_sink(tmp_path: Path) -> None:
    client = job(tmp_path, 10**9, event_time=True).execute_async("drained")
    wait_for(client, "a checkpoint", lambda: completed(client) >= 1)
    client.stop_with_savepoint(tmp_path / "sp", drain=True)
    client.wait(60)
    out = read_stream_sink(tmp_path / "out")
    records = sorted(r[2] for r in out if r[0] == "record")
    timers = sorted(r[2] for r in out if r[0] == "timer")
    assert records and timers == records  # each record's timer fired, once


def test_stop_without_drain_keeps_the_timers_in_the_savepoint(tmp_path: Path) -> None:
    client = job(tmp_path, 10**9, event_time=True).execute_async("suspended")
    wait_for(client, "a checkpoint", lambda: completed(client) >= 1)
    savepoint = client.stop_with_savepoint(tmp_path / "sp")
    client.wait(60)
    out = read_stream_sink(tmp_path / "out")
    assert out and not [r for r in out if r[0] == "timer"]
    timers = weir.read_state(savepoint).timers("count")
    assert len(timers) == len({r[2] for r in out})


@pytest.mark.parametrize("retain", [False, True])
def test_cancel_stops_every_task_and_keeps_checkpoints_only_if_asked(
    tmp_path: Path, retain: bool
) -> None:
    client = job(tmp_path, 10**9, retain_on_cancel=retain).execute_async("cancelled")
    wait_for(client, "two checkpoints", lambda: completed(client) >= 2)
    tasks = client.tasks()
    assert [(t.vertex, t.subtask, t.attempt) for t in tasks] == [
        ("count", 0, 0), ("count", 1, 0), ("numbers", 0, 0), ("numbers", 1, 0)]
    assert all(os.path.exists(f"/proc/{t.pid}") for t in tasks)
    result = client.cancel()
    assert result.cancelled and client.done and client.tasks() == []
    procs = client._job._procs.values()
    assert procs and all(p.poll() is not None for p in procs)
    left = sorted(p.name for p in (tmp_path / "chk").iterdir())
    if retain:
        assert any(name.startswith("chk-") for name in left)
        latest = weir.CheckpointCoordinator(str(tmp_path / "chk")).latest()
        assert latest is not None and latest.checkpoint_id == max(
            s.checkpoint_id for s in client.checkpoints()
            if s.status is CheckpointStatus.COMPLETED)
    else:
        assert not [name for name in left if name.startswith("chk-") or name == "shared"]
    with pytest.raises(weir.ConfigurationError, match="has ended"):
        client.trigger_savepoint(tmp_path / "late")


def test_a_cancelled_job_resumes_from_its_retained_checkpoint_at_another_parallelism(
    tmp_path: Path
) -> None:
    """Cancel with retained checkpoints, then the same job at parallelism 3 on the same
    checkpoint storage: it rescales the latest checkpoint (keyed state by key groups,
    source positions by even split, the sink's transactions by union) and goes on —
    every record once in the committed output, every count exact."""
    n = 30_000
    client = job(tmp_path, n, retain_on_cancel=True).execute_async("first")
    wait_for(client, "three checkpoints", lambda: completed(client) >= 3)
    client.cancel()
    first = read_stream_sink(tmp_path / "out")
    assert 0 < len(first) < n
    job(tmp_path, n, parallelism=3, rate=None).execute("rescaled")
    out = read_stream_sink(tmp_path / "out")
    assert Counter(r[2] for r in out) == Counter(range(n))
    final = {r[1]: r[3] for r in sorted(out, key=lambda r: r[3])}
    assert final == dict.fromkeys(range(10), n // 10)


class FailsAt1000(Count):
    """Count, failing at record 1000 in every attempt."""

    def process_element(self, value: int, ctx: Any) -> Any:
        if value == 1000:
            raise RuntimeError("always at 1000")
        yield from super().process_element(value, ctx)


def test_cancel_during_a_restart_delay_ends_the_job_at_once(tmp_path: Path) -> None:
    env = StreamEnvironment(
        weir.JobConfig(
            tmp_path / "chk",
            parallelism=2,
            max_parallelism=32,
            checkpointing=CheckpointConfig(interval=100),
            restart_strategy=RestartStrategy.fixed_delay(attempts=3, delay="60 s"),
        )
    )
    (env.from_source(SequenceSource(10_000), uid="numbers").key_by(lambda v: v % 10)
        .process(FailsAt1000(), uid="count").sink_to(FileSink(tmp_path / "out"), uid="sink"))
    client = env.execute_async("failing")
    wait_for(client, "the first failure", lambda: client._job.result.failures)
    started = time.monotonic()
    result = client.cancel()
    assert result.cancelled and time.monotonic() - started < 10
    assert len(result.failures) == 1 and "always at 1000" in result.failures[0]
    assert client._job.attempt == 0  # no second attempt started


def test_the_command_line_reads_a_continuous_jobs_checkpoints(tmp_path: Path) -> None:
    """The same checkpoint format as every runtime: list, inspect (verified), state show
    and the checkpoint page work on a continuous job's checkpoint storage."""
    from typer.testing import CliRunner

    from weir.cli import app

    job(tmp_path, 5_000, rate=None).execute("cli")
    chk = str(tmp_path / "chk")
    cli = CliRunner(env={"COLUMNS": "200"})
    listed = cli.invoke(app, ["checkpoint", "list", chk])
    assert listed.exit_code == 0 and "complete" in listed.output, listed.output
    inspected = cli.invoke(app, ["checkpoint", "inspect", chk])
    assert inspected.exit_code == 0 and "verified" in inspected.output, inspected.output
    shown = cli.invoke(app, ["state", "show", chk, "--uid", "count", "--state", "count"])
    assert shown.exit_code == 0 and " 500 " in shown.output, shown.output
    page = cli.invoke(app, ["ui", chk, "--output", str(tmp_path / "page.html")])
    assert page.exit_code == 0 and "checkpoint" in (tmp_path / "page.html").read_text()
