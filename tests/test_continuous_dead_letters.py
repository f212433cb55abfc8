"""Bad records on the continuous runtime: a record for which a process function raises
one of its ``bad_record_exceptions`` (on the keyed or the broadcast input) goes to its
dead-letter sink with the reason and where (the job and the checkpoint), exactly once
across a restart, and the job goes on; any other exception still fails (and restarts)
the job."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import weir
from weir.connectors import FileSink, SequenceSource, read_stream_sink
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

COUNT = weir.ValueStateDescriptor[int]("count", weir.IntSerializer())
RULES = weir.MapStateDescriptor[int, int]("rules", weir.IntSerializer(), weir.IntSerializer())


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Invalid(ValueError):
    """A record the function rejects."""


class Checked(weir.KeyedBroadcastProcessFunction[int, int, list[int]]):
    """Counts numbers per key; rejects multiples of 97 and the rule 3 (before touching
    state); fails once, for real, at 20,000 while ``marker`` exists."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_broadcast_element(self, value: int, ctx: Any) -> Any:
        if value == 3:
            raise Invalid(f"rule {value} is malformed")
        ctx.get_broadcast_state(RULES).put(value, value)
        return None

    def process_element(self, value: int, ctx: Any) -> Any:
        if value % 97 == 0:
            raise Invalid(f"{value} is a multiple of 97")
        if value == 20_000 and os.path.exists(self.marker):
            os.remove(self.marker)
            raise RuntimeError("a real failure: the job restarts")
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield [ctx.current_key, value, n]


def test_bad_records_go_to_the_dead_letters_once_and_the_job_goes_on(
    tmp_path: Path, backend: str
) -> None:
    n = 40_000
    marker = tmp_path / "fail-once"
    marker.touch()
    env = StreamEnvironment(
        weir.JobConfig(
            tmp_path / "chk",
            parallelism=2,
            max_parallelism=32,
            state_backend=backend,
            checkpointing=CheckpointConfig(interval=50),
            restart_strategy=RestartStrategy.fixed_delay(attempts=1, delay="0 s"),
        )
    )
    rules = env.from_source(SequenceSource(5), uid="rules", parallelism=1)
    (env.from_source(SequenceSource(n, 20_000), uid="numbers")
        .key_by(lambda v: v % 10)
        .connect(rules.broadcast(RULES))
        .process(Checked(str(marker)), uid="checked", bad_record_exceptions=[Invalid],
                 dead_letters=FileSink(tmp_path / "dead"))
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    result = env.execute("dead-letters", timeout=120)
    assert result.restarts == 1 and "a real failure" in result.failures[0]

    bad = [v for v in range(n) if v % 97 == 0]
    dead = read_stream_sink(tmp_path / "dead")
    keyed_side = [d["record"] for d in dead if "multiple of 97" in d["reason"]]
    assert Counter(keyed_side) == Counter(bad)  # each once, across the restart
    rules_side = [d["record"] for d in dead if "rule" in d["reason"]]
    assert rules_side == [3, 3]  # broadcast: each of the two subtasks rejects it once
    assert {d["uid"] for d in dead} == {"checked"}
    assert all(d["reason"].startswith("Invalid: ") for d in dead)
    # the one shape of both runtimes: where = the job and the checkpoint committing it
    assert all(set(d) == {"uid", "subtask", "reason", "record", "where"} for d in dead)
    assert {d["where"]["checkpoint"] for d in dead} <= set(result.completed)
    assert all(d["where"]["job"].startswith("dead-letters") for d in dead)
    out = read_stream_sink(tmp_path / "out")
    assert Counter(r[1] for r in out) == Counter(v for v in range(n) if v % 97)
    state = weir.read_state(str(tmp_path / "chk")).keyed_state("checked", "count")
    expected = Counter(v % 10 for v in range(n) if v % 97)
    assert dict(zip(state["key"], state["value"], strict=True)) == dict(expected)


class Echo(weir.KeyedProcessFunction[int, int]):
    def process_element(self, value: int, ctx: Any) -> Any:
        yield value


def test_a_dead_letter_sink_needs_bad_record_exceptions(tmp_path: Path) -> None:
    """A sink with nothing to receive is refused; bad_record_exceptions alone send the
    records to the job's checkpoint storage (tests/test_dead_letters_one_shape.py)."""
    env = StreamEnvironment(weir.JobConfig(tmp_path, parallelism=1))
    keyed = env.from_source(SequenceSource(10), uid="n").key_by(lambda v: v)
    with pytest.raises(weir.ConfigurationError, match="needs bad_record_exceptions"):
        keyed.process(Echo(), uid="a", dead_letters=FileSink(tmp_path / "d"))
    keyed.process(Echo(), uid="c", bad_record_exceptions=[Invalid])  # (into the storage)
    with pytest.raises(weir.ConfigurationError, match="exception types"):
        keyed.process(Echo(), uid="b", bad_record_exceptions=["oops"],  # type: ignore[list-item]
                      dead_letters=FileSink(tmp_path / "d"))


class Timed(weir.KeyedProcessFunction[int, list[int]]):
    """Rejects a record without event time; else emits it with its timestamp."""

    def process_element(self, value: int, ctx: Any) -> Any:
        if ctx.timestamp is None:
            raise Invalid(f"{value} has no event time")
        yield [value, ctx.timestamp]


def test_a_record_without_event_time_reaches_the_function_and_can_be_rejected(
    tmp_path: Path
) -> None:
    from weir.stream import WatermarkStrategy

    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                                           restart_strategy=RestartStrategy.no_restart()))
    strategy = WatermarkStrategy.bounded_out_of_orderness(
        0, lambda v: None if v % 50 == 0 else 10 * v, interval=10)
    (env.from_source(SequenceSource(2_000), uid="numbers", watermarks=strategy)
        .key_by(lambda v: v % 7)
        .process(Timed(), uid="timed", bad_record_exceptions=[Invalid],
                 dead_letters=FileSink(tmp_path / "dead"))
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    env.execute("untimed", timeout=60)
    assert sorted(d["record"] for d in read_stream_sink(tmp_path / "dead")) == list(
        range(0, 2_000, 50))
    assert sorted(read_stream_sink(tmp_path / "out")) == [
        [v, 10 * v] for v in range(2_000) if v % 50]


def key_of(record: dict[str, int]) -> int:
    return record["card"]  # KeyError for a record without a card


def test_a_record_whose_key_cannot_be_computed_is_rejected_by_the_keyed_function(
    tmp_path: Path
) -> None:
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                                           restart_strategy=RestartStrategy.no_restart()))
    (env.from_source(SequenceSource(3_000), uid="numbers")
        .map(lambda v: {"n": v} if v % 100 == 0 else {"n": v, "card": v % 9})
        .key_by(key_of)
        .process(Echo(), uid="echo", bad_record_exceptions=[KeyError],
                 dead_letters=FileSink(tmp_path / "dead"))
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    env.execute("keyless", timeout=60)
    dead = read_stream_sink(tmp_path / "dead")
    assert sorted(d["record"]["n"] for d in dead) == list(range(0, 3_000, 100))
    assert all(d["reason"] == "KeyError: 'card'" for d in dead)
    assert sorted(r["n"] for r in read_stream_sink(tmp_path / "out")) == [
        v for v in range(3_000) if v % 100]
