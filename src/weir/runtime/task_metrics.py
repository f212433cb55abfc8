"""What a running job's tasks are doing, one shape on both runtimes
(``JobClient.metrics()`` of a continuous job and of a Spark query): Flink's task
metrics — records in and out per second, the current watermark — per task, with what
only one runtime knows left ``None``.

* The continuous runtime: one per running task (operator ``uid`` and subtask), over the
  interval between its last two heartbeats (about a second), with where its time went
  (*busy*, *idle*, *backpressured*: ``busyTimeMsPerSecond`` …) and its channels'
  buffers (:mod:`weir.runtime.continuous.metrics`).
* The micro-batch runtime: one per stage (``subtask`` None: summed over its subtasks),
  from the newest batch that ran it — Spark's observed metrics ``weir:<uid>``
  (:mod:`weir.runtime.spark.observed`): its records, outputs, late records, dead
  letters, timers, state entries, and its checkpoint's ``state_size`` and
  ``checkpointed_size`` (the names of :mod:`weir.checkpoint.stats`); rates over the
  batch's duration.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TaskMetrics"]


@dataclass(frozen=True)
class TaskMetrics:
    """One task's (continuous) or stage's (micro-batch) recent behaviour."""

    #: the operator's uid
    operator: str
    #: the subtask (None: a micro-batch stage, summed over its subtasks)
    subtask: int | None
    records_in_per_s: float
    records_out_per_s: float
    #: the current event time (None: no watermark yet, no event time, or not known)
    watermark: int | None
    #: when these were sampled (wall clock, ms; a micro-batch: the batch's start)
    sampled_at_ms: int
    #: continuous: fraction of the interval the task waited for downstream credit (0..1)
    backpressured: float | None = None
    #: continuous: fraction it waited for input, with none there (0..1)
    idle: float | None = None
    #: continuous: the rest, processing (0..1)
    busy: float | None = None
    #: continuous: buffers received and not yet processed, per input channel
    input_queued: tuple[int, ...] = ()
    #: continuous: buffers waiting for credit, per output channel
    output_backlog: tuple[int, ...] = ()
    #: micro-batch: the batch these are of
    batch: int | None = None
    #: micro-batch: input records of the batch, and rows emitted
    records_in: int | None = None
    records_out: int | None = None
    #: micro-batch: records at or behind the watermark, dead letters, timers fired
    late_records: int | None = None
    dead_letters: int | None = None
    timers_fired: int | None = None
    #: micro-batch: keyed-state entries after the batch
    state_entries: int | None = None
    #: micro-batch: the batch's checkpoint: bytes it references, bytes it wrote, and
    #: the slowest subtask's snapshot
    state_size: int | None = None
    checkpointed_size: int | None = None
    checkpoint_duration_ms: float | None = None
    #: micro-batch: subtasks that ran, and of them those restored from storage
    subtasks: int | None = None
    restored: int | None = None

    @property
    def vertex(self) -> str:
        """(The name before issue 39: :attr:`operator`.)"""
        return self.operator
