"""Changelog checkpoints (weir.checkpoint.changelog) of the hash map and of RocksDB
(weir.state.rocksdb_changes): what each checkpoint writes, restore from a base plus
deltas at any parallelism and across backends (a model test), materialization racing
processing, a crash at every write step of a checkpoint that switches to a
materialization, the one-checkpointer rule, and extending only checkpoints known
complete (the continuous runtime's rule)."""

from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from test_state_model import SETTINGS, ApplyCommand, ClusterMachine, key_of
from weir import (
    CheckpointCoordinator,
    CheckpointStorage,
    ConfigurationError,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
    load_checkpoint,
    take_checkpoint,
)
from weir.checkpoint.changelog import ChangelogPolicy, decode_delta
from weir.checkpoint.format import KeyedChangelogHandle
from weir.errors import CorruptCheckpointError, StateError
from weir.runtime.batch_state import BatchStateView
from weir.runtime.checkpointer import SubtaskCheckpointer
from weir.state.hashmap import SAMPLE_MASK, SAMPLE_MIN_KEYS
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.testing import KeyedOperatorHarness
from weir.testing.faults import WHEN, FaultInjectingFileSystem, InjectedCrash

COUNT = ValueStateDescriptor("count")
SEEN = ListStateDescriptor("seen")
LAST = MapStateDescriptor("last")
MAXP = 32
SYNC = ChangelogPolicy(interval_ms=None, max_deltas=1_000, size_ratio=1e9, background=False,
                       rebase_share=None)


class Tracker(KeyedProcessFunction[Any, Any]):
    """Element ``(key, n)``: count, the list of every n, map n % 4 -> n, an event-time
    timer at 1000 + n (fired timers emit); n < 0 clears the key (its timers stay)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)
        self.seen = ctx.get_list_state(SEEN)
        self.last = ctx.get_map_state(LAST)

    def process_element(self, value: Any, ctx: Any) -> Any:
        _, n = value
        if n < 0:
            self.count.clear()
            self.seen.clear()
            self.last.clear()
            return
        self.count.update((self.count.value() or 0) + 1)
        self.seen.add(n)
        self.last.put(n % 4, n)
        ctx.timer_service.register_event_time_timer(1000 + n)
        if n % 7 == 0:
            ctx.timer_service.delete_event_time_timer(1000 + n)

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield (ctx.current_key, timestamp)


def _cluster(p: int, restore: Any = None, backend: str = "hashmap"
             ) -> list[KeyedOperatorHarness]:
    out = []
    for i in range(p):
        if restore is None:
            h = KeyedOperatorHarness(Tracker(), lambda v: v[0], max_parallelism=MAXP,
                                     parallelism=p, subtask_index=i, state_backend=backend)
            h.open()
        else:
            h = KeyedOperatorHarness.restore(Tracker(), lambda v: v[0], restore,
                                             parallelism=p, subtask_index=i,
                                             max_parallelism=MAXP, state_backend=backend)
        out.append(h)
    return out


def _send(cluster: list[KeyedOperatorHarness], records: list[tuple[str, int]]) -> None:
    for key, n in records:
        cluster[assign_key_to_parallel_operator(key, MAXP, len(cluster))].process_element(
            (key, n))


def _state(cluster: list[KeyedOperatorHarness], keys: list[str]) -> dict[str, Any]:
    timers: dict[Any, list[int]] = {}
    for h in cluster:
        for t, k in h.event_time_timers():
            timers.setdefault(k, []).append(t)
    out: dict[str, Any] = {}
    for key in keys:
        h = cluster[assign_key_to_parallel_operator(key, MAXP, len(cluster))]
        out[key] = (h.state_of(key, COUNT), h.state_of(key, SEEN), h.state_of(key, LAST),
                    sorted(timers.get(key, [])))
    return out


def _restored_state(url: str, keys: list[str], p: int = 1, backend: str = "hashmap"
                    ) -> dict[str, Any]:
    """The state of ``keys`` in a cluster of ``p`` subtasks restored from ``url``."""
    restored = _cluster(p, load_checkpoint(url), backend)
    try:
        return _state(restored, keys)
    finally:
        _close(restored, [])


def _checkpointers(
    cluster: list[KeyedOperatorHarness], storage: CheckpointStorage, policy: ChangelogPolicy
) -> list[SubtaskCheckpointer]:
    return [SubtaskCheckpointer(h.operator, storage, mode="changelog", asynchronous=False,
                                changelog=policy) for h in cluster]


def _close(cluster: list[KeyedOperatorHarness], checkpointers: list[SubtaskCheckpointer]) -> None:
    for c in checkpointers:
        c.close()
    for h in cluster:
        h.close()


def _keyed(completed: Any, subtask: int = 0) -> KeyedChangelogHandle:
    handle = completed.metadata.operators["operator"].subtasks[subtask]
    assert isinstance(handle.keyed, KeyedChangelogHandle)
    return handle.keyed


# ---------------------------------------------------------------- bytes per checkpoint


def test_checkpoint_bytes_follow_the_change_not_the_state(tmp_path: Path, backend: str) -> None:
    keys = [f"key-{i}" for i in range(5_000)]
    coordinator = CheckpointCoordinator(str(tmp_path), retained=2)
    cluster = _cluster(1, backend=backend)
    checkpointers = _checkpointers(cluster, coordinator.storage, SYNC)
    try:
        _send(cluster, [(k, 7 * i + 1) for i, k in enumerate(keys)])
        base = take_checkpoint(coordinator, checkpointers)
        base_bytes = base.metadata.total_bytes
        idle = take_checkpoint(coordinator, checkpointers)  # nothing changed
        _send(cluster, [(k, 3) for k in keys[:50]])  # 1% of the keys
        churn = take_checkpoint(coordinator, checkpointers)
        _send(cluster, [(keys[0], -1)])  # one key deleted
        deleted = take_checkpoint(coordinator, checkpointers)
        want = _state(cluster, keys)
    finally:
        _close(cluster, checkpointers)
    stats = [c.metadata.operators["operator"].subtasks[0].stats for c in (idle, churn, deleted)]
    assert stats[0].new_bytes == 0 and _keyed(idle) == _keyed(base)  # idle: no file at all
    assert 0 < stats[1].new_bytes <= 0.05 * base_bytes, (stats[1].new_bytes, base_bytes)
    assert stats[2].new_bytes < 200
    assert [d.file.path for d in _keyed(deleted).deltas] == [
        d.file.path for d in _keyed(churn).deltas] + [_keyed(deleted).deltas[-1].file.path]
    # the delete is recorded: the key is gone after a restore (its timers stay)
    assert _restored_state(deleted.url, keys) == want
    assert _restored_state(deleted.url, keys, 2, backend="rocksdb") == want
    assert want[keys[0]][:3] == (None, [], {})


def test_a_checkpoint_that_changed_most_keys_writes_a_new_base_instead_of_a_delta(
    tmp_path: Path,
) -> None:
    """At or above ``rebase_share`` of the keys written, the checkpoint writes the
    whole state as a new base (no delta; the chain starts over); below it, a delta."""
    keys = [f"key-{i}" for i in range(1_000)]
    coordinator = CheckpointCoordinator(str(tmp_path), retained=2)
    cluster = _cluster(1)
    policy = ChangelogPolicy(interval_ms=None, max_deltas=1_000, size_ratio=1e9,
                             background=False, rebase_share=0.5)
    checkpointers = _checkpointers(cluster, coordinator.storage, policy)
    try:
        _send(cluster, [(k, 1) for k in keys])
        first = take_checkpoint(coordinator, checkpointers)
        _send(cluster, [(k, 2) for k in keys[:490]])  # 49%: a delta
        below = take_checkpoint(coordinator, checkpointers)
        _send(cluster, [(k, 3) for k in keys[:500]])  # 50%: a new base
        at = take_checkpoint(coordinator, checkpointers)
        _send(cluster, [(k, 4) for k in keys[:10]])  # the next delta extends the new base
        after = take_checkpoint(coordinator, checkpointers)
        want = _state(cluster, keys)
    finally:
        _close(cluster, checkpointers)
    assert _keyed(below).base == _keyed(first).base and len(_keyed(below).deltas) == 1
    assert _keyed(at).base != _keyed(first).base and _keyed(at).deltas == ()
    assert _keyed(at).base.file.path.rsplit("/", 1)[-1].startswith(f"{at.checkpoint_id}-")
    assert _keyed(after).base == _keyed(at).base and len(_keyed(after).deltas) == 1
    for p in (1, 3):
        assert _restored_state(after.url, keys, p) == want


def test_after_a_base_for_churn_writes_are_sampled_until_fewer_keys_change(
    tmp_path: Path,
) -> None:
    """After a base written because most keys changed, a large hash-map state records
    only a sample of its written keys in a set (a hash test per write instead of a
    set insert): the next checkpoint estimates the share from the sample. Most keys
    again: a base. Nothing written: no file. A few keys: which ones is unknown, so a
    base too, after which every change is recorded exactly and the next few keys
    make a delta."""
    keys = [f"key-{i}" for i in range(2 * SAMPLE_MIN_KEYS)]  # a sample of about 512
    coordinator = CheckpointCoordinator(str(tmp_path), retained=4)
    cluster = _cluster(1)
    op = cluster[0].operator
    policy = dataclasses.replace(SYNC, rebase_share=0.5)
    checkpointers = _checkpointers(cluster, coordinator.storage, policy)
    states: dict[int, Any] = {}

    def step(records: list[tuple[str, int]]) -> tuple[Any, bool]:
        _send(cluster, records)
        completed = take_checkpoint(coordinator, checkpointers)
        states[completed.checkpoint_id] = _state(cluster, keys)
        return completed, op.changes_sampled()

    try:
        first, sampled_after_first = step([(k, 1) for k in keys])
        churn, sampled_after_churn = step([(k, 2) for k in keys[: len(keys) * 7 // 10]])
        assert op.changed_share() == 0.0 and op.changes_known()  # nothing written yet
        _send(cluster, [(k, 3) for k in keys[len(keys) * 3 // 10:]])  # 70% again
        estimate = op.changed_share()
        assert op.changes_sampled() and not op.changes_known()
        with pytest.raises(StateError, match="only a sample"):
            op.backend.take_changes().__next__()[1].__next__()
        again, sampled_after_again = step([])
        idle, sampled_after_idle = step([])
        few, sampled_after_few = step([(k, 4) for k in keys[:10]])
        delta, sampled_after_delta = step([(k, 5) for k in keys[10:20]])
    finally:
        _close(cluster, checkpointers)
    assert 0.6 <= estimate <= 0.8
    assert not sampled_after_first and sampled_after_churn and sampled_after_again
    assert sampled_after_idle and not sampled_after_few and not sampled_after_delta
    bases = {_keyed(c).base.file.path for c in (first, churn, again, few)}
    assert len(bases) == 4 and all(
        _keyed(c).deltas == () for c in (first, churn, again, few))
    assert _keyed(idle) == _keyed(again)  # nothing written: nothing new to reference
    assert _keyed(delta).base == _keyed(few).base and len(_keyed(delta).deltas) == 1
    for completed in (few, delta):
        for p in (1, 3):
            assert _restored_state(completed.url, keys, p) == states[completed.checkpoint_id]


class Counter(KeyedProcessFunction[Any, Any]):
    """One value state: element ``(key, n)`` stores n."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.count.update(value[1])


def test_an_exact_record_turns_sampled_at_the_rebase_share_and_a_base_follows(
    tmp_path: Path,
) -> None:
    """Once one state's exact record of written keys holds ``rebase_share`` of the keys,
    the checkpoint is a base whatever else is written: the record stops being exact
    there (a set insert per write no longer buys a delta) and only the sample is kept.
    Below the share the record stays exact and the checkpoint is a delta."""
    keys = [f"key-{i}" for i in range(2 * SAMPLE_MIN_KEYS)]
    limit = len(keys) // 2
    coordinator = CheckpointCoordinator(str(tmp_path), retained=4)
    h = KeyedOperatorHarness(Counter(), lambda v: v[0], max_parallelism=MAXP)
    h.open()
    op = h.operator
    [checkpointer] = checkpointers = [SubtaskCheckpointer(
        op, coordinator.storage, mode="changelog", asynchronous=False,
        changelog=dataclasses.replace(SYNC, rebase_share=0.5))]
    try:
        h.process_elements([(k, 1) for k in keys])
        exact = take_checkpoint(coordinator, checkpointers)  # the first: a base
        table = op.backend._tables["count"]  # recorded exactly now, up to the share
        assert table._dirty_limit == limit and table._sample_mask == 0
        h.process_elements([(k, 3) for k in keys[: limit - 1]])
        assert op.changes_known() and table._sample_mask == 0
        below = take_checkpoint(coordinator, checkpointers)  # 49.99%: a delta
        h.process_elements([(k, 4) for k in keys[: limit - 1]])
        assert op.changes_known()
        h.process_elements([(k, 4) for k in keys[limit - 1 : limit + 2_000]])
        assert table._sample_mask == SAMPLE_MASK and not op.changes_known()
        assert op.changes_sampled()
        assert len(table._dirty) < limit + 2_000 // 8  # past the limit: the sample only
        # the share: the exact part as counted, the rest estimated from the sample
        assert 0.65 <= op.changed_share() <= 0.85  # (written: 6,097 of 8,192 keys)
        at = take_checkpoint(coordinator, checkpointers)
        want = {k: h.state_of(k, COUNT) for k in keys}
        sampled_after = op.changes_sampled()
    finally:
        h.close()
        checkpointer.close()
    assert _keyed(exact).deltas == () and _keyed(below).base == _keyed(exact).base
    assert len(_keyed(below).deltas) == 1
    assert _keyed(at).deltas == () and _keyed(at).base != _keyed(exact).base
    assert sampled_after  # the share, estimated high, says churn: the next one sampled
    restored = KeyedOperatorHarness.restore(Counter(), lambda v: v[0], load_checkpoint(at.url),
                                            parallelism=1, subtask_index=0,
                                            max_parallelism=MAXP)
    try:
        assert {k: restored.state_of(k, COUNT) for k in keys} == want
    finally:
        restored.close()


def test_the_dirty_limit_follows_the_keys_held_from_one_delta_to_the_next(
    tmp_path: Path,
) -> None:
    """After a delta the record starts over with the limit of the keys held then: a
    state that grew keeps writing deltas below the rebase share of its new size."""
    keys = [f"key-{i}" for i in range(3 * SAMPLE_MIN_KEYS)]
    coordinator = CheckpointCoordinator(str(tmp_path), retained=4)
    h = KeyedOperatorHarness(Counter(), lambda v: v[0], max_parallelism=MAXP)
    h.open()
    checkpointers = [SubtaskCheckpointer(
        h.operator, coordinator.storage, mode="changelog", asynchronous=False,
        changelog=dataclasses.replace(SYNC, rebase_share=0.5))]
    try:
        h.process_elements([(k, 1) for k in keys[:SAMPLE_MIN_KEYS]])
        first = take_checkpoint(coordinator, checkpointers)
        table = h.operator.backend._tables["count"]
        assert table._dirty_limit == SAMPLE_MIN_KEYS // 2
        grown = keys[SAMPLE_MIN_KEYS : SAMPLE_MIN_KEYS + SAMPLE_MIN_KEYS // 2 - 1]
        h.process_elements([(k, 1) for k in grown])  # new keys, just below the limit
        delta = take_checkpoint(coordinator, checkpointers)
        held = SAMPLE_MIN_KEYS + len(grown)
        assert table._dirty_limit == math.ceil(held / 2)
        h.process_elements([(k, 2) for k in keys[: math.ceil(held / 2) - 1]])
        again = take_checkpoint(coordinator, checkpointers)  # (the first limit: a base)
    finally:
        h.close()
        for c in checkpointers:
            c.close()
    assert len(_keyed(delta).deltas) == 1 and _keyed(delta).base == _keyed(first).base
    assert len(_keyed(again).deltas) == 2 and _keyed(again).base == _keyed(first).base


def test_a_checkpointer_says_when_its_uploads_and_materialization_have_ended(
    tmp_path: Path,
) -> None:
    """``ended(timeout)`` waits in steps for the work handed to the worker threads (a
    caller that must stay alive, a finishing task, heartbeats in between); ``close``
    then has nothing left to wait for."""
    coordinator = CheckpointCoordinator(str(tmp_path), retained=2)
    cluster = _cluster(1)
    release = threading.Event()
    write = coordinator.storage.write

    def slow(relative: str, data: bytes) -> Any:
        release.wait(10)
        return write(relative, data)

    [checkpointer] = checkpointers = [SubtaskCheckpointer(
        cluster[0].operator, coordinator.storage, mode="changelog", asynchronous=True,
        changelog=dataclasses.replace(SYNC, background=True))]
    try:
        assert checkpointer.ended(0.0)  # nothing handed over yet
        _send(cluster, [("a", 1)])
        coordinator.storage.write = slow  # type: ignore[method-assign]
        pending = checkpointer.snapshot(1, 0)
        assert not checkpointer.ended(0.05)
        release.set()
        assert checkpointer.ended(10.0) and pending.future.done()
    finally:
        _close(cluster, checkpointers)


class _Stub:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def test_a_finishing_task_waits_for_its_checkpointers_with_heartbeats() -> None:
    """Before it closes its operators and reports finished, a continuous task waits for
    each checkpointer's running work, a heartbeat a step, then closes it."""
    from weir.runtime.continuous.task import Task

    events: list[str] = []
    answers = iter([False, False, True])
    checkpointer = _Stub(ended=lambda timeout: next(answers),
                         close=lambda: events.append("close"))
    operator = _Stub(core=_Stub(close=lambda: events.append("operator closed")),
                     writer=None, reader=None)
    task = _Stub(
        chain=_Stub(flush=lambda: None, sinks=[], all=[operator], stateful=[operator]),
        checkpointers=[checkpointer], heartbeat=lambda: events.append("heartbeat"),
        outs=[], control=_Stub(send=lambda message: events.append(message["kind"])))
    Task.finish(task)  # type: ignore[arg-type]
    assert events == ["heartbeat", "heartbeat", "close", "operator closed", "finished"]


@pytest.mark.parametrize("share", [0, -0.5, 1.5, float("inf"), float("nan"), "half", True])
def test_a_rebase_share_outside_zero_to_one_is_refused(share: Any) -> None:
    with pytest.raises(ConfigurationError, match="rebase_share"):
        ChangelogPolicy(rebase_share=share)
    assert ChangelogPolicy(rebase_share=1).rebase_share == 1
    assert ChangelogPolicy(rebase_share=None).rebase_share is None


@pytest.mark.parametrize("path", ["record", "python", "batch"])
def test_every_write_path_turns_the_record_sampled_at_its_limit(path: str) -> None:
    """The per-record C path, the tables' Python path and a batch function's ``put``
    all stop the exact record at the limit, at exactly that many keys."""
    keys = [f"key-{i}" for i in range(SAMPLE_MIN_KEYS)]
    h = KeyedOperatorHarness(Counter(), lambda v: v[0], max_parallelism=MAXP)
    h.open()
    try:
        h.process_elements([(k, 1) for k in keys])
        op = h.operator
        op.track_changes(rebase_share=0.25)
        table = op.backend._tables["count"]
        limit = SAMPLE_MIN_KEYS // 4
        assert table._dirty_limit == limit

        def write(batch: list[str]) -> None:
            if path == "record":
                h.process_elements([(k, 2) for k in batch])
            elif path == "python":
                for k in batch:
                    table.update_at(op.key_context.prefixed_keys([k])[0], 2)
                op.key_context.clear()
            else:
                view = BatchStateView(op, op.get_state(COUNT), COUNT)
                view.put(pa.array(batch), pa.array([2] * len(batch)))

        write(keys[: limit - 1])
        assert table._sample_mask == 0 and len(table._dirty) == limit - 1
        write(keys[limit - 1 : limit])
        assert table._sample_mask == SAMPLE_MASK and not op.changes_known()
    finally:
        h.close()


def test_a_small_state_records_every_change_even_after_a_base_for_churn() -> None:
    """Below ``SAMPLE_MIN_KEYS`` keys a sample would estimate poorly and the exact
    record is cheap: a request to sample records every key."""
    h = KeyedOperatorHarness(Tracker(), lambda v: v[0], max_parallelism=MAXP)
    h.open()
    try:
        h.process_elements([(f"key-{i}", 1) for i in range(100)])
        h.operator.track_changes(sampled=True)
        h.process_elements([(f"key-{i}", 2) for i in range(60)])
        assert h.operator.changes_known() and h.operator.changed_share() == 0.6
    finally:
        h.close()


def test_an_asynchronous_changelog_checkpoint_extends_the_one_still_uploading(
    tmp_path: Path, backend: str,
) -> None:
    """Checkpoint 2 is taken while checkpoint 1's delta is still being written: it
    extends the chain that ends with that delta (its synchronous part waits for it),
    so a restore of 2 has every change of 1."""
    keys = [f"key-{i}" for i in range(100)]
    coordinator = CheckpointCoordinator(str(tmp_path), retained=3)
    cluster = _cluster(1, backend=backend)
    policy = dataclasses.replace(SYNC, background=True)
    [checkpointer] = checkpointers = [SubtaskCheckpointer(
        cluster[0].operator, coordinator.storage, mode="changelog", asynchronous=True,
        changelog=policy)]
    release = threading.Event()
    write = coordinator.storage.write

    def slow_delta(relative: str, data: bytes) -> Any:
        if relative.endswith(".delta"):
            release.wait(10)
        return write(relative, data)

    try:
        _send(cluster, [(k, 1) for k in keys])
        take_checkpoint(coordinator, checkpointers)
        coordinator.storage.write = slow_delta  # type: ignore[method-assign]
        _send(cluster, [(k, 2) for k in keys[:5]])
        first = checkpointer.snapshot(2, 0)
        _send(cluster, [(k, 3) for k in keys[5:10]])
        threading.Timer(0.3, release.set).start()
        second = checkpointer.snapshot(3, 0)  # waits for the delta of 2
        assert first.future.done()
        deltas = second.result(10).keyed.deltas  # type: ignore[union-attr]
        assert [d.file for d in deltas[:1]] == [
            d.file for d in first.result().keyed.deltas]  # type: ignore[union-attr]
        assert len(deltas) == 2
    finally:
        release.set()
        _close(cluster, checkpointers)


@pytest.mark.parametrize("backend,mode", [("hashmap", "changelog"), ("rocksdb", "incremental")])
def test_a_subtask_restored_from_its_own_checkpoint_goes_on_without_rewriting_it(
    tmp_path: Path, backend: str, mode: str
) -> None:
    """As the Spark runtime does after a worker-cache miss: operator and checkpointer
    made first, then restored from the subtask's own newest checkpoint and ``adopt``-ed:
    the next checkpoint writes what changed, not the whole state again (the hash map
    extends the changelog; RocksDB references the restored SST files)."""
    keys = [f"key-{i}" for i in range(5_000)]
    coordinator = CheckpointCoordinator(str(tmp_path), retained=3)

    def subtask() -> tuple[KeyedOperatorHarness, SubtaskCheckpointer]:
        h = KeyedOperatorHarness(Tracker(), lambda v: v[0], max_parallelism=MAXP,
                                 state_backend=backend)
        return h, SubtaskCheckpointer(h.operator, coordinator.storage, mode=mode,
                                      asynchronous=False, changelog=SYNC)

    h, c = subtask()
    h.open()
    try:
        _send([h], [(k, 7 * i + 1) for i, k in enumerate(keys)])
        first = take_checkpoint(coordinator, [c])
        want = _state([h], keys)
    finally:
        _close([h], [c])
    h, c = subtask()
    try:
        handle = first.metadata.operators["operator"].subtasks[0]
        h.operator.restore(first.load("operator", 1, 0))
        h.open()
        assert c.adopt(handle, first.storage)
        idle = take_checkpoint(coordinator, [c])
        assert _state([h], keys) == want
    finally:
        _close([h], [c])
    written = idle.metadata.operators["operator"].subtasks[0].stats.new_bytes
    assert written <= 0.05 * first.metadata.total_bytes, (written, first.metadata.total_bytes)
    assert first.metadata.shared_files() & idle.metadata.shared_files()
    assert _restored_state(idle.url, keys) == want


def test_rocksdb_timers_go_on_from_their_column_families_across_restores(
    tmp_path: Path,
) -> None:
    """Incremental RocksDB checkpoints carry timers in column families that follow
    the timer queues by their changes: through five restore-and-adopt cycles (timers
    registered, deleted and fired in each) every restore has exactly the timers and
    state of the checkpoint, at the same parallelism, at p = 2 and on the hash map."""
    keys = [f"k{i}" for i in range(40)]
    coordinator = CheckpointCoordinator(str(tmp_path), retained=2)
    latest: Any = None
    want: Any = None
    fired: list[Any] = []
    for cycle in range(5):
        h = KeyedOperatorHarness(Tracker(), lambda v: v[0], max_parallelism=MAXP,
                                 state_backend="rocksdb")
        c = SubtaskCheckpointer(h.operator, coordinator.storage, mode="incremental",
                                asynchronous=False)
        try:
            if latest is not None:
                h.operator.restore(latest.load("operator", 1, 0))
            h.open()
            if latest is not None:
                assert c.adopt(latest.metadata.operators["operator"].subtasks[0],
                               latest.storage)
                assert (_state([h], keys), h.event_time_timers()) == want, cycle
            _send([h], [(k, 30 * cycle + i % 30) for i, k in enumerate(keys)])
            fired += h.advance_watermark(1000 + 30 * cycle + 10)
            latest = take_checkpoint(coordinator, [c])
            want = (_state([h], keys), h.event_time_timers())
        finally:
            _close([h], [c])
    assert fired and want[1], "timers fired, and some are still pending"
    timers = {t for t, _ in want[1]}
    for p, backend in ((2, "rocksdb"), (1, "hashmap")):
        cluster = [KeyedOperatorHarness.restore(Tracker(), lambda v: v[0], latest,
                                                parallelism=p, subtask_index=i,
                                                max_parallelism=MAXP, state_backend=backend)
                   for i in range(p)]
        try:
            assert _state(cluster, keys) == want[0]
            assert {t for h in cluster for t, _ in h.event_time_timers()} == timers
        finally:
            _close(cluster, [])


def test_native_checkpoints_hard_link_sst_files_next_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The native RocksDB checkpoint of an incremental snapshot is made on the working
    directory's filesystem (a sibling directory), so its SST files are hard links,
    never copies; a restore downloads into the ``local_dir`` it is given."""
    work = tmp_path / "local" / "db"
    seen: list[tuple[Path, list[int]]] = []
    upload = SubtaskCheckpointer._upload_native

    def spy(self: Any, storage: Any, prefix: str, native_dir: str, cid: int) -> Any:
        ssts = [p for p in Path(native_dir).iterdir() if p.suffix == ".sst"]
        seen.append((Path(native_dir).parent.parent, [p.stat().st_nlink for p in ssts]))
        return upload(self, storage, prefix, native_dir, cid)

    monkeypatch.setattr(SubtaskCheckpointer, "_upload_native", spy)
    coordinator = CheckpointCoordinator(str(tmp_path / "chk"))
    h = KeyedOperatorHarness(Tracker(), lambda v: v[0], max_parallelism=MAXP,
                             state_backend="rocksdb", rocksdb_path=work)
    c = SubtaskCheckpointer(h.operator, coordinator.storage, mode="incremental",
                            asynchronous=False)
    h.open()
    try:
        _send([h], [(f"k{i}", i) for i in range(200)])
        completed = take_checkpoint(coordinator, [c])
    finally:
        _close([h], [c])
    ((parent, links),) = seen
    assert parent == work.parent and links and all(n >= 2 for n in links)
    assert sorted(p.name for p in work.parent.iterdir()) == ["db"]  # native dir removed
    restore_to = tmp_path / "restore-local"
    snaps = completed.load("operator", 1, 0, local_dir=str(restore_to))
    native = snaps[0].keyed.native if snaps[0].keyed is not None else None
    assert native is not None and Path(native.path).parent == restore_to


# ---------------------------------------------------------------- model, any parallelism


def test_a_changelog_restores_base_plus_deltas_at_any_parallelism(
    tmp_path: Path, backend: str
) -> None:
    keys = [f"k{i}" for i in range(40)]
    coordinator = CheckpointCoordinator(str(tmp_path), retained=3)
    cluster = _cluster(2, backend=backend)
    checkpointers = _checkpointers(cluster, coordinator.storage, SYNC)
    expected = {}
    try:
        for step in range(6):
            _send(cluster, [(k, step * 100 + i) for i, k in enumerate(keys) if i % (step + 2)])
            if step == 3:
                _send(cluster, [(k, -1) for k in keys[:5]])
                cluster[0].advance_watermark(1000 + 150)  # fire (and remove) some timers
                cluster[1].advance_watermark(1000 + 150)
            completed = take_checkpoint(coordinator, checkpointers)
            expected[completed.checkpoint_id] = _state(cluster, keys)
    finally:
        _close(cluster, checkpointers)
    latest = coordinator.latest()
    assert latest is not None and len(_keyed(latest).deltas) == 5
    for p, other in ((1, "hashmap"), (2, "rocksdb"), (3, "hashmap"), (5, "rocksdb")):
        got = _restored_state(latest.url, keys, p, other)
        assert got == expected[latest.checkpoint_id], (p, other)


class ChangelogMachine(ClusterMachine):
    """The cluster of test_state_model with changelog checkpoints: each subtask
    checkpoints through a durable changelog (materializing every 1-3 deltas), and a
    rescale restores the newest checkpoint at a new parallelism on the other backend;
    at the same parallelism the new subtasks adopt the changelog and go on with it."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="weir-changelog-model-"))
        self.coordinator = CheckpointCoordinator(str(self.root), retained=2)
        self.checkpointers: list[SubtaskCheckpointer] = []
        self.policy = SYNC

    def _checkpointers(self) -> list[SubtaskCheckpointer]:
        if not self.checkpointers:
            self.checkpointers = _checkpointers(self.cluster, self.coordinator.storage,
                                                self.policy)
        return self.checkpointers

    @rule(max_deltas=st.integers(1, 3))
    def checkpoint(self, max_deltas: int) -> None:
        self.policy = ChangelogPolicy(interval_ms=None, max_deltas=max_deltas,
                                      background=False)
        for c in self._checkpointers():
            c.policy = self.policy
        take_checkpoint(self.coordinator, self._checkpointers())

    def rescale_once(self, data: st.DataObject) -> None:
        new_p = data.draw(st.integers(1, min(8, self.max_parallelism)), label="new p")
        take_checkpoint(self.coordinator, self._checkpointers())
        latest = self.coordinator.latest()
        assert latest is not None
        old_p = len(self.cluster)
        self.close_all()
        self.backend = "rocksdb" if self.backend == "hashmap" else "hashmap"
        self.cluster = [
            KeyedOperatorHarness.restore(ApplyCommand(), key_of, latest, parallelism=new_p,
                                         subtask_index=i, state_backend=self.backend)
            for i in range(new_p)
        ]
        if new_p == old_p:  # go on with the restored changelog
            handles = latest.metadata.operators["operator"].subtasks
            for c, handle in zip(self._checkpointers(), handles, strict=True):
                assert c.adopt(handle, latest.storage)
        self.rescales += 1

    def close_all(self) -> None:
        checkpointers, self.checkpointers = self.checkpointers, []
        for c in checkpointers:
            c.close()
        super().close_all()

    def teardown(self) -> None:
        super().teardown()
        shutil.rmtree(self.root, ignore_errors=True)


def test_changelog_checkpoints_match_the_model_across_rescales(
    backend: str, rocksdb_tmp: Path
) -> None:
    """Once per starting backend; each rescale switches to the other one."""
    machine = type(f"ChangelogMachineFrom_{backend}", (ChangelogMachine,),
                   {"start_backend": backend})
    run_state_machine_as_test(machine, settings=SETTINGS)


def test_a_changelog_extends_only_checkpoints_known_complete(
    tmp_path: Path, backend: str
) -> None:
    """The continuous runtime's rule (``confirmed_only``): a barrier can overtake the
    coordinator's notification, and a checkpoint not known complete may still be
    aborted and its delta deleted. So checkpoint 3, taken before 2 is confirmed, writes
    a new base, and 4 (3 confirmed) is a delta on it. A delta whose upload failed is
    never extended either (its changes were taken): the next checkpoint writes a base,
    even before the abort reaches the subtask."""
    coordinator = CheckpointCoordinator(str(tmp_path), retained=10)
    keys = [f"key-{i}" for i in range(21)]
    [h] = cluster = _cluster(1, backend=backend)
    [c] = checkpointers = [SubtaskCheckpointer(
        h.operator, coordinator.storage, mode="changelog", asynchronous=False,
        changelog=SYNC, confirmed_only=True)]
    write = coordinator.storage.write

    def failing(relative: str, data: bytes) -> Any:
        if relative.endswith(".delta"):
            raise OSError("injected: the delta upload failed")
        return write(relative, data)

    def checkpoint(step: int, notify: bool = True) -> Any:
        _send(cluster, [(k, step) for k in keys[3 * step:3 * step + 3]])
        pending = coordinator.trigger()
        snap = c.snapshot(pending.checkpoint_id, pending.timestamp_ms)
        try:
            handle = snap.result()
        except OSError:
            coordinator.abort(pending)  # the subtask is not told (yet)
            return None
        pending.acknowledge(c.uid, 1, MAXP, handle)
        completed = coordinator.complete(pending)
        if notify:
            c.notify_checkpoint_complete(pending.checkpoint_id)
        return completed

    try:
        one = checkpoint(1)
        two = checkpoint(2, notify=False)
        three = checkpoint(3)
        four = checkpoint(4)
        coordinator.storage.write = failing  # type: ignore[method-assign]
        assert checkpoint(5) is None
        coordinator.storage.write = write  # type: ignore[method-assign]
        six = checkpoint(6)
        want = _state(cluster, keys)
    finally:
        _close(cluster, checkpointers)
    assert _keyed(two).base == _keyed(one).base and len(_keyed(two).deltas) == 1
    assert _keyed(three).base != _keyed(one).base and _keyed(three).deltas == ()
    assert _keyed(four).base == _keyed(three).base and len(_keyed(four).deltas) == 1
    assert _keyed(six).base != _keyed(three).base and _keyed(six).deltas == ()
    assert _restored_state(six.url, keys, 2, backend) == want
    assert want["key-15"][0] == 1  # written only before the checkpoint whose delta failed


# ---------------------------------------------------------------- materialization


def test_a_background_materialization_racing_processing_copies_one_consistent_state(
    tmp_path: Path, backend: str,
) -> None:
    keys = [f"k{i}" for i in range(3_000)]
    coordinator = CheckpointCoordinator(str(tmp_path), retained=50)
    cluster = _cluster(1, backend=backend)
    policy = ChangelogPolicy(interval_ms=None, max_deltas=1, background=True, rebase_share=None)
    checkpointers = _checkpointers(cluster, coordinator.storage, policy)
    expected: dict[int, Any] = {}
    switched = 0
    try:
        _send(cluster, [(k, 1) for k in keys])
        first = take_checkpoint(coordinator, checkpointers)
        expected[first.checkpoint_id] = _state(cluster, keys)
        base = _keyed(first).base
        for step in range(2, 40):
            # writes to every key (lists and maps change in place) while the copy of the
            # previous checkpoint's state is encoded in the background
            _send(cluster, [(k, step) for k in keys])
            completed = take_checkpoint(coordinator, checkpointers)
            expected[completed.checkpoint_id] = _state(cluster, keys)
            if _keyed(completed).base != base:
                base = _keyed(completed).base
                assert "/m" in base.file.path
                switched += 1
            if switched >= 2:
                break
        running = checkpointers[0].materialization()
        if running is not None:
            running.result(60)
    finally:
        _close(cluster, checkpointers)
    assert switched >= 2, "no checkpoint used a materialization"
    for completed in CheckpointCoordinator(str(tmp_path)).completed_checkpoints:
        assert _restored_state(completed.url, keys) == expected[completed.checkpoint_id]


def test_a_materialization_starts_once_the_deltas_written_hold_size_ratio_times_the_base(
    tmp_path: Path, backend: str,
) -> None:
    """By bytes, a materialization is due once the deltas already written hold
    ``size_ratio`` times the base (this checkpoint's delta is not counted: its size is
    known only once it is encoded, off the task's thread)."""
    keys = [f"k{i}" for i in range(2_000)]
    coordinator = CheckpointCoordinator(str(tmp_path), retained=50)
    cluster = _cluster(1, backend=backend)
    policy = ChangelogPolicy(interval_ms=None, max_deltas=1_000, size_ratio=2.0,
                             background=False, rebase_share=None)
    checkpointers = _checkpointers(cluster, coordinator.storage, policy)
    seen: list[tuple[int, bool]] = []  # (bytes of the deltas written before, started)
    try:
        _send(cluster, [(k, 1) for k in keys])
        previous = take_checkpoint(coordinator, checkpointers)
        base = _keyed(previous).base
        for step in range(2, 40):
            _send(cluster, [(k, step) for k in keys[step % 4::4]])  # a quarter of the keys
            written = sum(d.file.size for d in _keyed(previous).deltas)
            previous = take_checkpoint(coordinator, checkpointers)
            started = checkpointers[0].materialization() is not None
            seen.append((written, started))
            if started:
                break
        want = _state(cluster, keys)
    finally:
        _close(cluster, checkpointers)
    assert seen[-1][1], f"no materialization started: {seen}"
    assert all(w < 2.0 * base.file.size for w, _ in seen[:-1]), (seen, base.file.size)
    assert seen[-1][0] >= 2.0 * base.file.size, (seen, base.file.size)
    assert len(seen) >= 3  # a few deltas first: a quarter of the keys each
    assert _restored_state(previous.url, keys) == want


def test_a_materialization_older_than_max_lag_is_not_used(tmp_path: Path) -> None:
    coordinator = CheckpointCoordinator(str(tmp_path), retained=1)
    cluster = _cluster(1)
    policy = ChangelogPolicy(interval_ms=None, max_deltas=1, max_lag=2, background=True,
                             rebase_share=None)
    [checkpointer] = _checkpointers(cluster, coordinator.storage, policy)
    gate = threading.Event()
    original = checkpointer.storage.write

    def slow_write(path: str, data: bytes) -> Any:
        if "/m" in path:
            gate.wait(30)  # the materialization upload hangs
        return original(path, data)

    checkpointer.storage.write = slow_write  # type: ignore[method-assign]
    try:
        for step in range(6):
            _send(cluster, [("a", step), ("b", step)])
            completed = take_checkpoint(coordinator, [checkpointer])
            if step == 4:
                gate.set()
                future = checkpointer.materialization()
                assert future is not None
                future.result(30)
        assert "/m" not in _keyed(completed).base.file.path  # too late: not used
        want = _state(cluster, ["a", "b"])
    finally:
        gate.set()
        _close(cluster, [checkpointer])
    assert _restored_state(completed.url, ["a", "b"]) == want


def test_one_operator_has_one_changelog_checkpointer(tmp_path: Path, backend: str) -> None:
    storage = CheckpointStorage(str(tmp_path))
    [h] = _cluster(1, backend=backend)
    try:
        first = SubtaskCheckpointer(h.operator, storage, mode="changelog")
        with pytest.raises(ConfigurationError, match="already has a changelog checkpointer"):
            SubtaskCheckpointer(h.operator, storage, mode="changelog")
        first.close()
        SubtaskCheckpointer(h.operator, storage, mode="changelog").close()  # free again
    finally:
        h.close()


def test_delta_files_apply_ttl_filters_and_record_timer_changes(
    tmp_path: Path, backend: str
) -> None:
    descriptor = ValueStateDescriptor(
        "v", ttl=StateTtlConfig(ttl_ms=1_000).cleanup_in_full_snapshot())

    class Ttl(KeyedProcessFunction[Any, Any]):
        def open(self, ctx: Any) -> None:
            self.v = ctx.get_state(descriptor)

        def process_element(self, value: Any, ctx: Any) -> Any:
            self.v.update(value[1])
            ctx.timer_service.register_event_time_timer(50)

    coordinator = CheckpointCoordinator(str(tmp_path))
    h = KeyedOperatorHarness(Ttl(), lambda v: v[0], max_parallelism=MAXP,
                             state_backend=backend)
    h.open()
    [c] = _checkpointers([h], coordinator.storage, SYNC)
    try:
        take_checkpoint(coordinator, [c])  # the (empty) base
        h.process_element(("old", 1))
        h.clock.set(900)
        h.process_element(("new", 2))
        h.clock.set(1_500)  # "old" expired, "new" not
        h.advance_watermark(100)  # both timers fire
        completed = take_checkpoint(coordinator, [c])
    finally:
        c.close()
        h.close()
    [delta] = _keyed(completed).deltas
    data = coordinator.storage.read(delta.file, "test")
    changes = decode_delta(data, delta.key_groups, None, "test")
    states: dict[str, tuple[int, int]] = {}
    for per in changes.values():
        for name, (replaced, entries) in per.items():
            a, b = states.get(name, (0, 0))
            states[name] = (a + len(replaced), b + len(entries))
    # both keys changed, only "new" is written; the timers were registered and fired
    assert states["v"] == (2, 1)
    assert states["__weir_timers/event"] == (2, 0)


# ---------------------------------------------------------------- crash points


def _three_checkpoints(
    root: Path, crash_at: int | None, when: str, backend: str
) -> tuple[Any, dict[int, Any], bool]:
    """Checkpoints 1 (base), 2 (a delta; materializes) and 3 (on the materialization,
    releasing the old base and delta), each subtask writing synchronously; a crash at
    step ``crash_at`` of checkpoint 3. Returns (fs, the state at 2 and 3, crashed)."""
    fs = FaultInjectingFileSystem(fsspec.filesystem("file"))
    storage = CheckpointStorage(str(root), fs=fs)
    coordinator = CheckpointCoordinator(storage, retained=1)
    policy = ChangelogPolicy(interval_ms=None, max_deltas=1, background=False, rebase_share=None)
    cluster = _cluster(2, backend=backend)
    checkpointers = _checkpointers(cluster, storage, policy)
    keys = [f"k{i}" for i in range(12)]
    try:
        _send(cluster, [(k, i) for i, k in enumerate(keys)])
        take_checkpoint(coordinator, checkpointers)
        _send(cluster, [(k, 20 + i) for i, k in enumerate(keys[:6])])
        take_checkpoint(coordinator, checkpointers)
        state = {2: _state(cluster, keys)}
        _send(cluster, [(k, 40 + i) for i, k in enumerate(keys[3:9])] + [(keys[11], -1)])
        state[3] = _state(cluster, keys)
        fs.arm(crash_at, when)
        crashed = False
        try:
            take_checkpoint(coordinator, checkpointers)
        except InjectedCrash:
            crashed = True
    finally:
        _close(cluster, checkpointers)
    return fs, state, crashed


def test_a_crash_at_any_step_of_a_checkpoint_switching_to_a_materialization(
    tmp_path: Path, backend: str,
) -> None:
    keys = [f"k{i}" for i in range(12)]
    fs, want, crashed = _three_checkpoints(tmp_path / "dry", None, "before", backend)
    assert not crashed
    steps = [(op, p.removeprefix(str(tmp_path / "dry") + "/")) for op, p in fs.steps]
    dry = load_checkpoint(str(tmp_path / "dry" / "chk-3"))
    for i in range(2):
        assert "/m2-" in _keyed(dry, i).base.file.path and len(_keyed(dry, i).deltas) == 1
    released = [p for op, p in steps if op == "delete" and "shared/" in p]
    assert any("/1-" in p and p.endswith(".keyed") for p in released)  # the old base
    runs = injected = restored_new = 0
    for crash_at in range(len(steps)):
        for when in WHEN:
            if when == "during" and steps[crash_at][0] != "write":
                continue
            root = tmp_path / f"{crash_at}-{when}"
            _, _, crashed = _three_checkpoints(root, crash_at, when, backend)
            runs += 1
            injected += crashed
            latest = CheckpointCoordinator(str(root)).latest()  # restart: clean-up too
            assert latest is not None and latest.checkpoint_id in (2, 3)
            got = _restored_state(latest.url, keys, 3, backend)
            restored_new += latest.checkpoint_id == 3
            assert got == want[latest.checkpoint_id], (crash_at, when)
    print(f"{backend} changelog switch crash points: steps={len(steps)} runs={runs} "
          f"injected={injected} restored chk-3={restored_new}")
    assert injected == runs and 0 < restored_new < runs


def test_a_copy_left_behind_holds_a_later_checkpoint_only_if_nothing_changed_since(
    tmp_path: Path,
) -> None:
    """As in the Spark runtime when a subtask's task runs in another Python worker and
    comes back: copy A wrote checkpoint 1; copy B restored it and ran on. A holds B's
    checkpoints for as long as they changed nothing (idle, timers not due), and not
    after a record, a timer firing or a restore from another chain."""
    coordinator = CheckpointCoordinator(str(tmp_path), retained=10)
    keys = [f"key-{i}" for i in range(200)]

    def subtask() -> tuple[KeyedOperatorHarness, SubtaskCheckpointer]:
        h = KeyedOperatorHarness(Tracker(), lambda v: v[0], max_parallelism=MAXP)
        return h, SubtaskCheckpointer(h.operator, coordinator.storage, mode="changelog",
                                      asynchronous=False, changelog=SYNC)

    def handle(completed: Any) -> Any:
        return completed.metadata.operators["operator"].subtasks[0]

    a, ca = subtask()
    a.open()
    _send([a], [(k, i) for i, k in enumerate(keys)])
    take_checkpoint(coordinator, [ca])  # the base
    _send([a], [(keys[0], 5000)])
    first = take_checkpoint(coordinator, [ca])  # a delta
    assert ca.holds(handle(first))
    b, cb = subtask()
    b.operator.restore(first.load("operator", 1, 0))
    b.open()
    assert cb.adopt(handle(first), first.storage)
    idle = [take_checkpoint(coordinator, [cb]) for _ in range(3)]
    assert all(ca.holds(handle(c)) for c in idle)  # B changed nothing: A is as good
    assert b.advance_watermark(1000 + 3)  # fires key-3's timer: a change (a timer deleted)
    fired = take_checkpoint(coordinator, [cb])
    assert not ca.holds(handle(fired)) and cb.holds(handle(fired))
    _send([b], [(keys[1], 6000)])
    changed = take_checkpoint(coordinator, [cb])
    assert not ca.holds(handle(changed)) and not ca.holds(handle(fired))
    fresh, cf = subtask()  # same state, written as its own base: another chain
    fresh.operator.restore(changed.load("operator", 1, 0))
    fresh.open()
    own = take_checkpoint(coordinator, [cf])
    assert not cb.holds(handle(own)) and cf.holds(handle(own))
    _close([a, b, fresh], [ca, cb, cf])


def test_a_copy_left_behind_catches_up_by_the_deltas_written_since(tmp_path: Path) -> None:
    """Copy A wrote checkpoint 1; copy B restored it and ran on (records, a deleted
    key, a fired timer): A catches up to B's checkpoint by reading only B's deltas,
    holds exactly B's state and timers, and its next checkpoint extends B's chain. A
    chain that no longer extends A's (a new base) or a corrupt delta: no catch-up."""
    coordinator = CheckpointCoordinator(str(tmp_path), retained=10)
    keys = [f"key-{i}" for i in range(300)]
    cluster_a, cluster_b = _cluster(1), []

    def checkpointer(h: KeyedOperatorHarness, policy: ChangelogPolicy = SYNC) -> Any:
        return SubtaskCheckpointer(h.operator, coordinator.storage, mode="changelog",
                                   asynchronous=False, changelog=policy)

    def handle(completed: Any) -> Any:
        return completed.metadata.operators["operator"].subtasks[0]

    ca = checkpointer(cluster_a[0])
    _send(cluster_a, [(k, i) for i, k in enumerate(keys)])
    take_checkpoint(coordinator, [ca])  # the base
    _send(cluster_a, [(keys[0], 5000)])
    first = take_checkpoint(coordinator, [ca])
    b = KeyedOperatorHarness(Tracker(), lambda v: v[0], max_parallelism=MAXP)
    b.operator.restore(first.load("operator", 1, 0))
    b.open()
    cluster_b = [b]
    cb = checkpointer(b)
    assert cb.adopt(handle(first), first.storage)
    _send(cluster_b, [(k, 7000 + i) for i, k in enumerate(keys[:40])])
    _send(cluster_b, [(keys[50], -1)])  # a key cleared (its timers stay)
    assert b.advance_watermark(1000 + 20)  # timers fired: deleted
    take_checkpoint(coordinator, [cb])
    _send(cluster_b, [(keys[60], 9000)])
    third = take_checkpoint(coordinator, [cb])
    assert len(_keyed(third).deltas) == 3
    assert _state(cluster_a, keys) != _state(cluster_b, keys)
    reads = coordinator.storage.read
    read_paths: list[str] = []

    def counting(ref: Any, where: str = "") -> bytes:
        read_paths.append(ref.path)
        return reads(ref, where)

    coordinator.storage.read = counting  # type: ignore[method-assign]
    assert ca.can_catch_up(handle(third)) and ca.catch_up(handle(third))
    coordinator.storage.read = reads  # type: ignore[method-assign]
    assert read_paths == [d.file.path for d in _keyed(third).deltas[1:]]  # B's deltas only
    assert _state(cluster_a, keys) == _state(cluster_b, keys)
    assert ca.holds(handle(third))
    _send(cluster_a, [(keys[70], 9100)])  # A goes on: its delta extends B's chain
    fourth = take_checkpoint(coordinator, [ca])
    assert _keyed(fourth).deltas[:3] == _keyed(third).deltas
    want = _state(cluster_a, keys)
    assert _restored_state(fourth.url, keys) == want
    # B rebases (writes most keys): its chain no longer extends A's
    cb.policy = dataclasses.replace(SYNC, rebase_share=0.5)
    _send(cluster_b, [(k, 1) for k in keys])
    rebased = take_checkpoint(coordinator, [cb])
    assert not ca.can_catch_up(handle(rebased)) and not ca.catch_up(handle(rebased))
    _close(cluster_a + cluster_b, [ca, cb])


def test_a_copy_catching_up_detects_a_corrupt_delta(tmp_path: Path) -> None:
    coordinator = CheckpointCoordinator(str(tmp_path), retained=10)
    keys = [f"key-{i}" for i in range(50)]
    a, b = _cluster(1), _cluster(1)
    ca, cb = (SubtaskCheckpointer(h[0].operator, coordinator.storage, mode="changelog",
                                  asynchronous=False, changelog=SYNC) for h in (a, b))
    _send(a, [(k, 1) for k in keys])
    first = take_checkpoint(coordinator, [ca])
    b[0].close()
    b = _cluster(1, load_checkpoint(first.url))
    cb = SubtaskCheckpointer(b[0].operator, coordinator.storage, mode="changelog",
                             asynchronous=False, changelog=SYNC)
    assert cb.adopt(first.metadata.operators["operator"].subtasks[0], first.storage)
    _send(b, [(keys[0], 2)])
    second = take_checkpoint(coordinator, [cb])
    delta = _keyed(second).deltas[-1].file
    path = Path(coordinator.storage.root) / delta.path
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError):
        ca.catch_up(second.metadata.operators["operator"].subtasks[0])
    _close(a + b, [ca, cb])
