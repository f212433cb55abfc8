"""Connectors. For Spark Structured Streaming: exactly-once sinks (PySpark Python data
sources). For the continuous runtime (:mod:`weir.stream`): :class:`SequenceSource` and
the two-phase-commit :class:`FileSink` (:mod:`weir.connectors.stream`), and the
replayable, bounded :class:`FileSource` of JSON-lines or text files
(:mod:`weir.connectors.file_source`), :class:`SqliteSink`, and the idempotent
:class:`CollectSink` for tests and small results (:mod:`weir.connectors.collect`);
and what a source or sink of your own implements (:class:`Source`,
:class:`SourceReader`, :class:`Sink`, :class:`SinkWriter`, :class:`SinkContext`; the
contract in :mod:`weir.api.connectors`).

``register_sinks(spark)`` makes ``df.writeStream.format("weir-files")`` and
``format("weir-sqlite")`` available; see :mod:`weir.connectors.sinks` for options,
on-disk layout and the exactly-once argument.
"""

from typing import TYPE_CHECKING, Any

from weir.api.connectors import Sink, SinkContext, SinkWriter, Source, SourceReader
from weir.connectors.collect import CollectSink
from weir.connectors.file_source import FileSource
from weir.connectors.stream import (
    FileSink,
    SequenceSource,
    SqliteSink,
    read_sqlite_stream_sink,
    read_stream_sink,
)

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
        SQLiteSink,
        SQLiteSinkWriter,
        committed_sqlite_batches,
        read_sqlite_sink,
    )

#: the Spark sinks, imported on first use (they import pyspark.sql and pyarrow, which a
#: continuous task process does not need: it starts faster without them)
_SPARK = {
    "FILE_SINK_NAME": "common", "SQLITE_SINK_NAME": "common",
    "FileCommitMessage": "files", "FileSinkWriter": "files",
    "TransactionalFileSink": "files", "committed_file_batches": "files",
    "read_file_sink": "files", "register_sinks": "sinks",
    "SQLiteCommitMessage": "sqlite", "SQLiteSink": "sqlite", "SQLiteSinkWriter": "sqlite",
    "committed_sqlite_batches": "sqlite", "read_sqlite_sink": "sqlite",
}


def __getattr__(name: str) -> Any:
    module = _SPARK.get(name)
    if module is None:
        raise AttributeError(f"module 'weir.connectors' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"weir.connectors.{module}"), name)


__all__ = [
    "Sink",
    "SinkContext",
    "SinkWriter",
    "Source",
    "SourceReader",
    "CollectSink",
    "FileSink",
    "FileSource",
    "SequenceSource",
    "SqliteSink",
    "read_sqlite_stream_sink",
    "read_stream_sink",
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
