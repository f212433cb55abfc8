"""A location's checkpoint history with per-operator and per-subtask costs, and the
min/avg/max summary of Flink's checkpoint tab (``weir ui``), from metadata only.

Flink's names, and where each number comes from (:class:`~weir.checkpoint.format.SubtaskStats`
in each subtask's handle):

* *end-to-end duration*: trigger to completion of the checkpoint (on Spark: the batch's
  start to Spark's commit, so it includes the batch's processing);
* *checkpointed data size*: bytes this checkpoint uploaded (``new_bytes``: changed SST
  files, changelog deltas, new full snapshots);
* *full checkpoint data size*: bytes of every file the checkpoint references;
* *sync* / *async duration*: per subtask, the snapshot's synchronous part (the task
  waits) and its upload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from weir.processor.catalog import list_checkpoints

__all__ = ["CheckpointEntry", "History", "Stat", "SubtaskEntry", "checkpoint_history"]


@dataclass(frozen=True, slots=True)
class SubtaskEntry:
    """What one subtask's snapshot cost in one checkpoint."""

    uid: str
    subtask: int
    bytes: int
    new_bytes: int
    sync_ms: float
    async_ms: float
    entries: int
    #: its task's barrier alignment (continuous runtime), if known
    alignment_ms: float | None = None


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


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """One row of the history: a checkpoint (or Spark batch) with its subtasks."""

    query: str | None
    uids: tuple[str, ...]
    id: int
    status: str
    kind: str | None
    triggered_ms: int | None
    completed_ms: int | None
    duration_ms: float | None
    bytes: int | None
    changed_bytes: int | None
    files: int | None
    url: str | None
    subtasks: tuple[SubtaskEntry, ...] = ()
    #: records in flight stored by an unaligned checkpoint (continuous runtime)
    channel_state_bytes: int | None = None

    def operator_summary(self, uid: str) -> dict[str, Stat | None]:
        """Min/avg/max over ``uid``'s subtasks of sync ms, async ms, bytes, changed bytes."""
        subs = [s for s in self.subtasks if s.uid == uid]
        return {
            "sync_ms": Stat.of([s.sync_ms for s in subs]),
            "async_ms": Stat.of([s.async_ms for s in subs]),
            "bytes": Stat.of([float(s.bytes) for s in subs]),
            "new_bytes": Stat.of([float(s.new_bytes) for s in subs]),
        }


@dataclass(frozen=True, slots=True)
class History:
    """The checkpoints of a location, newest last, with counts by status and the summary
    over the completed ones."""

    location: str
    entries: tuple[CheckpointEntry, ...]
    counts: dict[str, int] = field(default_factory=dict)
    summary: dict[str, Stat | None] = field(default_factory=dict)

    def completed(self) -> list[CheckpointEntry]:
        """The completed entries, oldest first."""
        return [e for e in self.entries if e.status == "completed"]

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``weir ui --json`` and ``/api/checkpoints``)."""
        def stat(s: Stat | None) -> dict[str, float] | None:
            return None if s is None else {"min": s.min, "avg": s.avg, "max": s.max,
                                          "count": s.count}
        return {
            "location": self.location,
            "counts": self.counts,
            "summary": {k: stat(v) for k, v in self.summary.items()},
            "checkpoints": [
                {**{k: getattr(e, k) for k in CheckpointEntry.__slots__ if k != "subtasks"},
                 "uids": list(e.uids),
                 "subtasks": [{k: getattr(s, k) for k in SubtaskEntry.__slots__}
                              for s in e.subtasks]}
                for e in self.entries
            ],
        }


def checkpoint_history(location: str, *, limit: int | None = 100,
                       storage_options: dict[str, Any] | None = None) -> History:
    """The history of ``location`` (what :func:`~weir.processor.catalog.list_checkpoints`
    reads): the newest ``limit`` checkpoints (``None``: all) by completion, each with its
    subtasks' costs; counts by status and the min/avg/max summary over the completed
    checkpoints shown."""
    rows = list_checkpoints(location, storage_options=storage_options)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    rows.sort(key=lambda r: (r["completed_ms"] is None, r["completed_ms"] or 0,
                             r["query"] or "", r["id"]))
    if limit is not None:
        done = [r for r in rows if r["completed_ms"] is not None]
        rows = done[-limit:] + [r for r in rows if r["completed_ms"] is None][-limit:]
    entries = []
    for row in rows:
        subs = tuple(SubtaskEntry(**sub) for sub in row["subtasks"])
        entries.append(CheckpointEntry(
            query=row["query"], uids=tuple(row["uids"]), id=row["id"], status=row["status"],
            kind=row["kind"], triggered_ms=row["triggered_ms"],
            completed_ms=row["completed_ms"], duration_ms=row["duration_ms"],
            bytes=row["bytes"], changed_bytes=row["changed_bytes"],
            files=row["files"], url=row["url"], subtasks=subs,
            channel_state_bytes=row["channel_state_bytes"]))
    done_entries = [e for e in entries if e.status == "completed"]
    summary = {
        "duration_ms": Stat.of([e.duration_ms for e in done_entries if e.duration_ms is not None]),
        "bytes": Stat.of([float(e.bytes) for e in done_entries if e.bytes is not None]),
        "changed_bytes": Stat.of([float(e.changed_bytes) for e in done_entries
                                  if e.changed_bytes is not None]),
        "sync_ms": Stat.of([s.sync_ms for e in done_entries for s in e.subtasks]),
        "async_ms": Stat.of([s.async_ms for e in done_entries for s in e.subtasks]),
        "channel_state_bytes": Stat.of([float(e.channel_state_bytes) for e in done_entries
                                        if e.channel_state_bytes]),
        "alignment_ms": Stat.of([s.alignment_ms for e in done_entries for s in e.subtasks
                                 if s.alignment_ms is not None]),
    }
    return History(location, tuple(entries), counts, summary)
