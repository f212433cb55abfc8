"""The serializer of typed records in state (:mod:`weir.api.records`): format
``record/1``, a msgpack array of the field values in the schema's order; the schema
goes into the checkpoint with the state, and a restore with an evolved record class
migrates the stored values (or refuses, naming the field and the rule)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgpack

from weir.api.record_codegen import compiled_codec
from weir.api.records import (
    Incompatible,
    default_of,
    is_record_type,
    record_fields,
    resolve,
    schema_of,
    value_codec,
)
from weir.api.serializers import Compatibility, SchemaResolution, Serializer

__all__ = ["RecordSerializer"]

R = TypeVar("R")


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


class RecordSerializer(Serializer[R], Generic[R]):
    """Values of a dataclass, ``typing.NamedTuple`` or pydantic model ``cls`` (see
    :mod:`weir.api.records`): ``ValueStateDescriptor("card", RecordSerializer(Card))``.
    A value of another class is refused as it is written; a field of the wrong type
    is refused naming the field — as it is written on RocksDB (which encodes every
    write), on the hash map (which keeps the objects, as Flink's heap backend does)
    at the first write of the class and at the latest when the state is snapshotted;
    call :meth:`check` to test a value yourself. ``from_schema(doc)`` reads stored
    records as dicts (what ``weir.read_state`` does, without the class)."""

    type_id = "record/1"
    inline_in_msgpack_array = False  # (a list of records is not a record: elements framed as bins)

    def __init__(self, cls: type[R]) -> None:
        if not is_record_type(cls):
            raise TypeError(f"RecordSerializer needs a dataclass, NamedTuple or pydantic "
                            f"model class, got {cls!r}")
        self.cls: type[R] | None = cls
        self._schema = schema_of(cls)
        self._compile()

    @staticmethod
    def from_schema(schema: dict[str, Any]) -> RecordSerializer[dict[str, Any]]:
        """A serializer reading (and writing) records of ``schema`` as plain dicts."""
        made: RecordSerializer[dict[str, Any]] = RecordSerializer.__new__(RecordSerializer)
        made.cls = None
        made._schema = schema
        made._compile()
        return made

    def _compile(self) -> None:
        """The schema's compiled functions (:func:`weir.api.record_codegen.compiled_codec`)
        as this instance's ``encode``, ``decode`` and ``check``: the backends call them
        once per value (a snapshot, RocksDB's every read and write), and the methods
        below around them would add a Python frame to each call, a fifth of an
        encode. (Not over a subclass's own methods.)"""
        self._compiled = compiled_codec(self._schema, self.cls)
        own = type(self)
        for name, fn in zip(("encode", "decode", "check"), self._compiled, strict=True):
            if getattr(own, name) is getattr(RecordSerializer, name):
                setattr(self, name, fn)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.cls is None:
            return (RecordSerializer.from_schema, (self._schema,))
        return (RecordSerializer, (self.cls,))

    def encode(self, value: R) -> bytes:
        """``value`` as bytes (TypeError naming the field of a wrong value); an
        instance calls the compiled function directly (see ``_compile``)."""
        return self._compiled[0](value)

    def decode(self, data: bytes) -> R:
        """The record in ``data``; an instance calls the compiled function directly."""
        return self._compiled[1](data)  # type: ignore[no-any-return]

    def check(self, value: R) -> None:
        """Raise what :meth:`encode` raises for a value or a field of the wrong type
        (naming the field), without encoding: a few ``type(x) is T`` tests for a record
        of primitives. The range of ints and what ``Any`` fields hold are left to
        encoding."""
        self._compiled[2](value)

    def schema(self) -> dict[str, Any]:
        return self._schema

    def resolve(self, old_type_id: str, old_schema: Any) -> SchemaResolution:
        """Another record schema: by :func:`weir.api.records.resolve`; values pickled
        (``pickle/5``) or msgpacked (``msgpack/1``) before: read with the old
        serializer and rebuilt by field name (the objects or dicts must have this
        record's fields; missing ones take their defaults)."""
        if old_type_id == self.type_id:
            try:
                migrate = resolve(old_schema, self._schema)
            except Incompatible as exc:
                return SchemaResolution(Compatibility.INCOMPATIBLE, reason=(
                    f"field {exc.path}: {exc.rule}"))
            if migrate is None:
                return SchemaResolution(Compatibility.AS_IS)
            return SchemaResolution(Compatibility.AFTER_MIGRATION, _bytes_migration(migrate))
        if old_type_id in ("pickle/5", "msgpack/1"):
            load: Callable[[bytes], Any] = pickle.loads if old_type_id == "pickle/5" else _unpack
            return SchemaResolution(Compatibility.AFTER_MIGRATION,
                                    lambda data: self._rebuild(load(data)))
        return super().resolve(old_type_id, old_schema)

    def _rebuild(self, value: Any) -> bytes:
        """``value`` (an object with this record's fields, or a dict of them) encoded
        as this record (TypeError if it lacks a required field or one has another
        type)."""
        if self.cls is not None and isinstance(value, self.cls):
            return self.encode(value)
        fields = record_fields(value, "a typed record")
        encoded = []
        for field in self._schema["fields"]:
            name = field["name"]
            if name in fields:
                encoded.append(value_codec(field["type"], None)[0](fields[name], name))
            elif "default" in field:
                encoded.append(default_of(field))
            elif field["type"].get("null"):
                encoded.append(None)
            else:
                raise TypeError(f"a stored {type(value).__name__} has no field {name!r}, "
                                f"which the record requires")
        return msgpack.packb(encoded, use_bin_type=True)  # type: ignore[no-any-return]

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, RecordSerializer) and other.cls is self.cls
                and other._schema == self._schema)

    def __hash__(self) -> int:
        return hash((RecordSerializer, self.cls, repr(self._schema)))

    def __repr__(self) -> str:
        name = self.cls.__name__ if self.cls is not None else self._schema["name"]
        return f"RecordSerializer({name})"


def _bytes_migration(migrate: Callable[[Any], Any]) -> Callable[[bytes], bytes]:
    pack = msgpack.Packer(use_bin_type=True).pack  # (one per migration: run by one restore)
    unpackb = msgpack.unpackb

    def rewrite(data: bytes) -> bytes:
        return pack(migrate(unpackb(data, raw=False, strict_map_key=False)))  # type: ignore[no-any-return]
    return rewrite
