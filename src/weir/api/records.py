"""Typed records in state (issue 41): dataclasses, ``typing.NamedTuple``\\ s and pydantic
models as state values, encoded compactly (a msgpack array of the field values in the
schema's order, nested records as arrays too) — not pickle — with the record's
*schema* stored once per state in the checkpoint.

Encoding and decoding run functions compiled once per schema and class
(:func:`weir.api.record_codegen.compiled_codec`).

A schema is a small msgpack-able document of types (:func:`schema_of`):

* ``{"t": "int" | "float" | "bool" | "str" | "bytes" | "any"}`` (``any``: whatever
  msgpack holds, for an unannotated field or ``typing.Any``),
* ``{"t": "list", "of": T}``, ``{"t": "map", "of": T}`` (``dict[str | int, T]``),
* ``{"t": "record", "name": ..., "fields": [{"name", "type": T, "default"?}]}`` (a
  default as its msgpack form in hex: the schema is JSON in the checkpoint's metadata),

each with ``"null": True`` when ``None`` is allowed (``T | None``). A value of the
wrong type is refused as it is written, naming the field.

**Evolution** (Flink's three answers, :class:`~weir.api.serializers.Compatibility`):
a restore compares the stored schema with the new one (:func:`resolve`). Fields are
matched by name: added ones take their default (or ``None`` if nullable), removed ones
are dropped, order does not matter, ``int`` widens to ``float``, a required field may
become nullable, and a record type may be renamed — *compatible after migration*: the
values are rewritten during the restore. A field whose type narrows or changes, a
nullable field made required, or a new required field without a default is
*incompatible*: the restore is refused naming the field and the rule."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import msgpack

__all__ = ["Incompatible", "default_of", "is_record_type", "record_fields", "resolve",
           "schema_of", "value_codec"]

_PRIMITIVES: dict[Any, str] = {int: "int", float: "float", bool: "bool", str: "str",
                               bytes: "bytes"}
_MISSING = object()


class Incompatible(Exception):
    """A schema change no rule covers: ``path`` names the field, ``rule`` says why."""

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"{path}: {rule}")
        self.path, self.rule = path, rule


def _is_pydantic(cls: Any) -> bool:
    return isinstance(cls, type) and hasattr(cls, "model_fields") and hasattr(
        cls, "model_construct")


def _is_namedtuple(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def is_record_type(cls: Any) -> bool:
    """Whether ``cls`` is a dataclass, a NamedTuple or a pydantic model class."""
    return isinstance(cls, type) and (
        dataclasses.is_dataclass(cls) or _is_namedtuple(cls) or _is_pydantic(cls))


def _missing(value: object) -> bool:
    """Whether a dataclass field's default is ``dataclasses.MISSING`` — or a copy of it:
    a class pickled by value (cloudpickle: Spark ships the driver's ``__main__`` and
    notebook classes so) has its fields' sentinel copied."""
    return isinstance(value, type(dataclasses.MISSING))


def _fields(cls: type) -> list[tuple[str, Any, Any]]:
    """(name, annotation, default or _MISSING) of each field of a record class."""
    hints = typing.get_type_hints(cls)
    if _is_pydantic(cls):
        out = []
        for name, info in cls.model_fields.items():  # type: ignore[attr-defined]
            default = _MISSING if info.is_required() else info.get_default(
                call_default_factory=True)
            out.append((name, hints.get(name, info.annotation), default))
        return out
    if _is_namedtuple(cls):
        defaults = getattr(cls, "_field_defaults", {})
        return [(n, hints.get(n, Any), defaults.get(n, _MISSING))
                for n in cls._fields]  # type: ignore[attr-defined]
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if not _missing(f.default):
            default = f.default
        elif not _missing(f.default_factory):
            default = f.default_factory()  # type: ignore[operator]  # (not MISSING)
        else:
            default = _MISSING
        out.append((f.name, hints.get(f.name, Any), default))
    return out


def record_fields(value: Any, target: str) -> Mapping[str, Any]:
    """The fields of a stored ``value`` (a dataclass, NamedTuple or pydantic model, or
    a mapping of them) by name, to rebuild it as ``target`` (named in the TypeError
    for anything else)."""
    if isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return dict(value._asdict())
    if hasattr(value, "model_dump"):
        return dict(value.model_dump())
    raise TypeError(f"a stored {type(value).__name__} is not a record or a dict: it "
                    f"cannot be rebuilt as {target}")


def _type_doc(annotation: Any, path: str, seen: tuple[type, ...]) -> dict[str, Any]:
    nullable = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != len(typing.get_args(annotation)) - 1 or len(args) != 1:
            raise TypeError(f"{path}: only `T | None` unions can be in a record, got "
                            f"{annotation!r}")
        nullable, annotation = True, args[0]
        origin = typing.get_origin(annotation)
    doc: dict[str, Any]
    if annotation is Any:
        doc = {"t": "any"}
    elif annotation in _PRIMITIVES:
        doc = {"t": _PRIMITIVES[annotation]}
    elif origin is list:
        (item,) = typing.get_args(annotation) or (Any,)
        doc = {"t": "list", "of": _type_doc(item, f"{path}[]", seen)}
    elif origin is dict:
        key, item = typing.get_args(annotation) or (Any, Any)
        if key not in (str, int, Any):
            raise TypeError(f"{path}: a map's keys must be str or int, got {key!r}")
        doc = {"t": "map", "of": _type_doc(item, f"{path}{{}}", seen)}
    elif is_record_type(annotation):
        if annotation in seen:
            raise TypeError(f"{path}: a record cannot contain itself ({annotation.__name__})")
        doc = _record_doc(annotation, path, (*seen, annotation))
    else:
        raise TypeError(
            f"{path}: type {annotation!r} cannot be in a typed record (int, float, bool, "
            f"str, bytes, Any, list[T], dict[str, T], T | None and records can); use "
            f"another type or PickleSerializer for the state")
    if nullable:
        doc["null"] = True
    return doc


def _record_doc(cls: type, path: str, seen: tuple[type, ...]) -> dict[str, Any]:
    fields = []
    for name, annotation, default in _fields(cls):
        field_path = f"{path}.{name}" if path else name
        entry: dict[str, Any] = {"name": name,
                                 "type": _type_doc(annotation, field_path, seen)}
        if default is not _MISSING:  # (as msgpack, in hex: a schema is JSON in metadata)
            encoded = value_codec(entry["type"])[0](default, field_path)
            entry["default"] = msgpack.packb(encoded, use_bin_type=True).hex()
        fields.append(entry)
    return {"t": "record", "name": cls.__qualname__, "fields": fields}


def schema_of(cls: type) -> dict[str, Any]:
    """The schema document of record class ``cls`` (a ``TypeError`` naming the field
    for a type a record cannot hold)."""
    if not is_record_type(cls):
        raise TypeError(f"{cls!r} is not a dataclass, NamedTuple or pydantic model")
    return _record_doc(cls, "", (cls,))


def default_of(field: dict[str, Any]) -> Any:
    """A schema field's default, in its msgpack form (the field must have one)."""
    return msgpack.unpackb(bytes.fromhex(field["default"]), raw=False, strict_map_key=False)


# ------------------------------------------------------------------ encode / decode

Encode = Callable[[Any, str], Any]
Decode = Callable[[Any], Any]


def value_codec(doc: dict[str, Any], cls: Any = None) -> tuple[Encode, Decode]:
    """(encode, decode) between values of type ``doc`` and their msgpack form.
    ``encode(value, path)`` checks the type (``TypeError`` naming ``path``); ``decode``
    builds records of ``cls`` (a record doc's class; None: plain dicts)."""
    kind, nullable = doc["t"], bool(doc.get("null"))
    encode: Encode
    decode: Decode
    if kind == "int":
        def encode(v: Any, path: str) -> Any:
            if type(v) is not int:
                _wrong(v, path, "an int")
            return v
        decode = _same
    elif kind == "float":
        def encode(v: Any, path: str) -> Any:
            if type(v) is float:
                return v
            if type(v) is int:
                return float(v)
            _wrong(v, path, "a float")
        decode = _same
    elif kind in ("bool", "str", "bytes"):
        want = {"bool": bool, "str": str, "bytes": bytes}[kind]

        def encode(v: Any, path: str) -> Any:
            if type(v) is not want:
                _wrong(v, path, f"a {kind}")
            return v
        decode = _same
    elif kind == "any":
        def encode(v: Any, path: str) -> Any:
            return v
        decode = _same
    elif kind == "list":
        item_encode, item_decode = value_codec(doc["of"], _item_class(cls))

        def encode(v: Any, path: str) -> Any:
            if not isinstance(v, list):
                _wrong(v, path, "a list")
            return [item_encode(x, f"{path}[{i}]") for i, x in enumerate(v)]

        def decode(v: Any) -> Any:
            return [item_decode(x) for x in v]
    elif kind == "map":
        item_encode, item_decode = value_codec(doc["of"], _item_class(cls))

        def encode(v: Any, path: str) -> Any:
            if not isinstance(v, dict):
                _wrong(v, path, "a dict")
            return {k: item_encode(x, f"{path}[{k!r}]") for k, x in v.items()}

        def decode(v: Any) -> Any:
            return {k: item_decode(x) for k, x in v.items()}
    else:
        encode, decode = _record_codec(doc, cls)
    if not nullable:
        return encode, decode
    inner_encode, inner_decode = encode, decode
    return ((lambda v, path: None if v is None else inner_encode(v, path)),
            (lambda v: None if v is None else inner_decode(v)))


def _same(v: Any) -> Any:
    return v


def _item_class(cls: Any) -> Any:
    """The element class of a ``list[C]`` / ``dict[str, C]`` annotation (or None)."""
    args = typing.get_args(cls) if cls is not None else ()
    return args[-1] if args else None


def _wrong(value: Any, path: str, want: str) -> typing.NoReturn:
    raise TypeError(f"field {path or '(the record)'}: expected {want}, got "
                    f"{type(value).__name__} {value!r:.60}")


def _record_codec(doc: dict[str, Any], cls: Any) -> tuple[Encode, Decode]:
    names = [f["name"] for f in doc["fields"]]
    hints: dict[str, Any] = {}
    if cls is not None and is_record_type(cls):
        hints = {n: a for n, a, _ in _fields(cls)}
    codecs = [value_codec(f["type"], _annotation_class(hints.get(f["name"])))
              for f in doc["fields"]]
    encoders = [c[0] for c in codecs]
    decoders = [c[1] for c in codecs]
    rtype = cls if cls is not None and is_record_type(cls) else None

    def encode(v: Any, path: str) -> Any:
        if rtype is not None and not isinstance(v, rtype):
            _wrong(v, path, f"a {rtype.__name__}")
        try:
            values = ([v[n] for n in names] if rtype is None and isinstance(v, dict)
                      else [getattr(v, n) for n in names])
        except (AttributeError, KeyError) as exc:
            raise TypeError(f"field {path or '(the record)'}: missing {exc}") from None
        return [e(x, f"{path}.{n}" if path else n)
                for e, x, n in zip(encoders, values, names, strict=True)]

    pairs = list(zip(names, decoders, strict=True))
    if rtype is None:
        def decode(v: Any) -> Any:
            return {n: d(x) for (n, d), x in zip(pairs, v, strict=True)}
    elif _is_namedtuple(rtype):
        def decode(v: Any) -> Any:
            return rtype(*[d(x) for (_, d), x in zip(pairs, v, strict=True)])
    elif _is_pydantic(rtype):
        def decode(v: Any) -> Any:
            return rtype.model_construct(
                **{n: d(x) for (n, d), x in zip(pairs, v, strict=True)})
    else:
        def decode(v: Any) -> Any:
            return rtype(**{n: d(x) for (n, d), x in zip(pairs, v, strict=True)})
    return encode, decode


def _annotation_class(annotation: Any) -> Any:
    """The class a field's annotation decodes to (``C | None`` -> C)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else None
    return annotation


# ------------------------------------------------------------------------ evolution

Migrate = Callable[[Any], Any]


def resolve(old: dict[str, Any], new: dict[str, Any], path: str = "") -> Migrate | None:
    """How a value of type ``old`` (in its msgpack form) becomes one of type ``new``:
    None if it is the same as is, else the function; :class:`Incompatible` naming the
    field and the rule if no rule covers the change (see the module doc)."""
    where = path or "(the record)"
    if old.get("null") and not new.get("null"):
        raise Incompatible(where, "a nullable field cannot become required (stored "
                                  "values may be None)")
    kind_old, kind_new = old["t"], new["t"]
    if kind_new == "any" and kind_old != "record":
        return None
    if kind_old != kind_new:
        if (kind_old, kind_new) == ("int", "float"):
            return lambda v: None if v is None else float(v)
        raise Incompatible(where, f"its type changed from {_name(old)} to {_name(new)}; "
                                  f"only int -> float widens")
    if kind_new in ("list", "map"):
        inner = resolve(old["of"], new["of"], f"{path}[]")
        if inner is None:
            return None
        if kind_new == "list":
            return lambda v: None if v is None else [inner(x) for x in v]
        return lambda v: None if v is None else {k: inner(x) for k, x in v.items()}
    if kind_new != "record":
        return None
    return _resolve_record(old, new, path)


def _resolve_record(old: dict[str, Any], new: dict[str, Any], path: str) -> Migrate | None:
    position = {f["name"]: i for i, f in enumerate(old["fields"])}
    steps: list[tuple[int | None, Migrate | None, Any]] = []
    for field in new["fields"]:
        name = field["name"]
        field_path = f"{path}.{name}" if path else name
        if name in position:
            steps.append((position[name], resolve(old["fields"][position[name]]["type"],
                                                  field["type"], field_path), None))
        elif "default" in field:
            steps.append((None, None, default_of(field)))
        elif field["type"].get("null"):
            steps.append((None, None, None))
        else:
            raise Incompatible(field_path, "a new field needs a default or to be nullable "
                                           "(`T | None`): stored records have no value for it")
    same = [i for i, _, _ in steps] == list(range(len(old["fields"]))) and all(
        m is None for _, m, _ in steps)
    if same:
        return None
    # compiled once (a restore runs it for every stored record): each new field is the
    # old one at its position, converted, or the default — one list display
    names: dict[str, Any] = {}
    parts = []
    for j, (i, m, d) in enumerate(steps):
        if i is None:
            names[f"d{j}"] = d  # (shared by every record: it is packed right away)
            parts.append(f"d{j}")
        elif m is None:
            parts.append(f"v[{i}]")
        else:
            names[f"m{j}"] = m
            parts.append(f"m{j}(v[{i}])")
    source = (f"def migrate(v):\n    if v is None:\n        return None\n"
              f"    return [{', '.join(parts)}]\n")
    exec(compile(source, "<weir record migration>", "exec"), names)
    return names["migrate"]  # type: ignore[no-any-return]


def _name(doc: dict[str, Any]) -> str:
    kind = doc["t"]
    if kind in ("list", "map"):
        return f"{kind}<{_name(doc['of'])}>"
    if kind == "record":
        return f"record {doc['name']}"
    return str(kind)
