"""A location's checkpoint history with per-operator and per-subtask costs, and the
min/avg/max summary of Flink's checkpoint tab (``weir ui``), from metadata only, in the
one statistics model of every runtime (:mod:`weir.checkpoint.stats`: Flink's names —
end-to-end duration, state size, checkpointed size, sync and async duration, alignment,
persisted in-flight data).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from weir.checkpoint.stats import CheckpointStats, CheckpointStatus
from weir.processor.catalog import list_checkpoints

__all__ = ["History", "Stat", "checkpoint_history", "operator_summary"]


@dataclass(frozen=True, slots=True)
class Stat:
    """Minimum, average and maximum of one quantity (``count`` values)."""

    min: float
    avg: float
    max: float
    count: int

    @staticmethod
    def of(values: list[float]) -> Stat | None:
        """The statistic of ``values``; ``None`` for none."""
        if not values:
            return None
        return Stat(min(values), sum(values) / len(values), max(values), len(values))


def operator_summary(stats: CheckpointStats, uid: str) -> dict[str, Stat | None]:
    """Min/avg/max over ``uid``'s subtasks of sync ms, async ms, state size and
    checkpointed size."""
    subs = [s for s in stats.subtasks if s.operator == uid]
    return {
        "sync_ms": Stat.of([s.sync_ms for s in subs]),
        "async_ms": Stat.of([s.async_ms for s in subs]),
        "state_size": Stat.of([float(s.state_size) for s in subs]),
        "checkpointed_size": Stat.of([float(s.checkpointed_size or 0) for s in subs]),
    }


@dataclass(frozen=True, slots=True)
class History:
    """The checkpoints of a location, newest last, with counts by status and the summary
    over the completed ones."""

    location: str
    entries: tuple[CheckpointStats, ...]
    counts: dict[str, int] = field(default_factory=dict)
    summary: dict[str, Stat | None] = field(default_factory=dict)

    def completed(self) -> list[CheckpointStats]:
        """The completed entries, oldest first."""
        return [e for e in self.entries if e.status is CheckpointStatus.COMPLETED]

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``weir ui --json`` and ``/api/checkpoints``)."""
        def stat(s: Stat | None) -> dict[str, float] | None:
            return None if s is None else {"min": s.min, "avg": s.avg, "max": s.max,
                                          "count": s.count}
        return {
            "location": self.location,
            "counts": self.counts,
            "summary": {k: stat(v) for k, v in self.summary.items()},
            "checkpoints": [e.as_json() for e in self.entries],
        }


def checkpoint_history(location: str, *, limit: int | None = 100,
                       storage_options: dict[str, Any] | None = None) -> History:
    """The history of ``location`` (what :func:`~weir.processor.catalog.list_checkpoints`
    reads): the newest ``limit`` checkpoints (``None``: all) by completion, each with its
    subtasks' costs; counts by status and the min/avg/max summary over the completed
    checkpoints shown."""
    entries = list_checkpoints(location, storage_options=storage_options)
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.status.value] = counts.get(entry.status.value, 0) + 1
    entries.sort(key=lambda e: (e.completed_timestamp_ms is None, e.completed_timestamp_ms or 0,
                                e.query or "", e.checkpoint_id))
    if limit is not None:
        done = [e for e in entries if e.completed_timestamp_ms is not None]
        entries = (done[-limit:]
                   + [e for e in entries if e.completed_timestamp_ms is None][-limit:])
    done_entries = [e for e in entries if e.status is CheckpointStatus.COMPLETED]
    summary = {
        "end_to_end_duration_ms": Stat.of([e.end_to_end_duration_ms for e in done_entries
                                           if e.end_to_end_duration_ms is not None]),
        "state_size": Stat.of([float(e.state_size) for e in done_entries
                               if e.state_size is not None]),
        "checkpointed_size": Stat.of([float(e.checkpointed_size) for e in done_entries
                                      if e.checkpointed_size is not None]),
        "sync_ms": Stat.of([s.sync_ms for e in done_entries for s in e.subtasks]),
        "async_ms": Stat.of([s.async_ms for e in done_entries for s in e.subtasks]),
        "channel_state_bytes": Stat.of([float(e.channel_state_bytes) for e in done_entries
                                        if e.channel_state_bytes]),
        "alignment_ms": Stat.of([s.alignment_ms for e in done_entries for s in e.subtasks
                                 if s.alignment_ms is not None]),
    }
    return History(location, tuple(entries), counts, summary)
