"""The Spark runtime on local[2] (one shared session): placement, exactly-once state
across replays and restarts, new queries, rescaling, savepoints, time, bad records."""

from __future__ import annotations

import collections
import datetime as dt
import itertools
import re
import struct
import time
from collections import Counter
from pathlib import Path
from typing import Any

import mmh3
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import weir
import weir.spark
from spark_support import (  # type: ignore[import-not-found]
    KEYED,
    BatchSink,
    Count,
    Placement,
    by_value,
    keyed_records,
    last_counts,
    run,
    write_file,
)
from weir.checkpoint.epochs import DRAIN_FILE, SPARK_FILE
from weir.errors import OutputSchemaError, RestoreError
from weir.runtime.spark.records import to_record_batch
from weir.runtime.spark.routing import route_table
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.testing import KeyedOperatorHarness

SCHEMA = "key string, seq long"
COUNT_OUT = "key string, seq long, n long, subtask int"


@pytest.fixture(autouse=True)
def _pickle_by_value() -> None:
    by_value()


def _oracle(records: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["key"] for r in records)


def _counts(**kwargs: Any) -> Any:
    def build(events: Any) -> Any:
        return weir.spark.process(events, key_by="key", function=Count(),
                                  output_schema=COUNT_OUT, uid="count", heartbeat=False,
                                  **kwargs)
    return build


def _state_counts(location: Path, target: Path) -> dict[str, int]:
    """Per-key state read back from a savepoint of the stage, through the harness."""
    weir.spark.savepoint(str(location), str(target))
    completed = weir.load_checkpoint(str(target))
    with KeyedOperatorHarness.restore(Count(), lambda v: v["key"], completed, uid="count",
                                      parallelism=1, subtask_index=0) as h:
        return {k: h.state_of(k, weir.ValueStateDescriptor[int]("count"))
                for k in h.keys(weir.ValueStateDescriptor[int]("count"))}


# ------------------------------------------------------------------ placement


def test_route_table_is_the_identity_under_sparks_hash_partitioning() -> None:
    for p in range(1, 65):
        table = route_table(p)
        assert len(set(table)) == p
        for i, v in enumerate(table):
            assert mmh3.hash(struct.pack("<i", v), 42) % p == i


@pytest.mark.spark
def test_route_values_match_sparks_own_hash(spark: Any) -> None:
    from pyspark.sql import functions as F

    values = sorted({v for p in (1, 2, 3, 5, 8, 64) for v in route_table(p)})
    df = spark.createDataFrame([(v,) for v in values], "v int")
    for row in df.select("v", F.hash("v").alias("h")).collect():
        assert row.h == mmh3.hash(struct.pack("<i", row.v), 42)


@pytest.mark.spark
@pytest.mark.parametrize("parallelism", [2, 3, 5])
def test_spark_partition_i_holds_exactly_subtask_is_key_groups(
    spark: Any, tmp_path: Path, parallelism: int
) -> None:
    records = keyed_records(0, 600, 97)
    for start in range(0, 600, 200):
        write_file(tmp_path / "in", records[start:start + 200], KEYED)
    sink = run(
        spark,
        tmp_path / "in",
        SCHEMA,
        lambda ev: weir.spark.process(
            ev,
            key_by="key",
            function=Placement(),
            output_schema="key string, subtask int, p int, partition int, pid int",
            uid="placement",
            config=weir.JobConfig(str(tmp_path / "weir")),
            parallelism=parallelism,
            heartbeat=False,
        ),
        tmp_path / "spark",
    )
    rows = sink.rows()
    assert len(sink.batches) == 3 and len(rows) == 600
    for key, subtask, p, partition, _pid in rows:
        assert p == parallelism
        assert subtask == partition == assign_key_to_parallel_operator(key, 128, parallelism)


# ------------------------------------------------------------------ exactly-once


@pytest.mark.spark
def test_restart_with_the_same_spark_checkpoint_continues_exactly_once(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    _count_across_a_restart(spark, tmp_path, 3000, state_backend=backend)


def _count_across_a_restart(spark: Any, tmp_path: Path, n: int, **kwargs: Any) -> None:
    """Count ``n`` records over 50 keys in two queries on the same Spark checkpoint
    (files of 500 records, half before the restart): every record out once, the last
    counts and the state equal to the oracle."""
    records = keyed_records(0, n, 50)
    build = _counts(checkpoint_location=str(tmp_path / "weir"), parallelism=2, **kwargs)
    for start in range(0, n // 2, 500):
        write_file(tmp_path / "in", records[start:start + 500], KEYED)
    sink = run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark")
    for start in range(n // 2, n, 500):
        write_file(tmp_path / "in", records[start:start + 500], KEYED)
    run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark", sink)
    rows = sink.rows()
    assert sorted(r[1] for r in rows) == list(range(n))  # no loss, no duplicate
    assert last_counts(rows) == _oracle(records)
    assert _state_counts(tmp_path / "weir", tmp_path / "sp") == _oracle(records)


@pytest.mark.spark
def test_a_rocksdb_stage_evicting_its_entry_cache_all_the_time_counts_exactly(
    spark: Any, tmp_path: Path
) -> None:
    """``rocksdb_cache_entries=2`` against 50 keys: writes are flushed by evictions in
    the middle of batches as well as before each checkpoint, across a restart."""
    _count_across_a_restart(spark, tmp_path, 2000, state_backend="rocksdb",
                            rocksdb_cache_entries=2)
    with pytest.raises(weir.ConfigurationError, match="cache_entries"):
        _counts(checkpoint_location=str(tmp_path / "bad"), state_backend="rocksdb",
                rocksdb_cache_entries=-1)(spark.createDataFrame([("a", 1)], "key string, seq long"))


@pytest.mark.spark
def test_a_progress_event_of_a_trigger_without_data_completes_nothing(
    spark: Any, tmp_path: Path
) -> None:
    """Spark reports a trigger that found no new data (every
    ``noDataProgressEventInterval``) under the id the *next* batch will have, with no
    ``addBatch``: no batch ran. ``finish`` then completes the batch before it, and
    the listener completes nothing (seen in the soak: a killed and restarted job that
    waited 10 s for data failed with "Spark committed batch 12 ... but no subtask of
    this stage ran it")."""
    records = keyed_records(0, 200, 10)
    write_file(tmp_path / "in", records, KEYED)
    sink = BatchSink()
    events = spark.readStream.schema(SCHEMA).parquet(str(tmp_path / "in"))
    previous = spark.conf.get("spark.sql.streaming.noDataProgressEventInterval")
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "50")
    try:
        query = (_counts(checkpoint_location=str(tmp_path / "weir"), parallelism=2)(events)
                 .writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(tmp_path / "spark"))
                 .trigger(processingTime="100 milliseconds").start())
        try:
            deadline = time.monotonic() + 60
            while not any(p["batchId"] == 1 and "addBatch" not in p["durationMs"]
                          for p in query.recentProgress):
                assert time.monotonic() < deadline, query.recentProgress
                time.sleep(0.1)
        finally:
            query.stop()
    finally:
        spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", previous)
    assert query.lastProgress["batchId"] == 1 and "addBatch" not in query.lastProgress[
        "durationMs"]
    assert weir.spark.finish(query) == 0  # the batch that ran, complete
    assert last_counts(sink.rows()) == _oracle(records)
    assert _state_counts(tmp_path / "weir", tmp_path / "sp") == _oracle(records)


class FailOnce(Count):
    """Fails the first time it sees ``poison`` (a marker file remembers it)."""

    def __init__(self, poison: int, marker: str) -> None:
        self.poison, self.marker = poison, marker

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        if value["seq"] == self.poison and not Path(self.marker).exists():
            Path(self.marker).touch()
            raise RuntimeError("injected failure")
        yield from super().process_element(value, ctx)


@pytest.mark.spark
def test_a_failed_batch_is_replayed_from_the_previous_batch(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    records = keyed_records(0, 2000, 40)
    for start in range(0, 2000, 500):
        write_file(tmp_path / "in", records[start:start + 500], KEYED)
    marker = tmp_path / "failed"

    def build(events: Any) -> Any:
        return weir.spark.process(
            events,
            key_by="key",
            function=FailOnce(1234, str(marker)),
            output_schema=COUNT_OUT,
            uid="count",
            config=weir.JobConfig(str(tmp_path / "weir"), state_backend=backend),
            parallelism=2,
            heartbeat=False,
        )

    sink = BatchSink()
    with pytest.raises(Exception, match="injected failure"):
        run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark", sink)
    assert marker.exists() and 2 not in sink.batches  # failed in batch 2
    run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark", sink)
    rows = sink.rows()
    assert sorted(r[1] for r in rows) == list(range(2000))
    assert last_counts(rows) == _oracle(records)
    assert _unreferenced(tmp_path / "weir") == []  # the failed attempt left no orphans


def _unreferenced(location: Path) -> list[str]:
    """Files of the stage's queries no retained checkpoint references (its summary
    and chosen parts count as referenced), but for the hash map's changelog
    materializations (``m<batch>-*``): one a batch started that
    no later batch used yet (or ever, when the query stopped) is swept once it is
    MATERIALIZATION_MAX_LAG batches old (test_spark_epochs)."""
    out = []
    for query in location.glob("stages/*/queries/*"):
        coordinator = weir.CheckpointCoordinator(query, clean_up=False)
        keep = coordinator.referenced_files()
        for c in coordinator.completed_checkpoints:  # what the next batch's tasks read
            attempts = c.metadata.source_positions["spark"]["attempts"]
            keep |= {f"{c.directory}/_parts/{i}-{a}.part" for i, a in attempts.items()}
            keep.add(f"{c.directory}/_summary.json")
        out += [f for f in coordinator.storage.walk_files()
                if f not in keep and f not in (SPARK_FILE, DRAIN_FILE)
                and not re.search(r"/m\d+-[0-9a-f]+\.keyed$", f)]
    return out


@pytest.mark.spark
def test_a_new_query_starts_from_the_latest_completed_checkpoint(
    spark: Any, tmp_path: Path
) -> None:
    first = keyed_records(0, 1000, 30)
    write_file(tmp_path / "a", first, KEYED)
    build = _counts(checkpoint_location=str(tmp_path / "weir"), parallelism=2)
    run(spark, tmp_path / "a", SCHEMA, build, tmp_path / "spark-1")
    second = keyed_records(1000, 1000, 30)
    write_file(tmp_path / "b", second, KEYED)
    # a new Spark checkpoint: batch ids start at 0 again, state continues
    sink = run(spark, tmp_path / "b", SCHEMA, build, tmp_path / "spark-2")
    assert last_counts(sink.rows()) == _oracle(first + second)
    queries = list((tmp_path / "weir").glob("stages/*/queries/*"))
    assert len(queries) == 2


@pytest.mark.spark
def test_rescale_2_3_1_across_restarts(spark: Any, tmp_path: Path, backend: str) -> None:
    records = keyed_records(0, 3000, 60)
    location = str(tmp_path / "weir")
    sink = BatchSink()
    for step, p in enumerate((2, 3, 1)):
        write_file(tmp_path / "in", records[step * 1000:(step + 1) * 1000], KEYED)
        run(spark, tmp_path / "in", SCHEMA,
            _counts(checkpoint_location=location, parallelism=p, state_backend=backend),
            tmp_path / "spark", sink)
        expected = _oracle(records[: (step + 1) * 1000])
        assert last_counts(sink.rows()) == expected
        assert _state_counts(tmp_path / "weir", tmp_path / f"sp-{step}") == expected
        assert {r[3] for r in sink.batches[max(sink.batches)]} == set(range(p))


@pytest.mark.spark
def test_changing_max_parallelism_is_refused(spark: Any, tmp_path: Path) -> None:
    write_file(tmp_path / "in", keyed_records(0, 100, 10), KEYED)
    run(spark, tmp_path / "in", SCHEMA,
        _counts(checkpoint_location=str(tmp_path / "weir"), parallelism=2), tmp_path / "spark")
    events = spark.readStream.schema(SCHEMA).parquet(str(tmp_path / "in"))
    with pytest.raises(RestoreError, match=r"max_parallelism=128.*cannot change"):
        weir.spark.process(
            events,
            key_by="key",
            function=Count(),
            output_schema=COUNT_OUT,
            uid="count",
            config=weir.JobConfig(str(tmp_path / "weir"), max_parallelism=64),
            parallelism=2,
        )


# ------------------------------------------------------------------ savepoints


@pytest.mark.spark
def test_a_savepoint_from_the_test_harness_starts_a_spark_query(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    before = keyed_records(0, 500, 20)
    with KeyedOperatorHarness(Count(), lambda v: v["key"], uid="count",
                              max_parallelism=128) as h:
        h.open()
        h.process_elements(before)
        coordinator = weir.CheckpointCoordinator(tmp_path / "harness-checkpoints")
        h.savepoint(coordinator, tmp_path / "harness-savepoint")
    after = keyed_records(500, 500, 20)
    write_file(tmp_path / "in", after, KEYED)
    sink = run(spark, tmp_path / "in", SCHEMA, _counts(
        checkpoint_location=str(tmp_path / "weir"), parallelism=3, state_backend=backend,
        restore_from=str(tmp_path / "harness-savepoint")), tmp_path / "spark")
    assert last_counts(sink.rows()) == _oracle(before + after)


# ------------------------------------------------------------------ time


SHORT_LIVED = weir.ValueStateDescriptor[int]("short", ttl=weir.StateTtlConfig(ttl_ms=1000))


class Timers(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Registers an event-time timer at ts + 5 and a processing-time timer 1.5 s on;
    the latter reports whether a value written with a 1 s TTL is still visible."""

    def open(self, ctx: Any) -> None:
        self.short = ctx.get_state(SHORT_LIVED)

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        ctx.timer_service.register_event_time_timer(value["ts"] + 5)
        if value.get("proc"):
            self.short.update(1)
            ctx.timer_service.register_processing_time_timer(
                ctx.timer_service.current_processing_time + 1500)
        return ()

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        domain = ctx.time_domain.name
        if domain == "PROCESSING_TIME":
            domain += ":expired" if self.short.value() is None else ":visible"
        yield (ctx.current_key, timestamp, domain, ctx.timer_service.current_watermark)


TIMED = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("proc", pa.bool_())])
TIMER_OUT = "key string, t long, domain string, watermark long"


@pytest.mark.spark
def test_event_time_timers_fire_when_the_watermark_from_earlier_batches_passes_them(
    spark: Any, tmp_path: Path
) -> None:
    write_file(tmp_path / "in", [{"key": "a", "ts": t, "proc": False} for t in range(10)], TIMED)
    write_file(tmp_path / "in", [{"key": "b", "ts": 20, "proc": False}], TIMED)
    write_file(tmp_path / "in", [{"key": "c", "ts": 30, "proc": False}], TIMED)
    sink = run(spark, tmp_path / "in", "key string, ts long, proc boolean",
               lambda ev: weir.spark.process(ev, key_by="key", function=Timers(),
                                             output_schema=TIMER_OUT, uid="timers",
                                             config=weir.JobConfig(str(tmp_path / "weir")),
                                             parallelism=2, event_time="ts", heartbeat=False),
                                             tmp_path / "spark")
    fired = {b: sorted(r[1] for r in rows) for b, rows in sink.batches.items()}
    assert fired[0] == []
    assert fired[1] == [5, 6, 7, 8, 9]          # watermark 9 (batch 0's max)
    assert fired[2] == [10, 11, 12, 13, 14]     # watermark 20; 25 still pending
    assert all(r[3] >= r[1] for rows in sink.batches.values() for r in rows)


@pytest.mark.spark
def test_processing_time_timers_fire_without_new_input(spark: Any, tmp_path: Path) -> None:
    write_file(tmp_path / "in", [{"key": "a", "ts": 0, "proc": True}], TIMED)
    events = spark.readStream.schema("key string, ts long, proc boolean").parquet(
        str(tmp_path / "in"))
    out = weir.spark.process(events, key_by="key", function=Timers(), output_schema=TIMER_OUT,
                             uid="proc", config=weir.JobConfig(str(tmp_path / "weir")),
                             parallelism=2)  # heartbeat on
    sink = BatchSink()
    query = (out.writeStream.foreachBatch(sink).trigger(processingTime="500 milliseconds")
             .option("checkpointLocation", str(tmp_path / "spark")).start())
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any(
            r[2].startswith("PROCESSING_TIME") for r in sink.rows()
        ):
            time.sleep(0.5)
    finally:
        query.stop()
    fired = [r for r in sink.rows() if r[2].startswith("PROCESSING_TIME")]
    assert [(r[0], r[2]) for r in fired] == [("a", "PROCESSING_TIME:expired")]  # TTL too
    # the record was read in batch 0 (one file); the timer fired in a later batch that
    # only the heartbeat started
    fired_in = [b for b, rows in sink.batches.items()
                if any(r[2].startswith("PROCESSING_TIME") for r in rows)]
    assert fired_in and fired_in[0] > 0


# ------------------------------------------------------------------ bad records, outputs


class Picky(Count):
    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        if value["seq"] % 100 == 42:
            raise ValueError(f"rejected seq {value['seq']}")
        yield from super().process_element(value, ctx)


@pytest.mark.spark
def test_bad_records_go_to_the_dead_letter_output_and_the_query_goes_on(
    spark: Any, tmp_path: Path
) -> None:
    records: list[dict[str, Any]] = keyed_records(0, 400, 10)
    records[7]["key"] = None
    write_file(tmp_path / "in", records[:200], KEYED)
    write_file(tmp_path / "in", records[200:], KEYED)
    location = str(tmp_path / "weir")
    sink = run(
        spark,
        tmp_path / "in",
        SCHEMA,
        lambda ev: weir.spark.process(
            ev,
            key_by="key",
            function=Picky(),
            output_schema=COUNT_OUT,
            uid="picky",
            config=weir.JobConfig(location),
            parallelism=2,
            heartbeat=False,
            bad_record_exceptions=(ValueError,),
        ),
        tmp_path / "spark",
    )
    good = [r for r in records if r["key"] is not None and r["seq"] % 100 != 42]
    assert sorted(r[1] for r in sink.rows()) == sorted(r["seq"] for r in good)
    assert last_counts(sink.rows()) == _oracle(good)
    dead = weir.spark.read_dead_letters(location)
    assert sorted(d["record"]["seq"] for d in dead) == [7, 42, 142, 242, 342]
    reasons = {d["record"]["seq"]: d["reason"] for d in dead}
    assert "key could not be computed" in reasons[7]
    assert reasons[142] == "ValueError: rejected seq 142"


def test_a_wrong_output_shape_names_the_operator_and_the_field() -> None:
    schema = pa.schema([("key", pa.string()), ("n", pa.int64())])
    with pytest.raises(OutputSchemaError, match=r"operator 'op': output field 'n' .*'x'"):
        to_record_batch([("a", 1), ("b", "x")], schema, "op")
    with pytest.raises(OutputSchemaError, match=r"3 values.*has 2 fields"):
        to_record_batch([("a", 1, 2)], schema, "op")
    with pytest.raises(OutputSchemaError, match="missing fields \\['n'\\]"):
        to_record_batch([{"key": "a"}], schema, "op")
    assert to_record_batch([{"key": "a", "n": 1}, ("b", 2)], schema, "op").num_rows == 2
    with pytest.raises(OutputSchemaError, match=r"1 values \('b',\).*has 2 fields"):
        to_record_batch([("a", 1), ("b",), ("c", 3)], schema, "op")
    assert to_record_batch([], schema, "op").num_rows == 0
    # rows that are not plain tuples (a list, a named tuple) convert as the tuples do
    pair = collections.namedtuple("pair", "key n")
    assert to_record_batch([["a", 1], pair("b", 2), ("c", 3)], schema, "op").equals(
        to_record_batch([("a", 1), ("b", 2), ("c", 3)], schema, "op"))
    assert to_record_batch([("a", 1), ("b", None)], schema, "op").to_pylist() == [
        {"key": "a", "n": 1}, {"key": "b", "n": None}]
    strict = pa.schema([("key", pa.string()), pa.field("n", pa.int64(), nullable=False)])
    with pytest.raises(OutputSchemaError, match=r"output field 'n' is NOT NULL"):
        to_record_batch([("a", 1), ("b", None)], strict, "op")


_NESTED = pa.schema([
    ("s", pa.string()), ("n", pa.int64()), ("x", pa.float64()), ("b", pa.bool_()),
    ("l", pa.list_(pa.int32())), ("t", pa.struct([("a", pa.int64()), ("c", pa.string())])),
    ("ts", pa.timestamp("us", tz="UTC")),
])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(
    st.one_of(st.none(), st.text(max_size=5)), st.one_of(st.none(), st.integers(-9, 9)),
    st.one_of(st.none(), st.floats(allow_nan=False), st.integers(-9, 9)),
    st.one_of(st.none(), st.booleans()),
    st.one_of(st.none(), st.lists(st.integers(-9, 9), max_size=3)),
    st.one_of(st.none(), st.fixed_dictionaries({"a": st.integers(-9, 9), "c": st.text(max_size=3)}),
              st.tuples(st.integers(-9, 9), st.text(max_size=3))),
    st.one_of(st.none(), st.datetimes(timezones=st.just(dt.UTC))),
), max_size=20))
def test_tuple_outputs_convert_to_what_each_column_converts_to(
    rows: list[tuple[Any, ...]],
) -> None:
    """Tuples of every kind of field (nulls, ints for a double, nested lists and
    structs, timestamps) convert to the batch each column's own conversion
    gives, or fail as it does (a struct field given as a tuple and as a dict)."""
    try:
        columns = [pa.array([r[i] for r in rows], type=f.type) for i, f in enumerate(_NESTED)]
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        with pytest.raises(OutputSchemaError, match="output field 't'"):
            to_record_batch(rows, _NESTED, "op")
        return
    assert to_record_batch(rows, _NESTED, "op").equals(
        pa.RecordBatch.from_arrays(columns, schema=_NESTED))


class WrongShape(weir.KeyedProcessFunction[dict[str, Any], Any]):
    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        yield (value["key"], "not a number")


@pytest.mark.spark
def test_a_wrong_output_shape_fails_the_query_with_the_field(spark: Any, tmp_path: Path) -> None:
    write_file(tmp_path / "in", keyed_records(0, 10, 3), KEYED)
    with pytest.raises(Exception, match="operator 'shape': output field 'n'"):
        run(
            spark,
            tmp_path / "in",
            SCHEMA,
            lambda ev: weir.spark.process(
                ev,
                key_by="key",
                function=WrongShape(),
                output_schema="key string, n long",
                uid="shape",
                config=weir.JobConfig(str(tmp_path / "weir")),
                parallelism=2,
                heartbeat=False,
            ),
            tmp_path / "spark",
        )


# ------------------------------------------------------------------ workers


@pytest.mark.spark
def test_hashmap_state_survives_tasks_moving_between_python_workers(
    spark: Any, tmp_path: Path
) -> None:
    records = keyed_records(0, 2400, 24)
    for start in range(0, 2400, 200):
        write_file(tmp_path / "in", records[start:start + 200], KEYED)

    def build(events: Any) -> Any:
        return weir.spark.process(
            events,
            key_by="key",
            function=CountWithPid(),
            output_schema="key string, seq long, n long, subtask int, pid int",
            uid="count",
            config=weir.JobConfig(str(tmp_path / "weir")),
            parallelism=2,
            heartbeat=False,
        )

    sink = run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark")
    rows = sink.rows()
    assert last_counts(rows) == _oracle(records)
    pids: dict[int, list[int]] = {}
    for b in sorted(sink.batches):
        for subtask in sorted({r[3] for r in sink.batches[b]}):
            pids.setdefault(subtask, []).append(
                next(r[4] for r in sink.batches[b] if r[3] == subtask))
    moves = sum(a != b for seq in pids.values() for a, b in itertools.pairwise(seq))
    assert moves > 0, f"tasks never changed worker: {pids}"


class CountWithPid(Count):
    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        import os

        for key, seq, n, subtask in super().process_element(value, ctx):
            yield (key, seq, n, subtask, os.getpid())


# ------------------------------------------------------------------ static input


@pytest.mark.spark
def test_a_static_dataframe_reads_the_latest_state_and_writes_none(
    spark: Any, tmp_path: Path
) -> None:
    records = keyed_records(0, 300, 10)
    write_file(tmp_path / "in", records, KEYED)
    location = str(tmp_path / "weir")
    run(spark, tmp_path / "in", SCHEMA, _counts(checkpoint_location=location, parallelism=2),
        tmp_path / "spark")
    before = sorted(p.name for p in (tmp_path / "weir").rglob("*"))
    static = spark.createDataFrame([("k1", 10_000)], SCHEMA)
    out = weir.spark.process(static, key_by="key", function=Count(), output_schema=COUNT_OUT,
                             uid="count", config=weir.JobConfig(location), parallelism=2)
    first = out.collect()
    assert [tuple(r)[:3] for r in first] == [("k1", 10_000, _oracle(records)["k1"] + 1)]
    assert [tuple(r) for r in out.collect()] == [tuple(r) for r in first]
    assert sorted(p.name for p in (tmp_path / "weir").rglob("*")) == before


# ------------------------------------------------------------------ broadcast, operator state

LIMITS = weir.MapStateDescriptor[str, int]("limits")
TOTAL = weir.ValueStateDescriptor[int]("total")


class Limits(weir.KeyedBroadcastProcessFunction[dict[str, Any], dict[str, Any], Any]):
    """Keyed side: a running total per key, alerting when it reaches the broadcast
    limit for the key's prefix. Broadcast side: ``{"prefix", "limit"}`` rules."""

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(TOTAL)

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        total = (self.total.value() or 0) + 1
        self.total.update(total)
        limit = ctx.get_broadcast_state(LIMITS).get(value["key"][:1])
        if limit is not None and total == limit:
            yield (value["key"], total, ctx.subtask_index)

    def process_broadcast_element(self, value: dict[str, Any], ctx: Any) -> None:
        ctx.get_broadcast_state(LIMITS).put(value["prefix"], value["limit"])


@pytest.mark.spark
def test_broadcast_rules_reach_every_subtask_before_the_batchs_records(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    rules_schema = pa.schema([("prefix", pa.string()), ("limit", pa.int64())])
    write_file(tmp_path / "rules", [{"prefix": "k", "limit": 3}], rules_schema)
    records = keyed_records(0, 200, 20)  # 10 records per key
    write_file(tmp_path / "in", records, KEYED)
    rules = spark.readStream.schema("prefix string, limit long").parquet(str(tmp_path / "rules"))
    sink = run(
        spark,
        tmp_path / "in",
        SCHEMA,
        lambda ev: weir.spark.process(
            ev,
            key_by="key",
            function=Limits(),
            output_schema="key string, n long, subtask int",
            uid="limits",
            config=weir.JobConfig(str(tmp_path / "weir"), state_backend=backend),
            parallelism=3,
            broadcast=rules,
            broadcast_state_descriptors=[LIMITS],
            heartbeat=False,
        ),
        tmp_path / "spark",
    )
    rows = sink.rows()
    assert sorted(r[0] for r in rows) == sorted({r["key"] for r in records})
    assert {r[1] for r in rows} == {3} and {r[2] for r in rows} == {0, 1, 2}


SEEN_COUNT = weir.ListStateDescriptor[int]("seen")


class Tally(weir.ProcessFunction[dict[str, Any], Any], weir.CheckpointedFunction):
    """Non-keyed: counts records per subtask in even-split operator list state."""

    def initialize_state(self, ctx: Any) -> None:
        self.state = ctx.operator_state_store.get_list_state(SEEN_COUNT)
        self.count = sum(self.state.get())
        self.restored = ctx.is_restored

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        self.count += 1
        yield (value["seq"], self.count, ctx.subtask_index, self.restored)

    def snapshot_state(self, ctx: Any) -> None:
        self.state.update([self.count])


@pytest.mark.spark
def test_a_non_keyed_checkpointed_function_keeps_operator_state(
    spark: Any, tmp_path: Path
) -> None:
    records = keyed_records(0, 600, 10)
    for start in range(0, 600, 200):
        write_file(tmp_path / "in", records[start:start + 200], KEYED)

    def build(events: Any) -> Any:
        return weir.spark.process(events, key_by=None, function=Tally(),
                                  output_schema="seq long, n long, subtask int, restored boolean",
                                  uid="tally", config=weir.JobConfig(str(tmp_path / "weir")),
                                  parallelism=2, heartbeat=False)

    sink = run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark")
    rows = sink.rows()
    assert sorted(r[0] for r in rows) == list(range(600))
    final = {}
    for _seq, n, subtask, _restored in rows:
        final[subtask] = max(final.get(subtask, 0), n)
    # each subtask's count runs on across batches, whether its task stayed in the
    # worker (live) or moved and restored the operator state from the parts
    assert sum(final.values()) == 600 and set(final) == {0, 1}
    for subtask in (0, 1):
        counts = [r[1] for b in sorted(sink.batches) for r in sink.batches[b] if r[2] == subtask]
        assert counts == list(range(1, len(counts) + 1))


@pytest.mark.spark
def test_the_readme_spark_quick_start_runs_as_pasted_twice_from_an_empty_directory(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's Spark quick start makes its own input, prints its result, and a
    second run (the same Spark checkpoint) counts nothing twice."""
    import re

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    (block,) = re.findall(r"```python spark\n(.*?)```", readme, re.S)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        exec(block, {"__name__": "__main__"})
        assert capsys.readouterr().out.splitlines()[-1] == "[('c0', 4), ('c1', 3), ('c2', 3)]"
    assert len(list((tmp_path / "quickstart" / "in").iterdir())) == 1


@pytest.mark.spark
def test_sparks_own_file_sink_gets_each_output_once_across_a_restart(
    spark: Any, tmp_path: Path
) -> None:
    records = keyed_records(0, 1200, 30)
    write_file(tmp_path / "in", records[:600], KEYED)

    def start() -> None:
        events = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
                  .parquet(str(tmp_path / "in")))
        out = weir.spark.process(
            events,
            key_by="key",
            function=Count(),
            output_schema=COUNT_OUT,
            uid="count",
            heartbeat=False,
            config=weir.JobConfig(str(tmp_path / "weir"), state_backend="rocksdb"),
            parallelism=2,
        )
        query = (out.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "spark"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        weir.spark.finish(query)

    start()
    write_file(tmp_path / "in", records[600:], KEYED)
    start()
    rows = [tuple(r) for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(r[1] for r in rows) == list(range(1200))
    assert last_counts(rows) == _oracle(records)


def test_completion_chooses_one_part_per_subtask_in_subtask_order_at_any_parallelism(
    tmp_path: Path,
) -> None:
    from weir.checkpoint.epochs import EpochStore, choose_parts
    from weir.checkpoint.format import SubtaskStateHandle
    from weir.state.keygroups import key_group_range_for_operator

    store = EpochStore(weir.CheckpointStorage(str(tmp_path)), "op")
    for i in reversed(range(12)):
        handle = SubtaskStateHandle(i, key_group_range_for_operator(128, 12, i), {}, (), None,
                                    {}, {}, None)
        store.write_part("q", 5, 12, 128, handle, {"attempt": f"a{i:02d}"})
    parts = store.read_parts("q", 5)
    chosen = choose_parts(parts)
    assert chosen is not None
    assert [p.handle.subtask_index for p in chosen] == list(range(12))
    assert [p.epoch["attempt"] for p in chosen] == [f"a{i:02d}" for i in range(12)]
    assert store.read_parts("q", 4) == []


# ------------------------------------------------------------------ checkpoint bytes


@pytest.mark.spark
def test_hashmap_batches_write_their_changes_and_an_idle_subtask_writes_no_state_file(
    spark: Any, tmp_path: Path
) -> None:
    records = keyed_records(0, 4000, 2000)  # batch 0: 2000 keys
    owner = {r["key"]: assign_key_to_parallel_operator(r["key"], 128, 2) for r in records}
    busy = [k for k in sorted(owner) if owner[k] == 0]
    write_file(tmp_path / "in", records, KEYED)
    write_file(tmp_path / "in", [{"key": k, "seq": 5000 + i} for i, k in enumerate(busy[:20])],
               KEYED)  # batch 1: 1% of the keys, all of subtask 0's
    location = tmp_path / "weir"

    def build(events: Any) -> Any:
        return weir.spark.process(events, key_by="key", function=Count(), output_schema=COUNT_OUT,
                                  uid="count", config=weir.JobConfig(str(location)), parallelism=2,
                                  heartbeat=False)

    run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark")
    (query,) = location.glob("stages/*/queries/*")
    first, second = (weir.load_checkpoint(str(query / f"chk-{b}")).metadata for b in (0, 1))
    full = first.total_bytes
    written = [s.stats.new_bytes for s in second.operators["count"].subtasks]
    assert 0 < written[0] <= 0.05 * full, (written, full)  # 1% of the keys changed
    assert written[1] == 0  # subtask 1 had only clock rows: no state file at all
    idle_before, idle_after = (m.operators["count"].subtasks[1].keyed for m in (first, second))
    assert idle_after == idle_before
    counts = _state_counts(location, tmp_path / "sp")
    assert counts == _oracle(records + [{"key": k} for k in busy[:20]])


# ------------------------------------------------------------------ reads per task


@pytest.mark.spark
def test_at_p_64_every_record_is_on_its_owner_and_a_task_reads_only_its_own_state(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    """p = 64 (2 key groups per subtask), one batch per run, so each batch starts
    with the previous one completed: placement holds for every record, and each
    task's storage reads (recorded in its part, kept per subtask in the batch's
    metadata) are its own state's files plus a few small ones — never every
    subtask's."""
    records = keyed_records(0, 800, 400)
    location = tmp_path / "weir"
    build = _counts(checkpoint_location=str(location), parallelism=64, state_backend=backend)
    sink = BatchSink()
    for start in range(0, 800, 400):
        write_file(tmp_path / "in", records[start:start + 400], KEYED)
        run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark", sink)
    rows = sink.rows()
    assert len(sink.batches) == 2 and sorted(r[1] for r in rows) == list(range(800))
    for key, _seq, _n, subtask in rows:
        assert subtask == assign_key_to_parallel_operator(key, 128, 64)
    assert last_counts(rows) == _oracle(records)
    (query,) = location.glob("stages/*/queries/*")
    metas = [weir.load_checkpoint(str(query / f"chk-{b}")).metadata for b in range(2)]
    for b, (before, meta) in enumerate(itertools.pairwise(metas)):
        own = {h.subtask_index: h.files() for h in before.operators["count"].subtasks}
        attempts = before.source_positions["spark"]["attempts"]
        summary = (query / f"chk-{b}" / "_summary.json").stat().st_size
        assert summary < 0.1 * (query / f"chk-{b}" / "_metadata").stat().st_size
        ios = meta.source_positions["spark_io"]["subtasks"]
        assert sorted(map(int, ios)) == list(range(64))
        for i, io in ios.items():
            files = own[int(i)]  # what a cache miss restores
            part = (query / f"chk-{b}" / "_parts" / f"{i}-{attempts[i]}.part").stat().st_size
            # + the head claim (<1 KB), the summary, the task's own part: nothing of others
            assert io["reads"] <= len(files) + 3, (i, io, len(files))
            assert io["read_bytes"] <= sum(f.size for f in files) + summary + part + 1024, (
                i, io)
            assert io["lists"] <= 1, (i, io)
    print("io of batch 1's tasks (max):", metas[1].source_positions["spark_io"]["max"])
