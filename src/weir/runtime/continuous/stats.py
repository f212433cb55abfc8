"""The checkpoint history of a continuous job (Flink's checkpoint statistics): every
checkpoint and savepoint triggered, its status, duration and size, the bytes stored as
channel state, and per task when it acknowledged, how long its alignment took, the
synchronous and asynchronous parts of its snapshots and their bytes, in the one model
of every runtime (:mod:`weir.checkpoint.stats`). ``JobClient.checkpoints()`` returns
it."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from weir.checkpoint.format import CheckpointMetadata, SubtaskStateHandle
from weir.checkpoint.stats import (
    CheckpointStats,
    CheckpointStatus,
    SubtaskCheckpointStats,
    checkpoint_stats,
)

__all__ = ["CheckpointHistory", "CheckpointStats", "CheckpointStatus", "SubtaskCheckpointStats"]


class CheckpointHistory:
    """The history, kept by the driver (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats: dict[int, CheckpointStats] = {}

    def started(self, stats: CheckpointStats) -> None:
        """A checkpoint or savepoint was triggered."""
        with self._lock:
            self._stats[stats.checkpoint_id] = stats

    def update(self, checkpoint_id: int, **changes: Any) -> None:
        """Change what is known of ``checkpoint_id`` (``duration_ms``: its end-to-end
        duration)."""
        if "duration_ms" in changes:
            changes["end_to_end_duration_ms"] = changes.pop("duration_ms")
        with self._lock:
            self._stats[checkpoint_id] = dataclasses.replace(self._stats[checkpoint_id],
                                                             **changes)

    def acknowledged(self, checkpoint_id: int, vertex: str, subtask: int, *,
                     acknowledged_ms: float, alignment_ms: float | None,
                     handles: list[SubtaskStateHandle], channel_state_bytes: int) -> None:
        """Task ``vertex[subtask]`` acknowledged ``checkpoint_id`` with ``handles``."""
        part = SubtaskCheckpointStats(
            vertex, subtask, acknowledged_ms=round(acknowledged_ms, 3),
            alignment_ms=None if alignment_ms is None else round(alignment_ms, 3),
            sync_ms=round(sum(h.stats.sync_ms for h in handles), 3),
            async_ms=round(sum(h.stats.async_ms for h in handles), 3),
            state_size=sum(f.size for h in handles for f in h.files()),
            channel_state_bytes=channel_state_bytes,
            checkpointed_size=sum(h.stats.new_bytes for h in handles),
            entries=sum(h.stats.entries for h in handles))
        with self._lock:
            old = self._stats[checkpoint_id]
            self._stats[checkpoint_id] = dataclasses.replace(old,
                                                             subtasks=(*old.subtasks, part))

    def completed(self, checkpoint_id: int, metadata: CheckpointMetadata) -> None:
        """``checkpoint_id`` completed with ``metadata``."""
        done = checkpoint_stats(metadata)
        self.update(checkpoint_id, status=CheckpointStatus.COMPLETED,
                    completed_timestamp_ms=done.completed_timestamp_ms,
                    end_to_end_duration_ms=done.end_to_end_duration_ms,
                    state_size=done.state_size, checkpointed_size=done.checkpointed_size,
                    channel_state_bytes=done.channel_state_bytes, files=done.files,
                    operators=done.operators)

    def snapshot(self) -> list[CheckpointStats]:
        """Every checkpoint and savepoint so far, oldest first."""
        with self._lock:
            return [self._stats[k] for k in sorted(self._stats)]
