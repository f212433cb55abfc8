"""One job handle on either runtime (issue 39): a Spark query and a continuous job are
handled with the same verbs — ``trigger_savepoint``, ``stop_with_savepoint(drain=)``,
``checkpoints()`` in the one statistics model, ``metrics()``, ``cancel()``, ``wait()``
and ``done`` — and their savepoints land in fresh directories inside the target."""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any

import pytest

import weir
import weir.spark
from spark_support import (  # type: ignore[import-not-found]
    KEYED,
    BatchSink,
    Count,
    by_value,
    keyed_records,
    write_file,
)
from weir.checkpoint.stats import CheckpointStats, CheckpointStatus
from weir.stream import JobClient as StreamJobClient
from weir.stream import TaskMetrics

VERBS = ("trigger_savepoint", "stop_with_savepoint", "checkpoints", "metrics", "cancel", "wait")


def test_both_runtimes_handles_have_the_same_verbs_and_properties() -> None:
    for cls in (weir.spark.JobClient, StreamJobClient):
        for verb in VERBS:
            assert callable(getattr(cls, verb)), (cls, verb)
        assert isinstance(inspect.getattr_static(cls, "done"), property), cls
        assert isinstance(inspect.getattr_static(cls, "job_name"), property), cls
        drain = inspect.signature(cls.stop_with_savepoint).parameters["drain"]
        assert drain.kind is inspect.Parameter.KEYWORD_ONLY and drain.default is False


def _wait(condition: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.1)


@pytest.mark.spark
def test_a_spark_query_takes_savepoints_and_reports_checkpoints_like_a_continuous_job(
    spark: Any, tmp_path: Path
) -> None:
    by_value()  # (the workers unpickle the test's function by value)
    write_file(tmp_path / "in", keyed_records(0, 300, 30), KEYED)
    config = weir.JobConfig(tmp_path / "weir", parallelism=2,
                            state_backend=weir.RocksDBStateBackend())
    events = (spark.readStream.schema("key string, seq long")
              .option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in")))
    out = weir.spark.process(events, "key", Count(), "key string, seq long, n long, subtask int",
                             "count", config)  # (heartbeat: the draining batch runs)
    sink = BatchSink()
    query = (out.writeStream.foreachBatch(sink).option("checkpointLocation",
                                                       str(tmp_path / "spark"))
             .trigger(processingTime="300 milliseconds").start())
    job = weir.spark.JobClient(query, config)
    try:
        _wait(lambda: len(job.checkpoints()) >= 1, "completed checkpoint")
        assert not job.done and job.job_name
        (tmp_path / "sp").mkdir()
        (tmp_path / "sp" / "notes.txt").write_text("kept")  # what else the target holds
        running = job.trigger_savepoint(str(tmp_path / "sp"))
        final = job.stop_with_savepoint(str(tmp_path / "sp"), drain=True)
    finally:
        query.stop()
    assert job.done
    names = sorted(p.name for p in (tmp_path / "sp").iterdir())
    assert names[0] == "notes.txt" and len(names) == 3
    assert all(n.startswith("savepoint-") for n in names[1:])
    assert {running.rstrip("/").rsplit("/", 1)[-1], final.rstrip("/").rsplit("/", 1)[-1]} == set(
        names[1:])
    for target in (running, final):
        counts = weir.read_state(target).keyed_state("count", "count")
        assert dict(zip(counts["key"], counts["value"], strict=True)) == {
            f"k{i}": 10 for i in range(30)}
    stats = job.checkpoints()
    assert stats and all(isinstance(s, CheckpointStats) for s in stats)
    assert all(s.status is CheckpointStatus.COMPLETED and s.query == str(query.id)
               and s.operators == ("count",) and s.state_size and s.end_to_end_duration_ms
               is not None for s in stats)
    assert {s.subtask for s in stats[0].subtasks} == {0, 1}
    (metrics,) = job.metrics()  # one shape on both runtimes: TaskMetrics, a stage's sum
    assert isinstance(metrics, TaskMetrics) and (metrics.operator, metrics.subtask) == (
        "count", None)
    assert metrics.state_entries == 30 and metrics.state_size and metrics.batch is not None
    assert metrics.records_in is not None and metrics.records_in_per_s >= 0
