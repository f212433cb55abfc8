"""The continuous runtime's SQLite sink (:class:`SqliteSink`): records as rows of a
SQLite table, one column per field (a dict's keys; ``columns=`` for tuples), as the
Spark ``weir-sqlite`` sink writes them; exactly-once by two-phase commit through a
staging table, its lineage in ``<table>_lineage`` (see the class).
:func:`read_sqlite_stream_sink` reads it. Re-exported by :mod:`weir.connectors.stream`.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack

from weir.api.connectors import (
    Sink,
    SinkContext,
    SinkLineageError,
    SinkWriter,
)
from weir.connectors.sqlite_db import open_database
from weir.connectors.stream import _left_over, _now, _transaction
from weir.errors import ConfigurationError, SinkError

__all__ = ["SqliteSink", "read_sqlite_stream_sink", "sqlite_rows"]

log = logging.getLogger("weir")


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
