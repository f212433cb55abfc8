"""``CheckpointConfig(materialization_interval=...)`` on the continuous runtime: a keyed
task checkpointing its hash-map state as a changelog materializes the whole state (a
full copy, ``m<checkpoint>-*.keyed``, which later checkpoints use as their base) at
about that interval — and not at all within a run shorter than a long one, when the
deltas stay small next to the base."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

import weir
from continuous_helpers import by_value, keyed_graph
from weir.api.checkpointing import CheckpointConfig, SnapshotStrategy
from weir.checkpoint.format import KeyedChangelogHandle
from weir.connectors.stream import SequenceSource
from weir.runtime.continuous.master import LocalJob

SEEN = weir.ValueStateDescriptor[int]("seen", weir.IntSerializer())
BLOB = weir.ValueStateDescriptor[bytes]("blob", weir.BytesSerializer())


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


class Grow(weir.KeyedProcessFunction[int, Any]):
    """One new key per record (a small delta per checkpoint); the first record's key
    also holds 256 KiB, so the base is far larger than the deltas (eight times the
    base is never reached by size in the run)."""

    def open(self, ctx: Any) -> None:
        self.seen = ctx.get_state(SEEN)
        self.blob = ctx.get_state(BLOB)

    def process_element(self, value: int, ctx: Any) -> Any:
        self.seen.update(value)
        if value == 0:
            self.blob.update(bytes(range(256)) * 1024)
        return ()


def materializations(tmp_path: Path, interval: str) -> tuple[list[int], list[int]]:
    """Run the job (about 3.5 s of input, a checkpoint every 100 ms) with
    ``materialization_interval=interval``; the checkpoint ids the materializations
    its checkpoints used copied, and the trigger times (ms) of those checkpoints."""
    graph = keyed_graph(tmp_path, source=SequenceSource(700, 200), function=Grow(),
                        key_selector=lambda v: v, parallelism=1, job="grow")
    config = CheckpointConfig(interval=100, snapshot=SnapshotStrategy.CHANGELOG,
                              materialization_interval=interval)
    result = LocalJob(graph, config, retained=1000,
                      restart=weir.RestartStrategy.no_restart()).run(timeout_s=120)
    assert len(result.completed) >= 10, result.completed
    chain = weir.CheckpointCoordinator(str(tmp_path / "chk"), retained=1000,
                                       clean_up=False).completed_checkpoints
    assert len(chain) == len(result.completed)
    copied: set[int] = set()
    deltas = 0
    for checkpoint in chain:
        (handle,) = checkpoint.metadata.operators["count"].subtasks
        keyed = handle.keyed
        assert isinstance(keyed, KeyedChangelogHandle)
        deltas += len(keyed.deltas)
        name = keyed.base.file.path.rsplit("/", 1)[-1]
        if name.startswith("m"):  # a materialization: m<checkpoint it copied>-...
            copied.add(int(name[1:].split("-", 1)[0]))
    assert deltas, "no checkpoint wrote a delta"
    by_id = {c.checkpoint_id: c.metadata.trigger_timestamp_ms for c in chain}
    ids = sorted(copied)
    return ids, [by_id[i] for i in ids if i in by_id]


def test_a_short_materialization_interval_materializes_at_about_that_interval(
    tmp_path: Path
) -> None:
    ids, times = materializations(tmp_path, "300 ms")
    assert len(ids) >= 3, ids
    # never more often than the interval (less the barrier's way to the task)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= 200 for gap in gaps), (ids, gaps)


def test_a_long_materialization_interval_does_not_materialize(tmp_path: Path) -> None:
    ids, _ = materializations(tmp_path, "1 h")
    assert ids == []
