"""The idempotent CollectSink: the newest record per key, converging to the oracle
across a kill -9 and the replay that follows (records written, never committed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import weir
from continuous_helpers import Running, keyed_graph
from weir.api.checkpointing import CheckpointConfig
from weir.api.connectors import SinkContext
from weir.connectors import CollectSink, SequenceSource
from weir.runtime.continuous.master import LocalJob

COUNT = weir.ValueStateDescriptor[int]("count", weir.IntSerializer())


class Count(weir.KeyedProcessFunction[int, list[int]]):
    """Running count per key (n % 40): emits [key, count]."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: int, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield [value % 40, n]


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_a_record_overwrites_the_one_with_its_key(tmp_path: Path) -> None:
    sink = CollectSink(tmp_path / "c.db", key=lambda r: r["k"])
    assert sink.collected() == {}
    writer = sink.writer(SinkContext(run_id="r", subtask=0, parallelism=1, attempt=0))
    for record in ({"k": [1, "a"], "v": 1}, {"k": 2, "v": 1}, {"k": [1, "a"], "v": 2}):
        writer.write(record)
    assert writer.prepare_commit(1) is None  # nothing to commit: flushed, final
    assert sink.collected() == {(1, "a"): {"k": [1, "a"], "v": 2}, 2: {"k": 2, "v": 1}}
    writer.write({"k": 2, "v": 3})  # (a replay of another attempt writes the same keys)
    writer.close()
    assert sink.records() == [{"k": 2, "v": 3}, {"k": [1, "a"], "v": 2}]
    distinct = CollectSink(tmp_path / "d.db")  # no key: each record is its own
    w = distinct.writer(SinkContext(run_id="r", subtask=0, parallelism=1, attempt=0))
    for r in ([1, 2], [1, 2], [3]):
        w.write(r)
    w.close()
    assert distinct.records() == [[1, 2], [3]]


def _open_together(directory: str, rounds: int, barrier: Any, errors: Any) -> None:
    from weir.connectors import SqliteSink

    for r in range(rounds):
        barrier.wait()
        try:
            CollectSink(f"{directory}/c{r}.db")._connect().close()
            SqliteSink(f"{directory}/s{r}.db")._connect().close()
        except Exception as exc:
            errors.put(repr(exc))


def test_task_processes_open_a_new_database_at_the_same_moment(tmp_path: Path) -> None:
    """Every subtask opens the sink's database when it starts; switching a new
    database to WAL from several processes at once made SQLite answer "database is
    locked" without waiting (seen failing a job's first attempt in make test)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier, errors = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_open_together, args=(str(tmp_path), 25, barrier, errors))
             for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 6
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert failures == []


def test_the_newest_count_per_key_survives_a_kill(tmp_path: Path, backend: str) -> None:
    n = 200_000
    sink = CollectSink(tmp_path / "counts.db", key=lambda r: r[0])
    graph = keyed_graph(tmp_path, source=SequenceSource(n, 50_000), function=Count(),
                        key_selector=lambda v: v % 40, backend=backend, sink=sink)
    job = LocalJob(graph, CheckpointConfig(interval=100),
                   restart=weir.RestartStrategy.fixed_delay(attempts=1, delay="0.0 s"))
    running = Running(job)
    running.until(lambda: len(job.result.completed) >= 2 and len(sink.collected()) == 40)
    before = sink.collected()
    running.kill(("count", 1))
    assert not running.join()
    assert job.result.restarts == 1 and len(job.result.failures) == 1
    assert 0 < min(r[1] for r in before.values()) < n // 40  # killed mid-run
    assert sink.collected() == {k: [k, n // 40] for k in range(40)}
