"""Sources and sinks of the continuous runtime (:mod:`weir.api.connectors`).

* :class:`SequenceSource` — the numbers ``0 .. n-1``; subtask ``i`` of ``p`` emits
  ``i, i+p, i+2p, …`` (Flink's ``UnalignedCheckpointITCase`` shape), so each subtask's
  output is strictly increasing. A position is ``[next, step]``. Optionally at a fixed
  rate per subtask, and in batches (``batch_size``: each record a ``pyarrow.RecordBatch``
  of numbers, column ``value``).
* :class:`~weir.connectors.file_source.FileSource` — a directory's (or one file's) JSON
  lines or text lines, bounded and replayable; see :mod:`weir.connectors.file_source`.
* :class:`FileSink` — JSON lines (a record that is an Arrow batch or table: a line per
  row), exactly-once by two-phase commit. Layout under its directory::

      _lineage.json                                   the lineage of jobs writing here
      .pending/<sink>-<run>-<attempt>-<subtask>-<n>.jsonl   an open or prepared transaction
      part-<sink>-<run>-<attempt>-<subtask>-<n>.jsonl        a committed one (renamed)

  (``sink``: the sink's uid as a file name can hold it — its letters, digits and ``_``,
  at most 32, then ``_`` and 8 hex digits of its SHA-256 — so sinks sharing a directory,
  a dead-letter sink beside the main one, never write or drop each other's files;
  ``run``: the run's id, which sorts by start time; numbers zero-padded, so a sink's
  names sort in the order a subtask wrote them).

  A committable is ``[directory, pending file name]``; committing renames it (a second
  commit finds the part file and does nothing; a run restored from a savepoint commits
  the savepoint's transactions where they were written). A restore re-commits what its
  checkpoint holds and takes a transaction that is neither pending nor committed as
  committed (a consumer took the part file away; a warning names it); a commit after a
  checkpoint completes raises instead (the pending file of this attempt was removed).
  Files of this sink's earlier attempts and other runs left in ``.pending`` that no
  checkpoint holds are deleted on restore.

  ``_lineage.json`` (``{"format": "weir-stream-sink/1", "lineage": ..., "recorded_by":
  {...}, "recorded_at": ...}``) is created by the first subtask to open, exclusively
  and whole (written to a temporary file, then hard-linked to its name, which fails if
  it exists); a job of another lineage — a fresh start onto a used directory — is
  refused (:class:`~weir.api.connectors.SinkLineageError`).
* ``SqliteSink`` (:mod:`weir.connectors.sqlite_stream`, also importable from here) —
  records as rows of a SQLite table, one column per field (a dict's keys; ``columns=``
  for tuples), as the Spark ``weir-sqlite`` sink writes them; exactly-once by
  two-phase commit through a staging table, its lineage in ``<table>_lineage``;
  ``read_sqlite_stream_sink`` reads it.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

from weir.api.connectors import (
    Sink,
    SinkContext,
    SinkLineageError,
    SinkWriter,
    Source,
    SourceReader,
)
from weir.errors import SinkError

__all__ = ["FileSink", "SequenceSource", "read_stream_sink"]

#: the SQLite sink lives in its own module (it imports this one's transaction naming)
_SQLITE = ("SqliteSink", "read_sqlite_stream_sink", "sqlite_rows")


def __getattr__(name: str) -> Any:
    if name in _SQLITE:
        from weir.connectors import sqlite_stream

        return getattr(sqlite_stream, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

log = logging.getLogger("weir")

#: a FileSink directory's record of the lineage writing it, and its format
LINEAGE_MARKER = "_lineage.json"
LINEAGE_FORMAT = "weir-stream-sink/1"


class _SequenceReader(SourceReader[int]):
    def __init__(self, positions: list[list[int]], end: int, rate: float | None,
                 batch_size: int | None = None) -> None:
        self._positions = [list(p) for p in positions]
        self._end = end
        self._rate = rate
        self._batch_size = batch_size
        self._started = time.monotonic()
        self._emitted = 0

    def poll(self, max_records: int) -> list[Any] | None:
        live = [p for p in self._positions if p[0] < self._end]
        if not live:
            return None
        if self._batch_size is not None:
            max_records = self._batch_size
        if self._rate is not None:
            allowed = int((time.monotonic() - self._started) * self._rate) - self._emitted
            if allowed <= 0:
                time.sleep(min(0.005, 1 / self._rate))
                return []
            max_records = min(max_records, allowed)
        if self._batch_size is not None:
            return self._batch(live, max_records)
        out: list[int] = []
        while len(out) < max_records and live:
            for p in live:
                out.append(p[0])
                p[0] += p[1]
            live = [p for p in live if p[0] < self._end]
        self._emitted += len(out)
        return out

    def _batch(self, live: list[list[int]], rows: int) -> list[Any]:
        """One ``pyarrow.RecordBatch`` of up to ``rows`` numbers (column ``value``)
        of the first split that has any left."""
        import numpy as np
        import pyarrow as pa

        p = live[0]
        numbers = np.arange(p[0], min(self._end, p[0] + p[1] * rows), p[1], dtype=np.int64)
        p[0] += p[1] * len(numbers)
        self._emitted += len(numbers)
        return [pa.record_batch([pa.array(numbers)], names=["value"])]

    def positions(self) -> list[Any]:
        return [list(p) for p in self._positions]


class SequenceSource(Source[int]):
    """The numbers ``0 .. n-1`` (see the module doc); with ``batch_size``, as
    ``pyarrow.RecordBatch`` records of up to that many numbers (column ``value``)."""

    def __init__(self, n: int, records_per_second: float | None = None, *,
                 batch_size: int | None = None) -> None:
        self.n = n
        #: at most this many records a second per subtask (None: as fast as it goes)
        self.records_per_second = records_per_second
        #: numbers per record batch (None: one number per record)
        self.batch_size = batch_size

    def reader(self, subtask: int, parallelism: int, positions: list[Any] | None
               ) -> SourceReader[int]:
        start = [[subtask, parallelism]] if positions is None else positions
        return _SequenceReader(start, self.n, self.records_per_second, self.batch_size)


def _is_arrow(record: Any) -> bool:
    """Whether ``record`` is a ``pyarrow`` batch or table (without importing pyarrow)."""
    return type(record).__module__.startswith("pyarrow") and hasattr(record, "to_pylist")


def sink_tag(uid: str) -> str:
    """A sink uid as a part of a file name or transaction id: its letters, digits and
    ``_`` (others as ``_``, at most 32), ``_``, and 8 hex digits of its SHA-256 — no
    ``-``, no ``.``, distinct for distinct uids."""
    safe = re.sub(r"[^A-Za-z0-9_]", "_", uid)[:32]
    return f"{safe}_{hashlib.sha256(uid.encode()).hexdigest()[:8]}"


def _transaction(context: SinkContext, n: int) -> str:
    """A transaction's name: unique across sinks, runs, attempts, subtasks; in a sink
    and a run, sorting by name is sorting by attempt, subtask, and order of writing."""
    return (f"{sink_tag(context.uid)}-{context.run_id}-{context.attempt:05d}-"
            f"{context.subtask:05d}-{n:09d}")


def _left_over(name: str, context: SinkContext) -> bool:
    """Whether transaction ``name`` is this sink's, of an earlier attempt or another
    run (another sink's is never left over)."""
    own, _, rest = name.partition("-")
    if own != sink_tag(context.uid):
        return False
    run, _, rest = rest.partition("-")
    attempt = rest.split("-", 1)[0]
    return run != context.run_id or (attempt.isdigit() and int(attempt) < context.attempt)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _fsync_directory(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _read_owner(marker: Path, uid: str) -> str | None:
    """The lineage recorded in ``marker`` (None: no marker)."""
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        problem = str(exc)
    else:
        if (isinstance(data, dict) and data.get("format") == LINEAGE_FORMAT
                and isinstance(data.get("lineage"), str)):
            return str(data["lineage"])
        problem = f"not a {LINEAGE_FORMAT} lineage record"
    raise SinkError(
        f"FileSink {uid!r}: {marker} cannot be read ({problem}), so the lineage of jobs "
        f"that owns {marker.parent} is unknown; nothing was written. If the directory "
        f"holds only this job's output, delete {marker} (the next start records the "
        f"lineage again); else give the sink a new directory.")


def _record_owner(marker: Path, context: SinkContext) -> None:
    """Create ``marker`` naming ``context.lineage`` unless it exists: written whole to a
    temporary file, then hard-linked to its name (exclusive: the link fails if another
    subtask created it first, and the marker is never seen half written)."""
    record = {"format": LINEAGE_FORMAT, "lineage": context.lineage,
              "recorded_by": {"uid": context.uid, "run_id": context.run_id,
                              "subtask": context.subtask, "attempt": context.attempt},
              "recorded_at": _now()}
    tmp = marker.with_name(f"{marker.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as out:
            json.dump(record, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, marker)
        except FileExistsError:
            return  # another subtask recorded it first: what it recorded counts
        _fsync_directory(marker.parent)
    except OSError as exc:
        raise SinkError(
            f"FileSink {context.uid!r}: cannot record the lineage of the job writing "
            f"{marker.parent} in {marker}: {exc}; nothing was written. Check that the "
            f"directory is writable (and on a filesystem with hard links).") from exc
    finally:
        tmp.unlink(missing_ok=True)


class _FileWriter(SinkWriter[Any]):
    def __init__(self, sink: FileSink, context: SinkContext) -> None:
        self.sink, self.context = sink, context
        self._n = 0
        self._file: Any = None
        self._name = ""

    def write(self, record: Any) -> None:
        if self._file is None:
            self._name = f"{_transaction(self.context, self._n)}.jsonl"
            self._n += 1
            self._file = open(self.sink.pending / self._name, "w", encoding="utf-8")  # noqa: SIM115
        if _is_arrow(record):  # a batch of records: a line per row
            self._file.writelines(json.dumps(row) + "\n" for row in record.to_pylist())
        else:
            self._file.write(json.dumps(record) + "\n")

    def prepare_commit(self, checkpoint_id: int) -> Any:
        if self._file is None:
            return None
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        return [str(self.sink.path.resolve()), self._name]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class FileSink(Sink[Any]):
    """JSON lines in ``path``, exactly-once (see the module doc)."""

    def __init__(self, path: str | Path) -> None:
        # (absolute where the job is built: every task, on any executor, writes there)
        self.path = Path(path).resolve()
        self.pending = self.path / ".pending"

    def locations(self) -> list[str]:
        """Its directory (every task must reach it at the same path)."""
        return [str(self.path)]

    def claim(self, context: SinkContext) -> None:
        """Record ``context.lineage`` in ``<path>/_lineage.json`` if no lineage is
        recorded there; refuse another one (see the module doc)."""
        self.path.mkdir(parents=True, exist_ok=True)
        marker = self.path / LINEAGE_MARKER
        owner = _read_owner(marker, context.uid)
        if owner is None:
            _record_owner(marker, context)
            owner = _read_owner(marker, context.uid)
        if owner != context.lineage:
            raise SinkLineageError(
                f"FileSink {context.uid!r}: {self.path} holds the output of another "
                f"lineage of jobs ({owner!r}, recorded in {marker}); this job's lineage "
                f"is {context.lineage!r} — a fresh start, without the checkpoints or a "
                f"savepoint of the job that wrote it, would commit that output a second "
                f"time. Nothing was written. To continue that job, restore it from its "
                f"checkpoints or a savepoint; to start over, delete {self.path} or give "
                f"the sink a new directory.")

    def writer(self, context: SinkContext) -> SinkWriter[Any]:
        self.pending.mkdir(parents=True, exist_ok=True)
        return _FileWriter(self, context)

    def commit(self, committables: list[Any]) -> None:
        """Rename each pending file to its part file (a second commit finds the part
        file); a transaction neither pending nor committed raises :class:`SinkError`:
        its pending file was removed, its records are lost."""
        self._commit(committables, recovered=False)

    def commit_after_recovery(self, committables: list[Any]) -> None:
        """As :meth:`commit`, but a transaction neither pending nor committed counts
        as committed (a consumer took its part file away; logged as a warning)."""
        self._commit(committables, recovered=True)

    def _commit(self, committables: list[Any], recovered: bool) -> None:
        directories = set()
        for directory, name in committables:  # (where it was written: a run restored
            path = Path(directory)             # from a savepoint may write elsewhere)
            pending, target = path / ".pending" / name, path / f"part-{name}"
            try:
                os.rename(pending, target)
            except FileNotFoundError:
                if target.exists():
                    pass  # committed before
                elif recovered:  # (Flink's LocalCommitter.commitAfterRecovery)
                    log.warning(
                        "weir: FileSink: transaction %s recovered from a checkpoint is "
                        "neither pending (%s) nor committed (%s): taken as committed "
                        "(its part file was moved or deleted after its commit)",
                        name, pending, target)
                else:
                    raise SinkError(
                        f"FileSink: transaction {name} in {directory} is neither pending "
                        f"({pending}) nor committed ({target}): its pending file was "
                        f"removed before its checkpoint's commit, so its records are "
                        f"lost. Nothing but the sink may move or delete files in "
                        f"{path / '.pending'} (a consumer may take the part files)."
                    ) from None
            directories.add(path)
        for path in directories:
            _fsync_directory(path)

    def abort_attempts(self, context: SinkContext, keep: list[Any]) -> None:
        kept = {name for _, name in keep}
        if not self.pending.exists():
            return
        for entry in self.pending.iterdir():
            if _left_over(entry.name, context) and entry.name not in kept:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()


def read_stream_sink(path: str | Path) -> list[Any]:
    """Every committed record of a :class:`FileSink` directory."""
    out: list[Any] = []
    for part in sorted(Path(path).glob("part-*.jsonl")):
        with open(part, encoding="utf-8") as f:
            out.extend(json.loads(line) for line in f)
    return out
