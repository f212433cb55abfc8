"""``state_entries`` is the number of keyed-state entries a checkpoint holds: one per
key of each value, reducing, aggregating and list state, one per (key, user key) of
each map state; timers are not counted. It is what ``weir.read_state`` returns (a
list state's rows are its elements: its keys count), on both backends and in every
snapshot mode, in the checkpoint's metadata (``weir checkpoint inspect``) and in the
Spark stage's metrics — from its checkpoints, and the same in Spark's progress when
``spark.weir.metrics`` asks for them there."""

from __future__ import annotations

import json
import operator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import weir
import weir.spark
from spark_support import (  # type: ignore[import-not-found]
    KEYED,
    BatchSink,
    Count,
    by_value,
    keyed_records,
    observed,
    stage_metrics,
    write_file,
)
from weir import (
    CheckpointCoordinator,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    StateKind,
    StateScope,
    StateTtlConfig,
    ValueStateDescriptor,
)
from weir.cli import app
from weir.state.rocksdb import RocksDBMemory
from weir.testing import KeyedOperatorHarness

VALUE = ValueStateDescriptor[int]("value")
ITEMS = ListStateDescriptor[int]("items")
TAGS = MapStateDescriptor[str, int]("tags")
NOTE = ValueStateDescriptor[str]("note", ttl=StateTtlConfig(ttl_ms=10_000_000))


class Mixed(KeyedProcessFunction[tuple[str, str, int], Any]):
    """``("put", key, n)`` writes a value, maybe a list element, a map entry, a value
    with TTL and a timer; ``("drop", key, _)`` clears the key's value, list and map;
    ``("untag", key, n)`` removes one map entry."""

    def process_element(self, value: tuple[str, str, int], ctx: Any) -> Any:
        op, _, n = value
        if op == "put":
            state = ctx.get_state(VALUE)
            state.update((state.value() or 0) + n)
            if n % 2 == 0:
                ctx.get_list_state(ITEMS).add(n)
            if n % 3 == 0:
                ctx.get_map_state(TAGS).put(f"t{n % 4}", n)
            if n % 5 == 0:
                ctx.get_state(NOTE).update(f"n{n}")
            if n % 7 == 0:
                ctx.timer_service.register_event_time_timer(10**9 + n)
        elif op == "drop":
            ctx.get_state(VALUE).clear()
            ctx.get_list_state(ITEMS).clear()
            ctx.get_map_state(TAGS).clear()
        else:
            ctx.get_map_state(TAGS).remove(f"t{n % 4}")
        return ()


def stored_entries(url: str, uid: str) -> int:
    """The keyed entries ``weir.read_state`` returns for ``uid`` at ``url``: its rows,
    but one per key of a list state (a list is one entry)."""
    reader = weir.read_state(url)
    total = 0
    for info in reader.states(uid):
        if info.scope is not StateScope.KEYED:
            continue
        frame = reader.keyed_state(uid, info.name)
        total += (frame["key"].map(repr).nunique() if info.kind is StateKind.LIST
                  else len(frame))
    return total


def recorded_entries(completed: Any, uid: str = "operator") -> int:
    return sum(s.stats.entries for s in completed.metadata.operators[uid].subtasks)


def rounds() -> list[list[tuple[str, str, int]]]:
    """Three rounds of records over 200 keys: all written; some dropped, some
    untagged, some written again; then more keys and drops."""
    first = [("put", f"k{i % 200}", i) for i in range(600)]
    second = ([("drop", f"k{i}", 0) for i in range(0, 200, 9)]
              + [("untag", f"k{i}", i) for i in range(1, 200, 5)]
              + [("put", f"k{i}", i) for i in range(100, 140)])
    third = ([("put", f"k{i}", i) for i in range(180, 260)]
             + [("drop", f"k{i}", 0) for i in range(200, 260, 4)])
    return [first, second, third]


MODES = [("hashmap", "full", None), ("hashmap", "changelog", None),
         ("hashmap", "savepoint", None), ("rocksdb", "full", None),
         ("rocksdb", "incremental", None), ("rocksdb", "changelog", None),
         ("rocksdb", "savepoint", None),
         # RocksDB states larger than the entry cache, and no entry cache at all
         ("rocksdb", "incremental", 16), ("rocksdb", "changelog", 16),
         ("rocksdb", "incremental", 0)]


@pytest.mark.parametrize(("backend", "mode", "cache_entries"), MODES)
def test_recorded_entries_are_what_read_state_returns(
    tmp_path: Path, backend: str, mode: str, cache_entries: int | None
) -> None:
    memory = RocksDBMemory(cache_entries=cache_entries) if cache_entries is not None else None
    coord = CheckpointCoordinator(tmp_path / "chk")
    checkpoint_mode = "full" if mode == "savepoint" else mode
    key_of = operator.itemgetter(1)

    def take(h: KeyedOperatorHarness, n: int) -> Any:
        if mode == "savepoint":
            return h.savepoint(coord, tmp_path / f"sp-{n}")
        return h.checkpoint(coord, mode=checkpoint_mode)

    batches = rounds()
    seen = []
    with KeyedOperatorHarness(Mixed(), key_of, state_backend=backend,
                              rocksdb_memory=memory) as h:
        for n, batch in enumerate(batches[:2]):
            h.process_elements(batch)
            completed = take(h, n)
            seen.append((recorded_entries(completed), stored_entries(completed.url, "operator")))
    # restored (in a fresh subtask), then written again
    restored = weir.load_checkpoint(completed.url)
    with KeyedOperatorHarness.restore(Mixed(), key_of, restored, parallelism=1,
                                      subtask_index=0, state_backend=backend,
                                      rocksdb_memory=memory) as h:
        completed = take(h, 2)
        seen.append((recorded_entries(completed), stored_entries(completed.url, "operator")))
        h.process_elements(batches[2])
        completed = take(h, 3)
        seen.append((recorded_entries(completed), stored_entries(completed.url, "operator")))
    assert [recorded for recorded, _ in seen] == [stored for _, stored in seen], seen
    assert all(stored > 200 for _, stored in seen), seen  # every kind of state is there


@pytest.mark.spark
@pytest.mark.parametrize(("backend", "snapshot"), [
    ("hashmap", "changelog"), ("rocksdb", "changelog"), ("rocksdb", "incremental")])
def test_state_entries_of_a_spark_stage_are_the_keys_read_state_returns(
    spark: Any, tmp_path: Path, backend: str, snapshot: str
) -> None:
    """A keyed count over 200 keys: the first batch writes every key, the second 70
    of them (few enough for a changelog delta, not a new base). The stage's observed
    metrics and ``weir checkpoint inspect`` report the 200 entries ``read_state``
    returns after each batch (they were the 70 keys the delta wrote, and 0 for a
    native RocksDB checkpoint)."""
    by_value()
    write_file(tmp_path / "in", keyed_records(0, 200, 200), KEYED)
    write_file(tmp_path / "in", keyed_records(200, 70, 200), KEYED)
    location = tmp_path / "weir"
    events = (spark.readStream.schema("key string, seq long").option("maxFilesPerTrigger", 1)
              .parquet(str(tmp_path / "in")))
    config = weir.JobConfig(str(location), state_backend=backend,
                            checkpointing=weir.CheckpointConfig(snapshot=snapshot))
    spark.conf.set("spark.weir.metrics", "true")  # (also into Spark's progress)
    try:
        out = weir.spark.process(
            events, key_by="key", function=Count(),
            output_schema="key string, seq long, n long, subtask int", uid="count",
            config=config, parallelism=2, heartbeat=False)
    finally:
        spark.conf.unset("spark.weir.metrics")
    sink = BatchSink()
    query = (out.writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "spark"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    finally:
        query.stop()
    weir.spark.finish(query)

    stored = len(weir.read_state(str(location), uid="count").keyed_state("count", "count"))
    assert stored == 200
    metrics = stage_metrics(location, "count", query)
    assert [m["records"] for m in metrics] == [200, 70]
    assert [m["state_entries"] for m in metrics] == [stored, stored], metrics
    assert [m["outputs"] for m in metrics] == [200, 70] and all(
        m["subtasks"] == 2 and m["state_size"] > 0 for m in metrics)
    progress = observed(query, "count")  # the same numbers in Spark's progress
    timing = "checkpoint_duration_ms"  # (the checkpoint keeps whole milliseconds)

    def numbers(m: dict[str, Any]) -> dict[str, float]:
        return {k: float(v) for k, v in m.items() if k != timing}
    assert [numbers(m) for m in metrics] == [numbers(m) for m in progress], progress
    assert all(abs(m[timing] - p[timing]) < 1 for m, p in zip(metrics, progress, strict=True))

    inspected = CliRunner().invoke(app, ["checkpoint", "inspect", str(location), "--json"])
    assert inspected.exit_code == 0, inspected.output
    (checkpoint,) = json.loads(inspected.stdout)
    assert checkpoint["operators"]["count"]["state_entries"] == stored
    assert checkpoint["state_entries"] == stored
    assert sum(s["state_entries"] for s in checkpoint["operators"]["count"]["subtasks"]) == (
        stored)
