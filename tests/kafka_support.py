"""A real Kafka-protocol broker for tests: ``noida-db`` (PyPI; one Rust binary) started
on a free loopback port with its own data directory, and stopped — or restarted, for a
fault test — by the test. weir's connectors use only standard Kafka client semantics
(confluent-kafka), so what passes here runs unchanged against Apache Kafka or Redpanda.

Where noida-db deviates from Apache Kafka, it is written down here, and the tests test
Kafka's documented behaviour, not the deviation:

* **A SIGKILL loses its last second or so of writes** — records, committed offsets and
  even topics created just before (seen: a topic created and written within a second
  of the kill was gone; transactions committed 2 s before survived, the one committed
  just before did not). Apache Kafka keeps every acknowledged write when its process
  dies (they are in the OS page cache; only a machine crash with one replica loses
  unflushed data). So a "broker restart" in the tests is a SIGTERM (noida-db then
  persists everything); a broker *crash* would test noida-db's flush interval, not
  weir.

* (Not a deviation, though first taken for one: after a restart a sink producer hung
  in ``send_offsets_to_transaction`` for good — librdkafka's hang once its cached group
  coordinator is decommissioned, confluentinc/librdkafka#5456 and #5511, which
  ``weir.connectors.kafka_transactions`` works around. Restarts 0 to 30 ms into a
  transaction's commit and right after it were tried since: the next producer of the
  transactional id goes on at once.)

* **Records with timestamps older than the retention are deleted at once** (seen:
  records stamped in 1970 were gone a second after they were written, the log start
  offset past them; records stamped an hour ago stay). Apache Kafka deletes by time
  only whole closed segments, so the active segment's records stay. So tests that set
  record timestamps use recent ones.

What the tests rely on and noida-db does as Kafka does: topics, consumer groups,
idempotent and transactional producers, ``read_committed`` hiding open and aborted
transactions, fencing on a reused ``transactional.id``, ``send_offsets_to_transaction``
(any offset, with metadata), control records taking offsets, data kept across a
restart. On Debian 12 it prints a GLIBC symbol warning as it starts: harmless."""

from __future__ import annotations

import uuid

from weir.examples._kafka_broker import Broker

__all__ = ["Broker", "create_topic", "produce"]

def create_topic(bootstrap: str, partitions: int, name: str | None = None) -> str:
    """A new topic (a unique name unless given) with ``partitions`` partitions."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = name or f"t-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)
    return name


def produce(bootstrap: str, topic: str, n: int, keys: int = 50) -> None:
    """The numbers 0 .. n-1 into ``topic``, keyed by n % ``keys`` (so a key's numbers are
    in one partition, in order)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(n):
        while True:
            try:
                producer.produce(topic, key=str(i % keys).encode(), value=str(i).encode())
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
