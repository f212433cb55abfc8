"""Tests for weir.state.keygroups: Flink's key-group formulas and stable key hashing."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import mmh3
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
    key_group_for_key_bytes,
    key_group_range_for_operator,
)

MAX_M = 32768
m_and_p = st.integers(1, MAX_M).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m)))


def key_strategy(allow_nan: bool) -> st.SearchStrategy:
    scalars = st.one_of(st.text(), st.integers(-(2**63), 2**64 - 1), st.binary(),
                        st.floats(allow_nan=allow_nan), st.booleans(), st.none())
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=8)


keys = key_strategy(allow_nan=True)
ranges = st.builds(KeyGroupRange, st.integers(-3, 40), st.integers(-3, 40))


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
    assert g == key_group_for_key_bytes(canonical_key_bytes(key), m)
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
# MurmurHash3_x86_32 published vectors, each confirmed in two sources (the SMHasher-derived
# table in Stack Overflow's "MurmurHash3 Test Vectors" and hlibc's murmur test suite):
# (input, seed, unsigned hash).
MURMUR3_VECTORS = [
    (b"", 0, 0),
    (b"", 1, 0x514E28B7),
    (b"\xff\xff\xff\xff", 0, 0x76293B50),
    (b"!Ce\x87", 0, 0xF55B516B),
    (b"Hello, world!", 1234, 0xFAF6CDB3),
]


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


@pytest.mark.parametrize(("data", "seed", "want"), MURMUR3_VECTORS)
def test_murmur3_matches_published_x86_32_vectors(data, seed, want):
    assert mmh3.hash(data, seed, signed=False) == want
    if seed == 0:  # weir always hashes with seed 0
        for m in (1, 7, 128, MAX_M):
            assert key_group_for_key_bytes(data, m) == want % m


def test_pinned_key_groups_are_unchanged():
    # Regression constants: changing any of these moves keys to other key groups and
    # breaks every existing savepoint/checkpoint. Do not "fix" them, fix the code.
    assert canonical_key_bytes("card-42") == b"\xa7card-42"  # msgpack fixstr
    assert canonical_key_bytes(("a", 1)) == b"\x92\xa1a\x01"  # msgpack fixarray
    assert assign_to_key_group("card-42", 128) == 97
    assert assign_to_key_group(12345, 30) == 23
    assert assign_to_key_group(("a", 1), 32768) == 24957


# --- 3. stability across interpreters --------------------------------------------------
KEYS_SRC = """
KEYS = ([f"user-{i}" for i in range(50)] + list(range(-25, 25))
        + [bytes([i]) * i for i in range(25)] + [i / 7 for i in range(25)] + [True, False, None]
        + [(f"k{i}", i, i % 2 == 0, None, i / 3, str(i).encode()) for i in range(47)])
"""
PRINT_SRC = KEYS_SRC + """
import json
from weir.state.keygroups import assign_to_key_group
print(json.dumps([hash("weir"), [assign_to_key_group(k, 32768) for k in KEYS]]))
"""


def test_key_groups_are_identical_across_interpreters_and_hash_seeds():
    scope: dict = {}
    exec(KEYS_SRC, scope)
    assert len(scope["KEYS"]) == 200
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


@pytest.mark.parametrize("bad", [-1, 4, 5])
def test_subtask_index_or_key_group_outside_its_bounds_is_rejected(bad):
    with pytest.raises(ConfigurationError, match="subtask index"):
        key_group_range_for_operator(128, 4, bad)
    with pytest.raises(ConfigurationError, match="key group"):
        compute_operator_index_for_key_group(4, 2, bad)


@pytest.mark.parametrize(
    "key", [{}, {"a": 1}, [], [1], set(), frozenset(), object(), ("a", [1]), (("x", {}),),
            2**64, -(2**63) - 1, "\ud800"],
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
