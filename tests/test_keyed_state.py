"""Keyed state through KeyedOperatorHarness: every state kind, per-key isolation,
snapshot/restore across backends, inspection and error cases, on both backends.

Elements are ``(key, action)`` pairs; the function runs ``action(ctx)`` with the key
current and emits its result, so each test states its state access inline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import weir
from support import Action, Actions, Average, key_of, write_state
from weir import (
    AggregatingStateDescriptor,
    IntSerializer,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StrSerializer,
    ValueStateDescriptor,
)
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.testing import KeyedOperatorHarness

VALUE = ValueStateDescriptor("value")
LIST = ListStateDescriptor("list")
MAP = MapStateDescriptor("map")
SUM = ReducingStateDescriptor("sum", reduce_function=lambda a, b: a + b)
AVG = AggregatingStateDescriptor("avg", aggregate_function=Average())
OTHER = {"hashmap": "rocksdb", "rocksdb": "hashmap"}


def do(h: KeyedOperatorHarness, key: Any, action: Action) -> Any:
    """Run ``action(ctx)`` with ``key`` current; returns its result."""
    return h.process_element((key, action))[0]


@pytest.fixture
def h(backend: str) -> Iterator[KeyedOperatorHarness]:
    with KeyedOperatorHarness(Actions(), key_of, state_backend=backend) as harness:
        yield harness


def restored(snapshot: weir.OperatorSubtaskSnapshot, backend: str) -> KeyedOperatorHarness:
    return KeyedOperatorHarness.restore(
        Actions(), key_of, [snapshot], parallelism=1, subtask_index=0, state_backend=backend
    )


# ValueState ---------------------------------------------------------------------------


def test_value_state_is_none_until_updated_then_holds_latest_value(h):
    assert do(h, "a", lambda c: c.get_state(VALUE).value()) is None
    do(h, "a", lambda c: c.get_state(VALUE).update(1))
    do(h, "a", lambda c: c.get_state(VALUE).update(2))
    assert do(h, "a", lambda c: c.get_state(VALUE).value()) == 2


def test_value_state_update_none_and_clear_both_remove_the_value(h):
    do(h, "a", lambda c: c.get_state(VALUE).update("x"))
    do(h, "a", lambda c: c.get_state(VALUE).update(None))
    assert h.state_of("a", VALUE) is None
    assert h.keys(VALUE) == []
    do(h, "a", lambda c: c.get_state(VALUE).update("y"))
    do(h, "a", lambda c: c.get_state(VALUE).clear())
    assert h.state_of("a", VALUE) is None
    assert h.keys(VALUE) == []


# ListState ----------------------------------------------------------------------------


def test_list_state_is_empty_list_when_absent(h):
    assert do(h, "a", lambda c: c.get_list_state(LIST).get()) == []


def test_list_state_add_add_all_update_and_clear(h):
    do(h, "a", lambda c: c.get_list_state(LIST).add(1))
    do(h, "a", lambda c: c.get_list_state(LIST).add_all([2, 3]))
    do(h, "a", lambda c: c.get_list_state(LIST).add_all([]))
    assert h.state_of("a", LIST) == [1, 2, 3]
    do(h, "a", lambda c: c.get_list_state(LIST).update([9, 8]))
    assert h.state_of("a", LIST) == [9, 8]
    do(h, "a", lambda c: c.get_list_state(LIST).update([]))
    assert h.state_of("a", LIST) == []
    do(h, "a", lambda c: c.get_list_state(LIST).add(7))
    do(h, "a", lambda c: c.get_list_state(LIST).clear())
    assert h.state_of("a", LIST) == []
    assert h.keys(LIST) == []


def test_list_state_get_returns_a_copy(h):
    do(h, "a", lambda c: c.get_list_state(LIST).add_all([1, 2]))
    got = do(h, "a", lambda c: c.get_list_state(LIST).get())
    got.append(3)
    got[0] = 100
    assert h.state_of("a", LIST) == [1, 2]


@pytest.mark.parametrize(
    "write",
    [lambda s: s.add(None), lambda s: s.add_all([1, None]), lambda s: s.update([None])],
    ids=["add", "add_all", "update"],
)
def test_list_state_rejects_none_elements(h, write):
    do(h, "a", lambda c: c.get_list_state(LIST).add(1))
    with pytest.raises(weir.StateError, match="None"):
        do(h, "a", lambda c: write(c.get_list_state(LIST)))
    assert h.state_of("a", LIST) == [1]


# MapState -----------------------------------------------------------------------------


def test_map_state_get_put_put_all_remove_contains(h):
    def scenario(c: Any) -> None:
        m = c.get_map_state(MAP)
        assert m.is_empty()
        assert m.get("x") is None
        assert m.get("x", 0) == 0
        m.put("x", 1)
        m.put_all({"y": 2, "z": 3})
        m.put_all([("w", 4)])
        assert m.get("x") == 1
        assert m.contains("y")
        assert not m.contains("nope")
        m.remove("z")
        m.remove("never-there")
        assert not m.contains("z")
        assert not m.is_empty()

    do(h, "a", scenario)
    assert h.state_of("a", MAP) == {"x": 1, "y": 2, "w": 4}


def test_map_state_keys_values_items_and_iteration(h):
    do(h, "a", lambda c: c.get_map_state(MAP).put_all({"x": 1, "y": 2}))

    def views(c: Any) -> tuple[Any, ...]:
        m = c.get_map_state(MAP)
        return sorted(m.keys()), sorted(m.values()), sorted(m.items()), sorted(m)

    assert do(h, "a", views) == (["x", "y"], [1, 2], [("x", 1), ("y", 2)], ["x", "y"])


def test_map_state_dunder_access(h):
    def scenario(c: Any) -> None:
        m = c.get_map_state(MAP)
        m["k"] = "v"
        assert m["k"] == "v"
        assert "k" in m
        assert "other" not in m
        with pytest.raises(KeyError):
            m["other"]
        del m["k"]
        assert "k" not in m
        with pytest.raises(KeyError):
            del m["k"]

    do(h, "a", scenario)
    assert h.state_of("a", MAP) == {}


def test_map_state_clear_removes_every_entry(h):
    do(h, "a", lambda c: c.get_map_state(MAP).put_all({1: "a", 2: "b"}))
    do(h, "a", lambda c: c.get_map_state(MAP).clear())
    assert do(h, "a", lambda c: c.get_map_state(MAP).is_empty())
    assert h.keys(MAP) == []


# Reducing / aggregating ---------------------------------------------------------------


def test_reducing_state_folds_added_values(h):
    assert do(h, "a", lambda c: c.get_reducing_state(SUM).get()) is None
    for v in (1, 2, 3):
        do(h, "a", lambda c, v=v: c.get_reducing_state(SUM).add(v))
    assert h.state_of("a", SUM) == 6
    do(h, "a", lambda c: c.get_reducing_state(SUM).clear())
    assert h.state_of("a", SUM) is None


def test_aggregating_state_computes_an_average(h):
    assert do(h, "a", lambda c: c.get_aggregating_state(AVG).get()) is None
    for v in (1, 2, 6):
        do(h, "a", lambda c, v=v: c.get_aggregating_state(AVG).add(v))
    assert h.state_of("a", AVG) == 3
    do(h, "a", lambda c: c.get_aggregating_state(AVG).clear())
    assert h.state_of("a", AVG) is None
    do(h, "a", lambda c: c.get_aggregating_state(AVG).add(10))
    assert h.state_of("a", AVG) == 10


# Per-key isolation --------------------------------------------------------------------

DESCS = {"value": VALUE, "list": LIST, "map": MAP, "reducing": SUM, "aggregating": AVG}


def writer(kind: str, value_of: Callable[[Any], Any] = lambda c: c.current_key) -> Action:
    """An action writing ``value_of(ctx)`` (default: the current key) to ``kind``."""

    return lambda c: write_state(c.get_state(DESCS[kind]), kind, value_of(c))


WRITERS = {kind: (desc, writer(kind)) for kind, desc in DESCS.items()}
EXPECTED = {
    "value": lambda k: k, "list": lambda k: [k], "map": lambda k: {"k": k},
    "reducing": lambda k: k, "aggregating": lambda k: k,
}
EMPTY = {"value": None, "list": [], "map": {}, "reducing": None, "aggregating": None}


@pytest.mark.parametrize("kind", list(WRITERS))
def test_each_key_sees_only_its_own_state(h, kind):
    desc, write = WRITERS[kind]
    keys = list(range(50))
    for k in keys:
        do(h, k, write)
    assert sorted(h.keys(desc)) == keys
    for k in keys:
        assert h.state_of(k, desc) == EXPECTED[kind](k)
    assert h.state_of(1000, desc) == EMPTY[kind]


@pytest.mark.parametrize("kind", list(WRITERS))
def test_clear_only_affects_the_current_key(h, kind):
    desc, write = WRITERS[kind]
    for k in (1, 2, 3):
        do(h, k, write)
    do(h, 2, lambda c: c.get_state(desc).clear())
    assert sorted(h.keys(desc)) == [1, 3]
    assert h.state_of(2, desc) == EMPTY[kind]
    assert h.state_of(1, desc) == EXPECTED[kind](1)
    assert h.state_of(3, desc) == EXPECTED[kind](3)


def test_composite_tuple_keys_are_distinct_states(h):
    for key in [("a", 1), ("a", 2), ("b", 1)]:
        do(h, key, lambda c: c.get_state(VALUE).update(list(c.current_key)))
    assert sorted(h.keys(VALUE)) == [("a", 1), ("a", 2), ("b", 1)]
    assert h.state_of(("a", 2), VALUE) == ["a", 2]


# Value types, snapshot and restore ----------------------------------------------------

ROUND_TRIP = [
    (1, 2, "three"), {1, 2, 3}, frozenset({"x"}), {"a": 1, "b": [1, 2]},
    {(1, 2): {"nested": (3, {4, 5})}}, [(1, (2, 3)), {"k": frozenset({(4, 5)})}],
    b"\x00bytes", 1.5, True,
]


@pytest.mark.parametrize("value", ROUND_TRIP, ids=repr)
def test_values_round_trip_live_and_through_snapshot_into_other_backend(h, backend, value):
    for kind in ("value", "list", "map"):
        do(h, "a", writer(kind, lambda c: value))
    assert h.state_of("a", VALUE) == value
    with restored(h.snapshot(), OTHER[backend]) as r:
        got = [r.state_of("a", VALUE), *r.state_of("a", LIST), r.state_of("a", MAP)["k"]]
        assert got == [value] * 3
        assert {type(g) for g in got} == {type(value)}


def test_map_state_with_non_string_keys_round_trips(h, backend):
    entries = {1: "int", (1, "t"): "tuple", b"b": "bytes", 2.5: "float"}
    do(h, "a", lambda c: c.get_map_state(MAP).put_all(entries))
    with restored(h.snapshot(), OTHER[backend]) as r:
        assert r.state_of("a", MAP) == entries


def test_every_state_kind_survives_restore_into_the_other_backend_and_back(h, backend):
    keys = [3, 5, 7]
    for k in keys:
        for _desc, write in WRITERS.values():
            do(h, k, write)
            do(h, k, write)
    expected = {
        VALUE: lambda k: k, LIST: lambda k: [k, k], MAP: lambda k: {"k": k},
        SUM: lambda k: k + k, AVG: lambda k: k,
    }
    with (
        restored(h.snapshot(), OTHER[backend]) as there,
        restored(there.snapshot(), backend) as back,
    ):
        for r in (there, back):
            for desc, want in expected.items():
                assert sorted(r.keys(desc)) == keys
                for k in keys:
                    assert r.state_of(k, desc) == want(k)
        do(back, 3, lambda c: c.get_reducing_state(SUM).add(1))
        assert back.state_of(3, SUM) == 7


def test_state_of_inspects_without_disturbing_the_current_key(h):
    do(h, "a", lambda c: c.get_state(VALUE).update(1))
    do(h, "b", lambda c: c.get_state(VALUE).update(2))

    def peek_then_read(c: Any) -> Any:
        assert h.state_of("b", VALUE) == 2
        return c.get_state(VALUE).value()

    assert do(h, "a", peek_then_read) == 1
    assert h.state_of("nobody", VALUE) is None


# Errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "again",
    [
        ListStateDescriptor("value"),
        MapStateDescriptor("value"),
        ValueStateDescriptor("value", serializer=IntSerializer()),
        ValueStateDescriptor("value", ttl=weir.StateTtlConfig(ttl_ms=10)),
    ],
    ids=["other-kind", "map-kind", "other-serializer", "with-ttl"],
)
def test_registering_a_name_again_differently_is_rejected(h, again):
    assert do(h, "a", lambda c: c.get_state(VALUE) is c.get_state(VALUE))
    with pytest.raises(weir.StateRegistrationError, match="'value'"):
        do(h, "a", lambda c: c.get_state(again))


def test_map_key_serializer_change_is_rejected(h):
    do(h, "a", lambda c: c.get_map_state(MapStateDescriptor("m", key_serializer=StrSerializer())))
    with pytest.raises(weir.StateRegistrationError):
        do(h, "a", lambda c: c.get_map_state(MapStateDescriptor("m")))


def in_open(kind: str, use: str) -> Action:
    desc = DESCS[kind]
    if use == "write":
        return writer(kind, lambda c: 1)
    if use == "clear":
        return lambda c: c.get_state(desc).clear()
    if kind == "value":
        return lambda c: c.get_state(desc).value()
    return lambda c: c.get_state(desc).get(*(["k"] if kind == "map" else []))


@pytest.mark.parametrize("use", ["read", "write", "clear"])
@pytest.mark.parametrize("kind", list(WRITERS))
def test_keyed_state_in_open_raises_no_key_context(backend, kind, use):
    h = KeyedOperatorHarness(Actions(on_open=in_open(kind, use)), key_of, state_backend=backend)
    try:
        with pytest.raises(weir.NoKeyContextError, match="open"):
            h.open()
    finally:
        h.close()


@pytest.mark.parametrize("kind", ["value", "list", "map-value", "map-key", "reducing"])
def test_unencodable_value_raises_serialization_error_naming_state_and_type(h, kind):
    writes = {
        "value": ("value", lambda c: c.get_state(VALUE).update(object())),
        "list": ("list", lambda c: c.get_list_state(LIST).add(object())),
        "map-value": ("map", lambda c: c.get_map_state(MAP).put("k", object())),
        "map-key": ("map", lambda c: c.get_map_state(MAP).put(object(), 1)),
        "reducing": ("sum", lambda c: c.get_reducing_state(SUM).add(object())),
    }
    name, write = writes[kind]
    with pytest.raises(weir.StateSerializationError) as info:
        do(h, "a", write)
    assert f"'{name}'" in str(info.value)
    assert "object" in str(info.value)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_an_int_beyond_64_bits_fails_the_snapshot_naming_the_state(backend, asynchronous):
    """A write checks a value's type once per type (the hash map encodes at snapshot
    time), so a later int that does not fit IntSerializer fails the snapshot with the
    typed error, whichever way the snapshot encodes."""
    counts = ValueStateDescriptor("counts", weir.IntSerializer())
    with KeyedOperatorHarness(Actions(), key_of, state_backend=backend) as h:
        do(h, "a", lambda c: c.get_state(counts).update(1))
        if backend == "rocksdb":  # (encoded at the write)
            with pytest.raises(weir.StateSerializationError, match="'counts'"):
                do(h, "b", lambda c: c.get_state(counts).update(1 << 70))
            return
        do(h, "b", lambda c: c.get_state(counts).update(1 << 70))
        op = h._op
        with pytest.raises(weir.StateSerializationError, match=r"'counts'.*int"):
            if asynchronous:  # frozen now, encoded later
                op.prepare_snapshot(1, 0)()
            else:  # encoded from the live state
                [list(entries) for _, entries in op.backend.snapshot_sources()]


def test_key_owned_by_another_subtask_raises_key_group_error(backend):
    foreign = next(
        k for k in range(1000) if assign_key_to_parallel_operator(k, 128, 2) == 1
    )
    own = next(k for k in range(1000) if assign_key_to_parallel_operator(k, 128, 2) == 0)
    with KeyedOperatorHarness(
        Actions(), key_of, state_backend=backend, parallelism=2, subtask_index=0
    ) as h:
        do(h, own, lambda c: c.get_state(VALUE).update(1))
        with pytest.raises(weir.KeyGroupError, match=repr(foreign)):
            do(h, foreign, lambda c: c.get_state(VALUE).update(2))
        assert h.keys(VALUE) == [own]


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: weir.ValueStateDescriptor("n", int), "not the type of the values"),
        (lambda: weir.ListStateDescriptor("n", weir.IntSerializer), "pass an instance"),
        (lambda: weir.MapStateDescriptor("n", key_serializer=str), "key_serializer"),
        (lambda: weir.ReducingStateDescriptor("n", max, serializer="msgpack"),
         "leave it out for the default"),
    ],
)
def test_a_descriptor_given_something_else_than_a_serializer_says_what_to_pass(
    make: Any, says: str
) -> None:
    with pytest.raises(weir.ConfigurationError, match=r"state 'n': \w*serializer must be a "
                       r"weir Serializer instance") as excinfo:
        make()
    assert says in str(excinfo.value)
