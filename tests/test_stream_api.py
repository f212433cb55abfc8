"""weir.stream, the continuous runtime's public API: a job declared with
from_source / map / filter / flat_map / key_by / process / sink_to runs exactly-once
over task processes on both backends; jobs that cannot run are refused clearly."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import weir
from weir.connectors import FileSink, SequenceSource, read_stream_sink
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

TOTAL = weir.ValueStateDescriptor[int]("total", weir.IntSerializer())


class RunningTotal(weir.KeyedProcessFunction[dict[str, int], dict[str, int]]):
    """Sum of the values per key, emitted after each record."""

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(TOTAL)

    def process_element(self, value: dict[str, int], ctx: Any) -> Any:
        total = (self.total.value() or 0) + value["v"]
        self.total.update(total)
        yield {"key": ctx.current_key, "n": value["n"], "total": total}


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_a_job_with_chained_steps_runs_exactly_once(tmp_path: Path, backend: str) -> None:
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=16,
                                           state_backend=backend,
                                           checkpointing=CheckpointConfig(interval=50)))
    (env.from_source(SequenceSource(30_000), uid="numbers")
        .filter(lambda n: n % 3 != 0)                       # chained into the source
        .flat_map(lambda n: [{"n": n, "v": 1}, {"n": -n - 1, "v": 2}])
        .key_by(lambda r: abs(r["n"]) % 7)
        .process(RunningTotal(), uid="totals")
        .map(lambda r: [r["key"], r["n"], r["total"]])      # chained into the sink's task
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    result = env.execute("totals")
    assert result.restarts == 0 and result.completed
    out = read_stream_sink(tmp_path / "out")
    kept = [n for n in range(30_000) if n % 3 != 0]
    assert Counter(r[1] for r in out) == Counter(kept + [-n - 1 for n in kept])
    expected: Counter[int] = Counter()
    for n in kept:
        expected[n % 7] += 1  # {"n": n, "v": 1} under key n % 7
        expected[(n + 1) % 7] += 2  # {"n": -n-1, "v": 2} under key |-n-1| % 7
    state = weir.read_state(str(tmp_path / "chk")).keyed_state("totals", "total")
    assert dict(zip(state["key"], state["value"], strict=True)) == dict(expected)
    assert max(r[2] for r in out if r[0] == 0) == expected[0]


def test_defaults_follow_flink(tmp_path: Path) -> None:
    off = StreamEnvironment(weir.JobConfig(tmp_path, parallelism=1))
    assert off.checkpointing.interval_ms is None
    assert off.restart_strategy == RestartStrategy.no_restart()
    on = StreamEnvironment(weir.JobConfig(tmp_path, parallelism=1,
                                          checkpointing=CheckpointConfig(interval=1000)))
    assert on.restart_strategy == RestartStrategy.exponential_delay()


def test_jobs_that_cannot_run_are_refused_before_they_start(tmp_path: Path) -> None:
    env = StreamEnvironment(weir.JobConfig(tmp_path, parallelism=1))
    stream = env.from_source(SequenceSource(10), uid="a")
    with pytest.raises(weir.ConfigurationError, match="no sink"):
        env.execute()
    stream.map(lambda n: n).sink_to(FileSink(tmp_path / "o"), uid="s")
    stream.filter(bool)
    with pytest.raises(weir.ConfigurationError, match=r"output of \['filter-3'\] goes nowhere"):
        env.execute()
    with pytest.raises(weir.ConfigurationError, match="KeyedProcessFunction"):
        stream.key_by(lambda n: n).process(object(), uid="x")
    with pytest.raises(weir.ConfigurationError, match=r"is keyed: call \.key_by"):
        stream.process(RunningTotal(), uid="y")  # type: ignore[arg-type]
    with pytest.raises(weir.ConfigurationError, match="uid"):
        stream.sink_to(FileSink(tmp_path / "o"), uid="")
    twice = StreamEnvironment(weir.JobConfig(tmp_path, parallelism=1))
    twice.from_source(SequenceSource(10), uid="same").sink_to(FileSink(tmp_path / "o"),
                                                               uid="same")
    with pytest.raises(weir.ConfigurationError, match=r"\['same'\] are used twice"):
        twice.execute()


class Count(weir.KeyedProcessFunction[int, list[int]]):
    """A running count per key (n % 10), emitted with each record."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(weir.ValueStateDescriptor[int]("count", weir.IntSerializer()))

    def process_element(self, value: int, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield [value % 10, value, n]


def counting_job(tmp_path: Path, backend: str) -> StreamEnvironment:
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                                           state_backend=backend,
                                           checkpointing=CheckpointConfig(interval=100)))
    (env.from_source(SequenceSource(5_000), uid="numbers")
        .key_by(lambda n: n % 10)
        .process(Count(), uid="count")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    return env


def test_a_bootstrapped_savepoint_restores_at_another_parallelism(
    tmp_path: Path, backend: str
) -> None:
    """State written by weir.write_savepoint at parallelism 1 (the same format every
    runtime writes) drives a continuous job at parallelism 2: counts go on from it."""
    import pandas as pd

    counts = pd.DataFrame({"key": list(range(10)), "value": [1_000 + k for k in range(10)]})
    savepoint = weir.write_savepoint(
        tmp_path / "sp", uid="count", max_parallelism=32, parallelism=1,
        states={"count": counts},
        descriptors=[weir.ValueStateDescriptor[int]("count", weir.IntSerializer())])
    counting_job(tmp_path, backend).execute("resumed", restore_from=savepoint)
    out = read_stream_sink(tmp_path / "out")
    for key in range(10):
        assert sorted(c for k, _, c in out if k == key) == list(range(1_001 + key,
                                                                       1_001 + key + 500))
    state = weir.read_state(str(tmp_path / "chk")).keyed_state("count", "count")
    assert dict(zip(state["key"], state["value"], strict=True)) == {
        k: 1_500 + k for k in range(10)}


def test_state_of_an_operator_the_job_lacks_is_refused_unless_allowed(tmp_path: Path) -> None:
    import pandas as pd

    savepoint = weir.write_savepoint(
        tmp_path / "sp", uid="gone", max_parallelism=32,
        states={"x": pd.DataFrame({"key": [1], "value": [1]})},
        descriptors=[weir.ValueStateDescriptor[int]("x", weir.IntSerializer())])
    with pytest.raises(weir.RestoreError, match="gone"):
        counting_job(tmp_path, "hashmap").execute("strict", restore_from=savepoint)
    counting_job(tmp_path, "hashmap").execute("lenient", restore_from=savepoint,
                                              allow_non_restored_state=True)
    assert len(read_stream_sink(tmp_path / "out")) == 5_000
