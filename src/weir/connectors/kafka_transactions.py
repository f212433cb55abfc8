"""Exactly-once writes to Kafka without resuming another producer's transaction: a
*slot* (a continuous sink's subtask, a Spark write task's partition) writes each unit
of output (a checkpoint, a Spark batch) in one transaction together with a *marker*,
and skips a unit whose marker is committed already.

The marker is the consumer group ``<prefix>-<slot>``: in the same transaction
(``send_offsets_to_transaction``) it commits, for partition 0 of the output topic, the
offset = the unit's sequence number (checkpoint or batch id) with its run (a run id, a
Spark query id) as metadata — atomic with the records, read back with
``Consumer.committed``. Before its first write a slot's producer, whose
``transactional.id`` is ``<prefix>-<slot>`` too, fences every earlier producer of that
id (``init_transactions``: an open transaction of a dead or zombie one is aborted, so it
never holds ``read_committed`` readers back and never commits late). A unit is written
only if ``(run, sequence)`` is above the marker's: units of a slot are written in that
order (runs are named so that a later run sorts after an earlier one).

Two defences against librdkafka (2.16) hanging in ``send_offsets_to_transaction`` past its
timeout once a broker it knew went away (confluentinc/librdkafka#5456 and #5511: the
group coordinator stays cached as a decommissioned broker after a re-bootstrap, and the
call waits for it forever — seen here after a broker restart): a slot's producer that
reported a broker error (``error_cb``) since its last transaction is replaced by a new
one before the next (which fences it: nothing is open between two units), and the call
is bounded by a watchdog, past which the slot's producer is dropped and the write fails
with :class:`~weir.errors.SinkError` (the task fails; its retry fences the stuck
transaction, so it never holds ``read_committed`` readers back)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from weir.errors import ConfigurationError, SinkError

__all__ = ["TIMEOUT_S", "TransactionalSlots", "kafka_client", "produce"]

#: how long a client call waits for the broker (seconds): a commit's few calls stay well
#: within a continuous task's heartbeat timeout (50 s), so a broker that does not answer
#: fails the task (and the job restarts) rather than making it look hung
TIMEOUT_S = 10.0

#: librdkafka issues whose hang the watchdog of :meth:`TransactionalSlots.write_once` bounds
_HANG = "confluentinc/librdkafka#5456, #5511"


def kafka_client() -> Any:
    """The ``confluent_kafka`` module (a clear error when it is not installed)."""
    try:
        import confluent_kafka
    except ImportError as exc:  # pragma: no cover - a dependency of the kafka extra
        raise ConfigurationError(
            "weir's Kafka connectors need confluent-kafka: pip install 'weir[kafka]'"
        ) from exc
    return confluent_kafka


def produce(producer: Any, topic: str, key: bytes | None, value: bytes | None,
            on_delivery: Callable[[Any, Any], None]) -> None:
    """``producer.produce``, waiting while the producer's queue is full."""
    while True:
        try:
            producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
            return
        except BufferError:  # (the queue is full: let it drain)
            producer.poll(0.05)


class TransactionalSlots:
    """The transactional producers and markers of one sink (see the module doc)."""

    def __init__(self, bootstrap_servers: str, topic: str, prefix: str,
                 producer_config: dict[str, Any]) -> None:
        self.bootstrap_servers, self.topic, self.prefix = bootstrap_servers, topic, prefix
        self.producer_config = producer_config
        self._producers: dict[int, Any] = {}
        self._troubled: set[int] = set()  # (slots whose producer reported a broker error)
        #: how long a call that librdkafka may never return from is waited for
        self.watchdog_s = 2 * TIMEOUT_S

    def transactional_id(self, slot: int) -> str:
        """The transactional id, and marker group, of ``slot``."""
        return f"{self.prefix}-{slot}"

    def producer(self, slot: int) -> Any:
        """``slot``'s producer; made on first use, fencing every earlier one of its
        transactional id (an open transaction of it is aborted)."""
        producer = self._producers.get(slot)
        if producer is not None:
            producer.poll(0)  # (serves error_cb: a broker error since the last unit?)
            if slot in self._troubled:
                producer = self._producers.pop(slot)  # (replaced: the new one fences it)
        if slot not in self._producers:
            self._troubled.discard(slot)
            producer = kafka_client().Producer({
                **self.producer_config, "transactional.id": self.transactional_id(slot),
                "error_cb": self._error_callback(slot)})
            producer.init_transactions(TIMEOUT_S)
            self._producers[slot] = producer
        return self._producers[slot]

    def _error_callback(self, slot: int) -> Callable[[Any], None]:
        chained = self.producer_config.get("error_cb")

        def on_error(error: Any) -> None:
            self._troubled.add(slot)
            if chained is not None:
                chained(error)
        return on_error

    def _bounded(self, slot: int, call: Callable[[], None], what: str) -> None:
        """``call()``, but fail after :attr:`watchdog_s` if it has not returned (the
        librdkafka hang of the module doc): the slot's producer is dropped."""
        outcome: list[BaseException | None] = []
        thread = threading.Thread(target=lambda: outcome.append(_run(call)), daemon=True,
                                  name=f"weir-kafka-{what}")
        thread.start()
        thread.join(self.watchdog_s)
        if not outcome:
            self._producers.pop(slot, None)
            raise SinkError(
                f"Kafka topic {self.topic!r}: {what} of transactional id "
                f"{self.transactional_id(slot)!r} did not return in {self.watchdog_s:g} s "
                f"(librdkafka hangs there after a broker went away: {_HANG}); its "
                f"producer is dropped, and the retry fences its open transaction")
        if outcome[0] is not None:
            raise outcome[0]

    def _group(self, slot: int) -> Any:
        auth = {k: v for k, v in self.producer_config.items()
                if k.startswith(("security.", "sasl.", "ssl."))}
        return kafka_client().Consumer({"bootstrap.servers": self.bootstrap_servers,
                                        "group.id": self.transactional_id(slot),
                                        "enable.auto.commit": False, **auth})

    def committed(self, slot: int) -> tuple[str, int]:
        """(run, sequence) of ``slot``'s last committed unit (("", -1): none). Call it
        after :meth:`producer` (which fences): no earlier producer commits after."""
        group = self._group(slot)
        try:
            (found,) = group.committed([kafka_client().TopicPartition(self.topic, 0)],
                                       timeout=TIMEOUT_S)
        finally:
            group.close()
        return ("", -1) if found.offset < 0 else (found.metadata or "", found.offset)

    def write_once(self, slot: int, run: str, sequence: int,
                   records: Iterable[tuple[bytes | None, bytes | None]]) -> bool:
        """Write ``records`` and the marker (run, sequence) of ``slot`` in one
        transaction unless the marker is there already; whether it wrote."""
        producer = self.producer(slot)
        if (run, sequence) <= self.committed(slot):
            return False
        kafka = kafka_client()
        errors: list[str] = []

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                errors.append(str(error))

        group = self._group(slot)
        try:
            producer.begin_transaction()
            for key, value in records:
                produce(producer, self.topic, key, value, delivered)
            marker = [kafka.TopicPartition(self.topic, 0, sequence, run)]
            metadata = group.consumer_group_metadata()
            self._bounded(slot, lambda: producer.send_offsets_to_transaction(
                marker, metadata, TIMEOUT_S), "send_offsets_to_transaction")
            producer.flush(TIMEOUT_S)
            if errors:
                producer.abort_transaction(TIMEOUT_S)
                raise SinkError(f"Kafka topic {self.topic!r}: the records of {run} "
                                f"{sequence} (slot {slot}) were refused: {errors[:3]}")
            producer.commit_transaction(TIMEOUT_S)
        except BaseException:
            self._producers.pop(slot, None)  # (its transaction may be open: fenced next)
            raise
        finally:
            group.close()
        return True


def _run(call: Callable[[], None]) -> BaseException | None:
    try:
        call()
    except BaseException as exc:  # (handed to the caller's thread)
        return exc
    return None
