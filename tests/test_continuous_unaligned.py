"""Unaligned checkpoints on the continuous runtime (Flink's ``UnalignedCheckpointITCase``
shape): tiny buffers and a slow keyed function keep the job backpressured, so barriers
overtake records in flight and checkpoints store them as channel state; five failures
(at processing, at a snapshot, at a restore, at processing again, at close) restore
from such checkpoints. A strict-order oracle over the committed output: lost =
duplicates = out-of-order = 0 with the five failures counted, unaligned from the start
and aligned with a timeout that switches to unaligned."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import test_continuous_acceptance as acceptance
import weir
from continuous_helpers import TINY, Running, by_value, keyed_graph
from weir.api.checkpointing import CheckpointConfig
from weir.api.connectors import SourceReader
from weir.checkpoint.coordinator import CheckpointCoordinator
from weir.connectors.stream import SequenceSource, read_stream_sink
from weir.processor.history import checkpoint_history
from weir.runtime.continuous.master import LocalJob

P = acceptance.P


class SlowFailing(acceptance.Failing):
    """The acceptance test's failing count, slowed down so that its input backs up."""

    def process_element(self, value: int, ctx: Any) -> Any:
        if value % 16 == 0:
            time.sleep(0.002)
        yield from super().process_element(value, ctx)


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])
    by_value(acceptance)


class PacedSequence(SequenceSource):
    """0..n-1, each reader at most ``first`` records ahead of its start plus ``per``
    for every checkpoint completed since: the input lasts a number of checkpoints, not
    of seconds (under load checkpoints slow down more than the function: a run read
    all 48,000 numbers before its last failure was armed, and ended)."""

    def __init__(self, n: int, first: int = 2_000, per: int = 800) -> None:
        super().__init__(n)
        self.first, self.per = first, per

    def reader(self, subtask: int, parallelism: int, positions: list[Any] | None
               ) -> SourceReader[int]:
        return _Paced(super().reader(subtask, parallelism, positions), self.first, self.per)


class _Paced(SourceReader[int]):
    def __init__(self, inner: SourceReader[int], first: int, per: int) -> None:
        self.inner, self.allowed, self.per = inner, first, per

    def poll(self, max_records: int) -> list[int] | None:
        if self.allowed <= 0:
            time.sleep(0.002)
            return []
        out = self.inner.poll(min(max_records, self.allowed))
        self.allowed -= len(out or ())
        return out

    def positions(self) -> list[Any]:
        return self.inner.positions()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.allowed += self.per


def slow_failing_job(tmp_path: Path, n: int, markers: Path, *, parallelism: int,
                     backend: str, config: CheckpointConfig, attempts: int,
                     launcher: Any = None) -> LocalJob:
    """Numbers 0..n-1 (paced by checkpoints) keyed by n % P into ``SlowFailing``, tiny
    buffers, a file sink."""
    spec = keyed_graph(tmp_path, source=PacedSequence(n), source_uid="source",
                       key_selector=lambda v: v % P, function=SlowFailing(str(markers)),
                       function_uid="failing", parallelism=parallelism, backend=backend,
                       max_parallelism=16, job="unaligned", channel=TINY)
    return LocalJob(spec, config,
                    restart=weir.RestartStrategy.fixed_delay(attempts=attempts, delay="0 s"),
                    launcher=launcher)


@pytest.mark.parametrize("aligned_timeout_ms", [0, 20], ids=["unaligned", "aligned-timeout"])
def test_five_failures_under_backpressure_lose_duplicate_or_reorder_nothing(
    tmp_path: Path, aligned_timeout_ms: int
) -> None:
    n = 48_000
    markers = tmp_path / "markers"
    markers.mkdir()
    (markers / "close").touch()  # armed from the start: fires at the end of the job
    job = slow_failing_job(tmp_path, n, markers, parallelism=P, backend="rocksdb",
                           config=CheckpointConfig(interval=50, unaligned=True,
                                                   aligned_timeout=aligned_timeout_ms),
                           attempts=5)
    running = Running(job, timeout_s=240)

    def with_channel_state() -> int:
        return sum(1 for s in job.checkpoint_stats() if s.channel_state_bytes)

    # each armed once its attempt completed 3 checkpoints, the latest with records in flight
    running.arm_in_turn(markers, [(0, 3, ["map"]), (1, 3, ["snapshot", "restore"]),
                                  (3, 3, ["map"])],
                        lambda: bool(job.checkpoint_stats()[-1].channel_state_bytes))
    assert not running.join(240)
    causes = [m.group(1) for f in job.result.failures
              if (m := re.search(r"injected failure at (\w+)", f))]
    assert causes == ["map", "snapshot", "restore", "map", "close"], job.result.failures
    assert job.result.restarts == 5
    stored = with_channel_state()
    rows = read_stream_sink(tmp_path / "out")
    lost, duplicates, disorder = acceptance.oracle(rows, n)
    # wrong state: a committed row whose running count is not its position in its key
    mismatched = sum(c != i for key in range(P)
                     for i, c in enumerate((c for k, _, c in rows if k == key), 1))
    corrupt = 0
    coordinator = CheckpointCoordinator(tmp_path / "chk", clean_up=False)
    for completed in coordinator.completed_checkpoints:
        try:
            completed.verify()
        except weir.CorruptCheckpointError:
            corrupt += 1
    # every checkpoint aborted on a failure is gone, whatever its tasks wrote into it
    on_disk = {p for p in coordinator.storage.walk_files()
               if not p.startswith("claims/")}  # (the owner's claims: weir.checkpoint.ownership)
    assert on_disk == coordinator.referenced_files()
    print(f"[{aligned_timeout_ms} ms] L={lost} D={duplicates} M={mismatched} C={corrupt} "
          f"out-of-order={disorder} | failures={len(causes)}, checkpoints with channel "
          f"state={stored}")
    assert (lost, duplicates, mismatched, corrupt, disorder) == (0, 0, 0, 0, 0)
    assert stored > 0
    history = checkpoint_history(str(tmp_path / "chk"))  # what the checkpoint page shows
    assert history.summary["alignment_ms"] is not None
    assert all(s.alignment_ms is not None for e in history.completed() for s in e.subtasks
               if s.operator == "failing")


class _LateToTrigger(SourceReader[int]):
    def __init__(self, inner: SourceReader[int], delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    def poll(self, max_records: int) -> list[int] | None:
        return self.inner.poll(max_records)

    def positions(self) -> list[Any]:  # read at each trigger, before the barrier goes
        time.sleep(self.delay_s)
        return self.inner.positions()

    def close(self) -> None:
        self.inner.close()


class LateToTrigger(SequenceSource):
    """Numbers; subtask 1 emits each barrier 300 ms after its trigger."""

    def reader(self, subtask: int, parallelism: int, positions: list[Any] | None
               ) -> SourceReader[int]:
        return _LateToTrigger(super().reader(subtask, parallelism, positions),
                              0.3 if subtask == 1 else 0.0)


def test_the_final_checkpoint_waits_for_the_pending_unaligned_one(tmp_path: Path) -> None:
    """A bounded job's final checkpoint starts once its sources ended, with a periodic
    one still pending (one source is late with every barrier). Started beside it, the
    final one's barrier reached the keyed tasks ahead of the late source's barrier of
    the pending one, and they gave the pending one up — a decline counted against
    ``tolerable_failures`` (0), so the job restarted. Unaligned checkpoints run one at
    a time: nothing is aborted, nothing restarts."""
    n = 2_000
    spec = keyed_graph(tmp_path, source=LateToTrigger(n), key_selector=lambda v: v % P,
                       function=acceptance.Failing(str(tmp_path)), function_uid="failing",
                       parallelism=2, max_parallelism=16, job="final", channel=TINY)
    job = LocalJob(spec, CheckpointConfig(interval=10, unaligned=True),
                   restart=weir.RestartStrategy.fixed_delay(attempts=3, delay="0 s"))
    job.run()
    assert (job.result.aborted, job.result.restarts) == ([], 0), job.result.failures
    assert len(job.result.completed) >= 2
    assert acceptance.oracle(read_stream_sink(tmp_path / "out"), n) == (0, 0, 0)


@pytest.mark.spark
def test_on_spark_a_failure_restores_the_records_in_flight(tmp_path: Path, spark: Any) -> None:
    """The same on the Spark runner (the test session's two slots: a source and one
    keyed task), one failure after a checkpoint that stored records in flight."""
    from weir.runtime.continuous.spark_launcher import SparkLauncher

    n = 30_000
    markers = tmp_path / "markers"
    markers.mkdir()
    job = slow_failing_job(tmp_path, n, markers, parallelism=1, backend="hashmap",
                           config=CheckpointConfig(interval=50, unaligned=True),
                           attempts=1, launcher=SparkLauncher(spark))
    running = Running(job, timeout_s=240)
    running.until(lambda: len(job.result.completed) >= 3
                  and bool(job.checkpoint_stats()[-1].channel_state_bytes), 120, 0.005)
    (markers / "map").touch()
    assert not running.join(240)
    assert job.result.restarts == 1 and "injected failure at map" in job.result.failures[0]
    rows = read_stream_sink(tmp_path / "out")
    assert acceptance.oracle(rows, n) == (0, 0, 0)
    for key in range(P):
        assert [c for k, _, c in rows if k == key] == list(range(1, n // P + 1))
