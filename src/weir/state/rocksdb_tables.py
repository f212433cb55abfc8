"""The tables of the RocksDB backend: one column family per state, bytes in and out.

Value and list states store one entry per key (a list as one framed value, appended
to in place); a map state stores one entry per (key, user key), the user key's
canonical bytes appended to the prefixed key. Keys and values are laid out exactly as
in the canonical snapshot form (``weir.state.backend``). The backend that owns the
column families is ``weir.state.rocksdb``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from weir.api.serializers import Serializer
from weir.api.state import ListState, MapState, ValueState
from weir.errors import StateError
from weir.state.backend import (
    EntryFilter,
    ListTable,
    MapTable,
    ValueTable,
    decode_checked,
    encode_checked,
    frame,
    frame_append,
    frame_items,
    split_map_key,
    unframe,
)
from weir.state.keycontext import KeyContext
from weir.state.rocksdb_changes import ChangeRecord

__all__ = ["RocksListTable", "RocksMapTable", "RocksValueTable", "successor"]


def successor(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class _RocksTable(ChangeRecord):
    def __init__(self, name: str, ctx: KeyContext, cf: Any, serializer: Serializer[Any]):
        self.name = name
        self._ctx = ctx
        self._cf = cf
        self._serializer = serializer

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

    def clear_at(self, key: bytes) -> None:
        self._delete(key)

    def filter_at(self, key: bytes, keep: EntryFilter) -> int:
        """Apply a bytes-level filter to one key's stored bytes without decoding
        values (TTL cleanup); returns the number of entries changed or dropped."""
        data = self._cf.get(key)
        if data is None:
            return 0
        kept = keep(key, data)
        if kept is None:
            self._delete(key)
        elif kept != data:
            self._put(key, kept)
        else:
            return 0
        return 1


class RocksValueTable(_RocksTable, ValueTable, ValueState[Any]):
    def value(self) -> Any:
        data = self._cf.get(self._current())
        return None if data is None else self._decode(data)

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
        else:
            key, data = self._current(), self._encode(value)
            self._cf.put(key, data)
            if self._written is not None:  # (inline: the hot write)
                self._written[key] = data

    def clear(self) -> None:
        self._delete(self._current())

    def value_at(self, key: bytes) -> Any:
        data = self._cf.get(key)
        return None if data is None else self._decode(data)

    def update_at(self, key: bytes, value: Any) -> None:
        self._put(key, self._encode(value))


class RocksListTable(_RocksTable, ListTable, ListState[Any]):
    def __init__(self, name: str, ctx: KeyContext, cf: Any, serializer: Serializer[Any]):
        super().__init__(name, ctx, cf, serializer)
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
        data = frame_append(self._cf.get(key), items, count)
        self._cf.put(key, data)
        if self._written is not None:  # (inline: the hot write)
            self._written[key] = data

    def add_all(self, values: Iterable[Any]) -> None:
        key = self._current()
        items, count = self._frame_checked(values)
        if count:
            self._put(key, frame_append(self._cf.get(key), items, count))

    def update(self, values: Iterable[Any]) -> None:
        key = self._current()
        items, count = self._frame_checked(values)
        if count:
            self._put(key, frame_append(None, items, count))
        else:
            self._delete(key)

    def clear(self) -> None:
        self._delete(self._current())

    def get_at(self, key: bytes) -> list[Any]:
        data = self._cf.get(key)
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
            self._put(key, frame((self._encode(v) for v in values), self._inline))
        else:
            self._delete(key)


class RocksMapTable(_RocksTable, MapTable, MapState[Any, Any]):
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

    def _user_key(self, user_key: Any) -> bytes:
        return encode_checked(self.name, self._key_serializer, user_key)

    def get(self, user_key: Any, default: Any = None) -> Any:
        data = self._cf.get(self._current() + self._user_key(user_key))
        return default if data is None else self._decode(data)

    def put(self, user_key: Any, value: Any) -> None:
        key = self._current()
        self._cf.put(key + self._user_key(user_key), self._encode(value))
        if self._touched is not None:  # (inline: the hot write)
            self._touched.add(key)

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
        for composite, data in list(self._scan(key)):
            if keep(composite, data) is None:
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
        self._cf.delete(key + self._user_key(user_key))
        self._touch(key)

    def put_at(self, key: bytes, user_key: Any, value: Any) -> None:
        self._cf.put(key + self._user_key(user_key), self._encode(value))
        self._touch(key)
