"""Dead letters: the records a process function rejected (it raised one of its
``bad_record_exceptions``; on the micro-batch runtime also malformed input, records
without an event time and late records), one record shape on both runtimes::

    {"uid": <the operator>, "subtask": <its subtask>, "reason": "<Exception>: <message>",
     "record": <the record; its repr if JSON cannot hold it>,
     "where": {"query": <Spark query id>, "batch": <batch id>}          # micro-batch
              {"job": <job name>, "checkpoint": <checkpoint id>}}        # continuous

On the micro-batch runtime ``checkpoint`` is a batch (a micro-batch is one
checkpoint); records of it also carry ``query`` and ``batch`` at the top, for one
release. On the continuous runtime ``checkpoint`` is the checkpoint whose completion
committed the record (the one at whose barrier its transaction was prepared; ``job`` is
the name the job ran under, ``execute``'s name with the run's suffix).

:func:`read_dead_letters` reads both layouts from a checkpoint storage location
(``weir dead-letters LOCATION`` prints them)::

    <storage>/dead-letter/
      <query id>/batch=<batch>/<uid-dir>-<subtask>.jsonl   micro-batch: one file per
                                                           subtask and batch
      stream/<sink>-<run>-<attempt>-<subtask>-<n>.jsonl    continuous: one file per
                                                           committed transaction
      .pending/<sink>-<run>-<attempt>-<subtask>-<n>.jsonl.pending
                                                           continuous: staged (never
                                                           read)

The continuous runtime writes there (:class:`StorageDeadLetters`) whenever a process
function has ``bad_record_exceptions`` (its class declares them, or ``process`` names
them) and no ``dead_letters=`` sink is given: exactly once, by two-phase commit with
the checkpoints, as :class:`~weir.connectors.stream.FileSink` does — a transaction is
uploaded to ``.pending/`` at its checkpoint's barrier (its committable, the storage's
URL and the transaction's name, goes into the checkpoint) and renamed into ``stream/``
when the checkpoint completes; a restore re-commits what its checkpoint holds (one
found committed counts as committed) and deletes what earlier attempts and runs of the
sink left in ``.pending/``. Committed files older than ``JobConfig.dead_letter_retention``
are deleted by subtask 0 when the first checkpoint of a task completes and then every
:data:`SWEEP_EVERY` checkpoints (the micro-batch runtime sweeps every 100 batches).

Every dead-letter sink of the continuous runtime — the default one or a user's
``dead_letters=`` sink — is wrapped in :class:`DeadLetterSink`, which holds the
records a subtask rejects until the checkpoint's barrier and writes them then, with
``where["checkpoint"]`` filled in, into the transaction the barrier closes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import posixpath
import tempfile
import time
from datetime import UTC, datetime
from typing import IO, Any

from weir.api.connectors import Sink, SinkContext, SinkWriter
from weir.checkpoint.storage import CheckpointStorage
from weir.connectors.stream import _left_over, _transaction
from weir.errors import SinkError

__all__ = ["DEAD_LETTER_DIR", "DeadLetterSink", "StorageDeadLetters", "read_dead_letters"]

log = logging.getLogger("weir")

#: where a checkpoint storage holds dead letters, and the continuous runtime's parts
DEAD_LETTER_DIR = "dead-letter"
STREAM_DIR = f"{DEAD_LETTER_DIR}/stream"
PENDING_DIR = f"{DEAD_LETTER_DIR}/.pending"
PENDING_SUFFIX = ".jsonl.pending"
#: the continuous runtime's retention sweep: every this many completed checkpoints
SWEEP_EVERY = 100
#: dead letters a writer holds in memory before it spills them to a temporary file
_SPOOL_BYTES = 1 << 20


# -- reading


def read_dead_letters(location: str | os.PathLike[str], *,
                      storage_options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every dead letter in the checkpoint storage ``location`` (a path or URL; a Spark
    stage's ``checkpoint_location`` or a continuous job's storage), of either runtime,
    in the one shape of the module doc: the micro-batch runtime's by query, batch and
    subtask (a batch Spark replayed was rewritten in place, so each bad record appears
    once per query run that committed it), then the continuous runtime's by job,
    checkpoint, operator and subtask (each committed once). Staged and temporary files
    are never read."""
    storage = CheckpointStorage(str(location), storage_options=storage_options)
    batches: list[dict[str, Any]] = []
    stream: list[dict[str, Any]] = []
    for path in storage.walk_files(DEAD_LETTER_DIR):
        parts = path.split("/")[1:]
        if not path.endswith(".jsonl") or any(p.startswith((".", "_")) for p in parts):
            continue
        for line in storage.read_bytes(path, path).splitlines():
            if line.strip():
                letter = _one_shape(json.loads(line))
                (batches if "batch" in letter["where"] else stream).append(letter)
    batches.sort(key=lambda d: (str(d["query"]), _int(d["batch"]), _int(d["subtask"])))
    stream.sort(key=lambda d: (str(d["where"].get("job")), _int(d["where"].get("checkpoint")),
                               str(d["uid"]), _int(d["subtask"])))
    return batches + stream


def _int(value: Any) -> int:
    return value if isinstance(value, int) else -1


def _one_shape(letter: dict[str, Any]) -> dict[str, Any]:
    """A dead letter as written by either runtime (the micro-batch runtime's with
    ``query`` and ``batch`` at the top, or already with ``where``), in the one shape."""
    where = letter.get("where")
    if not isinstance(where, dict):
        where = {"query": letter.get("query"), "batch": letter.get("batch")}
    shaped = {k: letter.get(k) for k in ("uid", "subtask", "reason", "record")}
    shaped["where"] = where
    if "batch" in where:  # micro-batch: query and batch at the top too, for one release
        shaped["query"], shaped["batch"] = where.get("query"), where.get("batch")
    return shaped


# -- writing: the wrapper of every dead-letter sink


class _Stamping(SinkWriter[Any]):
    """Holds a subtask's dead letters until a checkpoint's barrier, then writes them
    into the wrapped writer's transaction with the checkpoint's id."""

    def __init__(self, inner: SinkWriter[Any]) -> None:
        self.inner = inner
        self._spool: IO[bytes] | None = None
        self._held = 0

    def write(self, record: Any) -> None:
        if self._spool is None:
            self._spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115
        pickle.dump(record, self._spool, protocol=pickle.HIGHEST_PROTOCOL)
        self._held += 1

    def prepare_commit(self, checkpoint_id: int) -> Any:
        spool, held = self._spool, self._held
        self._spool, self._held = None, 0
        if spool is not None:
            try:
                spool.seek(0)
                for _ in range(held):
                    letter = pickle.load(spool)
                    where = letter.get("where") if isinstance(letter, dict) else None
                    if isinstance(where, dict) and where.get("checkpoint") is None:
                        where["checkpoint"] = checkpoint_id
                    self.inner.write(letter)
            finally:
                spool.close()
        return self.inner.prepare_commit(checkpoint_id)

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()
            self._spool, self._held = None, 0
        self.inner.close()


class DeadLetterSink(Sink[Any]):
    """A dead-letter sink of the continuous runtime: ``sink``, its records (dead
    letters) held until the barrier of the checkpoint that commits them, which fills in
    their ``where["checkpoint"]`` (see the module doc). Everything else is ``sink``'s."""

    def __init__(self, sink: Sink[Any]) -> None:
        self.sink = sink

    def writer(self, context: SinkContext) -> SinkWriter[Any]:
        return _Stamping(self.sink.writer(context))

    def claim(self, context: SinkContext) -> None:
        self.sink.claim(context)

    def locations(self) -> list[str]:
        return self.sink.locations()

    def commit(self, committables: list[Any]) -> None:
        self.sink.commit(committables)

    def commit_after_recovery(self, committables: list[Any]) -> None:
        self.sink.commit_after_recovery(committables)

    def abort_attempts(self, context: SinkContext, keep: list[Any]) -> None:
        self.sink.abort_attempts(context, keep)


# -- writing: the default sink, into the checkpoint storage


class _StorageWriter(SinkWriter[Any]):
    def __init__(self, sink: StorageDeadLetters, context: SinkContext) -> None:
        self.sink, self.context = sink, context
        self._n = 0
        self._file: Any = None

    def write(self, record: Any) -> None:
        if self._file is None:
            self._file = tempfile.NamedTemporaryFile(  # noqa: SIM115
                "wb", prefix="weir-dead-letters-", suffix=".jsonl", delete=False)
        self._file.write(json.dumps(record, ensure_ascii=False, default=str).encode() + b"\n")

    def prepare_commit(self, checkpoint_id: int) -> Any:
        if self._file is None:
            return None
        name = _transaction(self.context, self._n)
        self._n += 1
        local, self._file = self._file, None
        try:
            local.close()
            # (published whole: written to a temporary name, then renamed)
            self.sink.storage(self.sink.url).upload(f"{PENDING_DIR}/{name}{PENDING_SUFFIX}",
                                                    local.name)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(local.name)
        return [self.sink.url, name]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            with contextlib.suppress(OSError):
                os.unlink(self._file.name)
            self._file = None


class StorageDeadLetters(Sink[Any]):
    """The continuous runtime's default dead-letter sink: JSON lines under
    ``<storage>/dead-letter/`` of the checkpoint storage ``url``, exactly-once, deleted
    after ``retention_ms`` (see the module doc), opened with the job's
    ``storage_options`` (in the task processes too: they travel in the job graph)."""

    def __init__(self, url: str, retention_ms: int,
                 storage_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.retention_ms = retention_ms
        self._storage_options = storage_options
        self._storages: dict[str, CheckpointStorage] = {}
        #: (in a task) the subtask writing, and checkpoints completed since it opened
        self._subtask: int | None = None
        self._commits = 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_storages": {}}  # (filesystems stay where they were made)

    def __repr__(self) -> str:  # (never the options: they may hold credentials)
        return f"{type(self).__name__}({self.url!r})"

    def storage(self, url: str) -> CheckpointStorage:
        """The checkpoint storage at ``url`` (one object per URL in a process)."""
        found = self._storages.get(url)
        if found is None:
            found = self._storages[url] = CheckpointStorage(
                url, storage_options=self._storage_options)
        return found

    def writer(self, context: SinkContext) -> SinkWriter[Any]:
        self._subtask = context.subtask
        return _StorageWriter(self, context)

    def commit(self, committables: list[Any]) -> None:
        """Rename each staged transaction into ``stream/`` (a second commit finds it
        there); one neither staged nor committed raises :class:`SinkError`. Then, on
        subtask 0, the retention sweep when due."""
        self._commit(committables, recovered=False)
        if self._subtask == 0:
            if self._commits % SWEEP_EVERY == 0:
                self.sweep()
            self._commits += 1

    def commit_after_recovery(self, committables: list[Any]) -> None:
        """As :meth:`commit`, but a transaction neither staged nor committed counts as
        committed (its file was deleted after its commit; logged as a warning)."""
        self._commit(committables, recovered=True)

    def _commit(self, committables: list[Any], recovered: bool) -> None:
        touched: set[str] = set()
        for url, name in committables:  # (where it was written: a run restored from a
            storage = self.storage(url)   # savepoint may write elsewhere)
            pending = storage.full_path(f"{PENDING_DIR}/{name}{PENDING_SUFFIX}")
            target = storage.full_path(f"{STREAM_DIR}/{name}.jsonl")
            try:
                _rename(storage, pending, target)
            except FileNotFoundError:
                if storage.fs.exists(target):
                    continue  # committed before
                if recovered:
                    log.warning(
                        "weir: dead letters: transaction %s recovered from a checkpoint is "
                        "neither staged (%s) nor committed (%s): taken as committed (its "
                        "file was deleted after its commit)", name, pending, target)
                    continue
                raise SinkError(
                    f"dead letters: transaction {name} in {url} is neither staged "
                    f"({pending}) nor committed ({target}): its staged file was removed "
                    f"before its checkpoint's commit, so its dead letters are lost. Nothing "
                    f"but weir may move or delete files in {PENDING_DIR}.") from None
            touched.add(url)
        for url in touched:
            storage = self.storage(url)
            if storage.is_local:
                _fsync_directory(storage.full_path(STREAM_DIR))

    def abort_attempts(self, context: SinkContext, keep: list[Any]) -> None:
        kept = {name for _, name in keep}
        storage = self.storage(self.url)
        for entry in storage.list_dir(PENDING_DIR):
            name = entry.split(PENDING_SUFFIX, 1)[0]
            if _left_over(entry, context) and name not in kept:
                storage.delete(f"{PENDING_DIR}/{entry}")

    def sweep(self) -> int:
        """Delete the committed dead letters of this storage older than the retention
        (by their files' modification time, the time they were staged); how many."""
        storage = self.storage(self.url)
        cutoff = time.time() - self.retention_ms / 1000
        deleted = 0
        for path in storage.walk_files(STREAM_DIR):
            try:
                modified = storage.fs.modified(storage.full_path(path))
            except (OSError, NotImplementedError, ValueError):
                continue
            if modified.tzinfo is None:
                modified = modified.replace(tzinfo=UTC)
            if modified.timestamp() < cutoff:
                storage.delete(path)
                deleted += 1
        if deleted:
            log.info("weir: dead letters in %s: deleted %d files older than %s", self.url,
                     deleted, datetime.fromtimestamp(cutoff, UTC).isoformat(timespec="seconds"))
        return deleted


def _rename(storage: CheckpointStorage, source: str, target: str) -> None:
    """Move ``source`` to ``target`` (atomically on a local disk); FileNotFoundError if
    ``source`` is missing."""
    if storage.is_local:
        os.makedirs(posixpath.dirname(target), exist_ok=True)
        os.rename(source, target)
        return
    if not storage.fs.exists(source):
        raise FileNotFoundError(source)
    storage.fs.makedirs(posixpath.dirname(target), exist_ok=True)
    storage.fs.mv(source, target)


def _fsync_directory(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
