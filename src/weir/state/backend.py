"""The keyed-state backend interface: storage of keyed state, by prefixed key.

A backend stores, per registered state name, entries addressed by the *prefixed
key* of ``weir.state.keycontext`` (2 bytes of key group + canonical key bytes). It
knows nothing of TTL, reducing or aggregating functions: those wrap the tables it
creates (``weir.state.ttl``, ``weir.state.keyed``). Three table shapes exist:

* value table — one value per key (value, reducing, aggregating state);
* list table — a list of elements per key;
* map table — a map of user keys to values per key.

Tables implement the public state interfaces directly (so a state without TTL costs
one method call), plus ``*_at(prefixed_key)`` variants used for iteration, TTL
cleanup and restore. Values pass through the state's serializer when the backend
needs bytes: the RocksDB backend on every write, the hash-map backend only when it
snapshots (live values are Python objects, as in Flink's heap backend).

Snapshot entries — the canonical, backend-independent form of keyed state
(``KeyedStateSnapshot``), identical for both backends:

* value table: ``(prefixed_key, value_bytes)``
* list table:  ``(prefixed_key, frame(element_bytes...))`` where ``frame`` is a
  msgpack array32 (``0xdd``, ``uint32_be(count)``) with one item per element: the
  element's msgpack encoding itself when the serializer is msgpack
  (``inline_in_msgpack_array``), else a msgpack ``bin`` holding the encoded element.
  Appending patches the count; reading a msgpack list is one C-level unpack
* map table:   ``(prefixed_key + user_key_bytes, value_bytes)``
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

import msgpack

from weir.api.serializers import (
    _FLOAT64,
    _INT64,
    FloatSerializer,
    IntSerializer,
    MsgpackSerializer,
    Serializer,
)
from weir.errors import StateError, StateSerializationError
from weir.state.keycontext import NO_KEY, KeyContext
from weir.state.packed import pairs
from weir.state.snapshot import NativeRocksDBState

__all__ = [
    "EntryFilter",
    "KeyedStateBackend",
    "ListTable",
    "MapTable",
    "ValueTable",
    "WriteCheck",
    "frame",
    "split_map_key",
    "unframe",
]

#: ``(key, value_bytes) -> new value bytes or None to drop``; applied to snapshot
#: and compaction entries (TTL cleanup), never on the processing path.
EntryFilter = Callable[[bytes, bytes], bytes | None]


_ARRAY32 = b"\xdd"
_pack_bin = msgpack.Packer(use_bin_type=True).pack


def frame(elements: Iterable[bytes], inline: bool = False) -> bytes:
    """List elements (already encoded) as a msgpack array32 (see the module doc)."""
    items, count = frame_items(elements, inline)
    return _ARRAY32 + count.to_bytes(4, "big") + items


def frame_items(elements: Iterable[bytes], inline: bool = False) -> tuple[bytes, int]:
    """The framed items of ``elements`` without the array header, and their count:
    what :func:`frame_append` adds to an existing frame."""
    items = list(elements) if inline else [_pack_bin(e) for e in elements]
    return b"".join(items), len(items)


def frame_append(framed: bytes | None, items: bytes, count: int) -> bytes:
    """``framed`` (or an empty list) with ``count`` more framed ``items`` appended."""
    if framed is None:
        return _ARRAY32 + count.to_bytes(4, "big") + items
    total = int.from_bytes(framed[1:5], "big") + count
    return _ARRAY32 + total.to_bytes(4, "big") + framed[5:] + items


def unframe(data: bytes) -> list[bytes]:
    """Inverse of :func:`frame` for bin items (serializers that are not inline)."""
    if data[:1] != _ARRAY32:
        raise StateSerializationError("list state bytes do not start with a msgpack array32")
    return msgpack.unpackb(data, raw=False)  # type: ignore[no-any-return]


def split_map_key(key: bytes) -> tuple[bytes, bytes]:
    """Split ``prefixed_key + user_key_bytes`` (canonical keys are prefix-free)."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(key[2:])
    unpacker.skip()
    end = 2 + unpacker.tell()
    return key[:end], key[end:]


class WriteCheck:
    """Checks at write time that a value's type can be encoded by the state's
    serializer, encoding the first value of every type once. Backends that keep
    objects (hash map) use it so a bad value fails where it is written, not at the
    next snapshot."""

    __slots__ = ("name", "ok_types", "serializer")

    def __init__(self, name: str, serializer: Serializer[Any]) -> None:
        self.name = name
        self.serializer = serializer
        #: Types already shown encodable; hot paths test membership inline.
        self.ok_types: set[type] = set()

    def __call__(self, value: Any) -> None:
        if type(value) in self.ok_types:
            return
        encode_checked(self.name, self.serializer, value)
        self.ok_types.add(type(value))


def encode_checked(name: str, serializer: Serializer[Any], value: Any) -> bytes:
    """``serializer.encode(value)`` with failures reported as StateSerializationError."""
    try:
        return serializer.encode(value)
    except StateSerializationError:
        raise
    except Exception as exc:
        raise StateSerializationError(
            f"state {name!r}: a value of type {type(value).__name__} cannot be encoded by "
            f"{type(serializer).__name__} ({exc}); give the descriptor a serializer for this "
            f"type (e.g. serializer=weir.PickleSerializer())"
        ) from exc


#: values encoded per step of :class:`EncodedValues` (bounds the encoded bytes held)
_ENCODE_CHUNK = 1 << 14


class EncodedValues:
    """``(key, encoded value)`` of every entry of ``values`` (a hash-map table's dict,
    or a frozen copy of it), in its order, each time it is iterated; the same bytes as
    :func:`encode_checked` per value. The values passed the table's ``WriteCheck``, so
    their types are ones the serializer accepted: the fixed-width serializers run as
    their bare packers, ``_ENCODE_CHUNK`` values at a time by ``map`` (a snapshot's hot
    loop: a third of the per-entry cost of calling ``encode_checked``). A value that
    still cannot be encoded (an int beyond 64 bits) is encoded again through
    ``encode_checked`` for its typed error.

    ``fixed``: 0 if the serializer is ``IntSerializer``, 1 if ``FloatSerializer``, 2 if
    ``MsgpackSerializer`` (C packs its scalars: None, bool, int, float, str, bytes), else
    None — :func:`weir.state.packed.pack_sources` then packs ``values`` in C without
    encoding each value in Python (``pack_fixed``), to the same bytes; a state with a
    value C does not pack goes the general way."""

    __slots__ = ("fixed", "name", "serializer", "values")

    def __init__(self, name: str, serializer: Serializer[Any], values: Mapping[bytes, Any]
                 ) -> None:
        self.name, self.serializer, self.values = name, serializer, values
        kind = type(serializer)
        self.fixed = (0 if kind is IntSerializer else 1 if kind is FloatSerializer
                      else 2 if kind is MsgpackSerializer else None)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        serializer, values = self.serializer, self.values
        encode: Callable[[Any], bytes] = (
            _INT64.pack if self.fixed == 0
            else _FLOAT64.pack if self.fixed == 1  # (ints too, as its encode)
            else serializer.encode
        )
        keys, rest = iter(values), iter(values.values())
        while chunk := list(islice(rest, _ENCODE_CHUNK)):
            try:
                encoded = list(map(encode, chunk))
            except Exception:
                encoded = [encode_checked(self.name, serializer, v) for v in chunk]
            yield from zip(list(islice(keys, len(chunk))), encoded, strict=True)


def decode_checked(name: str, serializer: Serializer[Any], data: bytes) -> Any:
    """``serializer.decode(data)`` with failures reported as StateSerializationError."""
    try:
        return serializer.decode(data)
    except Exception as exc:
        raise decode_error(name, serializer, exc) from exc


def decode_error(name: str, serializer: Serializer[Any], exc: Exception
                 ) -> StateSerializationError:
    """The error of state ``name``'s stored bytes that ``serializer`` failed to
    decode with ``exc``."""
    return StateSerializationError(
        f"state {name!r}: stored bytes cannot be decoded by {type(serializer).__name__} "
        f"({type(exc).__name__}: {exc})"
    )


class _Table(ABC):
    """Common part of the three table shapes, on every backend: a state's name, the
    key context and the serializer of its values."""

    name: str
    _ctx: KeyContext
    _serializer: Serializer[Any]

    def _current(self) -> bytes:
        """The current prefixed key; NoKeyContextError without one."""
        key = self._ctx.key_bytes
        if key is NO_KEY:
            raise self._ctx.no_key_error(f"state {self.name!r}")
        return key  # type: ignore[no-any-return]

    def _encode(self, value: Any) -> bytes:
        return encode_checked(self.name, self._serializer, value)

    def _decode(self, data: bytes) -> Any:
        return decode_checked(self.name, self._serializer, data)

    @abstractmethod
    def keys_snapshot(self) -> list[bytes]:
        """The prefixed keys that currently have state (a list: safe to mutate while
        walking it)."""

    @abstractmethod
    def clear_at(self, key: bytes) -> None:
        """Remove the state of one prefixed key."""

    def keys_page(self, cursor: Any, limit: int) -> tuple[list[bytes], Any]:
        """Up to ``limit`` prefixed keys starting at ``cursor`` (None: the beginning),
        and the cursor of the next page (None once the end is reached). Used by
        incremental TTL cleanup, which walks a state a few keys at a time."""
        keys, pos = cursor if cursor is not None else (self.keys_snapshot(), 0)
        page = keys[pos : pos + limit]
        pos += limit
        return page, ((keys, pos) if pos < len(keys) else None)


class ValueTable(_Table):
    """One stored value per key. Implements ``value``/``update``/``clear`` for the
    current key (``weir.api.state.ValueState``)."""

    @abstractmethod
    def value(self) -> Any:
        """The current key's stored value, or None."""

    @abstractmethod
    def update(self, value: Any) -> None:
        """Store a value for the current key (None clears)."""

    @abstractmethod
    def clear(self) -> None:
        """Remove the current key's value."""

    @abstractmethod
    def value_at(self, key: bytes) -> Any:
        """The stored value of a prefixed key, or None."""

    @abstractmethod
    def update_at(self, key: bytes, value: Any) -> None:
        """Store a value for a prefixed key."""


class ListTable(_Table):
    """A list of stored elements per key (``weir.api.state.ListState``)."""

    @abstractmethod
    def get(self) -> list[Any]:
        """The current key's elements (a new list)."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Append one element."""

    @abstractmethod
    def add_all(self, values: Iterable[Any]) -> None:
        """Append elements."""

    @abstractmethod
    def update(self, values: Iterable[Any]) -> None:
        """Replace the elements."""

    @abstractmethod
    def clear(self) -> None:
        """Remove the current key's list."""

    @abstractmethod
    def get_at(self, key: bytes) -> list[Any]:
        """The elements of a prefixed key."""

    @abstractmethod
    def update_at(self, key: bytes, values: list[Any]) -> None:
        """Replace the elements of a prefixed key (empty list clears)."""


class MapTable(_Table):
    """A map per key (``weir.api.state.MapState``)."""

    @abstractmethod
    def get(self, user_key: Any, default: Any = None) -> Any:
        """The stored value under ``user_key`` or ``default``."""

    @abstractmethod
    def put(self, user_key: Any, value: Any) -> None:
        """Store a value under ``user_key``."""

    @abstractmethod
    def remove(self, user_key: Any) -> None:
        """Remove ``user_key``."""

    @abstractmethod
    def contains(self, user_key: Any) -> bool:
        """Whether ``user_key`` is present."""

    @abstractmethod
    def items(self) -> Iterator[tuple[Any, Any]]:
        """The current key's entries."""

    @abstractmethod
    def is_empty(self) -> bool:
        """Whether the current key's map is empty."""

    @abstractmethod
    def clear(self) -> None:
        """Remove the current key's map."""

    @abstractmethod
    def items_at(self, key: bytes) -> list[tuple[Any, Any]]:
        """The entries of a prefixed key."""

    @abstractmethod
    def remove_at(self, key: bytes, user_key: Any) -> None:
        """Remove one entry of a prefixed key."""

    @abstractmethod
    def put_at(self, key: bytes, user_key: Any, value: Any) -> None:
        """Store one entry of a prefixed key."""


class KeyedStateBackend(ABC):
    """Storage for the keyed state of one operator subtask (one key-group range)."""

    #: ``"hashmap"`` or ``"rocksdb"``
    name: str = ""
    #: entries a full snapshot packs per call while holding the GIL
    #: (``weir.state.packed.pack_sources``)
    snapshot_chunk: int = 16384

    def __init__(self, key_context: KeyContext) -> None:
        self.key_context = key_context

    @abstractmethod
    def create_value_table(
        self, name: str, serializer: Serializer[Any], check_writes: bool = True
    ) -> ValueTable:
        """The value table of state ``name``, holding data restored for it, if any."""

    @abstractmethod
    def create_list_table(
        self, name: str, serializer: Serializer[Any], check_writes: bool = True
    ) -> ListTable:
        """The list table of state ``name``."""

    @abstractmethod
    def create_map_table(
        self,
        name: str,
        key_serializer: Serializer[Any],
        serializer: Serializer[Any],
        check_writes: bool = True,
    ) -> MapTable:
        """The map table of state ``name``."""

    @abstractmethod
    def restore_entries(self, name: str, entries: Iterable[tuple[bytes, bytes]]) -> None:
        """Add snapshot entries (already clipped to this backend's key-group range)."""

    def restore_flat(self, name: str, flat: list[bytes]) -> None:
        """:meth:`restore_entries` of ``[key0, raw0, key1, raw1, ...]``, the form a
        restore unpacks a data file's key group into (the hash map loads it without a
        tuple per entry)."""
        self.restore_entries(name, pairs(flat))

    @abstractmethod
    def migrate_restored(self, name: str, rewrite: Callable[[bytes], bytes]) -> None:
        """Rewrite the value bytes of every restored entry of state ``name`` (a state
        migration, ``weir.state.migration``), before a table of it is created."""

    @abstractmethod
    def snapshot_sources(self) -> Iterable[tuple[str, Iterable[tuple[bytes, bytes]]]]:
        """``(state name, canonical entries)`` of every state, including states
        restored but never registered."""

    def frozen_sources(self) -> Iterable[tuple[str, Iterable[tuple[bytes, bytes]]]]:
        """Like :meth:`snapshot_sources`, but unaffected by writes made after this call
        returns: the synchronous part of an asynchronous snapshot. The default
        materializes every entry; backends override it with something cheaper."""
        return [(name, list(entries)) for name, entries in self.snapshot_sources()]

    def track_changes(self) -> None:
        """Start recording which keys are written (changelog snapshots): the state as
        of now is the base that :meth:`take_changes` reports changes against. The
        hash-map and RocksDB backends record changes."""
        raise StateError(f"the {self.name} backend does not record changes; changelog "
                         f"snapshots need the hash-map or RocksDB backend")

    def take_changes(
        self,
    ) -> Iterable[tuple[str, Iterable[tuple[bytes, Iterable[tuple[bytes, bytes]]]]]]:
        """Per state with changes since the last call: ``(name, ((prefixed key, its
        canonical entries now — none if deleted), ...))``, or ``(name, {prefixed key:
        its one canonical value now, or None if deleted})`` for a state of one entry
        per key; the record starts over."""
        raise StateError(f"the {self.name} backend does not record changes")

    def restore_native(
        self, natives: Sequence[NativeRocksDBState]
    ) -> dict[str, list[tuple[bytes, bytes]]]:
        """Load native RocksDB checkpoints (downloaded, already clipped to this backend's
        range by their ``key_group_range``); returns the timers mirrored in them (timer
        name -> entries in range). The default scans them into canonical entries; the
        RocksDB backend adopts one as its database instead."""
        from weir.state.rocksdb import TIMER_CF_PREFIX, scan_native

        timers: dict[str, list[tuple[bytes, bytes]]] = {}
        for native in natives:
            for name, entries in scan_native(native, TIMER_CF_PREFIX):
                timers.setdefault(name, []).extend(entries)
            for name, entries in scan_native(native):
                self.restore_entries(name, entries)
            shutil.rmtree(native.path, ignore_errors=True)
        return timers

    def compact(self, filters: Mapping[str, EntryFilter]) -> int:
        """Run compaction with ``filters`` as compaction filters; returns the number of
        entries dropped. Only the RocksDB backend compacts."""
        return 0

    def compact_step(
        self, name: str, cursor: bytes | None, limit: int, keep: EntryFilter
    ) -> tuple[int, int, bytes | None]:
        """Apply the compaction filter ``keep`` to at most ``limit`` stored entries of
        state ``name``, from the key ``cursor`` on (None: the first): the bounded,
        resumable form of :meth:`compact` for background TTL cleanup. Returns
        ``(entries visited, entries deleted, key to continue from or None at the
        end)``. Only the RocksDB backend has stored entries to filter; the hash map
        cleans up on access instead."""
        return 0, 0, None

    @abstractmethod
    def close(self) -> None:
        """Release resources (files of a RocksDB instance)."""
