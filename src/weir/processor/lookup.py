"""Point lookups of keyed state in a checkpoint: :func:`query_state`.

Only what the keys need is read: each key's key group names the one subtask file
that holds it, and the file's key-group index (in the checkpoint's metadata) the
bytes of that group. A full ``.keyed`` file is read at those offsets only; a
changelog (hash map) reads its base and deltas the same way and replays only those
groups. A native RocksDB checkpoint is a database, not an indexed file: the owning
subtask's files are downloaded and the keys looked up in it. The cut-out bytes have
no checksum of their own (a file's SHA-256 covers all of it); a malformed group is
still a :class:`~weir.errors.CorruptCheckpointError`, and ``weir checkpoint inspect``
or :func:`weir.read_state` verify whole files.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weir.api.descriptors import StateKind
from weir.api.serializers import Serializer
from weir.checkpoint.changelog import replay
from weir.checkpoint.coordinator import CompletedCheckpoint
from weir.checkpoint.datafiles import decode_keyed, sparse_file
from weir.checkpoint.format import (
    KeyedChangelogHandle,
    KeyedFullHandle,
    KeyedIncrementalHandle,
    SubtaskStateHandle,
)
from weir.checkpoint.storage import FileRef
from weir.processor.decoding import SerializerSet, keyed_columns, keyed_rows, to_frame
from weir.processor.locate import locate
from weir.processor.reader import StateReader
from weir.state.backend import split_map_key
from weir.state.keybytes import canonical_key_bytes
from weir.state.keygroups import KeyGroupRange, assign_to_key_group
from weir.state.rocksdb import lookup_native

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["query_state"]


def query_state(
    location: str | Path,
    uid: str,
    state_name: str,
    keys: Iterable[Any],
    *,
    checkpoint_id: int | None = None,
    query: str | None = None,
    serializers: Iterable[Serializer[Any]] = (),
    storage_options: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """Keyed state ``state_name`` of operator ``uid`` for ``keys`` only, from the
    latest completed checkpoint in ``location`` (anything :func:`weir.read_state`
    opens; ``checkpoint_id``/``query`` choose another), reading only those keys' key
    groups. Columns as :meth:`~weir.StateReader.keyed_state`; a key without state has
    no row.

    >>> weir.query_state("/chk/fraud", "fraud-detector", "count", ["acct-17"])  # doctest: +SKIP
           key  value
    0  acct-17      3
    """
    located = locate(str(location), uid=uid, checkpoint_id=checkpoint_id, query=query,
                     storage_options=storage_options)
    completed = located.checkpoints[uid]
    op = completed.metadata.operators[uid]
    sers = SerializerSet(serializers, reading=True)
    meta = StateReader(located.checkpoints, located.description, sers)._meta(uid, state_name)
    wanted: dict[int, set[bytes]] = {}
    for key in keys:
        group = assign_to_key_group(key, op.max_parallelism)
        wanted.setdefault(group, set()).add(group.to_bytes(2, "big") + canonical_key_bytes(key))
    is_map = meta.kind is StateKind.MAP
    entries: list[tuple[bytes, bytes]] = []
    for handle in op.subtasks:
        groups = sorted(g for g in wanted if g in handle.key_group_range)
        if not groups or handle.keyed is None:
            continue
        prefixes = {p for g in groups for p in wanted[g]}
        for raw_key, value in _entries(completed, uid, handle, groups, state_name, prefixes):
            if (split_map_key(raw_key)[0] if is_map else raw_key) in prefixes:
                entries.append((raw_key, value))
    what = f"keyed state {state_name!r} of operator {uid!r} in {located.description}"
    rows = list(keyed_rows(meta, entries, sers, what))
    return to_frame(rows, keyed_columns(meta))


def _entries(
    completed: CompletedCheckpoint, uid: str, handle: SubtaskStateHandle, groups: list[int],
    name: str, prefixes: set[bytes],
) -> list[tuple[bytes, bytes]]:
    """State ``name``'s entries in ``groups`` of one subtask (a superset of the keys'
    entries: whole groups, or in RocksDB the keys' prefixes)."""
    where = f"{completed.url}, operator {uid!r} subtask {handle.subtask_index}"
    keyed = handle.keyed
    span = KeyGroupRange(groups[0], groups[-1])
    if isinstance(keyed, KeyedIncrementalHandle):
        local = tempfile.mkdtemp(prefix="weir-lookup-")
        try:
            snap = completed.load_subtask(uid, handle.subtask_index, span, local)
            native = snap.keyed.native if snap.keyed is not None else None
            return lookup_native(native.path, name, sorted(prefixes)) if native else []
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def reader(ref: FileRef) -> Callable[[int, int], bytes]:
        return lambda start, length: completed.storage.read_range(ref.path, start, length,
                                                                  where)

    cut_files: dict[str, bytes] = {}

    def cut(full: KeyedFullHandle, base: bool = False) -> KeyedFullHandle:
        if not base and not any(g in full.key_groups for g in groups):
            return KeyedFullHandle(full.file, {})  # a delta without them: never read
        data, index = sparse_file(reader(full.file), full.key_groups, groups)
        cut_files[full.file.path] = data
        return KeyedFullHandle(full.file, index)

    if isinstance(keyed, KeyedFullHandle):
        part = cut(keyed)
        decoded = (decode_keyed(cut_files[part.file.path], part.key_groups, None, where)
                   if part.key_groups else {})
    elif isinstance(keyed, KeyedChangelogHandle):
        sparse = KeyedChangelogHandle(cut(keyed.base, base=True),
                                      tuple(cut(d) for d in keyed.deltas))
        decoded = replay(lambda ref: cut_files[ref.path], sparse, span, handle.metas, where)
    else:
        return []
    return [entry for per in decoded.values() for entry in per.get(name, ())]
