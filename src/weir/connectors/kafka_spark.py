"""``weir-kafka``: an exactly-once Kafka sink for Spark Structured Streaming (the
micro-batch runtime), a PySpark Python data source — PySpark's own Kafka sink needs
JVM jars from outside the package registries, and is at-least-once.

Registered by :func:`weir.connectors.spark.register_sinks`; then::

    (df.selectExpr("CAST(key AS STRING) AS key", "to_json(struct(*)) AS value")
       .writeStream.format("weir-kafka")
       .option("kafka.bootstrap.servers", "broker:9092")
       .option("topic", "counts")
       .option("checkpointLocation", "/chk/q1")
       .start())

Columns: ``value`` (binary or string; required) and ``key`` (binary or string,
optional), as Spark's Kafka sink takes them. Options: ``kafka.bootstrap.servers``,
``topic``; ``transactionalIdPrefix`` (default ``weir-<query id>-<topic>``: the
Spark query id is kept in its checkpoint, so a restarted query keeps its prefix);
any other ``kafka.*`` option goes to the producer (``kafka.security.protocol`` ...).

**Exactly once per batch id.** Each task writes its partition of batch *N* in one
Kafka transaction together with a marker — the consumer group
``<prefix>-<partition>`` commits offset *N* in the same transaction
(:mod:`weir.connectors.kafka_transactions`) — after fencing every earlier producer of
its transactional id ``<prefix>-<partition>`` (a zombie or speculative attempt of the
same task can no longer commit; its open transaction is aborted). A task that finds
the marker at *N* already writes nothing. Spark replays a batch that was not recorded
in its commit log with the same id and the same input offsets, so a retried task, a
retried batch and a query restarted after a crash each make the partition's records
visible to ``read_committed`` readers exactly once. The records of a batch become
visible as its tasks finish (before Spark's commit log records it), as with any sink
whose tasks commit; what a replay writes is exactly what the first attempt wrote as
long as a batch's partitions are deterministic (weir stages are: partition ``i`` is
subtask ``i``, and a subtask's output is a function of its input and state).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage

from weir.connectors.common import _task_info
from weir.connectors.kafka_transactions import TransactionalSlots
from weir.errors import SinkError

if TYPE_CHECKING:
    from pyspark.sql import Row
    from pyspark.sql.types import StructType

__all__ = ["KAFKA_SINK_NAME", "KafkaCommitMessage", "KafkaDataSource", "KafkaStreamWriter"]

KAFKA_SINK_NAME = "weir-kafka"


@dataclass(frozen=True)
class KafkaCommitMessage(WriterCommitMessage):
    """What one task did: its partition of batch ``batch_id``, its rows, and whether
    it wrote them (False: the batch's marker was there already — a replay)."""

    partition_id: int
    batch_id: int | None
    rows: int
    written: bool


def _bytes(value: Any, column: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise SinkError(f"{KAFKA_SINK_NAME} sink: column {column!r} must be binary or string, "
                    f"got {type(value).__name__}")


class KafkaStreamWriter(DataSourceStreamWriter):
    """The stream writer of :class:`KafkaDataSource` (see the module doc): the tasks
    write and commit; the driver's ``commit`` and ``abort`` have nothing left to do."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.bootstrap_servers = _required(options, "kafka.bootstrap.servers")
        self.topic = _required(options, "topic")
        self.prefix = options.get("transactionalIdPrefix") or options.get(
            "transactionalidprefix")
        names = [f.name for f in schema.fields]
        if "value" not in names:
            raise SinkError(f"{KAFKA_SINK_NAME} sink: the stream needs a 'value' column "
                            f"(binary or string), and may have 'key'; it has {names}")
        self.has_key = "key" in names
        self.producer_config = {
            "bootstrap.servers": self.bootstrap_servers, "linger.ms": 5,
            **{k.removeprefix("kafka."): v for k, v in options.items()
               if k.lower().startswith("kafka.") and k != "kafka.bootstrap.servers"}}

    def write(self, iterator: Iterator[Row]) -> KafkaCommitMessage:
        """Write this partition of the batch in one transaction with its marker, unless
        the marker says it is written already."""
        info = _task_info()
        records = [(_bytes(row["key"], "key") if self.has_key else None,
                    _bytes(row["value"], "value")) for row in iterator]
        if not records:
            return KafkaCommitMessage(info.partition_id, info.batch_id, 0, False)
        if info.batch_id is None or info.query_id is None:
            raise SinkError(f"{KAFKA_SINK_NAME} sink: no batch or query id in the task "
                            f"(not a streaming query?): exactly-once needs both")
        prefix = self.prefix or f"weir-{info.query_id}-{self.topic}"
        slots = TransactionalSlots(self.bootstrap_servers, self.topic, prefix,
                                   self.producer_config)
        written = slots.write_once(info.partition_id, info.query_id, info.batch_id, records)
        return KafkaCommitMessage(info.partition_id, info.batch_id, len(records), written)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task committed its own transaction."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: a task's transaction is committed or was never (its open
        one is aborted when the next attempt fences it)."""


def _required(options: Any, name: str) -> str:
    value = options.get(name) or options.get(name.lower())
    if not value:
        raise SinkError(f"{KAFKA_SINK_NAME} sink: option {name!r} is missing; set it with "
                        f".option({name!r}, ...) on writeStream")
    return str(value)


class KafkaDataSource(DataSource):
    """``weir-kafka``: an exactly-once Kafka sink of the micro-batch runtime (see the
    module doc)."""

    @classmethod
    def name(cls) -> str:
        """The format name, ``"weir-kafka"``."""
        return KAFKA_SINK_NAME

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        """The writer of one micro-batch (Spark calls this on the driver)."""
        if overwrite:
            raise SinkError(f"{KAFKA_SINK_NAME} sink: complete output mode is not supported "
                            f"(a topic is appended to); use outputMode('append')")
        return KafkaStreamWriter(dict(self.options), schema)
