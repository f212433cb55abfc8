"""Savepoints of Spark stages: a completed checkpoint rewritten in the canonical,
self-contained savepoint format (the same format ``weir.checkpoint.take_savepoint``
writes, so a savepoint restores on any runtime, backend and parallelism).

Full-format state is re-encoded as it is; an incremental RocksDB part is opened from
its native files and read out in canonical key order.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from typing import Any

from weir.checkpoint.coordinator import CompletedCheckpoint, PendingCheckpoint
from weir.checkpoint.format import (
    METADATA_FILE,
    CheckpointKind,
    CheckpointMetadata,
    encode_metadata,
    uid_dir,
)
from weir.checkpoint.snapshotter import write_snapshot
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import CheckpointError
from weir.state.keycontext import KeyContext
from weir.state.keyed import KeyedStateStore
from weir.state.rocksdb import RocksDBStateBackend
from weir.state.snapshot import KeyedStateSnapshot, OperatorSubtaskSnapshot

__all__ = ["write_savepoint"]


def _canonical(keyed: KeyedStateSnapshot, owner: str) -> KeyedStateSnapshot:
    """Canonical entries of a native (incremental RocksDB) keyed snapshot."""
    if keyed.native is None:
        return keyed
    context = KeyContext(keyed.max_parallelism, keyed.key_group_range, owner)
    backend = RocksDBStateBackend(context, None)
    try:
        store = KeyedStateStore(backend, lambda: 0, owner)
        timers = store.restore([keyed], keyed.timer_states)
        return store.snapshot(timers, keyed.key_group_range)
    finally:
        backend.close()
        shutil.rmtree(keyed.native.path, ignore_errors=True)


def write_savepoint(
    checkpoints: list[CompletedCheckpoint], target: str, *,
    storage_options: dict[str, Any] | None = None,
) -> str:
    """Write the operators of ``checkpoints`` (one per stage) as one savepoint into the
    directory ``target``; its URL. Each stage's Spark positions are kept under
    ``source_positions["spark_stages"][uid]``."""
    storage = CheckpointStorage(target, storage_options=storage_options)
    if storage.exists(METADATA_FILE):
        raise CheckpointError(f"{storage.url} already holds a savepoint; choose a new directory")
    first = max(checkpoints, key=lambda c: c.checkpoint_id).metadata
    pending = PendingCheckpoint(
        first.checkpoint_id, first.trigger_timestamp_ms, CheckpointKind.SAVEPOINT, storage, ""
    )
    stages: dict[str, Any] = {}
    for completed in checkpoints:
        meta = completed.metadata
        for uid, op in sorted(meta.operators.items()):
            if uid in stages:
                raise CheckpointError(f"operator {uid!r} appears in two checkpoints")
            stages[uid] = dict(meta.source_positions.get("spark") or {})
            for handle in op.subtasks:
                i = handle.subtask_index
                snaps = completed.load(uid, op.parallelism, i)
                own: OperatorSubtaskSnapshot = next(s for s in snaps if s.subtask_index == i)
                for other in snaps:
                    if other is not own and other.keyed is not None and other.keyed.native:
                        shutil.rmtree(other.keyed.native.path, ignore_errors=True)
                if own.keyed is not None:
                    owner = f"savepoint of operator {uid!r} subtask {i}"
                    own = dataclasses.replace(own, keyed=_canonical(own.keyed, owner))
                prefix = f"{uid_dir(uid)}/{i}-savepoint"
                written = write_snapshot(own, storage, prefix, handle.key_group_range)
                pending.acknowledge(uid, op.parallelism, op.max_parallelism, written)
    positions: dict[str, Any] = {"spark_stages": stages}
    if len(stages) == 1:
        positions["spark"] = next(iter(stages.values()))
    done = CheckpointMetadata(
        first.checkpoint_id, CheckpointKind.SAVEPOINT, first.trigger_timestamp_ms,
        int(time.time() * 1000), pending._operators(), positions,
    )
    storage.write(METADATA_FILE, encode_metadata(done))
    return storage.url
