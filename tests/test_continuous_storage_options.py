"""``JobConfig(storage_options=...)`` on the continuous runtime: the fsspec options of
the checkpoint storage reach the driver (coordinator, ownership, savepoints), every
task process (checkpoints, restore after a kill, savepoint targets) and an explicit
``restore_from``; they never appear in checkpoint metadata nor in the job's logs.

The storage is fsspec's ``dir://`` filesystem, which cannot be opened without its
options (``path``: the directory it is rooted in, ``target_protocol``), so a task that
opened the storage from the URL alone would fail."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

import weir
from continuous_helpers import Count, by_value, check_exactly_once, completed, wait_for
from weir.checkpoint.storage import CheckpointStorage
from weir.connectors.stream import FileSink, SequenceSource, read_stream_sink
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

#: a stand-in for a credential (DirFileSystem keeps unknown options as its own)
SECRET = "hunter2-not-for-logs"


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


def options(base: Path) -> dict[str, str]:
    return {"path": str(base), "target_protocol": "file", "token": SECRET}


def env_of(tmp_path: Path, n: int, rate: float | None, *,
           restore_from: str | None = None) -> StreamEnvironment:
    env = StreamEnvironment(weir.JobConfig(
        "dir://chk", storage_options=options(tmp_path), parallelism=2, max_parallelism=32,
        checkpointing=CheckpointConfig(interval=100),
        restart_strategy=RestartStrategy.fixed_delay(attempts=1, delay="0 s"),
        restore_from=restore_from))
    (env.from_source(SequenceSource(n, rate), uid="numbers")
        .key_by(lambda v: v % 50)
        .process(Count(), uid="count")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    return env


def test_the_dir_filesystem_needs_its_options() -> None:
    with pytest.raises(Exception):  # noqa: B017  (fsspec: an AttributeError)
        CheckpointStorage("dir://chk").exists("x")


def test_storage_options_reach_the_driver_every_task_savepoints_and_restore_from(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job on ``dir://chk``: checkpoints complete, a keyed task killed after two of
    them restores from the latest, a stop-with-savepoint into ``dir://savepoints``
    completes, and a second run restoring that savepoint (``restore_from``, a URL of
    the same filesystem) finishes the input exactly once."""
    caplog.set_level(logging.DEBUG, logger="weir")
    n = 40_000
    client = env_of(tmp_path, n, rate=4_000).execute_async("opts", timeout="120 s")
    wait_for(client, "two checkpoints", lambda: completed(client) >= 2)
    assert (tmp_path / "chk").is_dir()  # (under the options' path, not the cwd)
    job = client._job
    wait_for(client, "the keyed task", lambda: ("count", 1) in job._procs)
    seen = completed(client)
    job._procs[("count", 1)].kill()
    wait_for(client, "the restart", lambda: job.attempt == 1)
    wait_for(client, "a checkpoint after the restart", lambda: completed(client) > seen)
    stopped = client.stop_with_savepoint("dir://savepoints")
    result = client.wait(60)
    assert result.restarts == 1 and result.savepoint == stopped
    assert stopped.startswith("dir://savepoints/savepoint-opts")
    assert (tmp_path / "savepoints" / stopped.rsplit("/", 1)[-1] / "_metadata").is_file()

    env_of(tmp_path, n, rate=None, restore_from=stopped).execute("opts", timeout="120 s")
    check_exactly_once(tmp_path, n)  # output, counts, state, every transaction committed
    latest = weir.CheckpointCoordinator("dir://chk", storage_options=options(tmp_path),
                                        clean_up=False).latest()
    assert latest is not None and latest.metadata.operators["count"].subtasks

    # the options (a credential) are in no metadata and no log line
    for path in [*tmp_path.glob("chk/**/*"), *tmp_path.glob("savepoints/**/*")]:
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in caplog.text
    assert SECRET not in repr(env_of(tmp_path, 1, None).job_graph())


def test_a_new_run_goes_on_from_the_savepoint_the_last_run_stopped_with(
    tmp_path: Path
) -> None:
    """Without ``restore_from``, a new run on the storage goes on from the savepoint the
    previous run stopped with (the storage's history names it): the driver opens it
    with the storage's options too."""
    n = 20_000
    client = env_of(tmp_path, n, rate=4_000).execute_async("opts", timeout="120 s")
    wait_for(client, "a checkpoint", lambda: completed(client) >= 1)
    stopped = client.stop_with_savepoint("dir://savepoints")
    assert client.wait(60).savepoint == stopped
    env_of(tmp_path, n, rate=None).execute("opts", timeout="120 s")
    check_exactly_once(tmp_path, n)


class Invalid(ValueError):
    """A record the function rejects."""


class Picky(weir.KeyedProcessFunction[int, int]):
    """Rejects multiples of 7 (to the dead letters), emits the rest."""

    def process_element(self, value: int, ctx: Any) -> Any:
        if value % 7 == 0:
            raise Invalid(f"{value} is a multiple of 7")
        yield value


def test_the_default_dead_letters_go_into_the_storage_with_its_options(
    tmp_path: Path
) -> None:
    """A function's default dead-letter sink writes into the job's checkpoint storage:
    its task processes open it with the job's storage options too."""
    env = StreamEnvironment(weir.JobConfig(
        "dir://chk", storage_options=options(tmp_path), parallelism=2, max_parallelism=32,
        checkpointing=CheckpointConfig(interval=100),
        restart_strategy=RestartStrategy.no_restart()))
    (env.from_source(SequenceSource(1_000), uid="numbers")
        .key_by(lambda v: v % 10)
        .process(Picky(), uid="picky", bad_record_exceptions=[Invalid])
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    env.execute("picky", timeout="120 s")
    dead = weir.read_dead_letters("dir://chk", storage_options=options(tmp_path))
    assert sorted(d["record"] for d in dead) == list(range(0, 1_000, 7))
    assert sorted(read_stream_sink(tmp_path / "out")) == [v for v in range(1_000) if v % 7]


@pytest.mark.spark
def test_storage_options_reach_the_tasks_on_spark_executors(spark: Any, tmp_path: Path
                                                            ) -> None:
    """``runner="spark"``: the driver's probe file, each executor's check of it and the
    tasks (forks of Spark's Python workers) open the storage with the options."""
    n = 20_000
    env = StreamEnvironment(weir.JobConfig(
        "dir://chk", storage_options=options(tmp_path), parallelism=1, max_parallelism=32,
        checkpointing=CheckpointConfig(interval=100),
        restart_strategy=RestartStrategy.no_restart()))
    (env.from_source(SequenceSource(n), uid="numbers")
        .key_by(lambda v: v % 50)
        .process(Count(), uid="count")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    result = env.execute("opts-on-spark", runner="spark", spark=spark, timeout="300 s")
    assert result.completed and result.restarts == 0
    check_exactly_once(tmp_path, n)
