"""Exactly-once sinks for Spark Structured Streaming (PySpark Python data sources).

``register_sinks(spark)`` makes ``df.writeStream.format("weir-files")`` and
``format("weir-sqlite")`` available; see :mod:`weir.connectors.sinks` for options,
on-disk layout and the exactly-once argument.
"""

from weir.connectors.sinks import (
    FILE_SINK_NAME,
    SQLITE_SINK_NAME,
    FileCommitMessage,
    FileSinkWriter,
    SQLiteCommitMessage,
    SQLiteSink,
    SQLiteSinkWriter,
    TransactionalFileSink,
    committed_file_batches,
    committed_sqlite_batches,
    read_file_sink,
    read_sqlite_sink,
    register_sinks,
)

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
