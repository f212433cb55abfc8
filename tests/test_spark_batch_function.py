"""A KeyedBatchFunction as a micro-batch stage: exactly-once across a restart and a
rescale, its state the per-record function's, its errors named."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import weir
import weir.spark
from spark_support import (  # type: ignore[import-not-found]
    COUNT,
    KEYED,
    BatchSink,
    Count,
    by_value,
    keyed_records,
    last_counts,
    run,
    write_file,
)
from weir.errors import ConfigurationError
from weir.testing import KeyedOperatorHarness

SCHEMA = "key string, seq long"
COUNT_OUT = "key string, seq long, n long, subtask int"


class BatchCount(weir.KeyedBatchFunction):
    """``spark_support.Count`` a batch at a time, in the same state: one get of the
    batch's keys, one put of their new counts."""

    def open(self, ctx: weir.KeyedBatchContext) -> None:
        self.count = ctx.get_state(COUNT)

    def process_batch(self, batch: pa.RecordBatch, ctx: weir.KeyedBatchContext) -> Any:
        keys = list(ctx.keys)
        distinct = list(dict.fromkeys(keys))
        current = dict(zip(distinct, self.count.get(distinct, type=pa.int64()).to_pylist(),
                           strict=True))
        counts = []
        for key in keys:
            current[key] = (current[key] or 0) + 1
            counts.append(current[key])
        self.count.put(distinct, [current[k] for k in distinct])
        return pa.record_batch(
            [batch.column("key"), batch.column("seq"), pa.array(counts, pa.int64()),
             pa.array([ctx.subtask_index] * len(keys), pa.int32())],
            names=["key", "seq", "n", "subtask"])


class Fails(weir.KeyedBatchFunction):
    def process_batch(self, batch: pa.RecordBatch, ctx: weir.KeyedBatchContext) -> Any:
        raise RuntimeError(f"injected: {batch.num_rows} rows")


@pytest.fixture(autouse=True)
def _pickle_by_value() -> None:
    by_value()
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _counts(location: Path, parallelism: int, backend: str) -> Any:
    config = weir.JobConfig(location.as_uri(),
                            state_backend=weir.api.config.state_backend_of(backend))

    def build(events: Any) -> Any:
        return weir.spark.process(events, key_by="key", function=BatchCount(),
                                  output_schema=COUNT_OUT, uid="count", heartbeat=False,
                                  config=config, parallelism=parallelism)
    return build


def _state_counts(location: Path, target: Path) -> dict[str, int]:
    """The stage's state read back through the per-record ``Count`` from a savepoint."""
    weir.spark.savepoint(str(location), str(target))
    completed = weir.load_checkpoint(str(target))
    with KeyedOperatorHarness.restore(Count(), lambda v: v["key"], completed, uid="count",
                                      parallelism=1, subtask_index=0) as h:
        return {k: h.state_of(k, COUNT) for k in h.keys(COUNT)}


@pytest.mark.spark
def test_a_batch_stage_counts_exactly_once_across_a_restart_and_a_rescale(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    """Three queries on one checkpoint location, at parallelism 2, 2 (a restart) and 3:
    every record out once with its running count, and the state a per-record ``Count``
    restores from a savepoint of the batch stage equals the oracle."""
    records = keyed_records(0, 3000, 40)
    location = tmp_path / "weir"
    sink = BatchSink()
    for step, p in enumerate((2, 2, 3)):
        for start in range(step * 1000, (step + 1) * 1000, 500):
            write_file(tmp_path / "in", records[start:start + 500], KEYED)
        run(spark, tmp_path / "in", SCHEMA,
            _counts(location, p, backend),
            tmp_path / "spark", sink)
        expected = Counter(r["key"] for r in records[: (step + 1) * 1000])
        rows = sink.rows()
        assert sorted(r[1] for r in rows) == list(range((step + 1) * 1000))  # once each
        assert last_counts(rows) == expected
        assert _state_counts(location, tmp_path / f"sp-{step}") == expected
    per_key: dict[str, list[int]] = {}
    for row in sorted(sink.rows(), key=lambda r: r[1]):  # in input order, per key: 1, 2, ...
        per_key.setdefault(row[0], []).append(row[2])
    assert all(ns == list(range(1, len(ns) + 1)) for ns in per_key.values())


@pytest.mark.spark
def test_an_exception_of_process_batch_fails_the_batch_naming_it(spark: Any, tmp_path: Path
                                                                  ) -> None:
    df = spark.createDataFrame([("a", 1), ("b", 2)], SCHEMA)
    out = weir.spark.process(df, key_by="key", function=Fails(), output_schema=COUNT_OUT,
                             uid="fails", config=weir.JobConfig(tmp_path.as_uri()),
                             parallelism=2)
    with pytest.raises(Exception, match=r"(?s)injected: \d rows.*'fails'.*process_batch"):
        out.collect()


class Validating(BatchCount):
    bad_record_exceptions = (ValueError,)


@pytest.mark.spark
def test_process_refuses_a_batch_function_without_key_by_or_with_bad_record_exceptions(
    spark: Any, tmp_path: Path
) -> None:
    df = spark.createDataFrame([("a", 1)], SCHEMA)
    config = weir.JobConfig(tmp_path.as_uri())
    with pytest.raises(ConfigurationError, match="KeyedBatchFunction needs key_by"):
        weir.spark.process(df, key_by=None, function=BatchCount(), output_schema=COUNT_OUT,
                           uid="nokey", config=config)
    with pytest.raises(ConfigurationError, match="takes no bad_record_exceptions"):
        weir.spark.process(df, key_by="key", function=Validating(), output_schema=COUNT_OUT,
                           uid="bad", config=config)


LAST = weir.ValueStateDescriptor("last", serializer=weir.IntSerializer())


class Sessions(weir.KeyedBatchFunction):
    """A key's session ends 5 ms of event time after its latest record."""

    def open(self, ctx: weir.KeyedBatchContext) -> None:
        self.last = ctx.get_state(LAST)

    def process_batch(self, batch: pa.RecordBatch, ctx: weir.KeyedBatchContext) -> Any:
        latest: dict[str, int] = {}
        for key, ts in zip(ctx.keys, batch.column("ts").to_pylist(), strict=True):
            latest[key] = max(latest.get(key, ts), ts)
        keys = list(latest)
        before = self.last.get(keys).to_pylist()
        new = [latest[k] if b is None else max(b, latest[k]) for k, b in zip(keys, before,
                                                                             strict=True)]
        self.last.put(keys, new)
        ctx.register_event_time_timers(keys, [t + 5 for t in new])
        return None

    def on_timers(self, timestamps: pa.Array, ctx: weir.KeyedBatchContext) -> Any:
        keys = list(ctx.keys)
        last = self.last.get(keys).to_pylist()
        ended = [(k, t) for k, t, b in zip(keys, timestamps.to_pylist(), last, strict=True)
                 if b is not None and b + 5 == t]
        self.last.delete([k for k, _ in ended])
        return pa.table({"key": [k for k, _ in ended], "ended": [t for _, t in ended],
                         "watermark": [ctx.current_watermark] * len(ended)})


def sessions_stage(tmp_path: Path) -> Any:
    """The Sessions batch stage over a ``key, ts`` stream, event time from ``ts``."""
    return lambda ev: weir.spark.process(
        ev, key_by="key", function=Sessions(),
        output_schema="key string, ended long, watermark long", uid="sessions",
        config=weir.JobConfig(str(tmp_path / "weir")), parallelism=2,
        event_time="ts", heartbeat=False)


@pytest.mark.spark
def test_a_batch_stages_event_time_timers_fire_when_the_watermark_passes_them(
    spark: Any, tmp_path: Path
) -> None:
    """Sessions on a stream of three files (one batch each): a session ends when the
    watermark from earlier batches passes its latest record + 5, in ``on_timers``."""
    timed = pa.schema([("key", pa.string()), ("ts", pa.int64())])
    write_file(tmp_path / "in", [{"key": "a", "ts": t} for t in (1, 3, 2)]
               + [{"key": "b", "ts": 8}], timed)
    write_file(tmp_path / "in", [{"key": "b", "ts": 12}, {"key": "c", "ts": 30}], timed)
    write_file(tmp_path / "in", [{"key": "c", "ts": 31}], timed)
    sink = run(spark, tmp_path / "in", "key string, ts long", sessions_stage(tmp_path),
               tmp_path / "spark")
    ended = {b: sorted(tuple(r) for r in rows) for b, rows in sink.batches.items()}
    assert ended[0] == []
    assert ended[1] == [("a", 8, 8)]                      # watermark 8: a's 3 + 5 reached
    assert ended[2] == [("b", 17, 30)]          # watermark 30: b's 13 is stale; c goes on


@pytest.mark.spark
def test_records_without_an_event_time_go_to_the_dead_letters_before_the_batch_function(
    spark: Any, tmp_path: Path
) -> None:
    timed = pa.schema([("key", pa.string()), ("ts", pa.int64())])
    write_file(tmp_path / "in", [{"key": "a", "ts": 1}, {"key": "b", "ts": None},
                                 {"key": "c", "ts": 2}], timed)
    run(spark, tmp_path / "in", "key string, ts long", sessions_stage(tmp_path),
        tmp_path / "spark")
    (dead,) = weir.read_dead_letters(str(tmp_path / "weir"))
    assert dead["record"] == {"key": "b", "ts": None}
    assert "null or invalid event time" in dead["reason"]
    state = weir.read_state(str(tmp_path / "weir")).keyed_state("sessions", "last")
    assert dict(zip(state["key"], state["value"], strict=True)) == {"a": 1, "c": 2}


LIMITS = weir.MapStateDescriptor[str, int]("limits")
TOTAL = weir.ValueStateDescriptor[int]("total")


class BatchLimits(weir.KeyedBroadcastBatchFunction):
    """``test_spark_runtime.Limits`` a batch at a time: a running total per key, an alert
    when it reaches the broadcast limit of the key's prefix; each rule also emits one
    row per subtask (Arrow, as the batches' outputs)."""

    def open(self, ctx: weir.KeyedBatchContext) -> None:
        self.total = ctx.get_state(TOTAL)

    def process_batch(self, batch: pa.RecordBatch, ctx: weir.KeyedBatchContext) -> Any:
        keys = list(ctx.keys)
        distinct = list(dict.fromkeys(keys))
        current = dict(zip(distinct, self.total.get(distinct, type=pa.int64()).to_pylist(),
                           strict=True))
        limits = ctx.get_broadcast_state(LIMITS)
        alerts = []
        for key in keys:
            current[key] = (current[key] or 0) + 1
            if current[key] == limits.get(key[:1]):
                alerts.append((key, current[key], ctx.subtask_index))
        self.total.put(distinct, [current[k] for k in distinct])
        return _limit_rows(alerts)

    def process_broadcast_element(self, value: dict[str, Any], ctx: Any) -> Any:
        ctx.get_broadcast_state(LIMITS).put(value["prefix"], value["limit"])
        return _limit_rows([(f"rule {value['prefix']}", value["limit"], ctx.subtask_index)])


def _limit_rows(rows: list[tuple[str, int, int]]) -> pa.RecordBatch:
    return pa.record_batch([pa.array([r[0] for r in rows], pa.string()),
                            pa.array([r[1] for r in rows], pa.int64()),
                            pa.array([r[2] for r in rows], pa.int32())],
                           names=["key", "n", "subtask"])


@pytest.mark.spark
def test_a_broadcast_batch_stage_reads_the_rules_on_every_subtask(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    """As ``test_spark_runtime``'s per-record rules test: every key's alert at its
    limit, on every subtask; the rule's own output row once per subtask."""
    rules_schema = pa.schema([("prefix", pa.string()), ("limit", pa.int64())])
    write_file(tmp_path / "rules", [{"prefix": "k", "limit": 3}], rules_schema)
    records = keyed_records(0, 200, 20)  # 10 records per key
    write_file(tmp_path / "in", records, KEYED)
    rules = spark.readStream.schema("prefix string, limit long").parquet(str(tmp_path / "rules"))
    sink = run(spark, tmp_path / "in", SCHEMA, lambda ev: weir.spark.process(
        ev, key_by="key", function=BatchLimits(),
        output_schema="key string, n long, subtask int", uid="limits",
        config=weir.JobConfig(str(tmp_path / "weir"),
                              state_backend=weir.api.config.state_backend_of(backend)),
        parallelism=3, broadcast=weir.spark.Broadcast(rules, [LIMITS]),
        heartbeat=False), tmp_path / "spark")
    rows = sink.rows()
    alerts = [r for r in rows if not r[0].startswith("rule")]
    assert sorted(r[0] for r in alerts) == sorted({r["key"] for r in records})
    assert {r[1] for r in alerts} == {3} and {r[2] for r in alerts} == {0, 1, 2}
    assert sorted(tuple(r) for r in rows if r[0].startswith("rule")) == [
        ("rule k", 3, s) for s in range(3)]
    with pytest.raises(ConfigurationError, match="needs a KeyedBroadcastBatchFunction"):
        weir.spark.process(spark.createDataFrame([("a", 1)], SCHEMA), key_by="key",
                           function=BatchCount(), output_schema=COUNT_OUT, uid="plain",
                           config=weir.JobConfig(tmp_path.as_uri()),
                           broadcast=weir.spark.Broadcast(rules, [LIMITS]))


class RejectOdd(BatchCount):
    """``BatchCount`` over the rows with an even ``seq``; the odd ones are rejected."""

    rejects_records = True

    def process_batch(self, batch: pa.RecordBatch, ctx: weir.KeyedBatchContext) -> Any:
        odd = [s % 2 == 1 for s in batch.column("seq").to_pylist()]
        ctx.reject(odd, "an odd seq")
        even = pa.array([not o for o in odd])
        keys = [k for k, o in zip(ctx.keys, odd, strict=True) if not o]
        return super().process_batch(batch.filter(even), _Keys(ctx, keys))


class _Keys:
    """``ctx`` with other keys (the rows a function passes on to another's logic)."""

    def __init__(self, ctx: Any, keys: list[Any]) -> None:
        self._ctx, self.keys = ctx, keys

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


@pytest.mark.spark
@pytest.mark.parametrize("record_format", ["dict", "tuple"])
def test_rows_a_batch_stage_rejects_are_its_dead_letters(
        spark: Any, tmp_path: Path, record_format: str) -> None:
    """Each odd row once in the dead letters, its record in the stage's record format
    (as the stage's other dead letters: a dict, or the values in column order)."""
    records = keyed_records(0, 400, 10)
    write_file(tmp_path / "in", records, KEYED)
    location = tmp_path / "weir"
    sink = run(spark, tmp_path / "in", SCHEMA, lambda ev: weir.spark.process(
        ev, key_by="key", function=RejectOdd(), output_schema=COUNT_OUT, uid="even",
        config=weir.JobConfig(location.as_uri()), parallelism=2, heartbeat=False,
        record_format=record_format), tmp_path / "spark")
    assert sorted(r[1] for r in sink.rows()) == list(range(0, 400, 2))
    dead = weir.read_dead_letters(str(location))
    assert all(d["reason"] == "an odd seq" and d["uid"] == "even" for d in dead)
    rows = [dict(zip(("key", "seq"), d["record"], strict=True)) if record_format == "tuple"
            else d["record"] for d in dead]
    assert sorted(r["seq"] for r in rows) == list(range(1, 400, 2))
    assert all(r == records[r["seq"]] for r in rows)
    assert all(isinstance(d["record"], dict) == (record_format == "dict") for d in dead)
