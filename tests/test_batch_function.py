"""A KeyedBatchFunction reads and writes keyed value state for many keys per call, with
the semantics and the checkpoints of the same logic as a per-record function, on both
backends."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import weir
from weir import CheckpointCoordinator, CheckpointStorage
from weir.errors import ConfigurationError, KeyGroupError, StateError
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.state.rocksdb_options import RocksDBMemory
from weir.testing import KeyedOperatorHarness, ManualClock

SUM = weir.ValueStateDescriptor("sum", serializer=weir.IntSerializer())
BACKENDS = ("hashmap", "rocksdb")


def _step(total: int | None, v: int) -> int | None:
    """The running sum, cleared whenever it reaches a multiple of 7."""
    n = (total or 0) + v
    return None if n % 7 == 0 else n


class RecordSum(weir.KeyedProcessFunction[tuple[str, int], tuple[str, int | None]]):
    def open(self, ctx: weir.KeyedContext) -> None:
        self.sum = ctx.get_state(SUM)

    def process_element(self, value: tuple[str, int], ctx: weir.KeyedContext) -> Any:
        n = _step(self.sum.value(), value[1])
        if n is None:
            self.sum.clear()
        else:
            self.sum.update(n)
        return [(value[0], n)]


class BatchSum(weir.KeyedBatchFunction):
    """The same logic a batch at a time: one get for every row's key, the running sums
    in order, one put of every row's sum (a key given twice keeps its last)."""

    def open(self, ctx: weir.KeyedBatchContext) -> None:
        self.sum = ctx.get_state(SUM)

    def process_batch(self, batch: pa.RecordBatch, ctx: weir.KeyedBatchContext) -> Any:
        keys = list(ctx.keys)
        current = dict(zip(keys, self.sum.get(keys).to_pylist(), strict=True))
        out = []
        for key, v in zip(keys, batch.column("v").to_pylist(), strict=True):
            current[key] = _step(current[key], v)
            out.append(current[key])
        gone = [k for k, n in current.items() if n is None]
        self.sum.put(keys, out)  # (a null deletes)
        self.sum.delete(gone)
        return pa.record_batch([pa.array(keys, pa.string()), pa.array(out, pa.int64())],
                               names=["k", "sum"])


def _backend(backend: str) -> dict[str, Any]:
    """Harness arguments of a backend name; ``rocksdb-evicting``: RocksDB with an entry
    cache of 2 entries (a batch's writes evict as they go, key by key)."""
    if backend == "rocksdb-evicting":
        return {"state_backend": "rocksdb", "rocksdb_memory": RocksDBMemory(cache_entries=2)}
    return {"state_backend": backend}


def _harness(function: Any, backend: str, tmp: Path, **kwargs: Any) -> KeyedOperatorHarness:
    return KeyedOperatorHarness(function, lambda row: row[0] if isinstance(row, tuple)
                                else row["k"], **_backend(backend),
                                rocksdb_path=tmp / "rocks" / function.__class__.__name__,
                                **kwargs)


def _batch(rows: list[tuple[str, int]]) -> pa.RecordBatch:
    return pa.record_batch([pa.array([k for k, _ in rows], pa.string()),
                            pa.array([v for _, v in rows], pa.int64())], names=["k", "v"])


def _state(h: KeyedOperatorHarness, keys: set[str]) -> dict[str, int | None]:
    """Each key's sum as a per-record function restored from ``h``'s snapshot reads it."""
    snap = h.snapshot()
    reader = KeyedOperatorHarness.restore(RecordSum(), lambda row: row[0], [snap],
                                          parallelism=1, subtask_index=0)
    out = _values(reader, SUM, keys)
    reader.close()
    return out


BATCHES = st.lists(st.lists(st.tuples(st.sampled_from("abcdefghij"), st.integers(-9, 9)),
                            max_size=30), min_size=1, max_size=6)


@pytest.mark.parametrize("backend", [*BACKENDS, "rocksdb-evicting"])
@settings(max_examples=25, deadline=None)
@given(batches=BATCHES, cut=st.integers(0, 6))
def test_a_batch_function_gives_the_outputs_and_state_of_the_same_per_record_logic(
    backend: str, batches: list[list[tuple[str, int]]], cut: int, tmp_path_factory: Any
) -> None:
    """For random batches, including a restore from a snapshot part way: the batch
    function's outputs equal the per-record function's, and so does every key's state
    (read back through a per-record function restored from the batch one's snapshot)."""
    tmp = tmp_path_factory.mktemp("b")
    record = _harness(RecordSum(), backend, tmp)
    batch = _harness(BatchSum(), backend, tmp)
    record.open()
    batch.open()
    seen: set[str] = set()
    for i, rows in enumerate(batches):
        if i == cut:  # restore the batch function from its own snapshot and go on
            snap = batch.snapshot()
            batch.close()
            batch = KeyedOperatorHarness.restore(
                BatchSum(), lambda row: row["k"], [snap], parallelism=1, subtask_index=0,
                **_backend(backend), rocksdb_path=tmp / "rocks" / f"restored{i}")
        want = record.process_elements(rows)
        got = [r for out in batch.process_batch(_batch(rows)) for r in zip(
            out.column("k").to_pylist(), out.column("sum").to_pylist(), strict=True)]
        assert got == want
        seen.update(k for k, _ in rows)
    assert _state(batch, seen) == _state(record, seen)
    record.close()
    batch.close()


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=15, deadline=None)
@given(before=BATCHES, after=BATCHES)
def test_a_batch_function_rescaled_from_one_subtask_to_two_goes_on_as_per_record(
    backend: str, before: list[list[tuple[str, int]]], after: list[list[tuple[str, int]]],
    tmp_path_factory: Any
) -> None:
    """A batch function's snapshot at parallelism 1 restored into two subtasks: each
    goes on with its keys' state, its outputs those of one per-record subtask that saw
    everything, for its keys, in order."""
    tmp = tmp_path_factory.mktemp("r")
    record = _harness(RecordSum(), backend, tmp)
    batch = _harness(BatchSum(), backend, tmp)
    record.open()
    batch.open()
    for rows in before:
        record.process_elements(rows)
        batch.process_batch(_batch(rows))
    snap = batch.snapshot()
    batch.close()
    subtasks = [KeyedOperatorHarness.restore(
        BatchSum(), lambda row: row["k"], [snap], parallelism=2, subtask_index=i,
        state_backend=backend, rocksdb_path=tmp / "rescaled" / str(i)) for i in (0, 1)]
    owner = {k: assign_key_to_parallel_operator(k, 128, 2) for k in "abcdefghij"}
    for rows in after:
        want = record.process_elements(rows)
        for i, h in enumerate(subtasks):
            mine = [r for r in rows if owner[r[0]] == i]
            got = [r for out in (h.process_batch(_batch(mine)) if mine else []) for r in zip(
                out.column("k").to_pylist(), out.column("sum").to_pylist(), strict=True)]
            assert got == [w for w in want if owner[w[0]] == i]
    record.close()
    for h in subtasks:
        h.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_per_record_savepoint_restores_into_a_batch_function_and_back(
    backend: str, tmp_path: Path
) -> None:
    rows = [("a", 1), ("b", 2), ("a", 3), ("c", 5)]
    record = _harness(RecordSum(), backend, tmp_path)
    record.open()
    record.process_elements(rows)
    batch = KeyedOperatorHarness.restore(BatchSum(), lambda row: row["k"], [record.snapshot()],
                                         parallelism=1, subtask_index=0, state_backend=backend,
                                         rocksdb_path=tmp_path / "b")
    assert batch.operator.function.function.sum.get(["a", "b", "c", "z"]).to_pylist() == [
        4, 2, 5, None]
    out = batch.process_batch(_batch([("a", 2), ("z", 1)]))
    assert out[0].column("sum").to_pylist() == [6, 1]
    assert _state(batch, {"a", "b", "c", "z"}) == {"a": 6, "b": 2, "c": 5, "z": 1}
    record.close()
    batch.close()


@pytest.mark.parametrize("mode", ["changelog", "incremental", "full"])
def test_batch_writes_reach_every_snapshot_mode_of_the_hash_map(mode: str, tmp_path: Path
                                                                 ) -> None:
    """The hash map's one-operation path records its writes as ``update`` does, so a
    changelog (or incremental) checkpoint after batch writes restores the same state."""
    coordinator = CheckpointCoordinator(CheckpointStorage(str(tmp_path / "cp")))
    h = _harness(BatchSum(), "hashmap", tmp_path)
    h.open()
    h.process_batch(_batch([("a", 1), ("b", 2), ("d", 1)]))
    h.checkpoint(coordinator, mode=mode)
    h.process_batch(_batch([("a", 2), ("c", 4), ("b", 5)]))  # b reaches 7: deleted
    completed = h.checkpoint(coordinator, mode=mode)
    h.close()
    restored = KeyedOperatorHarness.restore(RecordSum(), lambda row: row[0], completed,
                                            parallelism=1, subtask_index=0)
    assert _state(restored, {"a", "b", "c", "d"}) == {"a": 3, "b": None, "c": 4, "d": 1}
    restored.close()


@pytest.mark.parametrize(("backend", "mode"), [("hashmap", "changelog"),
                                             ("rocksdb", "incremental"),
                                             ("rocksdb", "changelog")])
def test_checkpoint_bytes_after_batch_writes_follow_the_change(backend: str, mode: str,
                                                               tmp_path: Path) -> None:
    """5,000 keys written by batches: an idle checkpoint writes at most 1% of the
    state's bytes (nothing with a changelog; RocksDB's native one its metadata files),
    one after a batch that changed 1% of the keys at most 5% (issue 43)."""
    coordinator = CheckpointCoordinator(CheckpointStorage(str(tmp_path / "cp")))
    h = _harness(BatchSum(), backend, tmp_path)
    h.open()
    keys = [f"key-{i}" for i in range(5_000)]
    h.process_batch(_batch([(k, 1) for k in keys]))
    base = h.checkpoint(coordinator, mode=mode)
    idle = h.checkpoint(coordinator, mode=mode)
    h.process_batch(_batch([(k, 1) for k in keys[:50]]))
    churn = h.checkpoint(coordinator, mode=mode)
    h.close()
    stats = [c.metadata.operators["operator"].subtasks[0].stats for c in (idle, churn)]
    assert stats[0].new_bytes <= (0 if mode == "changelog" else 0.01 * base.metadata.total_bytes)
    assert 0 < stats[1].new_bytes <= 0.05 * base.metadata.total_bytes, (
        stats[1].new_bytes, base.metadata.total_bytes)
    restored = KeyedOperatorHarness.restore(RecordSum(), lambda row: row[0], churn,
                                            parallelism=1, subtask_index=0)
    assert _state(restored, set(keys[45:55])) == {k: 2 if k in keys[:50] else 1
                                                  for k in keys[45:55]}
    restored.close()


def test_get_types_come_from_the_serializer_or_are_given_and_a_bad_value_fails(
    tmp_path: Path
) -> None:
    h = _harness(BatchSum(), "hashmap", tmp_path)
    h.open()
    ctx = h.operator.function._ctx
    assert ctx is not None
    sums = ctx.get_state(SUM)
    assert sums.get(["x"]).type == pa.int64()  # IntSerializer: int64, even all null
    anything = ctx.get_state(weir.ValueStateDescriptor("any"))
    assert anything.get(["x"]).type == pa.null()
    assert anything.get(["x"], type=pa.string()).type == pa.string()
    anything.put(["x", "y"], [1.5, "two"])
    with pytest.raises(StateError, match=r"pass get\(keys, type=\.\.\.\)"):
        anything.get(["x", "y"])
    with pytest.raises(weir.errors.StateSerializationError):
        sums.put(["x"], ["not an int"])
    sums.put(["x", "y"], np.array([3, 4]))  # NumPy values arrive as Python ints
    per_record = h.operator.get_state(SUM)
    h.operator.key_context.set_current_key("y")
    assert type(per_record.value()) is int and per_record.value() == 4
    h.operator.key_context.clear()
    with pytest.raises(ValueError, match="2 keys with 1 values"):
        sums.put(["x", "y"], [1])
    with pytest.raises(ConfigurationError, match="get_state takes a ValueStateDescriptor"):
        ctx.get_state(weir.ListStateDescriptor("l"))
    h.close()


def test_a_key_of_another_subtask_fails_as_it_does_per_record(tmp_path: Path) -> None:
    h = _harness(BatchSum(), "hashmap", tmp_path, parallelism=2, subtask_index=0)
    h.open()
    mine = [k for k in "abcdefghijklmnop"
            if weir.state.keygroups.assign_key_to_parallel_operator(k, 128, 2) == 0]
    other = next(k for k in "abcdefghijklmnop" if k not in mine)
    sums = h.operator.function._ctx.get_state(SUM)
    sums.put(mine[:1], [1])
    with pytest.raises(KeyGroupError):
        sums.get([mine[0], other])
    with pytest.raises(weir.errors.NoKeyContextError):  # no key left current after a call
        h.operator.get_state(SUM).value()
    h.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_ttl_state_expires_for_a_batch_function_as_per_record(backend: str, tmp_path: Path
                                                                 ) -> None:
    ttl = weir.ValueStateDescriptor("t", serializer=weir.IntSerializer(),
                                    ttl=weir.StateTtlConfig(ttl_ms=10_000))
    clock = ManualClock(1_000)
    h = _harness(BatchSum(), backend, tmp_path, clock=clock)
    h.open()
    state = h.operator.function._ctx.get_state(ttl)
    state.put(["a", "b"], [1, 2])
    clock.advance(5_000)
    state.put(["b"], [3])
    clock.advance(6_000)  # a written 11 s ago: expired; b 6 s ago
    assert state.get(["a", "b"]).to_pylist() == [None, 3]
    h.close()


def test_process_element_on_a_batch_function_says_what_to_call(tmp_path: Path) -> None:
    h = _harness(BatchSum(), "hashmap", tmp_path)
    h.open()
    with pytest.raises(ConfigurationError, match="process_batch"):
        h.process_element(("a", 1))
    per_record = _harness(RecordSum(), "hashmap", tmp_path)
    per_record.open()
    with pytest.raises(ConfigurationError, match="needs a KeyedBatchFunction"):
        per_record.process_batch(_batch([("a", 1)]))
    h.close()
    per_record.close()


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.tuples(st.sampled_from([1, 2, 3]), st.integers(1, 5)), max_size=12),
       limit=st.integers(5, 9))
def test_the_spark_pass_hands_a_batch_function_runs_of_records_merged_up_to_its_limit(
    sizes: list[tuple[int, int]], limit: int
) -> None:
    """A shuffle gives a subtask its records in runs (one per map output): consecutive
    runs of records reach the function as one batch while they fit ``limit`` rows, in
    order; other kinds pass through where they were."""
    from weir.runtime.spark.spill import merged_slices

    counter = iter(range(1000))
    slices = [(kind, pa.table({"i": [next(counter) for _ in range(n)]})) for kind, n in sizes]
    merged = list(merged_slices(iter(slices), 2, limit))
    flat = [(k, i) for k, t in merged for i in t.column("i").to_pylist()]
    assert flat == [(k, i) for k, t in slices for i in t.column("i").to_pylist()]
    assert all(t.num_rows <= limit for k, t in merged if k == 2)
    assert all(not (a == b == 2 and ta.num_rows + tb.num_rows <= limit)
               for (a, ta), (b, tb) in itertools.pairwise(merged))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_same_arrow_keys_read_then_written_then_read_again(backend: str, tmp_path: Path
                                                               ) -> None:
    """The usual pattern — ``get(keys)``, compute, ``put(keys, ...)`` with the same Arrow
    array — and a later call with other keys of the same values."""
    h = _harness(BatchSum(), backend, tmp_path)
    h.open()
    sums = h.operator.function._ctx.get_state(SUM)
    keys = pa.array(["a", "b", "c"])
    assert sums.get(keys).to_pylist() == [None, None, None]
    sums.put(keys, pa.array([1, 2, None]))
    assert sums.get(keys).to_pylist() == [1, 2, None]
    assert sums.get(pa.chunked_array([["c", "a"]])).to_pylist() == [None, 1]
    sums.delete(keys)
    assert sums.get(["a", "b"]).to_pylist() == [None, None]
    h.close()


LAST = weir.ValueStateDescriptor("last", serializer=weir.IntSerializer())
GAP = 5


class RecordSessions(weir.KeyedProcessFunction[tuple[str, int], tuple[str, int]]):
    """A key's session ends GAP ms of event time after its latest record: a timer at
    latest + GAP per record; a timer that is not the latest one is stale."""

    def open(self, ctx: weir.KeyedContext) -> None:
        self.last = ctx.get_state(LAST)

    def process_element(self, value: tuple[str, int], ctx: weir.KeyedContext) -> Any:
        latest = max(self.last.value() or value[1], value[1])
        self.last.update(latest)
        ctx.timer_service.register_event_time_timer(latest + GAP)
        return ()

    def on_timer(self, timestamp: int, ctx: weir.KeyedContext) -> Any:
        if (self.last.value() or 0) + GAP == timestamp:
            self.last.clear()
            yield (ctx.current_key, timestamp)


class BatchSessions(weir.KeyedBatchFunction):
    """The same sessions a batch at a time: one timer per key and batch."""

    def open(self, ctx: weir.KeyedBatchContext) -> None:
        self.last = ctx.get_state(LAST)

    def process_batch(self, batch: pa.RecordBatch, ctx: weir.KeyedBatchContext) -> Any:
        latest: dict[str, int] = {}
        for key, ts in zip(ctx.keys, batch.column("v").to_pylist(), strict=True):
            latest[key] = max(latest.get(key, ts), ts)
        keys = list(latest)
        before = self.last.get(keys).to_pylist()
        new = [max(b, latest[k]) if b is not None else latest[k]
               for k, b in zip(keys, before, strict=True)]
        self.last.put(keys, new)
        ctx.register_event_time_timers(keys, np.array(new) + GAP)
        return None

    def on_timers(self, timestamps: pa.Array, ctx: weir.KeyedBatchContext) -> Any:
        assert ctx.time_domain is weir.TimeDomain.EVENT_TIME
        keys = list(ctx.keys)
        last = self.last.get(keys).to_pylist()
        ended = [(k, t) for k, t, b in zip(keys, timestamps.to_pylist(), last, strict=True)
                 if (b or 0) + GAP == t]
        self.last.delete([k for k, _ in ended])
        return pa.record_batch([pa.array([k for k, _ in ended], pa.string()),
                                pa.array([t for _, t in ended], pa.int64())],
                               names=["k", "ended"])


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=20, deadline=None)
@given(steps=st.lists(st.tuples(
    st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 40)), max_size=12),
    st.integers(0, 15)), min_size=1, max_size=6))
def test_batch_timers_end_the_sessions_the_per_record_timers_end(
    backend: str, steps: list[tuple[list[tuple[str, int]], int]], tmp_path_factory: Any
) -> None:
    """Event-time timers registered from arrays and fired into ``on_timers``: after each
    batch the watermark moves on, and the sessions ended (key, end) are the per-record
    function's, in the same order; so is the state left."""
    tmp = tmp_path_factory.mktemp("t")
    record = _harness(RecordSessions(), backend, tmp)
    batch = _harness(BatchSessions(), backend, tmp)
    record.open()
    batch.open()
    watermark = 0
    for rows, step in steps:
        record.process_elements(rows)
        batch.process_batch(_batch(rows))
        watermark += step
        want = list(record.advance_watermark(watermark))
        got = [r for out in batch.advance_watermark(watermark) for r in zip(
            out.column("k").to_pylist(), out.column("ended").to_pylist(), strict=True)]
        assert got == want
    keys = {k for rows, _ in steps for k, _ in rows}
    assert _values(batch, LAST, keys) == _values(record, LAST, keys)
    record.close()
    batch.close()


def _values(h: KeyedOperatorHarness, descriptor: Any, keys: set[str]) -> dict[str, Any]:
    op = h.operator
    state = op.get_state(descriptor)
    out = {}
    for key in sorted(keys):
        op.key_context.set_current_key(key)
        out[key] = state.value()
    op.key_context.clear()
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_key_put_twice_keeps_its_last_value_a_null_included(backend: str, tmp_path: Path
                                                               ) -> None:
    h = _harness(BatchSum(), backend, tmp_path)
    h.open()
    sums = h.operator.function._ctx.get_state(SUM)
    sums.put(["a", "b"], [1, 2])
    sums.put(["a", "a", "b", "b", "c"], [5, None, None, 7, 3])
    assert sums.get(["a", "b", "c"]).to_pylist() == [None, 7, 3]
    with pytest.raises(weir.errors.StateSerializationError):  # the key context is cleared
        sums.put(["d"], ["not an int"])
    with pytest.raises(weir.errors.NoKeyContextError):
        h.operator.get_state(SUM).value()
    h.close()


ITEMS = weir.ListStateDescriptor("items", serializer=weir.IntSerializer())
ENTRIES = weir.MapStateDescriptor("entries", serializer=weir.IntSerializer())


class RecordLists(weir.KeyedProcessFunction[tuple[str, int], None]):
    """Per record (k, v): v appended to k's list; k's map entry v % 4 set to v, or
    removed when v is negative."""

    def open(self, ctx: weir.KeyedContext) -> None:
        self.items = ctx.get_list_state(ITEMS)
        self.last = ctx.get_map_state(ENTRIES)

    def process_element(self, value: tuple[str, int], ctx: weir.KeyedContext) -> Any:
        v = value[1]
        self.items.add(v)
        if v < 0:
            self.last.remove(v % 4)
        else:
            self.last.put(v % 4, v)
        return ()


class BatchLists(weir.KeyedBatchFunction):
    """RecordLists a batch at a time: one add and one put for every row."""

    def open(self, ctx: weir.KeyedBatchContext) -> None:
        self.items = ctx.get_list_state(ITEMS)
        self.last = ctx.get_map_state(ENTRIES)

    def process_batch(self, batch: pa.RecordBatch, ctx: weir.KeyedBatchContext) -> Any:
        values = batch.column("v").to_pylist()
        self.items.add(ctx.keys, values)
        self.last.put(ctx.keys, [v % 4 for v in values], [v if v >= 0 else None
                                                           for v in values])


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=20, deadline=None)
@given(batches=BATCHES, cut=st.integers(0, 6))
def test_batch_list_and_map_state_end_as_the_per_record_appends_and_puts_do(
    backend: str, batches: list[list[tuple[str, int]]], cut: int, tmp_path_factory: Any
) -> None:
    """For random batches, with a restore part way: each key's list and map equal what
    the same appends, puts and removes per record leave."""
    _side_by_side(RecordLists(), BatchLists, backend, batches, cut,
                  tmp_path_factory.mktemp("lm"), (ITEMS, ENTRIES))


def _side_by_side(record_fn: Any, batch_fn: Any, backend: str,
                  batches: list[list[tuple[str, int]]], cut: int, tmp: Path,
                  descriptors: tuple[Any, ...],
                  check: Any = lambda out, record: None) -> None:
    """``record_fn`` per record and ``batch_fn()`` per batch over ``batches``, the batch
    one restored from its own snapshot before batch ``cut``; ``check(outputs, record
    harness)`` after each batch; at the end every key's state of ``descriptors`` equal."""
    record, batch = _harness(record_fn, backend, tmp), _harness(batch_fn(), backend, tmp)
    record.open()
    batch.open()
    seen: set[str] = set()
    for i, rows in enumerate(batches):
        if i == cut:
            snap = batch.snapshot()
            batch.close()
            batch = KeyedOperatorHarness.restore(
                batch_fn(), lambda row: row["k"], [snap], parallelism=1, subtask_index=0,
                state_backend=backend, rocksdb_path=tmp / "rocks" / f"restored{i}")
        record.process_elements(rows)
        check(batch.process_batch(_batch(rows)), record)
        seen.update(k for k, _ in rows)
    for key in seen:
        for descriptor in descriptors:
            assert batch.state_of(key, descriptor) == record.state_of(key, descriptor)
    record.close()
    batch.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_list_and_map_batch_reads_updates_and_deletes(backend: str, tmp_path: Path) -> None:
    class Probe(weir.KeyedBatchFunction):
        def open(self, ctx: weir.KeyedBatchContext) -> None:
            self.items, self.last = ctx.get_list_state(ITEMS), ctx.get_map_state(ENTRIES)
            self.ctx = ctx

        def process_batch(self, batch: pa.RecordBatch, ctx: weir.KeyedBatchContext) -> Any:
            return None

    probe = Probe()
    h = _harness(probe, backend, tmp_path)
    h.open()
    items, last = probe.items, probe.last
    items.add(["a", "b", "a"], [1, 2, 3])
    assert items.get(["a", "b", "c"]).to_pylist() == [[1, 3], [2], []]
    assert items.get(["a"]).type == pa.list_(pa.int64())
    items.update(["a", "b"], [np.array([7]), None])
    items.delete(["c"])
    assert items.get(["a", "b"]).to_pylist() == [[7], []]
    last.put(["a", "a", "b"], [1, 2, 1], [10, 20, 30])
    assert last.get(["a", "a", "b", "b"], [1, 2, 1, 2]).to_pylist() == [10, 20, 30, None]
    assert last.contains(["a", "b"], [2, 2]).to_pylist() == [True, False]
    last.put(["a"], [1], [None])
    last.delete(["b"])
    assert last.get(["a", "a", "b"], [1, 2, 1]).to_pylist() == [None, 20, None]
    with pytest.raises(ValueError, match="2 keys"):
        items.add(["a", "b"], [1])
    with pytest.raises(ConfigurationError, match="get_map_state"):
        probe.ctx.get_state(ENTRIES)
    # values compared element-wise by == (arrays) are added, not asked for their truth
    arrays = probe.ctx.get_list_state(
        weir.ListStateDescriptor("arrays", serializer=weir.PickleSerializer()))
    arrays.add(["a", "a"], [np.array([1, 2]), np.array([3])])
    h.operator.key_context.set_current_key("a")
    got = h.operator.get_list_state(
        weir.ListStateDescriptor("arrays", serializer=weir.PickleSerializer())).get()
    h.operator.key_context.clear()
    assert [a.tolist() for a in got] == [[1, 2], [3]]
    # adds fail as per-record adds do, and are recorded for a changelog snapshot
    with pytest.raises(StateError, match="cannot add None"):
        items.add(["a", "b"], [8, None])
    with pytest.raises(weir.errors.StateSerializationError):
        items.add(["b"], ["not an int"])
    h.operator.track_changes()
    items.add(pa.array(["d", "d", "e"]), pa.array([4, 5, 6]))
    assert items.get(["d", "e"]).to_pylist() == [[4, 5], [6]]
    assert h.state_of("d", ITEMS) == [4, 5]
    if backend == "hashmap":
        changed = {key for _, changes in h.operator.backend.take_changes()
                   for key, _ in changes}
        ctx = h.operator.key_context
        assert changed == set(ctx.prefixed_keys(["d", "e"]))
        ctx.clear()
    h.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_put_of_an_int_beyond_int64_fails_as_update_does(backend: str,
                                                                tmp_path: Path) -> None:
    h = _harness(BatchSum(), backend, tmp_path)
    h.open()
    view = h.operator.function._ctx.get_state(SUM)
    with pytest.raises(weir.errors.StateSerializationError):
        view.put(["a"], [2**63])
    h.close()


AMOUNT = weir.ValueStateDescriptor("amount", serializer=weir.FloatSerializer())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_put_of_arrays_stores_what_per_record_updates_store(
        backend: str, tmp_path: Path) -> None:
    """Arrow and NumPy arrays of every width (RocksDB packs a state's own kind without
    a Python object per value) read back per record as the same values; a null
    deletes; on RocksDB a value of another kind, or an unsigned int beyond int64, goes
    through the checked path and fails as ``update`` does."""
    h = _harness(BatchSum(), backend, tmp_path)
    h.open()
    ctx = h.operator.function._ctx
    ints, floats = ctx.get_state(SUM), ctx.get_state(AMOUNT)
    ints.put([], np.array([], dtype=np.int64))  # (nothing: no value to check)
    keys = ["a", "b", "c", "d"]
    ints.put(keys, np.array([0, -1, 2**63 - 1, 256], dtype=np.int64))
    floats.put(keys, pa.array([0.0, -1.5, 1e300, 256.0], pa.float64()))
    assert [h.state_of(k, SUM) for k in keys] == [0, -1, 2**63 - 1, 256]
    assert [h.state_of(k, AMOUNT) for k in keys] == [0.0, -1.5, 1e300, 256.0]
    ints.put(keys, pa.chunked_array([pa.array([7, None], pa.int32()),
                                     pa.array([-(2**31), 9], pa.int32())]))
    floats.put(keys[:2], pa.array([0.5, -2.0], pa.float32()))
    assert [h.state_of(k, SUM) for k in keys] == [7, None, -(2**31), 9]
    assert [h.state_of(k, AMOUNT) for k in keys[:2]] == [0.5, -2.0]
    assert ints.get(keys).to_pylist() == [7, None, -(2**31), 9]
    if backend == "rocksdb":  # (the hash map checks a value's type once, as update does)
        with pytest.raises(weir.errors.StateSerializationError):
            ints.put(["a"], np.array([2**63], dtype=np.uint64))
        with pytest.raises(weir.errors.StateSerializationError):
            ints.put(["a"], np.array([1.5]))
    with pytest.raises(ValueError, match="put of 2 keys with 1 values"):
        ints.put(["a", "b"], np.array([1]))
    # a masked array's masked values are nulls: they delete
    ints.put(keys[:2], np.ma.masked_array([5, 6], mask=[False, True], dtype=np.int64))
    assert [h.state_of(k, SUM) for k in keys[:2]] == [5, None]
    h.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_get_of_numbers_is_what_arrow_makes_of_the_stored_values(
        backend: str, tmp_path: Path) -> None:
    """A get as int64 or float64 (read in C on the hash map) gives what Arrow makes of
    the values per-record reads: nulls where absent; a bool, an int for a float, an
    int beyond int64 converted or refused as Arrow converts or refuses them."""
    h = _harness(BatchSum(), backend, tmp_path)
    h.open()
    anything = h.operator.function._ctx.get_state(weir.ValueStateDescriptor("any"))
    per_record = h.operator.get_state(weir.ValueStateDescriptor("any"))
    stored = {"int": -(2**63), "big": 2**63, "bool": True, "float": -0.5, "one": 1,
              "nan": float("nan")}
    for key, value in stored.items():
        h.operator.key_context.set_current_key(key)
        per_record.update(value)
    h.operator.key_context.clear()
    for kind in (pa.int64(), pa.float64()):
        for keys in (["int", "gone", "one"], ["float", "nan", "gone"], ["bool"], ["big"],
                     ["one", "float"], []):
            try:
                want = pa.array([stored.get(k) for k in keys], type=kind)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
                with pytest.raises(StateError, match="do not make one Arrow array"):
                    anything.get(pa.array(keys, pa.string()), type=kind)
                continue
            got = anything.get(pa.array(keys, pa.string()), type=kind)
            assert got.type == kind and got.null_count == want.null_count
            assert got.equals(want) or str(got) == str(want), (keys, kind)  # (nan != nan)
    h.close()


@pytest.mark.parametrize("backend", ["rocksdb", "rocksdb-evicting"])
def test_rocksdbs_fixed_width_values_move_through_one_buffer_or_the_table(
        backend: str, tmp_path: Path) -> None:
    """RocksDB's int and float values go between the entry cache and one buffer in C
    where the cache holds them all, and through the table where it does not (a cache
    of two entries evicts as the batch writes): the same values either way, nulls where
    absent, RocksDB read where the cache does not hold a key."""
    h = _harness(BatchSum(), backend, tmp_path)
    h.open()
    ctx = h.operator.function._ctx
    ints, floats = ctx.get_state(SUM), ctx.get_state(AMOUNT)
    keys = [f"k{i}" for i in range(10)]
    ints.put(pa.array(keys), pa.array(range(-5, 5), pa.int64()))
    floats.put(keys[:5], np.linspace(-1.0, 1.0, 5))
    h.operator.backend.flush()  # (written to RocksDB: an evicting cache reads it back)
    asked = [*keys, "absent"]
    assert ints.get(asked).to_pylist() == [*range(-5, 5), None]
    assert floats.get(asked).to_pylist() == [*np.linspace(-1.0, 1.0, 5).tolist(),
                                             *[None] * 6]
    assert [h.state_of(k, SUM) for k in keys] == list(range(-5, 5))
    h.close()


def _smaller(a: int, b: int) -> int:
    return min(a, b)


class MeanOf(weir.AggregateFunction[int, list[int], float]):
    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        return [accumulator[0] + value, accumulator[1] + 1]

    def get_result(self, accumulator: list[int]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1]]


LOWEST = weir.ReducingStateDescriptor("lowest", reduce_function=_smaller,
                                      serializer=weir.IntSerializer())
MEAN = weir.AggregatingStateDescriptor("mean", aggregate_function=MeanOf())


class RecordFolds(weir.KeyedProcessFunction[tuple[str, int], None]):
    def open(self, ctx: weir.KeyedContext) -> None:
        self.lowest = ctx.get_reducing_state(LOWEST)
        self.mean = ctx.get_aggregating_state(MEAN)

    def process_element(self, value: tuple[str, int], ctx: weir.KeyedContext) -> Any:
        self.lowest.add(value[1])
        self.mean.add(value[1])
        return ()


class BatchFolds(weir.KeyedBatchFunction):
    def open(self, ctx: weir.KeyedBatchContext) -> None:
        self.lowest = ctx.get_reducing_state(LOWEST)
        self.mean = ctx.get_aggregating_state(MEAN)

    def process_batch(self, batch: pa.RecordBatch, ctx: weir.KeyedBatchContext) -> Any:
        self.lowest.add(ctx.keys, batch.column("v"))
        self.mean.add(ctx.keys, batch.column("v"))
        keys = sorted(set(ctx.keys))
        return pa.record_batch({"k": keys, "lowest": self.lowest.get(keys),
                                "mean": self.mean.get(keys, type=pa.float64())})


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=20, deadline=None)
@given(batches=BATCHES, cut=st.integers(0, 6))
def test_batch_reducing_and_aggregating_state_fold_as_per_record_adds_do(
    backend: str, batches: list[list[tuple[str, int]]], cut: int, tmp_path_factory: Any
) -> None:
    """For random batches, with a restore part way: each key's reduced value and
    aggregate equal what the same adds per record leave."""
    def check(outputs: list[Any], record: KeyedOperatorHarness) -> None:
        for out in outputs:
            for row in out.to_pylist():
                assert row["lowest"] == record.state_of(row["k"], LOWEST)
                assert row["mean"] == record.state_of(row["k"], MEAN)

    _side_by_side(RecordFolds(), BatchFolds, backend, batches, cut,
                  tmp_path_factory.mktemp("folds"), (LOWEST, MEAN), check)
