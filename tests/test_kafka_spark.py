"""``weir-kafka``: the micro-batch runtime's Kafka source and exactly-once Kafka sink,
on real Spark against a real broker (noida-db). A weir stage counts per key and writes each count
to Kafka; the oracle: every input record once in the ``read_committed`` output (L, D)
and each key's counts 1..k (M). The replay test fails a batch after one of its tasks
has committed its transaction: the restarted query replays the batch with the same id
and that task's partition must not appear twice."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import weir
import weir.connectors.spark
import weir.spark
from kafka_support import Broker, create_topic
from spark_support import KEYED, Count, by_value, keyed_records, write_file
from weir.connectors.kafka import read_kafka
from weir.state.keygroups import (
    assign_key_to_parallel_operator,
    compute_default_max_parallelism,
)

pytestmark = pytest.mark.spark

KEYS = 40


class FailOnce(Count):
    """Count, failing its task once at the record with ``seq == at`` (a token file:
    the replay goes past it) — once ``topic`` holds more than ``after`` records, so the
    batch's other task has committed its part when this one fails (else Spark may
    cancel that task first, and nothing of the batch is committed to replay)."""

    def __init__(self, token: str, at: int, bootstrap: str = "", topic: str = "",
                 after: int = 0) -> None:
        self.token, self.at = token, at
        self.bootstrap, self.topic, self.after = bootstrap, topic, after

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        if value["seq"] == self.at and os.path.exists(self.token):
            os.remove(self.token)
            import time

            deadline = time.monotonic() + 60
            while (self.topic and time.monotonic() < deadline
                   and len(read_kafka(self.bootstrap, self.topic)) <= self.after):
                time.sleep(0.1)
            raise RuntimeError(f"injected failure at seq {self.at}")
        yield from super().process_element(value, ctx)


def start(spark: Any, tmp_path: Path, bootstrap: str, topic: str, function: Any) -> Any:
    config = weir.JobConfig(tmp_path / "weir", parallelism=2)
    events = (spark.readStream.schema("key string, seq long").option("maxFilesPerTrigger", 1)
              .parquet(str(tmp_path / "in")))
    counts = weir.spark.process(events, "key", function,
                                "key string, seq long, n long, subtask int", "count", config)
    return (counts.selectExpr("key", "to_json(struct(key, seq, n)) AS value")
            .writeStream.format("weir-kafka")
            .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
            .option("checkpointLocation", str(tmp_path / "spark"))
            .trigger(availableNow=True).start())


def ldm(bootstrap: str, topic: str, n: int) -> tuple[int, int, int]:
    rows = [json.loads(r.value or b"") for r in read_kafka(bootstrap, topic)]
    seqs = Counter(r["seq"] for r in rows)
    lost = len(set(range(n)) - set(seqs))
    duplicated = sum(c - 1 for c in seqs.values() if c > 1)
    per_key: dict[str, list[int]] = {}
    for r in rows:
        per_key.setdefault(r["key"], []).append(r["n"])
    expected = Counter(r["key"] for r in keyed_records(0, n, KEYS))
    wrong = sum(sorted(per_key.get(k, [])) != list(range(1, c + 1)) for k, c in expected.items())
    return lost, duplicated, wrong


def test_a_query_writes_every_count_to_kafka_exactly_once(
    spark: Any, tmp_path: Path, kafka: Broker
) -> None:
    by_value()
    weir.connectors.spark.register_sinks(spark)
    for i in range(3):
        write_file(tmp_path / "in", keyed_records(i * 400, 400, KEYS), KEYED)
    topic = create_topic(kafka.bootstrap, 3)
    query = start(spark, tmp_path, kafka.bootstrap, topic, Count())
    query.awaitTermination()
    weir.spark.finish(query)
    counts = ldm(kafka.bootstrap, topic, 1_200)
    print(f"L={counts[0]} D={counts[1]} M={counts[2]} | failures injected=0")
    assert counts == (0, 0, 0)


def test_a_batch_replayed_after_a_failure_writes_each_partition_once(
    spark: Any, tmp_path: Path, kafka: Broker
) -> None:
    """Batch 1 fails in subtask 1's task after subtask 0's task committed its
    transaction; the query started again replays batch 1: subtask 0's partition finds
    its marker and writes nothing, subtask 1's writes once."""
    by_value()
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    weir.connectors.spark.register_sinks(spark)
    for i in range(3):
        write_file(tmp_path / "in", keyed_records(i * 400, 400, KEYS), KEYED)
    topic = create_topic(kafka.bootstrap, 3)
    token = tmp_path / "fail-once"
    token.touch()
    victim = next(r["seq"] for r in keyed_records(400, 400, KEYS)
                  if assign_key_to_parallel_operator(
                      r["key"], compute_default_max_parallelism(2), 2) == 1)
    query = start(spark, tmp_path, kafka.bootstrap, topic,
                  FailOnce(str(token), victim, kafka.bootstrap, topic, after=400))
    with pytest.raises(Exception, match="injected failure"):
        query.awaitTermination()
    query.stop()
    assert not token.exists()
    first = len(read_kafka(kafka.bootstrap, topic))
    assert 400 < first < 800  # (batch 0, and subtask 0's part of batch 1)
    query = start(spark, tmp_path, kafka.bootstrap, topic, FailOnce(str(token), victim))
    query.awaitTermination()
    weir.spark.finish(query)
    counts = ldm(kafka.bootstrap, topic, 1_200)
    print(f"L={counts[0]} D={counts[1]} M={counts[2]} | failures injected=1 "
          f"(after {first - 400} of batch 1's records were committed)")
    assert counts == (0, 0, 0)


def test_kafka_in_a_keyed_count_kafka_out_on_spark(
    spark: Any, tmp_path: Path, kafka: Broker
) -> None:
    """``spark.readStream.format("weir-kafka")`` → a weir stage → ``weir-kafka``, in
    batches of at most 500 offsets, stopped and started again halfway: every record's
    count once (L = D = M = 0), the restarted query going on from Spark's offsets."""
    from confluent_kafka import Producer

    by_value()
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    weir.connectors.spark.register_sinks(spark)
    source, sink = create_topic(kafka.bootstrap, 3), create_topic(kafka.bootstrap, 2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})

    def produce(records: list[dict[str, Any]]) -> None:
        for r in records:
            producer.produce(source, key=r["key"].encode(), value=json.dumps(r).encode())
        assert producer.flush(30) == 0

    def run() -> None:
        config = weir.JobConfig(tmp_path / "weir", parallelism=2)
        raw = (spark.readStream.format("weir-kafka")
               .option("kafka.bootstrap.servers", kafka.bootstrap).option("subscribe", source)
               .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 500)
               .load())
        events = raw.selectExpr("CAST(value AS STRING) AS json").selectExpr(
            "get_json_object(json, '$.key') AS key",
            "CAST(get_json_object(json, '$.seq') AS BIGINT) AS seq")
        counts = weir.spark.process(events, "key", Count(),
                                    "key string, seq long, n long, subtask int", "count", config)
        query = (counts.selectExpr("key", "to_json(struct(key, seq, n)) AS value")
                 .writeStream.format("weir-kafka")
                 .option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", sink)
                 .option("checkpointLocation", str(tmp_path / "spark"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        weir.spark.finish(query)
        # (maxOffsetsPerTrigger: 1,200 records in three batches, not one)
        assert sum(1 for p in query.recentProgress if p.numInputRows) >= 3

    produce(keyed_records(0, 1_200, KEYS))
    run()
    assert len(read_kafka(kafka.bootstrap, sink)) == 1_200
    produce(keyed_records(1_200, 1_200, KEYS))
    run()
    counts = ldm(kafka.bootstrap, sink, 2_400)
    print(f"L={counts[0]} D={counts[1]} M={counts[2]} | restarts of the query=1")
    assert counts == (0, 0, 0)


def test_the_source_gives_spark_kafka_columns_and_headers_on_request(
    spark: Any, tmp_path: Path, kafka: Broker
) -> None:
    """Spark's Kafka columns, and ``headers`` (array of key/value structs) with
    ``includeHeaders=true``, as Spark's own Kafka source; without it, no such column."""
    from confluent_kafka import Producer

    weir.connectors.spark.register_sinks(spark)
    topic = create_topic(kafka.bootstrap, 1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(topic, key=b"k", value=b"v", headers=[("trace", b"t-1"), ("n", b"2")])
    assert producer.flush(30) == 0

    def read(name: str, **options: str) -> list[Any]:
        reader = (spark.readStream.format("weir-kafka")
                  .option("kafka.bootstrap.servers", kafka.bootstrap)
                  .option("subscribe", topic).option("startingOffsets", "earliest"))
        for key, value in options.items():
            reader = reader.option(key, value)
        query = (reader.load().writeStream.format("memory").queryName(name)
                 .option("checkpointLocation", str(tmp_path / name))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        return spark.sql(f"SELECT * FROM {name}").collect()

    (plain,) = read("kafka_plain")
    assert (plain.key, plain.value, plain.topic, plain.partition, plain.offset) == (
        b"k", b"v", topic, 0, 0)
    assert "headers" not in plain.asDict()
    (row,) = read("kafka_headers", includeHeaders="true")
    assert [(h.key, bytes(h.value)) for h in row.headers] == [("trace", b"t-1"), ("n", b"2")]


def test_partitions_added_while_a_query_runs_are_read_from_their_start(
    spark: Any, tmp_path: Path, kafka: Broker
) -> None:
    """A topic grows from one partition to three between two runs of a query: the
    restarted query reads the new partitions from their earliest offset (Spark's Kafka
    source does), besides going on in the old one."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewPartitions

    weir.connectors.spark.register_sinks(spark)
    topic = create_topic(kafka.bootstrap, 1)

    def produce(values: range, partitions: int) -> None:
        producer = Producer({"bootstrap.servers": kafka.bootstrap})  # (fresh metadata)
        for v in values:
            producer.produce(topic, value=str(v).encode(), partition=v % partitions)
        assert producer.flush(30) == 0

    def run() -> list[int]:
        query = (spark.readStream.format("weir-kafka")
                 .option("kafka.bootstrap.servers", kafka.bootstrap).option("subscribe", topic)
                 .option("startingOffsets", "earliest").load()
                 .selectExpr("CAST(CAST(value AS STRING) AS INT) AS v").writeStream
                 .format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "chk"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        return sorted(r.v for r in spark.read.parquet(str(tmp_path / "out")).collect())

    produce(range(0, 30), 1)
    assert run() == list(range(30))
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, 3)]).values():
        future.result(30)
    produce(range(30, 90), 3)
    assert run() == list(range(90))
