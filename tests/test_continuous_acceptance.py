"""Flink's acceptance shape (``UnalignedCheckpointITCase``, aligned here) on the
continuous runtime: subtask i of the source emits i, i+p, i+2p, …; an order-preserving
shuffle (the key is the source subtask, and channels keep order); a function that
fails once each at processing, at a snapshot, at a restore, at processing again and at
close, armed as checkpoints complete; a strict-order oracle over the committed output:
lost = duplicates = out-of-order = 0 with exactly 5 failures, and the running count
per key equal to the oracle. On the local runner (parallelism 2) and on Spark (the test
run's ``local[2]`` session: parallelism 1, two tasks), where each failure is a task
raising inside a barrier stage."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import weir
from continuous_helpers import Running, keyed_graph
from weir.api.checkpointing import CheckpointConfig
from weir.connectors.stream import SequenceSource, read_stream_sink
from weir.runtime.continuous.master import LocalJob
from weir.runtime.continuous.spark_launcher import SparkLauncher

P = 2
SEEN = weir.ValueStateDescriptor[int]("seen", weir.IntSerializer())


class Failing(weir.KeyedProcessFunction[int, list[int]], weir.CheckpointedFunction):
    """Counts per key; fails once where a marker file in ``markers`` says (the first
    task to rename the marker away fires it)."""

    def __init__(self, markers: str) -> None:
        self.markers = markers
        self.n = 0

    def _fire(self, where: str) -> None:
        marker = os.path.join(self.markers, where)
        try:
            os.rename(marker, marker + ".fired")
        except FileNotFoundError:
            return
        raise RuntimeError(f"injected failure at {where}")

    def initialize_state(self, ctx: Any) -> None:
        if ctx.is_restored:
            self._fire("restore")

    def snapshot_state(self, ctx: Any) -> None:
        self._fire("snapshot")

    def open(self, ctx: Any) -> None:
        self.seen = ctx.get_state(SEEN)

    def process_element(self, value: int, ctx: Any) -> Any:
        self.n += 1
        if self.n % 64 == 0:
            self._fire("map")
        count = (self.seen.value() or 0) + 1
        self.seen.update(count)
        yield [value % P, value, count]

    def close(self) -> None:
        self._fire("close")


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def oracle(rows: list[list[int]], n: int) -> tuple[int, int, int]:
    """(lost, duplicates, out of order) of each source subtask's sequence, in the order
    the sink committed it."""
    lost = dup = disorder = 0
    for key in range(P):
        values = [v for k, v, _ in rows if k == key]
        prev = None
        for v in values:
            if prev is not None:
                if v == prev:
                    dup += 1
                elif v < prev:
                    disorder += 1
                else:
                    lost += (v - prev) // P - 1
            else:
                lost += (v - key) // P
            prev = v if prev is None or v > prev else prev
        last = max(range(key, n, P))
        lost += 0 if prev is None else (last - prev) // P
    return lost, dup, disorder


# make test runs it on RocksDB (the backend with more to get wrong on restore: native
# checkpoints, shared files); make soak (WEIR_SOAK=1) on both.
SOAK_BACKENDS = ["hashmap", "rocksdb"] if os.environ.get("WEIR_SOAK") else ["rocksdb"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", SOAK_BACKENDS)
@pytest.mark.parametrize("runner", ["local", pytest.param("spark", marks=pytest.mark.spark)])
def test_five_failures_at_every_stage_lose_duplicate_or_reorder_nothing(
    tmp_path: Path, backend: str, runner: str, request: pytest.FixtureRequest
) -> None:
    n = 100_000
    markers = tmp_path / "markers"
    markers.mkdir()
    (markers / "close").touch()  # armed from the start: fires at the end of the job
    spec = keyed_graph(tmp_path, source=SequenceSource(n, 20_000), source_uid="source",
                       key_selector=lambda v: v % P, function=Failing(str(markers)),
                       function_uid="failing", parallelism=P if runner == "local" else 1,
                       backend=backend, max_parallelism=16, job="acceptance")
    launcher = (None if runner == "local"
                else SparkLauncher(request.getfixturevalue("spark")))
    job = LocalJob(spec, CheckpointConfig(interval=50),
                   restart=weir.RestartStrategy.fixed_delay(attempts=5, delay="0 s"),
                   launcher=launcher)
    running = Running(job, timeout_s=240)
    # each armed once its attempt completed 3 checkpoints
    running.arm_in_turn(markers, [(0, 3, ["map"]), (1, 3, ["snapshot", "restore"]),
                                  (3, 3, ["map"])])
    errors = running.join(240)
    assert not errors, errors
    fired = sorted(p.name for p in markers.iterdir())
    assert fired == ["close.fired", "map.fired", "restore.fired", "snapshot.fired"]
    causes = [m.group(1) for f in job.result.failures
              if (m := re.search(r"injected failure at (\w+)", f))]
    assert causes == ["map", "snapshot", "restore", "map", "close"], job.result.failures
    assert job.result.restarts == 5
    rows = read_stream_sink(tmp_path / "out")
    assert oracle(rows, n) == (0, 0, 0)
    counts = weir.read_state(str(tmp_path / "chk")).keyed_state("failing", "seen")
    assert dict(zip(counts["key"], counts["value"], strict=True)) == {k: n // P for k in range(P)}
    for key in range(P):  # the running count of each committed row is its position
        assert [c for k, _, c in rows if k == key] == list(range(1, n // P + 1))
