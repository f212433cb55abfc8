"""The ``weir-sqlite`` sink of the Spark (micro-batch) runtime,
:class:`SqliteDataSource`: one SQLite transaction publishes a batch (layout and
exactly-once argument in :mod:`weir.connectors.sinks`). Commit work does not grow
with past batches: every lookup is by primary key or index.

(``SQLiteSink``, its former name, is kept for one release with a
:class:`DeprecationWarning`: it differed only in letter case from the continuous
runtime's :class:`~weir.connectors.sqlite_stream.SqliteSink`.)"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    Row,
    ShortType,
    StructType,
)

from weir.connectors.common import (
    _CHUNK_ROWS,
    COMMITS_TABLE,
    DEFAULT_BUSY_TIMEOUT,
    LINEAGE_TABLE,
    SQLITE_SINK_NAME,
    STAGING_TABLE,
    _check_messages,
    _lineage_error,
    _now,
    _option,
    _query_of,
    _required_option,
    _row_json,
    _task_info,
    _TaskInfo,
)
from weir.errors import SinkError

# --------------------------------------------------------------------------- SQLite


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


_INTEGER_TYPES = (BooleanType, ByteType, ShortType, IntegerType, LongType)
_JSON_TYPES = (ArrayType, MapType, StructType)


def _sqlite_type(data_type: DataType) -> str:
    """The SQLite column type of a Spark type (see the module docstring)."""
    if isinstance(data_type, _INTEGER_TYPES):
        return "INTEGER"
    if isinstance(data_type, FloatType | DoubleType):
        return "REAL"
    if isinstance(data_type, BinaryType):
        return "BLOB"
    return "TEXT"  # strings, decimals, dates, timestamps, JSON of nested types, others


def _sqlite_value(value: Any, data_type: DataType) -> Any:
    """A staged JSON value as stored in the target table."""
    if value is None:
        return None
    if isinstance(data_type, BinaryType) and isinstance(value, str):
        return base64.b64decode(value)
    if isinstance(data_type, _JSON_TYPES):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if isinstance(data_type, BooleanType):
        return int(bool(value))
    if isinstance(data_type, DecimalType) and not isinstance(value, str):
        return str(value)
    return value


def _connect(path: str, timeout: float) -> sqlite3.Connection:
    """A connection in manual-transaction mode with a busy timeout and full fsync."""
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _ensure_meta(conn: sqlite3.Connection) -> None:
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {STAGING_TABLE} ("
        "attempt_id TEXT NOT NULL, table_name TEXT NOT NULL, batch_id INTEGER, "
        "partition_id INTEGER NOT NULL, seq INTEGER NOT NULL, payload TEXT NOT NULL)"
    )
    conn.execute(
        f"CREATE INDEX IF NOT EXISTS {STAGING_TABLE}_attempt ON {STAGING_TABLE}(attempt_id, seq)"
    )
    conn.execute(
        f"CREATE INDEX IF NOT EXISTS {STAGING_TABLE}_batch ON {STAGING_TABLE}(table_name, batch_id)"
    )
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {COMMITS_TABLE} ("
        "table_name TEXT NOT NULL, batch_id INTEGER NOT NULL, committed_at TEXT NOT NULL, "
        "row_count INTEGER NOT NULL, query_id TEXT, PRIMARY KEY (table_name, batch_id))"
    )
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {LINEAGE_TABLE} ("
        "table_name TEXT NOT NULL PRIMARY KEY, query_id TEXT, "
        "recorded_by_batch INTEGER NOT NULL, recorded_at TEXT NOT NULL)"
    )


def _table_exists(conn: sqlite3.Connection, table: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?", (table,)
    ).fetchone()
    return row is not None


@dataclass(frozen=True)
class SQLiteCommitMessage(WriterCommitMessage):
    """What a ``weir-sqlite`` task staged: returned by ``write``, named by ``commit``."""

    partition_id: int
    attempt_id: str
    batch_id: int | None
    query_id: str | None
    rows: int


class SQLiteSinkWriter(DataSourceStreamWriter):
    """The stream writer of :class:`SqliteDataSource` (tables: module docstring).

    ``write`` runs in the tasks and stages rows in ``_weir_staging``; ``commit`` and
    ``abort`` run on the driver, each in one transaction.
    """

    def __init__(
        self,
        path: str,
        table: str,
        schema: StructType,
        overwrite: bool = False,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        lowered = table.lower()
        if not table or lowered.startswith(("_weir_", "sqlite_")):
            raise SinkError(
                f"{SQLITE_SINK_NAME} sink at {path}: table name {table!r} is reserved "
                "(names starting with _weir_ or sqlite_); choose another table"
            )
        self.path = os.path.abspath(os.path.expanduser(path))
        self.table = table
        self.schema = schema
        self.overwrite = overwrite
        self.busy_timeout = busy_timeout

    @property
    def _where(self) -> str:
        return f"{SQLITE_SINK_NAME} sink {self.path} table {self.table!r}"

    def prepare(self) -> None:
        """Create the sink's bookkeeping tables, switch to WAL and check the target.

        Called on the driver when a query starts a batch, so that configuration errors
        surface before any task runs.
        """
        if not os.path.isdir(os.path.dirname(self.path)):
            raise SinkError(
                f"{self._where}: directory {os.path.dirname(self.path)} does not exist; "
                "create it or choose another database path"
            )
        try:
            conn = _connect(self.path, self.busy_timeout)
        except sqlite3.Error as exc:
            raise SinkError(f"{self._where}: cannot open the database: {exc}") from exc
        try:
            # WAL lets tasks stage while others read; if another connection is busy
            # the switch fails, which is harmless (WAL is an optimisation only).
            with contextlib.suppress(sqlite3.OperationalError):
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN IMMEDIATE")
            _ensure_meta(conn)
            self._check_target(conn)
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise SinkError(f"{self._where}: preparing the database failed: {exc}") from exc
            raise
        finally:
            conn.close()

    def _check_target(self, conn: sqlite3.Connection) -> bool:
        """Whether the target table exists; raise if it lacks a column of the schema."""
        if not _table_exists(conn, self.table):
            return False
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({_quote(self.table)})")}
        missing = [f.name for f in self.schema.fields if f.name not in columns]
        if missing:
            raise SinkError(
                f"{self._where}: the existing table has no column(s) {missing} of the "
                "stream's schema; write to a new table or add the columns"
            )
        return True

    # ---- tasks

    def write(self, iterator: Iterator[Row]) -> SQLiteCommitMessage:
        """Stage this partition's rows in ``_weir_staging`` under a fresh attempt id."""
        info = _task_info()
        rows = 0
        try:
            conn = _connect(self.path, self.busy_timeout)
        except sqlite3.Error as exc:
            raise self._write_error(info, exc) from exc
        try:
            chunk: list[tuple[Any, ...]] = []
            for row in iterator:
                chunk.append(
                    (
                        info.attempt_id,
                        self.table,
                        info.batch_id,
                        info.partition_id,
                        rows,
                        _row_json(row),
                    )
                )
                rows += 1
                if len(chunk) >= _CHUNK_ROWS:
                    self._stage(conn, chunk)
                    chunk = []
            if chunk:
                self._stage(conn, chunk)
        except sqlite3.Error as exc:
            raise self._write_error(info, exc) from exc
        finally:
            conn.close()
        return SQLiteCommitMessage(
            info.partition_id, info.attempt_id, info.batch_id, info.query_id, rows
        )

    def _stage(self, conn: sqlite3.Connection, chunk: list[tuple[Any, ...]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            _ensure_meta(conn)
            conn.executemany(
                f"INSERT INTO {STAGING_TABLE} (attempt_id, table_name, batch_id, "
                "partition_id, seq, payload) VALUES (?, ?, ?, ?, ?, ?)",
                chunk,
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _write_error(self, info: _TaskInfo, exc: Exception) -> SinkError:
        return SinkError(
            f"{self._where}: staging partition {info.partition_id} of batch {info.batch_id} "
            f"failed: {exc}. If the database is locked, raise option busyTimeout "
            f"(now {self.busy_timeout:g} s); Spark retries the task or the batch."
        )

    # ---- driver

    def _delete_staged(
        self, conn: sqlite3.Connection, attempts: Iterable[str], batch_id: int
    ) -> None:
        conn.executemany(
            f"DELETE FROM {STAGING_TABLE} WHERE attempt_id = ?", [(a,) for a in attempts]
        )
        conn.execute(
            f"DELETE FROM {STAGING_TABLE} WHERE table_name = ? AND batch_id = ?",
            (self.table, batch_id),
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """In one transaction: insert the named attempts' rows and record ``batchId``.

        If ``batchId`` is already recorded for the table (a replay after a crash), only
        the staged rows are deleted. An empty batch is not recorded: in append mode it
        changes nothing (but creates the table if missing); in complete mode it empties
        the table.
        """
        staged: list[SQLiteCommitMessage] = _check_messages(
            messages, SQLiteCommitMessage, batchId, self._where
        )
        query_id = _query_of(staged)
        try:
            conn = _connect(self.path, self.busy_timeout)
        except sqlite3.Error as exc:
            raise SinkError(f"{self._where}: cannot open the database: {exc}") from exc
        try:
            conn.execute("BEGIN IMMEDIATE")
            _ensure_meta(conn)
            self._check_lineage(conn, batchId, query_id)
            done = conn.execute(
                f"SELECT 1 FROM {COMMITS_TABLE} WHERE table_name = ? AND batch_id = ?",
                (self.table, batchId),
            ).fetchone()
            has_rows = any(m.rows for m in staged)
            if done is None and (has_rows or self.overwrite or not _table_exists(conn, self.table)):
                total = self._insert(conn, staged, batchId)
                if has_rows:
                    conn.execute(
                        f"INSERT INTO {COMMITS_TABLE} (table_name, batch_id, committed_at, "
                        "row_count, query_id) VALUES (?, ?, ?, ?, ?)",
                        (self.table, batchId, _now(), total, query_id),
                    )
            self._delete_staged(conn, (m.attempt_id for m in staged), batchId)
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise SinkError(
                    f"{self._where}: commit of batch {batchId} failed and was rolled back: "
                    f"{exc}. Restart the query from its checkpoint to retry."
                ) from exc
            raise
        finally:
            conn.close()

    def _check_lineage(self, conn: sqlite3.Connection, batch_id: int, query_id: str | None) -> None:
        """Refuse a batch of a query other than the table's in ``_weir_lineage``; record
        the query there (in the commit's transaction) if the table has no query yet."""
        row = conn.execute(
            f"SELECT query_id FROM {LINEAGE_TABLE} WHERE table_name = ?", (self.table,)
        ).fetchone()
        if row is not None:
            stored = row[0]
        else:  # a table from before _weir_lineage (or a new one): one search, once
            newest = conn.execute(
                f"SELECT query_id FROM {COMMITS_TABLE} WHERE table_name = ? AND query_id IS "
                "NOT NULL ORDER BY batch_id DESC LIMIT 1",
                (self.table,),
            ).fetchone()
            stored = newest[0] if newest is not None else None
        if query_id is not None and stored is not None and stored != query_id:
            raise _lineage_error(
                self._where, batch_id, stored, query_id, "Write the new query to a new table"
            )
        if row is None or (stored is None and query_id is not None):
            conn.execute(
                f"INSERT OR REPLACE INTO {LINEAGE_TABLE} (table_name, query_id, "
                "recorded_by_batch, recorded_at) VALUES (?, ?, ?, ?)",
                (self.table, stored if stored is not None else query_id, batch_id, _now()),
            )

    def _insert(
        self, conn: sqlite3.Connection, messages: list[SQLiteCommitMessage], batch_id: int
    ) -> int:
        fields = self.schema.fields
        if not self._check_target(conn):
            columns_ddl = ", ".join(f"{_quote(f.name)} {_sqlite_type(f.dataType)}" for f in fields)
            conn.execute(f"CREATE TABLE {_quote(self.table)} ({columns_ddl})")
        if self.overwrite:
            conn.execute(f"DELETE FROM {_quote(self.table)}")
        if not fields:
            return 0
        insert = (
            f"INSERT INTO {_quote(self.table)} ({', '.join(_quote(f.name) for f in fields)}) "
            f"VALUES ({', '.join('?' for _ in fields)})"
        )
        total = 0
        for message in sorted(messages, key=lambda m: m.partition_id):
            cursor = conn.execute(
                f"SELECT payload FROM {STAGING_TABLE} WHERE attempt_id = ? ORDER BY seq",
                (message.attempt_id,),
            )
            found = 0
            while chunk := cursor.fetchmany(_CHUNK_ROWS):
                values = []
                for (payload,) in chunk:
                    record = json.loads(payload)
                    values.append(
                        tuple(_sqlite_value(record.get(f.name), f.dataType) for f in fields)
                    )
                conn.executemany(insert, values)
                found += len(chunk)
            if found != message.rows:
                raise SinkError(
                    f"{self._where}: partition {message.partition_id} of batch {batch_id} "
                    f"staged {message.rows} rows but {found} are in {STAGING_TABLE} "
                    "(deleted by an abort or by hand?); nothing was committed. Restart the "
                    "query from its checkpoint to re-run the batch."
                )
            total += found
        return total

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Delete the rows staged for batch ``batchId`` (committed rows are untouched).

        Spark usually passes ``None`` for every task here, so all staging rows of the
        table's batch are deleted, not only those of the attempts named.
        """
        attempts = [m.attempt_id for m in messages if isinstance(m, SQLiteCommitMessage)]
        try:
            conn = _connect(self.path, self.busy_timeout)
            try:
                conn.execute("BEGIN IMMEDIATE")
                _ensure_meta(conn)
                self._delete_staged(conn, attempts, batchId)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise SinkError(
                f"{self._where}: abort of batch {batchId} could not delete staged rows: "
                f"{exc}. They are invisible and are removed when the batch is committed."
            ) from exc


class SqliteDataSource(DataSource):
    """``weir-sqlite``: exactly-once rows in a SQLite table, one transaction per batch
    (a PySpark data source of the micro-batch runtime; the continuous runtime's sink is
    :class:`~weir.connectors.sqlite_stream.SqliteSink`, the same table layout).

    Options: ``path`` (database file), ``table``, ``busyTimeout`` (seconds, default 60).
    Append and complete output mode. Tables and the exactly-once argument are in
    :mod:`weir.connectors.sinks`.
    """

    @classmethod
    def name(cls) -> str:
        """The format name, ``"weir-sqlite"``."""
        return SQLITE_SINK_NAME

    def streamWriter(self, schema: StructType, overwrite: bool) -> SQLiteSinkWriter:
        """The writer of one micro-batch (Spark calls this on the driver); prepares the
        database so that a bad path or table fails the query before any task runs."""
        path = _required_option(self.options, "path", SQLITE_SINK_NAME)
        table = _required_option(self.options, "table", SQLITE_SINK_NAME)
        raw_timeout = _option(self.options, "busyTimeout") or str(DEFAULT_BUSY_TIMEOUT)
        try:
            timeout = float(raw_timeout)
        except ValueError:
            timeout = -1.0
        if not timeout >= 0:
            raise SinkError(
                f"{SQLITE_SINK_NAME} sink at {path}: option busyTimeout={raw_timeout!r} is "
                "not a number of seconds >= 0"
            )
        writer = SQLiteSinkWriter(path, table, schema, overwrite, timeout)
        writer.prepare()
        return writer

    @staticmethod
    def committed_batches(path: str, table: str) -> list[int]:
        """The batch ids committed into ``table`` of database ``path``, ascending."""
        return committed_sqlite_batches(path, table)


def _open_read_only(path: str) -> sqlite3.Connection:
    local = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(local):
        raise SinkError(f"{SQLITE_SINK_NAME} sink: no database file at {local}; check the path")
    try:
        return sqlite3.connect(f"{Path(local).as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as exc:
        raise SinkError(f"{SQLITE_SINK_NAME} sink: cannot open {local}: {exc}") from exc


def committed_sqlite_batches(path: str, table: str) -> list[int]:
    """The batch ids a ``weir-sqlite`` sink committed into ``table``, ascending."""
    conn = _open_read_only(path)
    try:
        if not _table_exists(conn, COMMITS_TABLE):
            return []
        rows = conn.execute(
            f"SELECT batch_id FROM {COMMITS_TABLE} WHERE table_name = ? ORDER BY batch_id",
            (table,),
        ).fetchall()
        return [int(r[0]) for r in rows]
    except sqlite3.Error as exc:
        raise SinkError(f"{SQLITE_SINK_NAME} sink: reading {path}: {exc}") from exc
    finally:
        conn.close()


def read_sqlite_sink(path: str, table: str) -> list[dict[str, Any]]:
    """All committed rows of ``table``, in insertion (batch, then partition) order, as
    dicts of its columns. Reads the tables of the continuous runtime's
    :class:`~weir.connectors.sqlite_stream.SqliteSink` too (the same layout; their columns
    declared JSON are decoded, as :func:`~weir.connectors.sqlite_stream.read_sqlite_stream_sink`
    does)."""
    from weir.connectors.sqlite_stream import sqlite_rows

    conn = _open_read_only(path)
    try:
        return sqlite_rows(conn, table)
    except sqlite3.Error as exc:
        raise SinkError(f"{SQLITE_SINK_NAME} sink: reading {table!r} in {path}: {exc}") from exc
    finally:
        conn.close()


def __getattr__(name: str) -> Any:
    if name == "SQLiteSink":  # (its name until this release)
        import warnings

        warnings.warn("weir.connectors.sqlite.SQLiteSink is deprecated: use "
                      "weir.connectors.spark.SqliteDataSource (the Spark 'weir-sqlite' "
                      "data source; weir.connectors.SqliteSink is the continuous runtime's "
                      "sink)", DeprecationWarning, stacklevel=2)
        return SqliteDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
