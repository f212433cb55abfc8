"""Backpressure you can see (``JobClient.metrics()``, ``JobClient.checkpoints()``): a
source feeding a slow keyed function is backpressured, the slowest task busy with its
input queued; every completed checkpoint reports, per task, when it
acknowledged, its alignment, its snapshots' synchronous and asynchronous parts and the
records in flight it stored; the driver's rates from two heartbeats."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

import weir
from continuous_helpers import by_value
from weir.connectors.stream import FileSink, SequenceSource
from weir.runtime.continuous.metrics import MetricsBoard, TaskMetrics
from weir.stream import CheckpointConfig, CheckpointStatus, JobClient, StreamEnvironment


class Slow(weir.KeyedProcessFunction[int, int]):
    """Passes every number on, slowly."""

    def process_element(self, value: int, ctx: Any) -> Any:
        if value % 8 == 0:
            time.sleep(0.002)
        yield value


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


def after_two_heartbeats(job: JobClient, tasks: int, timeout_s: float = 30
                         ) -> dict[tuple[str, int], TaskMetrics]:
    """Every one of the ``tasks`` tasks' metrics, once each is over an interval that
    began after this call: two heartbeats of every task sampled since."""
    since_ms = int(time.time() * 1000)
    fresh: dict[tuple[str, int], set[int]] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = {(m.vertex, m.subtask): m for m in job.metrics()}
        for task, m in metrics.items():
            if m.sampled_at_ms > since_ms:
                fresh.setdefault(task, set()).add(m.sampled_at_ms)
        # the newest sample of each is its second one since: the one before it, where
        # its interval begins, was sampled after since_ms
        if len(metrics) == tasks and all(len(fresh.get(t, ())) >= 2 for t in metrics):
            return metrics
        assert time.monotonic() < deadline, (
            f"not two heartbeats of every one of {tasks} tasks in {timeout_s} s: "
            f"sampled since {since_ms}: {fresh}")
        time.sleep(0.05)


def test_a_slow_function_shows_as_busy_and_its_source_as_backpressured(tmp_path: Path) -> None:
    env = StreamEnvironment(
        weir.JobConfig(
            tmp_path / "chk",
            parallelism=2,
            checkpointing=CheckpointConfig(interval=200, unaligned=True),
        )
    )
    (env.from_source(SequenceSource(1_000_000), uid="numbers")
        .key_by(lambda v: v % 7).process(Slow(), uid="slow")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    job = env.execute_async("metrics")
    try:
        deadline = time.monotonic() + 60
        while True:
            by_task = {(m.vertex, m.subtask): m for m in job.metrics()}
            done = [s for s in job.checkpoints() if s.status is CheckpointStatus.COMPLETED]
            if len(by_task) == 4 and len(done) >= 3:
                break
            assert time.monotonic() < deadline, (by_task, done)
            time.sleep(0.1)
        metrics = after_two_heartbeats(job, 4)  # rates over a backpressured second
        sources = [metrics[("numbers", i)] for i in range(2)]
        slow = [metrics[("slow", i)] for i in range(2)]
        bottleneck = max(slow, key=lambda m: m.busy)  # (7 keys split unevenly)
        assert bottleneck.busy > 0.5 and bottleneck.backpressured < 0.1, slow
        assert sum(bottleneck.input_queued) > 0, slow
        for source in sources:
            assert source.backpressured > 0.5, sources
            assert len(source.output_backlog) == 2 and source.records_out_per_s > 0
            assert abs(source.busy + source.idle + source.backpressured - 1) < 0.01
        assert all(len(m.input_queued) == 2 and m.output_backlog == () for m in slow)
        assert bottleneck.records_in_per_s > 0
    finally:
        job.cancel()
    completed = [s for s in job.checkpoints() if s.status is CheckpointStatus.COMPLETED]
    for stats in completed:
        tasks = {(t.vertex, t.subtask): t for t in stats.subtasks}
        assert set(tasks) == {(v, i) for v in ("numbers", "slow") for i in range(2)}
        assert all(t.acknowledged_ms <= (stats.duration_ms or 0) + 1 for t in tasks.values())
        assert all(t.sync_ms >= 0 and t.async_ms >= 0 and t.state_bytes > 0
                   for t in tasks.values())
        assert tasks[("numbers", 0)].alignment_ms is None
        assert all(tasks[("slow", i)].alignment_ms is not None for i in range(2))
        assert sum(t.channel_state_bytes for t in tasks.values()) == stats.channel_state_bytes
        assert stats.alignment_ms == max(tasks[("slow", i)].alignment_ms or 0 for i in range(2))
    assert any(s.channel_state_bytes for s in completed)


def sample(t_s: float, idle_s: float, pressured_s: float, records: int) -> dict[str, Any]:
    return {"t_ns": int(t_s * 1e9), "ts": int(t_s * 1000), "idle_ns": int(idle_s * 1e9),
            "backpressured_ns": int(pressured_s * 1e9), "in": records, "out": records,
            "queued": [1, 2], "backlog": [3], "watermark": None}


def test_the_board_turns_two_heartbeats_into_rates() -> None:
    board = MetricsBoard()
    board.update(("v", 0), sample(10, 1, 2, 1000))
    assert board.snapshot() == []  # one sample: no interval yet
    board.update(("v", 0), sample(12, 1.5, 3, 5000))
    (m,) = board.snapshot()
    assert (m.idle, m.backpressured, m.busy) == (0.25, 0.5, 0.25)
    assert m.records_in_per_s == m.records_out_per_s == 2000.0
    assert (m.input_queued, m.output_backlog) == ((1, 2), (3,))
    board.update(("v", 0), sample(1, 0, 0, 0))  # restarted: counts from zero again
    assert board.snapshot() == []
