"""Avro-encoded state values (issue 41): ``AvroSerializer(schema)`` round-trips Avro's
Python form (dicts) or a record class, refuses a value that does not fit naming the
field, and answers a restore with another schema by Avro's resolution rules — as is,
after migration (every stored value rewritten, new fields at their defaults) or
incompatible (naming the field and the rule), decided before any value is read.
Hypothesis draws record schemas and changes; real checkpoints and savepoints carry
Avro state through a restore on both backends."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import re
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import weir
from weir import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from weir.api.avro_serializer import AvroSerializer
from weir.api.record_serializer import RecordSerializer
from weir.api.serializers import (
    Compatibility,
    IntSerializer,
    MsgpackSerializer,
    PickleSerializer,
    SchemaResolution,
)
from weir.errors import ConfigurationError, StateMigrationError, StateSerializationError
from weir.testing import KeyedOperatorHarness

CARD = {
    "type": "record", "name": "Card", "namespace": "shop",
    "fields": [
        {"name": "card", "type": "string"},
        {"name": "count", "type": "int"},
        {"name": "total", "type": "long"},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
        {"name": "color", "type": {"type": "enum", "name": "Color",
                                   "symbols": ["RED", "GREEN"]}},
        {"name": "owner", "type": {"type": "record", "name": "Owner", "fields": [
            {"name": "id", "type": "long"},
            {"name": "limits", "type": {"type": "map", "values": "double"}}]}},
        {"name": "last", "type": ["null", "double"], "default": None},
        {"name": "raw", "type": "bytes", "default": "\u00ff"},
        {"name": "key", "type": {"type": "fixed", "name": "Key", "size": 2}},
    ],
}
VALUE = {"card": "c1", "count": 3, "total": 12, "tags": ["gold"], "color": "RED",
         "owner": {"id": 7, "limits": {"eur": 5.0}}, "last": None, "raw": b"q",
         "key": b"k1"}


def changed(schema: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``schema`` with fields replaced (a field dict), added (new name) or removed
    (None)."""
    made = copy.deepcopy(schema)
    kept = [f for f in made["fields"] if fields.get(f["name"], f) is not None]
    names = {f["name"] for f in kept}
    made["fields"] = [fields.get(f["name"], f) for f in kept] + [
        f for n, f in fields.items() if f is not None and n not in names]
    return made


# ------------------------------------------------------------------ values


@dataclasses.dataclass
class Point:
    x: int
    y: float = 0.0
    label: str | None = None


class PointTuple(NamedTuple):
    x: int
    y: float = 0.0
    label: str | None = None


class PointModel(pydantic.BaseModel):
    x: int
    y: float = 0.0
    label: str | None = None


POINT = {"type": "record", "name": "Point", "fields": [
    {"name": "x", "type": "long"}, {"name": "y", "type": "double", "default": 0.0},
    {"name": "label", "type": ["null", "string"], "default": None}]}


def test_dicts_come_back_equal_with_defaults_for_left_out_fields() -> None:
    serializer = AvroSerializer(CARD)
    assert serializer.decode(serializer.encode(VALUE)) == VALUE
    assert serializer.accepts(VALUE)
    short = {k: v for k, v in VALUE.items() if k not in ("tags", "last", "raw")}
    assert serializer.decode(serializer.encode(short)) == {
        **VALUE, "tags": [], "last": None, "raw": b"\xff"}  # (a bytes default as bytes)
    assert len(serializer.encode(VALUE)) < len(MsgpackSerializer().encode(VALUE)) // 2
    assert AvroSerializer(json.dumps(CARD)) == serializer  # (JSON text)
    for schema, value in (("long", -5), ('"string"', "x"), (["null", "int"], None),
                          ({"type": "map", "values": "long"}, {"a": 1})):
        assert AvroSerializer(schema).decode(AvroSerializer(schema).encode(value)) == value


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
@pytest.mark.parametrize("cls", [Point, PointTuple, PointModel])
def test_records_of_a_class_come_back_as_that_class(cls: type) -> None:
    serializer = AvroSerializer(POINT, cls)
    value = cls(x=3, y=1.5, label="a")
    assert serializer.decode(serializer.encode(value)) == value
    assert type(serializer.decode(serializer.encode(cls(x=1)))) is cls
    with pytest.raises(TypeError, match=rf"expected a {cls.__name__}, got dict"):
        serializer.encode({"x": 1})
    wrong = cls.model_construct(x="1") if cls is PointModel else cls(x="1")
    with pytest.raises(TypeError, match=r"field 'x': expected long, got str"):
        serializer.encode(wrong)
    copied = pickle.loads(pickle.dumps(serializer))  # (descriptors travel to Spark)
    assert copied == serializer and copied.decode(serializer.encode(value)) == value


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"count": "3"}, TypeError, r"field 'count': expected int, got str '3'"),
    ({"count": True}, TypeError, r"field 'count': expected int, got bool"),
    ({"count": 2.5}, TypeError, r"field 'count': expected int, got float"),
    ({"count": 2**40}, ValueError, r"field 'count': 1099511627776 is out of range"),
    ({"tags": "ab"}, TypeError, r"field 'tags': expected array<string>, got str"),
    ({"tags": ["a", 2]}, TypeError, r"field 'tags\[1\]': expected string, got int"),
    ({"owner": {"id": "7", "limits": {}}}, TypeError, r"field 'owner.id': expected long"),
    ({"owner": {"id": 7, "limits": {"eur": "5"}}}, TypeError,
     r"field 'owner.limits\[\"eur\"\]': expected double"),
    ({"owner": {"id": 7}}, TypeError, r"field 'owner.limits': missing, and it has no default"),
    ({"color": "BLUE"}, ValueError, r"field 'color': 'BLUE' is not a symbol of enum Color"),
    ({"last": "x"}, TypeError, r"field 'last': expected union\[null, double\], got str"),
    ({"key": b"abc"}, ValueError, r"field 'key': expected 2 bytes, got 3"),
    ({"cuont": 3}, TypeError, r"the value: 'cuont' is not a field of record Card"),
])
def test_a_wrong_value_is_refused_naming_the_field(
    change: dict[str, Any], error: type[Exception], message: str
) -> None:
    serializer = AvroSerializer(CARD)
    with pytest.raises(error, match=message):
        serializer.encode({**VALUE, **change})
    assert not serializer.accepts({**VALUE, **change})


def test_a_schema_or_class_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="needs an Avro schema"):
        AvroSerializer({"type": "record", "name": "R", "fields": [
            {"name": "a", "type": "int", "default": "x"}]})
    with pytest.raises(ConfigurationError, match="needs an Avro schema"):
        AvroSerializer({"type": "record", "name": "R", "fields": [
            {"name": "a", "type": "Unknown"}]})

    @dataclasses.dataclass
    class Other:
        x: int
        z: int

    with pytest.raises(TypeError, match=r"field 'z' is not a field of the schema's record"):
        AvroSerializer(POINT, Other)
    with pytest.raises(TypeError, match=r"needs a record schema"):
        AvroSerializer("long", Point)


def test_equal_schemas_make_equal_serializers() -> None:
    spelled = {**copy.deepcopy(CARD), "name": "shop.Card"}
    del spelled["namespace"]
    assert AvroSerializer(spelled) == AvroSerializer(CARD)  # (full names, normalised)
    assert hash(AvroSerializer(spelled)) == hash(AvroSerializer(CARD))
    assert AvroSerializer(spelled).schema() == AvroSerializer(CARD).schema()
    assert AvroSerializer(POINT) != AvroSerializer(POINT, Point)
    assert AvroSerializer(CARD) != AvroSerializer(changed(CARD, raw=None))
    assert repr(AvroSerializer(CARD)) == "AvroSerializer(Card)"
    assert json.loads(json.dumps(AvroSerializer(CARD).schema())) == AvroSerializer(
        CARD).schema()


# -------------------------------------------------------------------- resolution


def resolution(old: Any, new: Any) -> Any:
    return AvroSerializer(new).resolve("avro/1", json.loads(json.dumps(
        AvroSerializer(old).schema())))


def rewrite(found: SchemaResolution) -> Callable[[bytes], bytes]:
    assert found.compatibility is Compatibility.AFTER_MIGRATION, found.reason
    assert found.migrate is not None
    return found.migrate


def migrated(old: Any, new: Any, value: Any) -> Any:
    migrate = rewrite(resolution(old, new))
    return AvroSerializer(new).decode(migrate(AvroSerializer(old).encode(value)))


def as_is(old: Any, new: Any, value: Any) -> Any:
    found = resolution(old, new)
    assert found.compatibility is Compatibility.AS_IS, found.reason
    return AvroSerializer(new).decode(AvroSerializer(old).encode(value))


def test_the_same_schema_or_the_same_bytes_read_as_is() -> None:
    assert resolution(CARD, CARD).compatibility is Compatibility.AS_IS
    documented = changed(CARD, card={"name": "card", "type": "string", "doc": "its id"})
    assert as_is(CARD, documented, VALUE) == VALUE
    longer = changed(CARD, count={"name": "count", "type": "long"})  # (the same varint)
    assert as_is(CARD, longer, VALUE) == VALUE
    more = changed(CARD, color={"name": "color", "type": {
        "type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}})
    assert as_is(CARD, more, {**VALUE, "color": "GREEN"})["color"] == "GREEN"


def test_compatible_changes_migrate_every_field() -> None:
    v2 = {
        "type": "record", "name": "Card2", "namespace": "shop", "aliases": ["Card"],
        "fields": [
            {"name": "total", "type": "double"},                   # long -> double, moved
            {"name": "number", "type": "long", "aliases": ["count"]},  # renamed, widened
            {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": [
                "BLUE", "RED", "GREEN"]}},                         # a symbol first
            {"name": "owner", "type": ["null", {                   # made nullable
                "type": "record", "name": "Owner", "fields": [
                    {"name": "id", "type": "long"},
                    {"name": "since", "type": "bytes", "default": "\u0001"}]}]},
            {"name": "card", "type": "bytes"},                     # string -> bytes
            {"name": "limit", "type": "int", "default": 500},      # added
            {"name": "note", "type": ["null", "string"], "default": None},
        ],                                                         # tags, ...: removed
    }
    assert migrated(CARD, v2, VALUE) == {
        "total": 12.0, "number": 3, "color": "RED", "owner": {"id": 7, "since": b"\x01"},
        "card": b"c1", "limit": 500, "note": None}
    assert migrated("int", "double", 3) == 3.0
    assert migrated("int", ["null", "long"], 3) == 3
    assert migrated({"type": "array", "items": "float"}, {"type": "array", "items": "double"},
                    [0.5]) == [0.5]
    enum_v1 = {"type": "enum", "name": "E", "symbols": ["A", "B"]}
    enum_v2 = {"type": "enum", "name": "E", "symbols": ["A"], "default": "A"}
    assert migrated(enum_v1, enum_v2, "B") == "A"  # (a removed symbol: the default)


@pytest.mark.parametrize(("new", "rule"), [
    (changed(CARD, total={"name": "total", "type": "int"}),
     r"field 'total': long cannot be read as int \(a narrowed type\)"),
    (changed(CARD, card={"name": "card", "type": "int"}),
     r"field 'card': its type changed from string to int"),
    (changed(CARD, country={"name": "country", "type": "string"}),
     r"field 'country': new and without a default"),
    (changed(CARD, last={"name": "last", "type": "double"}),
     r"field 'last': null, a branch of the stored union, cannot be read as double "
     r"\(a nullable field made required\)"),
    (changed(CARD, color={"name": "color", "type": {"type": "enum", "name": "Color",
                                                    "symbols": ["RED"]}}),
     r"field 'color': symbol 'GREEN' of enum Color was removed and the enum has no "
     r"default"),
    (changed(CARD, key={"name": "key", "type": {"type": "fixed", "name": "Key", "size": 3}}),
     r"field 'key': fixed Key: its size changed from 2 to 3"),
    (changed(CARD, owner={"name": "owner", "type": {"type": "record", "name": "Holder",
                                                    "fields": [{"name": "id", "type": "long"}]}}),
     r"field 'owner': record Owner cannot be read as record Holder \(named types match"),
    (changed(CARD, owner={"name": "owner", "type": {"type": "record", "name": "Owner",
                                                    "fields": [{"name": "id", "type": "int"}]}}),
     r"field 'owner.id': long cannot be read as int"),
    (changed(CARD, tags={"name": "tags", "type": {"type": "array", "items": "long"}}),
     r"field 'tags\[\]': its type changed from string to long"),
    (changed(CARD, tags={"name": "tags", "type": {"type": "map", "values": "string"}}),
     r"field 'tags': its type changed from array<string> to map<string>"),
    ({**CARD, "name": "Other"}, r"the value: record Card cannot be read as record Other"),
])
def test_an_incompatible_change_is_refused_naming_the_field_and_rule(
    new: dict[str, Any], rule: str
) -> None:
    found = resolution(CARD, new)
    assert found.compatibility is Compatibility.INCOMPATIBLE
    assert re.search(rule, found.reason), found.reason


def test_pickled_msgpacked_or_typed_record_values_move_to_avro() -> None:
    """From pickle, plain dicts or weir's typed records: each stored value is read with
    the old serializer and written as Avro by field name (missing ones at defaults)."""
    serializer = AvroSerializer(POINT, Point)
    from_pickle = rewrite(serializer.resolve("pickle/5", None))
    assert serializer.decode(from_pickle(PickleSerializer().encode(
        PointTuple(2, 3.0)))) == Point(2, 3.0)
    from_dicts = rewrite(AvroSerializer(POINT).resolve("msgpack/1", None))
    assert AvroSerializer(POINT).decode(from_dicts(MsgpackSerializer().encode(
        {"x": 1, "extra": 0}))) == {"x": 1, "y": 0.0, "label": None}
    with pytest.raises(TypeError, match="field 'x': missing"):
        from_dicts(MsgpackSerializer().encode({"y": 1.0}))
    with pytest.raises(TypeError, match="field 'x': expected long, got str"):
        from_dicts(MsgpackSerializer().encode({"x": "1"}))

    @dataclasses.dataclass
    class Typed:
        x: int
        label: str | None

    old = RecordSerializer(Typed)
    from_records = rewrite(serializer.resolve("record/1", old.schema()))
    assert serializer.decode(from_records(old.encode(Typed(4, None)))) == Point(4)
    refused = AvroSerializer(changed(POINT, label={"name": "label", "type": "string"})
                             ).resolve("record/1", old.schema())
    assert refused.compatibility is Compatibility.INCOMPATIBLE
    assert "field 'label': a nullable str cannot be read as string" in refused.reason
    assert serializer.resolve("int64", None).compatibility is Compatibility.INCOMPATIBLE
    assert serializer.resolve(IntSerializer.type_id, None).reason


# ------------------------------------------------------- random schemas, changes

KINDS = ["int", "long", "float", "double", "string", "boolean", "bytes"]
VALUES = {
    "int": st.integers(-2**31, 2**31 - 1), "long": st.integers(-2**63, 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False), "double": st.floats(allow_nan=False),
    "string": st.text(max_size=5), "boolean": st.booleans(), "bytes": st.binary(max_size=5)}
PROMOTE = {"int": ["long", "float", "double"], "long": ["float", "double"],
           "float": ["double"], "string": ["bytes"]}


def converted(value: Any, old: str, new: str) -> Any:
    """A value of type ``old`` as Avro reads it as type ``new``."""
    if new == "float":
        return struct.unpack("<f", struct.pack("<f", float(value)))[0]
    if new == "double":
        return float(value)
    return value.encode() if (old, new) == ("string", "bytes") else value


def as_json(kind: str, value: Any) -> Any:
    return value.decode("latin-1") if kind == "bytes" else value


@st.composite
def compatible_change(draw: Any) -> tuple[Any, Any, list[dict[str, Any]], Any]:
    """An old record, a compatible new one (fields kept, promoted, made nullable,
    renamed with an alias, reordered, dropped, or added with a default; the record
    renamed with an alias), old values and the function giving their new form."""
    names = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True))
    old_fields = [(n, draw(st.sampled_from(KINDS))) for n in names]
    new_fields: list[dict[str, Any]] = []
    reads: list[tuple[str, Any]] = []  # (new name, old value -> new value)
    for name, kind in old_fields:
        if draw(st.booleans()) and len(old_fields) > 1:
            continue  # (dropped)
        target = draw(st.sampled_from([kind, *PROMOTE.get(kind, [])]))
        new_type: Any = target
        if draw(st.booleans()):
            new_type = draw(st.sampled_from([["null", target], [target, "null"]]))
        field: dict[str, Any] = {"name": name, "type": new_type}
        if draw(st.booleans()):
            field = {**field, "name": name.upper(), "aliases": [name]}
        new_fields.append(field)
        reads.append((field["name"], lambda v, n=name, k=kind, t=target: converted(v[n], k, t)))
    for extra in draw(st.lists(st.sampled_from("pqrs"), max_size=3, unique=True)):
        kind = draw(st.sampled_from(KINDS))
        default = draw(VALUES[kind])
        nullable = draw(st.booleans())
        new_fields.append({"name": extra, "type": [kind, "null"] if nullable else kind,
                           "default": as_json(kind, default)})
        reads.append((extra, lambda v, d=default: d))
    order = draw(st.permutations(range(len(new_fields))))
    renamed = draw(st.booleans())
    old = {"type": "record", "name": "Old", "fields": [
        {"name": n, "type": k} for n, k in old_fields]}
    new = {"type": "record", "name": "New" if renamed else "Old",
           "aliases": ["Old"] if renamed else [], "fields": [new_fields[i] for i in order]}
    values = draw(st.lists(st.fixed_dictionaries({n: VALUES[k] for n, k in old_fields}),
                           min_size=1, max_size=4))
    return old, new, values, lambda v: {n: read(v) for n, read in reads}


@settings(max_examples=150, deadline=None)
@given(compatible_change())
def test_random_compatible_changes_migrate_every_value(case: Any) -> None:
    old_schema, new_schema, values, expected = case
    old, new = AvroSerializer(old_schema), AvroSerializer(new_schema)
    found = new.resolve("avro/1", json.loads(json.dumps(old.schema())))
    assert found.compatibility is not Compatibility.INCOMPATIBLE, found.reason
    for value in values:
        data = old.encode(value)
        if found.migrate is not None:
            data = found.migrate(data)
        assert new.decode(data) == expected(value)


NARROWER = {"long": ["int"], "float": ["int", "long"], "double": ["int", "long", "float"]}


@st.composite
def incompatible_change(draw: Any) -> tuple[Any, Any, str]:
    """An old record and a new one with one change no rule covers, and the field."""
    names = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True))
    kinds = {n: draw(st.sampled_from(KINDS)) for n in names}
    nullable = {n: draw(st.booleans()) for n in names}
    fields = [{"name": n, "type": ["null", kinds[n]] if nullable[n] else kinds[n]}
              for n in names]
    victim = draw(st.sampled_from(names))
    how = draw(st.sampled_from(["retype", "required", "new", "renamed"]))
    new_fields = copy.deepcopy(fields)
    at = names.index(victim)
    named = victim
    if how == "retype":
        allowed = {kinds[victim], *PROMOTE.get(kinds[victim], [])}
        if kinds[victim] == "bytes":
            allowed.add("string")
        other = draw(st.sampled_from([k for k in KINDS if k not in allowed]))
        new_fields[at]["type"] = ["null", other] if nullable[victim] else other
        if other in NARROWER.get(kinds[victim], []):
            how = "narrowed"
    elif how == "required" and nullable[victim]:
        new_fields[at]["type"] = kinds[victim]
    else:  # (a new field without a default; or the field renamed without an alias)
        named = "z" if how == "new" else victim.upper()
        if how == "new":
            new_fields.append({"name": "z", "type": draw(st.sampled_from(KINDS))})
        else:
            new_fields[at]["name"] = named
        how = "new"
    new_fields = draw(st.permutations(new_fields))
    return ({"type": "record", "name": "R", "fields": fields},
            {"type": "record", "name": "R", "fields": list(new_fields)},
            f"{named}|{how}")


RULES = {"retype": "its type changed", "narrowed": "(a narrowed type)",
         "required": "(a nullable field made required)", "new": "new and without a default"}


@settings(max_examples=150, deadline=None)
@given(incompatible_change())
def test_random_incompatible_changes_are_refused_naming_the_field(case: Any) -> None:
    old, new, expected = case
    name, how = expected.split("|")
    found = resolution(old, new)
    assert found.compatibility is Compatibility.INCOMPATIBLE
    assert found.reason.startswith(f"field {name!r}: "), found.reason
    assert RULES[how] in found.reason, found.reason


# ---------------------------------------------------------- through real snapshots

V1 = {"type": "record", "name": "Card", "fields": [
    {"name": "count", "type": "int"}, {"name": "total", "type": "long"},
    {"name": "note", "type": "string"}]}
V2 = {"type": "record", "name": "Card", "fields": [
    {"name": "total", "type": "double"},                        # long -> double, moved
    {"name": "count", "type": "long"},
    {"name": "limit", "type": "int", "default": 500},           # added
    {"name": "last", "type": ["null", "string"], "default": None}]}  # added; note: removed


def descriptors(schema: Any, ttl: bool = False) -> list[Any]:
    serializer = AvroSerializer(schema)
    made: list[Any] = [ValueStateDescriptor("card", serializer),
                       ListStateDescriptor("history", serializer),
                       MapStateDescriptor("by_day", serializer=serializer)]
    if ttl:
        made = [d.enable_time_to_live(StateTtlConfig(ttl_ms=3_600_000)) for d in made]
    return made


class Writer(KeyedProcessFunction[Any, Any]):
    def __init__(self, ttl: bool = False) -> None:
        self.ttl = ttl

    def open(self, ctx: Any) -> None:
        self.value, self.history, self.by_day = (ctx.get_state(d)
                                                 for d in descriptors(V1, self.ttl))

    def process_element(self, value: Any, ctx: Any) -> Any:
        card = {"count": value % 7, "total": value, "note": f"n{value}"}
        self.value.update(card)
        self.history.add(card)
        self.by_day.put(f"d{value % 3}", card)
        return []


class Reader(KeyedProcessFunction[Any, Any]):
    def __init__(self, schema: Any, ttl: bool = False) -> None:
        self.schema, self.ttl = schema, ttl

    def open(self, ctx: Any) -> None:
        for d in descriptors(self.schema, self.ttl):
            ctx.get_state(d)  # (registered at open: the migration runs here)

    def process_element(self, value: Any, ctx: Any) -> Any:
        return []


def key(value: int) -> int:
    return value % 10


@pytest.mark.parametrize("ttl", [False, True], ids=["plain", "ttl"])
def test_a_restore_with_the_next_schema_migrates_every_state(backend: str, ttl: bool) -> None:
    """Value, list and map state (and with TTL) written with V1, restored with V2 on the
    same backend and on the other: every value migrated, the next snapshot in V2."""
    with KeyedOperatorHarness(Writer(ttl), key, state_backend=backend,
                              max_parallelism=16) as h:
        h.process_elements(range(40))
        snapshot = h.snapshot()
    value, history, by_day = descriptors(V2, ttl)
    other = "rocksdb" if backend == "hashmap" else "hashmap"
    for restored_on in (backend, other):
        with KeyedOperatorHarness.restore(Reader(V2, ttl), key, [snapshot], parallelism=1,
                                          subtask_index=0, state_backend=restored_on) as h:
            assert sorted(h.keys(value)) == list(range(10))
            for k in range(10):
                numbers = [n for n in range(40) if n % 10 == k]

                def card(n: int) -> dict[str, Any]:
                    return {"total": float(n), "count": n % 7, "limit": 500, "last": None}

                assert h.state_of(k, value) == card(numbers[-1])
                assert h.state_of(k, history) == [card(n) for n in numbers]
                assert h.state_of(k, by_day) == {f"d{n % 3}": card(n) for n in numbers}
            again = h.snapshot()  # (the next checkpoint holds the new schema)
        assert again.keyed is not None
        assert json.loads(again.keyed.metas["card"].schemas[0] or "null") == AvroSerializer(
            V2).schema()


def test_an_incompatible_schema_is_refused_naming_state_and_field(backend: str) -> None:
    with KeyedOperatorHarness(Writer(), key, state_backend=backend) as h:
        h.process_elements(range(5))
        snapshot = h.snapshot()
    narrowed = changed(V1, total={"name": "total", "type": "int"})
    with pytest.raises(StateMigrationError, match=re.compile(
            r"state 'card' cannot be restored with AvroSerializer\(Card\): field 'total': "
            r"long cannot be read as int \(a narrowed type\)")):
        KeyedOperatorHarness.restore(Reader(narrowed), key, [snapshot], parallelism=1,
                                     subtask_index=0, state_backend=backend)


def test_a_wrong_value_is_refused_as_it_is_written(backend: str) -> None:
    class Wrong(KeyedProcessFunction[Any, Any]):
        def open(self, ctx: Any) -> None:
            self.v = ctx.get_state(descriptors(V1)[0])

        def process_element(self, value: Any, ctx: Any) -> Any:
            self.v.update({"count": "3", "total": 1, "note": ""})
            return []

    with KeyedOperatorHarness(Wrong(), key, state_backend=backend) as h, pytest.raises(
            StateSerializationError, match=r"state 'card'.*field 'count': expected int"):
        h.process_element(1)


def test_a_savepoint_of_avro_state_reads_with_its_serializer(
    tmp_path: Any, backend: str
) -> None:
    coordinator = weir.CheckpointCoordinator(tmp_path / "chk")
    with KeyedOperatorHarness(Writer(), key, state_backend=backend, uid="cards") as h:
        h.process_elements(range(20))
        url = h.savepoint(coordinator, tmp_path / "sp").url
    read = weir.read_state(url, serializers=[AvroSerializer(V1)])
    rows = read.keyed_state("cards", "card")
    assert sorted(rows["value"].map(lambda v: v["total"])) == list(range(10, 20))
    assert len(read.keyed_state("cards", "history")) == 20


def test_a_savepoint_of_avro_state_reads_without_a_serializer(tmp_path: Any) -> None:
    coordinator = weir.CheckpointCoordinator(tmp_path / "chk")
    with KeyedOperatorHarness(Writer(), key, uid="cards") as h:
        h.process_elements(range(20))
        url = h.savepoint(coordinator, tmp_path / "sp").url
    rows = weir.read_state(url).keyed_state("cards", "card")
    assert rows["value"].iloc[0].keys() == {"count", "total", "note"}


def test_pickled_state_moves_to_avro_or_fails_naming_the_value(backend: str) -> None:
    """A state pickled before is read with pickle and rewritten as Avro during the
    restore; a stored value that does not fit the schema fails it, naming the field."""
    pickled = ValueStateDescriptor("card", PickleSerializer())

    class Old(KeyedProcessFunction[Any, Any]):
        def open(self, ctx: Any) -> None:
            self.v = ctx.get_state(pickled)

        def process_element(self, value: Any, ctx: Any) -> Any:
            note: Any = f"n{value}" if value != 13 else 13
            self.v.update({"count": value, "total": value, "note": note})
            return []

    def restored(values: range) -> Any:
        with KeyedOperatorHarness(Old(), lambda v: v, state_backend=backend) as h:
            h.process_elements(values)
            return h.snapshot()

    typed = ValueStateDescriptor("card", AvroSerializer(V2))
    with KeyedOperatorHarness.restore(Reader(V2), lambda v: v, [restored(range(10))],
                                      parallelism=1, subtask_index=0,
                                      state_backend=backend) as h:
        assert h.state_of(3, typed) == {"total": 3.0, "count": 3, "limit": 500, "last": None}
    with pytest.raises(StateMigrationError, match=r"state 'card': a stored value could not "
                                                  r"be migrated: field 'note': expected string"):
        KeyedOperatorHarness.restore(Reader(V1), lambda v: v, [restored(range(10, 15))],
                                     parallelism=1, subtask_index=0, state_backend=backend)
