"""Event time on the continuous runtime: records carry their timestamp
(``ctx.timestamp``), watermarks trail the largest one by the bound, event-time timers
fire as the smallest watermark of a task's inputs passes them, and every timer fires
by the end (the final watermark) — each exactly once, also across a SIGKILL restart. An
idle input does not hold event time back, and once every input is idle event time is
the largest watermark of them all."""

from __future__ import annotations

import itertools
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
import weir.api.connectors
from continuous_helpers import Running, keyed_graph
from weir.api.checkpointing import CheckpointConfig
from weir.api.watermarks import WatermarkStrategy
from weir.connectors.file_source import FileSource, owner
from weir.connectors.stream import FileSink, SequenceSource, read_stream_sink
from weir.runtime.continuous.graph import JobGraph
from weir.runtime.continuous.master import LocalJob
from weir.stream import StreamEnvironment

KEYS = 20


class Deadlines(weir.KeyedProcessFunction[int, list[Any]]):
    """Each record (event time = its number times 10 ms) sets a timer 1 s later; a record
    arriving after the watermark passed its own timer time would be a bug."""

    def process_element(self, value: int, ctx: Any) -> Any:
        assert ctx.timestamp == value * 10
        assert ctx.current_watermark < ctx.timestamp + 1_000
        ctx.timer_service.register_event_time_timer(ctx.timestamp + 1_000)
        yield ["record", value % KEYS, value]

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield ["timer", ctx.current_key, timestamp]


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def graph(tmp_path: Path, backend: str, source: weir.api.connectors.Source[int],
          strategy: WatermarkStrategy | None = None) -> JobGraph:
    strategy = strategy or WatermarkStrategy.bounded_out_of_orderness(50, lambda v: v * 10,
                                                                      interval=20)
    return keyed_graph(tmp_path, source=source, key_selector=lambda v: v % KEYS,
                       function=Deadlines(), function_uid="deadlines", backend=backend,
                       watermarks=strategy, job="deadlines")


def job(tmp_path: Path, backend: str, n: int, rate: float | None) -> LocalJob:
    return LocalJob(graph(tmp_path, backend, SequenceSource(n, rate)),
                    CheckpointConfig(interval=50),
                    restart=weir.RestartStrategy.fixed_delay(attempts=1, delay="0 s"))


def check(tmp_path: Path, n: int) -> None:
    out = read_stream_sink(tmp_path / "out")
    records = Counter(r[2] for r in out if r[0] == "record")
    assert set(records) == set(range(n)) and max(records.values()) == 1
    timers = Counter((r[1], r[2]) for r in out if r[0] == "timer")
    expected = {(v % KEYS, v * 10 + 1_000) for v in range(n)}  # one per distinct time
    assert set(timers) == expected and max(timers.values()) == 1


def test_every_event_time_timer_fires_once_by_the_end(tmp_path: Path, backend: str) -> None:
    n = 20_000
    result = job(tmp_path, backend, n, None).run(timeout_s=120)
    assert result.restarts == 0
    check(tmp_path, n)


def test_event_time_timers_fire_once_across_a_sigkill(tmp_path: Path) -> None:
    n = 100_000
    local = job(tmp_path, "rocksdb", n, rate=25_000)
    running = Running(local)
    running.until(lambda: len(local.result.completed) >= 3)
    running.kill(("deadlines", 1))
    errors = running.join()
    assert not errors, errors
    assert local.result.restarts == 1
    check(tmp_path, n)


class HalfSilent(weir.api.connectors.Source[int]):
    """Subtask 0: the numbers 0, 2, 4, … below ``n`` at a rate; subtask 1: nothing
    until the file ``stop`` exists, then its end."""

    def __init__(self, n: int, stop: str) -> None:
        self.n, self.stop = n, stop

    def reader(self, subtask: int, parallelism: int, positions: Any) -> Any:
        from weir.connectors.stream import SequenceSource as Seq

        if subtask == 0:
            return Seq(self.n, 2_000).reader(0, 2, positions)
        stop = self.stop

        class Silent(weir.api.connectors.SourceReader[int]):
            def poll(self, max_records: int) -> list[int] | None:
                if os.path.exists(stop):
                    return None
                time.sleep(0.005)
                return []

            def positions(self) -> list[Any]:
                return []

        return Silent()


def test_an_idle_source_subtask_does_not_hold_event_time_back(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    n = 10_000
    strategy = WatermarkStrategy.bounded_out_of_orderness(
        50, lambda v: v * 10, interval=20).with_idleness(100)
    running = Running(LocalJob(graph(tmp_path, "hashmap", HalfSilent(n, str(stop)),
                                     strategy), CheckpointConfig(interval=50)))
    out = tmp_path / "out"
    # timers fire (and commit) while subtask 1 has sent nothing and not ended
    running.until(lambda: out.exists() and any(r[0] == "timer" for r in read_stream_sink(out)),
                  poll_s=0.05)
    stop.touch()
    errors = running.join()
    assert not errors, errors
    rows = read_stream_sink(out)
    assert sorted(r[2] for r in rows if r[0] == "record") == list(range(0, n, 2))
    timers = Counter((r[1], r[2]) for r in rows if r[0] == "timer")
    assert set(timers) == {(v % KEYS, v * 10 + 1_000) for v in range(0, n, 2)}
    assert max(timers.values()) == 1


class OwnTime(weir.KeyedProcessFunction[int, list[Any]]):
    """Each record ``{"k": key, "ts": time}`` sets an event-time timer at its own time."""

    def process_element(self, value: dict[str, int], ctx: Any) -> Any:
        ctx.timer_service.register_event_time_timer(ctx.timestamp)
        yield ["record", ctx.current_key, ctx.timestamp]

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield ["timer", ctx.current_key, timestamp]


def owned_by(subtask: int, stem: str) -> str:
    """A file name the watching FileSource's subtask ``subtask`` of 2 reads."""
    return next(name for name in (f"{stem}-{i}.jsonl" for i in itertools.count())
                if owner(name, 2) == subtask)


def put(directory: Path, name: str, times: range) -> None:
    """Write ``times`` as records of keys 0..4 to ``directory/name`` at once (a watching
    source never sees half a file)."""
    hidden = directory / f".{name}"
    hidden.write_text("".join(json.dumps({"k": t // 10 % 5, "ts": t}) + "\n" for t in times))
    hidden.rename(directory / name)


def test_event_time_reaches_the_largest_watermark_when_every_input_is_idle(
        tmp_path: Path) -> None:
    """Flink's StatusWatermarkValve: when the last active input goes idle, event time
    moves to the largest watermark of all inputs. Here the input that went idle first
    (subtask 0 of a watching FileSource, read to 2990) is ahead of the one that stays
    active longer (subtask 1, read to 1090): once both are idle the keyed task's event
    time is 2989 (its watermark), not 1089 — no further (2990 stays)."""
    watched = tmp_path / "in"
    watched.mkdir()
    high, low = range(2_000, 3_000, 10), range(100, 1_000, 10)
    put(watched, owned_by(0, "high"), high)
    put(watched, owned_by(1, "low"), low)
    strategy = WatermarkStrategy.bounded_out_of_orderness(
        0, lambda r: r["ts"], interval=20).with_idleness(1_500)
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2,
                                           checkpointing=CheckpointConfig(interval=50)))
    (env.from_source(FileSource(watched, monitor_interval=0.02), uid="files",
                     watermarks=strategy)
        .key_by(lambda r: r["k"]).process(OwnTime(), uid="timers")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    job = env.execute_async("idle-inputs")
    out = tmp_path / "out"

    def timers() -> set[int]:
        return {r[2] for r in read_stream_sink(out) if r[0] == "timer"} if out.exists() else set()

    def wait_for(up_to: int, times: list[int]) -> None:
        """Until every timer at or before ``up_to`` is committed (each sink subtask
        commits on its own notification: one timer seen says nothing of the others)."""
        expected = {t for t in times if t <= up_to}
        deadline = time.monotonic() + 30
        while not expected <= timers():
            assert time.monotonic() < deadline and not job.done, (
                up_to, sorted(expected - timers())[:5])
            time.sleep(0.02)

    try:
        wait_for(989, [*high, *low])  # both inputs sent their watermarks: event time 989
        later = range(1_000, 1_100, 10)  # subtask 1 stays active after subtask 0 idles
        put(watched, owned_by(1, "later"), later)
        wait_for(2_989, [*high, *low, *later])
        rows = read_stream_sink(out)
    finally:
        job.cancel()
    everything = [*high, *low, *later]
    assert sorted(r[2] for r in rows if r[0] == "record") == sorted(everything)
    fired = Counter(r[2] for r in rows if r[0] == "timer")
    assert set(fired) == {t for t in everything if t <= 2_989} and max(fired.values()) == 1


def test_a_source_that_goes_idle_sends_the_watermark_of_what_it_read_first(
        tmp_path: Path) -> None:
    """Idle after 1 ms without records but watermarks only every 500 ms: records read
    by a source that is already idle still send their watermark at the next check (it
    makes the source active again), before the source idles again (Flink's
    WatermarksWithIdleness: a check with records since the last one is never idle)."""
    watched = tmp_path / "in"
    watched.mkdir()
    strategy = WatermarkStrategy.bounded_out_of_orderness(
        0, lambda r: r["ts"], interval=500).with_idleness(1)
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=1,
                                           checkpointing=CheckpointConfig(interval=50)))
    (env.from_source(FileSource(watched, monitor_interval=0.02), uid="files",
                     watermarks=strategy)
        .key_by(lambda r: r["k"]).process(OwnTime(), uid="timers")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    job = env.execute_async("idle-source")
    out = tmp_path / "out"
    try:
        deadline = time.monotonic() + 60
        while len(job.metrics()) < 2:  # both tasks run (the source idles: no records)
            assert time.monotonic() < deadline and not job.done
            time.sleep(0.05)
        times = range(100, 1_001, 10)
        put(watched, owned_by(0, "only"), times)
        while not out.exists() or 990 not in {
                r[2] for r in read_stream_sink(out) if r[0] == "timer"}:
            assert time.monotonic() < deadline and not job.done, "no watermark came"
            time.sleep(0.02)
        rows = read_stream_sink(out)
    finally:
        job.cancel()
    fired = Counter(r[2] for r in rows if r[0] == "timer")
    assert set(fired) == {t for t in times if t <= 999} and max(fired.values()) == 1
