"""``weir-kafka``: Kafka in and out for Spark Structured Streaming (the micro-batch
runtime), a PySpark Python data source — PySpark's own Kafka connector needs JVM jars
from outside the package registries (and its sink is at-least-once).

**Reading**, with Spark's Kafka option names and columns::

    events = (spark.readStream.format("weir-kafka")
              .option("kafka.bootstrap.servers", "broker:9092")
              .option("subscribe", "payments")          # topics, comma-separated
              .option("startingOffsets", "earliest")    # or latest, or JSON
              .option("maxOffsetsPerTrigger", 10000)    # optional
              .load())

Columns ``key``, ``value`` (binary), ``topic``, ``partition``, ``offset``,
``timestamp``, ``timestampType`` — Spark's. Offsets are Spark's own: a batch's end
offsets go into Spark's offset log before it runs, so a replay reads exactly the same
records. Reads with ``isolation.level=read_committed`` and ends each batch at the
partitions' last stable offsets (records of open transactions wait; of aborted ones
never appear). ``startingOffsets`` as JSON: ``{"topic": {"0": 23, "1": -2}}`` (-2:
earliest, -1: latest). Partitions added to the topics while the query runs are read
from their earliest offset, as Spark's Kafka source does.

**Writing** (both registered by :func:`weir.connectors.spark.register`)::

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

import datetime as dt
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from weir.connectors.common import _task_info
from weir.connectors.kafka_offsets import offset_bounds
from weir.connectors.kafka_transactions import TIMEOUT_S, TransactionalSlots, kafka_client
from weir.errors import ConfigurationError, SinkError, SourceError

if TYPE_CHECKING:
    from pyspark.sql import Row
    from pyspark.sql.types import StructType

__all__ = ["KAFKA_SINK_NAME", "KafkaCommitMessage", "KafkaDataSource", "KafkaStreamReader",
           "KafkaStreamWriter"]

#: how long a read may make no progress before it fails (seconds)
_STALL_S = 120.0
#: the columns a ``weir-kafka`` stream has (Spark's Kafka source's)
SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, timestampType int")
#: and with ``includeHeaders=true`` (Spark's option), the records' headers
HEADERS = "headers array<struct<key: string, value: binary>>"


def _flag(options: Any, name: str) -> bool:
    """A boolean option (Spark's spelling, any case of its name)."""
    value = options.get(name, options.get(name.lower(), "false"))
    if str(value).lower() not in ("true", "false"):
        raise ConfigurationError(f"{KAFKA_SINK_NAME}: option {name!r} must be true or "
                                 f"false, got {value!r}")
    return str(value).lower() == "true"

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


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """The records of one partition a batch reads: offsets ``start`` up to ``end``."""

    topic: str
    partition: int
    start: int
    end: int


def _client_options(options: Any) -> dict[str, Any]:
    """The ``kafka.*`` options but the bootstrap servers, as librdkafka settings."""
    return {k.removeprefix("kafka."): v for k, v in options.items()
            if k.lower().startswith("kafka.") and k.lower() != "kafka.bootstrap.servers"}


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The stream reader of :class:`KafkaDataSource` (see the module doc):
    ``maxOffsetsPerTrigger`` as Spark's read limit, and ``trigger(availableNow=True)``
    reading, in as many batches as the limit makes, what was there when it started."""

    def __init__(self, options: dict[str, str]) -> None:
        self.bootstrap_servers = _required(options, "kafka.bootstrap.servers")
        topics = options.get("subscribe")
        if not topics:
            raise ConfigurationError(f"{KAFKA_SINK_NAME} source: option 'subscribe' (the "
                                     f"topics, comma-separated) is missing")
        self.topics = sorted(t.strip() for t in topics.split(",") if t.strip())
        self.starting = options.get("startingOffsets") or options.get(
            "startingoffsets") or "latest"
        limit = options.get("maxOffsetsPerTrigger") or options.get("maxoffsetspertrigger")
        self.max_offsets = int(limit) if limit else None
        self.client = _client_options(options)
        self.headers = _flag(options, "includeHeaders")
        self._partitions: list[tuple[str, int]] | None = None
        #: trigger(availableNow=True): the offsets the query reads up to
        self._target: dict[tuple[str, int], int] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        """Record the partitions' last stable offsets: the query ends there."""
        self._target = {tp: stable for tp, (_, stable) in self._bounds().items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` records a batch, or everything available."""
        return ReadAllAvailable() if self.max_offsets is None else ReadMaxRows(self.max_offsets)

    def _all(self, fresh: bool = False) -> list[tuple[str, int]]:
        """The topics' partitions (``fresh``: listed again, to find new ones)."""
        if self._partitions is None or fresh:
            consumer = kafka_client().Consumer({"bootstrap.servers": self.bootstrap_servers,
                                                "group.id": f"weir-{uuid.uuid4().hex}",
                                                **self.client})
            try:
                found = consumer.list_topics(timeout=TIMEOUT_S).topics
            finally:
                consumer.close()
            missing = [t for t in self.topics if t not in found or found[t].error is not None]
            if missing:
                raise SourceError(f"{KAFKA_SINK_NAME} source: topics {missing} do not exist "
                                  f"on {self.bootstrap_servers}")
            self._partitions = [(t, p) for t in self.topics for p in sorted(found[t].partitions)]
        return self._partitions

    def _bounds(self, fresh: bool = False) -> dict[tuple[str, int], tuple[int, int]]:
        return offset_bounds(self.bootstrap_servers, self._all(fresh), self.client)

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts: ``startingOffsets``."""
        bounds = self._bounds()
        given: dict[str, Any] = {}
        if self.starting not in ("earliest", "latest"):
            try:
                given = json.loads(self.starting)
            except ValueError:
                raise ConfigurationError(
                    f"{KAFKA_SINK_NAME} source: startingOffsets must be earliest, latest or "
                    f"JSON such as {{\"topic\": {{\"0\": 23}}}}, got {self.starting!r}"
                ) from None
        out: dict[str, Any] = {}
        for (topic, partition), (low, stable) in bounds.items():
            wanted = given.get(topic, {}).get(str(partition), -2 if self.starting ==
                                              "earliest" or given else -1)
            offset = low if wanted == -2 else stable if wanted == -1 else int(wanted)
            out.setdefault(topic, {})[str(partition)] = max(low, offset)
        return out

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None
                     ) -> dict[str, Any]:
        """The partitions' last stable offsets (with ``trigger(availableNow=True)``: at
        most the ones it started at), at most ``limit`` records past ``start`` (shared
        by the partitions in proportion to their lag)."""
        bounds = self._bounds(fresh=self._target is None)  # (new partitions: as Spark)
        ends = ({tp: stable for tp, (_, stable) in bounds.items()}
                if self._target is None else dict(self._target))
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if most is not None and start is not None:
            begin = {tp: int(start.get(tp[0], {}).get(str(tp[1]), bounds[tp][0]))
                     for tp in ends}
            lag = {tp: max(0, ends[tp] - begin[tp]) for tp in ends}
            total = sum(lag.values())
            if total > most:
                share = {tp: lag[tp] * most // total for tp in ends}
                for tp in sorted(ends, key=lambda t: -lag[t]):  # (the rounding's rest)
                    if sum(share.values()) >= most:
                        break
                    share[tp] += 1 if share[tp] < lag[tp] else 0
                for tp in ends:
                    ends[tp] = begin[tp] + share[tp]
        out: dict[str, Any] = {}
        for (topic, partition), end in ends.items():
            out.setdefault(topic, {})[str(partition)] = end
        return out

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[KafkaRange]:
        """One input partition per Kafka partition with records between the two."""
        out = []
        new = [(t, int(p)) for t, ends in end.items() for p in ends
               if p not in start.get(t, {})]
        earliest = offset_bounds(self.bootstrap_servers, new, self.client) if new else {}
        for topic, ends in sorted(end.items()):
            for partition, stop in sorted(ends.items(), key=lambda e: int(e[0])):
                found = start.get(topic, {}).get(partition)  # (None: a new partition)
                begin = int(found) if found is not None else earliest[(topic, int(partition))][0]
                if int(stop) > begin:
                    out.append(KafkaRange(topic, int(partition), begin, int(stop)))
        return out

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """The records of one range (on an executor)."""
        assert isinstance(partition, KafkaRange)
        kafka = kafka_client()
        consumer = kafka.Consumer({"bootstrap.servers": self.bootstrap_servers,
                                   "group.id": f"weir-{uuid.uuid4().hex}",
                                   "enable.auto.commit": False,
                                   "isolation.level": "read_committed",
                                   **self.client, "auto.offset.reset": "error"})
        try:
            tp = kafka.TopicPartition(partition.topic, partition.partition, partition.start)
            consumer.assign([tp])
            position = partition.start
            stalled = time.monotonic() + _STALL_S
            while position < partition.end:
                if time.monotonic() > stalled:
                    raise SourceError(
                        f"{KAFKA_SINK_NAME} source, {partition.topic}[{partition.partition}]: "
                        f"no progress at offset {position} (of {partition.start}.."
                        f"{partition.end}) for {_STALL_S:.0f} s: is the broker reachable?")
                left = max(1, min(10_000, partition.end - position))  # (else: waits 0.2 s)
                for message in consumer.consume(num_messages=left, timeout=0.2):
                    error = message.error()
                    if error is not None:
                        raise SourceError(f"{KAFKA_SINK_NAME} source, {partition.topic}"
                                          f"[{partition.partition}]: {error}")
                    if message.offset() >= partition.end:
                        continue
                    kind, ts = message.timestamp()
                    row: tuple[Any, ...] = (message.key(), message.value(), message.topic(),
                           message.partition(), message.offset(),
                           dt.datetime.fromtimestamp(ts / 1000) if kind and ts >= 0 else None,
                           int(kind))
                    if self.headers:
                        row += ([(k, v) for k, v in message.headers() or ()],)
                    yield row
                (found,) = consumer.position([tp])
                if found.offset > position:
                    position, stalled = found.offset, time.monotonic() + _STALL_S
        finally:
            consumer.close()

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: Spark's offset and commit logs are the source's positions."""


class KafkaDataSource(DataSource):
    """``weir-kafka``: Kafka in and out for the micro-batch runtime, exactly-once out
    (see the module doc)."""

    @classmethod
    def name(cls) -> str:
        """The format name, ``"weir-kafka"``."""
        return KAFKA_SINK_NAME

    def schema(self) -> str:
        """The columns of a ``weir-kafka`` stream (Spark's Kafka source's; ``headers``
        with ``includeHeaders=true``)."""
        return f"{SCHEMA}, {HEADERS}" if _flag(self.options, "includeHeaders") else SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        """The stream reader (Spark calls this on the driver)."""
        return KafkaStreamReader(dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        """The writer of one micro-batch (Spark calls this on the driver)."""
        if overwrite:
            raise SinkError(f"{KAFKA_SINK_NAME} sink: complete output mode is not supported "
                            f"(a topic is appended to); use outputMode('append')")
        return KafkaStreamWriter(dict(self.options), schema)
