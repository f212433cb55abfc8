"""Which checkpoint a path means: a checkpoint or savepoint directory, the storage root
of a :class:`~weir.CheckpointCoordinator`, or a Spark stage's ``checkpoint_location``.

* a directory with ``_metadata`` (or the ``_metadata`` file): that checkpoint or
  savepoint;
* a coordinator's root (``chk-<id>`` directories): its current state, or checkpoint
  ``checkpoint_id``. The current state of a continuous job's checkpoint storage (its
  claims: ``weir.checkpoint.protocol``) is what the job's next run restores: the
  savepoint the last run stopped with, else that run's newest completed checkpoint,
  else the savepoint it was given (``restore_from``), else the newest completed
  checkpoint of any run — none after a cancel that deleted the checkpoints. Elsewhere
  (the harness's coordinator, storages of earlier releases), its newest completed
  checkpoint;
* a Spark ``checkpoint_location`` (``stages/<uid-dir>``, ``weir.checkpoint.epochs``):
  per stage (or only ``uid``'s), its current state — the newest completed batch of the
  query that owns it, or the checkpoint or savepoint it was started from — or batch
  ``checkpoint_id`` of ``query`` (the query may be left out when one query has that
  batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from weir.checkpoint.coordinator import CheckpointCoordinator, CompletedCheckpoint, load_checkpoint
from weir.checkpoint.epochs import EpochStore, lineage_state
from weir.checkpoint.format import METADATA_FILE
from weir.checkpoint.ownership import Lineage
from weir.checkpoint.protocol import storage_state
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import ConfigurationError, NoCheckpointError

__all__ = ["Located", "locate"]


@dataclass(frozen=True)
class Located:
    """The checkpoint holding each operator uid's state, and what was found."""

    checkpoints: dict[str, CompletedCheckpoint]
    description: str


def locate(
    path: str, *, uid: str | None = None, checkpoint_id: int | None = None,
    query: str | None = None, storage_options: dict[str, Any] | None = None,
) -> Located:
    """The checkpoints ``path`` means (see the module doc); a NoCheckpointError says
    what was there instead."""
    storage = CheckpointStorage(path, storage_options=storage_options)
    if storage.url.rstrip("/").endswith("/" + METADATA_FILE) or storage.exists(METADATA_FILE):
        if checkpoint_id is not None or query is not None:
            raise ConfigurationError(
                f"{path} is one checkpoint or savepoint: checkpoint_id= and query= choose "
                f"among the checkpoints of a checkpoint location or coordinator root")
        found = load_checkpoint(storage, verify=False)
        return _only(uid, {u: found for u in found.metadata.operators}, path,
                     f"{found.kind.value} {found.checkpoint_id} at {found.url}")
    stage_dirs = EpochStore.stage_dirs(storage)
    if stage_dirs:
        return _spark_location(storage, stage_dirs, uid, checkpoint_id, query, path)
    if query is not None:
        raise ConfigurationError(f"{path} is not a Spark checkpoint_location: query= does "
                                 f"not apply")
    coordinator = CheckpointCoordinator(storage, clean_up=False)
    done = coordinator.completed_checkpoints
    if checkpoint_id is not None:
        chosen = next((c for c in done if c.checkpoint_id == checkpoint_id), None)
        if chosen is None:
            raise NoCheckpointError(
                f"{path} has no completed checkpoint {checkpoint_id} (completed: "
                f"{[c.checkpoint_id for c in done]})")
        note = f"checkpoint {chosen.checkpoint_id} at {chosen.url}"
    else:
        chosen, note = _storage_state(storage, done, storage_options)
    if chosen is None:
        raise NoCheckpointError(
            f"{path} holds no completed checkpoint (no {METADATA_FILE}, no completed "
            f"chk-<id> directory, no stages/): give a checkpoint or savepoint directory, a "
            f"checkpoint storage root or a Spark stage's checkpoint_location" if not note
            else f"{path} holds no state: {note}")
    return _only(uid, {u: chosen for u in chosen.metadata.operators}, path, note)


def _storage_state(storage: CheckpointStorage, done: list[CompletedCheckpoint],
                   storage_options: dict[str, Any] | None
                   ) -> tuple[CompletedCheckpoint | None, str]:
    """The current state of the coordinator root ``storage`` whose completed checkpoints
    are ``done`` (see the module doc: the restore decision of the checkpoint protocol,
    :func:`weir.checkpoint.protocol.storage_state`, without verifying the files — the
    reader reads each through its checksum), and what it is ("" for none)."""

    def newest(token: int | None) -> CompletedCheckpoint | None:
        chain = [c for c in done if token is None or c.metadata.owner.get("token") == token]
        return chain[-1] if chain else None

    def load(url: str) -> CompletedCheckpoint:
        return load_checkpoint(url, storage_options=storage_options, verify=False)

    lineage = Lineage(storage)
    head = lineage.head()
    found = storage_state(lineage, head, newest, load)
    if found.checkpoint is None:
        return None, "" if head is None else found.note
    chosen = found.checkpoint
    return chosen, f"{chosen.kind.value} {chosen.checkpoint_id} at {chosen.url}" + (
        "" if head is None else f": {found.note}")


def _only(uid: str | None, found: dict[str, CompletedCheckpoint], path: str,
          description: str) -> Located:
    if uid is None:
        return Located(found, description)
    if uid not in found:
        raise NoCheckpointError(
            f"{path} has no state of operator {uid!r} (operators: {sorted(found)})")
    return Located({uid: found[uid]}, description)


def _spark_location(
    storage: CheckpointStorage, stage_dirs: list[str], uid: str | None,
    checkpoint_id: int | None, query: str | None, path: str,
) -> Located:
    stores = ([EpochStore(storage, uid)] if uid is not None
              else [EpochStore.at(storage, d) for d in stage_dirs])
    found: dict[str, CompletedCheckpoint] = {}
    notes = []
    for store in stores:
        if checkpoint_id is None:
            if query is not None:
                ids = store.completed_ids(query) if query in store.queries() else []
                chosen = store.completed(query, ids[-1]) if ids else None
                note = f"batch {ids[-1]} of query {query}" if ids else ""
            else:
                chosen, note = lineage_state(store, Lineage(store.stage))
        else:
            queries = [query] if query is not None else [
                q for q in store.queries() if checkpoint_id in store.completed_ids(q)]
            if len(queries) > 1:
                raise ConfigurationError(
                    f"{path}: batch {checkpoint_id} completed in several queries "
                    f"{queries}: choose one with query=")
            chosen = store.completed(queries[0], checkpoint_id) if queries else None
            note = f"batch {checkpoint_id} of query {queries[0]}" if queries else ""
        if chosen is None:
            continue
        for op_uid in chosen.metadata.operators:
            if uid is None or op_uid == uid:
                found[op_uid] = chosen
                notes.append(f"{op_uid!r}: {note}")
    if not found:
        which = f"operator {uid!r}" if uid is not None else "any stage"
        what = (f"no completed batch {checkpoint_id}" if checkpoint_id is not None
                else "no completed checkpoint")
        raise NoCheckpointError(
            f"{path} has {what} of {which}" + (f" in query {query}" if query else "")
            + "; run the query until a batch completes")
    return Located(found, f"checkpoint location {path} (" + "; ".join(notes) + ")")
