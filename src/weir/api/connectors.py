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
every earlier checkpoint visible. A restore commits the committables it recovers
(their checkpoint completed; the notification may have been lost) and
:meth:`Sink.abort_attempts` drops what earlier attempts — of this run of the job, or of
an earlier run (a job resumed from a savepoint) — left open. ``commit`` must be
idempotent: a committable may be committed again after a failure, or by a later run
restored from a savepoint (so a committable names where it was written). Transaction
names must be unique across runs: :class:`SinkContext` gives the run's id.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Sink", "SinkContext", "SinkWriter", "Source", "SourceReader"]

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

    def close(self) -> None:
        """Release what the reader holds."""


class Source(ABC, Generic[T]):
    """A replayable source."""

    #: how its readers' positions are restored: False (default) by even split, each
    #: reader a share; True by union, every reader all of them (to keep its own)
    union_positions: bool = False

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


class Sink(ABC, Generic[T]):
    """A two-phase-commit sink."""

    @abstractmethod
    def writer(self, context: SinkContext) -> SinkWriter[T]:
        """The writer of a subtask in an attempt of a run."""

    @abstractmethod
    def commit(self, committables: list[Any]) -> None:
        """Make the committables' records visible; idempotent."""

    @abstractmethod
    def abort_attempts(self, context: SinkContext, keep: list[Any]) -> None:
        """Drop what earlier attempts of ``context``'s run, and every other run, left
        uncommitted, except ``keep`` (called as a subtask of ``context.attempt`` starts,
        before it writes; other subtasks of that attempt may be writing already)."""
