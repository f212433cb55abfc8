"""Kafka in and out on the continuous runtime, against a real broker (noida-db,
``tests/kafka_support.py``): ``KafkaSource`` → keyed count → ``KafkaSink``.

Each test has an oracle: the input is the numbers ``0 .. n-1``; the output, read with
``read_committed``, must hold every number once (L = lost, D = duplicated) with each
key's counts ``1 .. n/50`` (M = keys whose counts are wrong), across what the test
injects — a task killed with SIGKILL, a stop with a savepoint and a restore at another
parallelism, a broker restart — and the injected count is asserted too."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import weir
from continuous_helpers import TINY, Count, by_value, completed, lost_duplicated_wrong, wait_for
from kafka_support import Broker, create_topic, produce
from weir.connectors.kafka import DeliveryGuarantee, KafkaRecord, KafkaSink, KafkaSource, read_kafka
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

KEYS = 50
#: records of the kill tests (1 ms each on two subtasks: about 4 s of work)
KILL_N = 8_000


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


def number(record: KafkaRecord) -> int:
    return int(record.value or b"")


def as_json(row: Any) -> tuple[bytes, bytes]:
    return str(row[0]).encode(), json.dumps(row).encode()


class SlowCount(Count):
    """Count, 0.2 ms a record: a job long enough to act on while it runs."""

    def process_element(self, value: int, ctx: Any) -> Any:
        time.sleep(0.0002)
        yield from super().process_element(value, ctx)


def job(tmp_path: Path, bootstrap: str, source_topic: str, sink_topic: str, *,
        parallelism: int = 2, function: Any = None,
        guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE,
        restore_from: str | None = None, chk: str = "chk", interval: int = 100,
        channels: Any = None) -> StreamEnvironment:
    env = StreamEnvironment(channels=channels, config=weir.JobConfig(
        tmp_path / chk, parallelism=parallelism, max_parallelism=32,
        checkpointing=CheckpointConfig(interval=interval),
        restart_strategy=RestartStrategy.fixed_delay(attempts=5, delay="0 s"),
        restore_from=restore_from))
    (env.from_source(KafkaSource(bootstrap, source_topic, bounded=True,
                                 deserializer=number), uid="numbers")
        .key_by(lambda v: v % KEYS)
        .process(function or Count(), uid="count")
        .sink_to(KafkaSink(bootstrap, sink_topic, delivery_guarantee=guarantee,
                           transactional_id_prefix=f"weir-test-{sink_topic}",
                           serializer=as_json), uid="sink"))
    return env


def ldm(bootstrap: str, topic: str, n: int) -> tuple[int, int, int]:
    """L, D and M of the committed output (see the module doc)."""
    return lost_duplicated_wrong([json.loads(r.value or b"") for r in read_kafka(bootstrap, topic)],
                                 n)


def test_kafka_to_a_keyed_count_to_kafka_is_exactly_once(tmp_path: Path, kafka: Broker
                                                         ) -> None:
    n = 20_000
    source, sink = create_topic(kafka.bootstrap, 4), create_topic(kafka.bootstrap, 3)
    produce(kafka.bootstrap, source, n)
    result = job(tmp_path, kafka.bootstrap, source, sink).execute("kafka", timeout="120 s")
    assert result.restarts == 0 and result.completed
    counts = ldm(kafka.bootstrap, sink, n)
    print(f"L={counts[0]} D={counts[1]} M={counts[2]} | failures injected=0")
    assert counts == (0, 0, 0)


def run_with_a_kill(tmp_path: Path, bootstrap: str, source: str, sink: str, *,
                    victim: str, guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE
                    ) -> Any:
    """The job (SlowCount), task ``victim`` (subtask 1) killed with SIGKILL after two
    completed checkpoints; the job's result."""
    client = job(tmp_path, bootstrap, source, sink, function=SlowerCount(),
                 guarantee=guarantee, channels=TINY  # (little in flight: barriers soon)
                 ).execute_async("kafka", timeout="180 s")
    wait_for(client, "two checkpoints", lambda: completed(client) >= 2)
    running = client._job
    wait_for(client, f"task {victim}[1]", lambda: (victim, 1) in running._procs)
    committed = len(read_kafka(bootstrap, sink))
    running._procs[(victim, 1)].kill()  # (SIGKILL)
    assert committed < KILL_N  # (killed with output still to come)
    return client.wait(180)


@pytest.mark.parametrize("victim", ["count", "numbers"])
def test_a_task_killed_with_sigkill_restarts_and_the_output_stays_exactly_once(
    tmp_path: Path, kafka: Broker, victim: str
) -> None:
    n = KILL_N
    source, sink = create_topic(kafka.bootstrap, 4), create_topic(kafka.bootstrap, 3)
    produce(kafka.bootstrap, source, n)
    result = run_with_a_kill(tmp_path, kafka.bootstrap, source, sink, victim=victim)
    counts = ldm(kafka.bootstrap, sink, n)
    print(f"L={counts[0]} D={counts[1]} M={counts[2]} | failures injected=1, "
          f"restarts={result.restarts}")
    assert result.restarts == 1 and counts == (0, 0, 0)


def test_at_least_once_loses_nothing_across_a_kill(tmp_path: Path, kafka: Broker) -> None:
    n = KILL_N
    source, sink = create_topic(kafka.bootstrap, 4), create_topic(kafka.bootstrap, 3)
    produce(kafka.bootstrap, source, n)
    result = run_with_a_kill(tmp_path, kafka.bootstrap, source, sink, victim="count",
                             guarantee=DeliveryGuarantee.AT_LEAST_ONCE)
    rows = [json.loads(r.value or b"") for r in read_kafka(kafka.bootstrap, sink)]
    lost = len(set(range(n)) - {r[1] for r in rows})
    print(f"L={lost} D={len(rows) - n} (allowed) | failures injected=1, "
          f"restarts={result.restarts}")
    assert result.restarts == 1 and lost == 0


def test_a_rescale_reassigns_the_partitions_and_stays_exactly_once(
    tmp_path: Path, kafka: Broker
) -> None:
    """Stopped with a savepoint at parallelism 2, restored at 3: the splits (and their
    offsets) are redistributed, the sink's pending transactions committed once."""
    n = 20_000
    source, sink = create_topic(kafka.bootstrap, 5), create_topic(kafka.bootstrap, 3)
    produce(kafka.bootstrap, source, n)
    # (tiny channels: the sources stay backpressured, reading, until the savepoint — with
    # default ones they read all 20,000 records into the channels at once, and a run
    # under load had them at their end, the job ending, before the first checkpoint)
    client = job(tmp_path, kafka.bootstrap, source, sink, function=SlowerCount(),
                 channels=TINY).execute_async("kafka", timeout="180 s")
    wait_for(client, "a checkpoint", lambda: completed(client) >= 1)
    savepoint = client.stop_with_savepoint(str(tmp_path / "sp"))
    client.wait(60)
    before = len(read_kafka(kafka.bootstrap, sink))
    assert 0 < before < n
    result = job(tmp_path, kafka.bootstrap, source, sink, parallelism=3,
                 restore_from=savepoint, chk="chk-3").execute("kafka", timeout="180 s")
    assert result.restored[0].startswith(f"restore_from {savepoint}")
    counts = ldm(kafka.bootstrap, sink, n)
    print(f"L={counts[0]} D={counts[1]} M={counts[2]} | rescaled 2 -> 3 after "
          f"{before} outputs")
    assert counts == (0, 0, 0)


class SlowerCount(Count):
    """Count, 1 ms a record: 20,000 records take 10 s on two subtasks."""

    def process_element(self, value: int, ctx: Any) -> Any:
        time.sleep(0.001)
        yield from super().process_element(value, ctx)


def test_a_broker_restart_mid_run_keeps_the_output_exactly_once(
    tmp_path: Path, own_kafka: Broker
) -> None:
    """The broker stops (SIGTERM) and starts again while the job runs: the source's
    consumers and the sink's producers reconnect, and the output stays exactly once.
    The restart comes 0.3 s after a checkpoint completed (checkpoints every 3 s), with
    output still to come. (It found librdkafka's hang in send_offsets_to_transaction
    after a broker went away: L=12,832 of 20,000 — a hung transaction held the output's
    last stable offset back; see kafka_transactions.)"""
    n = 20_000
    source, sink = create_topic(own_kafka.bootstrap, 4), create_topic(own_kafka.bootstrap, 3)
    produce(own_kafka.bootstrap, source, n)
    client = job(tmp_path, own_kafka.bootstrap, source, sink, function=SlowerCount(),
                 interval=3_000, channels=TINY  # (little in flight: barriers come soon)
                 ).execute_async("kafka", timeout="240 s")
    wait_for(client, "a checkpoint", lambda: completed(client) >= 1)
    seen = completed(client)
    wait_for(client, "the next checkpoint", lambda: completed(client) > seen)
    time.sleep(0.3)  # (its commits are done: a few ms)
    committed = len(read_kafka(own_kafka.bootstrap, sink))
    own_kafka.restart(signal.SIGTERM)
    result = client.wait(240)
    assert 0 < committed < n  # (the restart came in the middle of the output)
    counts = ldm(own_kafka.bootstrap, sink, n)
    print(f"L={counts[0]} D={counts[1]} M={counts[2]} | broker restarts injected=1 after "
          f"{committed} of {n} outputs, job restarts={result.restarts}")
    assert counts == (0, 0, 0)


# ---------------------------------------------------- the sink's commit, step by step


def sink_of(bootstrap: str, topic: str) -> KafkaSink:
    return KafkaSink(bootstrap, topic, transactional_id_prefix=f"weir-unit-{topic}")


def committable_of(sink: KafkaSink, subtask: int, run: str, checkpoint: int,
                   values: list[bytes]) -> Any:
    from weir.api.connectors import SinkContext

    writer = sink.writer(SinkContext(run, subtask, 2, 0, uid="sink", lineage="l"))
    for value in values:
        writer.write(value)
    return writer.prepare_commit(checkpoint)


def test_a_committed_checkpoint_is_never_written_twice(kafka: Broker) -> None:
    """The marker makes commit idempotent: again, after a restart (a new sink object),
    and for an older checkpoint of the same subtask offered after a newer one."""
    topic = create_topic(kafka.bootstrap, 1)
    sink = sink_of(kafka.bootstrap, topic)
    first = committable_of(sink, 0, "run-a", 3, [b"a", b"b"])
    second = committable_of(sink, 0, "run-a", 4, [b"c"])
    sink.commit([first, second])
    sink.commit([first, second])
    again = sink_of(kafka.bootstrap, topic)  # (as after a restart)
    again.commit([first])
    later_run = committable_of(again, 0, "run-b", 1, [b"d"])  # (a later run: ids anew)
    again.commit([later_run, second])
    assert [r.value for r in read_kafka(kafka.bootstrap, topic)] == [b"a", b"b", b"c", b"d"]


def test_a_sink_producer_outlives_a_broker_restart_between_two_commits(
    own_kafka: Broker
) -> None:
    """librdkafka 2.16 waits forever in send_offsets_to_transaction once the broker it
    cached as group coordinator went away (confluentinc/librdkafka#5456, #5511): a
    producer that saw the broker go is replaced before its next transaction."""
    topic = create_topic(own_kafka.bootstrap, 1)  # (one partition: in order)
    sink = sink_of(own_kafka.bootstrap, topic)
    sink.commit([committable_of(sink, 0, "run-a", 1, [b"a"])])
    own_kafka.restart(signal.SIGTERM)
    started = time.monotonic()
    sink.commit([committable_of(sink, 0, "run-a", 2, [b"b"])])
    assert time.monotonic() - started < sink._slots.watchdog_s
    assert [r.value for r in read_kafka(own_kafka.bootstrap, topic)] == [b"a", b"b"]


def test_a_call_that_never_returns_fails_the_commit_and_drops_the_producer(
    kafka: Broker
) -> None:
    """The watchdog over librdkafka's hang: the write fails with a SinkError naming the
    transactional id, and the next write uses a new producer (fencing the stuck one)."""
    from weir.errors import SinkError

    topic = create_topic(kafka.bootstrap, 1)
    sink = sink_of(kafka.bootstrap, topic)
    slots = sink._slots
    slots.watchdog_s = 0.2
    stuck = slots.producer(0)
    with pytest.raises(SinkError, match=f"{slots.transactional_id(0)}.*did not return"):
        slots._bounded(0, lambda: time.sleep(1), "send_offsets_to_transaction")
    assert slots.producer(0) is not stuck
    sink.commit([committable_of(sink, 0, "run-a", 1, [b"a"])])
    assert [r.value for r in read_kafka(kafka.bootstrap, topic)] == [b"a"]


def test_a_dead_producers_open_transaction_is_aborted_not_left_to_block_readers(
    kafka: Broker
) -> None:
    """A producer of the sink's transactional id died with records in an open
    transaction: the next commit fences it (``init_transactions``), so its records are
    never visible and ``read_committed`` readers are not held back."""
    from confluent_kafka import Producer

    topic = create_topic(kafka.bootstrap, 1)
    sink = sink_of(kafka.bootstrap, topic)
    zombie = Producer({"bootstrap.servers": kafka.bootstrap,
                       "transactional.id": sink.transactional_id(0)})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie")
    zombie.flush(30)
    sink.commit([committable_of(sink, 0, "run-a", 1, [b"x"])])
    assert [r.value for r in read_kafka(kafka.bootstrap, topic, timeout_s=20)] == [b"x"]


def test_after_a_rescale_each_subtask_commits_its_share_of_the_recovered(
    kafka: Broker
) -> None:
    """The sink's committables are union state: after a restore at parallelism 2, every
    subtask gets those of the 3 old ones and commits the ones of its index modulo 2."""
    from weir.api.connectors import SinkContext

    topic = create_topic(kafka.bootstrap, 1)
    old = sink_of(kafka.bootstrap, topic)
    recovered = [committable_of(old, s, "run-a", 7, [f"s{s}".encode()]) for s in range(3)]
    for subtask in range(2):
        sink = sink_of(kafka.bootstrap, topic)
        sink.claim(SinkContext("run-b", subtask, 2, 0, uid="sink", lineage="l"))
        sink.commit_after_recovery(recovered)
    assert sorted(r.value for r in read_kafka(kafka.bootstrap, topic)) == [b"s0", b"s1",
                                                                          b"s2"]


def test_exactly_once_needs_a_transactional_id_prefix() -> None:
    with pytest.raises(weir.ConfigurationError, match="transactional_id_prefix"):
        KafkaSink("127.0.0.1:9092", "out")
    with pytest.raises(weir.ConfigurationError, match=r"transaction\.timeout\.ms"):
        KafkaSink("127.0.0.1:9092", "out", transactional_id_prefix="p",
                  properties={"transaction.timeout.ms": 10})
    KafkaSink("127.0.0.1:9092", "out", delivery_guarantee="at-least-once")
