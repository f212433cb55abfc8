"""Dead letters are one record shape on both runtimes (issue 39):
``{"uid", "subtask", "reason", "record", "where"}``, ``where`` saying where it happened
— ``{"query", "batch"}`` on the micro-batch runtime (which also keeps ``query`` and
``batch`` at the top for one release), ``{"job", "checkpoint"}`` on the continuous one.

The continuous runtime writes them by default into its checkpoint storage (under
``<storage>/dead-letter/``) whenever a function's class declares
``bad_record_exceptions`` and no ``dead_letters=`` sink is given: exactly once, by
two-phase commit with the checkpoints (staged under a name no reader reads, renamed to
``.jsonl`` when the checkpoint completes). ``weir.read_dead_letters(location)`` reads
either runtime's, and so does ``weir dead-letters LOCATION``."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import weir
from weir.api.connectors import SinkContext
from weir.connectors import FileSink, SequenceSource, read_stream_sink
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

SHAPE = {"uid", "subtask", "reason", "record", "where"}


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Invalid(ValueError):
    """A record the function rejects."""


class Picky(weir.KeyedProcessFunction[int, int]):
    """Rejects the multiples of 97 (its class declares ``Invalid`` a bad record); fails
    for real, once, at ``fail_at`` while ``marker`` exists."""

    bad_record_exceptions = (Invalid,)

    def __init__(self, marker: str, fail_at: int) -> None:
        self.marker, self.fail_at = marker, fail_at

    def process_element(self, value: int, ctx: Any) -> Any:
        if value % 97 == 0:
            raise Invalid(f"{value} is a multiple of 97")
        if value == self.fail_at and os.path.exists(self.marker):
            os.remove(self.marker)
            raise RuntimeError("a real failure: the job restarts")
        yield value


def committed_files(storage: Path) -> list[Path]:
    return sorted((storage / "dead-letter").rglob("*.jsonl"))


def test_a_continuous_job_writes_its_dead_letters_into_its_storage_exactly_once(
    tmp_path: Path
) -> None:
    n = 30_000
    marker = tmp_path / "fail-once"
    marker.touch()
    storage = tmp_path / "chk"
    env = StreamEnvironment(weir.JobConfig(
        storage, parallelism=2, max_parallelism=32,
        checkpointing=CheckpointConfig(interval="50 ms"),
        restart_strategy=RestartStrategy.fixed_delay(attempts=1, delay="0 s")))
    (env.from_source(SequenceSource(n, 10_000), uid="numbers")
        .key_by(lambda v: v % 10)
        .process(Picky(str(marker), 12_000), uid="picky")  # (no dead_letters= sink)
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    result = env.execute("one-shape", timeout="120 s")
    assert result.restarts == 1 and "a real failure" in result.failures[0]

    dead = weir.read_dead_letters(str(storage))
    bad = [v for v in range(n) if v % 97 == 0]
    assert Counter(d["record"] for d in dead) == Counter(bad)  # each once, across the restart
    assert all(set(d) == SHAPE for d in dead), dead[0]
    assert {d["uid"] for d in dead} == {"picky"}
    assert {d["subtask"] for d in dead} == {0, 1}
    assert all(d["reason"] == f"Invalid: {d['record']} is a multiple of 97" for d in dead)
    assert {tuple(d["where"]) for d in dead} == {("job", "checkpoint")}
    assert all(d["where"]["job"].startswith("one-shape") for d in dead)
    # committed by the checkpoint named: one the job completed
    assert {d["where"]["checkpoint"] for d in dead} <= set(result.completed)
    assert dead == sorted(dead, key=lambda d: (d["where"]["checkpoint"], d["subtask"]))
    assert weir.read_dead_letters(storage.as_uri()) == dead  # (a URL reads the same)
    # committed files only: nothing staged is left, and a staged name is no .jsonl
    assert committed_files(storage)
    assert not [p for p in (storage / "dead-letter").rglob("*") if p.is_file()
                and p.suffix != ".jsonl"]
    out = read_stream_sink(tmp_path / "out")
    assert Counter(out) == Counter(v for v in range(n) if v % 97)

    # the command line reads the continuous layout too
    from typer.testing import CliRunner

    from weir.cli import app

    shown = CliRunner().invoke(app, ["dead-letters", str(storage), "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output) == json.loads(json.dumps(dead))
    last = max(d["where"]["checkpoint"] for d in dead)
    since = CliRunner().invoke(app, ["dead-letters", str(storage), "--since", str(last),
                                     "--json"])
    assert json.loads(since.output) == [d for d in dead if d["where"]["checkpoint"] == last]
    table = CliRunner().invoke(app, ["dead-letters", str(storage), "--limit", "3"],
                               env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    assert f"{len(dead)} dead letters" in table.output and "picky" in table.output


class Lenient(weir.KeyedProcessFunction[int, int]):
    """Declares no bad records: ``bad_record_exceptions=`` on ``process`` names them."""

    def process_element(self, value: int, ctx: Any) -> Any:
        if value % 10 == 3:
            raise Invalid(f"{value} ends in 3")
        yield value


def test_an_explicit_dead_letter_sink_gets_the_one_shape_and_nothing_goes_to_storage(
    tmp_path: Path
) -> None:
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                                           restart_strategy=RestartStrategy.no_restart()))
    (env.from_source(SequenceSource(500), uid="numbers")
        .key_by(lambda v: v % 4)
        .process(Lenient(), uid="lenient", bad_record_exceptions=[Invalid],
                 dead_letters=FileSink(tmp_path / "dead"))
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    result = env.execute("explicit", timeout="60 s")
    dead = read_stream_sink(tmp_path / "dead")
    assert sorted(d["record"] for d in dead) == list(range(3, 500, 10))
    assert all(set(d) == SHAPE for d in dead)
    assert {d["where"]["checkpoint"] for d in dead} <= set(result.completed)
    assert all(d["where"]["job"].startswith("explicit") for d in dead)
    assert weir.read_dead_letters(str(tmp_path / "chk")) == []


def test_bad_record_exceptions_alone_go_to_the_storage(tmp_path: Path) -> None:
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=1,
                                           restart_strategy=RestartStrategy.no_restart()))
    (env.from_source(SequenceSource(100), uid="numbers")
        .key_by(lambda v: v % 4)
        .process(Lenient(), uid="lenient", bad_record_exceptions=[Invalid])
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    env.execute("alone", timeout="60 s")
    dead = weir.read_dead_letters(str(tmp_path / "chk"))
    assert [d["record"] for d in dead] == list(range(3, 100, 10))


def test_a_dead_letter_sink_without_bad_records_is_a_configuration_error(
    tmp_path: Path
) -> None:
    env = StreamEnvironment(weir.JobConfig(tmp_path, parallelism=1))
    keyed = env.from_source(SequenceSource(10), uid="n").key_by(lambda v: v)
    with pytest.raises(weir.ConfigurationError, match="bad_record_exceptions"):
        keyed.process(Lenient(), uid="a", dead_letters=FileSink(tmp_path / "d"))


def test_the_storage_sink_commits_once_restores_and_drops_what_attempts_left_open(
    tmp_path: Path
) -> None:
    """The default sink's two-phase commit, by hand: a staged transaction is invisible;
    its commit renames it (twice is once); a restore re-commits what its checkpoint
    holds (taking one already committed as committed) and drops what earlier attempts
    left staged."""
    from weir.connectors.dead_letters import StorageDeadLetters

    storage = tmp_path / "chk"
    sink = StorageDeadLetters(str(storage), retention_ms=7 * 24 * 3_600_000)
    context = SinkContext("1000run", 0, 1, 0, uid="op-dead-letters", lineage="l")
    letter = {"uid": "op", "subtask": 0, "reason": "Invalid: x", "record": 1,
              "where": {"job": "j", "checkpoint": 1}}
    writer = sink.writer(context)
    assert writer.prepare_commit(1) is None  # (nothing written: no transaction)
    writer.write(letter)
    first = writer.prepare_commit(1)
    writer.write({**letter, "record": 2, "where": {"job": "j", "checkpoint": 2}})
    second = writer.prepare_commit(2)
    writer.write({**letter, "record": 3})  # (left open by this attempt)
    assert weir.read_dead_letters(str(storage)) == []  # staged: invisible
    assert not committed_files(storage)
    sink.commit([first])
    sink.commit([first])
    assert [d["record"] for d in weir.read_dead_letters(str(storage))] == [1]
    writer.close()
    # attempt 1 restores a checkpoint holding both transactions
    restored = SinkContext("1000run", 0, 1, 1, uid="op-dead-letters", lineage="l")
    sink.claim(restored)
    sink.commit_after_recovery([first, second])
    sink.abort_attempts(restored, keep=[first, second])
    assert [d["record"] for d in weir.read_dead_letters(str(storage))] == [1, 2]
    assert sorted(p for p in (storage / "dead-letter").rglob("*") if p.is_file()) == \
        committed_files(storage)  # (the open one is gone)


def test_committed_dead_letters_older_than_the_retention_are_deleted(tmp_path: Path) -> None:
    """As on the micro-batch runtime: ``JobConfig.dead_letter_retention``; the first
    checkpoint a job completes (then every hundredth) deletes older files."""
    storage = tmp_path / "chk"
    old = storage / "dead-letter" / "stream" / "old.jsonl"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"uid": "x", "subtask": 0, "reason": "r", "record": 0,
                               "where": {"job": "old", "checkpoint": 1}}) + "\n")
    week_ago = time.time() - 8 * 24 * 3600
    os.utime(old, (week_ago, week_ago))
    assert [d["where"]["job"] for d in weir.read_dead_letters(str(storage))] == ["old"]
    env = StreamEnvironment(weir.JobConfig(storage, parallelism=1,
                                           checkpointing=CheckpointConfig(interval="50 ms"),
                                           dead_letter_retention="7 days",
                                           restart_strategy=RestartStrategy.no_restart()))
    (env.from_source(SequenceSource(2_000, 4_000), uid="numbers")
        .key_by(lambda v: v % 4)
        .process(Picky(str(tmp_path / "never"), -1), uid="picky")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    env.execute("retention", timeout="60 s")
    assert not old.exists()
    dead = weir.read_dead_letters(str(storage))
    assert sorted(d["record"] for d in dead) == list(range(0, 2_000, 97))


# -- the micro-batch runtime's dead letters, read by the same reader


class SparkPicky(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Rejects the sequence numbers ending in 42 (its class declares ValueError)."""

    bad_record_exceptions = (ValueError,)

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        if value["seq"] % 100 == 42:
            raise ValueError(f"rejected seq {value['seq']}")
        yield (value["key"], value["seq"], 1, ctx.subtask_index)


@pytest.mark.spark
def test_the_micro_batch_dead_letters_are_read_in_the_one_shape(
    spark: Any, tmp_path: Path
) -> None:
    from spark_support import KEYED, keyed_records, run, write_file

    records = keyed_records(0, 300, 10)
    write_file(tmp_path / "in", records[:150], KEYED)
    write_file(tmp_path / "in", records[150:], KEYED)
    location = str(tmp_path / "weir")
    run(spark, tmp_path / "in", "key string, seq long",
        lambda ev: weir.spark.process(
            ev, key_by="key", function=SparkPicky(),
            output_schema="key string, seq long, n long, subtask int", uid="picky",
            config=weir.JobConfig(location), parallelism=2, heartbeat=False),
        tmp_path / "spark")
    dead = weir.read_dead_letters(location)
    assert sorted(d["record"]["seq"] for d in dead) == [42, 142, 242]
    for d in dead:
        assert set(d) == SHAPE | {"query", "batch"}  # (query, batch: for one release)
        assert d["where"] == {"query": d["query"], "batch": d["batch"]}
        assert d["uid"] == "picky" and d["reason"] == f"ValueError: rejected seq " \
            f"{d['record']['seq']}"
    assert [d["where"]["batch"] for d in dead] == sorted(d["where"]["batch"] for d in dead)
    assert {d["where"]["batch"] for d in dead} == {0, 1}

    from typer.testing import CliRunner

    from weir.cli import app

    shown = CliRunner().invoke(app, ["dead-letters", location, "--since", "1", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output) == [d for d in dead if d["batch"] >= 1]


def test_the_reader_takes_both_layouts_from_one_location_and_skips_staged_files(
    tmp_path: Path
) -> None:
    """By hand: a micro-batch file (its records as the Spark task writes them), a
    continuous one, a staged one and a temporary one."""
    def lines(path: Path, letters: list[dict[str, Any]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(d) + "\n" for d in letters))

    dead = tmp_path / "dead-letter"
    lines(dead / "q1" / "batch=3" / "op-1.jsonl", [
        {"uid": "op", "query": "q1", "batch": 3, "subtask": 1, "reason": "r", "record": "b"}])
    lines(dead / "q1" / "batch=2" / "op-0.jsonl", [
        {"uid": "op", "query": "q1", "batch": 2, "subtask": 0, "reason": "r", "record": "a"}])
    stream = {"uid": "f", "subtask": 0, "reason": "Invalid: x", "record": {"n": 1},
              "where": {"job": "j-1", "checkpoint": 4}}
    lines(dead / "stream" / "f-1-00000-00000-000000000.jsonl", [stream])
    lines(dead / ".pending" / "f-1-00000-00000-000000001.jsonl.pending", [stream])
    lines(dead / "stream" / "f-1-00000-00000-000000002.jsonl.tmp-0a1b", [stream])
    assert weir.read_dead_letters(tmp_path) == [
        {"uid": "op", "subtask": 0, "reason": "r", "record": "a",
         "where": {"query": "q1", "batch": 2}, "query": "q1", "batch": 2},
        {"uid": "op", "subtask": 1, "reason": "r", "record": "b",
         "where": {"query": "q1", "batch": 3}, "query": "q1", "batch": 3},
        stream]
    assert weir.read_dead_letters(tmp_path / "nothing-here") == []
