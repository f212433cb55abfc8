"""Tests for weir.state.keygroups: Flink's key-group formulas and stable key groups (the
key hash itself: tests/test_keyhash.py)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import struct
import subprocess
import sys
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.errors import ConfigurationError, StateSerializationError
from weir.state.keygroups import (
    KeyGroupRange,
    assign_key_to_parallel_operator,
    assign_to_key_group,
    canonical_key_bytes,
    compute_default_max_parallelism,
    compute_operator_index_for_key_group,
    decode_key,
    key_group_range_for_operator,
)
from weir.state.keyhash import key_hash

MAX_M = 32768
m_and_p = st.integers(1, MAX_M).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m)))


def key_strategy(allow_nan: bool) -> st.SearchStrategy:
    scalars = st.one_of(st.text(), st.integers(-(2**63), 2**64 - 1), st.binary(),
                        st.floats(allow_nan=allow_nan), st.booleans(), st.none())
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=8)


keys = key_strategy(allow_nan=True)

PLUS_1H, MINUS_1H = dt.timezone(dt.timedelta(hours=1)), dt.timezone(dt.timedelta(hours=-1))
#: time zones for aware datetimes: fixed offsets and IANA zones (DST gaps and folds)
zones = st.one_of(st.timezones(),
                  st.timedeltas(-dt.timedelta(hours=23, minutes=59),
                                dt.timedelta(hours=23, minutes=59)).map(dt.timezone))
#: aware datetimes whose instant is a datetime in UTC (one day inside min/max)
aware_datetimes = st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30), timezones=zones)
new_scalars = st.one_of(st.dates(), st.datetimes(), aware_datetimes,
                        st.decimals(allow_nan=False, allow_infinity=False))


def rich_key_strategy(allow_nan: bool) -> st.SearchStrategy:
    """Every key type: the old scalars and tuples, dates, datetimes, decimals, lists and
    dicts with str names (Spark's arrays and structs)."""
    scalars = st.one_of(st.text(), st.integers(-(2**63), 2**64 - 1), st.binary(),
                        st.floats(allow_nan=allow_nan), st.booleans(), st.none(), new_scalars)
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(tuple), st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=3), inner, max_size=3)), max_leaves=8)


rich_keys = rich_key_strategy(allow_nan=True)
#: valid ranges only (Flink's rules): the empty range, or 0 <= start <= end
ranges = st.one_of(
    st.just(KeyGroupRange.empty()),
    st.integers(0, 40).flatmap(lambda s: st.integers(s, 40).map(lambda e: KeyGroupRange(s, e))),
)


def assert_ranges_partition_key_groups(m: int, p: int) -> None:
    rs = [key_group_range_for_operator(m, p, i) for i in range(p)]
    assert rs[0].start == 0 and rs[-1].end == m - 1
    for left, right in itertools.pairwise(rs):
        assert right.start == left.end + 1  # contiguous, ordered, non-overlapping
        assert len(left.intersection(right)) == 0 and left.intersection(left) == left
    owner: list[int | None] = [None] * m
    for i, r in enumerate(rs):
        assert len(r) >= 1  # p <= M: every subtask owns at least one group
        for g in r:
            assert owner[g] is None, f"group {g} owned by {owner[g]} and {i}"
            owner[g] = i
    assert [compute_operator_index_for_key_group(m, p, g) for g in range(m)] == owner


# --- 1. properties -----------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(m_and_p)
def test_subtask_ranges_partition_all_key_groups_and_match_operator_index(mp):
    assert_ranges_partition_key_groups(*mp)


@pytest.mark.parametrize("m", [1, 7, 30, 128])
def test_every_parallelism_up_to_small_max_parallelism_partitions_key_groups(m):
    for p in range(1, m + 1):
        assert_ranges_partition_key_groups(m, p)


@given(ranges, ranges)
def test_intersection_is_commutative_and_exactly_the_common_groups(a, b):
    both = a.intersection(b)
    assert both == b.intersection(a)
    assert set(both) == set(a) & set(b)
    assert set(both) <= set(a) and set(both) <= set(b)
    if set(a).isdisjoint(set(b)):
        assert len(both) == 0 and both == KeyGroupRange.empty() and str(both) == "[]"


@settings(max_examples=300, deadline=None)
@given(keys, m_and_p)
def test_key_lands_in_exactly_the_subtask_whose_range_holds_its_group(key, mp):
    m, p = mp
    g = assign_to_key_group(key, m)
    assert 0 <= g < m
    assert g == key_hash(key) % m
    sub = assign_key_to_parallel_operator(key, m, p)
    holders = [i for i in range(p) if g in key_group_range_for_operator(m, p, i)]
    assert holders == [sub]


@given(keys)
def test_decoding_canonical_bytes_and_re_encoding_gives_the_same_bytes(key):
    data = canonical_key_bytes(key)
    assert canonical_key_bytes(decode_key(data)) == data


@given(key_strategy(allow_nan=False))
def test_keys_round_trip_through_canonical_bytes_with_their_types(key):
    decoded = decode_key(canonical_key_bytes(key))
    assert decoded == key and type(decoded) is type(key)


# --- 2. hand vectors -------------------------------------------------------------
# Printed by a throwaway Java 17 program using Flink's KeyGroupRangeAssignment formulas
# with int arithmetic: start=(i*M+p-1)/p, end=((i+1)*M-1)/p, index=g*p/M.
FLINK_RANGES = {
    (128, 3): [(0, 42), (43, 85), (86, 127)],
    (30, 4): [(0, 7), (8, 14), (15, 22), (23, 29)],
    (30, 8): [(0, 3), (4, 7), (8, 11), (12, 14), (15, 18), (19, 22), (23, 26), (27, 29)],
    (32768, 7): [(0, 4681), (4682, 9362), (9363, 14043), (14044, 18724), (18725, 23405),
                 (23406, 28086), (28087, 32767)],
    (10, 3): [(0, 3), (4, 6), (7, 9)],
}
FLINK_OPERATOR_INDEX = {  # (M, p, key group) -> subtask
    (128, 3, 0): 0, (128, 3, 42): 0, (128, 3, 43): 1, (128, 3, 85): 1, (128, 3, 86): 2,
    (128, 3, 127): 2, (30, 4, 7): 0, (30, 4, 8): 1, (30, 4, 29): 3, (30, 8, 3): 0,
    (30, 8, 4): 1, (30, 8, 29): 7, (32768, 7, 4681): 0, (32768, 7, 4682): 1,
    (32768, 7, 32767): 6, (10, 3, 3): 0, (10, 3, 4): 1, (10, 3, 9): 2,
}
FLINK_DEFAULT_MAX_PARALLELISM = {1: 128, 2: 128, 85: 128, 86: 256, 100: 256, 171: 256, 172: 512,
                                 1000: 2048, 10923: 16384, 10924: 32768, 30000: 32768, 32768: 32768}
@pytest.mark.parametrize(("m", "p"), sorted(FLINK_RANGES))
def test_key_group_ranges_match_flink(m, p):
    got = [key_group_range_for_operator(m, p, i) for i in range(p)]
    assert got == [KeyGroupRange(s, e) for s, e in FLINK_RANGES[(m, p)]]


def test_operator_index_for_key_group_matches_flink():
    got = {k: compute_operator_index_for_key_group(*k) for k in FLINK_OPERATOR_INDEX}
    assert got == FLINK_OPERATOR_INDEX


def test_default_max_parallelism_matches_flink():
    got = {p: compute_default_max_parallelism(p) for p in FLINK_DEFAULT_MAX_PARALLELISM}
    assert got == FLINK_DEFAULT_MAX_PARALLELISM


def test_pinned_key_groups_are_unchanged():
    # Regression constants: changing any of these moves keys to other key groups and
    # breaks every existing savepoint/checkpoint. Do not "fix" them, fix the code.
    assert canonical_key_bytes("card-42") == b"\xa7card-42"  # msgpack fixstr
    assert canonical_key_bytes(("a", 1)) == b"\x92\xa1a\x01"  # msgpack fixarray
    # key format 2: Spark's hash() of the key (weir.state.keyhash)
    assert assign_to_key_group("card-42", 128) == 25
    assert assign_to_key_group(12345, 30) == 20
    assert assign_to_key_group(("a", 1), 32768) == 1489


# --- 3. stability across interpreters --------------------------------------------------
KEYS_SRC = """
import datetime as dt
from decimal import Decimal
KEYS = ([f"user-{i}" for i in range(50)] + list(range(-25, 25))
        + [bytes([i]) * i for i in range(25)] + [i / 7 for i in range(25)] + [True, False, None]
        + [(f"k{i}", i, i % 2 == 0, None, i / 3, str(i).encode()) for i in range(47)]
        + [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(10)]
        + [dt.datetime(2024, 1, 1, i, tzinfo=dt.timezone(dt.timedelta(hours=i % 5)))
           for i in range(10)]
        + [dt.datetime(2024, 1, 1, i) for i in range(10)] + [Decimal(i) / 8 for i in range(10)]
        + [{f"f{j}": j * i for j in range(4, 0, -1)} for i in range(5)]
        + [[i, [str(i)], {"k": [i]}] for i in range(5)])
"""
PRINT_SRC = KEYS_SRC + """
import json
from weir.state.keygroups import assign_to_key_group
print(json.dumps([hash("weir"), [assign_to_key_group(k, 32768) for k in KEYS]]))
"""


def test_key_groups_are_identical_across_interpreters_and_hash_seeds():
    scope: dict = {}
    exec(KEYS_SRC, scope)
    assert len(scope["KEYS"]) == 250
    expected = [assign_to_key_group(k, 32768) for k in scope["KEYS"]]
    runs = {}
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", PRINT_SRC], env=env, check=True,
                             capture_output=True, text=True).stdout
        runs[seed] = json.loads(out)
    assert runs["0"][0] != runs["12345"][0], "PYTHONHASHSEED did not change hash(); test is void"
    assert runs["0"][1] == expected
    assert runs["12345"][1] == expected


# --- 4. errors and canonical encoding ---------------------------------------------------


@pytest.mark.parametrize("m", [0, -1, 32769, 128.0, "128", None])
def test_invalid_max_parallelism_is_a_configuration_error(m):
    with pytest.raises(ConfigurationError, match="max_parallelism"):
        key_group_range_for_operator(m, 1, 0)
    with pytest.raises(ConfigurationError, match="max_parallelism"):
        assign_to_key_group("k", m)


@pytest.mark.parametrize(("m", "p"), [(128, 0), (128, -1), (128, 129), (1, 2), (128, 2.0)])
def test_invalid_parallelism_is_a_configuration_error(m, p):
    with pytest.raises(ConfigurationError, match="parallelism"):
        key_group_range_for_operator(m, p, 0)
    with pytest.raises(ConfigurationError, match="parallelism"):
        compute_operator_index_for_key_group(m, p, 0)
    with pytest.raises(ConfigurationError):
        assign_key_to_parallel_operator("k", m, p)


@pytest.mark.parametrize("p", [0, -1, 32769, 1.5])
def test_default_max_parallelism_rejects_out_of_range_parallelism(p):
    with pytest.raises(ConfigurationError):
        compute_default_max_parallelism(p)


@pytest.mark.parametrize(
    ("start", "end"), [(-1, 5), (-1, -1), (-3, -2), (-(2**15), 0), (5, 3), (1, 0), (0, -2)]
)
def test_key_group_range_with_negative_start_or_start_after_end_is_refused(start, end):
    """Flink's ``KeyGroupRange(start, end)`` checks ``start >= 0`` and ``start <= end``;
    the one empty range is ``KeyGroupRange.empty()`` (Flink's EMPTY_KEY_GROUP_RANGE)."""
    with pytest.raises(ConfigurationError, match=r"KeyGroupRange\(") as info:
        KeyGroupRange(start, end)
    assert f"{start}, {end}" in str(info.value)


@given(st.integers(0, MAX_M - 1).flatmap(lambda s: st.tuples(st.just(s), st.integers(s, MAX_M))))
def test_key_group_ranges_from_zero_up_are_accepted(bounds):
    start, end = bounds
    r = KeyGroupRange(start, end)
    assert len(r) == end - start + 1 and start in r and end in r


def test_the_empty_range_is_still_allowed():
    assert KeyGroupRange(0, -1) == KeyGroupRange.empty()
    assert len(KeyGroupRange.empty()) == 0 and list(KeyGroupRange.empty()) == []
    assert KeyGroupRange(3, 7).intersection(KeyGroupRange(8, 9)) == KeyGroupRange.empty()


@pytest.mark.parametrize("bad", [-1, 4, 5])
def test_subtask_index_or_key_group_outside_its_bounds_is_rejected(bad):
    with pytest.raises(ConfigurationError, match="subtask index"):
        key_group_range_for_operator(128, 4, bad)
    with pytest.raises(ConfigurationError, match="key group"):
        compute_operator_index_for_key_group(4, 2, bad)


@pytest.mark.parametrize(
    "key", [set(), frozenset(), object(), ("a", {1}), (("x", object()),), {1: "a"},
            {"a": {b"x": 1}}, [bytearray(b"x")], 2**64, -(2**63) - 1, "\ud800", {"\ud800": 1},
            Decimal("NaN"), Decimal("-Infinity"), Decimal("sNaN"), Decimal("1E+3000000000"),
            dt.time(12), dt.timedelta(1), dt.datetime(1, 1, 1, tzinfo=PLUS_1H),
            dt.datetime(9999, 12, 31, 23, tzinfo=MINUS_1H)],
    ids=lambda k: type(k).__name__,
)
def test_unsupported_or_unencodable_keys_raise_state_serialization_error(key):
    with pytest.raises(StateSerializationError):
        canonical_key_bytes(key)
    with pytest.raises(StateSerializationError):
        assign_to_key_group(key, 128)


@pytest.mark.parametrize(
    "group", [(1, True, 1.0), ("1", b"1"), (0, False, 0.0, None), ("a", ("a",))]
)
def test_keys_differing_only_by_type_have_distinct_canonical_bytes(group):
    encoded = [canonical_key_bytes(k) for k in group]
    assert len(set(encoded)) == len(group)
    assert [type(decode_key(b)) for b in encoded] == [type(k) for k in group]


def test_nested_tuple_keys_round_trip_as_tuples():
    key = ("user", 7, (b"\x00", None, (True, 2.5)), ())
    assert decode_key(canonical_key_bytes(key)) == key
    assert isinstance(decode_key(canonical_key_bytes(key))[2][2], tuple)


# --- 5. dates, datetimes, decimals, lists and dicts (Spark's key types) -----------------


def identity(key):
    """What makes two keys the same key: their type (a list is a tuple), and their value
    (floats by bits, aware datetimes by instant, decimals by numeric value, dicts by
    items whatever their order)."""
    if isinstance(key, bool):
        return ("bool", key)
    if isinstance(key, float):
        return ("float", struct.pack(">d", key))
    if isinstance(key, tuple | list):
        return ("seq", tuple(identity(k) for k in key))
    if isinstance(key, dict):
        return ("map", tuple(sorted((n, identity(v)) for n, v in key.items())))
    if isinstance(key, dt.datetime):
        aware = key.utcoffset() is not None
        return ("instant" if aware else "local", key.astimezone(dt.UTC) if aware else key)
    return (type(key).__name__, key)


def assert_same_key(decoded, key):
    """``decoded`` is ``key`` as decode_key gives it back: equal, same types (lists as
    tuples), aware datetimes in UTC, decimals with trailing zeros stripped."""
    assert identity(decoded) == identity(key)
    if isinstance(key, tuple | list):
        assert type(decoded) is tuple
        for d, k in zip(decoded, key, strict=True):
            assert_same_key(d, k)
    elif isinstance(key, dict):
        assert type(decoded) is dict and list(decoded) == sorted(key)
        for name in key:
            assert_same_key(decoded[name], key[name])
    elif isinstance(key, dt.datetime) and key.utcoffset() is not None:
        assert type(decoded) is dt.datetime and decoded.tzinfo is dt.UTC
    elif isinstance(key, Decimal):
        assert type(decoded) is Decimal and decoded == key
        assert decoded.as_tuple().exponent == 0 or decoded.as_tuple().digits[-1] != 0
    else:
        assert type(decoded) is type(key)


@settings(max_examples=400, deadline=None)
@given(rich_key_strategy(allow_nan=False))
def test_every_key_type_round_trips_through_canonical_bytes(key):
    data = canonical_key_bytes(key)
    assert_same_key(decode_key(data), key)
    assert canonical_key_bytes(decode_key(data)) == data  # canonical: decoding is stable


@settings(max_examples=300, deadline=None)
@given(st.lists(rich_keys, min_size=2, max_size=12))
def test_keys_have_the_same_bytes_exactly_when_they_are_the_same_key(group):
    by_identity: dict = {}
    by_bytes: dict = {}
    for key in group:
        data = canonical_key_bytes(key)
        assert by_identity.setdefault(identity(key), data) == data  # same key, same bytes
        assert by_bytes.setdefault(data, identity(key)) == identity(key)  # and only then


@settings(max_examples=200, deadline=None)
@given(st.lists(rich_keys, min_size=1, max_size=5))
def test_key_bytes_are_prefix_free(group):
    """Concatenated key bytes split back at the key boundaries (a map state's user key
    follows the key bytes)."""
    import msgpack

    encoded = [canonical_key_bytes(k) for k in group]
    unpacker = msgpack.Unpacker(raw=False)  # ext types stay opaque: only framing counts
    unpacker.feed(b"".join(encoded))
    ends = []
    for _ in encoded:
        unpacker.skip()
        ends.append(unpacker.tell())
    assert ends == list(itertools.accumulate(len(e) for e in encoded))


@given(aware_datetimes, zones)
def test_an_instant_is_one_key_in_every_time_zone(moment, zone):
    there = moment.astimezone(zone)
    assert canonical_key_bytes(there) == canonical_key_bytes(moment)
    assert canonical_key_bytes(moment.replace(tzinfo=None)) != canonical_key_bytes(moment)
    assert decode_key(canonical_key_bytes(there)) == moment.astimezone(dt.UTC)


@given(st.decimals(allow_nan=False, allow_infinity=False), st.integers(0, 40))
def test_a_decimal_value_is_one_key_at_every_scale(value, zeros):
    sign, digits, exponent = value.as_tuple()
    wider = Decimal((sign, (*digits, *([0] * zeros)), exponent - zeros))
    assert wider == value
    assert canonical_key_bytes(wider) == canonical_key_bytes(value)
    assert assign_to_key_group(wider, 128) == assign_to_key_group(value, 128)


@given(st.dictionaries(st.text(max_size=4), st.integers(-99, 99), max_size=6), st.randoms())
def test_a_dict_is_one_key_whatever_its_insertion_order(fields, rng):
    items = list(fields.items())
    rng.shuffle(items)
    assert canonical_key_bytes(dict(items)) == canonical_key_bytes(fields)


@given(st.lists(st.one_of(st.integers(-5, 5), st.text(max_size=2), st.dates()), max_size=5))
def test_a_list_is_the_key_of_the_tuple_of_its_items(items):
    assert canonical_key_bytes(items) == canonical_key_bytes(tuple(items))
    assert decode_key(canonical_key_bytes(items)) == tuple(items)


#: Regression constants (msgpack by hand: fixstr a7, fixarray 92, uint64 cf, int64 d3,
#: float64 cb, true c3, false c2, nil c0, bin8 c4, str8 d9). These bytes are in every
#: savepoint and, with the key hash (checkpoint format 2: weir.state.keyhash), decide
#: every key group: they must never change. Do not "fix" them.
PINNED_EXISTING = [
    ("card-42", "a7636172642d3432", 29721),
    ("", "a0", 19804),
    ("é", "a2c3a9", 246),
    (("a", 1), "92a16101", 1489),
    (0, "00", 14429),
    (1, "01", 5277),
    (-1, "ff", 1321),
    (127, "7f", 20191),
    (128, "cc80", 30930),
    (-33, "d0df", 29072),
    (12345, "cd3039", 17120),
    (2**32, "cf0000000100000000", 16197),
    (2**63, "cf8000000000000000", 12193),
    (2**64 - 1, "cfffffffffffffffff", 7447),
    (-(2**63), "d38000000000000000", 25851),
    (1.5, "cb3ff8000000000000", 32229),
    (-0.0, "cb8000000000000000", 14429),
    (float("inf"), "cb7ff0000000000000", 29794),
    (float("nan"), "cb7ff8000000000000", None),
    (True, "c3", 30947),
    (False, "c2", 11919),
    (None, "c0", 42),
    (b"", "c400", 19804),
    (b"\x00\xff", "c40200ff", 31937),
    (("k", 7, True, None, 0.5, b"x"), "96a16b07c3c0cb3fe0000000000000c40178", 30775),
    (((), ("a", (None,))), "929092a16191c0", 30802),
    ("x" * 40, "d928" + "78" * 40, 18674),]
#: The new encodings, pinned the same way (ext: fixext4 d6, fixext8 d7, ext8 c7 + len).
PINNED_NEW = [
    (dt.date(1970, 1, 1), "d61000000000"),
    (dt.date(2024, 1, 2), "d61000004d0c"),
    (dt.date(1969, 12, 31), "d610ffffffff"),
    (dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC), "d71100060dedc04dd346"),
    (dt.datetime(2024, 1, 2, 4, 4, 5, 6, tzinfo=PLUS_1H), "d71100060dedc04dd346"),
    (dt.datetime(2024, 1, 2, 3, 4, 5, 6), "d71200060dedc04dd346"),
    (dt.datetime(1970, 1, 1), "d7120000000000000000"),
    (Decimal("1.50"), "c70513000000010f"),
    (Decimal("1.5"), "c70513000000010f"),
    (Decimal("-100"), "c70513fffffffeff"),
    (Decimal("0.000"), "c705130000000000"),
    (Decimal("-0"), "c705130000000000"),
    (Decimal("-128"), "c705130000000080"),
    (Decimal("12345678901234567890123456789012345678"),
     "c71413000000000949b0f6f0023313c4499050de38f34e"),
    ({"b": 1, "a": [1, 2]}, "82a161920102a16201"),
    ([1, (2, 3)], "9201920203"),
    ((dt.date(1970, 1, 2), {"x": Decimal("0.1")}), "92d6100000000181a178c705130000000101"),
]
GROUPS_NEW = (84, 23, 31, 81)


@pytest.mark.parametrize(("key", "hex_bytes", "group"), PINNED_EXISTING, ids=repr)
def test_existing_key_encodings_are_byte_identical(key, hex_bytes, group):
    assert canonical_key_bytes(key).hex() == hex_bytes
    if group is not None:
        assert assign_to_key_group(key, 32768) == group


@pytest.mark.parametrize(("key", "hex_bytes"), PINNED_NEW, ids=repr)
def test_new_key_encodings_are_pinned(key, hex_bytes):
    assert canonical_key_bytes(key).hex() == hex_bytes
    assert_same_key(decode_key(bytes.fromhex(hex_bytes)), key)


def test_pinned_key_groups_of_new_types_are_unchanged():
    assert assign_to_key_group(dt.date(2024, 1, 2), 128) == GROUPS_NEW[0]
    assert assign_to_key_group(dt.datetime(2024, 1, 2, tzinfo=dt.UTC), 128) == GROUPS_NEW[1]
    assert assign_to_key_group(Decimal("19.99"), 128) == GROUPS_NEW[2]
    assert assign_to_key_group({"id": 7, "region": "eu"}, 128) == GROUPS_NEW[3]


def test_unknown_extension_types_in_key_bytes_are_refused():
    import msgpack

    for code, data in [(5, b"x"), (16, b"\x00" * 5), (17, b"\x00"), (19, b"\x00" * 4)]:
        with pytest.raises(StateSerializationError, match="extension type"):
            decode_key(msgpack.packb(msgpack.ExtType(code, data)))


def test_unsupported_key_error_names_the_type_and_the_supported_ones():
    with pytest.raises(StateSerializationError) as info:
        canonical_key_bytes(frozenset())
    assert "frozenset" in str(info.value) and "datetime.date" in str(info.value)
    with pytest.raises(StateSerializationError, match="str names"):
        canonical_key_bytes({("a",): 1})
    with pytest.raises(StateSerializationError, match="NaN and infinite"):
        canonical_key_bytes((1, Decimal("NaN")))
