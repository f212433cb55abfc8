"""The connectors of the Spark (micro-batch) runtime (:mod:`weir.spark`): exactly-once
sinks (and a Kafka source) as PySpark Python data sources. :func:`register` makes
``df.writeStream.format("weir-files")`` (:class:`FilesDataSource`: JSON-lines files, a
directory per batch), ``format("weir-sqlite")`` (:class:`SqliteDataSource`: rows of
a SQLite table) and ``format("weir-kafka")`` (:class:`KafkaDataSource`: a Kafka topic,
exactly-once per batch id, and ``spark.readStream.format("weir-kafka")``;
:mod:`weir.connectors.kafka_spark`) available (:func:`register_sinks` is the same);
:func:`read_file_sink` and :func:`read_sqlite_sink` read what they committed. Options,
on-disk layout and the exactly-once argument are in :mod:`weir.connectors.sinks`.

The continuous runtime's sources and sinks are in :mod:`weir.connectors.stream`.
Importing this module imports ``pyspark.sql``."""

from __future__ import annotations

from weir.connectors.common import FILE_SINK_NAME, SQLITE_SINK_NAME
from weir.connectors.files import (
    FileCommitMessage,
    FilesDataSource,
    FileSinkWriter,
    committed_file_batches,
    read_file_sink,
)
from weir.connectors.kafka_spark import KAFKA_SINK_NAME, KafkaDataSource
from weir.connectors.sinks import register, register_sinks
from weir.connectors.sqlite import (
    SQLiteCommitMessage,
    SqliteDataSource,
    SQLiteSinkWriter,
    committed_sqlite_batches,
    read_sqlite_sink,
)

__all__ = [
    "FILE_SINK_NAME",
    "KAFKA_SINK_NAME",
    "SQLITE_SINK_NAME",
    "FileCommitMessage",
    "FileSinkWriter",
    "FilesDataSource",
    "KafkaDataSource",
    "SQLiteCommitMessage",
    "SQLiteSinkWriter",
    "SqliteDataSource",
    "committed_file_batches",
    "committed_sqlite_batches",
    "read_file_sink",
    "read_sqlite_sink",
    "register",
    "register_sinks",
]
