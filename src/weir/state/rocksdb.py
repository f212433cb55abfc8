"""The RocksDB backend: keyed state in an embedded RocksDB (through rocksdict).

One RocksDB instance per operator subtask, in a local directory; one column family
per state (``s:<state name>``). Every key starts with the 2-byte key-group prefix,
so a key-group range is a contiguous key range that can be iterated, copied and
dropped. Keys and values are bytes laid out exactly as in the canonical snapshot
form (``weir.state.backend``): a snapshot is a scan, a restore is a batch write.
The write-ahead log is off: durability comes from checkpoints, not from RocksDB.

rocksdict exposes no native compaction filter, so ``compact(filters)`` runs the
filters over every entry of the filtered column families and then compacts them,
and ``compact_step`` runs a filter over a bounded slice of one column family from a
cursor (RocksDB's automatic compactions then drop the deletions); the TTL layer uses
them for the compaction-filter cleanup.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import rocksdict

from weir.api.serializers import Serializer
from weir.errors import StateBackendError, StateError
from weir.state.backend import (
    EntryFilter,
    KeyedStateBackend,
    ListTable,
    MapTable,
    ValueTable,
)
from weir.state.keycontext import KeyContext
from weir.state.keygroups import KeyGroupRange
from weir.state.rocksdb_map_table import RocksMapTable
from weir.state.rocksdb_options import RocksDBMemory, db_options, open_db, shared_memory_usage
from weir.state.rocksdb_tables import (
    EntryWriter,
    RocksListTable,
    RocksValueTable,
    count_keys,
)
from weir.state.rocksdb_writes import write_entries
from weir.state.snapshot import NativeRocksDBState

__all__ = [
    "TIMER_CF_PREFIX", "RocksDBMemory", "RocksDBKeyedStateBackend", "list_column_families",
    "lookup_native",
    "scan_native", "shared_memory_usage",
]

_Table = TypeVar("_Table", RocksValueTable, RocksListTable, RocksMapTable)
_CF_PREFIX = "s:"
#: column families mirroring the timers (the timer queues stay on the heap; the
#: mirror makes incremental checkpoints carry timers as changed SST files)
TIMER_CF_PREFIX = "t:"
#: greater than every stored key (key groups are below 2**15, so prefixes below 0x80)
_END = b"\xff\xff\xff"


def _range_bounds(key_groups: KeyGroupRange) -> tuple[bytes, bytes]:
    """``[low, high)`` byte bounds of the keys of a key-group range."""
    return key_groups.start.to_bytes(2, "big"), (key_groups.end + 1).to_bytes(2, "big")


def list_column_families(path: str | Path, prefix: str = _CF_PREFIX) -> list[str]:
    """State names (timer names with ``prefix=TIMER_CF_PREFIX``) that have a column
    family in the database at ``path``."""
    try:
        names = rocksdict.Rdict.list_cf(str(path))
    except Exception:
        return []
    return [n[len(prefix) :] for n in names if n.startswith(prefix)]


def scan_native(
    native: NativeRocksDBState, prefix: str = _CF_PREFIX
) -> Iterator[tuple[str, list[tuple[bytes, bytes]]]]:
    """``(state name, entries)`` of a native checkpoint within its key-group range
    (``(timer name, entries)`` with ``prefix=TIMER_CF_PREFIX``)."""
    if not len(native.key_group_range):
        return
    low, high = _range_bounds(native.key_group_range)
    db = rocksdict.Rdict(native.path, db_options(), access_type=rocksdict.AccessType.read_only())
    try:
        for name in list_column_families(native.path, prefix):
            cf = db.get_column_family(prefix + name)
            entries = []
            it = cf.iter()
            it.seek(low)
            while it.valid():
                key = it.key()
                if key >= high:
                    break
                entries.append((key, it.value()))
                it.next()
            del it
            cf.close()
            yield name, entries
    finally:
        db.close()


def lookup_native(path: str | Path, name: str, prefixes: Iterable[bytes]
                  ) -> list[tuple[bytes, bytes]]:
    """The entries of state ``name`` in the database at ``path`` whose keys start with
    one of ``prefixes`` (prefixed keys: canonical keys are prefix-free, so a key's
    prefix finds exactly its entries, a map's user keys included)."""
    if name not in list_column_families(path):
        return []
    db = rocksdict.Rdict(str(path), db_options(), access_type=rocksdict.AccessType.read_only())
    try:
        cf = db.get_column_family(_CF_PREFIX + name)
        out = []
        it = cf.iter()
        for prefix in prefixes:
            it.seek(prefix)
            while it.valid() and it.key().startswith(prefix):
                out.append((it.key(), it.value()))
                it.next()
        del it
        cf.close()
        return out
    finally:
        db.close()


def _overlaid(stored: Iterable[tuple[bytes, bytes]], written: dict[bytes, bytes | None]
              ) -> Iterator[tuple[bytes, bytes]]:
    """``stored`` entries with ``written`` laid over them (None: deleted), the stored
    ones first (a snapshot's entries need no order)."""
    for key, data in stored:
        if key not in written:
            yield key, data
    for key, value in written.items():
        if value is not None:
            yield key, value


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """Keyed state in an embedded RocksDB under ``path`` (a fresh temporary directory
    if not given; removed on close when weir created it)."""

    name = "rocksdb"
    #: a snapshot's iterator skips every older version of a key still in the memtables:
    #: with 8-10 per key (a hot state between flushes) 16,384 entries took 30-58 ms per
    #: call, the task's longest synchronous pause (the checkpoint that started the
    #: materialization); 2,048 hold the GIL at most about 6-11 ms, same total time
    snapshot_chunk = 2048

    def __init__(
        self, key_context: KeyContext, path: str | Path | None = None,
        memory: RocksDBMemory | None = None,
    ) -> None:
        super().__init__(key_context)
        self._owns_path = path is None
        self.path = Path(path if path is not None else tempfile.mkdtemp(prefix="weir-rocksdb-"))
        #: block cache and write buffers: shared by the process's instances, bounded
        self.memory = memory if memory is not None else RocksDBMemory()
        self._write_options = rocksdict.WriteOptions()
        # rocksdict's stubs declare disable_wal a method; at run time it is a property.
        self._write_options.disable_wal = True  # type: ignore[method-assign,assignment]
        #: the database, opened on first use: a restore that adopts a native checkpoint
        #: opens only that one (an empty database opened first was 28% of a restore)
        self._opened: rocksdict.Rdict | None = None
        self._families: dict[str, Any] = {}
        #: the tables made, by state (they record their writes once changes are tracked)
        self._tables: dict[str, RocksValueTable | RocksListTable | RocksMapTable] = {}
        self._tracking = False
        self._timer_families: dict[str, Any] = {}
        #: entries of the column families of states without a table (restored, not
        #: registered yet), as counted (dropped when written)
        self._counted: dict[str, int] = {}
        self._closed = False
        #: shared-file references of the SST files of an adopted native checkpoint
        self.adopted_shared: tuple[str, Mapping[str, Any]] | None = None

    @property
    def _db(self) -> rocksdict.Rdict:
        db = self._opened
        if db is None:
            if self._closed:  # never reopened (nor recreated) once closed
                raise StateBackendError(f"the RocksDB backend at {self.path} is closed")
            db = self._opened = self._open("cannot open RocksDB")
        return db

    def _open(self, what: str) -> rocksdict.Rdict:
        try:
            db = open_db(self.path, self.memory)
        except Exception as exc:
            raise StateBackendError(
                f"{what} at {self.path}: {exc}; check that the directory is writable and "
                f"not used by another process"
            ) from exc
        db.set_write_options(self._write_options)
        return db

    def _family(self, name: str) -> Any:
        cf = self._families.get(name)
        if cf is None:
            cf_name = _CF_PREFIX + name
            try:
                cf = self._db.get_column_family(cf_name)
            except Exception:
                cf = self._db.create_column_family(cf_name, db_options(self.memory))
            cf.set_write_options(self._write_options)
            self._families[name] = cf
        return cf

    def write_timers(
        self,
        name: str,
        changes: Iterable[tuple[bytes, list[tuple[bytes, bytes]]]],
        reset: bool = False,
    ) -> None:
        """Apply timer changes (``TimerQueue.take_changes``: an entry key with its
        entry, or with none when the timer is gone) to timer ``name``'s column family;
        ``reset`` empties it first (the changes then hold every timer)."""
        cf = self._timer_families.get(name)
        if cf is None:
            cf_name = TIMER_CF_PREFIX + name
            try:
                cf = self._db.get_column_family(cf_name)
            except Exception:
                cf = self._db.create_column_family(cf_name, db_options(self.memory))
            cf.set_write_options(self._write_options)
            self._timer_families[name] = cf
        if reset and next(iter(cf.keys()), None) is not None:
            cf.delete_range(b"", _END)
        self._write(cf, TIMER_CF_PREFIX + name,
                    {key: entries[0][1] if entries else None for key, entries in changes})

    def _write(self, family: Any, cf_name: str, entries: dict[bytes, bytes | None]) -> None:
        """Write ``entries`` (None: delete) to column family ``family`` (``cf_name``):
        in key order, by a write batch or an ingested file (``rocksdb_writes``)."""
        write_entries(self._db, family, cf_name, entries, self._write_options, self.memory,
                      self.path)

    def _register(self, table: _Table) -> _Table:
        self._tables[table.name] = table
        if self._tracking:
            table.track()
        return table

    def track_changes(self) -> None:
        """Start (or start over) recording what is written (``weir.state.rocksdb_changes``):
        the state as of now is the base that :meth:`take_changes` reports against."""
        self._tracking = True
        for table in self._tables.values():
            table.track()

    def take_changes(self) -> Iterator[tuple[str, Any]]:
        """Per state with changes since the last call (or :meth:`track_changes`): a
        value or list state's dict of prefixed key -> bytes written last (None:
        deleted), a map state's ``((prefixed key, its canonical entries now), ...)``
        (no entry: gone; read now). The record starts over."""
        for name, table in self._tables.items():
            if table.changed():
                yield name, table.take()

    def _writer(self, name: str) -> EntryWriter:
        """Writes dirty entries of state ``name`` in one batch (the entry cache's flush)."""

        def write(entries: dict[bytes, bytes | None]) -> None:
            self._write(self._family(name), _CF_PREFIX + name, entries)

        return write

    def flush(self) -> None:
        """Write every table's cached writes to RocksDB (done before anything reads
        RocksDB other than by one key; see ``weir.state.rocksdb_tables``)."""
        for table in self._tables.values():
            table.flush()

    def entry_count(self) -> int:
        """The keyed-state entries held now, as a snapshot holds them: one per key of a
        value or list state, one per (key, user key) of a map state, states restored
        and not registered yet included (timers are not keyed state). Exact; what it
        costs is in ``weir.state.rocksdb_tables`` ("Counting entries"): nothing per
        record on value and list states, a dict lookup per map write, and at a
        checkpoint at most a scan of the states written much since the last count.
        Expired TTL entries not yet dropped by a compaction filter count."""
        total = 0
        for name, cf in self._families.items():
            table = self._tables.get(name)
            if table is not None:
                total += table.entry_count()
                continue
            counted = self._counted.get(name)
            if counted is None:
                counted = self._counted[name] = count_keys(cf)
            total += counted
        return total

    def create_value_table(
        self, name: str, serializer: Serializer[Any], check_writes: bool = True
    ) -> ValueTable:
        return self._register(RocksValueTable(
            name, self.key_context, self._family(name), serializer, self._writer(name),
            self.memory.cache_entries))

    def create_list_table(
        self, name: str, serializer: Serializer[Any], check_writes: bool = True
    ) -> ListTable:
        return self._register(RocksListTable(
            name, self.key_context, self._family(name), serializer, self._writer(name),
            self.memory.cache_entries))

    def create_map_table(
        self,
        name: str,
        key_serializer: Serializer[Any],
        serializer: Serializer[Any],
        check_writes: bool = True,
    ) -> MapTable:
        return self._register(
            RocksMapTable(name, self.key_context, self._family(name), key_serializer, serializer))

    def migrate_restored(self, name: str, rewrite: Callable[[bytes], bytes]) -> None:
        if name in self._tables:
            raise StateError(f"state {name!r} is registered already: it cannot be migrated")
        cf = self._family(name)
        # (the iterator reads a snapshot of the column family: the rewritten entries
        # written over it in batches are not read again)
        self.restore_entries(name, ((k, rewrite(v)) for k, v in cf.items()))

    def restore_entries(self, name: str, entries: Iterable[tuple[bytes, bytes]]) -> None:
        cf = self._family(name)
        self._counted.pop(name, None)
        table = self._tables.get(name)
        if table is not None:  # written around the table: it must read RocksDB again
            table.flush()
            table.drop_cache()
        batch = rocksdict.WriteBatch(raw_mode=True)
        batch.set_default_column_family(self._db.get_column_family_handle(_CF_PREFIX + name))
        count = 0
        for key, data in entries:
            batch.put(key, data)
            count += 1
            if count % 10_000 == 0:
                self._db.write(batch, self._write_options)
                batch = rocksdict.WriteBatch(raw_mode=True)
                batch.set_default_column_family(
                    self._db.get_column_family_handle(_CF_PREFIX + name)
                )
        if count % 10_000:
            self._db.write(batch, self._write_options)
        del cf

    def snapshot_sources(self) -> Iterable[tuple[str, Iterable[tuple[bytes, bytes]]]]:
        # Every column family is opened through _family (tables and restores).
        self.flush()
        return [(name, cf.items()) for name, cf in self._families.items()]

    def frozen_sources(self) -> Iterable[tuple[str, Iterable[tuple[bytes, bytes]]]]:
        """A RocksDB snapshot per column family, with a copy of the table's cached
        writes laid over it: reads later see the state as of now. The writes stay
        cached (no flush: copying them is a dict copy; writing them to RocksDB, a
        write batch, took about 1 µs per entry in the task's thread)."""
        out: list[tuple[str, Iterable[tuple[bytes, bytes]]]] = []
        for name, cf in self._families.items():
            table = self._tables.get(name)
            dirty = table.dirty_copy() if table is not None else None
            stored = cf.snapshot().items()
            out.append((name, stored if not dirty else _overlaid(stored, dirty)))
        return out

    def native_checkpoint(self, target: str | Path) -> list[str]:
        """Write a native RocksDB checkpoint (memtables flushed, SST files hard-linked)
        into the new directory ``target``; returns the names of its files."""
        for name in list_column_families(self.path):
            self._family(name)
        self.flush()
        try:
            rocksdict.Checkpoint(self._db).create_checkpoint(str(target))
        except Exception as exc:
            raise StateBackendError(
                f"RocksDB at {self.path}: native checkpoint into {target} failed: {exc}; "
                f"check free disk space"
            ) from exc
        return sorted(os.listdir(target))

    def _is_empty(self) -> bool:
        return all(next(iter(cf.keys()), None) is None for cf in self._families.values())

    def restore_native(
        self, natives: Sequence[NativeRocksDBState]
    ) -> dict[str, list[tuple[bytes, bytes]]]:
        """Adopt the native checkpoint with the largest overlap as this backend's
        database and delete the key groups outside its range (range deletes, no
        per-key rewrite); copy the in-range keys of the others in write batches.
        Returns the timers mirrored in them: the adopted one's read from the adopted
        database (no second open of the checkpoint), the others' scanned."""
        timers: dict[str, list[tuple[bytes, bytes]]] = {}
        natives = [n for n in natives if len(n.key_group_range)]
        if not natives:
            return timers
        natives.sort(key=lambda n: len(n.key_group_range), reverse=True)
        rest = natives
        if not self._families or self._is_empty():
            base, rest = natives[0], natives[1:]
            self._adopt(base)
            for name, cf in self._timer_families.items():  # clipped to the range by _adopt
                timers[name] = list(cf.items())
        for name, entries in super().restore_native(rest).items():  # scanned, written
            timers.setdefault(name, []).extend(entries)
        return timers

    def _close_families(self) -> None:
        for cf in (*self._families.values(), *self._timer_families.values()):
            cf.close()
        self._families.clear()
        self._timer_families.clear()

    def _adopt(self, native: NativeRocksDBState) -> None:
        for table in self._tables.values():  # their state is replaced: forget it
            table.drop_cache()
        self._counted.clear()
        self._close_families()
        if self._opened is not None:
            self._opened.close()
            self._opened = None
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(native.path, self.path)
        self._opened = self._open("cannot open the restored RocksDB checkpoint")
        self.adopted_shared = native.shared
        low, high = _range_bounds(native.key_group_range)
        clip = [self._family(name) for name in list_column_families(self.path)]
        for name, table in self._tables.items():  # their handles were of the closed db
            table.rebind(self._family(name))
        for name in list_column_families(self.path, TIMER_CF_PREFIX):
            self.write_timers(name, ())
            clip.append(self._timer_families[name])
        for cf in clip:  # range deletes only where there are keys (no tombstone SSTs)
            it = cf.iter()
            it.seek_to_first()
            if low and it.valid() and it.key() < low:
                cf.delete_range(b"", low)
            it.seek(high)
            if it.valid():
                cf.delete_range(high, _END)
            del it

    def compact(self, filters: Mapping[str, EntryFilter]) -> int:
        dropped = 0
        for name, keep in filters.items():
            dropped += self.compact_step(name, None, sys.maxsize, keep)[1]
            self._family(name).compact_range(None, None)
        return dropped

    def compact_step(
        self, name: str, cursor: bytes | None, limit: int, keep: EntryFilter
    ) -> tuple[int, int, bytes | None]:
        cf = self._family(name)
        table = self._tables.get(name)
        if table is not None:  # the filter reads RocksDB and writes around the table
            table.flush()
        else:
            self._counted.pop(name, None)
        it = cf.iter()
        if cursor is None:
            it.seek_to_first()
        else:
            it.seek(cursor)
        visited = dropped = 0
        note = table.note if table is not None and self._tracking else None
        while it.valid():  # the iterator reads a snapshot: writes below do not move it
            key = it.key()
            if visited >= limit:
                return visited, dropped, key
            data = it.value()
            kept = keep(key, data)
            if kept is None:
                cf.delete(key)
                dropped += 1
            elif kept != data:
                cf.put(key, kept)
            if kept != data:
                if table is not None:
                    table.stored(key, kept)
                if note is not None:
                    note(key, kept)
            visited += 1
            it.next()
        return visited, dropped, None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Close column families before the database: a handle dropped after the
        # database closed stalls for a second in rocksdict when the WAL is off.
        self._close_families()
        if self._opened is not None:
            self._opened.close()
        if self._owns_path:
            shutil.rmtree(self.path, ignore_errors=True)
