"""Rescaling from an unaligned checkpoint (Flink's ``UnalignedCheckpointRescaleITCase``):
a backpressured job (tiny buffers, a slow function) is cancelled right after a
checkpoint that stored records in flight, and a new job restores it with the slow
operator at another parallelism. Every input number must come out exactly once — none
lost with the records in flight, none replayed twice — for keyed, forward (both sides
rescaled), rebalance and union edges (also with the union's inputs listed the other way
round in the new job: channel state belongs to a producer and a consumer, not to an
input's position), and broadcast (every new subtask's broadcast state then holds every
rule), and a keyed edge whose records are Arrow batches split by their key column
(each new subtask replays the rows it owns of the parts in flight)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import weir
from continuous_helpers import TINY, Running, by_value
from weir.api.checkpointing import CheckpointConfig
from weir.checkpoint.coordinator import CheckpointCoordinator
from weir.connectors.stream import FileSink, SequenceSource, read_stream_sink
from weir.runtime.continuous.master import LocalJob
from weir.stream import StreamEnvironment

N = 30_000


class SlowKeyed(weir.KeyedProcessFunction[int, int]):
    """Passes every number on, slowly."""

    def process_element(self, value: int, ctx: Any) -> Any:
        if value % 8 == 0:
            time.sleep(0.002)
        yield value


RULES = weir.MapStateDescriptor[int, int]("rules")
R = 3_000  # rules, broadcast while the keyed side backs up


class SlowWithRules(weir.KeyedBroadcastProcessFunction[int, int, int]):
    """Passes every number on, slowly; keeps every rule in broadcast state."""

    def process_broadcast_element(self, value: int, ctx: Any) -> Any:
        ctx.get_broadcast_state(RULES).put(value, value)
        return None

    def process_element(self, value: int, ctx: Any) -> Any:
        if value % 8 == 0:
            time.sleep(0.002)
        yield value


class SlowPass(weir.ProcessFunction[int, int]):
    """Passes every number on, slowly (no key)."""

    def process_element(self, value: int, ctx: Any) -> Any:
        if value % 8 == 0:
            time.sleep(0.002)
        yield value


class SlowBatches(weir.KeyedBatchFunction):
    """Passes every number on, a batch at a time, slowly; marks its keys in state (a
    key of another subtask's key groups fails the batch)."""

    def open(self, ctx: Any) -> None:
        self.seen = ctx.get_state(weir.ValueStateDescriptor("seen", weir.IntSerializer()))

    def process_batch(self, batch: Any, ctx: Any) -> Any:
        time.sleep(0.01)
        keys = sorted(set(batch.column("key").to_pylist()))
        self.seen.put(keys, [1] * len(keys))
        return batch.select(["value"])


def with_key(batch: Any) -> Any:
    """A batch of numbers with its key column (the number mod 7)."""
    import pyarrow as pa

    return batch.append_column("key", pa.array(batch.column("value").to_numpy() % 7))


def graph(tmp_path: Path, edge: str, parallelism: int, chk: str, restored: bool = False
          ) -> Any:
    """The job of ``edge`` (``restored``: the job that restores the first one's
    checkpoint — for ``union-swapped``, with the union's inputs the other way round)."""
    env = StreamEnvironment(weir.JobConfig(tmp_path / chk,
                                           parallelism=parallelism if edge == "forward" else 2,
                                           max_parallelism=32))
    if edge == "forward":  # fan-out at one parallelism: two forward edges (not chained)
        numbers = env.from_source(SequenceSource(N), uid="numbers")
        numbers.process(SlowPass(), uid="side").sink_to(FileSink(tmp_path / "side"),
                                                         uid="side-sink")
        stream = numbers.process(SlowPass(), uid="slow")
    elif edge == "broadcast":  # a keyed input and a broadcast one, both backed up
        rules = env.from_source(SequenceSource(R, 2_000), uid="rules", parallelism=1)
        stream = (env.from_source(SequenceSource(N), uid="numbers")
                  .key_by(lambda v: v % 7).connect(rules.broadcast(RULES))
                  .process(SlowWithRules(), uid="slow", parallelism=parallelism))
    elif edge == "column":  # batches of records split by their key column
        stream = (env.from_source(SequenceSource(N, batch_size=37), uid="numbers")
                  .map(with_key).key_by("key")
                  .process(SlowBatches(), uid="slow", parallelism=parallelism))
    elif edge.startswith("union"):  # two sources of N / 2 numbers: the second one's shifted
        first = env.from_source(SequenceSource(N // 2), uid="first")
        second = env.from_source(SequenceSource(N // 2), uid="second").map(lambda v: v + N // 2)
        union = (second.union(first) if restored and edge == "union-swapped"
                 else first.union(second))
        stream = union.key_by(lambda v: v % 7).process(
            SlowKeyed(), uid="slow", parallelism=parallelism)
    else:
        numbers = env.from_source(SequenceSource(N), uid="numbers")
        stream = (numbers.key_by(lambda v: v % 7).process(
            SlowKeyed(), uid="slow", parallelism=parallelism) if edge == "keyed"
            else numbers.rebalance().process(SlowPass(), uid="slow", parallelism=parallelism))
    stream.sink_to(FileSink(tmp_path / "out"), uid="sink", parallelism=parallelism)
    return env.job_graph(f"rescale-{edge}")


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


@pytest.mark.parametrize("edge", ["keyed", "forward", "rebalance", "union", "union-swapped",
                                  "broadcast", "column"])
# make test rescales 2 -> 3; make soak (WEIR_SOAK=1) also 2 -> 1
@pytest.mark.parametrize("rescaled", [3, 1] if os.environ.get("WEIR_SOAK") else [3],
                         ids=lambda p: f"2-to-{p}")
def test_records_in_flight_reach_the_rescaled_job_exactly_once(
        tmp_path: Path, edge: str, rescaled: int) -> None:
    config = CheckpointConfig(interval=200, unaligned=True, retain_on_cancel=True)
    first = LocalJob(dataclasses.replace(graph(tmp_path, edge, 2, "chk"), channel=TINY),
                     config, restart=weir.RestartStrategy.no_restart())
    running = Running(first)
    running.until(lambda: len(first.result.completed) >= 3
                  and bool(first.checkpoint_stats()[-1].channel_state_bytes))
    first.cancel()
    running.join()
    latest = CheckpointCoordinator(tmp_path / "chk", clean_up=False).latest()
    assert latest is not None
    in_flight = sum(f.size for h in latest.metadata.channel_state.values()
                    for f in h.subtasks.values())
    assert in_flight > 0, "the checkpoint restored from has no records in flight"
    second = LocalJob(dataclasses.replace(graph(tmp_path, edge, rescaled, "chk2",
                                                restored=True), channel=TINY),
                      CheckpointConfig(interval=200, unaligned=True),
                      restart=weir.RestartStrategy.no_restart(), restore_from=latest.url)
    second.run(timeout_s=120)
    numbers = Counter(read_stream_sink(tmp_path / "out"))
    lost = sorted(set(range(N)) - set(numbers))
    duplicates = sorted(v for v, c in numbers.items() if c > 1)
    print(f"[{edge} 2->{rescaled}] restored checkpoint {latest.checkpoint_id} with "
          f"{in_flight} bytes in flight: L={len(lost)} D={len(duplicates)}")
    assert (lost[:5], duplicates[:5]) == ([], [])
    assert sum(numbers.values()) == N
    if edge == "forward":  # (the other consumer of the fan-out too)
        assert Counter(read_stream_sink(tmp_path / "side")) == Counter(range(N))
    if edge == "broadcast":  # every new subtask's broadcast state holds every rule
        reader = weir.read_state(str(tmp_path / "chk2"))
        for i in range(rescaled):
            _, rows = reader.rows("slow", "broadcast", "rules", subtasks=[i])
            assert sorted(r[-1] for r in rows) == list(range(R)), i


def test_which_old_channels_each_new_subtask_replays() -> None:
    """Every old consumer's channels go to exactly one new subtask (rebalance, forward),
    to every new subtask filtered by key group (hash), or — broadcast — new subtask i
    takes old subtask i % p_old's, as its broadcast state."""
    from weir.runtime.continuous.graph import Partitioner
    from weir.runtime.continuous.inflight import _old_consumers

    for old, new in [(2, 3), (3, 2), (4, 1), (1, 4)]:
        for partitioner in (Partitioner.REBALANCE, Partitioner.FORWARD):
            taken = [k for i in range(new) for k in _old_consumers(partitioner, i, new, old)]
            assert sorted(taken) == list(range(old)), (partitioner, old, new)
        assert all(list(_old_consumers(Partitioner.HASH, i, new, old)) == list(range(old))
                   for i in range(new))
        assert [list(_old_consumers(Partitioner.BROADCAST, i, new, old)) for i in range(new)
                ] == [[i % old] for i in range(new)]
