"""What the task of batch N of a stage reads of batch N-1: O(1) files, not O(p).

A completed batch has ``_metadata`` (every subtask's handle: O(p) bytes, what
restores at another parallelism, savepoints and ``weir checkpoint inspect`` read) and,
written by the completion's winner right after it, ``_summary.json``: the batch's
positions (watermark, batch time, the attempt chosen per subtask, counts) and its
parallelism — a few bytes per subtask. The chosen attempts' part files stay in the
batch's directory. So a task of batch N reads:

* ``_summary.json`` — enough to tell whether its worker-local subtask is exactly the
  chosen attempt (then it reads nothing more), and the global watermark;
* on a cache miss at the same parallelism, its own chosen part
  (``_parts/<subtask>-<attempt>.part``: its handle) and then only the files that
  handle names;
* ``_metadata`` only when it must: a rescale, a subtask with union operator state
  (every old subtask's list is needed), or a batch completed without a summary (by
  an older weir, or a completer that crashed between the two files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from weir.checkpoint.coordinator import CompletedCheckpoint
from weir.checkpoint.format import (
    METADATA_FILE,
    CheckpointKind,
    CheckpointMetadata,
    OperatorHandle,
    SubtaskStateHandle,
    decode_part,
)
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import CorruptCheckpointError
from weir.state.snapshot import RedistributionMode

__all__ = [
    "SUMMARY_FILE", "PriorBatch", "prior_of", "read_prior", "stage_positions", "summary_bytes",
]

SUMMARY_FILE = "_summary.json"
_SUMMARY_VERSION = 1


def stage_positions(source_positions: dict[str, Any], uid: str) -> dict[str, Any]:
    """The Spark runtime's progress recorded with a checkpoint for stage ``uid``."""
    stages = source_positions.get("spark_stages") or {}
    return dict(stages.get(uid) or source_positions.get("spark") or {})


def summary_bytes(meta: CheckpointMetadata, uid: str) -> bytes:
    """The ``_summary.json`` of a completed batch of stage ``uid``."""
    op = meta.operators[uid]
    positions = {k: v for k, v in meta.source_positions.items() if k != "spark_io"}
    return json.dumps({
        "version": _SUMMARY_VERSION, "uid": uid, "checkpoint": meta.checkpoint_id,
        "timestamp": meta.trigger_timestamp_ms, "parallelism": op.parallelism,
        "max_parallelism": op.max_parallelism, "positions": positions,
    }, separators=(",", ":")).encode()


@dataclass
class PriorBatch:
    """Batch ``batch`` (complete) as a task of the next batch needs it."""

    storage: CheckpointStorage
    uid: str
    batch: int
    parallelism: int
    max_parallelism: int
    timestamp: int
    #: the batch's ``source_positions`` (``stage_positions`` gives the stage's)
    source_positions: dict[str, Any]
    #: the whole checkpoint, once read (``full``)
    _full: CompletedCheckpoint | None = None
    #: subtask -> its chosen handle, once read (``own_handle``)
    _handles: dict[int, SubtaskStateHandle | None] = field(default_factory=dict)

    @property
    def positions(self) -> dict[str, Any]:
        """The stage's positions: ``watermark``, ``batch_time``, ``attempts``, ..."""
        return stage_positions(self.source_positions, self.uid)

    def attempt(self, subtask: int) -> str | None:
        """The attempt the completion chose for ``subtask``."""
        found = (self.positions.get("attempts") or {}).get(str(subtask))
        return None if found is None else str(found)

    def full(self) -> CompletedCheckpoint:
        """The whole completed checkpoint (reads ``_metadata``: O(p) bytes)."""
        if self._full is None:
            from weir.checkpoint.epochs import read_completed

            found = read_completed(self.storage, self.batch)
            if found is None:
                raise CorruptCheckpointError(
                    f"{self.storage.url.rstrip('/')}/chk-{self.batch}/{METADATA_FILE} is "
                    f"missing although the batch completed"
                )
            self._full = found
        return self._full

    def for_subtask(self, subtask: int, parallelism: int) -> CompletedCheckpoint:
        """What subtask ``subtask`` of ``parallelism`` restores from: at the same
        parallelism, a checkpoint holding only its own chosen handle (its part; what
        ``load`` then returns equals the whole checkpoint's answer) unless that
        handle has union operator state; otherwise the whole checkpoint."""
        if self._full is not None or parallelism != self.parallelism:
            return self.full()
        handle = self._own_handle(subtask)
        if handle is None or any(
            mode is RedistributionMode.UNION for mode, _ in handle.operator_states.values()
        ):
            return self.full()
        meta = CheckpointMetadata(
            self.batch, CheckpointKind.CHECKPOINT, self.timestamp, self.timestamp,
            {self.uid: OperatorHandle(self.uid, self.parallelism, self.max_parallelism,
                                      (handle,))},
            self.source_positions,
        )
        return CompletedCheckpoint(self.storage, f"chk-{self.batch}", meta)

    def own_handle(self, subtask: int) -> SubtaskStateHandle | None:
        """The handle this batch chose for ``subtask`` (its part; one read), or None
        if the batch kept no part for it."""
        return self._own_handle(subtask)

    def _own_handle(self, subtask: int) -> SubtaskStateHandle | None:
        if subtask not in self._handles:
            self._handles[subtask] = self._read_handle(subtask)
        return self._handles[subtask]

    def _read_handle(self, subtask: int) -> SubtaskStateHandle | None:
        attempt = self.attempt(subtask)
        if attempt is None:
            return None
        path = f"chk-{self.batch}/_parts/{subtask}-{attempt}.part"
        if not self.storage.exists(path):
            return None  # completed before parts were kept: read the whole checkpoint
        where = f"{self.storage.url.rstrip('/')}/{path}"
        uid, p, maxp, handle, _ = decode_part(self.storage.read_bytes(path, where), where)
        if (uid, p, maxp, handle.subtask_index) != (
            self.uid, self.parallelism, self.max_parallelism, subtask
        ):
            raise CorruptCheckpointError(
                f"{where}: the part of operator {uid!r} subtask {handle.subtask_index} of "
                f"{p} is not the one batch {self.batch} chose for subtask {subtask} of "
                f"{self.parallelism} of operator {self.uid!r}"
            )
        return handle


def read_prior(
    storage: CheckpointStorage, uid: str, batch: int
) -> PriorBatch | None:
    """Completed batch ``batch`` of a query (``storage`` is the query's directory) from
    its summary, or from ``_metadata`` when it has none; None if not complete."""
    if not storage.exists(f"chk-{batch}/{METADATA_FILE}"):
        return None
    path = f"chk-{batch}/{SUMMARY_FILE}"
    if storage.exists(path):
        try:
            doc = json.loads(storage.read_bytes(path, path))
            if doc.get("version") == _SUMMARY_VERSION and doc.get("uid") == uid and (
                int(doc["checkpoint"]) == batch
            ):
                return PriorBatch(storage, uid, batch, int(doc["parallelism"]),
                                  int(doc["max_parallelism"]), int(doc["timestamp"]),
                                  dict(doc["positions"]))
        except (ValueError, KeyError, TypeError, CorruptCheckpointError):
            pass  # a damaged summary: the metadata says the same, verified
    from weir.checkpoint.epochs import read_completed

    full = read_completed(storage, batch)
    return None if full is None else prior_of(full, uid)


def prior_of(full: CompletedCheckpoint, uid: str) -> PriorBatch:
    """A completed batch already read whole."""
    op = full.metadata.operators.get(uid)
    if op is None:
        raise CorruptCheckpointError(
            f"{full.url}: the checkpoint of batch {full.checkpoint_id} has no state of "
            f"operator {uid!r}"
        )
    return PriorBatch(full.storage, uid, full.checkpoint_id, op.parallelism,
                      op.max_parallelism, full.metadata.trigger_timestamp_ms,
                      dict(full.metadata.source_positions), full)
