"""Exactly-once (two-phase-commit) sinks for Spark Structured Streaming (the
micro-batch runtime; import them from :mod:`weir.connectors.spark`).

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
4. An *empty* batch (no task staged a row) has nothing to publish, so it is not
   recorded at all: publishing nothing any number of times is exactly-once. A
   heartbeat source's idle batch per second therefore leaves no trace in the sink
   (``committed_*_batches`` lists only batches that had rows).

A commit's work does not depend on how many batches the location holds: it never
lists them or reads their manifests or rows. Whether *N* is recorded is one lookup
(a ``stat`` of ``batch=<N>/``; a primary-key lookup), and the query owning the
location is one small record (below). Readers (``read_*_sink``,
``committed_*_batches``, ``spark.read``) still list the batches, as they must.

Known limitation: one sink location per query lineage
-----------------------------------------------------
Idempotence is keyed by batch id, and batch ids restart at 0 with a fresh Spark
checkpoint. Like Spark's own file sink, a sink path (``weir-files``) or a table
(``weir-sqlite``) therefore belongs to one streaming query: a new query with a new
checkpoint must write to a new path or table, or its first batches would be
mistaken for replays and silently dropped. Both sinks store the Spark query id with
every committed batch and, per location, in a *lineage record* (``<path>/_lineage.json``;
a ``_weir_lineage`` row per table), and refuse (:class:`~weir.errors.SinkError`) a
commit whose query id differs from the recorded one. The record is written by the
first commit on the location (empty or not; the sink's only write for an empty batch)
and again only when a query id first appears after commits without one; it is never
changed to another query. Where it is missing (a location written by an earlier weir
version, or a record deleted by hand) the first commit takes the newest batch's query
id in one search of the batches and records it. Rows written outside Spark (no
``TaskContext``, no query id) are not checked. Two queries running at the same time
against one location are not supported.

``weir-files``: :class:`~weir.connectors.files.FilesDataSource`
---------------------------------------------------------------
Option ``path``: a local directory (or a ``file://`` URL); on a cluster, a POSIX
filesystem mounted at the same path on the driver and all executors. The publish step
relies on an atomic directory rename, which object stores (``s3://`` ...) do not have;
other fsspec URLs are refused. Append output mode only. Layout::

    <path>/
      batch=1/                      one directory per committed batch that had rows,
        _manifest.json              published by rename: batch id, query id, commit time,
        part-00000-<attempt>.jsonl  files, row counts, schema; one JSON-lines file per
        part-00001-<attempt>.jsonl  non-empty partition
      batch=4/ ...                  (no directory for empty batches 0, 2, 3)
      _lineage.json                 the query owning the path: format, query id, the batch
                                    and time it was recorded (_lineage.json.tmp while
                                    it is replaced)
      _staging/batch=<N>/part-<partition>-<attempt>.jsonl   staged by write(); invisible
      _staging/unbatched/...        staged outside Spark (no batch id known in write())
      _publishing/batch=<N>/<uuid>/ a commit of batch N in progress (or crashed); invisible

Rows are ``row.asDict(recursive=True)``, one JSON object per line, with values made
JSON-safe: dates, times and timestamps as ISO-8601 strings (``TimestampType`` is the
naive local-time ``datetime`` PySpark hands to Python), decimals as strings, binary
as base64 strings, day-time intervals as seconds, map keys as strings. Directories
and files starting with ``_`` or ``.`` are ignored by readers, including Spark's:
``spark.read.json(path)`` reads the committed batches with a ``batch`` partition
column. ``commit(messages, N)`` takes these steps, none of which lists ``<path>``:

a. read ``_lineage.json`` and refuse another query's batch; if the record is missing,
   or has no query id and this batch has one, write it: temp file, fsync, rename over
   ``_lineage.json``, fsync ``<path>``;
b. if ``batch=<N>/`` exists (a replay), go to (e); if no task staged a row, go to (e);
c. delete ``_publishing/batch=<N>/`` (a crashed earlier commit's), check that every
   named staged file exists, move them into a new ``_publishing/batch=<N>/<uuid>/``,
   write ``_manifest.json``, fsync the manifest and the directory;
d. rename that directory to ``batch=<N>/`` and fsync ``<path>``;
e. delete ``_staging/batch=<N>/`` and ``_publishing/batch=<N>/`` (leftovers of earlier
   attempts; the batch is published, or empty).

A crash between any two steps is safe. Before (d) nothing of the batch is visible;
the lineage record, if (a) wrote it, names the same query that Spark's replay of *N*
comes from, so the replay passes (a), finds no ``batch=<N>/`` and publishes its own
attempt, its step (c) sweeping the crashed commit's half-filled directory. The rename
in (d) is atomic and comes after the manifest and files are durable, so ``batch=<N>/``
is never seen partial; Spark logs *N* only after ``commit`` returned, i.e. after the
fsync of ``<path>``. After (d) the replay stops at (b) and only deletes staged files.
An empty batch writes nothing beyond (a), which writes only on a path's first commit
(and once more if a query id first appears after commits without one). A new query
is refused by (a) in every case: the record is durable before any of its batches can
be published. The kill -9 and crash-at-every-step tests in ``tests/test_spark_sinks.py``
exercise these cases.

``weir-sqlite``: :class:`~weir.connectors.sqlite.SqliteDataSource`
-------------------------------------------------------------------
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
                                         one row per committed batch that had rows
    _weir_lineage(table_name PRIMARY KEY, query_id, recorded_by_batch, recorded_at)
                                         the query owning each table

``_weir_commits`` and ``_weir_lineage`` are keyed by table, so several sinks (queries)
can share one database file, each with its own table. ``write`` stages a partition's
rows in one transaction (partitions over 10,000 rows: one per 10,000 rows; staged rows
only count once ``write`` has returned its message). ``commit`` is one ``BEGIN
IMMEDIATE`` transaction: check (and on the first commit, record) ``_weir_lineage``;
look the batch up in ``_weir_commits``; if it is new and had rows, create the table
if needed, copy the staged rows of exactly the named attempts (in partition order)
and record the batch; in any case delete the batch's staging rows. Every lookup is
by primary key or index (but the one-time search of a table without a lineage row),
so commit work does not grow with past batches. An empty batch changes nothing in
append mode once the table exists (the first commit creates it); in complete mode it
empties the table (the result is empty) without recording the batch, which a replay
repeats harmlessly.

The continuous runtime's :class:`~weir.connectors.sqlite_stream.SqliteSink` writes its target
table in the same layout (one column per field, JSON text for nested values), with
bookkeeping tables of its own (``<table>_staging``, ``<table>_committed``,
``<table>_lineage``): :func:`~weir.connectors.sqlite.read_sqlite_sink` reads either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from weir.connectors.files import FilesDataSource
from weir.connectors.kafka_spark import KafkaDataSource
from weir.connectors.sqlite import SqliteDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register", "register_sinks"]

# --------------------------------------------------------------------------- registration


def register(spark: SparkSession) -> None:
    """Register weir's data sources with ``spark`` (once per session): the sinks
    ``weir-files`` and ``weir-sqlite``, and ``weir-kafka`` — Kafka in
    (``readStream``) and out (``writeStream``; :mod:`weir.connectors.kafka_spark`)."""
    spark.dataSource.register(FilesDataSource)
    spark.dataSource.register(SqliteDataSource)
    spark.dataSource.register(KafkaDataSource)


def register_sinks(spark: SparkSession) -> None:
    """The same as :func:`register` (its name from before ``weir-kafka`` could also be
    read from)."""
    register(spark)
