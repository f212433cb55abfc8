"""A KeyedBroadcastBatchFunction: keyed records in batches that read broadcast state,
broadcast elements one by one that write it, with the outputs and state of the same
logic as a per-record KeyedBroadcastProcessFunction — in the harness (both backends,
across a restore), on the continuous runtime (a batch sees the broadcast state the
records before a broadcast element saw) and on Spark."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import weir
from continuous_helpers import by_value
from weir.api.checkpointing import CheckpointConfig
from weir.api.watermarks import WatermarkStrategy
from weir.connectors.stream import FileSink, SequenceSource, read_stream_sink
from weir.errors import ConfigurationError
from weir.runtime.continuous.batching import BatchBuffer
from weir.runtime.continuous.master import LocalJob
from weir.stream import StreamEnvironment
from weir.testing import KeyedBroadcastOperatorHarness, KeyedOperatorHarness

LIMITS = weir.MapStateDescriptor[str, int]("limits", weir.StrSerializer(), weir.IntSerializer())
TOTAL = weir.ValueStateDescriptor("total", serializer=weir.IntSerializer())
BACKENDS = ("hashmap", "rocksdb")


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


def _reset(prefix: str) -> Any:
    def reset(key: str, state: Any) -> None:
        if key.startswith(prefix):
            state.clear()
    return reset


class RecordLimits(weir.KeyedBroadcastProcessFunction[Any, Any, tuple[str, int]]):
    """A running total of ``v`` per key; a record whose total crosses the limit of its
    key's first letter (broadcast: ``("limit", letter, n)``) emits ``(key, total)``;
    ``("reset", letter)`` clears the totals of the keys that start with it."""

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(TOTAL)

    def process_element(self, value: Any, ctx: Any) -> Any:
        before = self.total.value() or 0
        total = before + value[1]
        self.total.update(total)
        limit = ctx.get_broadcast_state(LIMITS).get(value[0][0])
        if limit is not None and before < limit <= total:
            yield (value[0], total)

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        if value[0] == "reset":
            ctx.apply_to_keyed_state(TOTAL, _reset(value[1]))
            return None
        ctx.get_broadcast_state(LIMITS).put(value[1], value[2])
        return [(f"rule {value[1]}", value[2])]


def _rows(pairs: list[tuple[str, int]]) -> pa.RecordBatch:
    return pa.record_batch([pa.array([k for k, _ in pairs], pa.string()),
                            pa.array([n for _, n in pairs], pa.int64())], names=["k", "total"])


class BatchLimits(weir.KeyedBroadcastBatchFunction):
    """RecordLimits a batch at a time: one get and one put of the batch's keys, the
    limits read once per batch."""

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(TOTAL)

    def process_batch(self, batch: pa.RecordBatch, ctx: Any) -> Any:
        keys = [str(k) for k in ctx.keys]
        current = dict(zip(keys, self.total.get(keys).to_pylist(), strict=True))
        limits = dict(ctx.get_broadcast_state(LIMITS).items())
        out = []
        for key, v in zip(keys, batch.column("v").to_pylist(), strict=True):
            before = current[key] or 0
            current[key] = before + v
            limit = limits.get(key[0])
            if limit is not None and before < limit <= current[key]:
                out.append((key, current[key]))
        self.total.put(list(current), list(current.values()))
        return _rows(out)

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        if value[0] == "reset":
            ctx.apply_to_keyed_state(TOTAL, _reset(value[1]))
            return None
        ctx.get_broadcast_state(LIMITS).put(value[1], value[2])
        return _rows([(f"rule {value[1]}", value[2])])


def _harness(function: Any, backend: str, tmp: Path, restored: Any = None
             ) -> KeyedBroadcastOperatorHarness:
    kwargs: dict[str, Any] = {
        "state_backend": backend, "broadcast_state_descriptors": [LIMITS],
        "rocksdb_path": tmp / f"rocks-{type(function).__name__}-{restored is not None}"}
    if restored is not None:
        return KeyedBroadcastOperatorHarness.restore(
            function, lambda r: r[0], [restored], parallelism=1, subtask_index=0, **kwargs)
    h = KeyedBroadcastOperatorHarness(function, lambda r: r[0], **kwargs)
    h.open()
    return h


def _as_tuples(outputs: list[Any]) -> list[tuple[str, int]]:
    return [(r["k"], r["total"]) for b in outputs for r in b.to_pylist()]


STEPS = st.lists(st.one_of(
    st.tuples(st.just("limit"), st.sampled_from("ab"), st.integers(1, 12)),
    st.tuples(st.just("reset"), st.sampled_from("ab")),
    st.lists(st.tuples(st.sampled_from(["a0", "a1", "b0", "b1", "b2"]), st.integers(1, 4)),
             min_size=1, max_size=12)), min_size=1, max_size=10)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=25, deadline=None)
@given(steps=STEPS, cut=st.integers(0, 10))
def test_a_broadcast_batch_function_gives_the_per_record_outputs_and_state(
        backend: str, tmp_path_factory: pytest.TempPathFactory, steps: list[Any], cut: int
) -> None:
    """Random limits, resets (apply_to_keyed_state) and batches of records: the same
    outputs in the same order, the same totals and limits; the batch function's
    snapshot after step ``cut`` restored into a new one on the way."""
    tmp = tmp_path_factory.mktemp("broadcast")
    record, batch = _harness(RecordLimits(), backend, tmp), _harness(BatchLimits(), backend, tmp)
    expected: list[tuple[str, int]] = []
    got: list[tuple[str, int]] = []
    for i, step in enumerate(steps):
        if i == cut:
            snapshot = batch.snapshot()
            batch.close()
            batch = _harness(BatchLimits(), backend, tmp, restored=snapshot)
        if isinstance(step, tuple):
            expected += record.process_broadcast_element(step)
            got += _as_tuples(batch.process_broadcast_element(step))
        else:
            for row in step:
                expected += record.process_element(row)
            got += _as_tuples(batch.process_batch(
                pa.record_batch([pa.array([k for k, _ in step]),
                                 pa.array([v for _, v in step], pa.int64())],
                                names=["k", "v"]), [k for k, _ in step]))
    assert got == expected
    keys = ["a0", "a1", "b0", "b1", "b2"]
    assert ([batch.state_of(k, TOTAL) for k in keys]
            == [record.state_of(k, TOTAL) for k in keys])
    assert batch.broadcast_state_of(LIMITS) == record.broadcast_state_of(LIMITS)
    record.close()
    batch.close()


class Plain(weir.KeyedBatchFunction):
    """A batch function without broadcast input that asks for broadcast state."""

    def process_batch(self, batch: pa.RecordBatch, ctx: Any) -> Any:
        ctx.get_broadcast_state(LIMITS)


def test_a_batch_function_reads_broadcast_state_only_when_it_is_a_broadcast_one(
        tmp_path: Path) -> None:
    h = KeyedOperatorHarness(Plain(), lambda r: r["k"])
    h.open()
    with pytest.raises(ConfigurationError, match="KeyedBroadcastBatchFunction"):
        h.process_batch(pa.record_batch({"k": ["a"]}))
    h.close()


def test_records_taken_before_a_broadcast_element_are_processed_before_it() -> None:
    """The continuous runtime's buffer flushes at a broadcast element: the records that
    came before it see the limits before it, those after it the new ones."""
    h = KeyedBroadcastOperatorHarness(BatchLimits(), lambda r: r["k"],
                                      broadcast_state_descriptors=[LIMITS])
    h.open()
    buffer = BatchBuffer(h.operator, None, "operator 'limits'")
    out: list[Any] = []
    buffer.emit = lambda record, ts: out.append(record)
    for v in (2, 2):  # (a0's total 4 when the limit 3 comes: it crossed none)
        buffer.push({"k": "a0", "v": v}, None)
    rule = buffer.broadcast(("limit", "a", 3), None)
    buffer.push({"k": "a0", "v": 1}, None)  # (4 -> 5: above the limit, not across it)
    buffer.push({"k": "a1", "v": 3}, None)  # (0 -> 3: across)
    buffer.flush()
    assert rule == [{"k": "rule a", "total": 3}]
    assert out == [{"k": "a1", "total": 3}]
    assert h.state_of("a0", TOTAL) == 5
    h.close()


class Rules(weir.api.connectors.Source[Any]):
    """Two limits at event time 0."""

    def reader(self, subtask: int, parallelism: int, positions: list[Any] | None) -> Any:
        return SequenceSource(2).reader(subtask, parallelism, positions)


class PendingRecords(weir.KeyedBroadcastProcessFunction[int, int, list[int]]):
    """Each number waits for event time to pass it (the broadcast input holds event time
    back until its rules are in), then is emitted with its group's limit."""

    def open(self, ctx: Any) -> None:
        self.pending = ctx.get_list_state(weir.ListStateDescriptor[int]("pending",
                                                                        weir.IntSerializer()))

    def process_broadcast_element(self, value: int, ctx: Any) -> Any:
        ctx.get_broadcast_state(LIMITS).put(f"g{value}", 100 * (value + 1))
        return [[-1 - value, subtask_marker(ctx)]]

    def process_element(self, value: int, ctx: Any) -> Any:
        self.pending.add(value)
        ctx.timer_service.register_event_time_timer(ctx.timestamp)
        return None

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        limits = ctx.get_broadcast_state(LIMITS)
        for value in self.pending.get() or []:
            yield [value, limits.get(f"g{value % 2}")]
        self.pending.clear()


def subtask_marker(ctx: Any) -> int:
    return int(ctx.subtask_index)


class PendingBatches(weir.KeyedBroadcastBatchFunction):
    """PendingRecords a batch at a time (list state appended per key, timers from
    arrays)."""

    def open(self, ctx: Any) -> None:
        self.pending = ctx.get_list_state(weir.ListStateDescriptor[int]("pending",
                                                                        weir.IntSerializer()))

    def process_broadcast_element(self, value: int, ctx: Any) -> Any:
        ctx.get_broadcast_state(LIMITS).put(f"g{value}", 100 * (value + 1))
        return pa.record_batch([pa.array([[-1 - value, subtask_marker(ctx)]])],
                               names=["value"])

    def process_batch(self, batch: pa.RecordBatch, ctx: Any) -> Any:
        values = batch.column("value").to_pylist()
        self.pending.add(ctx.keys, values)
        ctx.register_event_time_timers(ctx.keys, [1 + v // 100 for v in values])

    def on_timers(self, timestamps: pa.Array, ctx: Any) -> Any:
        limits = dict(ctx.get_broadcast_state(LIMITS).items())
        keys = list(dict.fromkeys(ctx.keys))
        rows = [[v, limits.get(f"g{v % 2}")] for values in self.pending.get(keys).to_pylist()
                for v in values]
        self.pending.delete(keys)
        return pa.record_batch([pa.array(rows, pa.list_(pa.int64()))], names=["value"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_on_the_continuous_runtime_batches_see_the_broadcast_rules_as_records_do(
        tmp_path: Path, backend: str) -> None:
    """The same job with the per-record and the batch function: every number once with
    its group's limit, the rules' own outputs once per subtask, the limits in the
    checkpoint."""
    n = 4_000
    outputs = []
    for name, function in (("record", PendingRecords()), ("batch", PendingBatches())):
        env = StreamEnvironment(weir.JobConfig(tmp_path / name / "chk", parallelism=2,
                                               max_parallelism=32, state_backend=backend))
        rules = env.from_source(Rules(), uid="rules", parallelism=1,
                                watermarks=WatermarkStrategy.bounded_out_of_orderness(
                                    0, lambda v: 0, interval=10))
        numbers = env.from_source(SequenceSource(n, 20_000), uid="numbers",
                                  watermarks=WatermarkStrategy.bounded_out_of_orderness(
                                      0, lambda v: 1 + v // 100, interval=10))
        (numbers.key_by(lambda v: v % 20).connect(rules.broadcast(LIMITS))
            .process(function, uid="pending")
            .sink_to(FileSink(tmp_path / name / "out"), uid="out"))
        result = LocalJob(env.job_graph(name), CheckpointConfig(interval=50)).run(
            timeout_s=120)
        assert result.completed and result.restarts == 0
        outputs.append(sorted(map(tuple, read_stream_sink(tmp_path / name / "out"))))
        state = weir.read_state(str(tmp_path / name / "chk")).broadcast_state("pending",
                                                                              "limits")
        assert dict(zip(state["key"], state["value"], strict=True)) == {"g0": 100, "g1": 200}
    record, batch = outputs
    assert batch == record
    assert [r for r in batch if r[0] >= 0] == [(v, 100 * (v % 2 + 1)) for v in range(n)]
    assert sorted(r for r in batch if r[0] < 0) == sorted(
        (-1 - rule, subtask) for rule in (0, 1) for subtask in (0, 1))


def test_a_broadcast_batch_function_refuses_dead_letters_and_plain_ones_a_broadcast(
        tmp_path: Path) -> None:
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk"))
    rules = env.from_source(Rules(), uid="rules").broadcast(LIMITS)
    keyed = env.from_source(SequenceSource(10), uid="numbers").key_by(lambda v: v)
    with pytest.raises(ConfigurationError, match="no bad_record_exceptions"):
        keyed.connect(rules).process(PendingBatches(), uid="p",
                                     bad_record_exceptions=[ValueError])
    with pytest.raises(ConfigurationError, match="KeyedBroadcastBatchFunction"):
        keyed.connect(rules).process(Plain(), uid="p")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="connect its broadcast input first"):
        keyed.process(PendingBatches(), uid="p")
