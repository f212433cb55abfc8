"""Checkpoint statistics, one model for every runtime and every view of them: a
continuous job's live history (``JobClient.checkpoints()``), a Spark query's
(``weir.spark.JobClient.checkpoints()``), a location's history read from metadata
(``weir ui``, ``weir.processor.history``). The names are Flink's
(``CheckpointStatsTracker`` / ``AbstractCheckpointStats`` / ``SubtaskStateStats``):

* *end-to-end duration* — trigger to completion (on Spark: the batch's start to
  Spark's commit, so it includes the batch's processing);
* *state size* — bytes of every file the checkpoint references (Flink's full
  checkpoint data size); *checkpointed size* — bytes it uploaded (changed SST files,
  changelog deltas, new full snapshots);
* *persisted data* (``channel_state_bytes``) — records in flight stored by an unaligned
  checkpoint;
* per subtask: *sync* / *async* duration of its snapshot, *alignment* (first barrier to
  last), *acknowledged* (trigger to its acknowledgement), its sizes and entries.

Built from a checkpoint's metadata by :func:`checkpoint_stats`; the continuous runtime's
driver also keeps in-progress and failed ones.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from weir.checkpoint.format import CheckpointMetadata

__all__ = ["CheckpointStats", "CheckpointStatus", "SubtaskCheckpointStats", "checkpoint_stats",
           "subtask_stats"]


class CheckpointStatus(enum.Enum):
    """Where a checkpoint (or savepoint, or Spark batch) stands."""

    IN_PROGRESS = "in_progress"
    """Triggered, not complete yet (a running job)."""
    COMPLETED = "completed"
    """Complete: its metadata is published."""
    FAILED = "failed"
    """Aborted (expired, declined, subsumed, the attempt ended)."""
    PENDING = "pending"
    """Files but no metadata in storage: running, failed, or never to complete."""
    EMPTY = "empty"
    """A Spark batch in which the stage had no row: its state is the previous batch's."""
    INCOMPLETE = "incomplete"
    """A Spark batch committed with parts of the stage's output never computed."""


@dataclass(frozen=True)
class SubtaskCheckpointStats:
    """One operator subtask's (or task's) part of a checkpoint."""

    #: the operator's uid (from metadata), or the task's vertex (a running job)
    operator: str
    subtask: int
    #: trigger to this task's acknowledgement (a running job's tasks)
    acknowledged_ms: float | None = None
    #: first barrier to last at its input (None: not known, or a task without inputs)
    alignment_ms: float | None = None
    sync_ms: float = 0.0
    async_ms: float = 0.0
    #: bytes its snapshot references
    state_size: int = 0
    #: records in flight it stored (unaligned checkpoints)
    channel_state_bytes: int = 0
    #: bytes it uploaded for this checkpoint
    checkpointed_size: int | None = None
    #: state entries its snapshot holds (keyed entries, operator and broadcast items)
    entries: int | None = None

    @property
    def vertex(self) -> str:
        """(The name before issue 39: :attr:`operator`.)"""
        return self.operator

    @property
    def state_bytes(self) -> int:
        """(The name before issue 39: :attr:`state_size`.)"""
        return self.state_size


@dataclass(frozen=True)
class CheckpointStats:
    """One checkpoint, savepoint or Spark batch, as Flink's checkpoint history shows it."""

    checkpoint_id: int
    #: "checkpoint", "savepoint" or "sync_savepoint" (of stop-with-savepoint); None: not
    #: known (no metadata)
    kind: str | None
    status: CheckpointStatus
    trigger_timestamp_ms: int | None
    completed_timestamp_ms: int | None = None
    #: trigger to completion or failure (None while in progress)
    end_to_end_duration_ms: float | None = None
    #: bytes of every file the checkpoint references (completed ones)
    state_size: int | None = None
    #: bytes it uploaded
    checkpointed_size: int | None = None
    #: of the state size, the records in flight stored by an unaligned checkpoint
    channel_state_bytes: int | None = None
    #: files it references
    files: int | None = None
    #: where it is (a savepoint's directory, a checkpoint's)
    location: str | None = None
    #: why it failed
    failure: str | None = None
    #: the Spark query that wrote it (micro-batch runtime)
    query: str | None = None
    #: the operators it holds state of
    operators: tuple[str, ...] = ()
    #: per operator subtask (from metadata) or task (a running job, in acknowledgement order)
    subtasks: tuple[SubtaskCheckpointStats, ...] = ()

    @property
    def alignment_ms(self) -> float | None:
        """The longest alignment of any task (None when none is known)."""
        times = [s.alignment_ms for s in self.subtasks if s.alignment_ms is not None]
        return max(times) if times else None

    @property
    def duration_ms(self) -> float | None:
        """(The name before issue 39: :attr:`end_to_end_duration_ms`.)"""
        return self.end_to_end_duration_ms

    @property
    def state_size_bytes(self) -> int | None:
        """(The name before issue 39: :attr:`state_size`.)"""
        return self.state_size

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``weir ui --json``)."""
        out: dict[str, Any] = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["status"] = self.status.value
        out["operators"] = list(self.operators)
        out["subtasks"] = [{name: getattr(s, name) for name in s.__dataclass_fields__}
                           for s in self.subtasks]
        return out


def subtask_stats(metadata: CheckpointMetadata) -> tuple[SubtaskCheckpointStats, ...]:
    """Every operator subtask's part of the checkpoint ``metadata`` describes."""
    return tuple(
        SubtaskCheckpointStats(
            uid, s.subtask_index, alignment_ms=s.stats.alignment_ms, sync_ms=s.stats.sync_ms,
            async_ms=s.stats.async_ms, state_size=s.stats.bytes,
            checkpointed_size=s.stats.new_bytes, entries=s.stats.entries)
        for uid, op in sorted(metadata.operators.items()) for s in op.subtasks)


def checkpoint_stats(metadata: CheckpointMetadata, *, location: str | None = None,
                     query: str | None = None) -> CheckpointStats:
    """The statistics of the completed checkpoint ``metadata`` describes."""
    subtasks = subtask_stats(metadata)
    return CheckpointStats(
        metadata.checkpoint_id, metadata.kind.value, CheckpointStatus.COMPLETED,
        metadata.trigger_timestamp_ms, completed_timestamp_ms=metadata.completion_timestamp_ms,
        end_to_end_duration_ms=metadata.duration_ms, state_size=metadata.total_bytes,
        checkpointed_size=sum(s.checkpointed_size or 0 for s in subtasks),
        channel_state_bytes=sum(f.size for h in metadata.channel_state.values()
                                for f in h.subtasks.values()),
        files=len(metadata.files()), location=location, query=query,
        operators=tuple(sorted(metadata.operators)), subtasks=subtasks)
