"""Epochs of the Spark runtime: one weir checkpoint per Spark micro-batch, per stage.

Layout under a ``checkpoint_location`` (any :class:`CheckpointStorage` URL)::

    stages/<uid-dir>/                         one directory per operator uid: stages
                                              sharing a location never touch each
                                              other's files
      claims/...                              who owns the stage (weir.checkpoint.ownership)
      pins/<uuid>.json                        a checkpoint a running savepoint copies:
                                              retention keeps it
      queries/<query id>/chk-<batch>/_parts/<subtask>-<attempt>.part
                                              a task attempt's acknowledgement of the
                                              batch (format.encode_part); every attempt
                                              has its own name, so a late (zombie or
                                              speculative) attempt never replaces one
      queries/<query id>/chk-<batch>/<uid-dir>/<subtask>-<attempt>.*
                                              the state files of that attempt
      queries/<query id>/chk-<batch>/_metadata
                                              the batch's checkpoint is complete; it
                                              names exactly one attempt per subtask
                                              (whose part stays; the others' go)
      queries/<query id>/chk-<batch>/_summary.json
                                              written by the completion's winner after
                                              _metadata: what the next batch's tasks
                                              read instead of it (weir.checkpoint.epoch_prior)
      queries/<query id>/chk-<batch>/_empty
                                              the stage had no row in the batch (no
                                              subtask ran): its state is the previous
                                              batch's
      queries/<query id>/chk-<batch>/_incomplete
                                              Spark committed the batch with parts
                                              missing (written by the driver's listener)
      queries/<query id>/_spark.json          {"checkpoint": Spark's checkpoint location of
                                              the query} (its offset log, for savepoints)
      queries/<query id>/_drain.json          {"from_batch": B}: batches >= B run at the
                                              final watermark (stop_with_savepoint drain)
      queries/<query id>/shared/<uid-dir>/<batch>-<uuid>.sst
                                              incremental RocksDB files
    dead-letter/<query id>/batch=<batch>/<uid-dir>-<subtask>.jsonl

**Completion** of batch N (once Spark committed it: by the driver's listener, by
:func:`weir.spark.finish`, or by any task of batch N+1 that finds N incomplete) picks
one complete set of parts — a parallelism for which every subtask published, preferring
the stage's current one, and per subtask the earliest published attempt (attempts of
one batch hold the same state: the batch's input and order are fixed) — and publishes
``_metadata`` with :meth:`CheckpointStorage.create_exclusive`. So completion is
idempotent and has exactly one winner however many race; only the winner then applies
retention, deletes older never-completed batches and sweeps the files of attempts it
did not choose. Once ``_metadata`` exists, every later reader restores from it and
never from parts. Parts of other parallelisms (a crash in the middle of a batch, then
a restart at another parallelism) never block a batch; a batch without a complete set
is an :class:`IncompleteBatchError` that names the likely cause.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from weir.api.watermarks import MIN_WATERMARK
from weir.checkpoint.coordinator import CheckpointCoordinator, CompletedCheckpoint, load_checkpoint
from weir.checkpoint.epoch_prior import SUMMARY_FILE, PriorBatch, read_prior, summary_bytes
from weir.checkpoint.epoch_retention import (
    DEAD_LETTER_SWEEP_BATCHES,
    drop_superseded_queries,
    sweep_dead_letters,
)
from weir.checkpoint.format import (
    METADATA_FILE,
    CheckpointKind,
    CheckpointMetadata,
    OperatorHandle,
    SubtaskStateHandle,
    decode_metadata,
    decode_part,
    encode_metadata,
    encode_part,
    uid_dir,
)
from weir.checkpoint.ownership import QUERY, Claim, Lineage, wall_ms
from weir.checkpoint.storage import TMP_MARKER, CheckpointStorage
from weir.errors import CorruptCheckpointError, IncompleteBatchError

__all__ = [
    "EMPTY_FILE",
    "INCOMPLETE_FILE",
    "MATERIALIZATION_MAX_LAG",
    "EpochPart",
    "EpochStore",
    "epoch_positions",
    "lineage_state",
]

log = logging.getLogger(__name__)
_CHK = re.compile(r"^chk-(\d+)$")
_PART = re.compile(r"^(\d+)-([0-9a-f]+)\.part$")
INCOMPLETE_FILE = "_incomplete"
SPARK_FILE = "_spark.json"
DRAIN_FILE = "_drain.json"
PIN_EXPIRY_MS = 6 * 3_600_000
#: a hash-map changelog materialization (``shared/<uid-dir>/m<batch>-*``) is used only
#: by a batch at most this many batches after the one it copies; unreferenced ones
#: older than that are swept (a running one is never swept under its writer)
MATERIALIZATION_MAX_LAG = 100
EMPTY_FILE = "_empty"
DEAD_LETTER_RETENTION_MS = 7 * 24 * 3_600_000


@dataclass(frozen=True)
class EpochPart:
    """One task attempt's acknowledged state of one batch."""

    uid: str
    parallelism: int
    max_parallelism: int
    handle: SubtaskStateHandle
    #: runtime facts: ``attempt``, ``written_ms``, ``watermark``, ``max_event_time``,
    #: ``batch_time``, ``token`` (the claim it was written under)
    epoch: dict[str, Any]

    @property
    def order(self) -> tuple[int, str]:
        """Publication order (earliest first), ties broken by attempt id."""
        return int(self.epoch.get("written_ms") or 0), str(self.epoch.get("attempt"))


def stage_storage(location: CheckpointStorage, uid: str) -> CheckpointStorage:
    """The directory of one operator uid in a checkpoint location."""
    return location.child(f"stages/{uid_dir(uid)}")


class EpochStore:
    """The epochs of one operator ``uid`` in one checkpoint location."""

    def __init__(
        self, location: CheckpointStorage, uid: str, *, retained: int = 3,
        dead_letter_retention_ms: int = DEAD_LETTER_RETENTION_MS,
    ) -> None:
        self.location = location
        self.uid = uid
        self.retained = retained
        self.dead_letter_retention_ms = dead_letter_retention_ms
        self.stage = stage_storage(location, uid)

    @classmethod
    def at(cls, location: CheckpointStorage, directory: str) -> EpochStore:
        """The store of the stage in ``stages/<directory>`` (its uid read from its
        checkpoints when needed)."""
        store = cls(location, "")
        store.stage = location.child(f"stages/{directory}")
        return store

    @staticmethod
    def stage_dirs(location: CheckpointStorage) -> list[str]:
        """The stage directories of a checkpoint location."""
        return location.list_dir("stages")

    def query_storage(self, query: str) -> CheckpointStorage:
        """The storage root of one query's checkpoints of this stage."""
        return self.stage.child(f"queries/{query}")

    def queries(self) -> list[str]:
        """Queries that wrote checkpoints of this stage."""
        return self.stage.list_dir("queries")

    def describe(self, query: str, batch: int | None = None) -> str:
        """``<url>`` of a query's directory (or of one batch in it), for messages."""
        url = self.query_storage(query).url.rstrip("/")
        return url if batch is None else f"{url}/chk-{batch}"

    # parts ------------------------------------------------------------------------------
    def write_part(
        self, query: str, batch: int, parallelism: int, max_parallelism: int,
        handle: SubtaskStateHandle, epoch: dict[str, Any],
    ) -> None:
        """Publish one attempt's part of ``batch`` under its own name."""
        epoch = {**epoch, "written_ms": wall_ms()}
        data = encode_part(self.uid, parallelism, max_parallelism, handle, epoch)
        name = f"{handle.subtask_index}-{epoch['attempt']}.part"
        self.query_storage(query).write(f"chk-{batch}/_parts/{name}", data)

    def read_parts(self, query: str, batch: int) -> list[EpochPart]:
        """Every attempt's part of ``batch`` (any parallelism, several per subtask);
        parts deleted while reading (completion swept them) are skipped."""
        storage = self.query_storage(query)
        directory = f"chk-{batch}/_parts"
        out = []
        for name in storage.list_dir(directory):
            if not _PART.match(name):
                continue
            path = f"{directory}/{name}"
            where = f"{storage.url.rstrip('/')}/{path}"
            try:
                data = storage.read_bytes(path, where)
            except CorruptCheckpointError:
                if not storage.exists(path):
                    continue  # swept by a completion that won meanwhile
                raise
            uid, p, maxp, handle, epoch = decode_part(data, where)
            if uid != self.uid:
                raise CorruptCheckpointError(f"{where}: a part of operator {uid!r} in the "
                                             f"directory of operator {self.uid!r}")
            out.append(EpochPart(uid, p, maxp, handle, epoch))
        return out

    # completed checkpoints ------------------------------------------------------------------
    def completed(self, query: str, batch: int) -> CompletedCheckpoint | None:
        """Batch ``batch`` of ``query`` if it is complete (metadata read, files not
        verified)."""
        return read_completed(self.query_storage(query), batch)

    def prior(self, query: str, batch: int) -> PriorBatch | None:
        """Completed batch ``batch`` of ``query`` as the next batch's tasks read it
        (its summary: O(1) files, see :mod:`weir.checkpoint.epoch_prior`); None if it is
        not complete."""
        return read_prior(self.query_storage(query), self.uid, batch)

    def completed_ids(self, query: str) -> list[int]:
        """Ids of the batches of ``query`` that have ``_metadata``, ascending."""
        storage = self.query_storage(query)
        ids = []
        for name in storage.list_dir():
            match = _CHK.match(name)
            if match and storage.exists(f"{name}/{METADATA_FILE}"):
                ids.append(int(match.group(1)))
        return sorted(ids)

    def completed_checkpoints(self, query: str, newest_first: bool = False
                              ) -> Iterator[tuple[int, CompletedCheckpoint]]:
        """``(batch, its completed checkpoint)`` of every completed batch of ``query``
        in this stage (none if the query never wrote one), oldest first or newest."""
        ids = self.completed_ids(query) if query in self.queries() else []
        for batch in reversed(ids) if newest_first else ids:
            done = self.completed(query, batch)
            if done is not None:
                yield batch, done

    def batches(self, query: str) -> list[int]:
        """Ids of every batch directory of ``query`` (complete or not), ascending."""
        return sorted(int(m.group(1)) for n in self.query_storage(query).list_dir()
                      if (m := _CHK.match(n)))

    def incomplete_note(self, query: str, batch: int) -> str | None:
        """What the driver's listener recorded about a committed, incomplete batch."""
        storage = self.query_storage(query)
        path = f"chk-{batch}/{INCOMPLETE_FILE}"
        if not storage.exists(path):
            return None
        try:
            return str(json.loads(storage.read_bytes(path, path))["reason"])
        except (ValueError, KeyError, TypeError, CorruptCheckpointError):
            return "recorded by the driver's listener"

    # completion ---------------------------------------------------------------------------
    def complete(
        self, query: str, batch: int, prefer_parallelism: int | None = None,
    ) -> CompletedCheckpoint:
        """Complete ``batch`` of ``query`` (Spark committed it) and return it; if it is
        complete already, the existing checkpoint. Raises IncompleteBatchError if no
        parallelism has a part from every subtask."""
        done = self.completed(query, batch)
        if done is not None:
            return done
        parts = self.read_parts(query, batch)
        chosen = choose_parts(parts, prefer_parallelism)
        if chosen is None:
            done = self.completed(query, batch)  # completed (and swept) while we read
            if done is not None:
                return done
            raise IncompleteBatchError(self.incomplete_message(query, batch, parts))
        storage = self.query_storage(query)
        ts = int(chosen[0].epoch.get("batch_time") or 0)
        first = chosen[0]
        meta = CheckpointMetadata(
            batch, CheckpointKind.CHECKPOINT, ts, wall_ms(),
            {self.uid: OperatorHandle(self.uid, first.parallelism, first.max_parallelism,
                                      tuple(p.handle for p in chosen))},
            epoch_positions(batch, chosen),
            duration_ms=max(0.0, time.time() * 1000 - ts) if ts else 0.0,
        )
        if not storage.create_exclusive(f"chk-{batch}/{METADATA_FILE}", encode_metadata(meta)):
            done = self.completed(query, batch)
            assert done is not None
            return done
        completed = CompletedCheckpoint(storage, f"chk-{batch}", meta)
        storage.write(f"chk-{batch}/{SUMMARY_FILE}", summary_bytes(meta, self.uid))
        new = sum(p.handle.stats.new_bytes for p in chosen)
        log.info("weir: operator %r: batch %d of query %s complete at %s: %d subtasks, "
                 "%d bytes of state (%d new), %.0f ms after the batch started", self.uid,
                 batch, query, completed.url, len(chosen), meta.total_bytes, new,
                 meta.duration_ms)
        kept = {f"chk-{batch}/_parts/{p.handle.subtask_index}-{p.epoch['attempt']}.part"
                for p in chosen}
        self._clean_up(storage, batch, kept, query)
        return completed

    def incomplete_message(self, query: str, batch: int, parts: list[EpochPart]) -> str:
        """Why ``batch`` cannot complete, and what to do."""
        where = f"batch {batch} of query {query} ({self.describe(query, batch)})"
        fix = ("The stage's output was only partly computed: show(), take(), first(), "
               "head() or limit() on it (e.g. inside foreachBatch) runs only some of its "
               "partitions, and a foreachBatch function that skips a batch runs none. "
               "Consume the whole output in every batch: write it to a sink, or persist() "
               "it and run a full action (e.g. count()) before show()/take()")
        out = (f"operator {self.uid!r}: Spark committed {where}, but ")
        by_p: dict[int, set[int]] = defaultdict(set)
        for part in parts:
            by_p[part.parallelism].add(part.handle.subtask_index)
        if by_p:
            p = max(by_p, key=lambda q: len(by_p[q]) / q)
            missing = sorted(set(range(p)) - by_p[p])
            out += (f"subtasks {missing} of {p} never processed their records of it. {fix}. ")
        else:
            out += (f"no subtask of this stage ran it. {fix}; or the batch's directory was "
                    f"deleted. ")
        return out + (
            "The records those subtasks missed are not in the stage's state; to go on "
            f"from the newest complete checkpoint, run weir.spark.recover("
            f"{self.location.url!r}, {self.uid!r}, source='latest') (or `weir spark "
            f"recover {self.location.url} --uid {self.uid} --from latest`) and restart the "
            f"query; it then says what that drops"
        )

    # savepoints: pins and Spark's checkpoint -------------------------------------------
    def pin(self, completed: CompletedCheckpoint) -> str:
        """Keep ``completed`` (a checkpoint of this stage) from retention until
        :meth:`unpin`; a savepoint pins what it copies. Returns the pin's path."""
        path = f"pins/{uuid.uuid4().hex}.json"
        doc = {"storage": completed.storage.root, "checkpoint": completed.checkpoint_id,
               "ms": wall_ms()}
        self.stage.write(path, json.dumps(doc).encode())
        return path

    def unpin(self, path: str) -> None:
        """Remove a pin."""
        self.stage.delete(path)

    def pinned(self, storage: CheckpointStorage) -> set[int]:
        """Ids of the checkpoints in ``storage`` (a query's directory) that a running
        savepoint pins (pins older than ``PIN_EXPIRY_MS`` are left over by a crash)."""
        out = set()
        now = wall_ms()
        for name in self.stage.list_dir("pins"):
            try:
                doc = json.loads(self.stage.read_bytes(f"pins/{name}", name))
                if doc["storage"] == storage.root and now - int(doc["ms"]) < PIN_EXPIRY_MS:
                    out.add(int(doc["checkpoint"]))
            except (ValueError, KeyError, TypeError, CorruptCheckpointError):
                continue  # removed while we read it, or not a pin
        return out

    def record_spark_checkpoint(self, query: str, root: str) -> None:
        """Remember where query ``query`` keeps Spark's checkpoint (its offset log)."""
        # compare-and-set (the first record stands), never exists-then-write
        self.query_storage(query).create_exclusive(
            SPARK_FILE, json.dumps({"checkpoint": root}).encode())

    def spark_checkpoint(self, query: str) -> str | None:
        """Spark's checkpoint location of ``query``, if the driver recorded it."""
        storage = self.query_storage(query)
        if not storage.exists(SPARK_FILE):
            return None
        try:
            return str(json.loads(storage.read_bytes(SPARK_FILE, SPARK_FILE))["checkpoint"])
        except (ValueError, KeyError, TypeError, CorruptCheckpointError):
            return None

    def request_drain(self, query: str, from_batch: int) -> None:
        """Ask every batch of ``query`` from ``from_batch`` on to run at the final
        watermark (+inf), so every event-time timer fires (Flink's drain). Written
        before ``from_batch`` starts, so every attempt of a batch agrees."""
        self.query_storage(query).write(
            DRAIN_FILE, json.dumps({"from_batch": from_batch}).encode()
        )

    def drain_from(self, query: str) -> int | None:
        """The first batch of ``query`` that drains, if a drain was requested."""
        storage = self.query_storage(query)
        if not storage.exists(DRAIN_FILE):
            return None
        return int(json.loads(storage.read_bytes(DRAIN_FILE, DRAIN_FILE))["from_batch"])

    def mark_empty(self, query: str, batch: int) -> None:
        """Record that the stage had no row at all in ``batch`` (idempotent)."""
        self.query_storage(query).create_exclusive(f"chk-{batch}/{EMPTY_FILE}", b"{}")

    def is_empty(self, query: str, batch: int) -> bool:
        """Whether ``batch`` had no row for the stage (its state is the previous one)."""
        return self.query_storage(query).exists(f"chk-{batch}/{EMPTY_FILE}")

    def mark_incomplete(self, query: str, batch: int, reason: str) -> None:
        """Record (for the next batch's tasks and for people) why a committed batch
        cannot complete."""
        self.query_storage(query).write(
            f"chk-{batch}/{INCOMPLETE_FILE}", json.dumps({"reason": reason}).encode()
        )

    def _clean_up(
        self, storage: CheckpointStorage, batch: int, kept: set[str], query: str
    ) -> None:
        """After completing ``batch``: retention, older never-completed batches, and the
        files of attempts not chosen (in the batch's directory, and shared files
        uploaded by a batch up to ``batch`` that no retained checkpoint references;
        the chosen parts in ``kept`` stay: the next batch's tasks read their own).
        Files of later (running) batches carry a larger id and are left alone."""
        coordinator = CheckpointCoordinator(storage, retained=self.retained, clean_up=False)
        coordinator.enforce_retention(self.pinned(storage))
        retained = coordinator.completed_checkpoints
        if len(retained) >= self.retained:  # (weir.checkpoint.epoch_retention)
            drop_superseded_queries(self, query, batch)
        if batch % DEAD_LETTER_SWEEP_BATCHES == 0:
            sweep_dead_letters(self, self.dead_letter_retention_ms)
        oldest = retained[0].checkpoint_id if retained else batch
        for name in storage.list_dir():
            match = _CHK.match(name)
            if match and int(match.group(1)) < oldest:
                storage.delete(name, recursive=True)
        keep = coordinator.referenced_files() | kept
        for path in storage.walk_files(f"chk-{batch}"):
            marker = path.endswith((f"/{INCOMPLETE_FILE}", f"/{EMPTY_FILE}", f"/{SUMMARY_FILE}"))
            if (path not in keep and not marker) or TMP_MARKER in path:
                storage.delete(path)
        directory = f"shared/{uid_dir(self.uid)}"
        for name in storage.list_dir(directory):
            head = name.split("-", 1)[0]
            path = f"{directory}/{name}"
            if path in keep:
                continue
            if head.isdigit() and int(head) <= batch:
                storage.delete(path)
            elif head[:1] == "m" and head[1:].isdigit() and (
                int(head[1:]) < batch - MATERIALIZATION_MAX_LAG
            ):
                storage.delete(path)  # no later batch can use it any more


def choose_parts(
    parts: list[EpochPart], prefer_parallelism: int | None = None
) -> list[EpochPart] | None:
    """One part per subtask of one parallelism that every subtask published (the
    preferred one if complete, else the most recently published complete one), the
    earliest attempt per subtask; None if no parallelism is complete."""
    groups: dict[int, dict[int, list[EpochPart]]] = defaultdict(lambda: defaultdict(list))
    for part in parts:
        groups[part.parallelism][part.handle.subtask_index].append(part)
    whole = [p for p, subs in groups.items() if sorted(subs) == list(range(p))]
    if not whole:
        return None
    if prefer_parallelism in whole:
        p = prefer_parallelism
    else:
        p = max(whole, key=lambda q: max(part.order for s in groups[q].values() for part in s))
    return [min(groups[p][i], key=lambda part: part.order) for i in range(p)]


def epoch_positions(batch: int, parts: list[EpochPart]) -> dict[str, Any]:
    """What a completed checkpoint records of the Spark runtime's progress."""
    events = [p.epoch.get("max_event_time") for p in parts]
    known = [e for e in events if e is not None]
    return {
        "spark": {
            "batch": batch,
            "watermark": max(int(p.epoch.get("watermark", MIN_WATERMARK)) for p in parts),
            "max_event_time": max(known) if known else None,
            "batch_time": max(int(p.epoch.get("batch_time") or 0) for p in parts),
            "attempts": {str(p.handle.subtask_index): p.epoch.get("attempt") for p in parts},
            **{name: sum(int(p.epoch.get(name) or 0) for p in parts)
               for name in ("dead_letters", "late_records", "null_event_time", "malformed")},
        },
        **_io(parts),
    }


def _io(parts: list[EpochPart]) -> dict[str, Any]:
    """``{"spark_io": ...}``: the storage operations of the chosen attempts
    (``storage_counts`` per task), their buffers (``rows_in``, ``arrow_in_bytes``,
    ``arrow_out_bytes``, ``spilled_bytes``: see ``spill``) and times (``restored``: 1 if
    the task restored its state from storage, 0 if its worker had it live;
    ``restore_ms``, ``process_ms``, ``snapshot_ms``) per subtask, the largest and the
    sum (in ``_metadata`` only: the summary leaves them out)."""
    ios = {str(p.handle.subtask_index): p.epoch["io"] for p in parts
           if isinstance(p.epoch.get("io"), dict)}
    if not ios:
        return {}
    names = sorted({name for io in ios.values() for name in io})
    return {"spark_io": {
        "max": {n: max(int(io.get(n) or 0) for io in ios.values()) for n in names},
        "total": {n: sum(int(io.get(n) or 0) for io in ios.values()) for n in names},
        "subtasks": ios,
    }}


def read_completed(storage: CheckpointStorage, batch: int) -> CompletedCheckpoint | None:
    """Batch ``batch`` in a query's directory if it is complete (its ``_metadata`` read,
    files not verified)."""
    path = f"chk-{batch}/{METADATA_FILE}"
    if not storage.exists(path):
        return None
    where = f"{storage.url.rstrip('/')}/{path}"
    meta = decode_metadata(storage.read_bytes(path, where), where)
    return CompletedCheckpoint(storage, f"chk-{batch}", meta)


def lineage_state(
    store: EpochStore, lineage: Lineage, head: Claim | None = None,
) -> tuple[CompletedCheckpoint | None, str]:
    """The stage's current state: the head claim's newest completed checkpoint, or
    the state the claim started from; with a description for messages."""
    head = head if head is not None else lineage.head()
    if head is None:
        return None, "empty state (the stage was never run here)"
    if head.kind == QUERY and head.query is not None:
        ids = [i for i in store.completed_ids(head.query) if i >= (head.batch or 0)]
        if ids:
            found = store.completed(head.query, ids[-1])
            if found is not None:
                return found, (f"checkpoint {ids[-1]} of query {head.query} "
                               f"({store.describe(head.query, ids[-1])})")
    if head.source is None:
        return None, f"empty state ({head.source_note})"
    return load_checkpoint(head.source, verify=False), head.source_note
