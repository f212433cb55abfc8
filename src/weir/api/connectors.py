"""What the continuous runtime asks of sources and sinks (Flink's ``Source`` /
``SourceReader`` and two-phase-commit ``Sink`` / ``SinkWriter`` / committer, trimmed).

A **source** is split into positions (msgpack-able values: a file and an offset, a
sequence's next number): a subtask's reader starts from the positions it is given (all
of its own on a fresh start; on restore, the checkpointed ones redistributed by even
split) and reports its current positions at every checkpoint, so a restore rewinds it
exactly there.

A **sink** is exactly-once by two-phase commit: its writer writes records into an open
transaction; at a checkpoint's barrier :meth:`SinkWriter.prepare_commit` closes the
transaction and returns a *committable* (msgpack-able), which goes into the checkpoint;
once the checkpoint completes, :meth:`Sink.commit` makes the committables of it and of
every earlier checkpoint visible. As a subtask opens, the sink first checks that where
it writes belongs to the job's *lineage* (:meth:`Sink.claim`: a job continuing from its
own checkpoints or a savepoint keeps its lineage, a fresh start has a new one), then
commits the committables recovered from a checkpoint (:meth:`Sink.commit_after_recovery`:
their checkpoint completed, the notification may have been lost; some may be committed
already and their output since taken away by a consumer), and
:meth:`Sink.abort_attempts` drops what earlier attempts of this sink — of this run of
the job, or of an earlier run (a job resumed from a savepoint) — left open. ``commit``
must be idempotent: a committable may be committed again after a failure, or by a later
run restored from a savepoint (so a committable names where it was written).
Transaction names must be unique across runs and across the sinks that may share a
place to write: :class:`SinkContext` gives the run's id and the sink's uid.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from weir.api.watermarks import WatermarkStrategy
from weir.errors import SinkLineageError

__all__ = ["Sink", "SinkContext", "SinkLineageError", "SinkWriter", "Source", "SourceReader"]

T = TypeVar("T")


class SourceReader(ABC, Generic[T]):
    """Reads a subtask's positions of a source."""

    @abstractmethod
    def poll(self, max_records: int) -> list[T] | None:
        """Up to ``max_records`` next records ([] if none is ready now); None once every
        position is exhausted (a bounded source's end)."""

    @abstractmethod
    def positions(self) -> list[Any]:
        """Where each of its positions stands now (checkpointed; restored by even
        split, or by union for a source with ``union_positions``)."""

    def live_splits(self) -> list[Hashable] | None:
        """The splits the reader reads now (not those at their end), for per-split
        watermarks; a reader that returns a list implements :meth:`poll_splits` too.
        Called as the source task starts and at every watermark check. Default: None,
        the reader does not tell splits apart (one watermark for all it reads)."""
        return None

    def poll_splits(self, max_records: int) -> list[tuple[Hashable, list[T]]] | None:
        """As :meth:`poll`, with the records grouped by their split: ``[(split,
        records), ...]``, each group in the split's order ([] if no record is ready
        now; None once every position is exhausted). Used instead of :meth:`poll` when
        :meth:`live_splits` is not None and the job has a watermark strategy. Default:
        :meth:`poll`'s records as one group of the split None."""
        records = self.poll(max_records)
        if records is None:
            return None
        return [(None, records)] if records else []

    def snapshot_positions(self, checkpoint_id: int) -> list[Any]:
        """The positions checkpoint ``checkpoint_id`` holds, taken at its trigger
        (Flink's ``snapshotState``); a reader that acts on the checkpoint's completion
        keeps what it needs under the id. Default: :meth:`positions`."""
        return self.positions()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed (called in the source task's thread,
        between polls; not for a savepoint of a running job). An error raised here
        fails the task: a reader whose action is best effort logs it instead. Default:
        nothing."""

    def close(self) -> None:
        """Release what the reader holds."""


class Source(ABC, Generic[T]):
    """A replayable source."""

    #: how its readers' positions are restored: False (default) by even split, each
    #: reader a share; True by union, every reader all of them (to keep its own)
    union_positions: bool = False

    #: the watermark strategy the source was made with (``KafkaSource(watermarks=)``),
    #: used by ``from_source`` when it is given none (None: no event time)
    watermarks: WatermarkStrategy | None = None

    @abstractmethod
    def reader(self, subtask: int, parallelism: int, positions: list[Any] | None
               ) -> SourceReader[T]:
        """The reader of subtask ``subtask`` of ``parallelism``: from ``positions`` when
        restored (possibly none), else from the start of its share."""


class SinkWriter(ABC, Generic[T]):
    """Writes a subtask's records into open transactions."""

    @abstractmethod
    def write(self, record: T) -> None:
        """Add ``record`` to the open transaction."""

    @abstractmethod
    def prepare_commit(self, checkpoint_id: int) -> Any:
        """Close the open transaction at checkpoint ``checkpoint_id``'s barrier (and open
        the next); its committable (None if it holds nothing)."""

    def close(self) -> None:
        """Release what the writer holds (an open transaction is left to
        :meth:`Sink.abort_attempts` of the next attempt)."""


@dataclass(frozen=True)
class SinkContext:
    """Where a sink writer runs (Flink's sink ``InitContext``)."""

    #: this run of the job (a new one for every execute; sortable by start time, no "-")
    run_id: str
    subtask: int
    parallelism: int
    #: the attempt within the run: 0, then one more after each restart
    attempt: int
    #: the sink operator's uid (any characters): transactions of two sinks writing to
    #: one place never share a name, and a sink drops only its own (a job always gives
    #: it; the default is for a context made by hand, e.g. in a test of one sink)
    uid: str = ""
    #: the job's lineage: the same while a job continues from its own checkpoints or
    #: from a savepoint, new for a fresh start with no state (:meth:`Sink.claim`; a job
    #: always gives it)
    lineage: str = ""


class Sink(ABC, Generic[T]):
    """A two-phase-commit sink."""

    @abstractmethod
    def writer(self, context: SinkContext) -> SinkWriter[T]:
        """The writer of a subtask in an attempt of a run."""

    def claim(self, context: SinkContext) -> None:
        """Check that where this sink writes belongs to ``context.lineage``, recording
        it as the owner when nobody is; raise :class:`SinkLineageError` when another
        lineage is (called as a subtask opens, before anything else of the sink; other
        subtasks may claim at the same moment and must agree). Default: nothing."""

    def locations(self) -> list[str]:
        """The places (directories, URLs) this sink writes that every task of the job
        must reach at the same path: on a cluster (the Spark runner) a job whose
        executors do not share one is refused when it starts. Default: none."""
        return []

    @abstractmethod
    def commit(self, committables: list[Any]) -> None:
        """Make the committables' records visible; idempotent."""

    def commit_after_recovery(self, committables: list[Any]) -> None:
        """Commit the committables recovered from a completed checkpoint as a subtask
        restores (Flink's ``commitAfterRecovery``): some may have been committed
        already, and what they made visible since moved or deleted by a consumer — a
        transaction found neither pending nor committed counts as committed. Default:
        :meth:`commit`."""
        self.commit(committables)

    @abstractmethod
    def abort_attempts(self, context: SinkContext, keep: list[Any]) -> None:
        """Drop what this sink (``context.uid``) left uncommitted in earlier attempts of
        ``context``'s run and in every other run, except ``keep`` — never what another
        sink wrote (called as a subtask of ``context.attempt`` starts, after
        :meth:`claim`, before it writes; other subtasks of that attempt may be writing
        already)."""
