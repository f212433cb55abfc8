"""Packed keyed snapshots (``weir.state.packed``): a snapshot's key groups are encoded
as they are taken, and the ``.keyed`` file written from them is byte for byte the
file the per-entry form gives (so every reader, old checkpoints included, is
unaffected), read back the same, and clipped to a key-group range the same."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from weir.checkpoint.datafiles import decode_keyed, encode_keyed
from weir.state.keygroups import KeyGroupRange
from weir.state.packed import FixedWidthValues, PackedGroups, _pack_fixed, pack_sources

#: key groups on both sides of C's 256-group pages and at the 2-byte prefix's ends
_GROUPS = st.one_of(st.integers(0, 40), st.sampled_from([255, 256, 257, 32767, 65535]))
_KEYS = st.builds(lambda g, rest: g.to_bytes(2, "big") + rest, _GROUPS, st.binary(max_size=6))
_SOURCES = st.lists(
    st.tuples(st.sampled_from(["a", "b", "count", "__weir_timers/event"]),
              st.lists(st.tuples(_KEYS, st.binary(max_size=300)), max_size=30)),
    max_size=5,
)


def _drop_odd_rewrite_long(key: bytes, data: bytes) -> bytes | None:
    """A full-snapshot filter: drops entries of odd length, shortens long values."""
    if len(data) % 2:
        return None
    return data[:10] if len(data) > 100 else data


def _per_entry(sources: list[tuple[str, list[tuple[bytes, bytes]]]],
               filters: dict[str, Any]) -> dict[int, dict[str, list[tuple[bytes, bytes]]]]:
    """The per-entry form: key group -> state -> entries in the order given."""
    groups: dict[int, dict[str, list[tuple[bytes, bytes]]]] = {}
    for name, entries in sources:
        for key, data in entries:
            keep = filters.get(name)
            kept = data if keep is None else keep(key, data)
            if kept is not None:
                groups.setdefault((key[0] << 8) | key[1], {}).setdefault(name, []).append(
                    (key, kept))
    return groups


@settings(max_examples=300, deadline=None)
@given(_SOURCES, st.booleans(), st.integers(0, 40), st.integers(0, 40),
       st.sampled_from([1, 2, 7, 16384]))
def test_a_packed_snapshot_writes_reads_and_clips_as_the_per_entry_form(
    sources: list[tuple[str, list[tuple[bytes, bytes]]]], filtered: bool, lo: int, hi: int,
    chunk: int,
) -> None:
    """Whatever the entries packed per call into C (``chunk``; RocksDB packs fewer)."""
    filters = {"b": _drop_odd_rewrite_long} if filtered else {}
    expected = _per_entry(sources, filters)
    packed = pack_sources(iter(sources), filters, chunk)

    assert encode_keyed(packed) == encode_keyed(expected)
    assert dict(packed) == {g: {n: tuple(e) for n, e in per.items()}
                            for g, per in expected.items()}
    data, index, entries = encode_keyed(packed)
    assert entries == sum(len(e) for per in expected.values() for e in per.values())
    assert decode_keyed(data, index, None, "f") == dict(packed)

    lo, hi = min(lo, hi), max(lo, hi)
    clipped = packed.restrict(KeyGroupRange(lo, hi).__contains__)
    assert isinstance(clipped, PackedGroups)
    assert encode_keyed(clipped) == encode_keyed(
        {g: per for g, per in expected.items() if lo <= g <= hi})
    assert decode_keyed(data, index, KeyGroupRange(lo, hi), "f") == dict(clipped)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(_KEYS, st.sampled_from([0, 1, 255, 256, 65535, 65536, 70000])),
                max_size=8))
def test_entries_packed_in_c_are_the_bytes_msgpack_packs(entries: list[Any]) -> None:
    """``pack_entries`` (C, every state's entries in a snapshot) writes each key and
    value as msgpack's own bin 8 / 16 / 32 objects, grouped by key group in order."""
    import msgpack

    from weir.state._hashcore import pack_entries

    pairs = [(key, bytes(size)) for key, size in entries]
    want: dict[int, tuple[bytes, int]] = {}
    for key, data in pairs:
        group = int.from_bytes(key[:2], "big")
        packed, count = want.get(group, (b"", 0))
        want[group] = (packed + msgpack.packb(key) + msgpack.packb(data), count + 1)
    got = {g: (bytes(buf), n) for g, (buf, n) in pack_entries(iter(pairs)).items()}
    assert got == want


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_KEYS, st.one_of(st.none(), st.binary(max_size=300)), max_size=30))
def test_a_changelog_delta_packed_in_c_lists_every_key_and_the_entries_still_present(
    changes: dict[bytes, bytes | None],
) -> None:
    """``pack_changes`` (C, a RocksDB changelog delta): per key group, every changed key
    as a msgpack bin, and each (key, value) not deleted, in the dict's order."""
    import msgpack

    from weir.state._hashcore import pack_changes

    want: dict[int, tuple[bytes, int, bytes, int]] = {}
    for key, value in changes.items():
        keys, nkeys, entries, nentries = want.get(int.from_bytes(key[:2], "big"),
                                                  (b"", 0, b"", 0))
        keys, nkeys = keys + msgpack.packb(key), nkeys + 1
        if value is not None:
            entries, nentries = entries + msgpack.packb(key) + msgpack.packb(value), nentries + 1
        want[int.from_bytes(key[:2], "big")] = (keys, nkeys, entries, nentries)
    got = {g: (bytes(k), nk, bytes(e), ne) for g, (k, nk, e, ne) in pack_changes(changes).items()}
    assert got == want


_INT64 = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1),
                   st.sampled_from([-(1 << 63), (1 << 63) - 1, 0, -1]))
_FLOAT = st.one_of(st.floats(allow_nan=True), st.integers(-(1 << 53), 1 << 53),
                   st.sampled_from([0.0, -0.0, float("inf"), 1e308, 5e-324]))


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from(["int", "float"]), st.sampled_from([1, 2, 7, 16384]))
def test_a_hash_map_state_of_ints_or_floats_packs_in_c_to_the_same_bytes(
    data: st.DataObject, kind: str, chunk: int,
) -> None:
    """A hash-map state whose serializer is ``IntSerializer`` or ``FloatSerializer`` is
    packed from its values in C (``pack_fixed``), chunk by chunk: the same groups and
    bytes as its entries encoded one by one. A value C does not pack (an int beyond 64
    bits) takes the general path, which raises the typed error naming the state."""
    import pytest

    from weir import FloatSerializer, IntSerializer, StateSerializationError
    from weir.state.backend import EncodedValues

    serializer = IntSerializer() if kind == "int" else FloatSerializer()
    values = data.draw(st.dictionaries(_KEYS, _INT64 if kind == "int" else _FLOAT,
                                       max_size=40))
    fast = EncodedValues("count", serializer, values)
    assert fast.fixed == (0 if kind == "int" else 1) and isinstance(fast, FixedWidthValues)
    assert _pack_fixed(values, fast.fixed, chunk) is not None  # C takes every value
    general = [(key, serializer.encode(v)) for key, v in values.items()]
    packed = pack_sources(iter([("count", fast), ("b", [])]), {}, chunk)
    assert encode_keyed(packed) == encode_keyed(pack_sources(iter([("count", general)]), {},
                                                             chunk))
    if kind == "int":
        with pytest.raises(StateSerializationError, match="'count'"):
            pack_sources(iter([("count", EncodedValues(
                "count", serializer, {**values, b"\x00\x01big": 1 << 64}))]), {}, chunk)


#: every msgpack format boundary of ints, str and bytes lengths (fixstr 31/32, str 8
#: 255/256, 16 bits 65535/65536), and the values just beyond what C packs
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1),
    st.sampled_from([0, 1, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32,
                     (1 << 63) - 1, 1 << 63, (1 << 64) - 1, -1, -32, -33, -128, -129,
                     -32768, -32769, -(1 << 31), -(1 << 31) - 1, -(1 << 63)]),
    st.floats(allow_nan=True), st.sampled_from([-0.0, float("inf"), 5e-324]),
    st.text(max_size=40), st.binary(max_size=40),
    st.sampled_from([n * "é" for n in (15, 16, 127, 128)] + [n * "x" for n in
                    (31, 32, 255, 256, 65535, 65536)] + [n * b"b" for n in (255, 256, 65536)]),
)
_NOT_SCALARS = st.sampled_from([1 << 64, -(1 << 63) - 1, "\ud800", [1], (1,), {"a": 1}, {2},
                                bytearray(b"x")])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_KEYS, _SCALARS, max_size=40), st.sampled_from([1, 3, 16384]),
       st.lists(_NOT_SCALARS, max_size=1))
def test_a_msgpack_state_of_scalars_packs_in_c_to_the_bytes_msgpack_writes(
    values: dict[bytes, Any], chunk: int, other: list[Any],
) -> None:
    """A hash-map state of the default ``MsgpackSerializer`` packs None, bool, int
    (-2**63 .. 2**64 - 1), float, str and bytes values in C (``pack_fixed`` kind 2):
    the same groups and bytes as msgpack-python's encoding one value at a time. A
    state with any other value (a list, a tuple, an int out of range, a lone
    surrogate) goes the general way: the same snapshot, or the same error."""
    import pytest

    from weir import MsgpackSerializer, StateSerializationError
    from weir.state.backend import EncodedValues

    serializer = MsgpackSerializer()
    if other:
        values = {**values, b"\x00\x07other": other[0]}
    fast = EncodedValues("count", serializer, values)
    assert fast.fixed == 2
    assert (_pack_fixed(values, 2, chunk) is None) == bool(other)  # C takes scalars only
    try:
        general = [(key, serializer.encode(v)) for key, v in values.items()]
    except Exception:  # whatever msgpack raises: the typed error instead
        with pytest.raises(StateSerializationError, match="'count'"):
            pack_sources(iter([("count", fast)]), {}, chunk)
        return
    packed = pack_sources(iter([("count", fast), ("b", [])]), {}, chunk)
    assert encode_keyed(packed) == encode_keyed(pack_sources(iter([("count", general)]), {},
                                                             chunk))


def test_a_dict_that_changes_while_packed_in_c_is_an_error_not_a_wrong_snapshot(
    monkeypatch: Any,
) -> None:
    """``pack_fixed`` resumes from a dict position between chunks: a dict written
    meanwhile (only a frozen copy may be packed in the background) would be packed
    partly twice or not at all, so it raises as iterating the dict would."""
    import pytest

    from weir import IntSerializer
    from weir.state import packed
    from weir.state.backend import EncodedValues

    values = {bytes([0, g]) + b"k": g for g in range(8)}
    real = packed.pack_fixed

    def writer_meanwhile(*args: Any) -> Any:
        out = real(*args)
        values[b"\x00\x09new"] = 1
        return out

    monkeypatch.setattr(packed, "pack_fixed", writer_meanwhile)
    with pytest.raises(RuntimeError, match="changed size during a snapshot"):
        pack_sources(iter([("count", EncodedValues("count", IntSerializer(), values))]), {}, 2)
