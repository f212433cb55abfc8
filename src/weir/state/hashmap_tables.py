"""The hash-map backend's tables: one state's entries in a dict, with the C fast
paths of its per-record calls (``_hashcore.c``) and the Python methods that hold the
whole semantics (``_slow_*``), and the record of the keys written since the last
changelog snapshot (every key, or a sample: ``HashMapTable.track_changes``).
The backend that owns them is ``weir.state.hashmap``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from weir.api.serializers import MsgpackSerializer, Serializer
from weir.api.state import ListState, MapState, ValueState
from weir.errors import StateError
from weir.state._hashcore import (
    SAMPLE_MASK,
    ListCore,
    MapCore,
    TableCore,
    ValueCore,
    load_flat,
    load_values,
)
from weir.state.backend import (
    EncodedValues,
    ListTable,
    MapTable,
    ValueTable,
    WriteCheck,
    decode_checked,
    decode_error,
    encode_checked,
    frame,
    split_map_key,
    unframe,
)
from weir.state.keycontext import NO_KEY, KeyContext
from weir.state.packed import pairs

__all__ = ["SAMPLE_MASK", "SAMPLE_MIN_KEYS", "AnyTable", "HashMapListTable", "HashMapMapTable",
           "HashMapTable", "HashMapValueTable"]


def _no_check(value: Any) -> None:
    return None


#: sampled change tracking (``HashMapKeyedStateBackend.track_changes``): a key is in the
#: sample when its hash has none of the bits of ``SAMPLE_MASK`` (15: 1 in 16; defined in
#: ``_hashcore.c``, whose writes apply it), in a state of at least ``SAMPLE_MIN_KEYS``
#: keys (a sample of about 256 keys or more: a share written of 70% is estimated within
#: about 3 points, enough to choose between a base and a delta)
SAMPLE_MIN_KEYS = 4_096

#: Types whose objects cannot change in place: a snapshot may share them with live state.
_IMMUTABLE: frozenset[type] = frozenset({int, float, str, bytes, bool, type(None)})


class HashMapTable(TableCore):
    """The Python part of every hash-map table. The calls a record makes most
    (value/update, reducing/aggregating add, list get/add, map get/put) are C methods
    of ``ValueCore``, ``ListCore`` and ``MapCore`` (``_hashcore.c``); each handles only
    the common case and otherwise calls the ``_slow_`` method here of the same name,
    which holds the whole semantics."""

    _ctx: KeyContext

    def __init__(self, name: str, ctx: KeyContext, serializer: Serializer[Any], check: bool):
        self.name = name
        self._ctx = ctx
        self._serializer = serializer
        if check:
            self._check: Any = WriteCheck(name, serializer)
            self._ok = self._check.ok_types
        else:  # the TTL layer checks user values; stored values are (value, ts) tuples
            self._check = _no_check
            self._ok = {tuple}
        self._data: dict[bytes, Any] = {}
        #: types of values loaded from snapshots (never passed through the write check)
        self._loaded_types: set[type] = set()
        #: prefixed keys written since the last ``take_changes`` (None: not tracked)
        self._dirty = None

    def load(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        raise NotImplementedError

    def load_flat(self, flat: list[bytes]) -> None:
        """:meth:`load` of ``[key0, raw0, key1, raw1, ...]`` (a restore's unpacked form)."""
        self.load(pairs(flat))

    def _values_immutable(self) -> bool:
        return self._check is not _no_check and (self._ok | self._loaded_types) <= _IMMUTABLE

    def freeze(self) -> Iterable[tuple[bytes, bytes]]:
        """Entries as of now, unaffected by later writes (see ``frozen_sources``)."""
        raise NotImplementedError

    def keys_snapshot(self) -> list[bytes]:
        return list(self._data)

    def clear_at(self, key: bytes) -> None:
        self._data.pop(key, None)
        self._mark(key)

    def written_estimate(self) -> int:
        """The keys written since the record started over: counted exactly, estimated
        from the sample (the exact part as counted when the record turned sampled at
        its limit)."""
        dirty = self._dirty
        if not dirty:
            return 0
        scale = self._sample_mask + 1
        limit = self._dirty_limit
        if limit and self._sample_mask:  # exact up to the limit, sampled after it
            return limit + max(0, len(dirty) - limit) * scale
        return len(dirty) * scale

    def track_changes(self, sample_mask: int = 0, dirty_limit: int = 0) -> None:
        """Record the writes from now on (for changelog snapshots): every key written,
        or with ``sample_mask`` only the keys whose hash has none of its bits (the
        share of keys written can be estimated; which keys changed is unknown once
        any is written: ``changes_known``). ``dirty_limit`` (exact records only): at
        that many keys recorded, only the sample is recorded from then on."""
        self._dirty, self._writes, self._sample_mask = set(), 0, sample_mask
        self._dirty_limit = dirty_limit

    def changes_known(self) -> bool:
        """Whether :meth:`take_changes` can report every change since it last ran."""
        return not self._sample_mask or not self._writes

    def take_changes(self) -> Iterator[tuple[bytes, Iterable[tuple[bytes, bytes]]]]:
        """``(prefixed key, its canonical entries now)`` of every key written since the
        last call (no entry: deleted); the record starts over (sampled as it was)."""
        if not self.changes_known():
            raise StateError(
                f"state {self.name!r}: only a sample of the keys written was tracked "
                f"({self._writes} writes): the changes are unknown; write a full snapshot"
            )
        dirty = self._dirty or set()
        self.track_changes(self._sample_mask, self._dirty_limit)
        entries = self.entries_at
        for key in dirty:
            yield key, entries(key)

    def entries_at(self, key: bytes) -> list[tuple[bytes, bytes]]:
        """The canonical snapshot entries of one prefixed key (empty if absent)."""
        raise NotImplementedError

    def entry_count(self) -> int:
        """The number of canonical snapshot entries this table holds now (a value or
        list state: its keys; a map state: its (key, user key) entries)."""
        raise NotImplementedError

    def _key_error(self, exc: TypeError) -> Exception:
        if self._ctx.key_bytes is NO_KEY:
            return self._ctx.no_key_error(f"state {self.name!r}")
        return exc


class HashMapValueTable(ValueCore, HashMapTable, ValueTable, ValueState[Any]):
    def _slow_value(self) -> Any:
        try:
            return self._data.get(self._ctx.key_bytes)
        except TypeError as exc:
            raise self._key_error(exc) from None

    def _slow_update(self, value: Any) -> None:
        if type(value) not in self._ok:
            if value is None:
                self.clear()
                return
            self._check(value)
        try:
            key = self._ctx.key_bytes
            self._data[key] = value
        except TypeError as exc:
            raise self._key_error(exc) from None
        self._mark(key)

    def _slow_reduce_add(self, function: Any, value: Any) -> None:
        """Reducing state without TTL: store ``function(current, value)`` (or
        ``value``) in one lookup."""
        data = self._data
        try:
            key = self._ctx.key_bytes
            current = data.get(key)
        except TypeError as exc:
            raise self._key_error(exc) from None
        result = value if current is None else function(current, value)
        if type(result) not in self._ok:
            self._check(result)
        data[key] = result
        self._mark(key)

    def _slow_aggregate_add(self, add: Any, create: Any, value: Any) -> None:
        """Aggregating state without TTL: store ``add(value, accumulator)`` in one
        lookup, starting from ``create()``."""
        data = self._data
        try:
            key = self._ctx.key_bytes
            current = data.get(key)
        except TypeError as exc:
            raise self._key_error(exc) from None
        result = add(value, create() if current is None else current)
        if type(result) not in self._ok:
            self._check(result)
        data[key] = result
        self._mark(key)

    def clear(self) -> None:
        # _current checks the key: dict.pop on an empty dict would not notice NO_KEY
        self.clear_at(self._current())

    def value_at(self, key: bytes) -> Any:
        return self._data.get(key)

    def entry_count(self) -> int:
        """Snapshot entries held: one per key (a dict's length)."""
        return len(self._data)

    def update_at(self, key: bytes, value: Any) -> None:
        self._data[key] = value
        self._mark(key)

    def entries_at(self, key: bytes) -> list[tuple[bytes, bytes]]:
        value = self._data.get(key)
        return [] if value is None else [(key, self._encode(value))]

    def snapshot_entries(self) -> Iterable[tuple[bytes, bytes]]:
        return EncodedValues(self.name, self._serializer, self._data)

    def freeze(self) -> Iterable[tuple[bytes, bytes]]:
        if not self._values_immutable():
            return list(self.snapshot_entries())
        return EncodedValues(self.name, self._serializer, self._data.copy())

    def load(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        self._load_with(load_values, entries)

    def load_flat(self, flat: list[bytes]) -> None:
        self._load_with(load_flat, flat)

    def _load_with(self, loader: Any, entries: Any) -> None:
        # in C (a restore decodes every entry): the default serializer's scalars
        # decoded there, any other value by the serializer's decode; a failure is
        # reported as decode_checked does
        serializer = self._serializer
        try:
            loader(self._data, entries, serializer.decode,
                   type(serializer) is MsgpackSerializer, self._loaded_types)
        except Exception as exc:
            raise decode_error(self.name, serializer, exc) from exc


class HashMapListTable(ListCore, HashMapTable, ListTable, ListState[Any]):
    def __init__(self, name: str, ctx: KeyContext, serializer: Serializer[Any], check: bool):
        super().__init__(name, ctx, serializer, check)
        self._inline = serializer.inline_in_msgpack_array

    def _slow_get(self) -> list[Any]:
        try:
            stored = self._data.get(self._ctx.key_bytes)
        except TypeError as exc:
            raise self._key_error(exc) from None
        return [] if stored is None else stored[:]

    def _slow_add(self, value: Any) -> None:
        if type(value) not in self._ok:
            if value is None:
                raise StateError(f"list state {self.name!r}: cannot add None")
            self._check(value)
        data = self._data
        try:
            key = self._ctx.key_bytes
            stored = data.get(key)
        except TypeError as exc:
            raise self._key_error(exc) from None
        if stored is None:
            data[key] = [value]
        else:
            stored.append(value)
        self._mark(key)

    def add_all(self, values: Iterable[Any]) -> None:
        values = self._checked(values)
        if values:
            key = self._current()
            self._data.setdefault(key, []).extend(values)
            self._mark(key)

    def update(self, values: Iterable[Any]) -> None:
        self.update_at(self._current(), self._checked(values))

    def clear(self) -> None:
        self.clear_at(self._current())

    def _checked(self, values: Iterable[Any]) -> list[Any]:
        out = list(values)
        for value in out:
            if value is None:
                raise StateError(f"list state {self.name!r}: cannot add None")
            self._check(value)
        return out

    def get_at(self, key: bytes) -> list[Any]:
        return list(self._data.get(key, ()))

    def entry_count(self) -> int:
        """Snapshot entries held: one per key, whatever its number of elements."""
        return len(self._data)

    def update_at(self, key: bytes, values: list[Any]) -> None:
        if values:
            self._data[key] = list(values)
        else:
            self._data.pop(key, None)
        self._mark(key)

    def entries_at(self, key: bytes) -> list[tuple[bytes, bytes]]:
        values = self._data.get(key)
        if not values:
            return []
        encode = self._encode
        return [(key, frame([encode(v) for v in values], self._inline))]

    def snapshot_entries(self) -> Iterator[tuple[bytes, bytes]]:
        encode = self._encode
        for key, values in self._data.items():
            yield key, frame([encode(v) for v in values], self._inline)

    def freeze(self) -> Iterable[tuple[bytes, bytes]]:
        if not self._values_immutable():
            return list(self.snapshot_entries())
        copy = {key: values[:] for key, values in self._data.items()}
        encode, inline = self._encode, self._inline
        return ((key, frame([encode(v) for v in values], inline)) for key, values in copy.items())

    def load(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        for key, data in entries:
            if self._inline:
                values = self._decode(data)
            else:
                values = [self._decode(e) for e in unframe(data)]
            self._data.setdefault(key, []).extend(values)
            self._loaded_types.update(map(type, values))


class HashMapMapTable(MapCore, HashMapTable, MapTable, MapState[Any, Any]):
    """Entries are stored as ``identity -> (user_key, value)``. The identity of a user
    key is the key itself for ``str`` and ``(int, k)`` for ``int``, else its encoded
    bytes, so keys equal in Python but encoded differently (``1``, ``True``, ``1.0``)
    stay distinct entries, exactly as on RocksDB and in snapshots."""

    def __init__(
        self,
        name: str,
        ctx: KeyContext,
        key_serializer: Serializer[Any],
        serializer: Serializer[Any],
        check: bool,
    ):
        super().__init__(name, ctx, serializer, check)
        self._key_serializer = key_serializer
        self._key_check = WriteCheck(name, key_serializer)
        self._key_ok = self._key_check.ok_types

    def _identity(self, user_key: Any) -> Any:
        if type(user_key) is int:
            return (int, user_key)
        return encode_checked(self.name, self._key_serializer, user_key)

    def _slow_get(self, user_key: Any, default: Any = None) -> Any:
        try:
            entries = self._data.get(self._ctx.key_bytes)
        except TypeError as exc:
            raise self._key_error(exc) from None
        if entries is None:
            return default
        kind = type(user_key)
        pair = entries.get(
            user_key if kind is str else (int, user_key) if kind is int
            else self._identity(user_key)
        )
        return default if pair is None else pair[1]

    def _slow_put(self, user_key: Any, value: Any) -> None:
        if type(user_key) not in self._key_ok:
            self._key_check(user_key)
        if type(value) not in self._ok:
            self._check(value)
        data = self._data
        try:
            key = self._ctx.key_bytes
            entries = data.get(key)
        except TypeError as exc:
            raise self._key_error(exc) from None
        kind = type(user_key)
        identity = (
            user_key if kind is str else (int, user_key) if kind is int
            else self._identity(user_key)
        )
        if entries is None:
            data[key] = {identity: (user_key, value)}
        else:
            entries[identity] = (user_key, value)
        self._mark(key)

    def remove(self, user_key: Any) -> None:
        self.remove_at(self._current(), user_key)

    def contains(self, user_key: Any) -> bool:
        entries = self._data.get(self._current())
        if entries is None:
            return False
        return (user_key if type(user_key) is str else self._identity(user_key)) in entries

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(self.items_at(self._current()))

    def is_empty(self) -> bool:
        return not self._data.get(self._current())

    def clear(self) -> None:
        self.clear_at(self._current())

    def items_at(self, key: bytes) -> list[tuple[Any, Any]]:
        entries = self._data.get(key)
        return list(entries.values()) if entries else []

    def entry_count(self) -> int:
        """Snapshot entries held: one per (key, user key) — the sizes of the keys'
        dicts, summed in C (memory bound: 40-150 ns a key measured)."""
        return sum(map(len, self._data.values()))

    def remove_at(self, key: bytes, user_key: Any) -> None:
        entries = self._data.get(key)
        if entries is not None:
            entries.pop(user_key if type(user_key) is str else self._identity(user_key), None)
            if not entries:
                del self._data[key]
            self._mark(key)

    def put_at(self, key: bytes, user_key: Any, value: Any) -> None:
        identity = user_key if type(user_key) is str else self._identity(user_key)
        self._data.setdefault(key, {})[identity] = (user_key, value)
        self._mark(key)

    def entries_at(self, key: bytes) -> list[tuple[bytes, bytes]]:
        entries = self._data.get(key)
        if not entries:
            return []
        encode, name, kser = self._encode, self.name, self._key_serializer
        return [(key + encode_checked(name, kser, user_key), encode(value))
                for user_key, value in entries.values()]

    def snapshot_entries(self) -> Iterator[tuple[bytes, bytes]]:
        encode, name, kser = self._encode, self.name, self._key_serializer
        for key, entries in self._data.items():
            for user_key, value in entries.values():
                yield key + encode_checked(name, kser, user_key), encode(value)

    def freeze(self) -> Iterable[tuple[bytes, bytes]]:
        if not self._values_immutable():
            return list(self.snapshot_entries())
        copy = {key: entries.copy() for key, entries in self._data.items()}
        encode, name, kser = self._encode, self.name, self._key_serializer
        return (
            (key + encode_checked(name, kser, user_key), encode(value))
            for key, entries in copy.items()
            for user_key, value in entries.values()
        )

    def load(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        name, kser = self.name, self._key_serializer
        for composite, data in entries:
            key, user_key_bytes = split_map_key(composite)
            value = self._decode(data)
            self._loaded_types.add(type(value))
            self.put_at(key, decode_checked(name, kser, user_key_bytes), value)


AnyTable = HashMapValueTable | HashMapListTable | HashMapMapTable
