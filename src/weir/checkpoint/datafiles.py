"""Checkpoint data files: ``.keyed`` (keyed state and timers by key group) and
``.op`` (operator and broadcast state of one subtask), and the header every weir
data file starts with. The layout is specified in :mod:`weir.checkpoint.format`
(its module documentation), which re-exports these functions."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import msgpack

from weir.errors import CheckpointFormatError, CorruptCheckpointError
from weir.state.keygroups import KeyGroupRange
from weir.state.packed import Entries, PackedGroups, pairs, unpack_group

__all__ = [
    "FORMAT_VERSION",
    "Entries",
    "check_data_header",
    "decode_keyed",
    "decode_operator_file",
    "encode_keyed",
    "encode_operator_file",
    "pack_groups",
    "pairs",
    "sparse_file",
    "unpack_groups",
    "version_advice",
]

T = TypeVar("T")

#: 2: key groups by weir.state.keyhash (Spark's hash() of the key); 1 placed keys by
#: murmur3 of their canonical bytes, so its key groups are not this weir's.
FORMAT_VERSION = 2
_DATA_MAGIC = b"WEIRDATA"
_VERSION = struct.Struct(">H")
_DATA_HEADER = len(_DATA_MAGIC) + _VERSION.size

def _header() -> bytes:
    return _DATA_MAGIC + _VERSION.pack(FORMAT_VERSION)


def _check_header(data: bytes, magic: bytes, where: str) -> None:
    if len(data) < len(magic) + _VERSION.size or data[: len(magic)] != magic:
        raise CheckpointFormatError(
            f"{where}: not a weir checkpoint file (bad magic); it was not written by weir "
            f"or is corrupt"
        )
    (version,) = _VERSION.unpack_from(data, len(magic))
    if version != FORMAT_VERSION:
        raise CheckpointFormatError(
            f"{where}: checkpoint format version {version}, this weir reads version "
            f"{FORMAT_VERSION}{version_advice(version)}"
        )


def version_advice(version: object) -> str:
    """What to do with a checkpoint of another format ``version`` (appended to the
    error that refuses it)."""
    if version == 1:
        return (
            "; format 1 put keys in other key groups (weir before its key hash became "
            "Spark's hash()), so this weir cannot restore it: restore it with the weir "
            "that wrote it, or start the query on a new checkpoint location"
        )
    return f"; restore it with a weir that writes version {version}"


def check_data_header(data: bytes, where: str) -> None:
    """Raise CheckpointFormatError unless ``data`` starts a weir data file of this
    format version."""
    _check_header(data, _DATA_MAGIC, where)


_packer = msgpack.Packer(use_bin_type=True, autoreset=True)
_packb = _packer.pack
#: the msgpack header of an array of n items
pack_array_header = _packer.pack_array_header


class PackedBody(bytes):
    """A state's body in a key group already encoded as msgpack (written as it is)."""

    __slots__ = ()


def _pack_group(per_state: Mapping[str, Any]) -> bytes:
    if not any(type(body) is PackedBody for body in per_state.values()):
        return bytes(_packb(per_state))
    parts = [_packer.pack_map_header(len(per_state))]
    for name, body in per_state.items():
        parts += (_packb(name), body if type(body) is PackedBody else _packb(body))
    return b"".join(parts)


def pack_groups(
    groups: Iterable[tuple[int, Mapping[str, Any]]],
) -> tuple[bytes, dict[int, tuple[int, int]]]:
    """A data file of key groups: the header, then one msgpack map (state name ->
    body, a :class:`PackedBody` as it is) per key group, in the order given; empty maps
    are left out. Returns the bytes and the key-group index (group -> offset after the
    header, length)."""
    parts = [_header()]
    index: dict[int, tuple[int, int]] = {}
    offset = 0
    for group, per_state in groups:
        if not per_state:
            continue
        blob = _pack_group(per_state)
        index[group] = (offset, len(blob))
        offset += len(blob)
        parts.append(blob)
    return b"".join(parts), index


def unpack_groups(
    data: bytes,
    index: Mapping[int, tuple[int, int]],
    key_groups: KeyGroupRange | None,
    where: str,
    decode: Callable[[Any], T],
) -> dict[int, dict[str, T]]:
    """The key groups of a data file that fall in ``key_groups`` (all if None), each
    state's body passed through ``decode``; any malformed group is a
    CorruptCheckpointError naming ``where``."""
    _check_header(data, _DATA_MAGIC, where)
    body = memoryview(data)[_DATA_HEADER:]
    out: dict[int, dict[str, T]] = {}
    for group, span in index.items():
        if key_groups is None or group in key_groups:
            out[group] = unpack_group(body, group, span, where, decode)
    return out


def sparse_file(
    read_range: Callable[[int, int], bytes], index: Mapping[int, tuple[int, int]],
    groups: Iterable[int],
) -> tuple[bytes, dict[int, tuple[int, int]]]:
    """A data file cut down to its key groups in ``groups``, read with
    ``read_range(offset, length)`` (file offsets): the header and only those groups'
    bytes, with their index in the cut file — what :func:`unpack_groups` and a
    changelog replay read instead of the whole file (no checksum: the file's SHA-256
    covers all of it)."""
    parts = [read_range(0, _DATA_HEADER)]
    cut: dict[int, tuple[int, int]] = {}
    offset = 0
    for group in sorted(set(groups) & set(index)):
        start, length = index[group]
        parts.append(read_range(_DATA_HEADER + start, length))
        cut[group] = (offset, length)
        offset += length
    return b"".join(parts), cut


def encode_keyed(
    groups: Mapping[int, Mapping[str, Iterable[tuple[bytes, bytes]]]],
) -> tuple[bytes, dict[int, tuple[int, int]], int]:
    """A ``.keyed`` file: header + one msgpack map per key group. Returns the bytes,
    the key-group index and the number of entries. Groups already packed
    (:class:`~weir.state.packed.PackedGroups`) are written as they are."""
    if isinstance(groups, PackedGroups):
        parts, index = groups.parts()
        entries = groups.entries  # None once restricted: count them
        if entries is None:
            entries = sum(len(e) for per in groups.values() for e in per.values())
        return b"".join([_header(), *parts]), index, entries
    entries = 0

    def flattened() -> Iterator[tuple[int, dict[str, list[bytes]]]]:
        nonlocal entries
        for group in sorted(groups):
            per_state: dict[str, list[bytes]] = {}
            for name, items in groups[group].items():
                flat = [x for pair in items for x in pair]
                if flat:
                    per_state[name] = flat
                    entries += len(flat) // 2
            yield group, per_state

    data, index = pack_groups(flattened())
    return data, index, entries


def decode_keyed(
    data: bytes,
    index: Mapping[int, tuple[int, int]],
    key_groups: KeyGroupRange | None,
    where: str,
) -> PackedGroups:
    """The key groups of a ``.keyed`` file that fall in ``key_groups`` (all if None),
    each decoded when it is read (a restore reads them as flat lists,
    ``PackedGroups.flat``, without a tuple per entry); a group outside the file or
    malformed is a CorruptCheckpointError then, as :func:`unpack_groups` gives."""
    _check_header(data, _DATA_MAGIC, where)
    groups = PackedGroups(memoryview(data)[_DATA_HEADER:], dict(index), None, where)
    return groups if key_groups is None else groups.restrict(key_groups.__contains__)


def encode_operator_file(
    operator: Mapping[str, Iterable[bytes]], broadcast: Mapping[str, Entries]
) -> bytes:
    """A ``.op`` file: operator list states and broadcast states of one subtask."""
    body = {
        "operator": {name: list(elements) for name, elements in operator.items()},
        "broadcast": {name: [x for pair in e for x in pair] for name, e in broadcast.items()},
    }
    packed: bytes = _packb(body)
    return _header() + packed


def decode_operator_file(
    data: bytes, where: str
) -> tuple[dict[str, tuple[bytes, ...]], dict[str, Entries]]:
    """Inverse of :func:`encode_operator_file`."""
    _check_header(data, _DATA_MAGIC, where)
    try:
        body = msgpack.unpackb(memoryview(data)[_DATA_HEADER:], raw=False)
        operator = {name: tuple(elements) for name, elements in body["operator"].items()}
        broadcast = {}
        for name, flat in body["broadcast"].items():
            it = iter(flat)
            broadcast[name] = tuple(zip(it, it, strict=True))
    except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as exc:
        raise CorruptCheckpointError(f"{where}: operator state cannot be decoded ({exc})") from exc
    return operator, broadcast
