"""Stored state entries as rows: what each state kind looks like as a table.

Keyed state is stored as canonical entries (``weir.state.backend``): a prefixed key
(2 bytes of key group + the key's canonical bytes, ``weir.state.keybytes``), for a
map the user key's bytes after it, and the value in the state's serializer (behind an
``int64_be`` timestamp when the state has TTL, ``weir.state.ttl``). Rows per kind:

==========================  ===========================================
state kind                  columns
==========================  ===========================================
value, reducing,            ``key, value`` (aggregating: the accumulator)
aggregating
list                        ``key, index, value`` (one row per element)
map                         ``key, map_key, value`` (one row per entry)
==========================  ===========================================

plus ``ttl_timestamp_ms`` (the entry's last write or access, epoch ms) when the state
has TTL. Timers: ``key, domain, timestamp_ms``; operator list state: ``subtask, index,
value``; broadcast state: ``key, value``.

Values are decoded with the serializer the state declared (by its ``type_id``):
weir's built-in ones, or ones the caller passes; a state that declared ``pickle/5``
is unpickled, nothing else is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from weir.api.avro_serializer import AvroSerializer
from weir.api.descriptors import StateKind
from weir.api.record_serializer import RecordSerializer
from weir.api.serializers import (
    BytesSerializer,
    Compatibility,
    FloatSerializer,
    IntSerializer,
    MsgpackSerializer,
    PickleSerializer,
    SchemaResolution,
    Serializer,
    StrSerializer,
)
from weir.errors import ConfigurationError, StateSerializationError
from weir.state.backend import split_map_key, unframe
from weir.state.keybytes import decode_key
from weir.state.snapshot import StateMeta, canonical_schema
from weir.state.timers import EVENT_TIMERS, PROCESSING_TIMERS

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "TIMER_COLUMNS",
    "TTL_COLUMN",
    "SerializerSet",
    "keyed_columns",
    "keyed_rows",
    "timer_rows",
    "to_frame",
]

TTL_COLUMN = "ttl_timestamp_ms"
TIMER_COLUMNS = ("key", "domain", "timestamp_ms")
#: timer state name -> the domain shown
TIMER_DOMAINS = {EVENT_TIMERS: "event", PROCESSING_TIMERS: "processing"}
_BUILT_IN: tuple[Serializer[Any], ...] = (
    MsgpackSerializer(), PickleSerializer(), IntSerializer(), FloatSerializer(),
    StrSerializer(), BytesSerializer(),
)


class SerializerSet:
    """Serializers by ``type_id``: weir's built-in ones and the caller's (which win).
    ``reading``: values are only read (``weir.read_state``), so a serializer of the
    caller's reads a state written with an older schema it migrates from, as a restore
    would (:meth:`of`)."""

    def __init__(self, extra: Iterable[Serializer[Any]] = (), *, reading: bool = False
                 ) -> None:
        extra = list(extra)
        self._extra = extra
        self._reading = reading
        self._by_id = {s.type_id: s for s in _BUILT_IN}
        for serializer in extra:
            if not isinstance(serializer, Serializer):
                raise ConfigurationError(
                    f"serializers must be Serializer instances, got {serializer!r}")
            self._by_id[serializer.type_id] = serializer
        #: the caller's serializers with a schema (typed records), by that schema: one
        #: per record class, each used for the states written with its schema
        self._by_schema = {canonical_schema(s.schema()): s for s in extra
                           if s.schema() is not None}

    def get(self, type_id: str, what: str) -> Serializer[Any]:
        """The serializer of ``type_id``; ``what`` names the state for the error."""
        found = self._by_id.get(type_id)
        if found is None:
            raise ConfigurationError(
                f"{what} was written with serializer {type_id!r}, which is not one of "
                f"weir's ({', '.join(sorted(s.type_id for s in _BUILT_IN))}): pass an "
                f"instance of it, e.g. read_state(..., serializers=[MySerializer()])"
            )
        return found

    def of_state(self, meta: StateMeta, position: int, what: str) -> Serializer[Any]:
        """The serializer of a state's ``position``-th serializer: a typed record's is
        rebuilt from the schema stored with the state (records read as dicts) unless
        the caller gave one of that very schema (records read as its class)."""
        return self.of(meta.serializers[position],
                       meta.schemas[position] if meta.schemas else None, what)

    def of(self, type_id: str, schema: str | None, what: str) -> Serializer[Any]:
        """The serializer of values written by ``type_id`` with ``schema`` (canonical
        JSON, or None): as :meth:`of_state`, for operator and broadcast states too."""
        if schema is None:
            return self.get(type_id, what)
        given = self._by_schema.get(schema)
        if given is not None and given.type_id == type_id:
            return given
        newer = self._migrating(type_id, schema, what) if self._reading else None
        if newer is not None:
            return newer
        if type_id == RecordSerializer.type_id:
            return RecordSerializer.from_schema(json.loads(schema))
        if type_id == AvroSerializer.type_id:
            return AvroSerializer(json.loads(schema))
        return self.get(type_id, what)


    def _migrating(self, type_id: str, schema: str, what: str) -> Serializer[Any] | None:
        """A reader of values written by ``type_id`` with ``schema`` through one of the
        caller's serializers that migrates them (an evolved record class): the one of
        the same record name, or the only one; None if there is none. Several that
        could, none of them by name: a ConfigurationError naming them."""
        doc = json.loads(schema)
        found: list[tuple[Serializer[Any], SchemaResolution]] = []
        for serializer in self._extra:
            if serializer.schema() is None:
                continue
            resolution = serializer.resolve(type_id, doc)
            if resolution.compatibility is not Compatibility.INCOMPATIBLE:
                found.append((serializer, resolution))
        named = [f for f in found if _record_name(f[0].schema()) == _record_name(doc)]
        candidates = named or found
        if not candidates:
            return None
        if len(candidates) > 1:
            raise ConfigurationError(
                f"{what} was written with the schema of record {_record_name(doc)!r}, which "
                f"several of the given serializers can read "
                f"({', '.join(repr(c) for c, _ in candidates)}): pass the one to read it "
                f"with, or read it without them (records as dicts)")
        chosen = candidates[0]
        serializer, resolution = chosen
        if resolution.compatibility is Compatibility.AS_IS or resolution.migrate is None:
            return serializer
        return _MigratingReader(serializer, resolution.migrate)


def _record_name(schema: Any) -> Any:
    return schema.get("name") if isinstance(schema, dict) else None


class _MigratingReader(Serializer[Any]):
    """Reads values of an older schema with a newer serializer: migrated, then
    decoded (``weir.read_state`` only: it never writes)."""

    def __init__(self, serializer: Serializer[Any], migrate: Any) -> None:
        self.type_id = serializer.type_id
        self._serializer, self._migrate = serializer, migrate

    def encode(self, value: Any) -> bytes:
        raise ConfigurationError("a migrating reader of old state does not write")

    def decode(self, data: bytes) -> Any:
        return self._serializer.decode(self._migrate(data))


def keyed_columns(meta: StateMeta) -> list[str]:
    """The columns of a keyed state's rows."""
    middle = {StateKind.LIST: ["index"], StateKind.MAP: ["map_key"]}.get(meta.kind, [])
    return ["key", *middle, "value", *([TTL_COLUMN] if meta.ttl else [])]


def _split_ttl(data: bytes) -> tuple[bytes, int]:
    return data[8:], int.from_bytes(data[:8], "big", signed=True)


def keyed_rows(
    meta: StateMeta, entries: Iterable[tuple[bytes, bytes]], serializers: SerializerSet,
    what: str,
) -> Iterator[tuple[Any, ...]]:
    """Rows (:func:`keyed_columns`) of a keyed state's canonical entries."""
    value_ser = serializers.of_state(meta, len(meta.serializers) - 1, what)
    decode = value_ser.decode
    decode_user_key = serializers.of_state(meta, 0, what).decode
    ttl = meta.ttl
    try:
        if meta.kind is StateKind.MAP:
            for raw_key, data in entries:
                primary, user = split_map_key(raw_key)
                key, map_key = decode_key(primary[2:]), decode_user_key(user)
                if ttl:
                    data, stamp = _split_ttl(data)
                    yield key, map_key, decode(data), stamp
                else:
                    yield key, map_key, decode(data)
        elif meta.kind is StateKind.LIST:
            for raw_key, data in entries:
                key = decode_key(raw_key[2:])
                if ttl:
                    for index, element in enumerate(unframe(data)):
                        inner, stamp = _split_ttl(element)
                        yield key, index, decode(inner), stamp
                    continue
                values: Sequence[Any] = (decode(data) if value_ser.inline_in_msgpack_array
                                         else [decode(e) for e in unframe(data)])
                for index, value in enumerate(values):
                    yield key, index, value
        else:
            for raw_key, data in entries:
                key = decode_key(raw_key[2:])
                if ttl:
                    data, stamp = _split_ttl(data)
                    yield key, decode(data), stamp
                else:
                    yield key, decode(data)
    except Exception as exc:  # a serializer's or msgpack's error: name the state
        raise StateSerializationError(
            f"{what}: a stored entry cannot be decoded with {meta.serializers} "
            f"({type(exc).__name__}: {exc})"
        ) from exc


def timer_rows(name: str, entries: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[Any, ...]]:
    """Rows (``TIMER_COLUMNS``) of one timer state's entries (``prefixed key +
    int64_be(timestamp)``, ``weir.state.timers``)."""
    domain = TIMER_DOMAINS.get(name, name)
    for raw_key, _ in entries:
        yield (decode_key(raw_key[2:-8]), domain,
               int.from_bytes(raw_key[-8:], "big", signed=True))


def to_frame(rows: list[tuple[Any, ...]], columns: list[str]) -> pd.DataFrame:
    """A pandas DataFrame of ``rows`` (pandas imported only when a table is read)."""
    import pandas as pd

    return pd.DataFrame.from_records(rows, columns=columns)
