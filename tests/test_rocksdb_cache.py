"""The RocksDB backend's entry cache (``weir.state.rocksdb_tables``): value and list
states read and write through a bounded cache with writes held back until a flush.

A model test drives one backend with a tiny cache (evictions every few calls) against
a dict, interleaving every way RocksDB is read other than by one key — key listing,
frozen and full snapshots, native checkpoints restored into a new backend, compaction
filters, restores written around the tables — and checks each against the model.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from weir.api.serializers import MsgpackSerializer
from weir.errors import ConfigurationError, StateBackendError
from weir.state import rocksdb as rocksdb_module
from weir.state._hashcore import sorted_writes
from weir.state.keycontext import KeyContext
from weir.state.keygroups import KeyGroupRange
from weir.state.rocksdb import RocksDBKeyedStateBackend, RocksDBMemory, scan_native
from weir.state.rocksdb_writes import INGEST_MIN_PUTS
from weir.state.snapshot import NativeRocksDBState

KEYS = ("a", "b", "c", 7, ("t", 1))
SER = MsgpackSerializer()
MAX_P = 16


def new_backend(cache_entries: int) -> RocksDBKeyedStateBackend:
    ctx = KeyContext(MAX_P, KeyGroupRange(0, MAX_P - 1))
    return RocksDBKeyedStateBackend(ctx, memory=RocksDBMemory(cache_entries=cache_entries))


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.values: dict[Any, int] = {}
        self.lists: dict[Any, list[int]] = {}
        self.limit = 1
        self.backend: RocksDBKeyedStateBackend | None = None
        self.frozen: list[tuple[dict[bytes, bytes], Any]] = []
        self.natives: list[Path] = []
        #: while changes are tracked: key -> what the value (list) state's change record
        #: must say since they were last taken (a value, "list", or None: deleted)
        self.changes: dict[str, dict[Any, Any]] | None = None

    @initialize(limit=st.sampled_from([1, 2, 3, 8, 0]))  # 8: no evictions
    def start(self, limit: int) -> None:
        self.limit = limit
        self.open(new_backend(limit))

    def open(self, backend: RocksDBKeyedStateBackend) -> None:
        self.backend = backend
        self.value = backend.create_value_table("v", SER)
        self.list = backend.create_list_table("l", SER)

    def at(self, key: Any) -> None:
        assert self.backend is not None
        self.backend.key_context.set_current_key(key)

    def key_bytes(self, key: Any) -> bytes:
        self.at(key)
        return self.backend.key_context.key_bytes  # type: ignore[union-attr,no-any-return]

    # writes and reads by key ----------------------------------------------------------
    @rule(key=st.sampled_from(KEYS), value=st.integers(0, 3))
    def update(self, key: Any, value: int) -> None:
        self.at(key)
        self.value.update(value)  # type: ignore[attr-defined]
        self.values[key] = value
        self.changed("v", key, value)

    @rule(key=st.sampled_from(KEYS))
    def clear(self, key: Any) -> None:
        self.at(key)
        self.value.clear()  # type: ignore[attr-defined]
        self.values.pop(key, None)
        self.changed("v", key, None)

    @rule(key=st.sampled_from(KEYS), value=st.integers(0, 3))
    def add(self, key: Any, value: int) -> None:
        self.at(key)
        self.list.add(value)  # type: ignore[attr-defined]
        self.lists.setdefault(key, []).append(value)
        self.changed("l", key, "list")

    @rule(key=st.sampled_from(KEYS), values=st.lists(st.integers(0, 3), max_size=2))
    def replace_list(self, key: Any, values: list[int]) -> None:
        self.at(key)
        self.list.update(values)  # type: ignore[attr-defined]
        if values:
            self.lists[key] = list(values)
        else:
            self.lists.pop(key, None)
        self.changed("l", key, "list" if values else None)

    @rule(key=st.sampled_from(KEYS))
    def read(self, key: Any) -> None:
        self.at(key)
        assert self.value.value() == self.values.get(key)  # type: ignore[attr-defined]
        assert self.list.get() == self.lists.get(key, [])  # type: ignore[attr-defined]

    @rule(key=st.sampled_from(KEYS), value=st.integers(0, 3))
    def write_by_key_bytes(self, key: Any, value: int) -> None:  # (the TTL layer's way)
        self.value.update_at(self.key_bytes(key), value)
        self.values[key] = value
        self.changed("v", key, value)

    # every other way RocksDB is read --------------------------------------------------
    @rule()
    def freeze(self) -> None:
        assert self.backend is not None
        sources = dict(self.backend.frozen_sources())
        self.frozen.append(({self.key_bytes(k): SER.encode(v) for k, v in self.values.items()},
                            sources["v"]))
        self.frozen.append(({self.key_bytes(k): self.list_bytes(k) for k in self.lists},
                            sources["l"]))

    def list_bytes(self, key: Any) -> bytes:
        """The stored bytes of ``key``'s list, as the table reads them now."""
        self.at(key)
        return self.list._get(self.key_bytes(key))  # type: ignore[attr-defined,no-any-return]

    @rule()
    def frozen_snapshots_hold_the_state_as_of_then(self) -> None:
        for expected, source in self.frozen:
            assert dict(source) == expected
        self.frozen.clear()

    @rule()
    def full_snapshot(self) -> None:
        assert self.backend is not None
        sources = {name: dict(entries) for name, entries in self.backend.snapshot_sources()}
        assert sources["v"] == {self.key_bytes(k): SER.encode(v) for k, v in self.values.items()}
        assert set(sources["l"]) == {self.key_bytes(k) for k in self.lists}

    @rule(drop=st.integers(0, 3))
    def compaction_filter(self, drop: int) -> None:
        assert self.backend is not None
        dead = SER.encode(drop)
        self.backend.compact_step("v", None, 100, lambda k, d: None if d == dead else d)
        for key in [k for k, v in self.values.items() if v == drop]:
            self.changed("v", key, None)
        self.values = {k: v for k, v in self.values.items() if v != drop}

    @rule(tables_first=st.booleans())
    def native_checkpoint_restored_into_a_new_backend(self, tables_first: bool) -> None:
        assert self.backend is not None
        self.frozen_snapshots_hold_the_state_as_of_then()  # (read before the close)
        target = Path(self.backend.path).with_name(Path(self.backend.path).name + "-chk")
        self.natives.append(target)
        self.backend.native_checkpoint(target)
        seen = dict(scan_native(NativeRocksDBState(str(target), KeyGroupRange(0, MAX_P - 1))))
        assert dict(seen["v"]) == {self.key_bytes(k): SER.encode(v)
                                   for k, v in self.values.items()}
        self.backend.close()
        restored = new_backend(self.limit)
        if tables_first:  # the states made before the restore (it adopts the checkpoint)
            self.open(restored)
        restored.restore_native([NativeRocksDBState(str(target), KeyGroupRange(0, MAX_P - 1))])
        if not tables_first:
            self.open(restored)
        self.changes = None  # (a new backend: nothing tracked)

    @rule(key=st.sampled_from(KEYS), value=st.integers(0, 3))
    def restore_written_around_the_table(self, key: Any, value: int) -> None:
        assert self.backend is not None
        self.backend.restore_entries("v", [(self.key_bytes(key), SER.encode(value))])
        self.values[key] = value

    @rule()
    def keys_are_those_of_the_model(self) -> None:
        assert sorted(self.value.keys_snapshot()) == sorted(  # type: ignore[attr-defined]
            self.key_bytes(k) for k in self.values)
        assert sorted(self.list.keys_snapshot()) == sorted(  # type: ignore[attr-defined]
            self.key_bytes(k) for k in self.lists)

    # the change record (changelog checkpoints) -----------------------------------------
    def changed(self, state: str, key: Any, what: Any) -> None:
        if self.changes is not None:
            self.changes[state][key] = what

    @rule()
    def track_changes(self) -> None:
        assert self.backend is not None
        self.backend.track_changes()
        self.changes = {"v": {}, "l": {}}

    @rule()
    def take_changes(self) -> None:
        assert self.backend is not None
        if self.changes is None:
            return
        taken = dict(self.backend.take_changes())
        want_v = {self.key_bytes(k): None if v is None else SER.encode(v)
                  for k, v in self.changes["v"].items()}
        assert taken.get("v", {}) == want_v
        got_l = {k: None if d is None else "list" for k, d in taken.get("l", {}).items()}
        assert got_l == {self.key_bytes(k): w for k, w in self.changes["l"].items()}
        self.changes = {"v": {}, "l": {}}

    @rule()
    def read_every_key(self) -> None:
        for key in KEYS:
            self.read(key)

    # invariants (no reads: they would evict, and evictions flush) ---------------------
    @invariant()
    def the_cache_stays_within_its_bound(self) -> None:
        if self.backend is not None:
            for table in (self.value, self.list):
                assert table.cached() <= self.limit  # type: ignore[attr-defined]

    def teardown(self) -> None:
        self.frozen.clear()
        if self.backend is not None:
            self.backend.close()
        for path in self.natives:
            shutil.rmtree(path, ignore_errors=True)


def test_cached_state_matches_the_model_through_every_way_rocksdb_is_read(
        rocksdb_tmp: Path) -> None:
    CacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                              deadline=None)
    from hypothesis.stateful import run_state_machine_as_test
    run_state_machine_as_test(CacheMachine, settings=CacheMachine.TestCase.settings)


def test_writes_reach_rocksdb_at_a_flush_once_per_key(rocksdb_tmp: Path) -> None:
    backend = new_backend(100)
    table = backend.create_value_table("count", SER)
    raw = backend._family("count")  # RocksDB itself, around the cache
    try:
        for _ in range(5):
            for key in ("a", "b"):
                backend.key_context.set_current_key(key)
                table.update((table.value() or 0) + 1)  # type: ignore[attr-defined]
        assert list(raw.keys()) == []  # held back
        backend.flush()
        assert {SER.decode(v) for v in raw.values()} == {5}
        assert table.cached() == 2  # type: ignore[attr-defined]
    finally:
        backend.close()


def test_an_eviction_writes_the_dirty_entries_first(rocksdb_tmp: Path) -> None:
    backend = new_backend(4)
    table = backend.create_value_table("v", SER)
    raw = backend._family("v")
    try:
        for i in range(5):  # the fifth entry evicts the older half, after a flush
            backend.key_context.set_current_key(i)
            table.update(i)  # type: ignore[attr-defined]
        assert sorted(SER.decode(v) for v in raw.values()) == [0, 1, 2, 3]
        assert table.cached() == 3  # type: ignore[attr-defined]
        for i in range(5):
            backend.key_context.set_current_key(i)
            assert table.value() == i  # type: ignore[attr-defined]
    finally:
        backend.close()


def test_the_cache_can_be_turned_off_and_refuses_a_negative_size(rocksdb_tmp: Path) -> None:
    backend = new_backend(0)
    table = backend.create_value_table("v", SER)
    try:
        backend.key_context.set_current_key("a")
        table.update(1)  # type: ignore[attr-defined]
        assert [SER.decode(v) for v in backend._family("v").values()] == [1]
        assert table.cached() == 0  # type: ignore[attr-defined]
    finally:
        backend.close()
    with pytest.raises(ConfigurationError, match="cache_entries"):
        RocksDBMemory(cache_entries=-1)


def test_a_frozen_snapshot_holds_the_cached_writes_as_of_then_without_flushing_them(
        rocksdb_tmp: Path) -> None:
    backend = new_backend(100)
    table = backend.create_value_table("v", SER)
    raw = backend._family("v")
    try:
        for key, value in (("a", 1), ("b", 2), ("c", 3)):
            backend.key_context.set_current_key(key)
            table.update(value)  # type: ignore[attr-defined]
        backend.flush()
        backend.key_context.set_current_key("a")
        table.update(10)  # type: ignore[attr-defined]
        backend.key_context.set_current_key("b")
        table.clear()  # type: ignore[attr-defined]
        frozen = dict(backend.frozen_sources())["v"]
        assert sorted(SER.decode(v) for v in raw.values()) == [1, 2, 3]  # not flushed
        backend.key_context.set_current_key("a")
        table.update(20)  # type: ignore[attr-defined]
        backend.key_context.set_current_key("d")
        table.update(4)  # type: ignore[attr-defined]
        backend.flush()
        assert sorted(SER.decode(v) for _, v in frozen) == [3, 10]
    finally:
        backend.close()


def test_a_large_flush_is_ingested_as_a_file_with_the_same_reads_snapshots_and_restores(
        rocksdb_tmp: Path) -> None:
    """From INGEST_MIN_PUTS puts on, a flush writes an SST file RocksDB ingests, not a
    write batch: keys read back, deletes in the same flush apply, a frozen snapshot
    from before still reads the old values, and a native checkpoint restores it all."""
    n = INGEST_MIN_PUTS + 500
    backend = new_backend(0)  # no entry cache: every read goes to RocksDB
    table = backend.create_value_table("v", SER)
    raw = backend._family("v")
    try:
        for i in range(n):
            backend.key_context.set_current_key(f"k{i}")
            table.update(i)  # type: ignore[attr-defined]
        backend.flush()  # a write batch each (no cache): the first state
        frozen = dict(backend.frozen_sources())["v"]
        big = {f"k{i}": (None if i % 7 == 0 else -i) for i in range(n)}
        writes: dict[bytes, bytes | None] = {}
        for key, value in big.items():
            backend.key_context.set_current_key(key)
            writes[backend.key_context.key_bytes] = None if value is None else SER.encode(value)
        backend._write(raw, "s:v", writes)
        assert not list(backend.path.glob("weir-ingest*"))  # moved in under RocksDB's name
        # the puts skipped the memtable (flushed before the ingestion): only deletes in it
        deletes = sum(v is None for v in writes.values())
        assert raw.property_int_value("rocksdb.num-entries-active-mem-table") == deletes
        want = {k: v for k, v in big.items() if v is not None}
        for key in big:
            backend.key_context.set_current_key(key)
            assert table.value() == want.get(key)  # type: ignore[attr-defined]
        assert sorted(SER.decode(v) for _, v in frozen) == list(range(n))  # as of then
        backend.native_checkpoint(rocksdb_tmp / "chk")
    finally:
        backend.close()
    restored = new_backend(0)
    try:
        restored.restore_native([NativeRocksDBState(str(rocksdb_tmp / "chk"),
                                                    KeyGroupRange(0, MAX_P - 1))])
        table = restored.create_value_table("v", SER)
        for key in big:
            restored.key_context.set_current_key(key)
            assert table.value() == want.get(key)  # type: ignore[attr-defined]
    finally:
        restored.close()


def test_tracked_writes_reach_rocksdb_after_their_changes_are_taken(rocksdb_tmp: Path) -> None:
    """While changes are tracked a write is held in the change record alone; taking
    the changes must leave it to be flushed, and a flush between takes must not drop
    it from the next record."""
    backend = new_backend(100)
    table = backend.create_value_table("v", SER)
    raw = backend._family("v")
    try:
        backend.track_changes()
        for key, value in (("a", 1), ("b", 2)):
            backend.key_context.set_current_key(key)
            table.update(value)  # type: ignore[attr-defined]
        assert {SER.decode(v) for v in dict(backend.take_changes())["v"].values()} == {1, 2}
        backend.key_context.set_current_key("c")
        table.update(3)  # type: ignore[attr-defined]
        frozen = dict(backend.frozen_sources())["v"]
        assert sorted(SER.decode(v) for _, v in frozen) == [1, 2, 3]
        assert list(raw.keys()) == []  # nothing flushed yet
        backend.flush()
        assert sorted(SER.decode(v) for v in raw.values()) == [1, 2, 3]
        backend.key_context.set_current_key("d")
        table.update(4)  # type: ignore[attr-defined]
        taken = dict(backend.take_changes())["v"]
        assert sorted(SER.decode(v) for v in taken.values()) == [3, 4]  # across the flush
    finally:
        backend.close()


# ------------------------------------------------------------------ whole tables

class _CountingFamily:
    """A column family handle that counts the gets made through it."""

    def __init__(self, cf: Any) -> None:
        self._cf = cf
        self.gets = 0

    def get(self, key: bytes) -> Any:
        self.gets += 1
        return self._cf.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cf, name)


def _restored_with(entries: dict[str, int], cache_entries: int, tmp: Path
                   ) -> RocksDBKeyedStateBackend:
    source = new_backend(100)
    table = source.create_value_table("v", SER)
    for key, value in entries.items():
        source.key_context.set_current_key(key)
        table.update(value)  # type: ignore[attr-defined]
    source.native_checkpoint(tmp / "chk")
    source.close()
    restored = new_backend(cache_entries)
    restored.restore_native([NativeRocksDBState(str(tmp / "chk"), KeyGroupRange(0, MAX_P - 1))])
    return restored


def test_a_new_table_answers_first_reads_without_rocksdb(rocksdb_tmp: Path) -> None:
    backend = new_backend(100)
    table = backend.create_value_table("v", SER)
    family = table._cf = _CountingFamily(table._cf)  # type: ignore[attr-defined]
    try:
        for key in range(50):
            backend.key_context.set_current_key(key)
            assert table.value() is None  # type: ignore[attr-defined]
            table.update(key)  # type: ignore[attr-defined]
        assert family.gets == 0
    finally:
        backend.close()


def _read_restored(cache_entries: int, tmp: Path) -> tuple[int, int]:
    """Restore 50 keys into a backend with a cache of ``cache_entries``, read them and
    10 absent keys (each must read right): the gets made of RocksDB, and the entries
    cached."""
    backend = _restored_with({f"k{i}": i for i in range(50)}, cache_entries, tmp)
    table = backend.create_value_table("v", SER)
    family = table._cf = _CountingFamily(table._cf)  # type: ignore[attr-defined]
    try:
        for i in range(60):
            backend.key_context.set_current_key(f"k{i}")
            assert table.value() == (i if i < 50 else None)  # type: ignore[attr-defined]
        return family.gets, table.cached()  # type: ignore[attr-defined]
    finally:
        backend.close()


def test_a_restored_table_that_fits_loads_it_in_one_scan(rocksdb_tmp: Path) -> None:
    """Every read after the scan, of present and absent keys, is a cache hit."""
    assert _read_restored(64, rocksdb_tmp) == (0, 50)


def test_a_restored_table_larger_than_the_cache_reads_rocksdb_by_key(rocksdb_tmp: Path) -> None:
    gets, cached = _read_restored(20, rocksdb_tmp)
    assert gets == 60
    assert cached <= 20


def test_a_restore_opens_only_the_checkpoint_it_adopts(
    rocksdb_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend opens its database on first use, so a restore that adopts a native
    checkpoint never opens (and throws away) an empty one first."""
    opened: list[Path] = []
    real_open = rocksdb_module.open_db

    def counting_open(path: Path, memory: RocksDBMemory) -> Any:
        opened.append(path)
        return real_open(path, memory)

    monkeypatch.setattr(rocksdb_module, "open_db", counting_open)
    backend = _restored_with({f"k{i}": i for i in range(50)}, 64, rocksdb_tmp)
    try:
        assert opened[-1] == backend.path
        assert len(opened) == 2  # the source's database, then the adopted checkpoint
        table = backend.create_value_table("v", SER)
        backend.key_context.set_current_key("k7")
        assert table.value() == 7  # type: ignore[attr-defined]
    finally:
        backend.close()
    empty = new_backend(16)  # never used: never opened, and its directory removed
    empty.close()
    assert len(opened) == 2 and not empty.path.exists()
    with pytest.raises(StateBackendError, match="is closed"):  # not recreated either
        empty.create_value_table("v", SER)
    assert len(opened) == 2 and not empty.path.exists()


@settings(max_examples=300, deadline=None)
@given(entries=st.dictionaries(st.binary(max_size=20), st.one_of(st.none(), st.binary(max_size=3)),
                               max_size=80),
       common=st.binary(max_size=17))
def test_writes_reach_a_batch_in_the_byte_order_of_their_keys(
    entries: dict[bytes, bytes | None], common: bytes
) -> None:
    """``sorted_writes`` (a write batch's puts and deletes in key order, so the memtable
    inserts them cheaply) orders keys as RocksDB's comparator does, a common prefix of
    any length included (its radix sort goes eight bytes at a time)."""
    entries = {common + key: value for key, value in entries.items()}
    keys, values, deleted = sorted_writes(entries)
    assert list(zip(keys, values, strict=True)) == sorted(
        (k, v) for k, v in entries.items() if v is not None)
    assert deleted == sorted(k for k, v in entries.items() if v is None)


def test_sorted_writes_takes_only_a_dict_of_bytes_keys() -> None:
    with pytest.raises(TypeError):
        sorted_writes([(b"a", b"b")])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="str, not bytes"):
        sorted_writes({b"a": b"1", "b": b"2"})  # type: ignore[dict-item]
    assert sorted_writes({}) == ([], [], [])


# ------------------------------------------------------------------ the C fast path

#: values of every kind, an unencodable one included (the write check must refuse it):
#: ints of every msgpack width and beyond uint64, floats, bools and strings (the C fast
#: path encodes ints and floats and decodes scalars itself)
VALUES = st.one_of(st.integers(-3, 3), st.integers(-(2**64), 2**65), st.floats(),
                   st.booleans(), st.sampled_from(["x", "y"]), st.text(max_size=3), st.none(),
                   st.lists(st.integers(0, 2), max_size=2), st.just(object()))
CALLS = st.lists(st.tuples(
    st.sampled_from(["value", "update", "no_key", "track", "take", "flush"]),
    st.sampled_from(["a", "b", 7]), VALUES,
), max_size=40)


class _ValueSide:
    """A RocksDB value table called through its public methods (C whenever the fast
    case applies) or through the ``_slow_`` methods only."""

    def __init__(self, slow: bool, cache_entries: int) -> None:
        self.backend = new_backend(cache_entries)
        self.table: Any = self.backend.create_value_table("v", SER)
        self.slow = slow

    def run(self, call: str, key: Any, value: Any) -> Any:
        ctx = self.backend.key_context
        if call == "track":
            return self.backend.track_changes()
        if call == "take":
            return sorted(dict(self.backend.take_changes()).get("v", {}).items())
        if call == "flush":
            return self.backend.flush()
        if call == "no_key":
            ctx.clear()
            return self.table._slow_value() if self.slow else self.table.value()
        ctx.set_current_key(key)
        if call == "value":
            return self.table._slow_value() if self.slow else self.table.value()
        return self.table._slow_update(value) if self.slow else self.table.update(value)

    def outcome(self, call: tuple[str, Any, Any]) -> Any:
        try:
            return ("returned", repr(self.run(*call)))
        except Exception as exc:
            return ("raised", type(exc).__name__, str(exc))

    def held(self) -> Any:
        t = self.table
        return (dict(t._cache), dict(t._dirty), None if t._written is None else dict(t._written))


@settings(max_examples=200, deadline=None)
@given(calls=CALLS, cache_entries=st.sampled_from([0, 2, 100]))
def test_the_value_fast_path_matches_the_python_semantics(
        calls: list[tuple[str, Any, Any]], cache_entries: int) -> None:
    fast, slow = _ValueSide(False, cache_entries), _ValueSide(True, cache_entries)
    try:
        for call in calls:
            assert fast.outcome(call) == slow.outcome(call), call
            assert fast.held() == slow.held()
    finally:
        fast.backend.close()
        slow.backend.close()


#: every msgpack int width's bounds, either side, and floats msgpack packs as float 64
_NUMBERS = [0, 1, -1, 127, 128, -32, -33, 255, 256, -128, -129, 65535, 65536, -32768,
            -32769, 2**32 - 1, 2**32, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63, 2**64 - 1,
            -(2**63), 0.0, -0.0, 1.5, float("inf"), float("-inf"), 1e308]


@pytest.mark.parametrize("value", _NUMBERS, ids=repr)
def test_the_fast_path_stores_a_number_as_msgpack_packs_it(value: Any) -> None:
    side = _ValueSide(False, 100)
    try:
        side.run("update", "a", value)
        assert side.table._cache[side.backend.key_context.key_bytes] == SER.encode(value)
        got = side.run("value", "a", None)
        assert got == value and type(got) is type(value)
    finally:
        side.backend.close()


def test_the_fast_path_refuses_ints_msgpack_cannot_pack_as_python_does() -> None:
    fast, slow = _ValueSide(False, 100), _ValueSide(True, 100)
    try:
        for value in (2**64, -(2**63) - 1):
            assert fast.outcome(("update", "a", value)) == slow.outcome(("update", "a", value))
            assert fast.outcome(("update", "a", value))[0] == "raised"
    finally:
        fast.backend.close()
        slow.backend.close()


def test_the_rocksdb_value_table_uses_the_c_methods() -> None:
    from weir.state._hashcore import RocksValueCore
    from weir.state.rocksdb_tables import RocksValueTable

    assert RocksValueTable.value is RocksValueCore.value  # type: ignore[comparison-overlap]
    assert RocksValueTable.update is RocksValueCore.update  # type: ignore[comparison-overlap]
