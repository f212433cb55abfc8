"""In-process checkpoint drivers: one whole checkpoint or savepoint over the
``SubtaskCheckpointer`` of every subtask of a job (used by the test harness, the
benchmarks and users' own tests; the Spark runtime drives its own per batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import wait
from pathlib import Path
from typing import Any

from weir.checkpoint.coordinator import (
    CheckpointCoordinator,
    CompletedCheckpoint,
    PendingCheckpoint,
)
from weir.checkpoint.format import CheckpointKind
from weir.checkpoint.storage import CheckpointStorage
from weir.runtime.checkpointer import PendingSnapshot, SubtaskCheckpointer

__all__ = ["take_checkpoint", "take_savepoint"]


def _run(
    coordinator: CheckpointCoordinator,
    pending: PendingCheckpoint,
    checkpointers: Sequence[SubtaskCheckpointer],
    source_positions: Mapping[str, Any] | None,
) -> CompletedCheckpoint:
    savepoint = pending.kind is CheckpointKind.SAVEPOINT
    snapshots: list[PendingSnapshot] = []
    try:
        for c in checkpointers:
            snapshots.append(c.snapshot(
                pending.checkpoint_id, pending.timestamp_ms,
                target=pending.storage if savepoint else None, savepoint=savepoint,
            ))
        for c, snap in zip(checkpointers, snapshots, strict=True):
            cfg = c.operator.config
            pending.acknowledge(c.uid, cfg.parallelism, cfg.max_parallelism, snap.result())
        completed = coordinator.complete(pending, source_positions)
    except Exception:
        # let every upload still running finish (or fail) first, so none of them
        # publishes a file after the abort has deleted the checkpoint's files
        wait([snap.future for snap in snapshots])
        for c in checkpointers:
            c.notify_checkpoint_aborted(pending.checkpoint_id)
        coordinator.abort(pending)
        raise
    if not savepoint:
        for c in checkpointers:
            c.notify_checkpoint_complete(pending.checkpoint_id)
    return completed


def take_checkpoint(
    coordinator: CheckpointCoordinator,
    checkpointers: Sequence[SubtaskCheckpointer],
    *,
    source_positions: Mapping[str, Any] | None = None,
    timestamp_ms: int | None = None,
) -> CompletedCheckpoint:
    """Run one whole checkpoint over ``checkpointers`` (every subtask of the job):
    trigger, snapshot (asynchronous parts run in their threads), acknowledge,
    complete, notify. On failure the checkpoint is aborted and the error re-raised;
    the previous checkpoint stays the latest."""
    return _run(coordinator, coordinator.trigger(timestamp_ms), checkpointers, source_positions)


def take_savepoint(
    coordinator: CheckpointCoordinator,
    checkpointers: Sequence[SubtaskCheckpointer],
    target: str | Path | CheckpointStorage,
    *,
    source_positions: Mapping[str, Any] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> CompletedCheckpoint:
    """Write a canonical, self-contained savepoint of every subtask into ``target``."""
    pending = coordinator.trigger_savepoint(target, storage_options=storage_options)
    return _run(coordinator, pending, checkpointers, source_positions)
