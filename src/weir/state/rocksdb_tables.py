"""The tables of the RocksDB backend: one column family per state, bytes in and out.

Value and list states store one entry per key (a list as one framed value, appended
to in place); a map state stores one entry per (key, user key), the user key's
canonical bytes appended to the prefixed key. Keys and values are laid out exactly as
in the canonical snapshot form (``weir.state.backend``). The backend that owns the
column families is ``weir.state.rocksdb``.

**The entry cache.** A RocksDB get or put from Python costs about 1-3 µs, most of it
the memtable's skip-list search (cache misses per level); a keyed count does one of
each per record. Value and list tables therefore read and write through a bounded
cache of stored entries (bytes, as in RocksDB; ``None``: known absent) with the
entries written since the last flush kept dirty. A read that hits costs a dict
lookup; the writes of a key between two flushes reach RocksDB once, in one write
batch. The cache holds at most ``cache_entries`` entries (``RocksDBMemory``); adding
one more first flushes and then drops the older half (insertion order). Everything
that reads RocksDB other than by one key — key iteration, full snapshots, native
checkpoints, compaction, restores — flushes first (the backend calls :meth:`flush`),
so RocksDB is the state whenever anything else looks at it; an asynchronous snapshot
(``frozen_sources``) instead lays a copy of the dirty entries over a RocksDB snapshot.
Map states read and write RocksDB directly: their reads are prefix scans
(:mod:`weir.state.rocksdb_map_table`).

**Whole tables.** A miss costs a RocksDB get even for a key RocksDB does not hold (every
key's first record), and a restored subtask (on Spark: each time a subtask's task runs in
another Python worker) starts with an empty cache. So at the first miss after a table is
made or its cache dropped, a table decides whether its column family fits in the cache:
if RocksDB's key estimate allows, it loads the column family in one scan (about 0.3 µs
an entry against 1-3 µs a get) and, when the scan ends within ``cache_entries``, the
cache is *complete*: a miss is an absent key, answered without RocksDB, until an
eviction. A new, empty table is complete at once. Writes around a table keep it
complete (``stored``) or drop its cache (restores).

**Counting entries** (``entry_count``, once per checkpoint: its ``state_entries``, the
entries ``weir.read_state`` returns) is exact, costs nothing per record on a value or
list state, and a dict lookup per write on a map state:

* a value or list state whose cache is complete counts the cache's entries that are
  not ``None`` (in C, a few ns an entry; at most ``cache_entries`` of them);
* a larger one keeps a count across flushes: each flush first reads which of the
  keys it writes RocksDB holds (one multi-get per flush: a get's cost per key written
  since the previous flush, not per record), and a compaction filter's delete
  subtracts one;
* a map state keeps a count and, per key written since the last count, the number of
  entries the key had before its first write (a dict lookup per write, and at a key's
  first write since the last count a prefix scan, about three puts); ``entry_count``
  adds, per such key, its entries now minus before;
* anything else scans the column family (an entry costs about a tenth of a get):
  the first count after a table was made, restored or written without an entry cache
  (``cache_entries`` 0), and a count kept at more cost since the last count than
  half a scan (:data:`GET_COST` entries a get or a seek) — the count is given up
  then, so a kept count never costs much more than the scan it saves.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from weir.api.serializers import MsgpackSerializer, Serializer
from weir.api.state import ListState, ValueState
from weir.errors import StateError
from weir.state._hashcore import RocksPointCore, RocksValueCore, cache_get_fixed, cache_put_fixed
from weir.state.backend import (
    EntryFilter,
    ListTable,
    ValueTable,
    frame,
    frame_append,
    frame_items,
    unframe,
)
from weir.state.keycontext import KeyContext
from weir.state.rocksdb_changes import ChangeRecord

__all__ = ["GET_COST", "EntryWriter", "RocksListTable", "RocksTable", "RocksValueTable",
           "count_budget", "count_keys", "successor"]

#: writes a table's dirty entries (None: delete) to its column family in one batch
EntryWriter = Callable[[dict[bytes, bytes | None]], None]
_MISSING: Any = object()
#: a table whose column family RocksDB estimates at more than this many times the
#: cache's bound is not scanned into it (the estimate counts a key once per SST file
#: and memtable that holds a version of it, so it overstates a state written in
#: several batches)
_ESTIMATE_SLACK = 4
#: what a RocksDB get, or a seek, costs in entries a scan reads (measured 6-10: a get
#: 1.5-6 µs, a scanned entry 0.16-2 µs, the more versions per key the more)
GET_COST = 8
#: the least a count may cost to keep between two counts, in scanned entries
_MIN_BUDGET = 4096


def count_keys(cf: Any) -> int:
    """The number of entries in column family ``cf`` (a scan, about 0.16 µs an entry)."""
    return sum(1 for _ in cf.keys())  # noqa: SIM118 - an Rdict is not iterable


def count_budget(count: int) -> int:
    """What keeping a count of ``count`` entries may cost between two counts, in
    scanned entries, before it is given up for a scan: half a scan."""
    return max(_MIN_BUDGET, count // 2)


def successor(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class RocksTable(ChangeRecord):
    def __init__(self, name: str, ctx: KeyContext, cf: Any, serializer: Serializer[Any]):
        self.name = name
        self._ctx = ctx
        self._cf = cf
        self._serializer = serializer

    def rebind(self, cf: Any) -> None:
        """Read and write column family handle ``cf`` from now on (the backend
        reopened its database)."""
        self._cf = cf

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._cf.iter()
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                break
            yield key, it.value()
            it.next()

    def keys_snapshot(self) -> list[bytes]:
        return list(self._cf.keys())

    def _state_key(self, stored_key: bytes) -> bytes:
        return stored_key

    def keys_page(self, cursor: Any, limit: int) -> tuple[list[bytes], Any]:
        # cursor: the first key of the next page, in RocksDB key order
        it = self._cf.iter()
        if cursor is None:
            it.seek_to_first()
        else:
            it.seek(cursor)
        page: list[bytes] = []
        while it.valid():
            key = self._state_key(it.key())
            if len(page) == limit:
                return page, key
            page.append(key)
            after = successor(key)
            if after is None:
                break
            it.seek(after)
        return page, None

    # The entry cache (value and list states; a map state holds nothing back):

    def flush(self) -> None:
        """Write the cached writes to RocksDB."""

    def drop_cache(self) -> None:
        """Forget every cached entry, dirty ones included (RocksDB was replaced)."""

    def stored(self, key: bytes, data: bytes | None) -> None:
        """``key``'s entry in RocksDB is now ``data`` (written around the table, after
        a flush)."""

    def dirty_copy(self) -> dict[bytes, bytes | None] | None:
        """A copy of the writes not yet in RocksDB (None: there are none)."""
        return None

    def entry_count(self) -> int:
        """The number of entries of this state now, as a snapshot holds them (see
        "Counting entries" in the module doc)."""
        raise NotImplementedError


class _PointTable(RocksPointCore, RocksTable):
    """A state with one stored entry per key, read and written through the entry
    cache (see the module's docstring). Its fields are slots of ``RocksPointCore``
    (``_rockscore.c``), which the value state's C fast path reads."""

    def __init__(self, name: str, ctx: KeyContext, cf: Any, serializer: Serializer[Any],
                 writer: EntryWriter, cache_entries: int):
        super().__init__(name, ctx, cf, serializer)
        self._fast_encode = serializer.encode
        self._fast_decode = serializer.decode
        # (msgpack scalars decoded and numbers encoded in C, to the same bytes)
        self._fast_scalars = type(serializer) is MsgpackSerializer
        self._written = None  # (the slot shadows ChangeRecord's class default)
        self._writer = writer
        #: at most this many cached entries (0: no cache, every call goes to RocksDB)
        self._limit = cache_entries
        #: prefixed key -> stored bytes (None: absent), the dirty ones included
        self._cache: dict[bytes, bytes | None] = {}
        #: prefixed key -> bytes written since the last flush (None: deleted) and not
        #: in ``_written``: while changes are tracked, a write goes to ``_written``
        #: alone (one dict store less per write) and reaches ``_dirty`` when the
        #: changes are taken
        self._dirty: dict[bytes, bytes | None] = {}
        #: the part of the change record that a flush already wrote (``_written`` holds
        #: the rest; the record's keys at most once, whatever the number of flushes)
        self._written_flushed: dict[bytes, bytes | None] = {}
        #: True: the cache holds every entry of the column family, so a miss is an
        #: absent key; None: not decided since the table was made or its cache dropped
        #: (the cache and the dirty entries are then empty; ``_warm`` decides)
        self._complete: bool | None = None if cache_entries else False
        #: the entries in RocksDB, kept across flushes while the cache is not complete
        #: (None: not known; a complete cache counts itself), and what keeping it cost
        #: since the last count (in scanned entries)
        self._count: int | None = None
        self._count_spent = 0

    def _get(self, key: bytes) -> bytes | None:
        data = self._cache.get(key, _MISSING)
        if data is _MISSING and self._complete is None:
            self._warm()
            data = self._cache.get(key, _MISSING)
        if data is not _MISSING:
            return data  # type: ignore[no-any-return]
        if self._complete:
            return None
        data = self._cf.get(key)
        if self._limit:
            if len(self._cache) >= self._limit:
                self._evict()
            self._cache[key] = data
        return data  # type: ignore[no-any-return]

    def get_stored(self, keys: list[bytes]) -> list[bytes | None]:
        """The stored bytes of many prefixed keys (None: absent), from the entry cache
        where it holds them (a batch function's read)."""
        if self._complete is None and self._limit:
            self._warm()
        get = self._cache.get
        if self._complete:  # (a key the cache does not hold is absent)
            return list(map(get, keys))
        found = [get(key, _MISSING) for key in keys]
        if _MISSING in found:
            found = [self._get(k) if d is _MISSING else d
                     for k, d in zip(keys, found, strict=True)]
        return found

    def get_fixed(self, keys: list[bytes], kind: str
                  ) -> tuple[bytearray, bytearray | None, int] | None:
        """:meth:`get_stored` of 8-byte values as one native int64 ("i") or float64
        ("f") buffer, its validity bitmap and null count (``_hashcore.cache_get_fixed``);
        None where the cache cannot answer alone (then :meth:`get_stored`)."""
        if self._complete is None and self._limit:
            self._warm()
        return cache_get_fixed(self._cache, keys, kind, bool(self._complete))

    def store_fixed(self, keys: list[bytes], values: Any) -> None:
        """:meth:`store_many` of 8-byte stored values given as one contiguous
        big-endian array, stored from it in C where the cache takes every key."""
        cache = self._cache
        if self._limit and self._complete is None:
            self._warm()
        if self._limit and len(cache) + len(keys) <= self._limit:
            cache_put_fixed(cache, self._dirty if self._written is None else self._written,
                            keys, values)
            return
        self.store_many(keys, values.view("V8").tolist())

    def store_many(self, keys: list[bytes], datas: list[bytes | None]) -> None:
        """Write many prefixed keys' stored bytes (None: delete; a key given twice
        keeps the last) as :meth:`_store` does, in two dict updates where the cache
        takes them all without an eviction."""
        cache = self._cache
        if self._limit and self._complete is None:
            self._warm()
        if not self._limit or (len(cache) + len(keys) > self._limit and (
                len(cache) + sum(k not in cache for k in keys) > self._limit)):
            for key, data in zip(keys, datas, strict=True):
                self._store(key, data)
            return
        cache.update(zip(keys, datas, strict=True))
        (self._dirty if self._written is None else self._written).update(
            zip(keys, datas, strict=True))

    def _put(self, key: bytes, data: bytes) -> None:
        self._store(key, data)

    def _delete(self, key: bytes) -> None:
        self._store(key, None)

    def _store(self, key: bytes, data: bytes | None) -> None:
        if self._limit:
            cache = self._cache
            if key not in cache:
                if self._complete is None:
                    self._warm()
                if len(cache) >= self._limit and key not in cache:
                    self._evict()
            cache[key] = data
            if self._written is None:
                self._dirty[key] = data
            else:
                self._written[key] = data
            return
        if data is None:
            self._cf.delete(key)
        else:
            self._cf.put(key, data)
        self._count = None  # (no entry cache: whether the key was there is not known)
        if self._written is not None:
            self._written[key] = data

    def _warm(self) -> None:
        """Load the whole column family into the (empty) cache when it fits, which
        makes the cache complete; else leave the cache empty and incomplete."""
        self._complete = False
        limit = self._limit
        try:
            estimate = int(self._cf.property_int_value("rocksdb.estimate-num-keys") or 0)
        except Exception:  # no estimate: the scan below is bounded anyway
            estimate = 0
        if estimate > _ESTIMATE_SLACK * limit:
            return
        entries = dict(itertools.islice(self._cf.items(), limit + 1))
        if len(entries) <= limit:
            self._cache.update(entries)
            self._complete = True

    def _evict(self) -> None:
        """Flush, then drop the older half of the cache (insertion order)."""
        self.flush()
        cache = self._cache
        if self._complete:  # the count the cache held from now on kept across flushes
            self._count = len(cache) - operator.countOf(cache.values(), None)
        for key in list(itertools.islice(cache, max(1, len(cache) // 2))):
            del cache[key]
        self._complete = False

    def flush(self) -> None:
        """Write the dirty entries to RocksDB, in one write batch; they stay cached."""
        if not self._limit:
            return
        written = self._written
        if written:  # (the change record stays whole: this part is kept, as flushed)
            self._keep_flushed(written)
        if self._dirty:
            dirty, self._dirty = self._dirty, {}
            if written:
                dirty.update(written)
        elif written:
            dirty = written
        else:
            return
        if self._count is not None and not self._complete:
            self._count_flush(dirty)
        self._writer(dirty)

    def _count_flush(self, batch: dict[bytes, bytes | None]) -> None:
        """Bring the kept count past the writes of ``batch`` (before they are
        written): one multi-get says which keys RocksDB holds now."""
        count = self._count
        assert count is not None
        self._count_spent += GET_COST * len(batch)
        if self._count_spent > count_budget(count):
            self._count = None  # the next entry_count scans: cheaper than the gets
            return
        before = self._cf.get(list(batch))
        self._count = (count + len(batch) - operator.countOf(batch.values(), None)
                       - (len(before) - operator.countOf(before, None)))

    def _keep_flushed(self, written: dict[bytes, bytes | None]) -> None:
        """Move the change record's ``written`` (now in RocksDB) to its flushed part."""
        if self._written_flushed:
            self._written_flushed.update(written)
        else:
            self._written_flushed = written
        self._written = {}

    def track(self) -> None:
        if self._limit and self._written:  # unflushed writes of the record that ends
            self._dirty.update(self._written)
        self._written_flushed = {}
        super().track()

    def changed(self) -> int:
        return len(self._written or ()) + len(self._written_flushed)

    def take(
        self,
    ) -> dict[bytes, bytes | None] | Iterator[tuple[bytes, list[tuple[bytes, bytes]]]]:
        written = self._written or {}
        if self._limit:
            self._dirty.update(written)  # not written to RocksDB yet
        if self._written_flushed:
            merged, self._written_flushed = self._written_flushed, {}
            merged.update(written)
            written = merged
        self._written = {}
        return written

    def drop_cache(self) -> None:
        if self._written:  # kept as a record of changes, never to be written
            self._keep_flushed(self._written)
        self._cache.clear()
        self._dirty.clear()
        self._count = None
        if self._limit:
            self._complete = None

    def stored(self, key: bytes, data: bytes | None) -> None:
        # (a compaction filter, after a flush, rewrote or deleted an entry RocksDB held)
        if key in self._cache:
            self._cache[key] = data
        if data is None and self._count is not None:
            self._count -= 1

    def entry_count(self) -> int:
        if self._complete:  # every entry is cached (None: known absent)
            cache = self._cache
            return len(cache) - operator.countOf(cache.values(), None)
        self.flush()  # (brings a kept count up to date)
        if self._count is None:
            self._count = count_keys(self._cf)
        self._count_spent = 0
        return self._count

    def dirty_copy(self) -> dict[bytes, bytes | None] | None:
        if not self._limit or not (self._dirty or self._written):
            return None
        copy = dict(self._dirty)
        if self._written:
            copy.update(self._written)
        return copy

    def cached(self) -> int:
        """The number of entries in the cache."""
        return len(self._cache)

    def keys_snapshot(self) -> list[bytes]:
        self.flush()
        return super().keys_snapshot()

    def keys_page(self, cursor: Any, limit: int) -> tuple[list[bytes], Any]:
        self.flush()
        return super().keys_page(cursor, limit)

    def clear_at(self, key: bytes) -> None:
        self._store(key, None)

    def filter_at(self, key: bytes, keep: EntryFilter) -> int:
        """Apply a bytes-level filter to one key's stored bytes without decoding
        values (TTL cleanup); returns the number of entries changed or dropped."""
        data = self._get(key)
        if data is None:
            return 0
        kept = keep(key, data)
        if kept is None:
            self._store(key, None)
        elif kept != data:
            self._store(key, kept)
        else:
            return 0
        return 1


class RocksValueTable(RocksValueCore, _PointTable, ValueTable, ValueState[Any]):
    # value() and update() are the hot calls: RocksValueCore's C methods handle a
    # cached key and call these for everything else (the checked helpers run only to
    # raise their errors)

    def _slow_value(self) -> Any:
        data = self._get(self._current())
        return None if data is None else self._decode(data)

    def _slow_update(self, value: Any) -> None:
        self._store(self._current(), None if value is None else self._encode(value))

    def clear(self) -> None:
        self._store(self._current(), None)

    def value_at(self, key: bytes) -> Any:
        data = self._get(key)
        return None if data is None else self._decode(data)

    def update_at(self, key: bytes, value: Any) -> None:
        self._put(key, self._encode(value))


class RocksListTable(_PointTable, ListTable, ListState[Any]):
    def __init__(self, name: str, ctx: KeyContext, cf: Any, serializer: Serializer[Any],
                 writer: EntryWriter, cache_entries: int):
        super().__init__(name, ctx, cf, serializer, writer, cache_entries)
        self._inline = serializer.inline_in_msgpack_array

    def _frame_checked(self, values: Iterable[Any]) -> tuple[bytes, int]:
        encoded = []
        for value in values:
            if value is None:
                raise StateError(f"list state {self.name!r}: cannot add None")
            encoded.append(self._encode(value))
        return frame_items(encoded, self._inline)

    def get(self) -> list[Any]:
        return self.get_at(self._current())

    def add(self, value: Any) -> None:
        key = self._current()
        items, count = self._frame_checked((value,))
        self._store(key, frame_append(self._get(key), items, count))

    def add_all(self, values: Iterable[Any]) -> None:
        key = self._current()
        items, count = self._frame_checked(values)
        if count:
            self._store(key, frame_append(self._get(key), items, count))

    def update(self, values: Iterable[Any]) -> None:
        key = self._current()
        items, count = self._frame_checked(values)
        self._store(key, frame_append(None, items, count) if count else None)

    def clear(self) -> None:
        self._store(self._current(), None)

    def get_at(self, key: bytes) -> list[Any]:
        data = self._get(key)
        if data is None:
            return []
        if self._inline:  # the whole list is one msgpack array
            return self._decode(data)  # type: ignore[no-any-return]
        decode = self._serializer.decode
        elements = unframe(data)
        try:
            return [decode(e) for e in elements]
        except Exception:  # name the state and the problem
            return [self._decode(e) for e in elements]

    def update_at(self, key: bytes, values: list[Any]) -> None:
        if values:
            self._store(key, frame((self._encode(v) for v in values), self._inline))
        else:
            self._store(key, None)
