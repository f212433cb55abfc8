"""The checkpoint history of a continuous job (Flink's checkpoint statistics): every
checkpoint and savepoint triggered, its status, duration and size, the bytes stored as
channel state, and per task when it acknowledged, how long its alignment took, the
synchronous and asynchronous parts of its snapshots and their bytes.
``JobClient.checkpoints()`` returns it."""

from __future__ import annotations

import dataclasses
import enum
import threading
from dataclasses import dataclass
from typing import Any

from weir.checkpoint.format import CheckpointMetadata, SubtaskStateHandle

__all__ = ["CheckpointHistory", "CheckpointStats", "CheckpointStatus", "SubtaskCheckpointStats"]


class CheckpointStatus(enum.Enum):
    """Where a checkpoint or savepoint stands."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True)
class CheckpointStats:
    """One checkpoint or savepoint of the job, as Flink's checkpoint history shows it."""

    checkpoint_id: int
    #: "checkpoint", "savepoint" or "sync_savepoint" (of stop-with-savepoint)
    kind: str
    status: CheckpointStatus
    trigger_timestamp_ms: int
    #: from trigger to completion or failure (None while in progress)
    duration_ms: float | None = None
    #: bytes of every file the checkpoint references (completed ones)
    state_size_bytes: int | None = None
    #: of those, the records in flight stored by an unaligned checkpoint
    channel_state_bytes: int | None = None
    #: where a savepoint was written
    location: str | None = None
    #: why it failed
    failure: str | None = None
    #: per task, in the order they acknowledged
    subtasks: tuple[SubtaskCheckpointStats, ...] = ()

    @property
    def alignment_ms(self) -> float | None:
        """The longest alignment of any task (None before any acknowledged)."""
        times = [s.alignment_ms for s in self.subtasks if s.alignment_ms is not None]
        return max(times) if times else None


@dataclass(frozen=True)
class SubtaskCheckpointStats:
    """One task's part of a checkpoint."""

    vertex: str
    subtask: int
    #: from the trigger to its acknowledgement (end to end for this task)
    acknowledged_ms: float
    #: first barrier to last at its input (None: a source)
    alignment_ms: float | None
    #: its operators' snapshots: synchronous part (in the task thread), upload
    sync_ms: float
    async_ms: float
    state_bytes: int
    #: records in flight it stored (unaligned checkpoints)
    channel_state_bytes: int


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
        """Change what is known of ``checkpoint_id``."""
        with self._lock:
            self._stats[checkpoint_id] = dataclasses.replace(self._stats[checkpoint_id],
                                                             **changes)

    def acknowledged(self, checkpoint_id: int, vertex: str, subtask: int, *,
                     acknowledged_ms: float, alignment_ms: float | None,
                     handles: list[SubtaskStateHandle], channel_state_bytes: int) -> None:
        """Task ``vertex[subtask]`` acknowledged ``checkpoint_id`` with ``handles``."""
        part = SubtaskCheckpointStats(
            vertex, subtask, round(acknowledged_ms, 3),
            None if alignment_ms is None else round(alignment_ms, 3),
            round(sum(h.stats.sync_ms for h in handles), 3),
            round(sum(h.stats.async_ms for h in handles), 3),
            sum(f.size for h in handles for f in h.files()), channel_state_bytes)
        with self._lock:
            old = self._stats[checkpoint_id]
            self._stats[checkpoint_id] = dataclasses.replace(old,
                                                             subtasks=(*old.subtasks, part))

    def completed(self, checkpoint_id: int, metadata: CheckpointMetadata) -> None:
        """``checkpoint_id`` completed with ``metadata``."""
        self.update(checkpoint_id, status=CheckpointStatus.COMPLETED,
                    duration_ms=metadata.duration_ms,
                    state_size_bytes=sum(f.size for f in metadata.files()),
                    channel_state_bytes=sum(f.size for h in metadata.channel_state.values()
                                            for f in h.subtasks.values()))

    def snapshot(self) -> list[CheckpointStats]:
        """Every checkpoint and savepoint so far, oldest first."""
        with self._lock:
            return [self._stats[k] for k in sorted(self._stats)]
