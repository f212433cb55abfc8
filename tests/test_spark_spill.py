"""A task's rows and outputs in bounded memory (weir.runtime.spark.spill): Arrow
batches beyond a limit go to an anonymous local file and come back memory-mapped, in
order; rows are handed over sorted, a slice at a time, by kind."""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

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
    by_value,
    keyed_records,
    last_counts,
    run,
    write_file,
)
from weir.runtime.spark.spill import SpillBuffer, sorted_runs, sorted_slices

KEYED_DDL = "key string, seq long"


@pytest.fixture(autouse=True)
def _pickle_by_value() -> None:
    by_value()


def _batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({
        "kind": pa.array([(start + i) % 3 for i in range(n)], pa.int8()),
        "order": pa.array([(start + i) * 7919 % 10_007 for i in range(n)], pa.int64()),
        "text": pa.array([f"row {start + i} " * 4 for i in range(n)]),
    })


def test_batches_stay_in_memory_below_the_limit_and_come_back_in_order(tmp_path: Path) -> None:
    buf = SpillBuffer(limit_bytes=1 << 20, directory=str(tmp_path))
    batches = [_batch(i * 100, 100) for i in range(5)]
    for b in batches:
        buf.append(b)
    buf.append(_batch(0, 0))  # empty batches are dropped
    assert not buf.spilled and buf.rows == 500
    assert buf.nbytes == sum(b.nbytes for b in batches)
    assert buf.batches() == batches
    buf.close()


def test_beyond_the_limit_batches_go_to_an_anonymous_local_file_and_come_back_mapped(
    tmp_path: Path,
) -> None:
    buf = SpillBuffer(limit_bytes=20_000, directory=str(tmp_path))
    batches = [_batch(i * 300, 300) for i in range(10)]
    for b in batches:
        buf.append(b)
    assert buf.spilled and buf.rows == 3000
    assert buf._held == []  # nothing of it left on the heap
    assert os.listdir(tmp_path) == []  # unlinked at creation: a killed worker leaves nothing
    before = pa.total_allocated_bytes()
    read = buf.batches()
    table = buf.table()
    # the data is read in place from the mapping, not copied onto the heap
    assert pa.total_allocated_bytes() - before < 1024
    assert [b.to_pydict() for b in read] == [b.to_pydict() for b in batches]
    assert table is not None and table.num_rows == 3000
    buf.close()
    assert buf.batches() == []


def test_nothing_appended_gives_no_table(tmp_path: Path) -> None:
    buf = SpillBuffer(limit_bytes=10, directory=str(tmp_path))
    assert buf.table() is None and not buf.spilled
    buf.close()


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 3), st.integers(-50, 50)), max_size=120),
    slice_rows=st.integers(1, 17),
    in_memory=st.booleans(),
)
def test_sorted_slices_hand_over_each_group_in_order_a_slice_at_a_time(
    rows: list[tuple[int, int]], slice_rows: int, in_memory: bool
) -> None:
    table = pa.table({
        "kind": pa.array([k for k, _ in rows], pa.int8()),
        "order": pa.array([o for _, o in rows], pa.int64()),
        "pos": pa.array(range(len(rows)), pa.int64()),
    })
    groups = [2, 0, 1]  # group 3 is skipped
    got = list(sorted_slices(table, [("kind", "ascending"), ("order", "ascending")],
                             "kind", groups, slice_rows, in_memory))
    assert all(0 < part.num_rows <= slice_rows for _, part in got)
    seen = [(g, o) for g, part in got for o in part["order"].to_pylist()]
    expected = [(g, o) for g in groups for o in sorted(o for k, o in rows if k == g)]
    assert seen == expected
    # every row of the handed-over groups exactly once (ties keep both rows)
    positions = sorted(p for _, part in got for p in part["pos"].to_pylist())
    assert positions == sorted(i for i, (k, _) in enumerate(rows) if k in groups)


@settings(max_examples=100, deadline=None)
@given(
    blocks=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    clocks=st.lists(st.integers(0, 3), max_size=6),
    data=st.data(),
    slice_rows=st.integers(1, 17),
    in_memory=st.booleans(),
)
def test_rows_already_in_runs_are_handed_over_as_slices_of_the_runs(
    blocks: list[int], clocks: list[int], data: st.DataObject, slice_rows: int,
    in_memory: bool,
) -> None:
    """A shuffle's rows: blocks of records (kind 1) each in its map task's order
    (``block << 33 | row``), the blocks in any order, a clock row (kind 3, skipped)
    or a broadcast row (kind 0) between records anywhere. ``sorted_runs`` finds the
    runs (no sort, no take) and ``sorted_slices`` hands over the same rows in the same
    order as sorting them would."""
    rows: list[tuple[int, int]] = []
    for block in data.draw(st.permutations(range(len(blocks)))):
        records = [(1, block << 33 | i) for i in range(blocks[block])]
        for _ in clocks:
            at = data.draw(st.integers(0, len(records)))
            records.insert(at, (data.draw(st.sampled_from([0, 3])), 1 << 45 | len(rows)
                                + data.draw(st.integers(0, 1 << 20))))
        rows += records
    table = pa.table({
        "kind": pa.array([k for k, _ in rows], pa.int8()),
        "order": pa.array([o for _, o in rows], pa.int64()),
        "pos": pa.array(range(len(rows)), pa.int64()),
    })
    keys = [("kind", "ascending"), ("order", "ascending")]
    runs = sorted_runs(table, keys, "kind", [1])
    assert runs is not None and len(runs) <= len(blocks) * (len(clocks) + 1)
    got = list(sorted_slices(table, keys, "kind", [1], slice_rows, in_memory))
    assert all(0 < part.num_rows <= slice_rows for _, part in got)
    seen = [o for _, part in got for o in part["order"].to_pylist()]
    assert seen == sorted(o for k, o in rows if k == 1)
    assert sorted(p for _, part in got for p in part["pos"].to_pylist()) == [
        i for i, (k, _) in enumerate(rows) if k == 1]


def test_rows_in_many_runs_are_taken_in_order_instead() -> None:
    """Rows whose sorted order is more than ``MAX_RUNS`` ranges of consecutive rows
    (shuffled): ``sorted_runs`` declines and the rows are taken in sorted order; ties
    keep their input order either way."""
    keys = [("kind", "ascending"), ("order", "ascending")]
    orders = random.Random(7).sample(range(2000), 2000)
    table = pa.table({"kind": pa.array([1] * 2000, pa.int8()),
                      "order": pa.array(orders, pa.int64())})
    assert sorted_runs(table, keys, "kind", [1]) is None
    got = [o for _, part in sorted_slices(table, keys, "kind", [1], 300, True)
           for o in part["order"].to_pylist()]
    assert got == sorted(orders)
    table = pa.table({"kind": pa.array([1, 1, 1], pa.int8()), "order": pa.array([2, 1, 2]),
                      "pos": pa.array([0, 1, 2])})
    assert sorted_runs(table, keys, "kind", [1]) == [(1, 1, 1), (1, 0, 1), (1, 2, 1)]


@pytest.mark.spark
def test_a_task_larger_than_its_buffer_spills_and_handles_every_record_once_in_input_order(
    spark: Any, tmp_path: Path
) -> None:
    """task_buffer_memory of 64 KB against batches of 30,000 records (about 1 MB of
    Arrow per task): inputs and outputs go to local files, records are handled in
    slices of 8,192 — and still every record once, each key's count in input order,
    state as the oracle's; the parts record the spill."""
    location = tmp_path / "weir"
    records = keyed_records(0, 60_000, 5_000)

    def build(events: Any) -> Any:
        return weir.spark.process(events, key_by="key", function=Count(),
                                  output_schema="key string, seq long, n long, subtask int",
                                  uid="count", heartbeat=False, parallelism=2,
                                  config=weir.JobConfig(str(location)), task_buffer_memory="64k")

    sink = BatchSink()
    for start in (0, 30_000):
        write_file(tmp_path / "in", records[start:start + 30_000], KEYED)
    run(spark, tmp_path / "in", KEYED_DDL, build, tmp_path / "spark", sink)
    rows = sink.rows()
    assert sorted(r[1] for r in rows) == list(range(60_000))
    per_key: dict[str, list[tuple[int, int]]] = {}
    for key, seq, n, _subtask in rows:
        per_key.setdefault(key, []).append((seq, n))
    for key, seen in per_key.items():  # the n-th record of a key (by seq) counted n
        assert [n for _, n in sorted(seen)] == list(range(1, len(seen) + 1)), key
    assert last_counts(rows) == Counter(r["key"] for r in records)
    (query,) = location.glob("stages/*/queries/*")
    for batch in (0, 1):
        io = weir.load_checkpoint(str(query / f"chk-{batch}")).metadata.source_positions[
            "spark_io"]
        assert io["total"]["rows_in"] >= 30_000
        for subtask, counts in io["subtasks"].items():
            assert counts["spilled_bytes"] > 0, (batch, subtask, counts)
            assert counts["arrow_out_bytes"] > 0
