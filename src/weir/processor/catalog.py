"""What checkpoints a location holds (``weir checkpoint list``, ``weir ui``): one
:class:`~weir.checkpoint.stats.CheckpointStats` per checkpoint or batch — the one
statistics model of every runtime (Flink's names: end-to-end duration, state size,
checkpointed size, per subtask sync and async duration, alignment, entries) — from
metadata only (no data file is read).

Statuses (:class:`~weir.checkpoint.stats.CheckpointStatus`): ``completed`` (its
``_metadata`` exists), ``empty`` (a Spark batch in which the stage had no row: its state
is the previous batch's), ``incomplete`` (Spark committed the batch with parts missing),
``pending`` (no metadata yet: running, failed before completing, or never to complete).
"""

from __future__ import annotations

import re
from typing import Any

from weir.checkpoint.coordinator import CompletedCheckpoint, load_checkpoint
from weir.checkpoint.epochs import EpochStore, read_completed
from weir.checkpoint.format import METADATA_FILE
from weir.checkpoint.stats import CheckpointStats, CheckpointStatus, checkpoint_stats
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import NoCheckpointError

__all__ = ["list_checkpoints"]

_CHK = re.compile(r"chk-(\d+)$")


def _entry(query: str | None, uids: list[str], checkpoint_id: int, status: CheckpointStatus,
           found: CompletedCheckpoint | None) -> CheckpointStats:
    if found is not None:
        return checkpoint_stats(found.metadata, location=found.url, query=query)
    return CheckpointStats(checkpoint_id, None, status, None, query=query,
                           operators=tuple(uids))


def list_checkpoints(location: str, storage_options: dict[str, Any] | None = None
                     ) -> list[CheckpointStats]:
    """Every checkpoint in ``location`` (a checkpoint or savepoint directory, a
    checkpoint storage root, or a Spark checkpoint_location), as statistics (see the
    module doc); a Spark location's queries in the order they first completed."""
    storage = CheckpointStorage(location, storage_options=storage_options)
    if storage.exists(METADATA_FILE):
        found = load_checkpoint(storage, verify=False)
        return [_entry(None, [], found.checkpoint_id, CheckpointStatus.COMPLETED, found)]
    stage_dirs = EpochStore.stage_dirs(storage)
    rows = ([row for d in stage_dirs for row in _stage_rows(EpochStore.at(storage, d), d)]
            if stage_dirs else _root_rows(storage))
    if not rows:
        raise NoCheckpointError(
            f"{location} holds no checkpoint (no {METADATA_FILE}, no chk-<id> directory, "
            f"no stages/)")
    return rows


def _root_rows(storage: CheckpointStorage) -> list[CheckpointStats]:
    ids = sorted(int(m.group(1)) for n in storage.list_dir() if (m := _CHK.match(n)))
    found = [(i, read_completed(storage, i)) for i in ids]
    return [_entry(None, [], i, CheckpointStatus.COMPLETED if done is not None
                   else CheckpointStatus.PENDING, done) for i, done in found]


def _stage_rows(store: EpochStore, directory: str) -> list[CheckpointStats]:
    per_query = []
    for query in store.queries():
        found = [(batch, store.completed(query, batch)) for batch in store.batches(query)]
        known = next((sorted(f.metadata.operators) for _, f in found if f is not None),
                     [directory])
        rows = [_entry(query, known, batch, _batch_status(store, query, batch, done), done)
                for batch, done in found]
        first = min((r.completed_timestamp_ms for r in rows if r.completed_timestamp_ms),
                    default=None)
        per_query.append((first is None, first or 0, query, rows))
    return [row for *_, rows in sorted(per_query, key=lambda q: q[:3]) for row in rows]


def _batch_status(store: EpochStore, query: str, batch: int,
                  found: CompletedCheckpoint | None) -> CheckpointStatus:
    if found is not None:
        return CheckpointStatus.COMPLETED
    if store.is_empty(query, batch):
        return CheckpointStatus.EMPTY
    if store.incomplete_note(query, batch) is not None:
        return CheckpointStatus.INCOMPLETE
    return CheckpointStatus.PENDING
