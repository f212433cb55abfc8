"""Epochs of the Spark runtime: one weir checkpoint per Spark micro-batch.

Layout under a stage's ``checkpoint_location`` (any :class:`CheckpointStorage` URL)::

    LATEST                                     JSON {"query": <query id>}: the query
                                               whose completed checkpoints are newest
    queries/<query id>/chk-<batch>/_parts/<uid-dir>/<subtask>.part
                                               a subtask's acknowledgement of batch
                                               <batch> (format.encode_part), published
                                               atomically; a retried attempt replaces it
    queries/<query id>/chk-<batch>/<uid-dir>/<subtask>-<attempt>.*
                                               the state files of that attempt
    queries/<query id>/chk-<batch>/_metadata   the checkpoint is complete
    queries/<query id>/shared/<uid-dir>/*.sst  incremental RocksDB files
    dead-letter/<query id>/batch=<batch>/<uid-dir>-<subtask>.jsonl

Every query (Spark's ``StreamingQuery.id``, stable across restarts from the same
Spark checkpoint) has its own directory of epochs, so a new query whose batch ids
start again at 0 never mixes its versions with an older query's.

The protocol (ARCHITECTURE.md, "The Spark runtime"): the task of batch N restores the
parts of batch N-1 of its own query — Spark starts batch N only after it committed
N-1 — or, in the query's first batch, the latest *completed* checkpoint of any query
(or the savepoint given by the user). It writes its part of N before it returns.
Checkpoint N is *completed* (``_metadata`` written, retention applied) once Spark has
committed batch N and all parts exist: by the driver's query listener after the
batch, or lazily by subtask 0 of batch N+1, whichever comes first (both write the
same metadata; the rename makes either win whole).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from weir.checkpoint.coordinator import (
    CheckpointCoordinator,
    CompletedCheckpoint,
    PendingCheckpoint,
)
from weir.checkpoint.format import (
    METADATA_FILE,
    CheckpointKind,
    CheckpointMetadata,
    OperatorHandle,
    SubtaskStateHandle,
    decode_part,
    encode_part,
    uid_dir,
)
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import CorruptCheckpointError, RestoreError
from weir.runtime.operator import MIN_WATERMARK

__all__ = ["EpochPart", "EpochStore"]

log = logging.getLogger(__name__)
_CHK = re.compile(r"^chk-(\d+)$")
LATEST_FILE = "LATEST"


@dataclass(frozen=True)
class EpochPart:
    """One subtask's acknowledged state of one batch."""

    uid: str
    parallelism: int
    max_parallelism: int
    handle: SubtaskStateHandle
    #: runtime facts: ``attempt``, ``watermark``, ``max_event_time``, ``batch_time``
    epoch: dict[str, Any]


class EpochStore:
    """The epochs of one operator ``uid`` in one checkpoint location."""

    def __init__(self, storage: CheckpointStorage, uid: str, *, retained: int = 3) -> None:
        self.root = storage
        self.uid = uid
        self.retained = retained

    # paths ----------------------------------------------------------------------------
    def query_storage(self, query: str) -> CheckpointStorage:
        """The storage root of one query's checkpoints (``queries/<query>``)."""
        return self.root.child(f"queries/{query}")

    def _parts_dir(self, batch: int) -> str:
        return f"chk-{batch}/_parts/{uid_dir(self.uid)}"

    # parts ------------------------------------------------------------------------------
    def write_part(
        self, query: str, batch: int, parallelism: int, max_parallelism: int,
        handle: SubtaskStateHandle, epoch: dict[str, Any],
    ) -> None:
        """Publish subtask ``handle.subtask_index``'s part of ``batch`` (atomically)."""
        data = encode_part(self.uid, parallelism, max_parallelism, handle, epoch)
        self.query_storage(query).write(
            f"{self._parts_dir(batch)}/{handle.subtask_index}.part", data
        )

    def read_parts(self, query: str, batch: int) -> list[EpochPart] | None:
        """Every subtask's part of ``batch``, or None if the batch has no parts. Raises
        RestoreError if some subtask's part is missing (the batch did not finish)."""
        storage = self.query_storage(query)
        directory = self._parts_dir(batch)
        if not storage.exists(directory):
            return None
        parts = []
        for name in storage.list_dir(directory):
            if not name.endswith(".part"):
                continue
            path = f"{directory}/{name}"
            where = f"{storage.url.rstrip('/')}/{path}"
            uid, p, maxp, handle, epoch = decode_part(storage.read_bytes(path, where), where)
            parts.append(EpochPart(uid, p, maxp, handle, epoch))
        if not parts:
            return None
        parts.sort(key=lambda part: part.handle.subtask_index)
        parallelism = parts[0].parallelism
        indexes = sorted(p.handle.subtask_index for p in parts)
        if indexes != list(range(parallelism)):
            raise RestoreError(
                f"batch {batch} of query {query} in {storage.url}: operator {self.uid!r} has "
                f"parts of subtasks {indexes} of {parallelism}; a committed batch has all. "
                f"The checkpoint location was changed by hand or shared by two queries"
            )
        return parts

    @staticmethod
    def as_checkpoint(
        storage: CheckpointStorage, batch: int, parts: list[EpochPart], timestamp_ms: int,
    ) -> CompletedCheckpoint:
        """The parts of one batch seen as a checkpoint (to load state from)."""
        first = parts[0]
        op = OperatorHandle(
            first.uid, first.parallelism, first.max_parallelism,
            tuple(sorted((p.handle for p in parts), key=lambda h: h.subtask_index)),
        )
        meta = CheckpointMetadata(
            batch, CheckpointKind.CHECKPOINT, timestamp_ms, timestamp_ms, {first.uid: op},
            epoch_positions(batch, parts),
        )
        return CompletedCheckpoint(storage, f"chk-{batch}", meta)

    # completion ---------------------------------------------------------------------------
    def complete(
        self, query: str, batch: int, parts: list[EpochPart] | None = None
    ) -> CompletedCheckpoint | None:
        """Mark ``batch`` of ``query`` complete (Spark committed it): write its
        ``_metadata`` from the parts, point LATEST at the query, drop checkpoints
        beyond the retained count and the parts of older batches. Idempotent; None if
        the batch has no parts (the operator did not run in it). ``parts``: the
        batch's parts if the caller has read them already."""
        storage = self.query_storage(query)
        if storage.exists(f"chk-{batch}/{METADATA_FILE}"):
            self._set_latest(query)
            return None
        if parts is None:
            parts = self.read_parts(query, batch)
        if parts is None:
            return None
        coordinator = CheckpointCoordinator(storage, retained=self.retained, clean_up=False)
        if any(c.checkpoint_id > batch for c in coordinator.completed_checkpoints):
            return None  # a newer batch already completed: this one is subsumed
        ts = int(parts[0].epoch.get("batch_time") or 0)
        pending = PendingCheckpoint(batch, ts, CheckpointKind.CHECKPOINT, storage, f"chk-{batch}")
        if ts:  # duration = batch start (its timestamp) to completion
            pending.started = time.perf_counter() - max(0.0, time.time() - ts / 1000)
        for part in parts:
            pending.acknowledge(part.uid, part.parallelism, part.max_parallelism, part.handle)
        completed = coordinator.complete(pending, epoch_positions(batch, parts))
        self._set_latest(query)
        self._prune(storage, coordinator)
        self._sweep(storage, coordinator, batch)
        return completed

    def _sweep(
        self, storage: CheckpointStorage, coordinator: CheckpointCoordinator, batch: int
    ) -> None:
        """Delete the files of failed or replaced attempts: in the completed batch's
        directory, and shared files uploaded by a batch up to ``batch`` that no
        retained checkpoint references. Files of later (running) batches carry a
        larger id in their name and are left alone."""
        keep = coordinator.referenced_files()
        for path in storage.walk_files(f"chk-{batch}"):
            if path not in keep and "/_parts/" not in path:
                storage.delete(path)
        directory = f"shared/{uid_dir(self.uid)}"
        if not storage.exists(directory):
            return
        for name in storage.list_dir(directory):
            head = name.split("-", 1)[0]
            path = f"{directory}/{name}"
            if head.isdigit() and int(head) <= batch and path not in keep:
                storage.delete(path)

    def _prune(self, storage: CheckpointStorage, coordinator: CheckpointCoordinator) -> None:
        """Delete directories of batches older than the oldest retained checkpoint that
        never completed (their state is in a newer completed checkpoint)."""
        retained = coordinator.completed_checkpoints
        if not retained:
            return
        oldest = retained[0].checkpoint_id
        for name in storage.list_dir():
            match = _CHK.match(name)
            if match and int(match.group(1)) < oldest:
                storage.delete(name, recursive=True)

    def _set_latest(self, query: str) -> None:
        current = self._latest_query()
        if current != query:
            self.root.write(LATEST_FILE, json.dumps({"query": query}).encode())

    def _latest_query(self) -> str | None:
        if not self.root.exists(LATEST_FILE):
            return None
        try:
            doc = json.loads(self.root.read_bytes(LATEST_FILE, LATEST_FILE))
            return str(doc["query"])
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable %s in %s; scanning queries", LATEST_FILE, self.root.url)
            return None

    def latest_completed(self, *, verify: bool = True) -> CompletedCheckpoint | None:
        """The newest intact completed checkpoint of any query (for a new query)."""
        queries: list[str] = []
        latest = self._latest_query()
        if latest is not None:
            queries.append(latest)
        if self.root.exists("queries"):
            queries += [q for q in self.root.list_dir("queries") if q != latest]
        best: CompletedCheckpoint | None = None
        for query in queries:
            storage = self.query_storage(query)
            try:
                found = CheckpointCoordinator(storage, clean_up=False).latest(verify=verify)
            except CorruptCheckpointError as exc:  # pragma: no cover - latest() skips these
                log.warning("query %s: %s", query, exc)
                continue
            if found is None:
                continue
            if query == latest:
                return found
            if best is None or (
                found.metadata.completion_timestamp_ms > best.metadata.completion_timestamp_ms
            ):
                best = found
        return best


def epoch_positions(batch: int, parts: list[EpochPart]) -> dict[str, Any]:
    """What a completed checkpoint records of the Spark runtime's progress."""
    events = [p.epoch.get("max_event_time") for p in parts]
    known = [e for e in events if e is not None]
    return {
        "spark": {
            "batch": batch,
            "watermark": max(int(p.epoch.get("watermark", MIN_WATERMARK)) for p in parts),
            "max_event_time": max(known) if known else None,
        }
    }

