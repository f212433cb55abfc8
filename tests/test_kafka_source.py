"""KafkaSource as Flink's: event time per partition (each partition its own watermark
and idleness, a subtask's watermark the smallest over its partitions), the offsets of
completed checkpoints committed to the consumer group, and a start at a timestamp.

The per-split watermark rules are tested on :class:`SplitWatermarks` itself (no
broker); the rest on a real broker (noida-db, ``tests/kafka_support.py``) with jobs
whose committed output shows what happened: records set event-time timers at their own
time, and the timers that fired say how far event time went."""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import weir
from continuous_helpers import by_value, wait_for
from kafka_support import Broker, create_topic, produce
from weir.api.watermarks import WatermarkStrategy
from weir.connectors.kafka import KafkaRecord, KafkaSource, StartingTimestamp
from weir.connectors.stream import FileSink, read_stream_sink
from weir.runtime.continuous.split_watermarks import SplitWatermarks
from weir.stream import CheckpointConfig, JobClient, StreamEnvironment

T0 = 1_000.0  # (a monotonic clock for SplitWatermarks, in seconds)
#: record timestamps of the broker tests: from an hour ago (the broker deletes records
#: older than its retention, 7 days, at once: see kafka_support)
BASE = (int(time.time()) // 3_600 - 1) * 3_600_000


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


def strategy(idleness_ms: int | None = None, lag_ms: int = 0) -> WatermarkStrategy:
    made = WatermarkStrategy.bounded_out_of_orderness(lag_ms, lambda r: r[1], interval=20)
    return made if idleness_ms is None else made.with_idleness(idleness_ms)


# ------------------------------------------------------- the per-split rules, no broker


def test_the_watermark_is_the_smallest_of_the_splits() -> None:
    marks = SplitWatermarks(strategy(lag_ms=10), ["a", "b"], T0)
    marks.read("a", 100_000, T0 + 0.01)
    marks.read("b", 1_000, T0 + 0.01)
    assert marks.check(T0 + 0.02, ["a", "b"]) == (1_000 - 10 - 1, False)


def test_a_split_without_records_holds_event_time_back_until_it_is_idle() -> None:
    """Idleness per split, counted from its assignment: "b" never read anything."""
    marks = SplitWatermarks(strategy(idleness_ms=500), ["a", "b"], T0)
    marks.read("a", 5_000, T0 + 0.1)
    assert marks.check(T0 + 0.2, ["a", "b"]) == (None, False)  # held at the minimum
    marks.read("a", 6_000, T0 + 0.45)
    assert marks.check(T0 + 0.5, ["a", "b"]) == (5_999, False)  # "b" idle: 0.5 s
    without = SplitWatermarks(strategy(), ["a", "b"], T0)  # no idleness: held for good
    without.read("a", 5_000, T0 + 0.1)
    assert without.check(T0 + 3_600, ["a", "b"]) == (None, False)


def test_a_split_assigned_later_counts_its_idleness_from_then() -> None:
    marks = SplitWatermarks(strategy(idleness_ms=500), ["a"], T0)
    marks.read("a", 5_000, T0 + 1.0)
    assert marks.check(T0 + 1.0, ["a", "late"]) == (None, False)  # "late" assigned now
    marks.read("a", 5_000, T0 + 1.4)
    assert marks.check(T0 + 1.4, ["a", "late"]) == (None, False)
    marks.read("a", 5_000, T0 + 1.5)
    assert marks.check(T0 + 1.5, ["a", "late"]) == (4_999, False)


def test_the_subtask_is_idle_only_when_every_split_is() -> None:
    marks = SplitWatermarks(strategy(idleness_ms=100), ["a", "b"], T0)
    marks.read("a", 2_000, T0)
    marks.read("b", 1_000, T0)
    assert marks.check(T0 + 0.01, ["a", "b"]) == (999, False)
    marks.read("b", 1_500, T0 + 0.15)  # "a" idle, "b" not: event time follows "b"
    assert marks.check(T0 + 0.15, ["a", "b"]) == (1_499, False)
    assert marks.check(T0 + 0.3, ["a", "b"]) == (None, True)  # both idle
    marks.read("a", 3_000, T0 + 0.31)  # records end idleness with their watermark
    assert marks.check(T0 + 0.32, ["a", "b"]) == (2_999, False)


def test_a_split_with_records_since_the_last_check_is_never_idle() -> None:
    """Records read after a long silence send their watermark at the next check, even
    when that check comes later than the idleness (Flink's WatermarksWithIdleness)."""
    marks = SplitWatermarks(strategy(idleness_ms=1), ["a"], T0)
    marks.read("a", 7_000, T0)
    assert marks.check(T0 + 5, ["a"]) == (6_999, False)
    assert marks.check(T0 + 5.1, ["a"]) == (None, True)


def test_a_finished_split_is_released_and_no_longer_holds_event_time_back() -> None:
    marks = SplitWatermarks(strategy(), ["a", "b"], T0)
    marks.read("a", 9_000, T0)
    marks.read("b", 1_000, T0)
    assert marks.check(T0, ["a", "b"]) == (999, False)
    assert marks.check(T0 + 0.1, ["a"]) == (8_999, False)  # "b" at its end
    assert marks.splits == ["a"]


def test_a_reader_without_splits_is_idle_after_the_idleness_only() -> None:
    """A subtask with no partition (fewer partitions than subtasks): idle once the
    idleness passed; without idleness it holds event time back, as in Flink."""
    assert SplitWatermarks(strategy(idleness_ms=200), [], T0).check(T0 + 0.1, []) == (
        None, False)
    assert SplitWatermarks(strategy(idleness_ms=200), [], T0).check(T0 + 0.2, []) == (
        None, True)
    assert SplitWatermarks(strategy(), [], T0).check(T0 + 3_600, []) == (None, False)


# ------------------------------------------------------------- settings, no broker


def test_a_strategy_given_to_the_source_is_the_streams_unless_given_twice(
    tmp_path: Path
) -> None:
    """``KafkaSource(watermarks=)`` (the issue's names) is what ``from_source`` uses;
    a second, different strategy given to ``from_source`` is refused."""
    from weir.errors import ConfigurationError

    made = strategy(idleness_ms=100)
    env = StreamEnvironment(config=weir.JobConfig(tmp_path / "chk"))
    source = KafkaSource("127.0.0.1:9092", "in", watermarks=made)
    env.from_source(source, uid="a")
    assert env._nodes[-1].op.watermarks is made
    env.from_source(source, uid="b", watermarks=made)
    with pytest.raises(ConfigurationError, match="give it once"):
        env.from_source(source, uid="c", watermarks=strategy())
    with pytest.raises(ConfigurationError, match="WatermarkStrategy"):
        KafkaSource("127.0.0.1:9092", "in", watermarks="5 s")  # type: ignore[arg-type]


def test_settings_are_checked_as_the_source_is_made() -> None:
    with pytest.raises(weir.ConfigurationError, match=r"milliseconds since the epoch.*-1"):
        KafkaSource("127.0.0.1:9092", "in", starting_offsets=KafkaSource.timestamp(-1))
    with pytest.raises(weir.ConfigurationError, match="aware datetime"):
        KafkaSource("127.0.0.1:9092", "in",
                    starting_offsets=datetime.datetime(2024, 1, 1))
    with pytest.raises(weir.ConfigurationError, match="group_id to commit"):
        KafkaSource("127.0.0.1:9092", "in", commit_offsets_on_checkpoint=True)
    with pytest.raises(weir.ConfigurationError, match=r"KafkaSource\.timestamp"):
        KafkaSource("127.0.0.1:9092", "in", starting_offsets="newest")
    at = datetime.datetime(2024, 1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))
    source = KafkaSource("127.0.0.1:9092", "in", starting_offsets=at)
    assert source.starting_offsets == StartingTimestamp(1_704_067_200_000)  # (00:00 UTC)
    assert KafkaSource("127.0.0.1:9092", "in", group_id="g").commit_offsets
    assert not KafkaSource("127.0.0.1:9092", "in", group_id="g",
                           commit_offsets_on_checkpoint=False).commit_offsets
    assert not KafkaSource("127.0.0.1:9092", "in").commit_offsets


# -------------------------------------------------------------------- on a broker


def produce_at(bootstrap: str, topic: str, partition: int, times: range) -> None:
    """One record per time of ``times`` into ``partition``, with that timestamp (the
    value is the time too)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for ts in times:
        producer.produce(topic, value=str(ts).encode(), partition=partition, timestamp=ts)
    assert producer.flush(30) == 0


def partition_and_time(record: KafkaRecord) -> list[int]:
    return [record.partition, int(record.value or b"")]


class Timers(weir.KeyedProcessFunction[int, list[Any]]):
    """Each record [partition, time] sets an event-time timer at its time; a timer that
    fires writes ["timer", time]."""

    def process_element(self, value: list[int], ctx: Any) -> Any:
        ctx.timer_service.register_event_time_timer(ctx.timestamp)
        yield ["record", value[1]]

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield ["timer", timestamp]


def timers_job(tmp_path: Path, bootstrap: str, topic: str,
               watermarks: WatermarkStrategy) -> JobClient:
    """An unbounded KafkaSource at parallelism 1 (both partitions in one subtask) →
    :class:`Timers` → a FileSink, running."""
    env = StreamEnvironment(config=weir.JobConfig(
        tmp_path / "chk", parallelism=1, checkpointing=CheckpointConfig(interval=100)))
    (env.from_source(KafkaSource(bootstrap, topic, deserializer=partition_and_time),
                     uid="kafka", watermarks=watermarks)
        .key_by(lambda r: r[1] % 7)
        .process(Timers(), uid="timers")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    return env.execute_async("timers", timeout="120 s")


def output(tmp_path: Path, kind: str) -> set[int]:
    out = tmp_path / "out"
    return {r[1] for r in read_stream_sink(out) if r[0] == kind} if out.exists() else set()


def test_event_time_follows_the_partition_behind_not_the_one_ahead(
    tmp_path: Path, kafka: Broker
) -> None:
    """Partition 0 is far ahead (BASE + 100,000 ms on), partition 1 behind (BASE + 1,000
    ms on) and empty at first: the subtask's watermark is partition 1's (the smallest), so the
    timers of partition 1's records fire and none of partition 0's — one watermark
    over the subtask (the largest timestamp it read) would fire them all. While
    partition 1 is empty it holds event time back (no idleness): nothing fires."""
    topic = create_topic(kafka.bootstrap, 2)
    ahead = range(BASE + 100_000, BASE + 100_100, 10)
    behind = range(BASE + 1_000, BASE + 1_100, 10)
    produce_at(kafka.bootstrap, topic, 0, ahead)
    client = timers_job(tmp_path, kafka.bootstrap, topic, strategy())
    try:
        wait_for(client, "partition 0's records", lambda: output(tmp_path, "record") >= set(ahead))
        produce_at(kafka.bootstrap, topic, 1, behind)
        wait_for(client, "partition 1's timers (or any of partition 0's)",
                 lambda: output(tmp_path, "timer") >= set(behind[:-1])
                 or bool(output(tmp_path, "timer") & set(ahead)))
        fired = output(tmp_path, "timer")
    finally:
        client.cancel()
    assert fired == set(behind[:-1])  # (the watermark is BASE + 1,089: the last waits)


def test_an_empty_partition_holds_event_time_back_only_until_it_is_idle(
    tmp_path: Path, kafka: Broker
) -> None:
    """Partition 1 never has a record; with idleness it stops holding event time back
    and partition 0's timers fire (without idleness none would: the test above)."""
    topic = create_topic(kafka.bootstrap, 2)
    times = range(BASE + 5_000, BASE + 5_100, 10)
    produce_at(kafka.bootstrap, topic, 0, times)
    client = timers_job(tmp_path, kafka.bootstrap, topic, strategy(idleness_ms=300))
    try:
        wait_for(client, "partition 0's timers",
                 lambda: output(tmp_path, "timer") >= set(times[:-1]))
        fired = output(tmp_path, "timer")
    finally:
        client.cancel()
    assert fired == set(times[:-1])


def values_job(tmp_path: Path, source: KafkaSource, name: str) -> list[Any]:
    """``source`` (bounded) into a FileSink, run to its end: the records written."""
    env = StreamEnvironment(config=weir.JobConfig(
        tmp_path / f"chk-{name}", parallelism=2, checkpointing=CheckpointConfig(interval=100)))
    env.from_source(source, uid="kafka").sink_to(FileSink(tmp_path / name), uid="sink")
    result = env.execute(name, timeout="120 s")
    assert result.completed
    return read_stream_sink(tmp_path / name)


def value(record: KafkaRecord) -> int:
    return int(record.value or b"")


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return [tp.offset for tp in consumer.committed(
            [TopicPartition(topic, p) for p in range(partitions)], timeout=30)]
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    from weir.connectors.kafka_offsets import offset_bounds

    bounds = offset_bounds(bootstrap, [(topic, p) for p in range(partitions)])
    return [bounds[(topic, p)][1] for p in range(partitions)]


def test_completed_checkpoints_commit_the_offsets_to_the_group_for_the_next_job(
    tmp_path: Path, kafka: Broker
) -> None:
    """With a group_id, the group's committed offsets follow the completed checkpoints
    (a bounded job: its ends); a new job starting at the group's offsets reads only
    what came after."""
    topic, group = create_topic(kafka.bootstrap, 3), "weir-test-monitoring"
    produce(kafka.bootstrap, topic, 300)
    first = values_job(tmp_path, KafkaSource(kafka.bootstrap, topic, group_id=group,
                                             bounded=True, deserializer=value), "first")
    assert sorted(first) == list(range(300))
    assert committed(kafka.bootstrap, group, topic, 3) == end_offsets(kafka.bootstrap, topic, 3)
    produce(kafka.bootstrap, topic, 100)
    second = values_job(tmp_path, KafkaSource(
        kafka.bootstrap, topic, group_id=group, starting_offsets="committed", bounded=True,
        deserializer=value), "second")
    assert sorted(second) == list(range(100))


def read_at_least(reader: Any, n: int, batch: int) -> list[Any]:
    """Poll ``reader`` (``batch`` at a time) until it returned ``n`` records or more."""
    out: list[Any] = []
    deadline = time.monotonic() + 30
    while len(out) < n:
        assert time.monotonic() < deadline, f"read {len(out)} of {n} records in 30 s"
        out += reader.poll(batch)
    return out


def test_a_checkpoint_commits_the_offsets_of_its_trigger_not_later_ones(
    kafka: Broker
) -> None:
    """The reader commits what the checkpoint holds — its positions at the trigger —
    when the checkpoint completes, though it read on in between; a checkpoint it has no
    positions of (one completed before, or a savepoint's) commits nothing."""
    topic, group = create_topic(kafka.bootstrap, 1), "weir-test-trigger-offsets"
    produce(kafka.bootstrap, topic, 100)
    reader = KafkaSource(kafka.bootstrap, topic, group_id=group).reader(0, 1, None)
    try:
        first = read_at_least(reader, 1, batch=10)
        at_trigger = reader.snapshot_positions(7)[0][2]
        read_at_least(reader, 100 - len(first), batch=100)
        reader.notify_checkpoint_complete(7)
        reader.notify_checkpoint_complete(8)
    finally:
        reader.close()  # (waits for the commit in flight)
    assert at_trigger == len(first) <= 10
    assert committed(kafka.bootstrap, group, topic, 1) == [at_trigger]


def test_no_offsets_are_committed_when_turned_off(tmp_path: Path, kafka: Broker) -> None:
    topic, group = create_topic(kafka.bootstrap, 2), "weir-test-no-commits"
    produce(kafka.bootstrap, topic, 50)
    values_job(tmp_path, KafkaSource(kafka.bootstrap, topic, group_id=group, bounded=True,
                                     deserializer=value, commit_offsets_on_checkpoint=False),
               "off")
    assert all(offset < 0 for offset in committed(kafka.bootstrap, group, topic, 2))


def test_a_start_at_a_timestamp_begins_at_the_first_record_at_or_after_it(
    tmp_path: Path, kafka: Broker
) -> None:
    """Partition 0 has records at BASE + 1,000 .. 1,090 ms, partition 1 at BASE + 500 ..
    590: from BASE + 1,045 ms, partition 0 starts at BASE + 1,050 and partition 1, with
    no record that late, at its end (Flink's OffsetsInitializer.timestamp)."""
    topic = create_topic(kafka.bootstrap, 2)
    produce_at(kafka.bootstrap, topic, 0, range(BASE + 1_000, BASE + 1_100, 10))
    produce_at(kafka.bootstrap, topic, 1, range(BASE + 500, BASE + 600, 10))
    out = values_job(tmp_path, KafkaSource(
        kafka.bootstrap, topic, bounded=True, deserializer=value,
        starting_offsets=KafkaSource.timestamp(BASE + 1_045)), "from-time")
    assert sorted(out) == list(range(BASE + 1_050, BASE + 1_100, 10))


# ------------------------------------------------ split ownership and partition discovery


def test_partitions_go_to_subtasks_by_flinks_rule() -> None:
    """Flink's ``getSplitOwner``: from a start picked by the topic name's Java hash, a
    topic's partitions go round the subtasks — each partition has one owner, and a
    topic's partitions are spread evenly."""
    from weir.connectors.kafka_source import _java_hash, split_owner

    assert (_java_hash("hello"), _java_hash(""), _java_hash("é€")) == (99162322, 0, 15587)
    start = ((_java_hash("payments") * 31) & 0x7FFFFFFF) % 3
    assert [split_owner("payments", p, 3) for p in range(6)] == [
        (start + p) % 3 for p in range(6)]
    for parallelism in (1, 2, 5):
        owners = [split_owner("t", p, parallelism) for p in range(10 * parallelism)]
        assert sorted(owners.count(s) for s in range(parallelism)) == [10] * parallelism


def test_a_restore_at_another_parallelism_gives_each_partition_one_reader(
    kafka: Broker
) -> None:
    """The positions of a checkpoint (every subtask's: union) restored at 3 subtasks:
    every partition is read by exactly one reader, from its checkpointed offset."""
    topic = create_topic(kafka.bootstrap, 7)
    source = KafkaSource(kafka.bootstrap, topic)
    positions = [[topic, p, 10 + p, None] for p in range(7)]
    readers = [source.reader(s, 3, [list(p) for p in positions]) for s in range(3)]
    try:
        kept = sorted(tuple(p) for r in readers for p in r.positions())
    finally:
        for reader in readers:
            reader.close()
    assert kept == sorted(tuple(p) for p in positions)


def test_an_unbounded_source_on_a_pattern_discovers_a_new_topic(
    tmp_path: Path, kafka: Broker
) -> None:
    """A topic made while the job runs that matches the source's pattern is read from
    its first record, by one subtask (Flink's partition discovery); each of its records
    once in the committed output."""
    import re
    import uuid

    prefix = f"disc-{uuid.uuid4().hex[:8]}"
    first = create_topic(kafka.bootstrap, 2, f"{prefix}-a")
    produce(kafka.bootstrap, first, 50)
    env = StreamEnvironment(config=weir.JobConfig(
        tmp_path / "chk", parallelism=2, checkpointing=CheckpointConfig(interval=100)))
    (env.from_source(KafkaSource(kafka.bootstrap, re.compile(f"{prefix}-.*"),
                                 deserializer=lambda r: [r.topic, value(r)],
                                 partition_discovery_interval="200 ms"), uid="kafka")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    client = env.execute_async("discovery", timeout="120 s")

    def seen(topic: str) -> list[int]:
        out = tmp_path / "out"
        return sorted(r[1] for r in read_stream_sink(out) if r[0] == topic) if out.exists() else []

    try:
        wait_for(client, "the first topic's records", lambda: len(seen(first)) == 50)
        later = create_topic(kafka.bootstrap, 3, f"{prefix}-b")
        produce(kafka.bootstrap, later, 60)
        wait_for(client, "the new topic's records", lambda: len(seen(later)) >= 60)
        time.sleep(0.5)  # (a record read twice would be committed by now)
        got = seen(first), seen(later)
    finally:
        client.cancel()
    assert got == (list(range(50)), list(range(60)))
