"""Sources and sinks of the continuous runtime (:mod:`weir.api.connectors`).

* :class:`SequenceSource` — the numbers ``0 .. n-1``; subtask ``i`` of ``p`` emits
  ``i, i+p, i+2p, …`` (Flink's ``UnalignedCheckpointITCase`` shape), so each subtask's
  output is strictly increasing. A position is ``[next, step]``. Optionally at a fixed
  rate per subtask.
* :class:`~weir.connectors.file_source.FileSource` — a directory's (or one file's) JSON
  lines or text lines, bounded and replayable; see :mod:`weir.connectors.file_source`.
* :class:`FileSink` — JSON lines, exactly-once by two-phase commit. Layout under its
  directory::

      .pending/<run>-<attempt>-<subtask>-<n>.jsonl    an open or prepared transaction
      part-<run>-<attempt>-<subtask>-<n>.jsonl         a committed one (renamed)

  (``run``: the run's id, which sorts by start time; numbers zero-padded, so the names
  sort in the order a subtask wrote them).

  A committable is ``[directory, pending file name]``; committing renames it (a second
  commit finds the part file and does nothing; a run restored from a savepoint commits
  the savepoint's transactions where they were written). Files of earlier attempts and
  other runs left in ``.pending`` that no checkpoint holds are deleted on restore.
* :class:`SqliteSink` — JSON records in a SQLite table, exactly-once by two-phase
  commit through a staging table (see the class).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from weir.api.connectors import Sink, SinkContext, SinkWriter, Source, SourceReader
from weir.connectors.sqlite_db import open_database
from weir.errors import SinkError

__all__ = ["FileSink", "SequenceSource", "SqliteSink", "read_sqlite_stream_sink",
           "read_stream_sink"]


class _SequenceReader(SourceReader[int]):
    def __init__(self, positions: list[list[int]], end: int, rate: float | None) -> None:
        self._positions = [list(p) for p in positions]
        self._end = end
        self._rate = rate
        self._started = time.monotonic()
        self._emitted = 0

    def poll(self, max_records: int) -> list[int] | None:
        live = [p for p in self._positions if p[0] < self._end]
        if not live:
            return None
        if self._rate is not None:
            allowed = int((time.monotonic() - self._started) * self._rate) - self._emitted
            if allowed <= 0:
                time.sleep(min(0.005, 1 / self._rate))
                return []
            max_records = min(max_records, allowed)
        out: list[int] = []
        while len(out) < max_records and live:
            for p in live:
                out.append(p[0])
                p[0] += p[1]
            live = [p for p in live if p[0] < self._end]
        self._emitted += len(out)
        return out

    def positions(self) -> list[Any]:
        return [list(p) for p in self._positions]


class SequenceSource(Source[int]):
    """The numbers ``0 .. n-1`` (see the module doc)."""

    def __init__(self, n: int, records_per_second: float | None = None) -> None:
        self.n = n
        #: at most this many records a second per subtask (None: as fast as it goes)
        self.records_per_second = records_per_second

    def reader(self, subtask: int, parallelism: int, positions: list[Any] | None
               ) -> SourceReader[int]:
        start = [[subtask, parallelism]] if positions is None else positions
        return _SequenceReader(start, self.n, self.records_per_second)


def _transaction(context: SinkContext, n: int) -> str:
    """A transaction's name: unique across runs, attempts, subtasks; in a run, sorting
    by name is sorting by attempt, subtask, and order of writing."""
    return f"{context.run_id}-{context.attempt:05d}-{context.subtask:05d}-{n:09d}"


def _left_over(name: str, context: SinkContext) -> bool:
    """Whether transaction ``name`` is of an earlier attempt or another run."""
    run, _, rest = name.partition("-")
    attempt = rest.split("-", 1)[0]
    return run != context.run_id or (attempt.isdigit() and int(attempt) < context.attempt)


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
        self.path = Path(path)
        self.pending = self.path / ".pending"

    def writer(self, context: SinkContext) -> SinkWriter[Any]:
        self.pending.mkdir(parents=True, exist_ok=True)
        return _FileWriter(self, context)

    def commit(self, committables: list[Any]) -> None:
        directories = set()
        for directory, name in committables:  # (where it was written: a run restored
            path = Path(directory)             # from a savepoint may write elsewhere)
            target = path / f"part-{name}"
            try:
                os.rename(path / ".pending" / name, target)
            except FileNotFoundError:
                if not target.exists():
                    raise SinkError(f"FileSink: transaction {name} of {directory} is "
                                    f"neither pending nor committed: its file was removed"
                                    ) from None
            directories.add(path)
        for path in directories:
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

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


class _SqliteWriter(SinkWriter[Any]):
    def __init__(self, sink: SqliteSink, context: SinkContext) -> None:
        self.sink, self.context = sink, context
        self._n = 0
        self._rows: list[tuple[str, str]] = []
        self._conn = sink._connect()

    def _txn(self) -> str:
        return _transaction(self.context, self._n)

    def write(self, record: Any) -> None:
        self._rows.append((self._txn(), json.dumps(record)))
        if len(self._rows) >= 1_000:
            self._stage()

    def _stage(self) -> None:
        if self._rows:
            with self._conn:
                self._conn.executemany(
                    f"INSERT INTO {self.sink.staging} (txn, value) VALUES (?, ?)", self._rows)
            self._rows = []

    def prepare_commit(self, checkpoint_id: int) -> Any:
        self._stage()
        txn = self._txn()
        self._n += 1
        found = self._conn.execute(
            f"SELECT 1 FROM {self.sink.staging} WHERE txn = ? LIMIT 1", (txn,)).fetchone()
        return txn if found else None

    def close(self) -> None:
        self._conn.close()


class SqliteSink(Sink[Any]):
    """Records as JSON in table ``table`` of the SQLite database ``path``, exactly-once
    by two-phase commit: a writer stages its transaction's rows in ``<table>_staging``
    under a transaction id (the committable); committing moves them into ``table`` and
    records the id in ``<table>_committed``, in one SQLite transaction, so a second
    commit of the same id does nothing."""

    def __init__(self, path: str | Path, *, table: str = "records") -> None:
        if not table.isidentifier():
            raise ValueError(f"table must be an identifier, got {table!r}")
        self.path, self.table = str(path), table
        self.staging, self.committed = f"{table}_staging", f"{table}_committed"

    def _connect(self) -> Any:
        conn = open_database(self.path)
        with conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} "
                         f"(txn TEXT NOT NULL, value TEXT NOT NULL)")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.staging} "
                         f"(txn TEXT NOT NULL, value TEXT NOT NULL)")
            conn.execute(f"CREATE INDEX IF NOT EXISTS {self.staging}_txn "
                         f"ON {self.staging} (txn)")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.committed} "
                         f"(txn TEXT PRIMARY KEY)")
        return conn

    @contextlib.contextmanager
    def _locked(self) -> Iterator[Any]:
        """A connection in a transaction holding the write lock (``BEGIN IMMEDIATE``),
        committed at the end of the block, rolled back on an error."""
        conn = self._connect()
        conn.isolation_level = None
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        finally:
            conn.close()

    def writer(self, context: SinkContext) -> SinkWriter[Any]:
        return _SqliteWriter(self, context)

    def commit(self, committables: list[Any]) -> None:
        # every subtask commits the recovered committables at once after a restore: the
        # write lock first, then claim each id (one claimed already is skipped)
        with self._locked() as conn:
            for txn in committables:
                claimed = conn.execute(
                    f"INSERT OR IGNORE INTO {self.committed} (txn) VALUES (?)", (txn,))
                if claimed.rowcount != 1:
                    continue
                conn.execute(f"INSERT INTO {self.table} (txn, value) SELECT txn, value "
                             f"FROM {self.staging} WHERE txn = ? ORDER BY rowid", (txn,))
                conn.execute(f"DELETE FROM {self.staging} WHERE txn = ?", (txn,))

    def abort_attempts(self, context: SinkContext, keep: list[Any]) -> None:
        kept = set(keep)
        with self._locked() as conn:  # (read, then write: the lock first)
            rows = conn.execute(f"SELECT DISTINCT txn FROM {self.staging}").fetchall()
            for (txn,) in rows:
                if _left_over(txn, context) and txn not in kept:
                    conn.execute(f"DELETE FROM {self.staging} WHERE txn = ?", (txn,))


def read_sqlite_stream_sink(path: str | Path, *, table: str = "records") -> list[Any]:
    """Every committed record of a :class:`SqliteSink` table, in commit order."""
    import sqlite3

    conn = sqlite3.connect(str(path))
    try:
        rows = conn.execute(f"SELECT value FROM {table} ORDER BY rowid").fetchall()
    finally:
        conn.close()
    return [json.loads(v) for (v,) in rows]
