"""Savepoints of completed checkpoints (Spark stages', continuous jobs'): a completed
checkpoint rewritten in the canonical, self-contained savepoint format (the same format
``weir.checkpoint.take_savepoint`` writes, so a savepoint restores on any runtime,
backend and parallelism).

Full-format state is re-encoded as it is; an incremental RocksDB part is opened from
its native files and read out in canonical key order.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from typing import Any

from weir.checkpoint.channel_state import ChannelStateHandle
from weir.checkpoint.coordinator import CompletedCheckpoint, PendingCheckpoint
from weir.checkpoint.format import (
    METADATA_FILE,
    CheckpointKind,
    CheckpointMetadata,
    encode_metadata,
    uid_dir,
)
from weir.checkpoint.publish import write_new_directory
from weir.checkpoint.storage import CheckpointStorage
from weir.checkpoint.subtask_files import write_snapshot
from weir.errors import CheckpointError
from weir.state.keycontext import KeyContext
from weir.state.keyed import KeyedStateStore
from weir.state.rocksdb import RocksDBKeyedStateBackend
from weir.state.snapshot import KeyedStateSnapshot, OperatorSubtaskSnapshot

__all__ = ["canonical_keyed", "copy_channel_state", "copy_subtask", "spark_offsets",
           "write_savepoint"]


def canonical_keyed(keyed: KeyedStateSnapshot, owner: str) -> KeyedStateSnapshot:
    """Canonical entries of a native (incremental RocksDB) keyed snapshot."""
    if keyed.native is None:
        return keyed
    context = KeyContext(keyed.max_parallelism, keyed.key_group_range, owner)
    backend = RocksDBKeyedStateBackend(context, None)
    try:
        store = KeyedStateStore(backend, lambda: 0, owner)
        timers = store.restore([keyed], keyed.timer_states)
        return store.snapshot(timers, keyed.key_group_range)
    finally:
        backend.close()
        shutil.rmtree(keyed.native.path, ignore_errors=True)


def spark_offsets(spark_checkpoint: str, batch: int) -> dict[str, Any] | None:
    """The end offsets of ``batch`` from Spark's offset log (``<checkpoint>/offsets/<batch>``:
    a version line, the batch's metadata, then one offset per source, ``-`` for none);
    None if the log does not have the batch (any more)."""
    import fsspec

    path = f"{spark_checkpoint.rstrip('/')}/offsets/{batch}"
    try:
        with fsspec.open(path, "rt") as f:
            lines = f.read().splitlines()
    except (OSError, ValueError):
        return None
    if len(lines) < 2 or not lines[0].startswith("v"):
        return None
    offsets: list[Any] = []
    for line in lines[2:]:
        try:
            offsets.append(None if line.strip() == "-" else json.loads(line))
        except ValueError:
            offsets.append(line)
    return {"spark_checkpoint": spark_checkpoint, "offset_log": path, "batch": batch,
            "offsets": offsets}


def write_savepoint(
    checkpoints: list[CompletedCheckpoint], target: str, *,
    storage_options: dict[str, Any] | None = None,
    stage_positions: dict[str, dict[str, Any]] | None = None,
) -> str:
    """Write the operators of ``checkpoints`` (one per stage) as one savepoint into the
    directory ``target``; its URL. Each stage's Spark positions (and
    ``stage_positions[uid]``, e.g. Spark's source offsets) are kept under
    ``source_positions["spark_stages"][uid]``; a continuous job's checkpoint keeps its
    source positions, the records it had in flight (unaligned) and its job lineage.
    Nothing is left in ``target`` if it fails: on a local disk the savepoint is written
    next to it and renamed into place; elsewhere what was written is deleted."""
    return write_new_directory(
        target, lambda storage: _write(checkpoints, storage, stage_positions or {}),
        storage_options=storage_options)


def _write(
    checkpoints: list[CompletedCheckpoint], storage: CheckpointStorage,
    stage_positions: dict[str, dict[str, Any]],
) -> None:
    first = max(checkpoints, key=lambda c: c.checkpoint_id).metadata
    pending = PendingCheckpoint(
        first.checkpoint_id, first.trigger_timestamp_ms, CheckpointKind.SAVEPOINT, storage, ""
    )
    stages: dict[str, Any] = {}
    kept: dict[str, Any] = {}  # (source positions of checkpoints that are not Spark's)
    spark = bool(stage_positions) or any(
        {"spark", "spark_stages"} & set(c.metadata.source_positions) for c in checkpoints)
    owner: dict[str, Any] = {}  # (the job lineage: its sinks accept the savepoint)
    channels: dict[str, ChannelStateHandle] = {}
    for completed in checkpoints:
        meta = completed.metadata
        if not spark:
            kept.update(meta.source_positions)
        if meta.owner.get("lineage"):
            owner = {"lineage": meta.owner["lineage"]}
        channels.update(copy_channel_state(completed, storage))
        for uid, op in sorted(meta.operators.items()):
            if uid in stages:
                raise CheckpointError(f"operator {uid!r} appears in two checkpoints")
            positions = meta.source_positions
            own = (positions.get("spark_stages") or {}).get(uid) or positions.get("spark")
            stages[uid] = {**dict(own or {}), **stage_positions.get(uid, {})}
            for handle in op.subtasks:
                copy_subtask(completed, uid, op, handle, storage, pending)
    positions_out: dict[str, Any] = kept
    if spark:
        positions_out = {"spark_stages": stages}
        if len(stages) == 1:
            positions_out["spark"] = next(iter(stages.values()))
    done = CheckpointMetadata(
        first.checkpoint_id, CheckpointKind.SAVEPOINT, first.trigger_timestamp_ms,
        int(time.time() * 1000), pending._operators(), positions_out,
        channel_state=channels, owner=owner,
    )
    storage.write(METADATA_FILE, encode_metadata(done))


def copy_subtask(
    completed: CompletedCheckpoint, uid: str, op: Any, handle: Any,
    storage: CheckpointStorage, pending: PendingCheckpoint,
) -> None:
    i = handle.subtask_index
    snaps = completed.load(uid, op.parallelism, i)
    own: OperatorSubtaskSnapshot = next(s for s in snaps if s.subtask_index == i)
    for other in snaps:
        if other is not own and other.keyed is not None and other.keyed.native:
            shutil.rmtree(other.keyed.native.path, ignore_errors=True)
    if own.keyed is not None:
        owner = f"savepoint of operator {uid!r} subtask {i}"
        own = dataclasses.replace(own, keyed=canonical_keyed(own.keyed, owner))
    prefix = f"{uid_dir(uid)}/{i}-savepoint"
    written = write_snapshot(own, storage, prefix, handle.key_group_range)
    pending.acknowledge(uid, op.parallelism, op.max_parallelism, written)


def copy_channel_state(completed: CompletedCheckpoint, storage: CheckpointStorage
                       ) -> dict[str, ChannelStateHandle]:
    """The records ``completed`` (an unaligned checkpoint of the continuous runtime) had
    in flight, its channel-state files copied into the savepoint ``storage``: its
    sources' positions are past them, so a savepoint without them would lose them."""
    out = {}
    for vertex, handle in sorted(completed.metadata.channel_state.items()):
        files = {}
        for subtask, ref in sorted(handle.subtasks.items()):
            data = completed.storage.read(
                ref, f"{completed.url}: channel state of {vertex}[{subtask}]")
            files[subtask] = storage.write(
                f"_channels/{uid_dir(vertex)}/{subtask}-savepoint.channels", data)
        out[vertex] = ChannelStateHandle(vertex, handle.parallelism, files)
    return out
