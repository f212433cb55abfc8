"""The key hash (weir.state.keyhash): Spark's hash() of the key as a Spark value.

Checked three ways: the C primitives against the reference Murmur3 (``mmh3``) where
Spark's agrees with it and against Spark's Java code transcribed here where it does
not (the byte tail); the key hash against its table; and, on real Spark, against
Spark's own ``hash`` (tests/test_spark_key_types.py checks the JVM route with it).
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from decimal import Decimal
from typing import Any

import mmh3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.state._hashcore import spark_hash_bytes, spark_hash_int, spark_hash_long
from weir.state.keybytes import canonical_key_bytes, decode_key
from weir.state.keyhash import KEY_HASH_SEED, key_hash

M32 = 0xFFFFFFFF
seeds = st.integers(0, M32)

# MurmurHash3_x86_32 published vectors of whole 4-byte blocks (where Spark's variant is
# the reference), each confirmed in two sources (the SMHasher-derived table in Stack
# Overflow's "MurmurHash3 Test Vectors" and hlibc's murmur test suite).
ALIGNED_VECTORS = [
    (b"", 0, 0),
    (b"", 1, 0x514E28B7),
    (b"\xff\xff\xff\xff", 0, 0x76293B50),
    (b"!Ce\x87", 0, 0xF55B516B),
]


def _java_hash_unsafe_bytes(data: bytes, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashUnsafeBytes``, transcribed from its Java source."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & M32

    def mix_k1(k1: int) -> int:
        return (rotl((k1 * 0xCC9E2D51) & M32, 15) * 0x1B873593) & M32

    def mix_h1(h1: int, k1: int) -> int:
        return (rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & M32

    h1, aligned = seed, len(data) - len(data) % 4
    for i in range(0, aligned, 4):
        h1 = mix_h1(h1, mix_k1(struct.unpack_from("<I", data, i)[0]))
    for byte in data[aligned:]:
        h1 = mix_h1(h1, mix_k1((byte - 256 if byte > 127 else byte) & M32))  # Java's byte
    h1 ^= len(data)
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & M32
    return h1 ^ (h1 >> 16)


@pytest.mark.parametrize(("data", "seed", "want"), ALIGNED_VECTORS)
def test_bytes_hash_matches_published_vectors_of_whole_blocks(data, seed, want):
    assert spark_hash_bytes(data, seed) == want


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64), seed=seeds)
def test_bytes_hash_is_sparks_hash_unsafe_bytes(data: bytes, seed: int) -> None:
    assert spark_hash_bytes(data, seed) == _java_hash_unsafe_bytes(data, seed)
    if len(data) % 4 == 0:  # no tail: the reference Murmur3
        assert spark_hash_bytes(data, seed) == mmh3.hash(data, seed, signed=False)


@settings(max_examples=300, deadline=None)
@given(value=st.integers(-(2**63), 2**63 - 1), seed=seeds)
def test_int_and_long_hashes_are_murmur3_of_their_little_endian_bytes(value, seed):
    assert spark_hash_long(value, seed) == mmh3.hash(struct.pack("<q", value), seed, signed=False)
    low = (value + 2**31) % 2**32 - 2**31
    assert spark_hash_int(value, seed) == mmh3.hash(struct.pack("<i", low), seed, signed=False)


def test_the_key_hash_follows_its_table():
    s = KEY_HASH_SEED
    assert key_hash(None) == s
    assert key_hash(True) == spark_hash_int(1, s) and key_hash(False) == spark_hash_int(0, s)
    assert key_hash(-7) == spark_hash_long(-7, s)
    assert key_hash("é") == spark_hash_bytes("é".encode(), s)
    assert key_hash(b"\x00\xff") == spark_hash_bytes(b"\x00\xff", s)
    assert key_hash(1.5) == spark_hash_long(struct.unpack("<q", struct.pack("<d", 1.5))[0], s)
    assert key_hash(dt.date(1970, 1, 11)) == spark_hash_int(10, s)
    assert key_hash(dt.datetime(1970, 1, 1, 0, 0, 1)) == spark_hash_long(1_000_000, s)
    utc = dt.datetime(1970, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert key_hash(utc) == spark_hash_long(0, s)  # the instant, whatever the zone
    assert key_hash(("a", None, 2)) == spark_hash_long(2, spark_hash_bytes(b"a", s))
    assert key_hash(["a", 2]) == key_hash(("a", 2))
    for other in ({"b": 1, "a": 2}, Decimal("1.50"), 2**63, 2**64 - 1):
        assert key_hash(other) == spark_hash_bytes(canonical_key_bytes(other), s)


def test_floats_hash_as_spark_normalizes_them():
    # Spark hashes -0.0 as 0.0 and every NaN as Java's canonical NaN: different keys
    # (their canonical bytes differ), one key group
    assert canonical_key_bytes(-0.0) != canonical_key_bytes(0.0)
    assert key_hash(-0.0) == key_hash(0.0) == spark_hash_long(0, KEY_HASH_SEED)
    other_nan = struct.unpack("<d", struct.pack("<q", 0x7FF8000000000001))[0]
    assert math.isnan(other_nan) and key_hash(other_nan) == key_hash(math.nan)
    assert key_hash(math.nan) == spark_hash_long(0x7FF8000000000000, KEY_HASH_SEED)


def _keys() -> st.SearchStrategy[Any]:
    zones = st.timedeltas(-dt.timedelta(hours=23), dt.timedelta(hours=23)).map(dt.timezone)
    scalars = st.one_of(
        st.text(), st.integers(-(2**63), 2**64 - 1), st.binary(), st.floats(), st.booleans(),
        st.none(), st.dates(), st.datetimes(),
        st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30), timezones=zones),
        st.decimals(allow_nan=False, allow_infinity=False),
    )
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(tuple), st.lists(inner, max_size=3),
        st.dictionaries(st.text(max_size=3), inner, max_size=3)), max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(key=_keys())
def test_a_key_hashes_as_its_decoded_canonical_form(key: Any) -> None:
    """The hash is a function of the key's canonical bytes: a key and the key decoded
    from its bytes (tuples for lists, UTC for aware datetimes, stripped decimals) hash
    alike, so every runtime and every restore agrees on its group."""
    h = key_hash(key)
    assert 0 <= h <= M32
    assert key_hash(decode_key(canonical_key_bytes(key))) == h


def _reference(key: Any, seed: int) -> int:
    """The table for None, str, int64 and tuples, from the primitives."""
    if key is None:
        return seed
    if isinstance(key, str):
        return spark_hash_bytes(key.encode(), seed)
    if isinstance(key, int):
        return spark_hash_long(key, seed)
    for item in key:
        seed = _reference(item, seed)
    return seed


@settings(max_examples=300, deadline=None)
@given(key=st.recursive(
    st.one_of(st.none(), st.text(), st.integers(-(2**63), 2**63 - 1)),
    lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=8), seed=seeds)
def test_the_c_path_of_common_keys_is_the_table(key: Any, seed: int) -> None:
    """None, str, int64 and tuples of them are hashed in C (``common_key_hash``); the
    result is the table's, and other keys are left to Python."""
    from weir.state._hashcore import common_key_hash

    assert common_key_hash(key, seed) == key_hash(key, seed) == _reference(key, seed)
    for other in (True, 1.5, b"x", 2**63, ("a", 1.5), ["a"], "\ud800"):
        assert common_key_hash(other, seed) is None
