"""Key groups packed as they are snapshotted: the compact form of a keyed snapshot.

A snapshot of a large hash-map state held as ``(key, value)`` tuples costs about 100
bytes of Python objects per entry on top of the live state; packed, an entry costs its
encoded size (a dozen bytes or so for a small key and value). :func:`pack_sources`
therefore encodes every state's canonical entries straight into the body of a
``.keyed`` data file (layout in :mod:`weir.checkpoint.format`, which adds the header)::

    per key group, ascending:  msgpack map {state name (str): [k0, v0, k1, v1, ...]}

each map holding the states in the order their first entry of the group came and
their entries (bin) in the order given; a state or group without entries is left
out. :class:`PackedGroups` is that body with its key-group index, and a read-only
``Mapping[group, Mapping[state name, entries]]`` that decodes a group when it is
read, so everything that reads a snapshot's groups works unchanged; the checkpoint
writer writes the body after the header, and a restore reads a file's body in place.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import msgpack

from weir.errors import CorruptCheckpointError
from weir.state._hashcore import pack_entries, pack_fixed

__all__ = ["Entries", "PackedGroups", "pack_sources", "pairs", "unpack_group"]

T = TypeVar("T")
Entries = tuple[tuple[bytes, bytes], ...]
#: entries packed per call by default, each holding the GIL throughout: about 3 ms
#: from a hash map's entries; 4,096 measured slower for the hash map (GIL hand-offs);
#: one call per state stalled RocksDB tasks 124-162 ms per materialization (RocksDB
#: packs fewer per call: ``KeyedStateBackend.snapshot_chunk``)
_CHUNK = 16384
_header_packer = msgpack.Packer(use_bin_type=True, autoreset=True)
_packb = _header_packer.pack
_packb_map_header = _header_packer.pack_map_header
_packb_array_header = _header_packer.pack_array_header


def pairs(flat: Sequence[bytes]) -> Entries:
    """``[k0, v0, k1, v1, ...]`` as ``((k0, v0), (k1, v1), ...)``."""
    it = iter(flat)
    return tuple(zip(it, it, strict=True))


def _flat(raw: Any) -> list[bytes]:
    if not isinstance(raw, list) or len(raw) % 2:
        raise ValueError("a state's entries are not a list of keys and values")
    return raw


def unpack_group(
    body: bytes | memoryview, group: int, span: tuple[int, int], where: str,
    decode: Callable[[Any], T],
) -> dict[str, T]:
    """Key group ``group`` of a data file's ``body`` at ``span`` (offset, length), each
    state's body passed through ``decode``; a span outside the body or a malformed
    group is a CorruptCheckpointError naming ``where``."""
    offset, length = span
    if offset < 0 or length < 0 or offset + length > len(body):
        raise CorruptCheckpointError(f"{where}: key group {group} lies outside the file")
    try:
        per_state = msgpack.unpackb(memoryview(body)[offset : offset + length], raw=False)
        return {name: decode(raw) for name, raw in per_state.items()}
    except (ValueError, TypeError, AttributeError, msgpack.UnpackException) as exc:
        raise CorruptCheckpointError(f"{where}: key group {group} cannot be decoded ({exc})"
                                     ) from exc


class PackedGroups(Mapping[int, Mapping[str, Entries]]):
    """The body of a ``.keyed`` data file (``body``: the packed groups after the header)
    and its key-group index (group -> offset in ``body``, length), read as key group
    -> state name -> entries; a group is decoded each time it is read. ``where`` names
    the file in a CorruptCheckpointError."""

    __slots__ = ("body", "entries", "index", "where")

    def __init__(self, body: bytes | memoryview, index: dict[int, tuple[int, int]],
                 entries: int | None, where: str) -> None:
        self.body = body
        self.index = index
        #: number of entries (None: not counted, e.g. read from a file)
        self.entries = entries
        self.where = where

    def __getitem__(self, group: int) -> dict[str, Entries]:
        return unpack_group(self.body, group, self.index[group], self.where, pairs)

    def flat(self, group: int) -> dict[str, list[bytes]]:
        """Key group ``group`` with each state's entries as the flat list
        ``[key0, raw0, key1, raw1, ...]`` it is packed as (no tuple per entry)."""
        return unpack_group(self.body, group, self.index[group], self.where, _flat)

    def __iter__(self) -> Iterator[int]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, group: object) -> bool:
        return group in self.index

    def restrict(self, keep: Callable[[int], bool]) -> PackedGroups:
        """The groups for which ``keep`` is true (the same file, a smaller index)."""
        index = {g: span for g, span in self.index.items() if keep(g)}
        if len(index) == len(self.index):
            return self
        return PackedGroups(self.body, index, None, self.where)

    def parts(self) -> tuple[list[memoryview], dict[int, tuple[int, int]]]:
        """The body of exactly these groups, in ascending order, as slices of
        ``body`` (one if :meth:`restrict` left nothing out), and its index."""
        view = memoryview(self.body)
        spans = sorted(self.index.items())  # groups are packed in ascending order
        if sum(length for _, (_, length) in spans) == len(view):
            return [view], self.index
        index: dict[int, tuple[int, int]] = {}
        out: list[memoryview] = []
        offset = 0
        for group, (start, length) in spans:
            index[group] = (offset, length)
            out.append(view[start : start + length])
            offset += length
        return out, index


def _kept(entries: Iterable[tuple[bytes, bytes]],
          keep: Callable[[bytes, bytes], bytes | None]) -> Iterator[tuple[bytes, bytes]]:
    """``entries`` after a full-snapshot filter (None drops one, bytes replace its value)."""
    for key, data in entries:
        kept = keep(key, data)
        if kept is not None:
            yield key, kept


@runtime_checkable
class FixedWidthValues(Protocol):
    """Entries that are a dict's values encoded by a serializer C can run
    (``weir.state.backend.EncodedValues``): ``fixed`` 0 for int64, 1 for float64, 2 for
    msgpack scalars, None for any other serializer."""

    fixed: int | None
    values: Mapping[bytes, Any]


def _pack_fixed(values: Mapping[bytes, Any], kind: int, chunk: int
                ) -> list[dict[int, tuple[bytearray, int]]] | None:
    """``pack_fixed`` over all of ``values``, ``chunk`` entries per call (each holds the
    GIL); None if a value is not one C packs (the general path then names it)."""
    if not isinstance(values, dict):
        return None
    out = []
    pos, size = 0, len(values)
    try:
        while pos >= 0:
            done, pos = pack_fixed(values, kind, pos, chunk)
            out.append(done)
    except (TypeError, ValueError, OverflowError):
        return None
    if len(values) != size:  # (a dict position means nothing once it changed)
        raise RuntimeError("dictionary changed size during a snapshot")
    return out


def pack_sources(
    sources: Iterable[tuple[str, Iterable[tuple[bytes, bytes]]]],
    filters: Mapping[str, Callable[[bytes, bytes], bytes | None]],
    chunk: int = _CHUNK,
) -> PackedGroups:
    """Every state's canonical entries (``sources``: state name, entries whose keys
    start with their 2-byte key group) packed by key group, after the full-snapshot
    filter of the state in ``filters`` (None drops an entry, bytes replace its
    value), ``chunk`` entries per call into C. Holds the encoded entries only, never a
    tuple per entry."""
    # group -> name -> [buffers of packed entries (one per call), entries]
    slots: dict[int, dict[str, list[Any]]] = {}

    def add(name: str, done: dict[int, tuple[bytearray, int]]) -> None:
        for group, (buf, count) in done.items():
            slot = slots.setdefault(group, {}).setdefault(name, [[], 0])
            slot[0].append(buf)
            slot[1] += count

    for name, entries in sources:
        keep = filters.get(name)
        # a hash-map state of ints or floats (weir.state.backend.EncodedValues): packed
        # in C from its values, no bytes object or tuple per entry
        if keep is None and isinstance(entries, FixedWidthValues) and entries.fixed is not None:
            fixed = _pack_fixed(entries.values, entries.fixed, chunk)
            if fixed is not None:
                for done in fixed:
                    add(name, done)
                continue
        it = iter(entries if keep is None else _kept(entries, keep))
        # a chunk at a time: pack_entries holds the GIL throughout, and this runs in a
        # worker thread beside the task's processing (a RocksDB iterator never lets go
        # of the GIL on its own)
        while done := pack_entries(itertools.islice(it, chunk)):
            add(name, done)
    parts: list[bytes] = []
    index: dict[int, tuple[int, int]] = {}
    offset = total = 0
    for group in sorted(slots):
        per_state = slots.pop(group)
        blob = [_packb_map_header(len(per_state))]
        for name, (chunks, count) in per_state.items():
            blob += (_packb(name), _packb_array_header(2 * count), *chunks)
            total += count
        packed = b"".join(blob)
        del blob, per_state
        index[group] = (offset, len(packed))
        offset += len(packed)
        parts.append(packed)
    return PackedGroups(b"".join(parts), index, total, "a snapshot in memory")

