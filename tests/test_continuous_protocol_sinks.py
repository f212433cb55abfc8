"""The continuous runtime's two-phase-commit sinks, end to end on the local runner, in
three situations of their protocol:

* two sinks write into one directory (two ``FileSink`` s, or a dead-letter sink beside
  the main one): every record of each lands once — their transactions never share a
  name;
* a consumer takes committed files away (file-drop ingestion) and then a task fails:
  the restore re-commits what its checkpoint holds, takes a transaction already
  committed and gone as committed, and the job ends with every record once;
* a fresh start (no checkpoint to continue from) onto a sink directory that another
  job's lineage wrote: refused with what to do, nothing written twice; the job that
  owns it continues from its own checkpoints into it."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import weir
from continuous_helpers import by_value
from weir.connectors import FileSink, SequenceSource, read_stream_sink
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


def lost_and_duplicated(records: list[Any], expected: list[Any]) -> tuple[int, int]:
    """How many of ``expected`` are missing from ``records``, and how many records are
    extra (a second copy, or one that was never expected)."""
    got, want = Counter(json.dumps(r) for r in records), Counter(json.dumps(r) for r in expected)
    return sum((want - got).values()), sum((got - want).values())


# -- two sinks, one directory


def test_two_file_sinks_on_one_directory_each_commit_every_record_once(tmp_path: Path) -> None:
    """A fan-out into two sinks (two vertices, same subtasks, same attempt) writing
    into the same directory, several checkpoints: the output is both streams, whole."""
    n = 20_000
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                                           checkpointing=CheckpointConfig(interval=50)))
    numbers = env.from_source(SequenceSource(n, 10_000), uid="numbers")
    numbers.map(lambda v: ["first", v]).sink_to(FileSink(tmp_path / "out"), uid="first")
    numbers.map(lambda v: ["second", v]).sink_to(FileSink(tmp_path / "out"),
                                                 uid="second sink/ü")  # (any characters)
    result = env.execute("two-sinks", timeout=120)

    expected = [["first", v] for v in range(n)] + [["second", v] for v in range(n)]
    assert lost_and_duplicated(read_stream_sink(tmp_path / "out"), expected) == (0, 0)
    assert len(result.completed) >= 3  # (several transactions per sink and subtask)
    assert not list((tmp_path / "out" / ".pending").iterdir())


class Invalid(ValueError):
    """A record the function rejects."""


class RejectSevens(weir.KeyedProcessFunction[int, int]):
    """Passes numbers on; rejects the multiples of 7 (they go to the dead letters)."""

    def process_element(self, value: int, ctx: Any) -> Any:
        if value % 7 == 0:
            raise Invalid(f"{value} is a multiple of 7")
        yield value


def test_dead_letters_and_the_main_sink_in_one_directory_keep_every_record(
    tmp_path: Path
) -> None:
    """The dead-letter sink runs beside the main sink in the same task (same subtask,
    same attempt): into one directory, neither overwrites the other."""
    n = 20_000
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                                           checkpointing=CheckpointConfig(interval=50)))
    (env.from_source(SequenceSource(n, 10_000), uid="numbers")
        .key_by(lambda v: v % 10)
        .process(RejectSevens(), uid="checked", bad_record_exceptions=[Invalid],
                 dead_letters=FileSink(tmp_path / "out"))
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    env.execute("dead-letters-beside", timeout=120)

    out = read_stream_sink(tmp_path / "out")
    dead = [r["record"] for r in out if isinstance(r, dict)]
    good = [r for r in out if not isinstance(r, dict)]
    assert lost_and_duplicated(dead, [v for v in range(n) if v % 7 == 0]) == (0, 0)
    assert lost_and_duplicated(good, [v for v in range(n) if v % 7]) == (0, 0)


# -- a consumer takes committed files away, then a task fails


class TakenAway(FileSink):
    """A FileSink whose committed files a consumer takes away at once (moved into
    ``taken``, as a file-drop ingestion does). While ``<taken>/../arm`` exists, the
    first subtask to commit a file kills its own process right after the consumer took
    it (a task failing then). The committables a restore recovers are noted, one JSON
    line per call, in ``<taken>/../recovered.jsonl``."""

    def __init__(self, path: Path, taken: Path) -> None:
        super().__init__(path)
        self.taken = str(taken)

    def commit(self, committables: list[Any]) -> None:
        super().commit(committables)
        for directory, name in committables:
            os.replace(Path(directory, f"part-{name}"), Path(self.taken, f"part-{name}"))
        if committables:
            try:
                os.remove(Path(self.taken).parent / "arm")
            except FileNotFoundError:
                return
            os.kill(os.getpid(), signal.SIGKILL)

    def commit_after_recovery(self, committables: list[Any]) -> None:
        with open(Path(self.taken).parent / "recovered.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(committables) + "\n")
        super().commit_after_recovery(committables)


def test_a_restore_after_the_consumer_took_committed_files_away_goes_on(
    tmp_path: Path
) -> None:
    n = 12_000
    out, taken = tmp_path / "out", tmp_path / "taken"
    taken.mkdir()
    (tmp_path / "arm").touch()
    env = StreamEnvironment(
        weir.JobConfig(
            tmp_path / "chk",
            parallelism=2,
            max_parallelism=32,
            checkpointing=CheckpointConfig(interval=100),
            restart_strategy=RestartStrategy.fixed_delay(attempts=1, delay="0 s"),
        )
    )
    (env.from_source(SequenceSource(n, 4_000), uid="numbers")
        .map(lambda v: v)
        .sink_to(TakenAway(out, taken), uid="sink"))
    result = env.execute("taken-away", timeout=120)

    # the failure happened: a task died right after a commit, and the restore was handed
    # committables whose files the consumer had taken away
    assert not (tmp_path / "arm").exists()
    assert result.restarts == 1 and "disappeared" in result.failures[0], result.failures
    recovered = [json.loads(line) for line in
                 (tmp_path / "recovered.jsonl").read_text().splitlines()]
    gone = {name for call in recovered for _, name in call
            if (taken / f"part-{name}").exists()}
    assert gone, recovered
    # every record once, across what the consumer took and what is still there
    records = read_stream_sink(taken) + read_stream_sink(out)
    assert lost_and_duplicated(records, list(range(n))) == (0, 0)
    assert not list((out / ".pending").iterdir())


# -- a fresh start onto a used sink


def environment(tmp_path: Path, checkpoints: str, n: int) -> StreamEnvironment:
    env = StreamEnvironment(
        weir.JobConfig(
            tmp_path / checkpoints,
            parallelism=2,
            max_parallelism=32,
            checkpointing=CheckpointConfig(interval=50),
            restart_strategy=RestartStrategy.fixed_delay(attempts=3, delay="0 s"),
        )
    )
    (env.from_source(SequenceSource(n, 10_000), uid="numbers")
        .map(lambda v: v)
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    return env


def test_a_fresh_start_onto_a_sink_another_lineage_wrote_is_refused(tmp_path: Path) -> None:
    n = 5_000
    environment(tmp_path, "chk", n).execute("first", timeout=120)
    assert lost_and_duplicated(read_stream_sink(tmp_path / "out"), list(range(n))) == (0, 0)

    # its checkpoints gone (here: a new storage), the same job starts afresh: refused at
    # once (no restart can help), naming the directory and what to do
    with pytest.raises(weir.SinkLineageError) as refused:
        environment(tmp_path, "chk-new", n).execute("again", timeout=120)
    message = str(refused.value)
    assert str(tmp_path / "out") in message and "lineage" in message
    assert "delete" in message and "new directory" in message
    assert "allows no more restarts" not in message  # (no restart was tried)
    assert lost_and_duplicated(read_stream_sink(tmp_path / "out"), list(range(n))) == (0, 0)

    # the job that owns it continues from its own checkpoints: accepted (its sources are
    # at their end, so nothing more is written)
    environment(tmp_path, "chk", n).execute("continued", timeout=120)
    assert lost_and_duplicated(read_stream_sink(tmp_path / "out"), list(range(n))) == (0, 0)
