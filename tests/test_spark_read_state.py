"""``weir.read_state`` over a Spark stage's checkpoint_location (real Spark, p = 2, both
backends): the stage's current state, an earlier query's, a chosen batch."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import weir
import weir.spark
from spark_support import (  # type: ignore[import-not-found]
    KEYED,
    Count,
    by_value,
    keyed_records,
    run,
    write_file,
)

SCHEMA = "key string, seq long"
COUNT_OUT = "key string, seq long, n long, subtask int"


@pytest.fixture(autouse=True)
def _pickle_by_value() -> None:
    by_value()


def _counts(reader: weir.StateReader) -> dict[str, int]:
    frame = reader.keyed_state("count", "count")
    return dict(zip(frame["key"], frame["value"], strict=True))


@pytest.mark.spark
def test_a_checkpoint_location_reads_each_stages_current_or_chosen_state(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    location = str(tmp_path / "weir")

    def build(events: Any) -> Any:
        return weir.spark.process(
            events,
            key_by="key",
            function=Count(),
            output_schema=COUNT_OUT,
            uid="count",
            heartbeat=False,
            config=weir.JobConfig(location, state_backend=backend),
            parallelism=2,
        )

    first, second = keyed_records(0, 600, 40), keyed_records(600, 600, 40)
    write_file(tmp_path / "a", first[:300], KEYED)
    write_file(tmp_path / "a", first[300:], KEYED)
    run(spark, tmp_path / "a", SCHEMA, build, tmp_path / "spark-1")
    (q1,) = [p.name for p in (tmp_path / "weir").glob("stages/*/queries/*")]
    write_file(tmp_path / "b", second, KEYED)
    run(spark, tmp_path / "b", SCHEMA, build, tmp_path / "spark-2")  # a second query

    current = weir.read_state(location)
    assert current.uids == ["count"]
    assert _counts(current) == Counter(r["key"] for r in first + second)
    assert [s.name for s in current.states("count")] == ["count"]
    # the first query's newest batch, and its first batch (one file per batch)
    assert _counts(weir.read_state(location, query=q1)) == Counter(r["key"] for r in first)
    assert _counts(weir.read_state(location, checkpoint_id=0, query=q1)) == Counter(
        r["key"] for r in first[:300])
    assert _counts(weir.read_state(location, uid="count", checkpoint_id=1)) == Counter(
        r["key"] for r in first)  # only the first query has a batch 1
    with pytest.raises(weir.NoCheckpointError, match="no completed batch 7"):
        weir.read_state(location, checkpoint_id=7)
    # weir checkpoint list: both queries' batches, the first query's first
    listed = subprocess.run([str(Path(sys.executable).parent / "weir"), "checkpoint", "list",
                             location, "--json"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["query"] == q1, r["checkpoint_id"], r["operators"]) for r in rows
            if r["status"] == "completed"
            ] == [(True, 0, ["count"]), (True, 1, ["count"]), (False, 0, ["count"])]


@pytest.mark.spark
def test_a_bootstrapped_savepoint_drives_a_spark_query_at_parallelism_3(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    """State written from a DataFrame (``weir.write_savepoint``) is what a Spark stage
    restored from it counts on, over p = 3 subtasks; the stage's own checkpoint then
    reads back as bootstrap + input."""
    import pandas as pd

    from spark_support import COUNT, BatchSink, last_counts  # type: ignore[import-not-found]

    records = keyed_records(0, 600, 40)
    keys = sorted({r["key"] for r in records})
    boot = {k: 1000 + i for i, k in enumerate(keys[:30])}  # 10 keys start from nothing
    url = weir.write_savepoint(
        tmp_path / "boot", uid="count", max_parallelism=128, parallelism=2,
        states={"count": pd.DataFrame({"key": list(boot), "value": list(boot.values())})},
        descriptors=[COUNT])
    location = str(tmp_path / "weir")

    def build(events: Any) -> Any:
        return weir.spark.process(
            events,
            key_by="key",
            function=Count(),
            output_schema=COUNT_OUT,
            uid="count",
            heartbeat=False,
            config=weir.JobConfig(location, state_backend=backend, restore_from=url),
            parallelism=3,
        )

    write_file(tmp_path / "in", records, KEYED)
    sink = run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark", BatchSink())
    expected = {k: boot.get(k, 0) + n for k, n in Counter(r["key"] for r in records).items()}
    assert last_counts(sink.rows()) == expected
    assert {row[3] for row in sink.rows()} == {0, 1, 2}  # three subtasks counted
    assert _counts(weir.read_state(location)) == expected
    made = subprocess.run([str(Path(sys.executable).parent / "weir"), "savepoint", "create",
                           location, str(tmp_path / "sp")], capture_output=True, text=True,
                          timeout=120)  # the stage's current state, from the command line
    assert made.returncode == 0, made.stderr
    assert _counts(weir.read_state(made.stdout.strip())) == expected


@pytest.mark.spark
def test_the_weir_state_source_reads_state_spread_over_four_subtasks_in_parallel(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    location = str(tmp_path / "weir")

    def build(events: Any) -> Any:
        return weir.spark.process(
            events,
            key_by="key",
            function=Count(),
            output_schema=COUNT_OUT,
            uid="count",
            heartbeat=False,
            config=weir.JobConfig(location, state_backend=backend),
            parallelism=4,
        )

    records = keyed_records(0, 800, 60)
    write_file(tmp_path / "in", records[:400], KEYED)
    write_file(tmp_path / "in", records[400:], KEYED)
    run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark")
    weir.spark.register_state_source(spark)
    frame = (spark.read.format("weir-state").option("uid", "count").option("state", "count")
             .load(location))
    assert frame.schema.simpleString() == "struct<key:string,value:bigint>"
    assert frame.rdd.getNumPartitions() == 4  # one per stored subtask
    per_partition = frame.rdd.glom().map(len).collect()
    assert len([n for n in per_partition if n]) == 4  # every subtask's part holds keys
    assert dict(frame.collect()) == Counter(r["key"] for r in records)
    assert frame.filter("value > 10").count() == sum(
        1 for n in Counter(r["key"] for r in records).values() if n > 10)
    with pytest.raises(Exception, match="no keyed state 'nope'"):
        spark.read.format("weir-state").option("state", "nope").load(location).collect()


@pytest.mark.spark
def test_the_weir_state_source_reads_every_kind_of_table(spark: Any, tmp_path: Path) -> None:
    """Lists, maps, TTL columns, timers, operator and broadcast state through Spark
    equal what read_state gives (tuples and other non-scalar values as JSON)."""
    import json as json_

    from test_read_state import run as run_everything  # type: ignore[import-not-found]

    _, url = run_everything(tmp_path, "rocksdb", "incremental")
    pandas_reader = weir.read_state(url)
    weir.spark.register_state_source(spark)

    def through_spark(scope: str, state: str = "") -> list[tuple[Any, ...]]:
        reader = spark.read.format("weir-state").option("scope", scope)
        if state:
            reader = reader.option("state", state)
        return sorted((tuple(r) for r in reader.load(url).collect()), key=repr)

    def expected(frame: Any, strings: tuple[int, ...] = (0,)) -> list[tuple[Any, ...]]:
        """``frame``'s rows as Spark shows them: the columns ``strings`` are string
        columns, where a value that is not text is JSON."""
        def cell(i: int, v: Any) -> Any:
            return json_.dumps(v, sort_keys=True) if i in strings and not isinstance(
                v, str) else v
        return sorted((tuple(cell(i, v) for i, v in enumerate(row))
                       for row in frame.values.tolist()), key=repr)

    for name in ("seen", "by_tag", "total", "recent"):
        assert through_spark("keyed", name) == expected(
            pandas_reader.keyed_state("everything", name)), name
    assert through_spark("keyed", "tags") == expected(
        pandas_reader.keyed_state("everything", "tags"))  # with its TTL column
    assert through_spark("timers") == expected(pandas_reader.timers("everything"))
    assert through_spark("operator", "buffer") == expected(
        pandas_reader.operator_state("everything", "buffer"), strings=(2,))
    assert through_spark("broadcast", "rules") == expected(
        pandas_reader.broadcast_state("everything", "rules"))
