"""Kafka in and out on the continuous runtime (Flink's ``KafkaSource`` / ``KafkaSink``),
with ``confluent-kafka`` (librdkafka) and nothing but standard Kafka client semantics:
it runs against Apache Kafka, Redpanda or any broker speaking the protocol.

**The source** (:class:`KafkaSource`, in :mod:`weir.connectors.kafka_source`) splits
the topics' partitions across its subtasks, each partition's offset in every
checkpoint (a restore resumes there, a rescale redistributes them); it starts at the
earliest, latest, the consumer group's committed offsets, given offsets or a time
(``KafkaSource.timestamp(ms)``), reads ``read_committed``, optionally bounded; with a
watermark strategy each partition has its own watermark and idleness (a subtask's
watermark is the smallest over its partitions), and with a ``group_id`` the offsets of
every completed checkpoint are committed to the group, for monitoring.

**The sink** (:class:`KafkaSink`) has Flink's three guarantees:

* ``NONE`` — records are handed to the producer, nothing waits;
* ``AT_LEAST_ONCE`` — the producer is flushed at every checkpoint's barrier: a
  completed checkpoint's records are all acknowledged by the broker (a restore may
  send some again);
* ``EXACTLY_ONCE`` — a Kafka transaction per subtask per checkpoint. Flink streams
  records into the transaction and, after a crash, *resumes* it in another producer
  to commit it (setting the dead producer's id and epoch by reflection on the Java
  client). librdkafka cannot resume another producer's transaction, so weir keeps the
  transaction's records in the checkpoint instead (the committable: a write-ahead
  log) and, once the checkpoint completes, writes them in one transaction under the
  transactional id ``<transactional_id_prefix>-<subtask>`` together with a *marker*:
  the consumer group ``<transactional_id_prefix>-<subtask>`` commits, in the same
  transaction (``send_offsets_to_transaction``), offset = checkpoint id with the run's
  id as metadata. A commit after a failure first fences every earlier producer of
  that transactional id (``init_transactions``: an open transaction of a dead one is
  aborted, never left to block ``read_committed`` readers), then reads the marker and
  skips a checkpoint whose transaction is committed already: so every checkpoint's
  records become visible exactly once, whatever fails when. Records are visible to
  ``read_committed`` readers when their checkpoint completes (as in Flink).

  Transactions are open only while a completed checkpoint's records are written,
  so ``transaction.timeout.ms`` (default 60 s; at most the broker's
  ``transaction.max.timeout.ms``) needs to cover only that, not the checkpoint
  interval as in Flink. What it costs: the checkpoint holds the records written since
  the one before (in the sink's union state: a restore hands every subtask all of
  them; each commits the ones of its own subtask index modulo the new parallelism).

Both take extra client settings as ``properties`` (librdkafka's names, e.g.
``{"security.protocol": "SSL"}``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from weir.api.connectors import Sink, SinkContext, SinkWriter
from weir.connectors.kafka_offsets import KafkaRecord, read_kafka
from weir.connectors.kafka_source import KafkaSource, StartingTimestamp
from weir.connectors.kafka_source import check_servers as _check_servers
from weir.connectors.kafka_transactions import (
    TIMEOUT_S,
    TransactionalSlots,
    kafka_client,
    produce,
)
from weir.errors import ConfigurationError, SinkError

__all__ = ["DeliveryGuarantee", "KafkaRecord", "KafkaSink", "KafkaSource", "StartingTimestamp",
           "read_kafka"]

class DeliveryGuarantee(enum.StrEnum):
    """What a :class:`KafkaSink` promises (Flink's ``DeliveryGuarantee``)."""

    NONE = "none"
    AT_LEAST_ONCE = "at-least-once"
    EXACTLY_ONCE = "exactly-once"


# ------------------------------------------------------------------------------- sink


def _encode_record(record: Any) -> tuple[bytes | None, bytes | None]:
    """A record as (key, value) bytes: a (key, value) pair, or a value."""
    def as_bytes(part: Any) -> bytes | None:
        if part is None or isinstance(part, bytes):
            return part
        if isinstance(part, str):
            return part.encode()
        raise SinkError(f"KafkaSink: a key or value must be bytes, str or None, got "
                        f"{type(part).__name__} (give serializer= to encode records)")

    if isinstance(record, tuple | list) and len(record) == 2:
        return as_bytes(record[0]), as_bytes(record[1])
    return None, as_bytes(record)


class KafkaSink(Sink[Any]):
    """Records into a Kafka topic (see the module doc)."""

    def __init__(
        self, bootstrap_servers: str | Sequence[str], topic: str, *,
        delivery_guarantee: DeliveryGuarantee | str = DeliveryGuarantee.EXACTLY_ONCE,
        transactional_id_prefix: str | None = None,
        serializer: Callable[[Any], tuple[bytes | None, bytes | None]] | None = None,
        properties: dict[str, Any] | None = None,
    ) -> None:
        self.bootstrap_servers = _check_servers(bootstrap_servers, "KafkaSink")
        if not isinstance(topic, str) or not topic:
            raise ConfigurationError(f"KafkaSink: topic must be a topic name, got {topic!r}")
        try:
            self.delivery_guarantee = DeliveryGuarantee(delivery_guarantee)
        except ValueError:
            raise ConfigurationError(
                f"KafkaSink: delivery_guarantee must be one of "
                f"{[g.value for g in DeliveryGuarantee]}, got {delivery_guarantee!r}") from None
        if self.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE and not (
                isinstance(transactional_id_prefix, str) and transactional_id_prefix):
            raise ConfigurationError(
                "KafkaSink(delivery_guarantee=EXACTLY_ONCE) needs transactional_id_prefix: "
                "a name unique to this sink among every application writing to the "
                "cluster (as Flink's setTransactionalIdPrefix): its transactions and "
                "markers are named after it")
        timeout = (properties or {}).get("transaction.timeout.ms")
        if timeout is not None and int(timeout) < 1_000:
            raise ConfigurationError(
                f"KafkaSink: transaction.timeout.ms={timeout} is too short to write a "
                f"checkpoint's records in one transaction (at least 1000; default 60000)")
        self.topic = topic
        self.transactional_id_prefix = transactional_id_prefix
        self.serializer = serializer or _encode_record
        self.properties = dict(properties or {})
        self._context: SinkContext | None = None
        self._transactions: TransactionalSlots | None = None

    def __repr__(self) -> str:
        return (f"KafkaSink({self.bootstrap_servers!r}, {self.topic!r}, "
                f"{self.delivery_guarantee.value})")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_transactions": None, "_context": None}

    def _producer_config(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, "linger.ms": 5,
                "enable.idempotence": self.delivery_guarantee is not DeliveryGuarantee.NONE,
                **self.properties}

    def claim(self, context: SinkContext) -> None:
        self._context = context

    def writer(self, context: SinkContext) -> SinkWriter[Any]:
        self._context = context
        if self.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE:
            return _WriteAheadWriter(self, context)
        return _DirectWriter(self, context)

    # -- exactly-once: committables are {"origin", "run", "checkpoint", "records"}

    def transactional_id(self, origin: int) -> str:
        """The transactional id (and marker group) of subtask ``origin``'s commits."""
        return f"{self.transactional_id_prefix}-{origin}"

    @property
    def _slots(self) -> TransactionalSlots:
        if self._transactions is None:
            self._transactions = TransactionalSlots(
                self.bootstrap_servers, self.topic, str(self.transactional_id_prefix),
                self._producer_config())
        return self._transactions

    def commit(self, committables: list[Any]) -> None:
        """Write each checkpoint's records in one transaction with its marker, in
        checkpoint order per subtask; a checkpoint whose marker is committed already is
        skipped (idempotent: :mod:`weir.connectors.kafka_transactions`)."""
        for c in sorted(committables, key=lambda c: (c["origin"], c["run"], c["checkpoint"])):
            self._slots.write_once(int(c["origin"]), str(c["run"]), int(c["checkpoint"]),
                                   msgpack.unpackb(c["records"], use_list=False))

    def commit_after_recovery(self, committables: list[Any]) -> None:
        """Commit the recovered committables of the subtasks whose index is this one's
        modulo the parallelism (the sink's state is a union: every subtask gets all)."""
        context = self._context
        if context is None:
            raise SinkError("KafkaSink: commit_after_recovery before claim")
        self.commit([c for c in committables
                     if int(c["origin"]) % context.parallelism == context.subtask])

    def abort_attempts(self, context: SinkContext, keep: list[Any]) -> None:
        """Fence every earlier producer of this subtask's transactional id (aborting an
        open transaction of it): nothing else of an earlier attempt is left open."""
        if self.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE:
            self._slots.producer(context.subtask)


class _WriteAheadWriter(SinkWriter[Any]):
    """Exactly-once: a checkpoint's records, kept until the checkpoint completes."""

    def __init__(self, sink: KafkaSink, context: SinkContext) -> None:
        self.sink, self.context = sink, context
        self._records: list[tuple[bytes | None, bytes | None]] = []

    def write(self, record: Any) -> None:
        self._records.append(self.sink.serializer(record))

    def prepare_commit(self, checkpoint_id: int) -> Any:
        if not self._records:
            return None
        records, self._records = self._records, []
        return {"origin": self.context.subtask, "run": self.context.run_id,
                "checkpoint": checkpoint_id, "records": msgpack.packb(records)}


class _DirectWriter(SinkWriter[Any]):
    """NONE and AT_LEAST_ONCE: straight to the producer (flushed at every barrier for
    at-least-once)."""

    def __init__(self, sink: KafkaSink, context: SinkContext) -> None:
        self.sink = sink
        self.producer = kafka_client().Producer(sink._producer_config())
        self._errors: list[str] = []

    def _delivered(self, error: Any, _message: Any) -> None:
        if error is not None:
            self._errors.append(str(error))

    def write(self, record: Any) -> None:
        key, value = self.sink.serializer(record)
        produce(self.producer, self.sink.topic, key, value, self._delivered)
        self.producer.poll(0)

    def prepare_commit(self, checkpoint_id: int) -> Any:
        if self.sink.delivery_guarantee is DeliveryGuarantee.AT_LEAST_ONCE:
            left = self.producer.flush(TIMEOUT_S)
            if left or self._errors:
                raise SinkError(f"KafkaSink {self.sink.topic!r}: at checkpoint "
                                f"{checkpoint_id}, {left} records not acknowledged and "
                                f"{len(self._errors)} refused: {self._errors[:3]}")
        return None

    def close(self) -> None:
        self.producer.flush(TIMEOUT_S)
