"""Changelog checkpoints of keyed state (checkpoint format version 2).

A subtask in changelog mode (``SnapshotMode.CHANGELOG``; hash map, or RocksDB:
``weir.state.rocksdb_changes``) writes its keyed state once in full (the *base*),
then per checkpoint only what changed since the previous one (a *delta*), and every
so often, in the background, a new full copy (a
*materialization*) that later checkpoints use as their base instead of the base and
the deltas before it — Flink's changelog state backend, and Spark's HDFS state store
(a delta file per batch, a snapshot every few). A checkpoint that changed nothing
writes no keyed file at all. Files (all under ``shared/``, so that later checkpoints
can reference them; reference counted like RocksDB's SST files)::

    shared/<uid-dir>/<id>-<uuid>.keyed     the base a subtask wrote in checkpoint <id>
    shared/<uid-dir>/<id>-<uuid>.delta     the changes of checkpoint <id>
    shared/<uid-dir>/m<id>-<uuid>.keyed    the state as of checkpoint <id>, written in
                                           the background (referenced by a later one)
    shared/<uid-dir>/<id>-<uuid>.op        operator and broadcast state, written by
                                           checkpoint <id> when it changed

A subtask's metadata (``format.KeyedChangelogHandle``) names its base and its deltas,
oldest first: ``{"kind": "changelog", "base": FULL, "deltas": [FULL, ...]}``, each
``FULL`` a file reference with its key-group index, as for ``.keyed`` files.

**Delta files** have the data-file header of ``weir.checkpoint.format`` (magic
``WEIRDATA``, ``uint16_be`` version) and then one msgpack map per key group (the
index in the metadata gives each group's offset and length)::

    {state name: [[primary key, ...], [key0, value0, key1, value1, ...]]}

Replaying a delta, for each state: every entry whose *primary key* is in the first
list is removed, then the entries of the second list are added. The primary key of
an entry is its key (value and list states, timers: ``prefixed key + int64_be(ts)``),
for a map state the prefixed key without the user key — so a changed key's whole
map is replaced. Deleted keys are listed with no entry. Entries are canonical
snapshot entries (``weir.state.backend``), after the state's full-snapshot TTL
filter. Restoring reads the base and the deltas of the key groups the new subtask
owns only, at any parallelism.

**Materialization** (``ChangelogPolicy``) starts when the deltas since the base are
as large as the base, or ``max_deltas`` long, or ``interval_ms`` after the last one
— the trade-off between bytes written per checkpoint and bytes read on restore
(at most about twice the state, and ``max_deltas`` + 1 files per subtask). A
materialization older than ``max_lag`` checkpoints when it finishes is dropped: a
runtime may delete unreferenced ``m<id>`` files older than that.

**Rebase**: a checkpoint that wrote at least ``rebase_share`` of the state's keys
(say every key of a small, hot state) writes a new base instead of a delta: the delta
would be about as large (it names each changed key twice), and the chain starts over,
so no materialization follows and a restore reads one file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from weir.api.descriptors import StateKind
from weir.checkpoint.datafiles import (
    Entries,
    PackedBody,
    pack_array_header,
    pack_groups,
    pairs,
    unpack_groups,
)
from weir.checkpoint.format import (
    KeyedChangelogHandle,
    KeyedFullHandle,
    decode_keyed,
)
from weir.checkpoint.storage import FileRef
from weir.errors import ConfigurationError
from weir.state._hashcore import pack_changes
from weir.state.backend import split_map_key
from weir.state.keygroups import KeyGroupRange
from weir.state.snapshot import StateMeta

__all__ = [
    "ChangelogPolicy",
    "Changes",
    "WrittenChanges",
    "checkpoint_of",
    "encode_delta",
    "decode_delta",
    "replay",
]

#: key group -> state name -> (primary keys replaced, their entries now)
Changes = Mapping[int, Mapping[str, tuple[list[bytes], list[tuple[bytes, bytes]]]]]
#: state name -> prefixed key -> the canonical value written last (None: deleted);
#: value and list states of RocksDB without a snapshot filter
WrittenChanges = Mapping[str, dict[bytes, bytes | None]]


@dataclass(frozen=True)
class ChangelogPolicy:
    """When a changelog subtask materializes its state in the background: once the
    deltas since its base hold ``size_ratio`` times the base's bytes, or number
    ``max_deltas``, or ``interval_ms`` passed since the last materialization (None:
    never by time). A materialization that finishes more than ``max_lag``
    checkpoints after the one it copies is dropped (None: never)."""

    interval_ms: int | None = 600_000
    max_deltas: int = 50
    size_ratio: float = 1.0
    max_lag: int | None = None
    #: a checkpoint that wrote at least this share of the state's keys writes a new
    #: base instead of a delta (None: never): such a delta is about as large as the
    #: state, and the chain (restore reads, materializations) starts over
    rebase_share: float | None = 0.5
    #: write materializations in a background thread (False: inside the checkpoint,
    #: for deterministic tests)
    background: bool = True

    def __post_init__(self) -> None:
        share = self.rebase_share
        if share is not None and not (type(share) in (int, float) and 0 < share <= 1):
            raise ConfigurationError(
                f"ChangelogPolicy(rebase_share={share!r}) must be a share of the keys in "
                f"(0, 1], or None to never write a new base for churn"
            )


def checkpoint_of(ref: FileRef) -> int:
    """The checkpoint id a changelog file was written for (``<id>-`` or ``m<id>-``)."""
    head = ref.path.rsplit("/", 1)[-1].split("-", 1)[0].removeprefix("m")
    return int(head) if head.isdigit() else -1


def encode_delta(
    changes: Changes, written: WrittenChanges | None = None,
) -> tuple[bytes, dict[int, tuple[int, int]], int]:
    """A ``.delta`` file of ``changes`` and of ``written`` (states whose changes are
    the bytes each key was written last, None if deleted: packed in C): the bytes, the
    key-group index and the number of keys replaced."""
    replaced = 0
    packed: dict[int, dict[str, PackedBody]] = {}
    header = pack_array_header
    for name, last in (written or {}).items():
        for group, (keys, n_keys, entries, n_entries) in pack_changes(last).items():
            packed.setdefault(group, {})[name] = PackedBody(b"".join((
                header(2), header(n_keys), keys, header(2 * n_entries), entries)))
            replaced += n_keys

    def bodies() -> Iterator[tuple[int, dict[str, Any]]]:
        nonlocal replaced
        for group in sorted(changes.keys() | packed.keys()):
            per_state: dict[str, Any] = {}
            for name, (keys, entries) in changes.get(group, {}).items():
                if keys:
                    per_state[name] = [keys, [x for pair in entries for x in pair]]
                    replaced += len(keys)
            per_state.update(packed.get(group, {}))
            yield group, per_state

    data, index = pack_groups(bodies())
    return data, index, replaced


def _delta_body(raw: Any) -> tuple[list[bytes], Entries]:
    keys, flat = raw
    return list(keys), pairs(flat)


def decode_delta(
    data: bytes, index: Mapping[int, tuple[int, int]], key_groups: KeyGroupRange | None,
    where: str,
) -> dict[int, dict[str, tuple[list[bytes], Entries]]]:
    """The key groups of a ``.delta`` file that fall in ``key_groups`` (all if None)."""
    return unpack_groups(data, index, key_groups, f"{where} (changelog delta)", _delta_body)


def replay(
    read: Callable[[FileRef], bytes],
    handle: KeyedChangelogHandle,
    key_groups: KeyGroupRange,
    metas: Mapping[str, StateMeta],
    where: str,
) -> Mapping[int, Mapping[str, Entries]]:
    """The keyed state of ``key_groups`` in ``handle``: its base with every delta
    applied in order. ``read`` returns a file's verified bytes. Only key groups that a
    delta touches are rebuilt; the cost is the base plus the changes."""
    base = handle.base
    groups = decode_keyed(read(base.file), base.key_groups, key_groups,
                          f"{where}: {base.file.path}")
    maps = {name for name, meta in metas.items() if meta.kind is StateKind.MAP}
    #: key group -> state -> primary key -> entries (only the groups a delta touches)
    live: dict[int, dict[str, dict[bytes, list[tuple[bytes, bytes]]]]] = {}
    for delta in handle.deltas:
        if not any(g in key_groups for g in delta.key_groups):
            continue
        changes = decode_delta(read(delta.file), delta.key_groups, key_groups,
                               f"{where}: {delta.file.path}")
        for group, per_state in changes.items():
            states = live.get(group)
            if states is None:
                states = live[group] = {
                    name: _by_primary(entries, name in maps)
                    for name, entries in groups.get(group, {}).items()
                }
            for name, (keys, entries) in per_state.items():
                table = states.setdefault(name, {})
                for key in keys:
                    table.pop(key, None)
                is_map = name in maps
                for key, value in entries:
                    primary = split_map_key(key)[0] if is_map else key
                    table.setdefault(primary, []).append((key, value))
    if not live:  # the base as it is (decoded when read: a restore reads it flat)
        return groups

    def rebuilt(group: int) -> dict[str, Entries]:
        merged = {name: tuple(e for entries in table.values() for e in entries)
                  for name, table in live[group].items()}
        return {name: entries for name, entries in merged.items() if entries}

    # the base's groups in its order, a group only the deltas have after them
    out = {g: rebuilt(g) if g in live else groups[g] for g in groups}
    out.update((g, rebuilt(g)) for g in live if g not in out)
    return {g: per for g, per in out.items() if per}


def _by_primary(
    entries: Iterable[tuple[bytes, bytes]], is_map: bool
) -> dict[bytes, list[tuple[bytes, bytes]]]:
    out: dict[bytes, list[tuple[bytes, bytes]]] = {}
    for key, value in entries:
        out.setdefault(split_map_key(key)[0] if is_map else key, []).append((key, value))
    return out


def digest(data: bytes) -> str:
    """The SHA-256 a ``FileRef`` of ``data`` carries (to reuse an unchanged file)."""
    return hashlib.sha256(data).hexdigest()


def chain_after(handle: KeyedChangelogHandle, checkpoint_id: int) -> tuple[KeyedFullHandle, ...]:
    """The deltas of ``handle`` written after checkpoint ``checkpoint_id``."""
    return tuple(d for d in handle.deltas if checkpoint_of(d.file) > checkpoint_id)
