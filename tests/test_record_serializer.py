"""Typed records in state (issue 41), at the serializer: dataclasses, NamedTuples and
pydantic models encoded by schema (not pickle), wrong values refused naming the field,
and Flink's three answers for a changed record — compatible as is, after migration (the
stored bytes rewritten), or incompatible (naming the field and the rule). Hypothesis
draws record schemas and compatible changes: every stored value comes back, new fields
at their defaults."""

from __future__ import annotations

import dataclasses
import json
import pickle
from typing import Any, NamedTuple

import msgpack
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.api.record_serializer import RecordSerializer
from weir.api.serializers import Compatibility, MsgpackSerializer, PickleSerializer


@dataclasses.dataclass
class Card:
    card: str
    count: int
    total: float
    tags: list[str] = dataclasses.field(default_factory=list)
    last: float | None = None


class Point(NamedTuple):
    x: int
    y: int = 0


class Account(pydantic.BaseModel):
    owner: str
    balance: float = 0.0
    cards: dict[str, Card] = {}


@dataclasses.dataclass
class Holder:
    point: Point
    points: list[Point]


def test_records_of_each_kind_come_back_equal() -> None:
    card = Card("c1", 3, 12.5, ["gold"], None)
    account = Account(owner="ann", balance=3.0, cards={"c1": card})
    holder = Holder(Point(1, 2), [Point(3), Point(4, 5)])
    for value in (card, Point(7, 8), account, holder):
        serializer = RecordSerializer(type(value))
        data = serializer.encode(value)
        assert serializer.decode(data) == value
        assert serializer.accepts(value)
    assert len(RecordSerializer(Card).encode(card)) < len(pickle.dumps(card)) // 3


def test_a_wrong_value_is_refused_naming_the_field() -> None:
    serializer = RecordSerializer(Card)
    with pytest.raises(TypeError, match=r"field count: expected an int, got str"):
        serializer.encode(Card("c1", "3", 1.0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"field tags\[1\]: expected a str, got int"):
        serializer.encode(Card("c1", 3, 1.0, ["a", 2]))  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"expected a Card, got Point"):
        serializer.encode(Point(1, 2))  # type: ignore[arg-type]
    assert not serializer.accepts(Card("c1", 3, None))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"type .*set.* cannot be in a typed record"):
        @dataclasses.dataclass
        class Bad:
            items: set[int]
        RecordSerializer(Bad)


def resolution(old: type, new: type) -> Any:
    return RecordSerializer(new).resolve("record/1", RecordSerializer(old).schema())


def test_an_unchanged_record_is_compatible_as_is_even_renamed() -> None:
    @dataclasses.dataclass
    class Renamed:
        card: str
        count: int
        total: float
        tags: list[str] = dataclasses.field(default_factory=list)
        last: float | None = None

    assert resolution(Card, Card).compatibility is Compatibility.AS_IS
    assert resolution(Card, Renamed).compatibility is Compatibility.AS_IS


def migrated(old_value: Any, new: type) -> Any:
    old = RecordSerializer(type(old_value))
    found = RecordSerializer(new).resolve("record/1", old.schema())
    assert found.compatibility is Compatibility.AFTER_MIGRATION, found.reason
    assert found.migrate is not None
    return RecordSerializer(new).decode(found.migrate(old.encode(old_value)))


def test_added_removed_reordered_and_widened_fields_migrate() -> None:
    @dataclasses.dataclass
    class V1:
        card: str
        count: int
        note: str

    @dataclasses.dataclass
    class V2:
        count: float                      # int -> float, moved first
        card: str | None                  # now nullable
        limit: int = 100                  # added, with a default
        seen: list[int] | None = None     # added, nullable
        # note: removed

    assert migrated(V1("c1", 3, "x"), V2) == V2(3.0, "c1", 100, None)


@pytest.mark.parametrize(("change", "rule"), [
    ("narrowed", r"field count: its type changed from float to int"),
    ("retyped", r"field card: its type changed from str to int"),
    ("required", r"field limit: a new field needs a default or to be nullable"),
    ("unnulled", r"field last: a nullable field cannot become required"),
])
def test_an_incompatible_change_is_refused_naming_the_field_and_rule(
    change: str, rule: str
) -> None:
    @dataclasses.dataclass
    class Old:
        card: str
        count: float
        last: int | None = None

    fields: dict[str, Any] = {"card": str, "count": float, "last": int | None}
    if change == "narrowed":
        fields["count"] = int
    elif change == "retyped":
        fields["card"] = int
    elif change == "unnulled":
        fields["last"] = int
    made = dataclasses.make_dataclass("New", [(n, t) for n, t in fields.items()]
                                      + ([("limit", int)] if change == "required" else []))
    found = RecordSerializer(made).resolve("record/1", RecordSerializer(Old).schema())
    assert found.compatibility is Compatibility.INCOMPATIBLE
    assert __import__("re").search(rule, found.reason), found.reason


def test_pickled_or_msgpacked_values_migrate_to_a_record() -> None:
    """Moving from pickle (the old only typed choice) or from plain dicts to a record:
    each stored value is read with the old serializer and rebuilt by field name."""
    serializer = RecordSerializer(Card)
    from_pickle = serializer.resolve("pickle/5", None)
    assert from_pickle.compatibility is Compatibility.AFTER_MIGRATION
    assert from_pickle.migrate is not None
    old = Card("c1", 2, 3.5)
    assert serializer.decode(from_pickle.migrate(PickleSerializer().encode(old))) == old
    from_dicts = serializer.resolve("msgpack/1", None)
    assert from_dicts.migrate is not None
    stored = MsgpackSerializer().encode({"card": "c2", "count": 1, "total": 2.0})
    assert serializer.decode(from_dicts.migrate(stored)) == Card("c2", 1, 2.0)
    with pytest.raises(TypeError, match="no field 'total'"):
        from_dicts.migrate(MsgpackSerializer().encode({"card": "c3", "count": 1}))
    assert serializer.resolve("int64", None).compatibility is Compatibility.INCOMPATIBLE


def test_records_read_without_their_class_are_dicts() -> None:
    """What weir.read_state does: the stored schema alone reads the values."""
    stored = RecordSerializer(Holder).encode(Holder(Point(1, 2), [Point(3, 4)]))
    reader = RecordSerializer.from_schema(RecordSerializer(Holder).schema())
    assert reader.decode(stored) == {"point": {"x": 1, "y": 2}, "points": [{"x": 3, "y": 4}]}
    assert msgpack.unpackb(stored) == [[1, 2], [[3, 4]]]  # (compact: values only)


# -------------------------------------------------------------- random schemas, changes

TYPES = {"int": int, "float": float, "str": str, "bool": bool}
VALUES = {"int": st.integers(-10**12, 10**12), "float": st.floats(allow_nan=False),
          "str": st.text(max_size=5), "bool": st.booleans()}


@st.composite
def schema_and_change(draw: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str, Any]],
                                          list[dict[str, Any]]]:
    """An old record (fields name -> type), a compatible new one (fields kept, widened,
    reordered, dropped, or added with a default) and old values."""
    names = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True))
    old = [(n, draw(st.sampled_from(sorted(TYPES)))) for n in names]
    new: list[tuple[str, str, Any]] = []
    for name, kind in old:
        if draw(st.booleans()) or len(new) == 0:
            widen = kind == "int" and draw(st.booleans())
            new.append((name, "float" if widen else kind, None))
    for extra in draw(st.lists(st.sampled_from("pqrs"), max_size=3, unique=True)):
        kind = draw(st.sampled_from(sorted(TYPES)))
        new.append((extra, kind, draw(VALUES[kind])))
    new = draw(st.permutations(new))
    values = draw(st.lists(st.fixed_dictionaries({n: VALUES[k] for n, k in old}),
                           min_size=1, max_size=5))
    return old, list(new), values


@settings(max_examples=150, deadline=None)
@given(schema_and_change())
def test_random_compatible_changes_restore_every_value(case: Any) -> None:
    old_fields, new_fields, values = case
    old_cls = dataclasses.make_dataclass("Old", [(n, TYPES[k]) for n, k in old_fields])
    new_cls = dataclasses.make_dataclass("New", [
        (n, TYPES[k]) if d is None else (n, TYPES[k], dataclasses.field(default=d))
        for n, k, d in sorted(new_fields, key=lambda f: f[2] is not None)])
    old, new = RecordSerializer(old_cls), RecordSerializer(new_cls)
    found = new.resolve("record/1", old.schema())
    assert found.compatibility is not Compatibility.INCOMPATIBLE, found.reason
    for value in values:
        data = old.encode(old_cls(**value))
        if found.migrate is not None:
            data = found.migrate(data)
        back = new.decode(data)
        for name, kind, default in new_fields:
            want = value[name] if default is None else default
            if default is None and kind == "float":
                want = float(want)
            assert getattr(back, name) == want


@st.composite
def schema_and_incompatible_change(draw: Any) -> tuple[type, type, str, str]:
    """An old record and a new one with one change no rule covers, on one field: its
    type changed (other than int -> float), made required from nullable, or a new field
    without a default that is not nullable; the field's name and the rule's words."""
    names = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True))
    old = {n: (draw(st.sampled_from(sorted(TYPES))), draw(st.booleans())) for n in names}
    new = dict(old)
    change = draw(st.sampled_from(["retyped", "required", "new"]))
    if change == "new" or (change == "required" and not any(n for _, n in old.values())):
        field, rule = "z", "a new field needs a default or to be nullable"
        new[field] = (draw(st.sampled_from(sorted(TYPES))), False)
    elif change == "required":
        field = draw(st.sampled_from(sorted(n for n, (_, null) in old.items() if null)))
        new[field], rule = (old[field][0], False), "a nullable field cannot become required"
    else:
        field = draw(st.sampled_from(names))
        kind = old[field][0]
        new[field] = (draw(st.sampled_from(sorted(
            k for k in TYPES if k != kind and (kind, k) != ("int", "float")))), old[field][1])
        rule = "its type changed"

    def record(name: str, fields: dict[str, tuple[str, bool]]) -> type:
        return dataclasses.make_dataclass(name, [
            (n, TYPES[k] | None if null else TYPES[k]) for n, (k, null) in fields.items()])
    return record("Old", old), record("New", new), field, rule


@settings(max_examples=150, deadline=None)
@given(schema_and_incompatible_change())
def test_random_incompatible_changes_are_refused_naming_the_field(case: Any) -> None:
    old_cls, new_cls, field, rule = case
    found = RecordSerializer(new_cls).resolve("record/1", RecordSerializer(old_cls).schema())
    assert found.compatibility is Compatibility.INCOMPATIBLE
    assert found.reason.startswith(f"field {field}: {rule}"), found.reason


def test_a_record_class_pickled_by_value_keeps_its_schema(tmp_path: Any) -> None:
    """Spark ships a class of the driver's ``__main__`` or notebook by value
    (cloudpickle), which copies ``dataclasses.MISSING`` of a field without a default:
    the class in the executor's process has the same schema (no field takes the copy
    as its default) and its records round-trip."""
    import subprocess
    import sys

    (tmp_path / "shipped_record.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass\nclass Shipped:\n"
        "    count: int\n    note: str = 'x'\n    tags: list[str] = "
        "dataclasses.field(default_factory=list)\n")
    driver = (
        "import sys; sys.path.insert(0, sys.argv[1]); import shipped_record\n"
        "from pyspark import cloudpickle; cloudpickle.register_pickle_by_value(shipped_record)\n"
        "sys.stdout.buffer.write(cloudpickle.dumps(shipped_record.Shipped))\n")
    executor = (
        "import json, pickle, sys\nfrom weir import RecordSerializer\n"
        "cls = pickle.loads(sys.stdin.buffer.read())\nserializer = RecordSerializer(cls)\n"
        "assert serializer.decode(serializer.encode(cls(3))) == cls(3, 'x', [])\n"
        "print(json.dumps(serializer.schema(), sort_keys=True))\n")
    shipped = subprocess.run([sys.executable, "-c", driver, str(tmp_path)], check=True,
                             capture_output=True).stdout
    received = subprocess.run([sys.executable, "-c", executor], input=shipped,
                              capture_output=True)
    assert received.returncode == 0, received.stderr.decode()
    sys.path.insert(0, str(tmp_path))
    try:
        import shipped_record  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("shipped_record", None)
    here = RecordSerializer(shipped_record.Shipped).schema()
    assert json.loads(received.stdout) == here
