"""Kafka records as weir hands them over (:class:`KafkaRecord`), where partitions stand
(:func:`offset_bounds`: first and last stable offsets, what both runtimes' Kafka
sources start and end at) and :func:`read_kafka`, which reads a topic to its end (what
tests and users check a sink's output with)."""

from __future__ import annotations

import importlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from weir.connectors.kafka_transactions import TIMEOUT_S, kafka_client
from weir.errors import SourceError

__all__ = ["KafkaRecord", "offset_bounds", "read_kafka", "record_of"]


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record read from Kafka, as a :class:`KafkaSource`'s ``deserializer`` sees it."""

    topic: str
    partition: int
    offset: int
    #: the record's timestamp (ms since the epoch; None if the broker gave none)
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def record_of(message: Any) -> KafkaRecord:
    """A confluent-kafka message as a :class:`KafkaRecord`."""
    kind, ts = message.timestamp()
    return KafkaRecord(message.topic(), message.partition(), message.offset(),
                       ts if kind != 0 and ts >= 0 else None, message.key(), message.value(),
                       tuple(message.headers() or ()))


def offset_bounds(bootstrap_servers: str, partitions: Sequence[tuple[str, int]],
                  properties: dict[str, Any] | None = None
                  ) -> dict[tuple[str, int], tuple[int, int]]:
    """Each partition's (first offset, last stable offset): the LSO, not the high
    watermark — a ``read_committed`` reader gets nothing past it, and records of a
    transaction still open there may yet be aborted (one admin call for all)."""
    if not partitions:
        return {}
    kafka = kafka_client()
    admin_module: Any = importlib.import_module("confluent_kafka.admin")
    AdminClient, OffsetSpec = admin_module.AdminClient, admin_module.OffsetSpec
    auth = {k: v for k, v in (properties or {}).items()
            if k.startswith(("security.", "sasl.", "ssl."))}
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, **auth})
    out: dict[tuple[str, int], list[int]] = {tp: [0, 0] for tp in partitions}
    for index, spec in ((0, OffsetSpec.earliest()), (1, OffsetSpec.latest())):
        asked = admin.list_offsets(
            {kafka.TopicPartition(t, p): spec for t, p in partitions},
            isolation_level=kafka.IsolationLevel.READ_COMMITTED, request_timeout=TIMEOUT_S)
        for tp, future in asked.items():
            out[(tp.topic, tp.partition)][index] = int(future.result().offset)
    return {tp: (low, high) for tp, (low, high) in out.items()}


def read_kafka(bootstrap_servers: str, topic: str, *,
               isolation_level: str = "read_committed", timeout_s: float = 60.0,
               properties: dict[str, Any] | None = None) -> list[KafkaRecord]:
    """Every record of ``topic`` up to its current end (committed ones only, by
    default), partition by partition in offset order. A transaction left open holds
    ``read_committed`` readers back: after ``timeout_s`` that is a SourceError."""

    kafka = kafka_client()
    consumer = kafka.Consumer({"bootstrap.servers": bootstrap_servers,
                               "group.id": f"weir-read-{uuid.uuid4().hex}",
                               "enable.auto.commit": False,
                               "isolation.level": isolation_level, **(properties or {})})
    try:
        meta = _topic_metadata(consumer, topic, time.monotonic() + timeout_s)
        if meta.error is not None:
            raise SourceError(f"read_kafka: topic {topic!r}: {meta.error}")
        ends = {}
        for partition in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(
                kafka.TopicPartition(topic, partition), timeout=TIMEOUT_S, cached=False)
            if high > low:
                ends[partition] = (low, high)
        out: list[KafkaRecord] = []
        if not ends:
            return out
        consumer.assign([kafka.TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
        remaining = set(ends)
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise SourceError(
                    f"read_kafka: partitions {sorted(remaining)} of {topic!r} did not reach "
                    f"their end in {timeout_s:.0f} s: an open transaction holds their last "
                    f"stable offset back")
            messages = consumer.consume(num_messages=10_000, timeout=0.2)
            for message in messages:
                if message.error() is None:
                    out.append(record_of(message))
            positions = consumer.position([kafka.TopicPartition(topic, p) for p in remaining])
            remaining = {tp.partition for tp in positions if tp.offset < ends[tp.partition][1]}
        out.sort(key=lambda r: (r.partition, r.offset))
        return out
    finally:
        consumer.close()


def _topic_metadata(consumer: Any, topic: str, deadline: float) -> Any:
    """``topic``'s metadata, asked again while the broker cannot be reached (until
    ``deadline``, ``time.monotonic()``)."""

    kafka = kafka_client()
    while True:
        try:
            return consumer.list_topics(topic, timeout=TIMEOUT_S).topics[topic]
        except kafka.KafkaException as exc:
            retriable = exc.args and exc.args[0].code() in (
                kafka.KafkaError._TRANSPORT, kafka.KafkaError._TIMED_OUT,
                kafka.KafkaError._ALL_BROKERS_DOWN)
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
