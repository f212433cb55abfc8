"""Typed records as keyed state that evolves (issue 41), through snapshot and restore
on both backends: value, list and map state (and TTL) written with one version of a
record class and restored with the next — every value comes back migrated, new fields
at their defaults, at another parallelism too; the next snapshot is in the new schema;
an incompatible change or a changed user-key type is refused naming the operator,
state and field."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import weir
from test_record_serializer import TYPES, schema_and_change  # type: ignore[import-not-found]
from weir import (
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from weir.api.record_serializer import RecordSerializer
from weir.api.serializers import PickleSerializer
from weir.errors import StateMigrationError
from weir.testing import KeyedOperatorHarness


@dataclasses.dataclass
class CardV1:
    count: int
    total: int
    note: str


@dataclasses.dataclass
class CardV2:
    total: float                 # int -> float, moved
    count: int
    limit: int = 500             # added with a default
    last: str | None = None      # added, nullable
    # note: removed


@dataclasses.dataclass
class CardV2Again:
    """Another evolution of CardV1 (another default): as able to read it as CardV2."""

    total: float
    count: int
    limit: int = 700


def descriptors(cls: type, ttl: bool = False) -> list[Any]:
    serializer = RecordSerializer(cls)
    made: list[Any] = [ValueStateDescriptor("card", serializer),
                       ListStateDescriptor("history", serializer),
                       MapStateDescriptor("by_day", serializer=serializer)]
    if ttl:
        config = StateTtlConfig(ttl_ms=3_600_000)
        made = [d.enable_time_to_live(config) for d in made]
    return made


class Writer(KeyedProcessFunction[Any, Any]):
    def __init__(self, cls: type, ttl: bool) -> None:
        self.cls, self.ttl = cls, ttl

    def open(self, ctx: Any) -> None:
        self.value, self.history, self.by_day = (ctx.get_state(d) for d in
                                                 descriptors(self.cls, self.ttl))

    def process_element(self, value: Any, ctx: Any) -> Any:
        record = self.cls(count=value % 7, total=value, note=f"n{value}")
        self.value.update(record)
        self.history.add(record)
        self.by_day.put(f"d{value % 3}", record)
        return []


class Reader(KeyedProcessFunction[Any, Any]):
    def __init__(self, cls: type, ttl: bool) -> None:
        self.cls, self.ttl = cls, ttl

    def open(self, ctx: Any) -> None:
        for d in descriptors(self.cls, self.ttl):
            ctx.get_state(d)  # (registered at open: the migration runs here)

    def process_element(self, value: Any, ctx: Any) -> Any:
        return []


def key(value: int) -> int:
    return value % 10


def written(backend: str, ttl: bool) -> Any:
    with KeyedOperatorHarness(Writer(CardV1, ttl), key, state_backend=backend,
                              parallelism=1, max_parallelism=16) as h:
        h.process_elements(range(40))
        return h.snapshot()


@pytest.mark.parametrize("ttl", [False, True], ids=["plain", "ttl"])
@pytest.mark.parametrize("parallelism", [1, 2])
def test_a_restore_with_the_next_record_version_migrates_every_state(
    backend: str, ttl: bool, parallelism: int
) -> None:
    snapshot = written(backend, ttl)
    value, history, by_day = descriptors(CardV2, ttl)
    seen = {}
    for subtask in range(parallelism):
        other = "rocksdb" if backend == "hashmap" else "hashmap"  # (and across backends)
        h = KeyedOperatorHarness.restore(Reader(CardV2, ttl), key, [snapshot],
                                         parallelism=parallelism, subtask_index=subtask,
                                         state_backend=other)
        with h:
            for k in h.keys(value):
                seen[k] = (h.state_of(k, value), h.state_of(k, history), h.state_of(k, by_day))
            again = h.snapshot()  # (the next checkpoint holds the new schema)
        meta = again.keyed.metas["card"] if again.keyed is not None else None
        assert meta is not None and "CardV2" in (meta.schemas[0] or "")
    assert sorted(seen) == list(range(10))
    for k, (card, cards, days) in seen.items():
        numbers = [n for n in range(40) if n % 10 == k]
        assert card == CardV2(float(numbers[-1]), numbers[-1] % 7)
        assert cards == [CardV2(float(n), n % 7) for n in numbers]
        assert days == {f"d{n % 3}": CardV2(float(n), n % 7) for n in numbers}


@dataclasses.dataclass
class Narrowed:
    count: int
    total: int
    note: int  # (str -> int)


def test_an_incompatible_record_change_is_refused_naming_state_and_field(backend: str) -> None:
    snapshot = written(backend, False)
    with pytest.raises(StateMigrationError, match=re.compile(
            r"state 'card' cannot be restored with RecordSerializer\(Narrowed\): field note: "
            r"its type changed from str to int")):
        KeyedOperatorHarness.restore(Reader(Narrowed, False), key, [snapshot],
                                     parallelism=1, subtask_index=0, state_backend=backend)


def test_a_changed_user_key_type_is_refused(backend: str) -> None:
    class Keys(KeyedProcessFunction[Any, Any]):
        def __init__(self, serializer: Any) -> None:
            self.d = MapStateDescriptor("m", key_serializer=serializer)

        def open(self, ctx: Any) -> None:
            self.m = ctx.get_state(self.d)

        def process_element(self, value: Any, ctx: Any) -> Any:
            self.m.put(str(value), value)
            return []

    with KeyedOperatorHarness(Keys(None), key, state_backend=backend) as h:
        h.process_elements(range(5))
        snapshot = h.snapshot()
    with pytest.raises(StateMigrationError, match="keys never evolve"):
        KeyedOperatorHarness.restore(Keys(PickleSerializer()), key, [snapshot],
                                     parallelism=1, subtask_index=0, state_backend=backend)


def test_pickled_state_moves_to_a_record(backend: str) -> None:
    """The one typed choice before was pickle: a restore with a RecordSerializer reads
    the pickled objects and rewrites them as records."""
    pickled = ValueStateDescriptor("card", PickleSerializer())

    class Old(KeyedProcessFunction[Any, Any]):
        def open(self, ctx: Any) -> None:
            self.v = ctx.get_state(pickled)

        def process_element(self, value: Any, ctx: Any) -> Any:
            self.v.update(CardV1(value, value, "x"))
            return []

    with KeyedOperatorHarness(Old(), key, state_backend=backend) as h:
        h.process_elements(range(10))
        snapshot = h.snapshot()
    typed = ValueStateDescriptor("card", RecordSerializer(CardV2))
    with KeyedOperatorHarness.restore(Reader(CardV2, False), key, [snapshot], parallelism=1,
                                      subtask_index=0, state_backend=backend) as h:
        assert h.state_of(3, typed) == CardV2(3.0, 3)
    assert weir.StateMigrationError is StateMigrationError


def test_a_savepoint_of_records_reads_as_dicts_or_as_the_class_of_its_schema(
    tmp_path: Any, backend: str
) -> None:
    """weir.read_state needs no class: the schema stored with the state reads the
    records as dicts; given a RecordSerializer of the same schema, as its class; given
    one of a later version of the class, as that class (migrated). The same savepoint
    restores with the evolved class (the test above)."""
    coordinator = weir.CheckpointCoordinator(tmp_path / "chk")
    with KeyedOperatorHarness(Writer(CardV1, False), key, state_backend=backend,
                              uid="cards") as h:
        h.process_elements(range(20))
        url = h.savepoint(coordinator, tmp_path / "sp").url
    rows = weir.read_state(url).keyed_state("cards", "card")
    assert sorted(rows["value"].map(lambda v: v["total"])) == list(range(10, 20))
    assert rows["value"].iloc[0].keys() == {"count", "total", "note"}
    typed = weir.read_state(url, serializers=[RecordSerializer(CardV1)])
    history = typed.keyed_state("cards", "history")
    assert {type(v) for v in history["value"]} == {CardV1} and len(history) == 20
    # with the next version's class: migrated as a restore would, new fields at defaults
    newer = weir.read_state(url, serializers=[RecordSerializer(CardV2)])
    cards = newer.keyed_state("cards", "card")["value"]
    assert sorted(cards.map(lambda v: v.total)) == [float(n) for n in range(10, 20)]
    by_day = newer.keyed_state("cards", "by_day")["value"]
    assert {(type(v), v.limit, v.last) for v in [*cards, *by_day]} == {(CardV2, 500, None)}
    # two later classes that both could read it, neither of its name: say so, not guess
    either = weir.read_state(url, serializers=[RecordSerializer(CardV2),
                                               RecordSerializer(CardV2Again)])
    with pytest.raises(weir.ConfigurationError, match="several of the given serializers"):
        either.keyed_state("cards", "card")


def test_a_record_state_rewritten_with_write_savepoint_restores_typed(
    tmp_path: Any, backend: str
) -> None:
    """The escape hatch for changes no rule covers: read the records (dicts), change
    them, write them back into a savepoint (by the stored schema, or with a descriptor
    of the new class), and restore."""
    coordinator = weir.CheckpointCoordinator(tmp_path / "chk")
    with KeyedOperatorHarness(Writer(CardV1, False), key, state_backend=backend,
                              uid="cards") as h:
        h.process_elements(range(20))
        url = h.savepoint(coordinator, tmp_path / "sp").url
    cards = weir.read_state(url).keyed_state("cards", "card")
    cards["value"] = cards["value"].map(lambda v: {**v, "note": v["note"].upper()})
    same = weir.write_savepoint(tmp_path / "same", uid="cards", base=url,
                                states={"card": cards})
    value = ValueStateDescriptor("card", RecordSerializer(CardV1))
    with KeyedOperatorHarness.restore(Reader(CardV1, False), key, weir.load_checkpoint(same),
                                      parallelism=1, subtask_index=0, state_backend=backend,
                                      uid="cards") as h:
        assert h.state_of(3, value) == CardV1(13 % 7, 13, "N13")
    narrowed = cards.assign(value=cards["value"].map(
        lambda v: Narrowed(v["count"], v["total"], len(v["note"]))))
    typed = ValueStateDescriptor("card", RecordSerializer(Narrowed))
    moved = weir.write_savepoint(tmp_path / "moved", uid="cards", base=url,
                                 states={"card": narrowed}, descriptors=[typed])
    with KeyedOperatorHarness.restore(Nothing(), key, weir.load_checkpoint(moved),
                                      parallelism=1, subtask_index=0, state_backend=backend,
                                      uid="cards") as h:
        assert h.state_of(3, typed) == Narrowed(13 % 7, 13, 3)  # (registered here)


class Nothing(KeyedProcessFunction[Any, Any]):
    def process_element(self, value: Any, ctx: Any) -> Any:
        return []


# ------------------------------------------------ random schemas through the state store


class Holds(KeyedProcessFunction[Any, Any]):
    """Keeps each element (key, record) as the key's value and appends it to a list."""

    def __init__(self, cls: type) -> None:
        self.value = ValueStateDescriptor("v", RecordSerializer(cls))
        self.list = ListStateDescriptor("l", RecordSerializer(cls))

    def open(self, ctx: Any) -> None:
        self.v, self.lst = ctx.get_state(self.value), ctx.get_state(self.list)

    def process_element(self, element: Any, ctx: Any) -> Any:
        self.v.update(element[1])
        self.lst.add(element[1])
        return []


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=schema_and_change(), backends=st.sampled_from(
    [("hashmap", "rocksdb"), ("rocksdb", "hashmap"), ("rocksdb", "rocksdb")]),
    parallelism=st.integers(1, 3))
def test_random_compatible_changes_restore_every_stored_record(
    case: Any, backends: tuple[str, str], parallelism: int
) -> None:
    """Random record schemas and compatible changes, through value and list state,
    snapshot on one backend and restore on another at another parallelism: every
    stored record comes back with new fields at their defaults."""
    old_fields, new_fields, values = case
    old_cls = dataclasses.make_dataclass("Old", [(n, TYPES[k]) for n, k in old_fields])
    new_cls = dataclasses.make_dataclass("New", [
        (n, TYPES[k]) if d is None else (n, TYPES[k], dataclasses.field(default=d))
        for n, k, d in sorted(new_fields, key=lambda f: f[2] is not None)])
    with KeyedOperatorHarness(Holds(old_cls), lambda e: e[0], state_backend=backends[0],
                              max_parallelism=8) as h:
        for i, value in enumerate(values):
            h.process_element((i, old_cls(**value)))
        snapshot = h.snapshot()

    def expected(value: dict[str, Any]) -> Any:
        return new_cls(**{n: (float(value[n]) if k == "float" else value[n])
                          if d is None else d for n, k, d in new_fields})

    fn = Holds(new_cls)
    got = {}
    for subtask in range(parallelism):
        with KeyedOperatorHarness.restore(fn, lambda e: e[0], [snapshot],
                                          parallelism=parallelism, subtask_index=subtask,
                                          state_backend=backends[1]) as h:
            for k in h.keys(fn.value):
                got[k] = (h.state_of(k, fn.value), h.state_of(k, fn.list))
    assert got == {i: (expected(v), [expected(v)]) for i, v in enumerate(values)}
