"""weir.spark.supervise: a streaming query restarted as its restart strategy allows.

Real Spark queries (marked ``spark``): a file source read with
``trigger(availableNow=True)`` whose ``foreachBatch`` raises on its first runs; the
supervisor restarts it (injected sleep: no real waiting) until it succeeds or the
strategy gives up. Fake queries (no Spark) cover the paths Spark does not reach easily:
``start_query`` raising, an error only in ``exception()``, ``KeyboardInterrupt``."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

import weir
import weir.spark
from weir.errors import ConfigurationError, RestartsExhaustedError
from weir.runtime.spark import supervise as supervise_module


class _Flaky:
    """Starts the query; its ``foreachBatch`` raises on the first ``failures`` calls."""

    def __init__(self, spark: Any, tmp_path: Path, failures: int) -> None:
        self.spark, self.tmp_path, self.failures_left = spark, tmp_path, failures
        self.starts = 0
        self.batches: dict[int, list[int]] = {}
        source = tmp_path / "in"
        source.mkdir()
        for i in range(2):  # the file source takes files in modification-time order
            path = source / f"{i}.json"
            path.write_text("\n".join(json.dumps({"n": 10 * i + j}) for j in range(3)))
            os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))

    def sink(self, df: Any, batch_id: int) -> None:
        if self.failures_left > 0:
            self.failures_left -= 1
            raise RuntimeError(f"injected failure in batch {batch_id}")
        self.batches[batch_id] = sorted(r.n for r in df.collect())

    def __call__(self) -> Any:
        self.starts += 1
        events = (self.spark.readStream.schema("n long").option("maxFilesPerTrigger", 1)
                  .json(str(self.tmp_path / "in")))
        return (events.writeStream.queryName("flaky").foreachBatch(self.sink)
                .option("checkpointLocation", str(self.tmp_path / "spark"))
                .trigger(availableNow=True).start())


@pytest.mark.spark
def test_a_failing_query_is_restarted_until_it_succeeds(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    flaky = _Flaky(spark, tmp_path, failures=2)
    sleeps: list[float] = []
    with caplog.at_level(logging.WARNING, logger="weir"):
        restarts = weir.spark.supervise(
            flaky, restart=weir.spark.RestartStrategy.fixed_delay(attempts=2, delay="7 s"),
            sleep=sleeps.append, poll_s=0.2)
    assert restarts == 2 and flaky.starts == 3
    assert sleeps == [7.0, 7.0]
    # the failed batch 0 ran again in the restarted query, then batch 1
    assert flaky.batches == {0: [0, 1, 2], 1: [10, 11, 12]}
    lines = [r.getMessage() for r in caplog.records
             if r.name == "weir" and r.levelno == logging.WARNING]
    assert len(lines) == 2
    for n, line in enumerate(lines, 1):
        assert "'flaky'" in line and f"restart {n} " in line and "in 7 s" in line
        assert "injected failure in batch 0" in line and "\n" not in line


@pytest.mark.spark
def test_a_strategy_that_gives_up_raises_from_the_spark_error(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from pyspark.errors import StreamingQueryException

    flaky = _Flaky(spark, tmp_path, failures=2)
    sleeps: list[float] = []
    with caplog.at_level(logging.WARNING, logger="weir"), \
            pytest.raises(RestartsExhaustedError) as info:
        weir.spark.supervise(flaky, restart=weir.RestartStrategy.fixed_delay(attempts=1),
                             sleep=sleeps.append, poll_s=0.2)
    assert flaky.starts == 2 and sleeps == [1.0] and not flaky.batches
    message = str(info.value)
    assert "'flaky'" in message and "after 1 restart(s)" in message
    assert "fixed-delay(attempts=1, delay=1.0)" in message
    assert "injected failure in batch 0" in message and "checkpointLocation" in message
    assert isinstance(info.value.__cause__, StreamingQueryException)
    assert isinstance(info.value, weir.WeirError)
    assert len([r for r in caplog.records if r.name == "weir"]) == 1
    assert not spark.streams.active


# ------------------------------------------------------------------ fake queries


class _Query:
    """A StreamingQuery stand-in: ends after ``polls`` polls (at once without a timeout),
    with ``error``."""

    def __init__(self, error: BaseException | None = None, *, raises: bool = True,
                 polls: int = 1) -> None:
        self.error, self.raises, self.polls = error, raises, polls
        self.name, self.id, self.stopped = "fake", "q-1", False

    def awaitTermination(self, timeout: float | None = None) -> bool:
        self.polls -= 1
        if self.polls > 0 and timeout is not None:
            return False
        if isinstance(self.error, KeyboardInterrupt) or (self.error and self.raises):
            raise self.error
        return True

    def exception(self) -> BaseException | None:
        return self.error

    def stop(self) -> None:
        self.stopped = True


class _Completion:
    """Records the queries the supervisor settles (the real ones belong to Spark)."""

    def __init__(self) -> None:
        self.settled: list[Any] = []

    def settle(self, query: Any) -> None:
        self.settled.append(query)


@pytest.fixture
def finished(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    done: list[Any] = []
    monkeypatch.setattr(supervise_module, "finish", done.append)
    monkeypatch.setattr(supervise_module, "COMPLETIONS", {0: _Completion()})
    return done


def test_start_query_raising_and_an_error_only_in_exception_are_failures(
    finished: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    failed = _Query(ValueError("bad batch"), raises=False, polls=3)
    outcomes: list[Any] = [RuntimeError("cannot start\nsecond line"), failed, _Query()]
    clock = iter([10.0, 20.0])

    def start() -> Any:
        item = outcomes.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    sleeps: list[float] = []
    with caplog.at_level(logging.WARNING, logger="weir"):
        assert supervise_module.supervise(
            start, restart=weir.RestartStrategy.failure_rate(2, 60, delay="3 s"),
            clock=lambda: next(clock), sleep=sleeps.append, poll_s=0.01) == 2
    assert sleeps == [3.0, 3.0] and len(finished) == 1
    # the failed run is settled at once: its stages are free for the restarted one
    settled = supervise_module.COMPLETIONS[0].settled  # type: ignore[attr-defined]
    assert [q.error for q in settled] == [failed.error] and finished[0] is not failed
    lines = [r.getMessage() for r in caplog.records if r.name == "weir"]
    assert "started by" in lines[0] and "RuntimeError: cannot start" in lines[0]
    assert "second line" not in lines[0]
    assert "'fake' (id q-1)" in lines[1] and "ValueError: bad batch" in lines[1]


def test_no_restart_raises_at_once_and_keyboard_interrupt_stops_the_query(
    finished: list[Any]
) -> None:
    error = RuntimeError("boom")
    with pytest.raises(RestartsExhaustedError, match="after 0 restart") as info:
        supervise_module.supervise(lambda: _Query(error),
                                   restart=weir.RestartStrategy.no_restart())
    assert info.value.__cause__ is error
    for poll_s in (None, 0.01):
        query = _Query(KeyboardInterrupt(), polls=2)
        with pytest.raises(KeyboardInterrupt):
            supervise_module.supervise(lambda q=query: q, poll_s=poll_s,
                                       sleep=pytest.fail)
        assert query.stopped and not finished


def test_supervise_validates_its_arguments() -> None:
    with pytest.raises(ConfigurationError, match="restart must be a RestartStrategy"):
        supervise_module.supervise(_Query, restart="fixed-delay")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="poll_s"):
        supervise_module.supervise(_Query, poll_s=0)


# ------------------------------------------------- a weir stage failing in its tasks


class _FailingCount(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """spark_support.Count whose subtask 0 raises while a token file is left in
    ``tokens`` (one token per failed run: local[2] does not retry tasks)."""

    def __init__(self, tokens: str) -> None:
        self.tokens = tokens

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(weir.ValueStateDescriptor[int]("count"))

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        if ctx.subtask_index == 0:
            for token in sorted(os.listdir(self.tokens)):
                try:
                    os.remove(os.path.join(self.tokens, token))
                except FileNotFoundError:
                    continue
                raise RuntimeError(f"injected task failure ({token})")
        yield (value["key"], value["seq"], n, ctx.subtask_index)


@pytest.mark.spark
def test_a_weir_stage_failing_in_its_tasks_restarts_exactly_once(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    """The usual shape: the stage's DataFrame built once, the query started again from
    it; each restart takes the stage over from the last committed batch, and the counts
    come out as if nothing had failed (L = D = 0)."""
    import sys
    from collections import Counter

    from pyspark import cloudpickle

    from spark_support import (  # type: ignore[import-not-found]
        KEYED,
        BatchSink,
        by_value,
        keyed_records,
        last_counts,
        write_file,
    )

    by_value()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    records = keyed_records(0, 900, 60)
    for part in range(3):
        write_file(tmp_path / "in", records[part * 300:(part + 1) * 300], KEYED)
    events = (spark.readStream.schema("key string, seq long").option("maxFilesPerTrigger", 1)
              .parquet(str(tmp_path / "in")))
    out = weir.spark.process(
        events,
        key_by="key",
        function=_FailingCount(str(tokens)),
        output_schema="key string, seq long, n long, subtask int",
        uid="count",
        config=weir.JobConfig(str(tmp_path / "weir"), state_backend=backend),
        parallelism=2,
        heartbeat=False,
    )
    sink, starts = BatchSink(), []

    def start() -> Any:
        starts.append(1)
        if len(starts) == 2:  # the second run fails in batch 1 (after batch 0 committed)
            (tokens / "b").touch()
        return (out.writeStream.foreachBatch(sink).queryName("counting")
                .option("checkpointLocation", str(tmp_path / "spark"))
                .trigger(availableNow=True).start())

    (tokens / "a").touch()  # the first run fails in batch 0
    sleeps: list[float] = []
    restarts = weir.spark.supervise(start, restart=weir.RestartStrategy.fixed_delay(
        attempts=2, delay="0.5 s"), sleep=sleeps.append, poll_s=0.2)
    assert restarts == 2 and len(starts) == 3 and sleeps == [0.5, 0.5]
    assert not list(tokens.iterdir())  # both injected failures happened
    rows = sink.rows()
    lost = {r["seq"] for r in records} - {r[1] for r in rows}
    duplicated = [s for s, c in Counter(r[1] for r in rows).items() if c > 1]
    assert (len(lost), len(duplicated)) == (0, 0)
    assert last_counts(rows) == Counter(r["key"] for r in records)
    reader = weir.read_state(str(tmp_path / "weir"))
    frame = reader.keyed_state("count", "count")
    assert dict(zip(frame["key"], frame["value"], strict=True)) == Counter(
        r["key"] for r in records)
