"""Exactly-once (two-phase-commit) sinks for Spark Structured Streaming.

Both sinks are PySpark Python data sources (:mod:`pyspark.sql.datasource`) with a
:class:`~pyspark.sql.datasource.DataSourceStreamWriter`. Register them once per
session with :func:`register_sinks`, then::

    query = (
        df.writeStream.format("weir-files")          # or "weir-sqlite"
        .option("path", "/data/out")                  # weir-sqlite: path=<db file>
        # .option("table", "events")                  # weir-sqlite only
        .option("checkpointLocation", "/chk/q1")
        .start()
    )

How PySpark drives a stream writer (observed on PySpark 4.3, local mode)
-----------------------------------------------------------------------
* For every micro-batch the driver calls ``DataSource.streamWriter(schema, overwrite)``
  in a Python planner process, pickles the writer and ships it to the tasks; each
  task calls ``write(rows)`` once per partition and returns a pickled commit message.
* ``commit(messages, batchId)`` and ``abort(messages, batchId)`` run on the driver, in
  *another* Python process, on a *new* writer made by a second ``streamWriter`` call:
  nothing written to ``self`` in ``write`` is visible there.
* ``write`` gets no batch id argument, but the task's local properties carry it:
  ``TaskContext.get().getLocalProperty("streaming.sql.batchId")``, and the stable
  streaming query id (the one kept in the Spark checkpoint) as
  ``"sql.streaming.queryId"``. The driver-side ``commit`` has no ``TaskContext`` and no
  query id, so the sinks carry both from ``write`` to ``commit`` in the commit messages.
* ``commit`` gets one message per partition, also for empty partitions.
* ``abort`` is called when a task fails, when ``commit`` raises, and when the query is
  stopped in the middle of a batch - and then it usually gets ``[None, None, ...]``
  (messages of the tasks that did succeed are *not* passed on), sometimes while
  tasks of the batch are still running. Abort therefore also cleans up by batch id,
  and the next successful commit of the batch id sweeps whatever is left.
* ``overwrite`` is ``True`` in ``complete`` output mode and ``False`` in ``append``
  mode; ``update`` mode is rejected by Spark for Python data sources.

The exactly-once argument
-------------------------
Spark logs the offsets of micro-batch *N* before running it and records *N* in its
commit log only after the sink's ``commit(messages, N)`` returned. After a crash it
re-runs the last logged-but-uncommitted batch with the *same* id and the same offsets.
So with a replayable source each batch id reaches the sink at least once, and the
sinks make ``commit`` idempotent per batch id:

1. ``write`` only *stages* rows under an attempt-unique name that no reader looks at.
   A task that fails or is killed leaves staged garbage, never visible output.
2. ``commit(messages, N)`` publishes exactly the staged attempts named in the messages,
   and records *N* as committed, in one atomic step (a directory rename; one SQLite
   transaction). A crash before that step leaves nothing visible; a crash after it
   leaves the whole batch visible.
3. If *N* is already recorded, ``commit`` only deletes the newly staged data. A crash
   after the sink's commit but before Spark's commit log therefore does not duplicate
   the batch when Spark replays it.

Known limitation: one sink location per query lineage
-----------------------------------------------------
Idempotence is keyed by batch id, and batch ids restart at 0 with a fresh Spark
checkpoint. Like Spark's own file sink, a sink path (``weir-files``) or a table
(``weir-sqlite``) therefore belongs to one streaming query: a new query with a new
checkpoint must write to a new path or table, or its first batches would be
mistaken for replays and silently dropped. Both sinks store the Spark query id with
every committed batch and refuse (:class:`~weir.errors.SinkError`) a commit whose
query id differs from the newest one recorded for the location. Rows written outside
Spark (no ``TaskContext``, no query id) are not checked. Two queries running at the
same time against one location are not supported.

``weir-files``: :class:`TransactionalFileSink`
----------------------------------------------
Option ``path``: a local directory (or a ``file://`` URL); on a cluster, a POSIX
filesystem mounted at the same path on the driver and all executors. The publish step
relies on an atomic directory rename, which object stores (``s3://`` ...) do not have;
other fsspec URLs are refused. Append output mode only. Layout::

    <path>/
      batch=0/                      one directory per committed batch, published by rename
        _manifest.json              batch id, query id, commit time, files, row counts, schema
        part-00000-<attempt>.jsonl  one file per non-empty partition, JSON lines
        part-00001-<attempt>.jsonl
      batch=1/ ...
      _staging/batch=<N>/part-<partition>-<attempt>.jsonl   staged by write(); invisible
      _staging/unbatched/...        staged outside Spark (no batch id known in write())
      .batch=<N>.tmp-<uuid>/        a commit in progress (or crashed); invisible

Rows are ``row.asDict(recursive=True)``, one JSON object per line, with values made
JSON-safe: dates, times and timestamps as ISO-8601 strings (``TimestampType`` is the
naive local-time ``datetime`` PySpark hands to Python), decimals as strings, binary
as base64 strings, day-time intervals as seconds, map keys as strings. Directories
and files starting with ``_`` or ``.`` are ignored by readers, including Spark's:
``spark.read.json(path)`` reads the committed batches with a ``batch`` partition
column. ``commit`` moves the staged files into ``.batch=<N>.tmp-<uuid>/``, writes
``_manifest.json``, fsyncs, renames the directory to ``batch=<N>/`` and fsyncs
``<path>``.

``weir-sqlite``: :class:`SQLiteSink`
------------------------------------
Options ``path`` (the database file; created if missing, its directory must exist),
``table`` (the target table; created from the stream's schema if missing) and
``busyTimeout`` (seconds to wait for a lock, default 60). Every task and the driver
open the database file, so this is a sink for local mode (or one machine). Works in
append and complete output mode (complete: the commit transaction replaces the
table's rows). The database is switched to WAL journal mode. Tables::

    <table>(<one column per field>)      target: INTEGER for booleans and integers,
                                         REAL for floats, BLOB for binary, TEXT for
                                         strings, decimals (exact), dates and timestamps
                                         (ISO-8601) and JSON for arrays, maps, structs
    _weir_staging(attempt_id, table_name, batch_id, partition_id, seq, payload)
                                         staged rows (payload: the row as a JSON object)
    _weir_commits(table_name, batch_id, committed_at, row_count, query_id,
                  PRIMARY KEY (table_name, batch_id))

``_weir_commits`` is keyed by table *and* batch id, so several sinks (queries) can
share one database file, each with its own table. ``write`` stages a partition's
rows in one transaction (partitions over 10,000 rows: one per 10,000 rows; staged rows
only count once ``write`` has returned its message). ``commit`` is one ``BEGIN
IMMEDIATE`` transaction: check ``_weir_commits``; if the batch is new, create the
table if needed, copy the staged rows of exactly the named attempts (in partition
order), record the batch and delete the batch's staging rows; if it is already
there, only delete the staging rows.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import json
import os
import re
import shutil
import sqlite3
import uuid
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

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

from weir.errors import SinkError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "FILE_SINK_NAME",
    "SQLITE_SINK_NAME",
    "FileCommitMessage",
    "FileSinkWriter",
    "SQLiteCommitMessage",
    "SQLiteSink",
    "SQLiteSinkWriter",
    "TransactionalFileSink",
    "committed_file_batches",
    "committed_sqlite_batches",
    "read_file_sink",
    "read_sqlite_sink",
    "register_sinks",
]

FILE_SINK_NAME = "weir-files"
"""Format name of :class:`TransactionalFileSink` (``df.writeStream.format(...)``)."""

SQLITE_SINK_NAME = "weir-sqlite"
"""Format name of :class:`SQLiteSink` (``df.writeStream.format(...)``)."""

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"

STAGING_DIR = "_staging"
UNBATCHED_DIR = "unbatched"
MANIFEST = "_manifest.json"
FILE_FORMAT = "weir-files/1"
_BATCH_DIR = re.compile(r"batch=(\d+)")
_TMP_PREFIX = "."

STAGING_TABLE = "_weir_staging"
COMMITS_TABLE = "_weir_commits"
DEFAULT_BUSY_TIMEOUT = 60.0
_CHUNK_ROWS = 10_000


# --------------------------------------------------------------------------- shared


@dataclass(frozen=True, slots=True)
class _TaskInfo:
    """What ``write`` knows about the task it runs in."""

    partition_id: int
    attempt_id: str
    batch_id: int | None
    query_id: str | None


def _task_info() -> _TaskInfo:
    """Partition, a fresh attempt id, batch id and query id of the running Spark task.

    Outside a Spark task (``TaskContext.get()`` is ``None``, e.g. in unit tests) the
    partition is 0 and the batch and query ids are unknown.
    """
    from pyspark import TaskContext

    attempt = uuid.uuid4().hex
    ctx = TaskContext.get()
    if ctx is None:
        return _TaskInfo(0, attempt, None, None)
    try:
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY)
    except AttributeError:  # a TaskContext without local properties
        batch = query = None
    partition = ctx.partitionId()
    return _TaskInfo(
        partition if partition is not None else 0,
        attempt,
        int(batch) if batch is not None else None,
        query,
    )


def _json_key(key: Any) -> str:
    safe = _json_safe(key)
    return safe if isinstance(safe, str) else json.dumps(safe, sort_keys=True)


def _json_safe(value: Any) -> Any:
    """``value`` (a field of a PySpark row) as plain JSON types."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Row):
        return {k: _json_safe(v) for k, v in value.asDict(recursive=True).items()}
    if isinstance(value, dict):
        return {_json_key(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if isinstance(value, _dt.datetime | _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    return str(value)


def _row_json(row: Row) -> str:
    """One row as a compact JSON object."""
    record = {k: _json_safe(v) for k, v in row.asDict(recursive=True).items()}
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _option(options: MutableMapping[str, str], name: str) -> str | None:
    """Option ``name``, case-insensitively (Spark passes a case-insensitive mapping)."""
    value = options.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in options.items() if k.lower() == lowered), None)
    return value


def _required_option(options: MutableMapping[str, str], name: str, sink: str) -> str:
    value = _option(options, name)
    if value is None or not str(value).strip():
        raise SinkError(
            f"{sink} sink: option {name!r} is missing; set it with "
            f".option({name!r}, ...) on writeStream"
        )
    return str(value)


def _check_messages(
    messages: Sequence[WriterCommitMessage | None], kind: type[Any], batch_id: int, where: str
) -> list[Any]:
    """The commit messages, all present, of ``kind``, and all of batch ``batch_id``."""
    checked: list[Any] = []
    for index, message in enumerate(messages):
        if message is None:
            raise SinkError(
                f"{where}: commit of batch {batch_id} got no commit message for task "
                f"{index}, so the batch is incomplete; nothing was published. Spark "
                "retries the batch when the query is restarted from its checkpoint."
            )
        if not isinstance(message, kind):
            raise SinkError(
                f"{where}: commit of batch {batch_id} got a {type(message).__name__}, "
                f"not a {kind.__name__}; is the query writing to another sink's location?"
            )
        if message.batch_id is not None and message.batch_id != batch_id:
            raise SinkError(
                f"{where}: commit of batch {batch_id} got rows staged for batch "
                f"{message.batch_id}; nothing was published"
            )
        checked.append(message)
    return checked


def _query_of(messages: Iterable[Any]) -> str | None:
    for message in messages:
        if message is not None and message.query_id is not None:
            return str(message.query_id)
    return None


def _lineage_error(where: str, batch_id: int, stored: str, query_id: str, fix: str) -> SinkError:
    return SinkError(
        f"{where} holds the output of streaming query {stored}, but batch {batch_id} comes "
        f"from query {query_id}. Batch ids restart at 0 with a new checkpoint, so this "
        "query's batches would be taken for replays and dropped; nothing was written. "
        f"{fix}, or restart the original query with its original checkpoint."
    )


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


# --------------------------------------------------------------------------- files


def _local_root(path: str) -> Path:
    """The local directory of a ``path`` option (plain path or ``file://`` URL)."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        local = parsed.path if parsed.scheme == "file" else path
        return Path(os.path.abspath(os.path.expanduser(local)))
    if len(parsed.scheme) == 1:  # a Windows drive letter, not a URL scheme
        return Path(os.path.abspath(path))
    raise SinkError(
        f"{FILE_SINK_NAME} sink: path {path!r} is on {parsed.scheme!r}; the sink publishes "
        "a batch by renaming a directory, which is atomic only on a local filesystem. "
        "Use a local directory (or a file:// URL)."
    )


def _fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _batch_dirs(root: Path) -> list[tuple[int, Path]]:
    """The published ``batch=<N>`` directories under ``root``, in batch order."""
    found: list[tuple[int, Path]] = []
    with os.scandir(root) as entries:
        for entry in entries:
            match = _BATCH_DIR.fullmatch(entry.name)
            if match and entry.is_dir():
                found.append((int(match.group(1)), Path(entry.path)))
    found.sort()
    return found


def _read_manifest(batch_dir: Path) -> dict[str, Any]:
    manifest = batch_dir / MANIFEST
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SinkError(
            f"{FILE_SINK_NAME} sink: committed batch {batch_dir} has no readable {MANIFEST} "
            f"({exc}); the directory was changed after it was published"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
        raise SinkError(f"{FILE_SINK_NAME} sink: {manifest} is not a {FILE_FORMAT} manifest")
    return data


@dataclass(frozen=True)
class FileCommitMessage(WriterCommitMessage):
    """What a ``weir-files`` task staged: returned by ``write``, named by ``commit``.

    ``staged_file`` is relative to the sink root (``None`` for an empty partition).
    """

    partition_id: int
    attempt_id: str
    batch_id: int | None
    query_id: str | None
    staged_file: str | None
    rows: int


class FileSinkWriter(DataSourceStreamWriter):
    """The stream writer of :class:`TransactionalFileSink` (layout: module docstring).

    ``write`` runs in the tasks and stages one JSON-lines file per partition;
    ``commit``/``abort`` run on the driver.
    """

    def __init__(self, path: str, schema: StructType) -> None:
        self.path = path
        self.root = _local_root(path)
        self.schema = schema

    # ---- tasks

    def write(self, iterator: Iterator[Row]) -> FileCommitMessage:
        """Stage this partition's rows in an attempt-unique file, fsynced; return its name."""
        info = _task_info()
        sub = f"batch={info.batch_id}" if info.batch_id is not None else UNBATCHED_DIR
        stage_dir = self.root / STAGING_DIR / sub
        name = f"part-{info.partition_id:05d}-{info.attempt_id}.jsonl"
        target = stage_dir / name
        rows = 0
        out = None
        try:
            for row in iterator:
                if out is None:
                    stage_dir.mkdir(parents=True, exist_ok=True)
                    out = open(target, "x", encoding="utf-8")  # noqa: SIM115 - closed below
                out.write(_row_json(row))
                out.write("\n")
                rows += 1
            if out is not None:
                out.flush()
                os.fsync(out.fileno())
                out.close()
                out = None
                _fsync_dir(stage_dir)
        except BaseException as exc:
            if out is not None:
                out.close()
            target.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise SinkError(
                    f"{FILE_SINK_NAME} sink: staging partition {info.partition_id} of batch "
                    f"{info.batch_id} in {target} failed: {exc}. Check that the sink path "
                    "is writable and has free space; Spark retries the task or the batch."
                ) from exc
            raise
        staged = f"{STAGING_DIR}/{sub}/{name}" if rows else None
        return FileCommitMessage(
            info.partition_id, info.attempt_id, info.batch_id, info.query_id, staged, rows
        )

    # ---- driver

    def _staged_path(self, message: FileCommitMessage) -> Path | None:
        if message.staged_file is None:
            return None
        staged = (self.root / message.staged_file).resolve()
        staging = (self.root / STAGING_DIR).resolve()
        if staging not in staged.parents:
            raise SinkError(
                f"{FILE_SINK_NAME} sink at {self.root}: commit message names "
                f"{message.staged_file!r}, which is not under {STAGING_DIR}/"
            )
        return staged

    def _discard(self, messages: Iterable[FileCommitMessage | None], batch_id: int) -> None:
        """Delete the staged files of ``messages`` and the staging directory of the batch."""
        for message in messages:
            if isinstance(message, FileCommitMessage):
                staged = self._staged_path(message)
                if staged is not None:
                    staged.unlink(missing_ok=True)
        shutil.rmtree(self.root / STAGING_DIR / f"batch={batch_id}", ignore_errors=True)

    def _check_lineage(self, batch_id: int, query_id: str | None) -> None:
        if query_id is None:
            return
        stored = None
        for _, batch_dir in reversed(_batch_dirs(self.root)):  # newest batch with a query id
            stored = _read_manifest(batch_dir).get("query_id")
            if stored is not None:
                break
        if stored is not None and stored != query_id:
            raise _lineage_error(
                f"{FILE_SINK_NAME} sink path {self.root}",
                batch_id,
                stored,
                query_id,
                "Write the new query to a new path",
            )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Publish the staged files of ``messages`` as ``<path>/batch=<batchId>/``, once.

        If the batch is already published (a replay after a crash), only deletes the
        newly staged files.
        """
        where = f"{FILE_SINK_NAME} sink at {self.root}"
        staged_messages: list[FileCommitMessage] = _check_messages(
            messages, FileCommitMessage, batchId, where
        )
        final = self.root / f"batch={batchId}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            query_id = _query_of(staged_messages)
            self._check_lineage(batchId, query_id)
            if final.is_dir():
                self._discard(staged_messages, batchId)
                return
            self._publish(staged_messages, batchId, query_id, final)
        except OSError as exc:
            raise SinkError(
                f"{where}: commit of batch {batchId} failed: {exc}. Nothing of the batch is "
                f"visible unless batch={batchId}/ exists; restart the query from its "
                "checkpoint to retry (a published batch is not written twice)."
            ) from exc
        shutil.rmtree(self.root / STAGING_DIR / f"batch={batchId}", ignore_errors=True)

    def _publish(
        self, messages: list[FileCommitMessage], batch_id: int, query_id: str | None, final: Path
    ) -> None:
        # Leftovers of an earlier commit of this batch that crashed before its rename.
        tmp_prefix = f"{_TMP_PREFIX}batch={batch_id}.tmp-"
        for entry in os.scandir(self.root):
            if entry.name.startswith(tmp_prefix):
                shutil.rmtree(entry.path, ignore_errors=True)
        staged: list[tuple[FileCommitMessage, Path]] = []
        for message in sorted(messages, key=lambda m: m.partition_id):
            path = self._staged_path(message)
            if path is None:
                continue
            if not path.is_file():  # checked before anything moves
                raise SinkError(
                    f"{FILE_SINK_NAME} sink at {self.root}: staged file {path} of partition "
                    f"{message.partition_id}, batch {batch_id} is missing (deleted by an "
                    "abort or by hand?); nothing was published. Restart the query from its "
                    "checkpoint to re-run the batch."
                )
            staged.append((message, path))
        tmp = self.root / f"{tmp_prefix}{uuid.uuid4().hex}"
        tmp.mkdir()
        files: list[dict[str, Any]] = []
        for message, path in staged:
            os.rename(path, tmp / path.name)
            files.append(
                {
                    "name": path.name,
                    "partition": message.partition_id,
                    "attempt": message.attempt_id,
                    "rows": message.rows,
                }
            )
        manifest = {
            "format": FILE_FORMAT,
            "batch_id": batch_id,
            "query_id": query_id,
            "committed_at": _now(),
            "rows": sum(f["rows"] for f in files),
            "files": files,
            "schema": self.schema.jsonValue(),
        }
        with open(tmp / MANIFEST, "x", encoding="utf-8") as out:
            json.dump(manifest, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        _fsync_dir(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if final.is_dir():  # published meanwhile: the batch is there once already
                shutil.rmtree(tmp, ignore_errors=True)
                return
            raise
        _fsync_dir(self.root)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Delete the files staged for batch ``batchId`` (never published batches).

        Spark usually passes ``None`` for every task here, so the whole staging
        directory of the batch is removed, not only the files named.
        """
        try:
            self._discard([m for m in messages if isinstance(m, FileCommitMessage)], batchId)
        except OSError as exc:
            raise SinkError(
                f"{FILE_SINK_NAME} sink at {self.root}: abort of batch {batchId} could not "
                f"delete staged files: {exc}. They are invisible to readers and are removed "
                "when the batch is committed."
            ) from exc


class TransactionalFileSink(DataSource):
    """``weir-files``: exactly-once JSON-lines files, one directory per micro-batch.

    Options: ``path`` (local directory or ``file://`` URL). Append output mode only.
    The layout and the exactly-once argument are in :mod:`weir.connectors.sinks`.
    """

    @classmethod
    def name(cls) -> str:
        """The format name, ``"weir-files"``."""
        return FILE_SINK_NAME

    def streamWriter(self, schema: StructType, overwrite: bool) -> FileSinkWriter:
        """The writer of one micro-batch (Spark calls this on the driver)."""
        path = _required_option(self.options, "path", FILE_SINK_NAME)
        if overwrite:
            raise SinkError(
                f"{FILE_SINK_NAME} sink at {path}: complete output mode is not supported "
                "(every batch is a new directory, readers would see all of them); use "
                f"outputMode('append'), or {SQLITE_SINK_NAME} for complete mode"
            )
        return FileSinkWriter(path, schema)

    @staticmethod
    def committed_batches(path: str) -> list[int]:
        """The batch ids published under ``path``, ascending."""
        return committed_file_batches(path)


def committed_file_batches(path: str) -> list[int]:
    """The batch ids a ``weir-files`` sink has published under ``path``, ascending."""
    root = _local_root(path)
    if not root.is_dir():
        raise SinkError(f"{FILE_SINK_NAME} sink: no directory at {root}; check the path")
    return [batch for batch, _ in _batch_dirs(root)]


def read_file_sink(path: str) -> list[dict[str, Any]]:
    """All committed rows of a ``weir-files`` sink, in batch order, then partition order.

    Rows are the JSON objects as written (see the module docstring for how values are
    encoded); staged and in-progress data is never included.
    """
    root = _local_root(path)
    if not root.is_dir():
        raise SinkError(f"{FILE_SINK_NAME} sink: no directory at {root}; check the path")
    rows: list[dict[str, Any]] = []
    for _, batch_dir in _batch_dirs(root):
        manifest = _read_manifest(batch_dir)
        for entry in manifest["files"]:
            data_file = batch_dir / entry["name"]
            try:
                with open(data_file, encoding="utf-8") as lines:
                    batch_rows = [json.loads(line) for line in lines if line.strip()]
            except (OSError, ValueError) as exc:
                raise SinkError(
                    f"{FILE_SINK_NAME} sink: cannot read committed file {data_file}: {exc}"
                ) from exc
            if len(batch_rows) != entry["rows"]:
                raise SinkError(
                    f"{FILE_SINK_NAME} sink: {data_file} has {len(batch_rows)} rows, its "
                    f"manifest says {entry['rows']}; the file was changed after publishing"
                )
            rows.extend(batch_rows)
    return rows


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
    """The stream writer of :class:`SQLiteSink` (tables: module docstring).

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
        the staged rows are deleted.
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
            if done is None:
                total = self._insert(conn, staged, batchId)
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
        if query_id is None:
            return
        row = conn.execute(
            f"SELECT query_id FROM {COMMITS_TABLE} WHERE table_name = ? AND query_id IS NOT "
            "NULL ORDER BY batch_id DESC LIMIT 1",
            (self.table,),
        ).fetchone()
        if row is not None and row[0] != query_id:
            raise _lineage_error(
                self._where, batch_id, row[0], query_id, "Write the new query to a new table"
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


class SQLiteSink(DataSource):
    """``weir-sqlite``: exactly-once rows in a SQLite table, one transaction per batch.

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
    """All committed rows of ``table``, in insertion (batch, then partition) order."""
    conn = _open_read_only(path)
    conn.row_factory = sqlite3.Row
    try:
        if not _table_exists(conn, table):
            return []
        rows = conn.execute(f"SELECT * FROM {_quote(table)} ORDER BY rowid").fetchall()
        return [dict(r) for r in rows]
    except sqlite3.Error as exc:
        raise SinkError(f"{SQLITE_SINK_NAME} sink: reading {table!r} in {path}: {exc}") from exc
    finally:
        conn.close()


# --------------------------------------------------------------------------- registration


def register_sinks(spark: SparkSession) -> None:
    """Register ``weir-files`` and ``weir-sqlite`` with ``spark`` (once per session)."""
    spark.dataSource.register(TransactionalFileSink)
    spark.dataSource.register(SQLiteSink)
