"""The hash map's C fast paths (``weir/state/_hashcore.c``) behave exactly as the
Python ``_slow_`` methods that hold the whole semantics.

Two operators get the same random calls: one through the public state methods (C
whenever the fast case applies), one through the ``_slow_`` methods only. Results,
errors, stored entries and the changelog's dirty keys must be identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    NoKeyContextError,
    ReducingStateDescriptor,
    StateSerializationError,
    ValueStateDescriptor,
)
from weir.state import hashmap_tables
from weir.state._hashcore import KeyCell, ListCore, MapCore, ValueCore
from weir.testing import KeyedOperatorHarness


class _Noop(KeyedProcessFunction[Any, Any]):
    def process_element(self, value: Any, ctx: Any) -> None:
        return None


class _Count(AggregateFunction[Any, int, int]):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


def _join(a: Any, b: Any) -> Any:
    return [a, b] if b == "to-list" else (object() if b == "bad" else f"{a}{b}")


DESCRIPTORS = {
    "value": ValueStateDescriptor("value"),
    "list": ListStateDescriptor("list"),
    "map": MapStateDescriptor("map"),
    "reducing": ReducingStateDescriptor("reducing", reduce_function=_join),
    "aggregating": AggregatingStateDescriptor("aggregating", aggregate_function=_Count()),
}

KEYS = st.sampled_from(["a", "b", 7])
VALUES = st.one_of(
    st.integers(-3, 3), st.sampled_from(["x", "y", "to-list", "bad"]), st.none(),
    st.booleans(), st.floats(allow_nan=False, width=32), st.lists(st.integers(0, 2), max_size=2),
    st.just(object()),  # never encodable: the write check must refuse it
)
USER_KEYS = st.one_of(st.sampled_from(["k", "", "é"]), st.integers(-2, 2), st.booleans(),
                      st.floats(allow_nan=False, width=16), st.tuples(st.integers(0, 1)))
CALLS = st.lists(st.tuples(
    st.sampled_from(["value", "update", "list_get", "list_add", "map_get", "map_get_default",
                     "map_put", "reduce", "aggregate", "no_key"]),
    KEYS, VALUES, USER_KEYS,
), max_size=40)


class _Side:
    """One operator and the way its calls are made (public methods or ``_slow_``)."""

    def __init__(self, slow: bool, sample_mask: int = 0) -> None:
        self.harness = KeyedOperatorHarness(_Noop(), lambda e: e)
        op = self.harness.operator
        op.open()
        op.keyed_state.backend.track_changes()
        self.op, self.slow = op, slow
        self.states = {n: op.keyed_state.get_state(d) for n, d in DESCRIPTORS.items()}
        self.tables = {n: op.keyed_state.backend._tables[d.name]  # type: ignore[attr-defined]
                       for n, d in DESCRIPTORS.items()}
        for table in self.tables.values():  # (the backend samples large states only)
            table.track_changes(sample_mask)

    def _call(self, table: str, method: str, *args: Any) -> Any:
        target = self.tables[table] if self.slow else self.states[table]
        if self.slow:
            method = f"_slow_{method}"
        elif table in ("reducing", "aggregating"):
            return target.add(*args)
        return getattr(target, method)(*args)

    def run(self, call: str, key: Any, value: Any, user_key: Any) -> Any:
        if call == "no_key":
            self.op.key_context.clear()
            return self._call("value", "value")
        self.op.key_context.set_current_key(key)
        reduce_fn, agg = _join, _Count()
        actions: dict[str, Callable[[], Any]] = {
            "value": lambda: self._call("value", "value"),
            "update": lambda: self._call("value", "update", value),
            "list_get": lambda: self._call("list", "get"),
            "list_add": lambda: self._call("list", "add", value),
            "map_get": lambda: self._call("map", "get", user_key),
            "map_get_default": lambda: self._call("map", "get", user_key, "absent"),
            "map_put": lambda: self._call("map", "put", user_key, value),
            "reduce": lambda: (self._call("reducing", "reduce_add", reduce_fn, value)
                               if self.slow else self._call("reducing", "add", value)),
            "aggregate": lambda: (
                self._call("aggregating", "aggregate_add", agg.add, agg.create_accumulator,
                           value) if self.slow else self._call("aggregating", "add", value)),
        }
        return actions[call]()

    def stored(self) -> dict[str, Any]:
        return {n: dict(t._data) for n, t in self.tables.items()}

    def dirty(self) -> dict[str, Any]:
        return {n: (set(t._dirty or ()), t._writes) for n, t in self.tables.items()}


def _outcome(side: _Side, call: tuple[str, Any, Any, Any]) -> Any:
    try:
        result = side.run(*call)
    except (NoKeyContextError, StateSerializationError) as exc:
        return ("raised", type(exc).__name__, str(exc))
    except Exception as exc:  # any other error must match too
        return ("raised", type(exc).__name__, str(exc))
    return ("returned", repr(result))


@settings(max_examples=300, deadline=None)
@given(calls=CALLS, sample_mask=st.sampled_from([0, 1]))
def test_fast_paths_match_the_python_semantics(
    calls: list[tuple[str, Any, Any, Any]], sample_mask: int,
) -> None:
    """Results, errors, entries and the change record (keys written, or with a sample
    mask only the sampled ones, and the count of writes) are the same either way."""
    fast, slow = _Side(slow=False, sample_mask=sample_mask), _Side(True, sample_mask)
    try:
        for call in calls:
            assert _outcome(fast, call) == _outcome(slow, call), call
            assert repr(fast.stored()) == repr(slow.stored())
            assert fast.dirty() == slow.dirty()
    finally:
        fast.harness.close()
        slow.harness.close()


def test_the_hash_map_tables_use_the_c_methods() -> None:
    """The public calls resolve to the C fast paths (a refactoring that shadows them
    with Python methods would silently lose the speed)."""
    assert hashmap_tables.HashMapValueTable.value is ValueCore.value  # type: ignore[attr-defined]
    assert hashmap_tables.HashMapValueTable.update is ValueCore.update  # type: ignore[attr-defined]
    assert hashmap_tables.HashMapValueTable.reduce_add is ValueCore.reduce_add  # type: ignore[attr-defined]
    assert hashmap_tables.HashMapListTable.get is ListCore.get  # type: ignore[attr-defined]
    assert hashmap_tables.HashMapListTable.add is ListCore.add  # type: ignore[attr-defined]
    assert hashmap_tables.HashMapMapTable.get is MapCore.get  # type: ignore[attr-defined]
    assert hashmap_tables.HashMapMapTable.put is MapCore.put  # type: ignore[attr-defined]
    from weir.state.keycontext import KeyContext

    assert issubclass(KeyContext, KeyCell)


@pytest.mark.parametrize("replace", ["_ok", "_key_ok"])
def test_a_replaced_accepted_set_forgets_the_type_last_accepted(replace: str) -> None:
    """The C side remembers the type last found in ``_ok``/``_key_ok``; a new set
    starts with nothing accepted, so the write check runs again."""
    side = _Side(slow=False)
    try:
        side.op.key_context.set_current_key("a")
        m = side.states["map"]
        m.put("k", 1)
        checked: list[Any] = []
        table = side.tables["map"]
        check = table._key_check if replace == "_key_ok" else table._check
        table._key_check = table._check = lambda v: (checked.append(v), check(v))
        setattr(table, replace, set())
        m.put("k", 2)
        assert checked == ["k"] if replace == "_key_ok" else checked == [2]
        assert m.get("k") == 2
    finally:
        side.harness.close()


# ------------------------------------------------------------------ the current key

#: keys of every kind: the C path takes str and int (msgpack's every int width, UTF-8
#: of any length), Python the rest (other types, ints beyond 64 bits, lone surrogates)
KEYS = st.one_of(
    st.text(max_size=40), st.text(min_size=250, max_size=300),
    st.integers(min_value=-(2**64), max_value=2**65),
    st.sampled_from([0, 31, 32, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, 2**31,
                     2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1, -32, -33,
                     -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63),
                     -(2**63) - 1, "x" * 31, "x" * 32, "é" * 128, "\ud800", "a\udfffb"]),
    st.none(), st.booleans(), st.floats(allow_nan=False), st.binary(max_size=8),
    st.tuples(st.integers(), st.text(max_size=4)),
)


def _python_key(key: Any, max_parallelism: int) -> tuple[int, bytes] | type[Exception]:
    """The specification: ``(group, prefixed key)``, or the error's type."""
    from weir.state.keygroups import canonical_key_bytes
    from weir.state.keyhash import key_hash

    try:
        raw = canonical_key_bytes(key)
    except Exception as exc:  # the type is compared
        return type(exc)
    group = key_hash(key) % max_parallelism
    return group, group.to_bytes(2, "big") + raw


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(KEYS, max_size=30), max_parallelism=st.integers(1, 32768),
       parallelism=st.integers(1, 8), split=st.integers(0, 32767))
def test_set_current_key_and_routes_in_c_match_the_python_specification(
    keys: list[Any], max_parallelism: int, parallelism: int, split: int
) -> None:
    """``KeyContext.set_current_key`` (C for str and int keys) and ``route_keys`` give
    every key the canonical bytes and key-hash group of ``weir.state.keygroups``; keys of
    groups outside the subtask's range raise KeyGroupError; keys C does not take go to
    Python (``route_keys`` lists them), with the same errors."""
    import array

    from weir.errors import KeyGroupError
    from weir.state._hashcore import route_keys
    from weir.state.keycontext import KeyContext
    from weir.state.keygroups import KeyGroupRange

    parallelism = min(parallelism, max_parallelism)
    end = split % max_parallelism
    ctx = KeyContext(max_parallelism, KeyGroupRange(0, end))
    for key in keys:
        expected = _python_key(key, max_parallelism)
        if isinstance(expected, type):
            with pytest.raises(expected):
                ctx.set_current_key(key)
            continue
        group, prefixed = expected
        if group > end:
            with pytest.raises(KeyGroupError):
                ctx.set_current_key(key)
            continue
        ctx.set_current_key(key)
        assert (ctx.key_bytes, ctx.key_group) == (prefixed, group)
        assert ctx.key is key

    table = tuple(range(100, 100 + parallelism))
    data, slow = route_keys(keys, max_parallelism, parallelism, table)
    routes = array.array("i", bytes(data))
    c_kinds = (str, int)
    assert slow == [j for j, k in enumerate(keys) if type(k) not in c_kinds
                    or isinstance(_python_key(k, max_parallelism), type)]
    for j, key in enumerate(keys):
        if j not in slow:
            group, _ = _python_key(key, max_parallelism)  # type: ignore[misc]
            assert routes[j] == table[group * parallelism // max_parallelism]


def test_int64_range_is_the_arrow_order_column() -> None:
    import array

    from weir.state._hashcore import int64_range

    base = 3 << 40
    assert list(array.array("q", bytes(int64_range(base, 5)))) == list(range(base, base + 5))
    assert int64_range(7, 0) == bytearray()


# ------------------------------------------------------------------ restore in C

#: every msgpack scalar format, minimal or not (float 32, a str 8 of 3 bytes, int 64 of
#: 1), arrays / maps / extension types, and bytes that are no msgpack value at all
_RAW = st.one_of(
    st.builds(lambda v: __import__("msgpack").packb(v, use_bin_type=True), st.one_of(
        st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1),
        st.sampled_from([127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, -1, -32,
                         -33, -128, -129, -32768, -32769, -(1 << 31), -(1 << 31) - 1,
                         -(1 << 63), (1 << 63) - 1, 1 << 63, (1 << 64) - 1]),
        st.floats(allow_nan=False), st.text(max_size=300), st.binary(max_size=300),
        st.lists(st.integers(-9, 9), max_size=2), st.dictionaries(
            st.text(max_size=2), st.integers(-9, 9), max_size=2))),
    st.builds(lambda f: __import__("msgpack").packb(f, use_single_float=True),
              st.floats(allow_nan=False, width=32)),
    st.sampled_from([b"\xd9\x03abc", b"\xd3" + (1).to_bytes(8, "big"), b"\xcc\x05",
                     b"\xc5\x00\x01z", b"\xd4\x01\x01", b"\x91\x01"]),
)
#: no msgpack value (truncated, trailing bytes, invalid UTF-8, the unused type byte)
_BAD_RAW = st.one_of(st.sampled_from([b"\xa2\xc3\x28", b"\xd9\xff", b"\x01\x02", b"",
                                      b"\xc1", b"\xcb\x00", b"\xcd\x01"]),
                     st.binary(max_size=12))


@settings(max_examples=400, deadline=None)
@given(raws=st.lists(_RAW, max_size=20), bad=st.lists(_BAD_RAW, max_size=1),
       flat=st.booleans())
def test_a_restored_value_state_decodes_in_c_to_what_msgpack_gives(
    raws: list[bytes], bad: list[bytes], flat: bool,
) -> None:
    """``HashMapValueTable.load`` (and ``load_flat``, from a restore's flat list)
    decodes the default serializer's scalars in C (``load_values``, ``load_flat``) and
    every other value with the serializer: the same objects of the same types as
    ``MsgpackSerializer.decode`` one by one, or, where that raises, a
    StateSerializationError naming the state."""
    from weir import MsgpackSerializer, StateSerializationError
    from weir.state.keycontext import KeyContext
    from weir.state.keygroups import KeyGroupRange

    serializer = MsgpackSerializer()
    entries = [(bytes([0, 0, i]), raw) for i, raw in enumerate(raws + bad)]
    table = hashmap_tables.HashMapValueTable("count", KeyContext(128, KeyGroupRange(0, 127)),
                                serializer, True)

    def load() -> None:
        if flat:
            table.load_flat([x for entry in entries for x in entry])
        else:
            table.load(entries)

    try:
        want = {key: serializer.decode(raw) for key, raw in entries}
    except Exception:  # whatever msgpack raises: the typed error instead
        with pytest.raises(StateSerializationError, match="'count'"):
            load()
        return
    load()
    assert [(k, type(v), repr(v)) for k, v in table._data.items()] == [
        (k, type(v), repr(v)) for k, v in want.items()]
    assert table._loaded_types == {type(v) for v in want.values()}


def test_load_flat_takes_only_a_list_of_keys_and_values() -> None:
    """A flat restore list has an even length (key, raw, key, raw, ...); anything else
    is refused before a value is stored."""
    from weir.state._hashcore import load_flat

    data: dict[bytes, Any] = {}
    for bad in ([b"\x00\x00k"], (b"\x00\x00k", b"\x01"), [b"\x00\x00k", b"\x01", b"x"]):
        with pytest.raises(TypeError, match="load_flat"):
            load_flat(data, bad, bytes, True, set())  # type: ignore[arg-type]
    assert data == {}
    types: set[type] = set()
    load_flat(data, [b"\x00\x00a", b"\x05", b"\x00\x00b", b"\xa1z"], bytes, True, types)
    assert data == {b"\x00\x00a": 5, b"\x00\x00b": "z"} and types == {int, str}
