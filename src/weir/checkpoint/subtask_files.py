"""The files of one subtask snapshot and the handle that names them.

``write_snapshot`` writes a full (or native RocksDB) snapshot; the changelog writer
of ``weir.runtime.checkpointer`` shares ``operator_file_data`` and
``subtask_handle`` with it. Formats: :mod:`weir.checkpoint.format`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from weir.checkpoint.format import (
    KeyedFullHandle,
    KeyedHandle,
    KeyedIncrementalHandle,
    SubtaskStateHandle,
    SubtaskStats,
    encode_keyed,
    encode_operator_file,
)
from weir.checkpoint.storage import CheckpointStorage, FileRef
from weir.state.keygroups import KeyGroupRange
from weir.state.snapshot import OperatorSubtaskSnapshot

__all__ = ["NativeUpload", "operator_file_data", "subtask_handle", "write_snapshot"]

NativeUpload = Callable[[str], tuple[dict[str, FileRef], dict[str, FileRef], int]]


def operator_file_data(snap: OperatorSubtaskSnapshot) -> bytes | None:
    """The ``.op`` file of ``snap`` (operator and broadcast state), None if it has none."""
    if not (snap.operator_states or snap.broadcast_states):
        return None
    return encode_operator_file(
        {n: s.elements for n, s in snap.operator_states.items()},
        {n: b.entries for n, b in snap.broadcast_states.items()},
    )


def subtask_handle(
    snap: OperatorSubtaskSnapshot,
    key_group_range: KeyGroupRange,
    keyed: KeyedHandle | None,
    operator_file: FileRef | None,
    *,
    new_bytes: int,
    sync_ms: float,
    started: float,
    entries: int,
) -> SubtaskStateHandle:
    """The handle of ``snap`` written as ``keyed`` and ``operator_file``, with its stats
    (``started``: ``time.perf_counter()`` when the writing began)."""
    handle = SubtaskStateHandle(
        subtask_index=snap.subtask_index,
        key_group_range=key_group_range,
        metas=snap.keyed.metas if snap.keyed is not None else {},
        timer_states=snap.keyed.timer_states if snap.keyed is not None else (),
        keyed=keyed,
        operator_states={n: (s.mode, s.serializer) for n, s in snap.operator_states.items()},
        broadcast_states={n: b.serializers for n, b in snap.broadcast_states.items()},
        operator_file=operator_file,
        operator_schemas={n: s.schema for n, s in snap.operator_states.items()
                          if s.schema is not None},
        broadcast_schemas={n: b.schemas for n, b in snap.broadcast_states.items()
                           if b.schemas != (None, None)},
    )
    stats = SubtaskStats(
        sum(f.size for f in handle.files()), new_bytes, sync_ms,
        (time.perf_counter() - started) * 1000, entries,
    )
    return dataclasses.replace(handle, stats=stats)


def write_snapshot(
    snap: OperatorSubtaskSnapshot,
    storage: CheckpointStorage,
    prefix: str,
    key_group_range: KeyGroupRange,
    sync_ms: float = 0.0,
    native: NativeUpload | None = None,
) -> SubtaskStateHandle:
    """Write the files of one subtask snapshot under ``prefix`` (``native`` uploads a
    native RocksDB checkpoint and returns its shared and private files); the handle
    to acknowledge."""
    started = time.perf_counter()
    keyed: KeyedHandle | None = None
    new_bytes = 0
    entries = 0
    if snap.keyed is not None:
        data, index, entries = encode_keyed(snap.keyed.groups)
        full: KeyedFullHandle | None = None
        if index or native is None:
            suffix = ".timers" if native is not None else ".keyed"
            ref = storage.write(prefix + suffix, data)
            new_bytes += ref.size
            full = KeyedFullHandle(ref, index)
        if native is not None:
            shared, private, uploaded = native(prefix)
            new_bytes += uploaded
            keyed = KeyedIncrementalHandle(shared, private, full)
        else:
            keyed = full
    operator_file = None
    op_data = operator_file_data(snap)
    if op_data is not None:
        operator_file = storage.write(prefix + ".op", op_data)
        new_bytes += operator_file.size
    return subtask_handle(snap, key_group_range, keyed, operator_file, new_bytes=new_bytes,
                          sync_ms=sync_ms, started=started, entries=entries)
