"""The worker-local cache of live subtasks of the Spark runtime: bounded by count and
by the worker's memory, least recently used first; eviction closes the subtask (the
function's ``close()``, the checkpointer's threads, RocksDB and its directory)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from weir import CheckpointStorage, KeyedProcessFunction, ValueStateDescriptor
from weir.api.durations import byte_size
from weir.errors import ConfigurationError
from weir.runtime.checkpointer import SubtaskCheckpointer
from weir.runtime.spark import cache
from weir.runtime.spark.cache import CacheLimits, LiveSubtask
from weir.testing import KeyedOperatorHarness

COUNT = ValueStateDescriptor("count")
CLOSED: list[int] = []


class Counting(KeyedProcessFunction[Any, Any]):
    def __init__(self, tag: int) -> None:
        self.tag = tag

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: Any, ctx: Any) -> None:
        self.count.update((self.count.value() or 0) + 1)

    def close(self) -> None:
        CLOSED.append(self.tag)


@pytest.fixture(autouse=True)
def empty_cache() -> Iterator[None]:
    CLOSED.clear()
    yield
    while cache.cached():
        live = cache.take(cache.cached()[0])
        assert live is not None
        live.close()


def _live(tmp_path: Path, tag: int, backend: str = "rocksdb") -> LiveSubtask:
    directory = cache.local_dir(str(tmp_path), "op", tag) if backend == "rocksdb" else None
    h = KeyedOperatorHarness(Counting(tag), lambda v: v, state_backend=backend,
                             rocksdb_path=directory)
    h.open()
    h.process_elements(range(100))
    checkpointer = SubtaskCheckpointer(h.operator, CheckpointStorage(str(tmp_path / "chk")),
                                       mode="incremental", asynchronous=True)
    return LiveSubtask((str(tmp_path), "op", tag), 1, h.operator, checkpointer,
                       cache.BatchClock(), cache.CurrentKey(), directory)


def test_the_least_recently_used_subtasks_beyond_the_count_are_closed(tmp_path: Path) -> None:
    limits = CacheLimits(max_subtasks=2, max_bytes=1 << 62)
    lives = [_live(tmp_path, i) for i in range(4)]
    assert all(live.rocksdb_dir and os.path.isdir(live.rocksdb_dir) for live in lives)
    assert cache.keep(lives[0], limits) == 0
    assert cache.keep(lives[1], limits) == 0
    again = cache.take(lives[0].spec_key)  # a task used subtask 0 again: now the newest
    assert again is lives[0]
    assert cache.keep(again, limits) == 0
    assert cache.keep(lives[2], limits) == 1  # evicts 1, the least recently used
    assert CLOSED == [1] and not os.path.exists(str(lives[1].rocksdb_dir))
    assert cache.keep(lives[3], limits) == 1
    assert CLOSED == [1, 0] and not os.path.exists(str(lives[0].rocksdb_dir))
    assert cache.cached() == [lives[2].spec_key, lives[3].spec_key]
    assert cache.take(lives[1].spec_key) is None  # evicted: the next task restores


def test_a_worker_over_its_memory_bound_keeps_only_the_subtask_just_used(
    tmp_path: Path,
) -> None:
    generous = CacheLimits(max_subtasks=10, max_bytes=1 << 62)
    for i in range(3):
        cache.keep(_live(tmp_path, i, "hashmap"), generous)
    assert CLOSED == []
    newest = _live(tmp_path, 3, "hashmap")
    assert cache.worker_rss_bytes() > 1 << 20
    assert cache.keep(newest, CacheLimits(max_subtasks=10, max_bytes=1 << 20)) == 3
    assert CLOSED == [0, 1, 2] and cache.cached() == [newest.spec_key]


def test_the_default_memory_bound_follows_spark_executor_pyspark_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_EXECUTOR_MEMORY_MB", raising=False)
    assert CacheLimits().memory_bound() == 4 << 30
    monkeypatch.setenv("PYSPARK_EXECUTOR_MEMORY_MB", "2048")  # set by PySpark in workers
    assert CacheLimits().memory_bound() == (2048 << 20) * 4 // 5
    assert CacheLimits(max_bytes=123).memory_bound() == 123
    assert byte_size("512m", "x") == 512 << 20 and byte_size("1.5g", "x") == 3 << 29
    with pytest.raises(ConfigurationError, match="worker_cache_memory"):
        byte_size("lots", "worker_cache_memory")


def test_rocksdb_instances_share_one_bounded_block_cache_and_write_buffer_budget(
    tmp_path: Path,
) -> None:
    """Every RocksDB instance of a process charges its blocks and memtables to one
    cache of ``RocksDBMemory.total_bytes`` (memtables at most ``write_buffer_ratio``
    of it): writing and reading more than that through two instances stays within."""
    from weir.state.rocksdb import shared_memory_usage
    from weir.state.rocksdb_options import RocksDBMemory

    memory = RocksDBMemory(total_bytes=8 << 20, write_buffer_ratio=0.25)
    with KeyedOperatorHarness(Counting(9), lambda v: v, state_backend="rocksdb") as h:
        assert h.operator.backend.memory == RocksDBMemory()  # the default: 256 MiB
    harnesses = [KeyedOperatorHarness(Counting(i), lambda v: v, state_backend="rocksdb",
                                      rocksdb_path=tmp_path / f"db{i}", rocksdb_memory=memory)
                 for i in range(2)]
    try:
        peak = (0, 0)
        for h in harnesses:
            h.open()
        for round_ in range(2):
            for h in harnesses:
                h.process_elements(f"{round_}-{i:07d}" * 4 for i in range(25_000))
                cached, memtables = shared_memory_usage(memory)
                peak = (max(peak[0], cached), max(peak[1], memtables))
        assert 0 < peak[1] <= memory.write_buffer_bytes * 1.1, peak
        assert peak[0] <= memory.total_bytes * 1.1, peak
    finally:
        for h in harnesses:
            h.close()
    with pytest.raises(ConfigurationError, match="at least 8 MiB"):
        RocksDBMemory(total_bytes=1024)


def test_restored_and_reopened_rocksdb_column_families_keep_the_shared_budget(
    tmp_path: Path,
) -> None:
    """A database opened where one exists (a restored native checkpoint, a working
    directory left behind) opens every column family with the process's shared block
    cache, not RocksDB's default private 8 MiB cache per column family: memory stays
    within ``RocksDBMemory.total_bytes`` after restores."""
    from weir.api.serializers import MsgpackSerializer
    from weir.state.keycontext import KeyContext
    from weir.state.keygroups import KeyGroupRange
    from weir.state.rocksdb import RocksDBKeyedStateBackend
    from weir.state.rocksdb_options import RocksDBMemory
    from weir.state.snapshot import NativeRocksDBState

    memory = RocksDBMemory(total_bytes=24 << 20)

    def backend(path: Path) -> RocksDBKeyedStateBackend:
        return RocksDBKeyedStateBackend(KeyContext(16, KeyGroupRange(0, 15)), path, memory)

    def capacities(db: RocksDBKeyedStateBackend) -> set[int]:
        families = [db._db, *(db._family(name) for name in ("v", "l"))]
        return {cf.property_int_value("rocksdb.block-cache-capacity") for cf in families}

    source = backend(tmp_path / "source")
    for name in ("v", "l"):
        table = source.create_value_table(name, MsgpackSerializer())
        source.key_context.set_current_key("k")
        table.update(1)  # type: ignore[attr-defined]
    source.native_checkpoint(tmp_path / "chk")
    assert capacities(source) == {memory.total_bytes}
    source.close()
    reopened = backend(tmp_path / "source")  # the directory left behind
    try:
        assert capacities(reopened) == {memory.total_bytes}
    finally:
        reopened.close()
    restored = backend(tmp_path / "restored")
    try:
        restored.restore_native([NativeRocksDBState(str(tmp_path / "chk"), KeyGroupRange(0, 15))])
        assert capacities(restored) == {memory.total_bytes}
    finally:
        restored.close()


def test_a_copy_that_can_never_be_used_again_is_evicted_by_a_task_of_the_same_stage(
    tmp_path: Path,
) -> None:
    """A task of subtask 0 at batch N (prior: batch N-1) judges this worker's copies of
    the stage's other subtasks: a copy of an earlier query, or one behind N-1 that
    cannot catch up (N-1's part names a chain that does not extend its own) is closed;
    a copy as of N-1, one ahead of it, one behind that can catch up, and other stages'
    copies stay."""
    from types import SimpleNamespace

    from weir.runtime.spark.reuse import useless

    spec = SimpleNamespace(location=str(tmp_path), uid="op", instance="i", parallelism=4)
    chains = {1: "extends", 2: "rebased"}  # the chain each subtask's part of N-1 names
    prior = SimpleNamespace(batch=9, parallelism=4, own_handle=lambda j: chains.get(j),
                            attempt=lambda j: f"a{j}")

    def copy(subtask: int, batch: int, query: str = "q", uid: str = "op") -> LiveSubtask:
        live = _live(tmp_path, 10 * subtask + batch)
        live.spec_key = (str(tmp_path), uid, subtask)
        live.parallelism, live.instance, live.query, live.token = 4, "i", query, 7
        live.batch, live.attempt = batch, f"x{subtask}"
        live.checkpointer.can_catch_up = (  # type: ignore[method-assign]
            lambda handle: handle == "extends")
        cache.keep(live, CacheLimits(max_bytes=1 << 62))
        return live

    extends, changed, current = copy(1, 7), copy(2, 7), copy(3, 9)
    old_query = copy(5, 9, query="earlier")
    ahead = copy(6, 10)
    other_stage = copy(2, 3, uid="other")
    closed = [live for live in cache.others(str(tmp_path), "op", 0)
              if useless(live, prior, "q", 7, spec)]  # type: ignore[arg-type]
    assert closed == [changed, old_query]
    for live in closed:
        assert cache.evict(live.spec_key, "test")
    assert not cache.evict(changed.spec_key, "test")  # gone already
    assert sorted(CLOSED) == [27, 59]
    assert set(cache.cached()) == {extends.spec_key, current.spec_key, ahead.spec_key,
                                   other_stage.spec_key}
