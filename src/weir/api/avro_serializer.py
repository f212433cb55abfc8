"""Avro-encoded state values with a user-given schema (issue 41): format ``avro/1``,
Avro's binary encoding (fastavro, no container header), the writer schema stored once
per state in the checkpoint. A restore with another schema follows Avro's schema
resolution: compatible changes migrate every stored value, the others are refused
naming the field and the rule (:mod:`weir.api.avro_schemas`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pickle
from collections.abc import Callable
from io import BytesIO
from typing import Any

import msgpack
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.validation import validate

from weir.api.avro_schemas import (
    NAMED_KINDS,
    Named,
    check,
    check_record,
    describe,
    kind_of,
    normalised,
    problem,
    reason,
    with_python_defaults,
)
from weir.api.record_serializer import RecordSerializer
from weir.api.records import Incompatible, is_record_type, record_fields
from weir.api.serializers import Compatibility, SchemaResolution, Serializer
from weir.errors import ConfigurationError

__all__ = ["AvroSerializer"]


class AvroSerializer(Serializer[Any]):
    """Values of an Avro ``schema`` (a dict, or its JSON text):
    ``ValueStateDescriptor("card", AvroSerializer(card_schema))``. Values are Avro's
    Python form (a record is a dict; a dict may leave out fields with a default, and a
    key that is not a field is refused), or, given ``record_class`` (a dataclass,
    NamedTuple or pydantic model whose fields are the record's top-level fields),
    instances of it — a pydantic model's nested models too, other nested records are
    dicts. A value that does not fit is refused as it is written, naming the field.

    A restore reads values written with another schema by Avro's resolution rules
    (fields matched by name or alias, removed ones dropped, added ones at their default,
    int -> long -> float -> double, string <-> bytes, a type made a union, enum symbols
    added, named types renamed with an alias); states written as pickles, msgpack or
    typed records (:class:`~weir.api.record_serializer.RecordSerializer`) move to Avro
    when their values fit."""

    type_id = "avro/1"
    inline_in_msgpack_array = False  # (Avro bytes: list elements framed as bins)

    def __init__(self, schema: dict[str, Any] | list[Any] | str,
                 record_class: type | None = None) -> None:
        if isinstance(schema, str):
            with contextlib.suppress(json.JSONDecodeError):  # (else a type name: "long")
                schema = json.loads(schema)
        try:
            schema = json.loads(json.dumps(schema))  # (the document the checkpoint keeps)
            named: Named = {}
            self._doc: Any = normalised(parse_schema(schema, named_schemas=named))
            self._named = {n: normalised(s) for n, s in named.items()}
            parsed_named: Named = {}
            self._parsed = with_python_defaults(
                parse_schema(self._doc, named_schemas=parsed_named), parsed_named)
        except Exception as exc:
            raise ConfigurationError(f"AvroSerializer needs an Avro schema (a dict, or its "
                                     f"JSON text): {exc}") from exc
        #: the class values are decoded to (None: Avro's Python form, dicts)
        self.record_class = record_class
        #: (the class, to dict, from dict) given a record class
        self._codec = None if record_class is None else (
            record_class, *_class_codec(record_class, self._doc))

    def __reduce__(self) -> tuple[Any, ...]:
        # (small and without fastavro's parsed form: descriptors travel to Spark)
        return (AvroSerializer, (self._doc, self.record_class))

    def encode(self, value: Any) -> bytes:
        """Avro's binary encoding of ``value`` (a ``TypeError``/``ValueError`` naming the
        field if it does not fit the schema)."""
        if self._codec is not None:
            cls, to_dict, _ = self._codec
            if not isinstance(value, cls):
                raise TypeError(f"the value: expected a {cls.__name__}, got "
                                f"{type(value).__name__} {value!r:.60}")
            value = to_dict(value)
        return self._write(value)

    def _write(self, value: Any) -> bytes:
        """``value`` in Avro's Python form, encoded (TypeError/ValueError naming the
        field if it does not fit: fastavro's writer alone coerces True to 1, 2.5 to 2
        and "ab" to ["a", "b"])."""
        out = BytesIO()
        failure: Exception | None = None
        try:
            if validate(value, self._parsed, raise_errors=False):
                schemaless_writer(out, self._parsed, value, strict_allow_default=True)
                return out.getvalue()
        except Exception as exc:
            failure = exc
        kind, message = problem(self._doc, value, "", self._named) or (
            TypeError, f"the value does not fit the schema: {failure or _why(value, self)}")
        raise kind(message) from failure

    def decode(self, data: bytes) -> Any:
        """The value encoded in ``data`` (a dict, or ``record_class``'s instance)."""
        value = schemaless_reader(BytesIO(data), self._parsed, None)
        return value if self._codec is None else self._codec[2](value)

    def schema(self) -> Any:
        """The writer schema, normalised (full names, no namespaces), defaults kept."""
        return self._doc

    def resolve(self, old_type_id: str, old_schema: Any) -> SchemaResolution:
        """Another Avro schema: by Avro's resolution rules (see the class doc); values
        of ``record/1``, ``pickle/5`` or ``msgpack/1``: read with the old serializer and
        written as Avro (dicts or objects with this record's fields; missing ones take
        their defaults) — a value that does not fit fails the restore."""
        if old_type_id == self.type_id:
            if old_schema == self._doc:
                return SchemaResolution(Compatibility.AS_IS)
            try:
                old_named: Named = {}
                old_parsed = parse_schema(old_schema, named_schemas=old_named)
                same = check(normalised(old_parsed), self._doc,
                              {n: normalised(s) for n, s in old_named.items()},
                              self._named, "", set())
            except Incompatible as exc:
                return SchemaResolution(Compatibility.INCOMPATIBLE, reason=reason(exc))
            except Exception as exc:
                return SchemaResolution(Compatibility.INCOMPATIBLE, reason=(
                    f"the stored Avro schema cannot be read: {exc}"))
            if same:
                return SchemaResolution(Compatibility.AS_IS)
            return SchemaResolution(Compatibility.AFTER_MIGRATION, self._reader_of(old_parsed))
        load: Callable[[bytes], Any]
        if old_type_id == RecordSerializer.type_id:
            try:
                check_record(old_schema, self._doc, self._named, "")
            except Incompatible as exc:
                return SchemaResolution(Compatibility.INCOMPATIBLE, reason=reason(exc))
            load = RecordSerializer.from_schema(old_schema).decode
        elif old_type_id in ("pickle/5", "msgpack/1"):
            load = pickle.loads if old_type_id == "pickle/5" else _unpack
        else:
            return super().resolve(old_type_id, old_schema)
        return SchemaResolution(Compatibility.AFTER_MIGRATION,
                                lambda data: self._rebuild(load(data)))

    def _reader_of(self, old_parsed: Any) -> Callable[[bytes], bytes]:
        new = self._parsed

        def migrate(data: bytes) -> bytes:
            try:
                value = schemaless_reader(BytesIO(data), old_parsed, new)
            except (TypeError, ValueError):
                raise
            except Exception as exc:  # (fastavro's own errors: not Type/ValueErrors)
                raise ValueError(str(exc)) from exc
            out = BytesIO()
            schemaless_writer(out, new, value)
            return out.getvalue()
        return migrate

    def _rebuild(self, value: Any) -> bytes:
        """``value`` (an object with this record's fields, or a dict of them) written
        as Avro (TypeError/ValueError naming the field if it does not fit)."""
        if self._codec is not None and isinstance(value, self._codec[0]):
            return self.encode(value)
        if kind_of(self._doc) in ("record", "error"):
            fields = record_fields(value, "an Avro record")
            value = {f["name"]: fields[f["name"]] for f in self._doc["fields"]
                     if f["name"] in fields}
        return self._write(value)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, AvroSerializer) and other.record_class is self.record_class
                and other._doc == self._doc)

    def __hash__(self) -> int:
        return hash((AvroSerializer, self.record_class, json.dumps(self._doc, sort_keys=True)))

    def __repr__(self) -> str:
        if self.record_class is not None:
            return f"AvroSerializer({self.record_class.__name__})"
        if kind_of(self._doc) in NAMED_KINDS:
            return f"AvroSerializer({self._doc['name'].rsplit('.', 1)[-1]})"
        return f"AvroSerializer({describe(self._doc, self._named)})"


# ------------------------------------------------------------------------ helpers


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _why(value: Any, serializer: AvroSerializer) -> str:
    try:
        validate(value, serializer._parsed, raise_errors=True)
    except Exception as exc:
        return " ".join(str(exc).split())
    return "fastavro refused it"


def _class_codec(cls: type, doc: Any) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """(to dict, from dict) of record class ``cls``, whose fields must be ``doc``'s."""
    if not is_record_type(cls):
        raise TypeError(f"AvroSerializer's record_class must be a dataclass, NamedTuple or "
                        f"pydantic model class, got {cls!r}")
    if kind_of(doc) not in ("record", "error"):
        raise TypeError(f"record_class {cls.__name__} needs a record schema, got "
                        f"{describe(doc, {})}")
    names = [f["name"] for f in doc["fields"]]
    if hasattr(cls, "model_fields") and hasattr(cls, "model_validate"):  # pydantic
        mine = list(cls.model_fields)
        to_dict: Callable[[Any], Any] = lambda v: v.model_dump()  # noqa: E731
        from_dict: Callable[[Any], Any] = cls.model_validate
    else:
        mine = (list(cls._fields) if issubclass(cls, tuple)  # type: ignore[attr-defined]
                else [f.name for f in dataclasses.fields(cls) if f.init])  # type: ignore[arg-type]
        to_dict = lambda v: {n: getattr(v, n) for n in names}  # noqa: E731
        from_dict = lambda d: cls(**d)  # noqa: E731
    for name in mine:
        if name not in names:
            raise TypeError(f"record_class {cls.__name__}: field {name!r} is not a field of "
                            f"the schema's record {doc['name']}")
    for name in names:
        if name not in mine:
            raise TypeError(f"record_class {cls.__name__}: the schema's field {name!r} is "
                            f"not a field of the class")
    return to_dict, from_dict
