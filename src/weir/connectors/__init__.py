"""Connectors, by runtime.

* **Continuous runtime** (:mod:`weir.stream`) — :mod:`weir.connectors.stream`,
  re-exported here: the sources :class:`SequenceSource` and :class:`FileSource`
  (replayable, bounded JSON-lines or text files; :mod:`weir.connectors.file_source`),
  the two-phase-commit sinks :class:`FileSink` (JSON lines) and :class:`SqliteSink`
  (rows of a SQLite table, one column per field), their readers
  :func:`read_stream_sink` and :func:`read_sqlite_stream_sink`, and the idempotent
  :class:`CollectSink` for tests and small results (:mod:`weir.connectors.collect`);
  Kafka in and out, exactly-once: :class:`KafkaSource`, :class:`KafkaSink` with a
  :class:`DeliveryGuarantee`, and :func:`read_kafka` (:mod:`weir.connectors.kafka`);
  and what a source or sink of your own implements (:class:`Source`,
  :class:`SourceReader`, :class:`Sink`, :class:`SinkWriter`, :class:`SinkContext`; the
  contract in :mod:`weir.api.connectors`).
* **Spark micro-batch runtime** (:mod:`weir.spark`) — :mod:`weir.connectors.spark`:
  exactly-once sinks as PySpark Python data sources. ``register_sinks(spark)`` makes
  ``df.writeStream.format("weir-files")`` (``FilesDataSource``) and
  ``format("weir-sqlite")`` (``SqliteDataSource``) available; ``read_file_sink`` and
  ``read_sqlite_sink`` read them (see :mod:`weir.connectors.sinks` for options, on-disk
  layout and the exactly-once argument). They are imported on first use (they import
  pyspark.sql and pyarrow, which a continuous task process does not need).

The Spark names are still importable from here for one release (``register_sinks``,
``read_file_sink``, ``TransactionalFileSink`` …; import them from
:mod:`weir.connectors.spark`). ``SQLiteSink``, one letter case away from the continuous
:class:`SqliteSink`, warns (:class:`DeprecationWarning`): it is
``weir.connectors.spark.SqliteDataSource``.

Dead letters — the records a process function rejects, on either runtime — are read by
:func:`weir.read_dead_letters` (:mod:`weir.connectors.dead_letters`).
"""

from typing import TYPE_CHECKING, Any

from weir.api.connectors import Sink, SinkContext, SinkWriter, Source, SourceReader
from weir.connectors.collect import CollectSink
from weir.connectors.file_source import FileSource
from weir.connectors.kafka import (
    DeliveryGuarantee,
    KafkaRecord,
    KafkaSink,
    KafkaSource,
    StartingTimestamp,
    read_kafka,
)
from weir.connectors.sqlite_stream import SqliteSink, read_sqlite_stream_sink
from weir.connectors.stream import FileSink, SequenceSource, read_stream_sink

if TYPE_CHECKING:
    from weir.connectors.common import FILE_SINK_NAME, SQLITE_SINK_NAME
    from weir.connectors.files import (
        FileCommitMessage,
        FileSinkWriter,
        TransactionalFileSink,
        committed_file_batches,
        read_file_sink,
    )
    from weir.connectors.sinks import register_sinks
    from weir.connectors.sqlite import (
        SQLiteCommitMessage,
        SQLiteSinkWriter,
        committed_sqlite_batches,
        read_sqlite_sink,
    )
    from weir.connectors.sqlite import (  # deprecated (see __getattr__)
        SqliteDataSource as SQLiteSink,  # noqa: F401
    )

#: the Spark sinks, imported on first use (they import pyspark.sql and pyarrow, which a
#: continuous task process does not need: it starts faster without them)
_SPARK = {
    "FILE_SINK_NAME": "common", "SQLITE_SINK_NAME": "common",
    "FileCommitMessage": "files", "FileSinkWriter": "files",
    "TransactionalFileSink": "files", "committed_file_batches": "files",
    "read_file_sink": "files", "register_sinks": "sinks",
    "SQLiteCommitMessage": "sqlite", "SQLiteSinkWriter": "sqlite",
    "committed_sqlite_batches": "sqlite", "read_sqlite_sink": "sqlite",
}

#: old names kept for one release, with a DeprecationWarning: name -> (module, new name)
_DEPRECATED = {"SQLiteSink": ("sqlite", "SqliteDataSource")}


def __getattr__(name: str) -> Any:
    import importlib

    if name == "spark":  # (the submodule, on first use)
        return importlib.import_module("weir.connectors.spark")
    if name in _DEPRECATED:
        home, new = _DEPRECATED[name]
        import warnings

        warnings.warn(f"weir.connectors.{name} is deprecated: use "
                      f"weir.connectors.spark.{new} (the Spark data source; "
                      f"weir.connectors.SqliteSink is the continuous runtime's sink)",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(f"weir.connectors.{home}"), new)
    module = _SPARK.get(name)
    if module is None:
        raise AttributeError(f"module 'weir.connectors' has no attribute {name!r}")
    return getattr(importlib.import_module(f"weir.connectors.{module}"), name)


__all__ = [
    "Sink",
    "SinkContext",
    "SinkWriter",
    "Source",
    "SourceReader",
    "CollectSink",
    "DeliveryGuarantee",
    "FileSink",
    "FileSource",
    "KafkaRecord",
    "KafkaSink",
    "KafkaSource",
    "StartingTimestamp",
    "SequenceSource",
    "SqliteSink",
    "read_kafka",
    "read_sqlite_stream_sink",
    "read_stream_sink",
    "FILE_SINK_NAME",
    "SQLITE_SINK_NAME",
    "FileCommitMessage",
    "FileSinkWriter",
    "SQLiteCommitMessage",
    "SQLiteSinkWriter",
    "TransactionalFileSink",
    "committed_file_batches",
    "committed_sqlite_batches",
    "read_file_sink",
    "read_sqlite_sink",
    "register_sinks",
]
