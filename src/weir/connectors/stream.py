"""Sources and sinks of the continuous runtime (:mod:`weir.api.connectors`).

* :class:`SequenceSource` — the numbers ``0 .. n-1``; subtask ``i`` of ``p`` emits
  ``i, i+p, i+2p, …`` (Flink's ``UnalignedCheckpointITCase`` shape), so each subtask's
  output is strictly increasing. A position is ``[next, step]``. Optionally at a fixed
  rate per subtask.
* :class:`~weir.connectors.file_source.FileSource` — a directory's (or one file's) JSON
  lines or text lines, bounded and replayable; see :mod:`weir.connectors.file_source`.
* :class:`FileSink` — JSON lines, exactly-once by two-phase commit. Layout under its
  directory::

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
* :class:`SqliteSink` — records as rows of a SQLite table, one column per field (a
  dict's keys; ``columns=`` for tuples), as the Spark ``weir-sqlite`` sink writes them;
  exactly-once by two-phase commit through a staging table, its lineage in
  ``<table>_lineage`` (see the class). :func:`read_sqlite_stream_sink` reads it.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack

from weir.api.connectors import (
    Sink,
    SinkContext,
    SinkLineageError,
    SinkWriter,
    Source,
    SourceReader,
)
from weir.connectors.sqlite_db import open_database
from weir.errors import ConfigurationError, SinkError

__all__ = ["FileSink", "SequenceSource", "SqliteSink", "read_sqlite_stream_sink",
           "read_stream_sink"]

log = logging.getLogger("weir")

#: a FileSink directory's record of the lineage writing it, and its format
LINEAGE_MARKER = "_lineage.json"
LINEAGE_FORMAT = "weir-stream-sink/1"


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


def _json_default(value: Any) -> Any:
    """What JSON text holds of a value JSON has no type for: bytes as base64, anything
    else (dates, decimals, sets...) as its ``str``."""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_default)


#: the largest magnitude SQLite's INTEGER holds (a larger int is stored as its text)
_INT64 = 2**63


def _column_type(value: Any) -> str:
    """The declared type of a column first seen with ``value`` (see :class:`SqliteSink`)."""
    if isinstance(value, bool | int):
        return "INTEGER"
    if isinstance(value, float):
        return "REAL"
    if isinstance(value, str):
        return "TEXT"
    if isinstance(value, bytes):
        return "BLOB"
    if isinstance(value, dict | list):
        return "JSON"
    return ""  # (None: no declared type; values are stored as they come)


def _plain(value: Any) -> Any:
    """A top-level column value as staged: None, bool, int, float, str, bytes, or a dict
    or list (JSON in the table); a tuple as a list, anything else as its ``str``."""
    if value is None or isinstance(value, bool | float | str | bytes | dict | list):
        return value
    if isinstance(value, int):
        return value if -_INT64 <= value < _INT64 else str(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return str(value)


def _sql_value(value: Any, column_type: str) -> Any:
    """A staged value as stored in a column of ``column_type``: in a JSON column always
    JSON text; elsewhere a dict or list as JSON text, the rest as it is."""
    if value is None:
        return None
    if column_type == "JSON" or isinstance(value, dict | list):
        return _json_text(value)
    return value


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


class _SqliteWriter(SinkWriter[Any]):
    def __init__(self, sink: SqliteSink, context: SinkContext) -> None:
        self.sink, self.context = sink, context
        self._n = 0
        self._rows: list[tuple[str, bytes]] = []
        self._conn = sink._connect()

    def _txn(self) -> str:
        return _transaction(self.context, self._n)

    def write(self, record: Any) -> None:
        row = self.sink.row_of(record)
        try:
            packed = msgpack.packb(row, default=_json_default, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise SinkError(f"SqliteSink {self.context.uid!r}: cannot store the record "
                            f"{record!r:.200} in table {self.sink.table}: {exc}") from exc
        self._rows.append((self._txn(), packed))
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


class _Table:
    """The target table's columns as a commit sees them (under the write lock):
    created from the first row, extended by later rows' new keys."""

    def __init__(self, sink: SqliteSink, conn: Any) -> None:
        self.sink, self.conn = sink, conn
        info = conn.execute(f"PRAGMA table_info({_quote(sink.table)})").fetchall()
        #: name as declared -> declared type; and by lower-case name (SQLite's rule)
        self.types: dict[str, str] = {r[1]: str(r[2]).upper() for r in info}
        self.names: dict[str, str] = {name.lower(): name for name in self.types}

    def insert(self, rows: list[dict[str, Any]]) -> None:
        """Insert ``rows`` in order (consecutive rows of the same keys at once)."""
        start = 0
        while start < len(rows):
            keys = list(rows[start])
            end = start + 1
            while end < len(rows) and list(rows[end]) == keys:
                end += 1
            self._columns(rows[start])
            names = [self.names[k.lower()] for k in keys]
            types = [self.types[n] for n in names]
            sql = (f"INSERT INTO {_quote(self.sink.table)} "
                   f"({', '.join(_quote(n) for n in names)}) "
                   f"VALUES ({', '.join('?' for _ in names)})")
            self.conn.executemany(sql, [
                tuple(_sql_value(row[k], t) for k, t in zip(keys, types, strict=True))
                for row in rows[start:end]])
            start = end

    def _columns(self, row: dict[str, Any]) -> None:
        """Create the table, or add the columns ``row`` has and the table has not."""
        table = _quote(self.sink.table)
        if not self.types:
            order = list(self.sink.columns or ())
            order += [k for k in row if k.lower() not in {c.lower() for c in order}]
            ddl = ", ".join(f"{_quote(c)} {_column_type(row.get(c))}".rstrip() for c in order)
            self.conn.execute(f"CREATE TABLE {table} ({ddl})")
            for c in order:
                self._known(c, _column_type(row.get(c)))
            return
        for key, value in row.items():
            if key.lower() not in self.names:
                kind = _column_type(value)
                self.conn.execute(
                    f"ALTER TABLE {table} ADD COLUMN {_quote(key)} {kind}".rstrip())
                self._known(key, kind)

    def _known(self, name: str, kind: str) -> None:
        self.types[name] = kind
        self.names[name.lower()] = name


class SqliteSink(Sink[Any]):
    """Records as rows of table ``table`` of the SQLite database ``path``, one column
    per field, as the Spark ``weir-sqlite`` sink writes them (the same committed-table
    layout: :func:`read_sqlite_stream_sink` and ``weir.connectors.spark.read_sqlite_sink``
    read either).

    A record that is a dict is a row with its keys as columns (keys are strings; SQLite
    compares column names without case, so two keys of one record must differ in more
    than case). A named tuple or a dataclass instance is a row of its fields. A tuple or
    list needs ``columns=`` (its values in that order, as many), and so does any other
    value (one column: ``columns=["value"]``); a record the sink cannot make a row of
    raises :class:`~weir.errors.SinkError` as it is written.

    The table is created by the first commit with rows: the columns of ``columns=`` (if
    given), then the first record's other keys. A later record with keys the table
    lacks adds them (``ALTER TABLE ADD COLUMN``, in the commit's transaction), so every
    key of every record is kept; rows written before have NULL there. A column's
    declared type comes from the value of the record that created it: INTEGER for
    bools and ints, REAL for floats, TEXT for strings, BLOB for bytes, JSON for dicts
    and lists (nested values are stored as JSON text; so is every value of a JSON
    column, and :func:`read_sqlite_stream_sink` decodes them), no type for None (values
    stored as they come). Tuples are lists; ints beyond 64 bits and other values (dates,
    decimals...) are stored as their ``str``.

    Exactly-once by two-phase commit: a writer stages its transaction's rows in
    ``<table>_staging`` (msgpack) under a transaction id (the committable; named as a
    :class:`FileSink`'s files are, ``<sink>-<run>-<attempt>-<subtask>-<n>``, so sinks
    sharing a table never mix their transactions); committing moves them into
    ``table`` and records the id in ``<table>_committed``, in one SQLite transaction, so
    a second commit of the same id does nothing. ``<table>_lineage`` holds one row, the
    lineage of the jobs writing the table (inserted by the first subtask to open, under
    the write lock); a job of another lineage is refused, and so is a table an earlier
    weir wrote as one JSON text per row (``txn``, ``value``)."""

    def __init__(self, path: str | Path, *, table: str = "records",
                 columns: Sequence[str] | None = None) -> None:
        if not table.isidentifier():
            raise ValueError(f"table must be an identifier, got {table!r}")
        if columns is not None:
            columns = list(columns)
            lowered = [c.lower() for c in columns if isinstance(c, str) and c]
            if len(lowered) != len(columns) or not columns or len(set(lowered)) != len(
                    lowered):
                raise ConfigurationError(
                    f"SqliteSink: columns must be non-empty strings, distinct without "
                    f"regard to case (SQLite's rule for column names), got {columns!r}")
        # (absolute where the job is built: every task, on any executor, writes there)
        self.path = str(path) if str(path) == ":memory:" else str(Path(path).resolve())
        self.table = table
        #: the names of a tuple's or list's values, and the table's first columns
        self.columns: tuple[str, ...] | None = None if columns is None else tuple(columns)
        self.staging, self.committed = f"{table}_staging", f"{table}_committed"
        self.lineage = f"{table}_lineage"

    def locations(self) -> list[str]:
        """The directory of its database file (every task must reach it)."""
        return [str(Path(self.path).resolve().parent)]

    def row_of(self, record: Any) -> dict[str, Any]:
        """``record`` as a row: column name -> value (see the class); raises
        :class:`~weir.errors.SinkError` for a record that cannot be one."""
        if isinstance(record, dict):
            row = record
        elif isinstance(record, tuple) and hasattr(record, "_fields"):  # a named tuple
            row = dict(zip(getattr(record, "_fields"), record, strict=True))  # noqa: B009
        elif dataclasses.is_dataclass(record) and not isinstance(record, type):
            row = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
        elif self.columns is None:
            raise SinkError(
                f"SqliteSink {self.path} table {self.table}: a {type(record).__name__} "
                f"record ({record!r:.100}) has no column names: give the sink "
                f"columns=[...] (a tuple's or list's values in that order; one name for "
                f"a single value), or write dicts")
        elif isinstance(record, tuple | list):
            if len(record) != len(self.columns):
                raise SinkError(
                    f"SqliteSink {self.path} table {self.table}: a record of "
                    f"{len(record)} values ({record!r:.100}) for {len(self.columns)} "
                    f"columns {list(self.columns)}")
            row = dict(zip(self.columns, record, strict=True))
        elif len(self.columns) == 1:
            row = {self.columns[0]: record}
        else:
            raise SinkError(
                f"SqliteSink {self.path} table {self.table}: a {type(record).__name__} "
                f"record ({record!r:.100}) for {len(self.columns)} columns "
                f"{list(self.columns)}: write a tuple or list of as many values, or a dict")
        if not row:
            raise SinkError(f"SqliteSink {self.path} table {self.table}: a record with no "
                            f"fields has no column to write")
        seen: set[str] = set()
        for key in row:
            if not isinstance(key, str) or not key:
                raise SinkError(
                    f"SqliteSink {self.path} table {self.table}: column names are "
                    f"non-empty strings; the record {record!r:.100} has the key {key!r}")
            if key.lower() in seen:
                raise SinkError(
                    f"SqliteSink {self.path} table {self.table}: the record "
                    f"{record!r:.100} has two keys that differ only in case, one column "
                    f"for SQLite")
            seen.add(key.lower())
        return {k: _plain(v) for k, v in row.items()}

    def _connect(self) -> Any:
        conn = open_database(self.path)
        with conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.staging} "
                         f"(txn TEXT NOT NULL, value TEXT NOT NULL)")
            conn.execute(f"CREATE INDEX IF NOT EXISTS {self.staging}_txn "
                         f"ON {self.staging} (txn)")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.committed} "
                         f"(txn TEXT PRIMARY KEY)")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.lineage} "
                         f"(id INTEGER PRIMARY KEY CHECK (id = 1), lineage TEXT NOT NULL, "
                         f"recorded_by TEXT NOT NULL, recorded_at TEXT NOT NULL)")
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

    def claim(self, context: SinkContext) -> None:
        """Record ``context.lineage`` in ``<table>_lineage`` if no lineage is recorded
        there; refuse another one, and a table in the layout of an earlier weir."""
        recorded_by = json.dumps({"uid": context.uid, "run_id": context.run_id,
                                  "subtask": context.subtask, "attempt": context.attempt})
        with self._locked() as conn:
            old = [(r[1], r[3]) for r in conn.execute(
                f"PRAGMA table_info({_quote(self.table)})").fetchall()]
            conn.execute(f"INSERT OR IGNORE INTO {self.lineage} "
                         f"(id, lineage, recorded_by, recorded_at) VALUES (1, ?, ?, ?)",
                         (context.lineage, recorded_by, _now()))
            (owner,) = conn.execute(f"SELECT lineage FROM {self.lineage} WHERE id = 1"
                                    ).fetchone()
        if old == [("txn", 1), ("value", 1)]:  # (NOT NULL: never a table of this layout)
            raise SinkLineageError(
                f"SqliteSink {context.uid!r}: table {self.table} of {self.path} was written "
                f"by an earlier weir, one JSON text per row (columns txn, value); this "
                f"sink writes one column per field. Nothing was written. Give the sink a "
                f"new table (or database), or move the old rows away and drop the tables "
                f"{self.table}, {self.staging}, {self.committed} and {self.lineage}.")
        if owner != context.lineage:
            raise SinkLineageError(
                f"SqliteSink {context.uid!r}: table {self.table} of {self.path} holds the "
                f"output of another lineage of jobs ({owner!r}, recorded in "
                f"{self.lineage}); this job's lineage is {context.lineage!r} — a fresh "
                f"start, without the checkpoints or a savepoint of the job that wrote it, "
                f"would commit that output a second time. Nothing was written. To continue "
                f"that job, restore it from its checkpoints or a savepoint; to start over, "
                f"drop the tables {self.table}, {self.staging}, {self.committed} and "
                f"{self.lineage} (or delete {self.path}), or give the sink a new table or "
                f"database.")

    def writer(self, context: SinkContext) -> SinkWriter[Any]:
        return _SqliteWriter(self, context)

    def commit(self, committables: list[Any]) -> None:
        # every subtask commits the recovered committables at once after a restore: the
        # write lock first, then claim each id (one claimed already is skipped)
        if not committables:
            return
        with self._locked() as conn:
            table = _Table(self, conn)
            for txn in committables:
                claimed = conn.execute(
                    f"INSERT OR IGNORE INTO {self.committed} (txn) VALUES (?)", (txn,))
                if claimed.rowcount != 1:
                    continue
                staged = conn.execute(f"SELECT value FROM {self.staging} WHERE txn = ? "
                                      f"ORDER BY rowid", (txn,)).fetchall()
                table.insert([msgpack.unpackb(v, raw=False, strict_map_key=False)
                              for (v,) in staged])
                conn.execute(f"DELETE FROM {self.staging} WHERE txn = ?", (txn,))

    def abort_attempts(self, context: SinkContext, keep: list[Any]) -> None:
        kept = set(keep)
        with self._locked() as conn:  # (read, then write: the lock first)
            rows = conn.execute(f"SELECT DISTINCT txn FROM {self.staging}").fetchall()
            for (txn,) in rows:
                if _left_over(txn, context) and txn not in kept:
                    conn.execute(f"DELETE FROM {self.staging} WHERE txn = ?", (txn,))


def sqlite_rows(conn: Any, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` (none if it does not exist) in insertion order, as dicts;
    the values of columns declared JSON decoded (what :class:`SqliteSink` writes there),
    every other value as SQLite holds it."""
    info = conn.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
    if not info:
        return []
    names = [r[1] for r in info]
    decode = [str(r[2]).upper() == "JSON" for r in info]
    out = []
    for values in conn.execute(f"SELECT * FROM {_quote(table)} ORDER BY rowid"):
        out.append({name: _decoded(v) if json_column else v
                    for name, v, json_column in zip(names, values, decode, strict=True)})
    return out


def _decoded(value: Any) -> Any:
    """A value of a JSON column: its JSON text decoded (a number SQLite's affinity
    made of it, or a text that is no JSON, as it is)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def read_sqlite_stream_sink(path: str | Path, *, table: str = "records") -> list[dict[str, Any]]:
    """Every committed row of a :class:`SqliteSink` table (or of a Spark ``weir-sqlite``
    table: the same layout), in commit order, as dicts of its columns (JSON columns
    decoded; none if the table does not exist). Raises
    :class:`~weir.errors.SinkError` if there is no database file at ``path``."""
    import sqlite3

    local = Path(path).expanduser().resolve()
    if not local.is_file():
        raise SinkError(f"SqliteSink: no database file at {local}; check the path")
    try:
        conn = sqlite3.connect(f"{local.as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as exc:
        raise SinkError(f"SqliteSink: cannot open {local}: {exc}") from exc
    try:
        return sqlite_rows(conn, table)
    except sqlite3.Error as exc:
        raise SinkError(f"SqliteSink: reading {table!r} in {local}: {exc}") from exc
    finally:
        conn.close()
