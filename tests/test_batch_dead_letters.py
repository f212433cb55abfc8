"""Bad rows of a batch function: a KeyedBatchFunction that declares ``rejects_records``
sends rows to the operator's dead letters (``ctx.reject(rows, reason)``) and the job
goes on — in the harness, on the continuous runtime (exactly once across a SIGKILL) and
on Spark (the job's checkpoint storage, read with ``weir.read_dead_letters``)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import weir
from continuous_helpers import Running, by_value
from weir.api.checkpointing import CheckpointConfig
from weir.connectors.stream import FileSink, SequenceSource, read_stream_sink
from weir.errors import ConfigurationError
from weir.runtime.continuous.master import LocalJob
from weir.stream import StreamEnvironment
from weir.testing import KeyedOperatorHarness

COUNT = weir.ValueStateDescriptor("count", serializer=weir.IntSerializer())


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


class CountValid(weir.KeyedBatchFunction):
    """Counts the numbers per key (``value``: continuous records that are ints); a
    multiple of 7 is rejected (its row's reason names it); emits ``[key, n, count]``."""

    rejects_records = True

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_batch(self, batch: pa.RecordBatch, ctx: Any) -> Any:
        values = batch.column("value").to_numpy()
        bad = values % 7 == 0
        ctx.reject(bad.tolist(), [f"{v} is a multiple of 7" for v in values[bad]])
        keys = np.asarray(ctx.keys)[~bad].tolist()
        current = dict(zip(keys, self.count.get(keys).to_pylist(), strict=True))
        rows = []
        for key, v in zip(keys, values[~bad].tolist(), strict=True):
            current[key] = (current[key] or 0) + 1
            rows.append([key, v, current[key]])
        self.count.put(list(current), list(current.values()))
        return pa.record_batch([pa.array(rows, pa.list_(pa.int64()))], names=["value"])


class Quiet(weir.KeyedBatchFunction):
    """Rejects without declaring rejects_records."""

    def process_batch(self, batch: pa.RecordBatch, ctx: Any) -> Any:
        ctx.reject([0], "bad")


class Rows(weir.KeyedBatchFunction):
    """Rejects the rows ``self.rows`` with ``self.reason`` (any form ``reject`` takes)."""

    rejects_records = True

    def __init__(self, rows: Any, reason: Any) -> None:
        self.rows, self.reason = rows, reason

    def process_batch(self, batch: pa.RecordBatch, ctx: Any) -> Any:
        ctx.reject(self.rows, self.reason)
        ctx.register_processing_time_timers(list(ctx.keys)[:1], [5])

    def on_timers(self, timestamps: pa.Array, ctx: Any) -> Any:
        ctx.reject([0], "from a timer")


def _batch() -> pa.RecordBatch:
    return pa.record_batch({"k": ["a", "b", "c"], "v": [1, 2, 3]})


def test_rejected_rows_reach_the_harness_as_records_with_their_reasons() -> None:
    h = KeyedOperatorHarness(CountValid(), lambda v: v % 3)
    h.open()
    out = h.process_batch(pa.record_batch({"value": [7, 1, 14, 4]}), [1, 1, 2, 1])
    assert h.rejected == [({"value": 7}, "7 is a multiple of 7"),
                          ({"value": 14}, "14 is a multiple of 7")]
    assert out[0].column(0).to_pylist() == [[1, 1, 1], [1, 4, 2]]
    forms = [(pa.array([False, True, True]), "x"), (np.array([2, 0]), ["r2", "r0"]),
             ([1], "one"),
             ([v % 2 == 0 for v in np.array([1, 2, 3])], "x")]  # (NumPy bools: a mask)
    got = []
    for rows, reason in forms:
        g = KeyedOperatorHarness(Rows(rows, reason), lambda r: r["k"])
        g.open()
        g.process_batch(_batch())
        got.append(g.rejected)
        g.close()
    assert got == [[({"k": "b", "v": 2}, "x"), ({"k": "c", "v": 3}, "x")],
                   [({"k": "c", "v": 3}, "r2"), ({"k": "a", "v": 1}, "r0")],
                   [({"k": "b", "v": 2}, "one")],
                   [({"k": "b", "v": 2}, "x")]]
    h.close()


@pytest.mark.parametrize(("function", "error", "match"), [
    (Quiet(), ConfigurationError, "declares rejects_records"),
    (Rows([True], "short mask"), ValueError, "a mask of 1 rows for a batch of 3"),
    (Rows([3], "x"), IndexError, "not all rows"),
    (Rows([0, 1], ["one reason"]), ValueError, "1 reasons for 2 rows"),
    (Rows(pa.array([True, None, False]), "x"), ValueError, "include a null"),
    (Rows([True, 1, False], "x"), ValueError, "mix booleans and indices"),
    (Rows([2, 0, 2], "x"), ValueError, r"rows \[2\] rejected twice"),
])
def test_a_reject_that_cannot_be_kept_says_why(function: Any, error: type, match: str
                                               ) -> None:
    h = KeyedOperatorHarness(function, lambda r: r["k"])
    h.open()
    with pytest.raises(error, match=match):
        h.process_batch(_batch())
    h.close()


def test_a_reject_outside_process_batch_is_refused() -> None:
    clock = weir.testing.ManualClock(0)
    h = KeyedOperatorHarness(Rows([], "x"), lambda r: r["k"], clock=clock)
    h.open()
    h.process_batch(_batch())
    with pytest.raises(ConfigurationError, match="rows of process_batch"):
        h.advance_processing_time(10)
    h.close()


def test_a_batch_function_declares_rejects_records_for_dead_letters(tmp_path: Path) -> None:
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk"))
    keyed = env.from_source(SequenceSource(10), uid="numbers").key_by(lambda v: v)
    with pytest.raises(ConfigurationError, match="declares rejects_records = True"):
        keyed.process(Quiet(), uid="q", dead_letters=FileSink(tmp_path / "dead"))
    with pytest.raises(ConfigurationError, match="takes no bad_record_exceptions"):
        keyed.process(CountValid(), uid="c", bad_record_exceptions=[ValueError])
    keyed.process(CountValid(), uid="c")  # (dead letters into the checkpoint storage)


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_rejected_rows_are_dead_letters_exactly_once_across_a_sigkill(
        tmp_path: Path, backend: str) -> None:
    """count[1] killed with SIGKILL after three checkpoints: every multiple of 7 in the
    dead letters once with its reason, every other number counted once."""
    n = 60_000
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2,
                                           max_parallelism=32, state_backend=backend))
    (env.from_source(SequenceSource(n, 20_000), uid="numbers").key_by(lambda v: v % 50)
        .process(CountValid(), uid="count", dead_letters=FileSink(tmp_path / "dead"))
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    job = LocalJob(env.job_graph("rejects"), CheckpointConfig(interval=50),
                   restart=weir.RestartStrategy.fixed_delay(attempts=1, delay="0 s"))
    running = Running(job)
    running.until(lambda: ("count", 1) in job._procs and len(job.result.completed) >= 3)
    running.kill(("count", 1))
    assert not running.join()
    dead = read_stream_sink(tmp_path / "dead")
    counted = Counter(r[1] for r in read_stream_sink(tmp_path / "out"))
    rejected = Counter(d["record"] for d in dead)
    bad = {v for v in range(n) if v % 7 == 0}
    lost = len(set(range(n)) - set(counted) - set(rejected))
    duplicated = sum(c - 1 for c in (counted + rejected).values())
    print(f"L={lost} D={duplicated} | failures injected=1, restarts={job.result.restarts}")
    assert job.result.restarts == 1 and lost == duplicated == 0
    assert set(rejected) == bad and set(counted) == set(range(n)) - bad
    assert all(d["reason"] == f"{d['record']} is a multiple of 7" and d["uid"] == "count"
               for d in dead)
    state = weir.read_state(str(tmp_path / "chk")).keyed_state("count", "count")
    assert dict(zip(state["key"], state["value"], strict=True)) == dict(
        Counter(v % 50 for v in range(n) if v % 7))
