"""A KeyedBatchFunction on the continuous runtime: records gathered into Arrow batches
between barriers, watermarks and pauses of the input, with the per-record function's
state, checkpoints and exactly-once (weir.runtime.continuous.batching). The bounded and
SIGKILL runs of test_continuous_job and the kill -9 suite run a batch count too."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import weir
from continuous_helpers import (
    TINY,
    BatchCount,
    Count,
    Running,
    by_value,
    check_exactly_once,
    keyed_graph,
)
from weir.api.checkpointing import CheckpointConfig
from weir.api.watermarks import WatermarkStrategy
from weir.connectors.stream import FileSink, SequenceSource, read_stream_sink
from weir.errors import ConfigurationError
from weir.runtime.continuous.batching import BatchBuffer, records_of, rows_of
from weir.runtime.continuous.gates import _rows as rows_in
from weir.runtime.continuous.graph import KeyColumn
from weir.runtime.continuous.master import LocalJob
from weir.runtime.continuous.routing import route
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.stream import StreamEnvironment
from weir.testing import KeyedOperatorHarness


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


def test_a_batch_count_is_exactly_once_with_unaligned_checkpoints(tmp_path: Path) -> None:
    """Tiny buffers under a slow rate: barriers overtake queued records, and the records
    a batch function had taken before its checkpoint are processed before the snapshot
    (the rest are channel state, replayed on restore)."""
    n = 20_000
    graph = keyed_graph(tmp_path, source=SequenceSource(n, 20_000), function=BatchCount(),
                        key_selector=lambda v: v % 50, job="count", channel=TINY)
    result = LocalJob(graph, CheckpointConfig(interval=10, unaligned=True)).run(timeout_s=120)
    check_exactly_once(tmp_path, n)
    assert len(result.completed) >= 3


def test_a_per_record_checkpoint_goes_on_as_a_batch_job_and_back(tmp_path: Path) -> None:
    """A per-record count's last checkpoint restored into the batch count, and its
    last into the per-record count again: the counts go on across both switches (the
    same keyed state; each step reads 0..4999 from a source of its own)."""
    out: list[list[Any]] = []
    restore: str | None = None
    for k, function in enumerate((Count(), BatchCount(), Count())):
        env = StreamEnvironment(weir.JobConfig(tmp_path / f"chk{k}", parallelism=2,
                                               max_parallelism=32))
        (env.from_source(SequenceSource(5_000), uid=f"numbers{k}")
            .key_by(lambda v: v % 50).process(function, uid="count")
            .sink_to(FileSink(tmp_path / f"out{k}"), uid=f"sink{k}"))
        result = LocalJob(env.job_graph(f"step{k}"), CheckpointConfig(interval=50),
                          restore_from=restore, allow_non_restored_state=True).run(
            timeout_s=120)
        assert result.completed and (restore is None or result.restored)
        out += read_stream_sink(tmp_path / f"out{k}")
        restore = str(tmp_path / f"chk{k}" / f"chk-{max(result.completed)}")
    per_key: dict[int, list[int]] = {}
    for key, _, count in out:
        per_key.setdefault(key, []).append(count)
    assert {k: sorted(c) for k, c in per_key.items()} == {
        k: list(range(1, 301)) for k in range(50)}


class RecordDeadlines(weir.KeyedProcessFunction[int, list[int]]):
    """Each record (event time: its number times 10 ms) sets a timer of its key 1 s
    later; each timer emits [key, time] (one per key and time, whenever it fires)."""

    def process_element(self, value: int, ctx: Any) -> Any:
        ctx.timer_service.register_event_time_timer(ctx.timestamp + 1_000)
        return ()

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield [ctx.current_key, timestamp, int(ctx.current_watermark >= timestamp)]


class BatchDeadlines(weir.KeyedBatchFunction):
    """RecordDeadlines a batch at a time: timers registered from arrays."""

    def process_batch(self, batch: pa.RecordBatch, ctx: Any) -> Any:
        times = pc.add(pc.multiply(batch.column("value"), 10), 1_000)
        ctx.register_event_time_timers(ctx.keys, times)

    def on_timers(self, timestamps: pa.Array, ctx: Any) -> Any:
        rows = [[k, t, int(ctx.current_watermark >= t)]
                for k, t in zip(ctx.keys, timestamps.to_pylist(), strict=True)]
        return pa.record_batch([pa.array(rows, pa.list_(pa.int64()))], names=["value"])


def test_batch_timers_fire_the_timers_per_record_timers_fire(tmp_path: Path, backend: str
                                                               ) -> None:
    """Event time on the continuous runtime: the batch function's timers, registered
    from arrays, fire exactly the per-record function's — each once, after the
    watermark passed it, every one by the end."""
    n = 4_000
    fired = []
    for name, function in (("record", RecordDeadlines()), ("batch", BatchDeadlines())):
        strategy = WatermarkStrategy.bounded_out_of_orderness(50, lambda v: v * 10,
                                                              interval=20)
        graph = keyed_graph(tmp_path / name, source=SequenceSource(n, 20_000),
                            function=function, key_selector=lambda v: v % 20, backend=backend,
                            function_uid="deadlines", watermarks=strategy, job=name)
        LocalJob(graph, CheckpointConfig(interval=50)).run(timeout_s=120)
        fired.append(sorted(map(tuple, read_stream_sink(tmp_path / name / "out"))))
    assert fired[0] == fired[1] == sorted({(v % 20, v * 10 + 1_000, 1) for v in range(n)})


def with_key(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch of numbers with its key column: the number mod 50."""
    return batch.append_column("key", pa.array(batch.column("value").to_numpy() % 50))


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_batches_of_records_keyed_by_a_column_count_exactly_once_across_a_kill(
    tmp_path: Path, backend: str
) -> None:
    """Records travel as Arrow batches (SequenceSource(batch_size=...)): split by key
    group on their way (key_by("key")), each part taken whole by the batch count, its
    output batches going on as one record each (output_batches) into the file sink, a
    line per row. The keyed task killed with SIGKILL mid-run: exactly once."""
    n = 200_000
    count_killed_once(tmp_path, n, SequenceSource(n, 40_000, batch_size=997), BatchCount(),
                      CheckpointConfig(interval=50), checkpoints=2, backend=backend)
    state = weir.read_state(str(tmp_path / "chk")).keyed_state("count", "count")
    assert dict(zip(state["key"], state["value"], strict=True)) == {k: n // 50 for k in range(50)}


class SlowBatchCount(BatchCount):
    """BatchCount, 20 ms a call: channels back up and barriers overtake records."""

    def process_batch(self, batch: Any, ctx: Any) -> Any:
        time.sleep(0.02)
        return super().process_batch(batch, ctx)


def test_batches_in_flight_in_an_unaligned_checkpoint_replay_to_their_owners(
    tmp_path: Path
) -> None:
    """Unaligned checkpoints store the batch parts in flight; a restore (the keyed task
    killed) replays each subtask exactly the rows it owns of them: exactly once."""
    n = 60_000
    count_killed_once(tmp_path, n, SequenceSource(n, 20_000, batch_size=53), SlowBatchCount(),
                      CheckpointConfig(interval=50, unaligned=True), checkpoints=3, channel=TINY)


def count_killed_once(tmp_path: Path, n: int, source: SequenceSource, function: Any,
                      checkpointing: CheckpointConfig, *, checkpoints: int,
                      backend: str = "hashmap", channel: Any = None) -> None:
    """``source``'s batches keyed by their column into ``function`` (a count emitting
    output batches) into a file sink; the keyed task count[1] killed with SIGKILL once
    ``checkpoints`` completed; one restart, and every number counted exactly once."""
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                                           state_backend=backend))
    (env.from_source(source, uid="numbers").map(with_key).key_by("key")
        .process(function, uid="count", output_batches=True)
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    graph = env.job_graph("count")
    if channel is not None:
        graph = dataclasses.replace(graph, channel=channel)
    job = LocalJob(graph, checkpointing,
                   restart=weir.RestartStrategy.fixed_delay(attempts=1, delay="0 s"))
    running = Running(job)
    running.until(lambda: ("count", 1) in job._procs
                  and len(job.result.completed) >= checkpoints)
    running.kill(("count", 1))
    assert not running.join()
    assert job.result.restarts == 1
    check_counts([row["value"] for row in read_stream_sink(tmp_path / "out")], n)


def with_time(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch of numbers with its key (mod 20) and event time (10 ms a number)."""
    numbers = batch.column("value").to_numpy()
    return (batch.append_column("key", pa.array(numbers % 20))
            .append_column("ts", pa.array(numbers * 10)))


class ColumnDeadlines(weir.KeyedBatchFunction):
    """A timer 1 s after each row's event time (from its ``ts`` column); each emits
    [key, time, whether the watermark had passed it]."""

    def process_batch(self, batch: pa.RecordBatch, ctx: Any) -> Any:
        ctx.register_event_time_timers(
            ctx.keys, pc.add(batch.column("ts"), 1_000))

    def on_timers(self, timestamps: pa.Array, ctx: Any) -> Any:
        return pa.record_batch({
            "key": pa.array(pa.array(ctx.keys).to_pylist(), pa.int64()), "at": timestamps,
            "passed": pa.array([ctx.current_watermark >= t for t in timestamps.to_pylist()]),
        })


def test_event_time_of_batches_of_records_fires_every_row_timer_once(tmp_path: Path) -> None:
    """Batches of records with event time: the timestamp assigner takes a batch (here its
    latest row's time), watermarks follow the batches, and the timers registered from
    each row's time fire once each, after the watermark passed them, every one by the
    end."""
    n = 20_000
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32))
    strategy = WatermarkStrategy.bounded_out_of_orderness(
        50, lambda b: pc.max(b.column("value")).as_py() * 10, interval=20)
    (env.from_source(SequenceSource(n, 20_000, batch_size=101), uid="numbers",
                     watermarks=strategy)
        .map(with_time).key_by("key")
        .process(ColumnDeadlines(), uid="deadlines", output_batches=True)
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    LocalJob(env.job_graph("deadlines"), CheckpointConfig(interval=50)).run(timeout_s=120)
    fired = [(r["key"], r["at"]) for r in read_stream_sink(tmp_path / "out")]
    assert sorted(fired) == sorted({(v % 20, v * 10 + 1_000) for v in range(n)})
    assert all(r["passed"] for r in read_stream_sink(tmp_path / "out"))


def check_counts(out: list[list[int]], n: int) -> None:
    """[key, number, count] rows: every number once, each key's counts 1..n/50."""
    numbers = [r[1] for r in out]
    assert sorted(numbers) == list(range(n))
    per_key: dict[int, list[int]] = {}
    for key, number, count in out:
        assert key == number % 50
        per_key.setdefault(key, []).append(count)
    assert {k: sorted(c) for k, c in per_key.items()} == {
        k: list(range(1, n // 50 + 1)) for k in range(50)}


def test_records_become_rows_and_rows_records_by_the_rules_documented() -> None:
    dicts = rows_of([{"a": 1, "b": "x"}, {"a": 2, "b": None}], None, "op")
    assert dicts.schema.names == ["a", "b"] and dicts.num_rows == 2
    others = rows_of([[1, 2], [3]], None, "op")
    assert others.schema.names == ["value"] and others.column(0).to_pylist() == [[1, 2], [3]]
    typed = rows_of([{"a": 1}], pa.schema([("a", pa.int32())]), "op")
    assert typed.schema.field("a").type == pa.int32()
    assert records_of(dicts) == [{"a": 1, "b": "x"}, {"a": 2, "b": None}]
    assert records_of(others) == [[1, 2], [3]]
    with pytest.raises(ConfigurationError, match=r"operator 'x'.*schema"):
        rows_of([{"a": "text"}], pa.schema([("a", pa.int64())]), "operator 'x'")
    with pytest.raises(ConfigurationError, match=r"operator 'x': 1 of 2 records .* dicts"):
        rows_of([{"a": 1}, 5], None, "operator 'x'")
    empty = pa.record_batch({"key": pa.array([], pa.int64())})
    assert KeyColumn("key").split(empty, 32, 3) == []  # (an empty batch goes nowhere)
    batch = pa.record_batch({"key": pa.array(range(40))})
    parts = KeyColumn("key").split(batch, 32, 3)
    assert sorted(k for _, p in parts for k in p.column(0).to_pylist()) == list(range(40))
    assert all(assign_key_to_parallel_operator(k, 32, 3) == target
               for target, p in parts for k in p.column(0).to_pylist())


def test_a_batch_function_takes_no_dead_letters_and_a_schema_only_for_batches(
    tmp_path: Path
) -> None:
    env = StreamEnvironment(weir.JobConfig(tmp_path, parallelism=1))
    keyed = env.from_source(SequenceSource(3), uid="a").key_by(lambda n: n)
    with pytest.raises(ConfigurationError, match="no bad_record_exceptions"):
        keyed.process(BatchCount(), uid="c", bad_record_exceptions=(ValueError,))
    with pytest.raises(ConfigurationError, match="are for a KeyedBatchFunction"):
        keyed.process(Count(), uid="c", schema=pa.schema([("value", pa.int64())]))


class Echo(weir.KeyedBatchFunction):
    def process_batch(self, batch: pa.RecordBatch, ctx: Any) -> Any:
        return batch


def test_batches_and_records_taken_together_make_one_batch_of_the_schema_given() -> None:
    h = KeyedOperatorHarness(Echo(), KeyColumn("key"))
    h.open()
    out: list[Any] = []
    typed = BatchBuffer(h.operator, pa.schema([("key", pa.int64()), ("v", pa.float64())]),
                        "operator 'x'", output_batches=True)
    typed.emit = lambda record, ts: out.append((record, ts))
    typed.push(pa.record_batch({"key": pa.array([1], pa.int32()),
                                "v": pa.array([2], pa.int64())}), 7)
    typed.push({"key": 2, "v": 1.5}, 5)
    typed.flush()
    ((batch, ts),) = out
    assert batch.schema == typed.schema and ts == 7
    assert batch.to_pylist() == [{"key": 1, "v": 2.0}, {"key": 2, "v": 1.5}]
    mixed = BatchBuffer(h.operator, None, "operator 'y'", output_batches=True)
    mixed.emit = lambda record, ts: None
    mixed.push(pa.record_batch({"key": pa.array([1])}), None)
    mixed.push(pa.record_batch({"key": pa.array([2.5])}), None)
    with pytest.raises(ConfigurationError, match=r"operator 'y'.*one schema"):
        mixed.flush()
    with pytest.raises(ConfigurationError, match=r"operator 'x'.*does not cast"):
        typed.push(pa.record_batch({"key": pa.array(["a"])}), None)
    h.close()


def test_channels_weigh_batches_of_records_by_their_rows_on_every_edge(tmp_path: Path
                                                                       ) -> None:
    """Where batches of records may travel (from a batching source or a batch function's
    output batches, and downstream of them), every edge counts a batch's rows toward a
    full buffer, not one record; elsewhere records count one each."""
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2))
    (env.from_source(SequenceSource(10, batch_size=5), uid="numbers")
        .map(with_key).key_by("key")
        .process(BatchCount(), uid="count", output_batches=True)
        .sink_to(FileSink(tmp_path / "out"), uid="sink", parallelism=1))
    graph = env.job_graph("weights")
    assert [graph.may_emit_batches(v.id) for v in graph.vertices] == [True] * len(
        graph.vertices)
    plain = keyed_graph(tmp_path / "plain", source=SequenceSource(10), function=Count(),
                        key_selector=lambda v: v % 50)
    assert not any(plain.may_emit_batches(v.id) for v in plain.vertices)

    class Channel:
        def __init__(self) -> None:
            self.got: list[tuple[Any, int]] = []

        def emit(self, item: Any, rows: int = 1) -> None:
            self.got.append((item, rows))

    rebalance = next(e for e in graph.edges if e.partitioner.value == "rebalance")
    channel = Channel()
    send = route(rebalance, [channel], 32, 0, False, batches=True)  # type: ignore[list-item]
    send(pa.record_batch({"v": pa.array(range(7))}), None)
    send({"v": 1}, None)
    assert [rows for _, rows in channel.got] == [7, 1]


def test_a_task_counts_the_rows_of_batches_of_records_it_takes_in() -> None:
    batch = pa.record_batch({"v": pa.array(range(7))})
    assert rows_in([batch, batch]) == 14
    assert rows_in([(5, batch), (6, batch)]) == 14  # (with event time)
    assert rows_in([1, 2, 3]) == 3 and rows_in([(1, 2), (3, 4)]) == 2 and rows_in([]) == 0
