"""The offline state processor on a continuous job's checkpoints: ``weir.read_state``
and the ``weir-state`` Spark data source read a continuous job's checkpoint storage
(or one of its checkpoints), ``weir.write_savepoint`` rewrites one — a state replaced,
a state added — and the job restores the result and goes on with the new state,
exactly once.

A storage root means the job's *current* state, what its next run restores
(``weir.checkpoint.protocol``): after a stop with a savepoint, that savepoint — not the
older checkpoints beside it, whose rewrite would repeat the output committed since.
The records an unaligned checkpoint had in flight go into the rewritten savepoint, so
none is lost on its restore."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import weir
from continuous_helpers import TINY, Count, by_value, completed, wait_for
from weir.checkpoint.coordinator import load_checkpoint
from weir.connectors import FileSink, SequenceSource, read_stream_sink
from weir.stream import ChannelConfig, CheckpointConfig, RestartStrategy, StreamEnvironment

KEYS = 50  # (Count's: n % 50)
BONUS = weir.ValueStateDescriptor[int]("bonus", weir.IntSerializer())
RECENT = weir.ListStateDescriptor[int]("recent", weir.IntSerializer())
FAR = 4_102_444_800_000  # 2100-01-01: a processing-time timer that never fires here


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


class CountWithBonus(Count):
    """Count that also emits the key's ``bonus`` state: [key, n, count, bonus]."""

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.bonus = ctx.get_state(BONUS)

    def process_element(self, value: int, ctx: Any) -> Any:
        for key, n, count in super().process_element(value, ctx):
            yield [key, n, count, self.bonus.value()]


class SlowCount(Count):
    """Count taking a millisecond a record: with tiny buffers its input backs up."""

    def process_element(self, value: int, ctx: Any) -> Any:
        import time

        time.sleep(0.001)
        yield from super().process_element(value, ctx)


class Tracked(Count):
    """Count with a list state (the key's last three numbers) and a processing-time
    timer per key: a keyed state of each form and timers to read."""

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.recent = ctx.get_state(RECENT)

    def process_element(self, value: int, ctx: Any) -> Any:
        self.recent.update([*self.recent.get(), value][-3:])
        if self.count.value() is None:
            ctx.timer_service.register_processing_time_timer(FAR + value % KEYS)
        yield from super().process_element(value, ctx)


def env_of(tmp_path: Path, source: SequenceSource, function: Any, *, backend: str = "hashmap",
           checkpointing: CheckpointConfig | None = None, restore_from: str | None = None,
           channels: ChannelConfig | None = None) -> StreamEnvironment:
    """numbers -> key_by(n % 50) -> function -> FileSink(tmp_path/out), checkpoints in
    tmp_path/chk."""
    env = StreamEnvironment(
        weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                       state_backend=backend,
                       checkpointing=checkpointing or CheckpointConfig(interval=50),
                       restart_strategy=RestartStrategy.no_restart(),
                       restore_from=restore_from),
        channels=channels)
    (env.from_source(source, uid="numbers")
        .key_by(lambda v: v % KEYS)
        .process(function, uid="count")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    return env


def counts_of(reader: weir.StateReader) -> dict[int, int]:
    frame = reader.keyed_state("count", "count")
    return dict(zip(frame["key"], frame["value"], strict=True))


def rewrite_counts(tmp_path: Path, base: str, plus: int, **more: Any) -> str:
    """``base`` rewritten with every key's count ``plus`` more: the savepoint's URL."""
    counts = weir.read_state(base).keyed_state("count", "count")
    counts["value"] = counts["value"] + plus
    states = {"count": counts, **more.pop("states", {})}
    return weir.write_savepoint(tmp_path / "rewritten", uid="count", base=base,
                                states=states, **more)


def check_continued(out: list[list[Any]], n: int, before: dict[int, int], plus: int
                    ) -> tuple[int, int, int]:
    """L, D and M of a job's output across a rewrite: every number once, and per key
    (in the order of its numbers) the counts 1..c, then c+1+plus.. on, where ``c`` is
    the key's count in the rewritten checkpoint (``before``)."""
    numbers = Counter(r[1] for r in out)
    lost = len(set(range(n)) - set(numbers))
    duplicated = sum(c - 1 for c in numbers.values() if c > 1)
    wrong = 0
    for key in range(KEYS):
        counts = [r[2] for r in sorted((r for r in out if r[0] == key), key=lambda r: r[1])]
        if key not in before:  # (not counted by the checkpoint yet: nothing rewritten)
            wrong += counts != list(range(1, len(counts) + 1))
            continue
        c = before[key]
        wrong += counts != [*range(1, c + 1), *range(c + 1 + plus, c + 1 + plus
                                                      + len(counts) - c)]
    return lost, duplicated, wrong


@pytest.mark.parametrize("base", ["storage", "checkpoint"])
def test_a_rewritten_checkpoint_restores_with_the_new_and_the_added_state(
    tmp_path: Path, backend: str, base: str
) -> None:
    """The storage root of a finished job, or its newest checkpoint (incremental on
    RocksDB, a changelog on the hash map), rewritten: every count 1000 more and a new
    state ``bonus``; the job restored from it continues every key from there."""
    n = 6_000
    env_of(tmp_path, SequenceSource(n), Count(), backend=backend).execute("first")
    root = str(tmp_path / "chk")
    reader = weir.read_state(root)
    newest = weir.CheckpointCoordinator(root).latest()
    assert newest is not None and reader.checkpoint("count").url == newest.url
    location = root if base == "storage" else newest.url
    before = counts_of(weir.read_state(location))
    assert before == {k: n // KEYS for k in range(KEYS)}

    bonus = pd.DataFrame({"key": list(range(KEYS)), "value": [10 * k for k in range(KEYS)]})
    savepoint = rewrite_counts(tmp_path, location, 1_000, states={"bonus": bonus},
                               descriptors=[BONUS])
    assert load_checkpoint(savepoint).metadata.owner == {  # (its sinks accept it)
        "lineage": newest.metadata.owner["lineage"]}

    result = env_of(tmp_path, SequenceSource(2 * n), CountWithBonus(), backend=backend,
                    restore_from=savepoint).execute("second")
    assert result.restored[0].startswith(f"restore_from {savepoint}")
    out = read_stream_sink(tmp_path / "out")
    second = [r for r in out if len(r) == 4]
    assert len(second) == n and {r[3] for r in second if r[0] == 7} == {70}
    assert check_continued([r[:3] for r in out], 2 * n, before, 1_000) == (0, 0, 0)
    after = weir.read_state(root)
    assert counts_of(after) == {k: 2 * n // KEYS + 1_000 for k in range(KEYS)}
    assert sorted(s.name for s in after.states("count")) == ["bonus", "count"]


def test_a_storage_stopped_with_a_savepoint_means_that_savepoint(tmp_path: Path) -> None:
    """After ``stop_with_savepoint`` the storage's checkpoints are older than its state
    (the stop savepoint, whose output is committed): reading or rewriting the storage
    root takes the savepoint, and the job restored from the rewrite repeats nothing."""
    n = 60_000
    client = env_of(tmp_path, SequenceSource(n, 2_000), Count(),
                    checkpointing=CheckpointConfig(interval=100)).execute_async("stopped")
    wait_for(client, "two checkpoints", lambda: completed(client) >= 2)
    stopped = client.stop_with_savepoint(tmp_path / "savepoints")
    client.wait(60)
    root = str(tmp_path / "chk")
    newest = weir.CheckpointCoordinator(root).latest()
    assert newest is not None and newest.checkpoint_id < load_checkpoint(stopped).checkpoint_id
    reader = weir.read_state(root)
    assert reader.checkpoint("count").url == stopped and "stopped with" in repr(reader)
    before = counts_of(reader)
    assert before == counts_of(weir.read_state(stopped)) != counts_of(weir.read_state(
        newest.url))
    assert sum(before.values()) == len(read_stream_sink(tmp_path / "out"))  # committed

    savepoint = rewrite_counts(tmp_path, root, 1_000)
    env_of(tmp_path, SequenceSource(n), Count(), restore_from=savepoint).execute("resumed")
    assert check_continued(read_stream_sink(tmp_path / "out"), n, before, 1_000) == (0, 0, 0)


def cancelled_with_records_in_flight(tmp_path: Path, n: int
                                     ) -> tuple[str, Any, dict[int, int]]:
    """A backpressured job (tiny buffers, a slow function) with unaligned checkpoints,
    cancelled with its checkpoints retained once two hold records in flight: its
    storage root, its newest checkpoint (holding records in flight) and its counts."""
    client = env_of(tmp_path, SequenceSource(n), SlowCount(), channels=TINY,
                    checkpointing=CheckpointConfig(interval=50, unaligned=True,
                                                   retain_on_cancel=True)
                    ).execute_async("unaligned")
    wait_for(client, "a checkpoint with records in flight", lambda: sum(
        1 for s in client.checkpoints() if s.status.name == "COMPLETED"
        and s.channel_state_bytes) >= 2)
    client.cancel()
    root = str(tmp_path / "chk")
    base = weir.read_state(root).checkpoint("count")
    assert base.metadata.channel_state, "the newest checkpoint holds no records in flight"
    return root, base, counts_of(weir.read_state(root))


def test_records_in_flight_of_an_unaligned_checkpoint_survive_the_rewrite(
    tmp_path: Path
) -> None:
    """A backpressured job (tiny buffers, a slow function) with unaligned checkpoints,
    cancelled with its checkpoints retained: the newest holds records in flight; its
    rewrite keeps them, and the job restored from it loses none."""
    n = 30_000
    root, base, before = cancelled_with_records_in_flight(tmp_path, n)

    savepoint = rewrite_counts(tmp_path, root, 1_000)
    copied = load_checkpoint(savepoint).metadata.channel_state
    assert {v: h.subtasks.keys() for v, h in copied.items()} == {
        v: h.subtasks.keys() for v, h in base.metadata.channel_state.items()}
    env_of(tmp_path, SequenceSource(n), Count(), restore_from=savepoint).execute("resumed")
    assert check_continued(read_stream_sink(tmp_path / "out"), n, before, 1_000) == (0, 0, 0)


def test_weir_savepoint_create_of_a_continuous_storage_restores_exactly_once(
    tmp_path: Path
) -> None:
    """``weir savepoint create <storage> <target>`` of a continuous job's storage
    (unaligned checkpoints with records in flight, the job cancelled with them
    retained): the savepoint keeps the sources' positions, the records in flight and
    the job's lineage, so the job restored from it goes on exactly once."""
    from typer.testing import CliRunner

    from weir.cli import app

    n = 30_000
    root, base, before = cancelled_with_records_in_flight(tmp_path, n)

    made = CliRunner().invoke(app, ["savepoint", "create", root, str(tmp_path / "sp")])
    assert made.exit_code == 0, made.output
    savepoint = made.output.strip().splitlines()[-1]
    copied = load_checkpoint(savepoint).metadata
    assert copied.source_positions == base.metadata.source_positions
    assert copied.owner.get("lineage") == base.metadata.owner["lineage"]
    assert {v: h.subtasks.keys() for v, h in copied.channel_state.items()} == {
        v: h.subtasks.keys() for v, h in base.metadata.channel_state.items()}
    env_of(tmp_path, SequenceSource(n), Count(), restore_from=savepoint).execute("resumed")
    assert check_continued(read_stream_sink(tmp_path / "out"), n, before, 0) == (0, 0, 0)


@pytest.mark.spark
def test_the_weir_state_source_reads_a_continuous_storage(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    """``spark.read.format("weir-state")`` on a continuous job's storage root: one
    partition per stored subtask, and the rows ``weir.read_state`` gives — value and
    list state, timers — also of a chosen checkpoint (``checkpointId``)."""
    import weir.spark

    n = 4_000
    env_of(tmp_path, SequenceSource(n), Tracked(), backend=backend).execute("tracked")
    root = str(tmp_path / "chk")
    reader = weir.read_state(root)
    weir.spark.register_state_source(spark)

    def through_spark(scope: str, state: str = "", **options: str) -> list[tuple[Any, ...]]:
        read = spark.read.format("weir-state").option("uid", "count").option("scope", scope)
        for name, value in {**({"state": state} if state else {}), **options}.items():
            read = read.option(name, value)
        frame = read.load(root)
        assert frame.rdd.getNumPartitions() == 2  # one per stored subtask
        return sorted((tuple(r) for r in frame.collect()), key=repr)

    def rows(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
        return sorted((tuple(r) for r in frame.values.tolist()), key=repr)

    counts = through_spark("keyed", "count")
    assert counts == rows(reader.keyed_state("count", "count"))
    assert dict(counts) == {k: n // KEYS for k in range(KEYS)}
    recent = through_spark("keyed", "recent")
    assert recent == rows(reader.keyed_state("count", "recent")) and len(recent) == 3 * KEYS
    timers = through_spark("timers")
    assert timers == rows(reader.timers("count")) and len(timers) == KEYS
    chosen = reader.checkpoint("count").checkpoint_id
    assert through_spark("keyed", "count", checkpointId=str(chosen)) == counts
