"""Job graphs for the continuous runtime's tests: the keyed shape most of them run, its
running count, and the exactly-once check of its output and state. A test module that
runs ``Count`` registers this module for pickling by value (``by_value``): task
processes do not import the tests."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from pyspark import cloudpickle

import weir
from weir.api.connectors import Sink, Source
from weir.api.watermarks import WatermarkStrategy
from weir.connectors.stream import FileSink, read_stream_sink
from weir.runtime.continuous.channels import ChannelConfig
from weir.runtime.continuous.graph import JobGraph
from weir.runtime.continuous.master import LocalJob
from weir.stream import CheckpointStatus, JobClient, StreamEnvironment

COUNT = weir.ValueStateDescriptor[int]("count", weir.IntSerializer())


class Count(weir.KeyedProcessFunction[int, list[Any]]):
    """Running count per key (n % 50): emits [key, n, count]."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: int, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield [value % 50, value, n]


class BatchCount(weir.KeyedBatchFunction):
    """``Count`` a batch at a time (records: ints, in the batch's ``value`` column, or
    lists whose item ``item`` is the number): each record's count is its key's count
    before the batch plus its occurrence in the batch; emits [key, n, count] rows (a
    ``value`` column of lists)."""

    def __init__(self, item: int | None = None) -> None:
        self.item = item

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_batch(self, batch: Any, ctx: Any) -> Any:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        keys = np.asarray(ctx.keys, dtype=np.int64)
        distinct, codes, runs = np.unique(keys, return_inverse=True, return_counts=True)
        before = pc.fill_null(self.count.get(distinct.tolist()), 0).to_numpy()
        order = np.argsort(codes, kind="stable")
        starts = np.concatenate(([0], np.cumsum(runs)[:-1]))
        occurrence = np.empty(len(codes), dtype=np.int64)
        occurrence[order] = np.arange(len(codes)) - np.repeat(starts, runs)
        self.count.put(distinct.tolist(), (before + runs).tolist())
        counts = before[codes] + occurrence + 1
        numbers = batch.column("value")
        if self.item is not None:
            numbers = pc.list_element(numbers, self.item)
        numbers = numbers.to_numpy()
        rows = np.stack([keys, numbers, counts], axis=1)
        return pa.record_batch([pa.array(rows.tolist(), pa.list_(pa.int64()))],
                               names=["value"])


def by_value(module: ModuleType) -> None:
    """Pickle ``module``'s functions, and this one's, by value into the job graph."""
    cloudpickle.register_pickle_by_value(module)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


#: the keys of ``Count`` (n % 50)
KEYS = 50


def lost_duplicated_wrong(out: list[Any], n: int) -> tuple[int, int, int]:
    """L, D and M of ``Count``'s [key, n, count] rows over ``0 .. n-1``: every number
    once; each key's counts 1..n/50."""
    numbers = Counter(r[1] for r in out)
    lost = len(set(range(n)) - set(numbers))
    duplicated = sum(c - 1 for c in numbers.values() if c > 1)
    per_key: dict[int, list[int]] = {}
    for key, _, count in out:
        per_key.setdefault(key, []).append(count)
    wrong = sum(sorted(per_key.get(k, [])) != list(range(1, n // KEYS + 1)) for k in range(KEYS))
    return lost, duplicated, wrong


def check_exactly_once(tmp_path: Path, n: int) -> None:
    """``Count`` over ``0 .. n-1`` into ``tmp_path/out`` with checkpoints in
    ``tmp_path/chk``: every number once in the output, every key's counts 1..n/50, the
    state, and every transaction committed."""
    out = read_stream_sink(tmp_path / "out")
    numbers = [r[1] for r in out]
    lost = set(range(n)) - set(numbers)
    duplicated = [v for v, c in Counter(numbers).items() if c > 1]
    assert (len(lost), len(duplicated)) == (0, 0), (len(lost), len(duplicated))
    per_key: dict[int, list[int]] = {}
    for key, _, count in out:
        per_key.setdefault(key, []).append(count)
    assert all(sorted(c) == list(range(1, n // 50 + 1)) for c in per_key.values())
    state = weir.read_state(str(tmp_path / "chk")).keyed_state("count", "count")
    assert dict(zip(state["key"], state["value"], strict=True)) == {k: n // 50 for k in range(50)}
    assert not list((tmp_path / "out" / ".pending").iterdir())


#: tiny buffers and credits: a slow stage backs its inputs up at once (unaligned tests)
TINY = ChannelConfig(buffer_records=4, buffer_timeout_ms=2, exclusive_buffers=2,
                     floating_buffers=2, max_backlog=2)


def keyed_graph(tmp_path: Path, *, source: Source[Any], function: Any,
                key_selector: Callable[[Any], Any], backend: str = "hashmap",
                sink: Sink[Any] | None = None, parallelism: int = 2,
                max_parallelism: int = 32, source_uid: str = "numbers",
                function_uid: str = "count", watermarks: WatermarkStrategy | None = None,
                job: str = "job", **fields: Any) -> JobGraph:
    """source -> key_by -> process -> sink (FileSink in tmp_path/out), checkpoints in
    tmp_path/chk; ``fields`` replace JobGraph settings (heartbeat_timeout_s, channel)."""
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=parallelism,
                                           max_parallelism=max_parallelism, state_backend=backend))
    (env.from_source(source, uid=source_uid, watermarks=watermarks)
        .key_by(key_selector)
        .process(function, uid=function_uid)
        .sink_to(sink if sink is not None else FileSink(tmp_path / "out"), uid="sink"))
    graph = env.job_graph(job)
    return dataclasses.replace(graph, **fields) if fields else graph


class Running:
    """A LocalJob run in a background thread, for tests that act on it while it runs
    (kill a task, wait for checkpoints); the error it ended with, if any, in ``errors``."""

    def __init__(self, job: LocalJob, timeout_s: float = 120) -> None:
        self.job = job
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(timeout_s,))
        self.thread.start()

    def _run(self, timeout_s: float) -> None:
        try:
            self.job.run(timeout_s=timeout_s)
        except BaseException as exc:
            self.errors.append(exc)

    def until(self, ready: Callable[[], Any], timeout_s: float = 60, poll_s: float = 0.01
              ) -> None:
        """Wait until ``ready()``, failing if the job ended first or it takes too long."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert time.monotonic() < deadline and self.thread.is_alive(), self.errors
            time.sleep(poll_s)

    def arm_in_turn(self, markers: Path, plan: list[tuple[int, int, list[str]]],
                    ready: Callable[[], bool] = lambda: True) -> None:
        """For each ``(attempt, checkpoints, names)`` of ``plan`` in turn: once the job
        is at ``attempt`` (or later) and has completed ``checkpoints`` more since it got
        there (and ``ready()``), create the marker files ``names`` in ``markers``. Only
        the attempt's own checkpoints count: one completes once every task of the
        attempt runs, so no marker is armed while a restart's tasks still open (an
        earlier attempt's count armed ``restore`` before ``snapshot`` fired)."""
        for attempt, checkpoints, names in plan:
            self.until(lambda a=attempt: self.job.attempt >= a, 120, 0.005)
            target = len(self.job.result.completed) + checkpoints
            self.until(lambda t=target: len(self.job.result.completed) >= t and ready(),
                       120, 0.005)
            for name in names:
                (markers / name).touch()

    def kill(self, task: tuple[str, int]) -> None:
        """SIGKILL the process of ``task`` (through its handle: never a pid that another
        process may have got since)."""
        self.job._procs[task].kill()

    def join(self, timeout_s: float = 120) -> list[BaseException]:
        """Wait for the job's end; the errors it ended with."""
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the job did not end"
        return self.errors


def wait_for(client: JobClient, what: str, done: Callable[[], Any],
             timeout: float = 60.0) -> None:
    """Wait until ``done()`` while ``client``'s job runs (failing if it ended first, or
    after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert not client.done, f"the job ended before {what}: {client.wait()}"
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.02)


def completed(client: JobClient) -> int:
    """How many checkpoints and savepoints of ``client``'s job completed so far."""
    return sum(s.status is CheckpointStatus.COMPLETED for s in client.checkpoints())
