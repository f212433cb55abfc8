"""The map-state table of the RocksDB backend: one entry per (key, user key), read and
written directly (no entry cache: a map's reads are prefix scans), with its entry count
kept as :mod:`weir.state.rocksdb_tables` describes (per key written since the last
count, its entries before the first write)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from weir.api.serializers import Serializer
from weir.api.state import MapState
from weir.state.backend import EntryFilter, MapTable, decode_checked, encode_checked, split_map_key
from weir.state.keycontext import KeyContext
from weir.state.rocksdb_tables import GET_COST, RocksTable, count_budget, count_keys, successor

__all__ = ["RocksMapTable"]


class RocksMapTable(RocksTable, MapTable, MapState[Any, Any]):
    is_map = True

    def __init__(
        self,
        name: str,
        ctx: KeyContext,
        cf: Any,
        key_serializer: Serializer[Any],
        serializer: Serializer[Any],
    ):
        super().__init__(name, ctx, cf, serializer)
        self._key_serializer = key_serializer
        #: the entries of the state when it was last counted (None: not known), and
        #: per key written since, its number of entries before its first write (None
        #: exactly when the count is not known); see "Counting entries"
        self._count: int | None = None
        self._before: dict[bytes, int] | None = None
        #: what the first writes' prefix scans may still cost before the count is given
        #: up (in scanned entries)
        self._count_budget = 0

    def _user_key(self, user_key: Any) -> bytes:
        return encode_checked(self.name, self._key_serializer, user_key)

    def get(self, user_key: Any, default: Any = None) -> Any:
        data = self._cf.get(self._current() + self._user_key(user_key))
        return default if data is None else self._decode(data)

    def put(self, user_key: Any, value: Any) -> None:
        key = self._current()
        before = self._before  # (inline: the hot write)
        if before is not None and key not in before:
            self._first_write(key)
        self._cf.put(key + self._user_key(user_key), self._encode(value))
        if self._touched is not None:  # (inline: the hot write)
            self._touched.add(key)

    def _will_write(self, key: bytes) -> None:
        """Call before writing any entry of prefixed key ``key``."""
        before = self._before
        if before is not None and key not in before:
            self._first_write(key)

    def _first_write(self, key: bytes, entries: int | None = None) -> None:
        """Keep ``key``'s number of entries before its first write since the count
        (``entries`` if known), or give the kept count up once it cost its budget."""
        before = self._before
        assert before is not None
        if entries is None:
            entries = self._prefix_count(key)
        # (its count now, at the next entry_count, costs about as much again)
        self._count_budget -= 2 * (GET_COST + entries)
        if self._count_budget < 0:
            self._count = self._before = None  # the next entry_count scans
            return
        before[key] = entries

    def _prefix_count(self, prefix: bytes) -> int:
        it = self._cf.iter()
        it.seek(prefix)
        n = 0
        while it.valid() and it.key().startswith(prefix):
            n += 1
            it.next()
        return n

    def entry_count(self) -> int:
        before, count = self._before, self._count
        if before is None or count is None:
            count = count_keys(self._cf)
        else:
            count += sum(self._prefix_count(key) - n for key, n in before.items())
        self._count, self._before = count, {}
        self._count_budget = count_budget(count)
        return count

    def drop_cache(self) -> None:
        # (RocksDB was written around the table, or replaced: count again)
        self._count = self._before = None

    def stored(self, key: bytes, data: bytes | None) -> None:
        # (a compaction filter rewrote or deleted an entry RocksDB held)
        if data is None and self._before is not None and self._count is not None:
            primary = split_map_key(key)[0]
            if primary not in self._before:  # (else its recount sees the delete)
                self._count -= 1

    def remove(self, user_key: Any) -> None:
        self.remove_at(self._current(), user_key)

    def contains(self, user_key: Any) -> bool:
        return self._cf.get(self._current() + self._user_key(user_key)) is not None

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(self.items_at(self._current()))

    def is_empty(self) -> bool:
        prefix = self._current()
        return next(self._scan(prefix), None) is None

    def clear(self) -> None:
        self.clear_at(self._current())

    def clear_at(self, key: bytes) -> None:
        self._will_write(key)
        self._touch(key)
        end = successor(key)
        if end is None:
            for composite, _ in list(self._scan(key)):
                self._cf.delete(composite)
        else:
            self._cf.delete_range(key, end)

    def keys_snapshot(self) -> list[bytes]:
        out: list[bytes] = []
        last = None
        for composite in self._cf.keys():  # noqa: SIM118 - Rdict iteration is not raw-mode safe
            if last is not None and composite.startswith(last):
                continue
            last = split_map_key(composite)[0]
            out.append(last)
        return out

    def _state_key(self, stored_key: bytes) -> bytes:
        return split_map_key(stored_key)[0]

    def filter_at(self, key: bytes, keep: EntryFilter) -> int:
        dropped = 0
        entries = list(self._scan(key))
        for composite, data in entries:
            if keep(composite, data) is None:
                if not dropped and self._before is not None and key not in self._before:
                    self._first_write(key, len(entries))
                self._cf.delete(composite)
                self._touch(key)
                dropped += 1
        return dropped

    def items_at(self, key: bytes) -> list[tuple[Any, Any]]:
        n = len(key)
        name, kser, decode = self.name, self._key_serializer, self._decode
        return [
            (decode_checked(name, kser, composite[n:]), decode(data))
            for composite, data in self._scan(key)
        ]

    def remove_at(self, key: bytes, user_key: Any) -> None:
        composite = key + self._user_key(user_key)
        self._will_write(key)
        self._cf.delete(composite)
        self._touch(key)

    def put_at(self, key: bytes, user_key: Any, value: Any) -> None:
        composite, data = key + self._user_key(user_key), self._encode(value)
        self._will_write(key)
        self._cf.put(composite, data)
        self._touch(key)
