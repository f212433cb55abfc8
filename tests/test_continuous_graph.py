"""Job graphs on the continuous runtime: how operators chain into tasks, and jobs of
every edge kind — union of sources, rebalance, a non-keyed process function with
operator state, two keyed stages, a keyed broadcast process function fed by a
broadcast stream, a source chained with its sink — running exactly-once."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import weir
from weir.connectors import FileSink, SequenceSource, read_stream_sink
from weir.runtime.continuous.graph import Partitioner
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment, WatermarkStrategy


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


COUNT = weir.ValueStateDescriptor[int]("count", weir.IntSerializer())


class Count(weir.KeyedProcessFunction[Any, list[Any]]):
    """A running count per key: [key, record, count]."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield [ctx.current_key, value, n]


class Tagged(weir.ProcessFunction[int, list[int]], weir.CheckpointedFunction):
    """Tags each record with its subtask and how many records that subtask saw (kept
    in operator list state, so it survives restarts)."""

    def initialize_state(self, ctx: Any) -> None:
        self.state = ctx.operator_state_store.get_list_state(
            weir.ListStateDescriptor[int]("seen", weir.IntSerializer()))
        self.seen = sum(self.state.get()) if ctx.is_restored else 0

    def snapshot_state(self, ctx: Any) -> None:
        self.state.update([self.seen])

    def process_element(self, value: int, ctx: Any) -> Any:
        self.seen += 1
        yield [ctx.subtask_index, value, self.seen]


def env_of(tmp_path: Path, backend: str = "hashmap") -> StreamEnvironment:
    """Checkpoints every 50 ms; a failure fails the test (no restarts)."""
    return StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                                            state_backend=backend,
                                            checkpointing=CheckpointConfig(interval=50),
                                            restart_strategy=RestartStrategy.no_restart()))


def test_operators_chain_as_in_flink(tmp_path: Path) -> None:
    env = env_of(tmp_path)
    numbers = env.from_source(SequenceSource(10), uid="numbers").map(lambda n: n + 1)
    letters = env.from_source(SequenceSource(10), uid="letters", parallelism=1)
    counted = numbers.union(letters).key_by(lambda n: n % 3).process(Count(), uid="count")
    counted.map(lambda r: r).sink_to(FileSink(tmp_path / "a"), uid="a")   # fan-out: two
    counted.rebalance().sink_to(FileSink(tmp_path / "b"), uid="b", parallelism=3)
    graph = env.job_graph("shape")
    chains = {v.id: [op.name for op in v.chain] for v in graph.vertices}
    assert chains == {"numbers": ["numbers", "map-1"], "letters": ["letters"],
                      "count": ["count"], "a": ["map-4", "a"], "b": ["b"]}
    edges = {(e.producer, e.consumer): e.partitioner for e in graph.edges}
    assert edges == {("numbers", "count"): Partitioner.HASH,
                     ("letters", "count"): Partitioner.HASH,
                     ("count", "a"): Partitioner.FORWARD,
                     ("count", "b"): Partitioner.REBALANCE}
    assert [e.producers_of(1, 2) for e in graph.inputs("a")] == [[1]]
    assert len(graph.tasks()) == 2 + 1 + 2 + 2 + 3


def test_a_forward_edge_across_parallelisms_becomes_a_rebalance(tmp_path: Path) -> None:
    env = env_of(tmp_path)
    env.from_source(SequenceSource(10), uid="s").sink_to(FileSink(tmp_path / "o"), uid="o",
                                                         parallelism=3)
    (edge,) = env.job_graph().edges
    assert edge.partitioner is Partitioner.REBALANCE


def test_a_union_of_sources_rebalanced_through_operator_state_is_exactly_once(
    tmp_path: Path
) -> None:
    """Two sources (parallelism 2 and 1) → union → rebalance → a non-keyed function with
    operator state (parallelism 3) → sink; then the numbers keyed and counted in a
    second branch of the same union. Every record once in each output."""
    env = env_of(tmp_path)
    evens = env.from_source(SequenceSource(20_000), uid="evens").map(lambda n: 2 * n)
    odds = env.from_source(SequenceSource(20_000), uid="odds", parallelism=1).map(
        lambda n: 2 * n + 1)
    both = evens.union(odds)
    (both.rebalance().process(Tagged(), uid="tagged", parallelism=3)
        .sink_to(FileSink(tmp_path / "tagged"), uid="tagged-sink"))
    (both.key_by(lambda n: n % 10).process(Count(), uid="count")
        .sink_to(FileSink(tmp_path / "counts"), uid="count-sink"))
    result = env.execute("union", timeout=120)
    assert result.completed and result.restarts == 0
    tagged = read_stream_sink(tmp_path / "tagged")
    assert sorted(r[1] for r in tagged) == list(range(40_000))
    per_subtask = Counter(r[0] for r in tagged)
    assert set(per_subtask) == {0, 1, 2}  # rebalanced over all three
    for subtask, n in per_subtask.items():  # operator state counted each one's records
        assert sorted(r[2] for r in tagged if r[0] == subtask) == list(range(1, n + 1))
    counts = read_stream_sink(tmp_path / "counts")
    assert sorted(r[1] for r in counts) == list(range(40_000))
    assert {k: max(r[2] for r in counts if r[0] == k) for k in range(10)} == dict.fromkeys(
        range(10), 4_000)


class Doubled(weir.KeyedProcessFunction[Any, list[Any]]):
    """Second keyed stage: sums the first stage's counts per key."""

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(weir.ValueStateDescriptor[int]("total", weir.IntSerializer()))

    def process_element(self, value: list[Any], ctx: Any) -> Any:
        total = (self.total.value() or 0) + value[2]
        self.total.update(total)
        yield [ctx.current_key, total]


def test_two_keyed_stages_in_a_row(tmp_path: Path, backend: str) -> None:
    env = env_of(tmp_path, backend)
    (env.from_source(SequenceSource(12_000), uid="numbers")
        .key_by(lambda n: n % 12).process(Count(), uid="count")
        .key_by(lambda r: r[0] % 4).process(Doubled(), uid="sum", parallelism=3)
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    env.execute("stages", timeout=120)
    out = read_stream_sink(tmp_path / "out")
    assert len(out) == 12_000
    per_key = 1_000 * 1_001 // 2 * 3  # keys k, k+4, k+8 each count 1..1000
    assert {k: max(r[1] for r in out if r[0] == k) for k in range(4)} == dict.fromkeys(
        range(4), per_key)


RULES = weir.MapStateDescriptor[str, int]("rules", weir.StrSerializer(), weir.IntSerializer())


class Rules(weir.api.connectors.Source[dict[str, Any]]):
    """Three rules at event time 0 (each sets a threshold for a card group)."""

    def reader(self, subtask: int, parallelism: int, positions: list[Any] | None) -> Any:
        return SequenceSource(3).reader(subtask, parallelism, positions)


class Detector(weir.KeyedBroadcastProcessFunction[int, int, list[Any]]):
    """Rules arrive on the broadcast side; each payment waits for event time to pass it
    (a timer), then is checked against its group's rule — which by then has arrived, as
    the broadcast input holds event time back until it sent them."""

    def open(self, ctx: Any) -> None:
        self.pending = ctx.get_list_state(weir.ListStateDescriptor[int]("pending",
                                                                        weir.IntSerializer()))

    def process_broadcast_element(self, value: int, ctx: Any) -> Any:
        ctx.get_broadcast_state(RULES).put(f"group-{value}", 100 * (value + 1))
        return None

    def process_element(self, value: int, ctx: Any) -> Any:
        self.pending.add(value)
        ctx.timer_service.register_event_time_timer(ctx.timestamp)
        return None

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        rules = ctx.get_broadcast_state(RULES)
        for value in self.pending.get() or []:
            limit = rules.get(f"group-{value % 3}")
            yield [value, limit, value % 300 >= limit]
        self.pending.clear()


def test_a_keyed_broadcast_function_sees_the_rules_on_every_subtask(
    tmp_path: Path, backend: str
) -> None:
    env = env_of(tmp_path, backend)
    rules = env.from_source(
        Rules(), uid="rules", parallelism=1,
        watermarks=WatermarkStrategy.bounded_out_of_orderness(0, lambda v: 0, interval=10))
    payments = env.from_source(
        SequenceSource(6_000), uid="payments",
        watermarks=WatermarkStrategy.bounded_out_of_orderness(0, lambda v: 1 + v // 100,
                                                              interval=10))
    (payments.key_by(lambda v: v % 20)
        .connect(rules.broadcast(RULES))
        .process(Detector(), uid="detector")
        .sink_to(FileSink(tmp_path / "out"), uid="alerts"))
    env.execute("fraud", timeout=120)
    out = read_stream_sink(tmp_path / "out")
    assert sorted(r[0] for r in out) == list(range(6_000))
    assert all(r[1] == 100 * (r[0] % 3 + 1) and r[2] == (r[0] % 300 >= r[1]) for r in out)
    state = weir.read_state(str(tmp_path / "chk")).broadcast_state("detector", "rules")
    assert dict(zip(state["key"], state["value"], strict=True)) == {
        "group-0": 100, "group-1": 200, "group-2": 300}


def test_a_source_chained_with_its_sink(tmp_path: Path) -> None:
    env = env_of(tmp_path)
    (env.from_source(SequenceSource(5_000), uid="numbers").filter(lambda n: n % 2 == 0)
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    assert len(env.job_graph().vertices) == 1
    env.execute("copy", timeout=120)
    assert sorted(read_stream_sink(tmp_path / "out")) == list(range(0, 5_000, 2))
