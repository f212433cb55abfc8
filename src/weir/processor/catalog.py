"""What checkpoints a location holds (``weir checkpoint list``): one row per
checkpoint or batch with its status, times, duration and size, from metadata only
(no data file is read).

Each row also has ``changed_bytes`` (what the checkpoint uploaded, Flink's "checkpointed
data size"; ``bytes`` is everything it references) and ``subtasks``: per operator uid
and subtask, the snapshot's bytes, new bytes, sync and async milliseconds and entries.

Statuses: ``completed`` (its ``_metadata`` exists), ``empty`` (a Spark batch in which
the stage had no row: its state is the previous batch's), ``incomplete`` (Spark
committed the batch with parts missing), ``pending`` (no metadata yet: running,
failed before completing, or never to complete).
"""

from __future__ import annotations

import re
from typing import Any

from weir.checkpoint.coordinator import CompletedCheckpoint, load_checkpoint
from weir.checkpoint.epochs import EpochStore, read_completed
from weir.checkpoint.format import METADATA_FILE, CheckpointMetadata
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import NoCheckpointError

__all__ = ["list_checkpoints"]

_CHK = re.compile(r"chk-(\d+)$")


def _subtask_rows(meta: CheckpointMetadata) -> list[dict[str, Any]]:
    return [{"uid": uid, "subtask": s.subtask_index, "bytes": s.stats.bytes,
             "new_bytes": s.stats.new_bytes, "sync_ms": s.stats.sync_ms,
             "async_ms": s.stats.async_ms, "entries": s.stats.entries,
             "alignment_ms": s.stats.alignment_ms}
            for uid, op in sorted(meta.operators.items()) for s in op.subtasks]


def _row(query: str | None, uids: list[str], checkpoint_id: int, status: str,
         found: CompletedCheckpoint | None) -> dict[str, Any]:
    meta = found.metadata if found is not None else None
    subtasks = _subtask_rows(meta) if meta else []
    return {
        "query": query, "uids": uids, "id": checkpoint_id, "status": status,
        "kind": meta.kind.value if meta else None,
        "triggered_ms": meta.trigger_timestamp_ms if meta else None,
        "completed_ms": meta.completion_timestamp_ms if meta else None,
        "duration_ms": meta.duration_ms if meta else None,
        "bytes": meta.total_bytes if meta else None,
        "changed_bytes": sum(r["new_bytes"] for r in subtasks) if meta else None,
        "channel_state_bytes": sum(f.size for h in meta.channel_state.values()
                                   for f in h.subtasks.values()) if meta else None,
        "files": len(meta.files()) if meta else None,
        "url": found.url if found is not None else None,
        "subtasks": subtasks,
    }


def list_checkpoints(location: str, storage_options: dict[str, Any] | None = None
                     ) -> list[dict[str, Any]]:
    """Rows (see the module doc) of every checkpoint in ``location``: a checkpoint or
    savepoint directory, a checkpoint storage root, or a Spark checkpoint_location."""
    storage = CheckpointStorage(location, storage_options=storage_options)
    if storage.exists(METADATA_FILE):
        found = load_checkpoint(storage, verify=False)
        return [_row(None, sorted(found.metadata.operators), found.checkpoint_id,
                     "completed", found)]
    stage_dirs = EpochStore.stage_dirs(storage)
    rows = ([row for d in stage_dirs for row in _stage_rows(EpochStore.at(storage, d), d)]
            if stage_dirs else _root_rows(storage))
    if not rows:
        raise NoCheckpointError(
            f"{location} holds no checkpoint (no {METADATA_FILE}, no chk-<id> directory, "
            f"no stages/)")
    return rows


def _root_rows(storage: CheckpointStorage) -> list[dict[str, Any]]:
    rows = []
    ids = sorted(int(m.group(1)) for n in storage.list_dir() if (m := _CHK.match(n)))
    for checkpoint_id in ids:
        found = read_completed(storage, checkpoint_id)
        rows.append(_row(None, sorted(found.metadata.operators) if found else [], checkpoint_id,
                         "completed" if found is not None else "pending", found))
    return rows


def _stage_rows(store: EpochStore, directory: str) -> list[dict[str, Any]]:
    per_query = []
    for query in store.queries():
        rows = []
        for batch in store.batches(query):
            found = store.completed(query, batch)
            if found is not None:
                status = "completed"
            elif store.is_empty(query, batch):
                status = "empty"
            elif store.incomplete_note(query, batch) is not None:
                status = "incomplete"
            else:
                status = "pending"
            uids = sorted(found.metadata.operators) if found else []
            rows.append(_row(query, uids, batch, status, found))
        known = next((r["uids"] for r in rows if r["uids"]), [directory])
        for row in rows:
            row["uids"] = row["uids"] or known
        first = min((r["completed_ms"] for r in rows if r["completed_ms"]), default=None)
        per_query.append((first is None, first or 0, query, rows))
    return [row for *_, rows in sorted(per_query) for row in rows]
