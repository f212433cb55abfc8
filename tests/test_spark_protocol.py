"""Adversarial protocol scenarios on real Spark (local[2], the shared session): what
users and Spark do to a stage's checkpoint location. Each ends exactly-once (L = D =
M = 0 against an oracle) or in the specific clear error, and asserts that the
situation it sets up really happened (RELIABILITY.md, test 11)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
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
    last_counts,
    observed,
    run,
    stage_metrics,
    write_file,
)

SCHEMA = "key string, seq long"
COUNT_OUT = "key string, seq long, n long, subtask int"


@pytest.fixture(autouse=True)
def _pickle_by_value() -> None:
    by_value()


def _oracle(records: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["key"] for r in records)


def _stage(location: Path, uid: str = "count", **kwargs: Any) -> Callable[[Any], Any]:
    options = {"parallelism": 2, "heartbeat": False, **kwargs}

    def build(events: Any) -> Any:
        return weir.spark.process(events, key_by="key", function=Count(),
                                  output_schema=COUNT_OUT, uid=uid,
                                  checkpoint_location=str(location), **options)
    return build


def _lmd(rows: list[tuple[Any, ...]], expected_seqs: list[int],
         oracle: Counter[str]) -> tuple[int, int, int]:
    """(lost, duplicated, keys whose final count differs) of ``rows``."""
    seen = Counter(r[1] for r in rows)
    lost = sum(1 for s in expected_seqs if s not in seen)
    duplicated = sum(n - 1 for n in seen.values() if n > 1)
    counts = last_counts(rows)
    mismatched = sum(1 for k in set(counts) | set(oracle) if counts.get(k) != oracle.get(k))
    return lost, duplicated, mismatched


def _query_dirs(location: Path, uid_prefix: str = "count") -> list[Path]:
    return sorted(location.glob(f"stages/{uid_prefix}-*/queries/*"))


def _start(spark: Any, source: Path, build: Callable[[Any], Any], spark_dir: Path,
           sink: Callable[[Any, int], None], *, once: bool = False, schema: str = SCHEMA,
           reader: Callable[[Any], Any] | None = None) -> Any:
    """Start ``build`` over the files in ``source``, one file per batch, into ``sink``
    (foreachBatch): until the input is consumed if ``once``, else every 300 ms."""
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
    events = reader(stream) if reader is not None else stream.parquet(str(source))
    writer = (build(events).writeStream.foreachBatch(sink)
              .option("checkpointLocation", str(spark_dir)))
    trigger = {"availableNow": True} if once else {"processingTime": "300 milliseconds"}
    return writer.trigger(**trigger).start()


def _first_run(
    spark: Any, tmp_path: Path, total: int, batches: int, **stage: Any
) -> tuple[list[dict[str, Any]], Path, Callable[[Any], Any], BatchSink]:
    """``total`` records over 30 keys; the first ``batches`` files of 300 of them run
    through a count stage in ``tmp_path/weir`` to the end. Returns (records, location,
    the stage builder, the sink)."""
    records = keyed_records(0, total, 30)
    location = tmp_path / "weir"
    build = _stage(location, **stage)
    for b in range(batches):
        write_file(tmp_path / "in", records[b * 300:(b + 1) * 300], KEYED)
    return records, location, build, run(spark, tmp_path / "in", SCHEMA, build,
                                         tmp_path / "spark")


def _own_largest_file(query: Path, batch: int) -> Path:
    """The largest state file checkpoint ``batch`` references and ``batch - 1`` does
    not (a full snapshot, a changelog delta, RocksDB files it uploaded)."""
    def files(n: int) -> dict[str, int]:
        if not (query / f"chk-{n}" / "_metadata").exists():
            return {}
        meta = weir.load_checkpoint(str(query / f"chk-{n}"), verify=False).metadata
        return {f.path: f.size for f in meta.files()}
    previous = files(batch - 1)
    own = {p: n for p, n in files(batch).items() if p not in previous}
    return query / max(own, key=lambda p: own[p])


def _error_text(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    return str(excinfo.value)


# ------------------------------------------------------------------ 1. lost state


@pytest.mark.spark
def test_1_a_deleted_location_fails_with_the_ways_out_and_recover_empty_is_explicit(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    records, location, build, sink = _first_run(spark, tmp_path, 900, 2, state_backend=backend)
    assert sorted(sink.batches) == [0, 1]
    shutil.rmtree(location)  # the injected fault: weir's state is gone, Spark's stays
    write_file(tmp_path / "in", records[600:], KEYED)
    with pytest.raises(Exception) as excinfo:
        run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark", sink)
    text = _error_text(excinfo)
    assert "MissingStateError" in text and "batch 2" in text and "batch 1" in text
    assert str(location) in text and "recover(" in text and "restore_from" in text
    assert 2 not in sink.batches  # nothing of batch 2 was emitted
    assert not any(location.glob("stages/*/queries/*/chk-2"))

    # the user's explicit choice: go on from empty state
    message = weir.spark.recover(str(location), "count", source="empty")
    assert "empty state" in message
    run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark", sink)
    assert last_counts(sink.batches[2]) == _oracle(records[600:])


@pytest.mark.spark
def test_1_a_newest_checkpoint_deleted_by_hand_fails_and_recover_latest_says_what_it_drops(
    spark: Any, tmp_path: Path
) -> None:
    records, location, build, sink = _first_run(spark, tmp_path, 1200, 3)
    (query,) = _query_dirs(location)
    shutil.rmtree(query / "chk-2")  # the injected fault
    write_file(tmp_path / "in", records[900:], KEYED)
    with pytest.raises(Exception) as excinfo:
        run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark", sink)
    text = _error_text(excinfo)
    assert "MissingStateError" in text and "chk-2 is missing" in text
    assert f"query {query.name}" in text and "recover(" in text

    message = weir.spark.recover(str(location), "count")
    assert "checkpoint 1" in message and "after batch 1 are dropped" in message
    run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark", sink)
    # exactly the explicit choice: batch 2's records are not in the state
    kept = records[:600] + records[900:]
    assert last_counts(sink.batches[3]) == {
        k: n for k, n in _oracle(kept).items() if k in {r["key"] for r in records[900:]}
    }


# ------------------------------------------------------------------ 2. stages sharing a location


@pytest.mark.spark
def test_2_two_stages_share_a_location_through_restart_rescale_and_a_new_query(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    records = keyed_records(0, 1500, 40)
    location = tmp_path / "weir"

    def both(p_a: int, p_b: int) -> Callable[[Any], Any]:
        def build(events: Any) -> Any:
            a = _stage(location, "a", parallelism=p_a, state_backend=backend)(events)
            b = _stage(location, "b", parallelism=p_b, state_backend=backend)(events)
            from pyspark.sql import functions as F

            return a.withColumn("stage", F.lit("a")).unionByName(
                b.withColumn("stage", F.lit("b")))
        return build

    sinks: dict[str, BatchSink] = {}  # batch ids start again at 0 in a new query
    steps = [(0, 500, (2, 2), "spark-1"), (500, 1000, (3, 2), "spark-1"),
             (1000, 1500, (1, 3), "spark-2")]
    for start, end, (p_a, p_b), spark_dir in steps:
        source = tmp_path / f"in-{spark_dir}"  # a new query reads its source from the start
        write_file(source, records[start:end], KEYED)
        run(spark, source, SCHEMA, both(p_a, p_b), tmp_path / spark_dir,
            sinks.setdefault(spark_dir, BatchSink()))
    rows = [r for s in sinks.values() for r in s.rows()]
    for stage in ("a", "b"):
        mine = [r for r in rows if r[4] == stage]
        assert _lmd(mine, list(range(1500)), _oracle(records)) == (0, 0, 0)
    # each stage kept its own namespace: no file of one stage in the other's directory
    assert len(list(location.glob("stages/*"))) == 2
    assert len(_query_dirs(location, "a")) == 2 and len(_query_dirs(location, "b")) == 2


@pytest.mark.spark
def test_1_a_new_query_whose_first_batches_are_empty_takes_the_stage_over_later(
    spark: Any, tmp_path: Path
) -> None:
    records, location, _, _ = _first_run(spark, tmp_path, 600, 2)
    (tmp_path / "empty").mkdir()
    sink = BatchSink()
    # the heartbeat's rate source has no row in the new query's batch 0: no task of the
    # stage runs it; the stage's first rows come in a later batch
    query = _start(spark, tmp_path / "empty", _stage(location, heartbeat=True),
                   tmp_path / "spark-2", sink)
    try:
        _wait(lambda: _committed(query) >= 2, "two batches of the new query", timeout=90)
        assert query.isActive, query.exception()
    finally:
        query.stop()
    weir.spark.finish(query)
    from weir.checkpoint.epochs import EpochStore
    from weir.checkpoint.ownership import Lineage

    store = EpochStore(weir.CheckpointStorage(str(location)), "count")
    mine = [c for c in Lineage(store.stage, 60_000).claims() if c.query == str(query.id)]
    # the injected situation: its first batch had no row for the stage (no task ran it,
    # so nothing claimed the stage), and a later batch took it over
    assert len(mine) == 1 and (mine[0].batch or 0) >= 1
    more = keyed_records(600, 630, 30)
    write_file(tmp_path / "more", more, KEYED)
    third = run(spark, tmp_path / "more", SCHEMA, _stage(location), tmp_path / "spark-3")
    assert last_counts(third.rows()) == _oracle(records + more)  # nothing lost or reset


# ------------------------------------------------------------------ 3. two queries at once


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _committed(query: Any) -> int:
    """The last batch Spark reported as committed (-1 before the first)."""
    progress = query.lastProgress
    return int(progress["batchId"]) if progress else -1


@pytest.mark.spark
def test_3_a_second_query_on_a_running_stage_is_refused_naming_the_running_one(
    spark: Any, tmp_path: Path
) -> None:
    records = keyed_records(0, 900, 30)
    location = tmp_path / "weir"
    build = _stage(location)
    write_file(tmp_path / "a", records[:300], KEYED)
    write_file(tmp_path / "b", records[300:600], KEYED)
    first_sink = BatchSink()
    first = _start(spark, tmp_path / "a", build, tmp_path / "spark-1", first_sink)
    try:
        _wait(lambda: 0 in first_sink.batches, "the first query's batch 0")
        second_sink = BatchSink()
        second = _start(spark, tmp_path / "b", build, tmp_path / "spark-2", second_sink)
        with pytest.raises(Exception) as excinfo:
            second.awaitTermination(60)
        text = _error_text(excinfo)
        assert "OwnershipError" in text and f"query {first.id}" in text and "running" in text
        assert second_sink.batches == {}  # the refused query emitted nothing
        # the running one is untouched and goes on
        write_file(tmp_path / "a", records[600:], KEYED)
        # Spark committed batch 1 (not only ran its sink): else stop() may interrupt it
        # before the commit, and the batch, rightly, never completes
        _wait(lambda: _committed(first) >= 1, "the first query's batch 1 committed")
        assert first.isActive
    finally:
        first.stop()
    weir.spark.finish(first)  # it stopped: the stage is free at once
    third = run(spark, tmp_path / "b", SCHEMA, build, tmp_path / "spark-3")
    expected = records[:300] + records[600:] + records[300:600]
    assert last_counts(first_sink.rows() + third.rows()) == _oracle(expected)


class _HeldListener:
    """A streaming query listener that holds Spark's listener bus in the progress event
    of batch ``batch`` (after weir's listener, registered before it, has handled that
    event) until released: every later event of the session waits."""

    def __init__(self, spark: Any, batch: int) -> None:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        self.holding, self.release = threading.Event(), threading.Event()
        held = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                if event.progress.batchId == batch and not held.holding.is_set():
                    held.holding.set()
                    held.release.wait(120)

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        self.listener = Listener()
        self.spark = spark
        spark.streams.addListener(self.listener)

    def close(self) -> None:
        self.release.set()
        self.spark.streams.removeListener(self.listener)


@pytest.mark.spark
def test_3_a_new_query_right_after_stop_without_finish_takes_the_stage_at_once(
    spark: Any, tmp_path: Path
) -> None:
    records = keyed_records(0, 900, 30)
    location = tmp_path / "weir"
    build = _stage(location, lease_timeout="1 h")  # only a release can free the stage
    write_file(tmp_path / "a", records[:300], KEYED)
    first_sink = BatchSink()
    first = _start(spark, tmp_path / "a", build, tmp_path / "spark-1", first_sink)
    held = _HeldListener(spark, 1)  # after weir's (the session's first process())
    try:
        try:
            _wait(lambda: _committed(first) >= 0, "the first query's batch 0 committed")
            write_file(tmp_path / "a", records[300:600], KEYED)
            # weir completed batch 1; the bus is held, so the termination event waits
            _wait(held.holding.is_set, "the first query's batch 1 reported")
        finally:
            first.stop()  # and no weir.spark.finish(first): what most users write
        assert _committed(first) == 1
        write_file(tmp_path / "b", records[600:], KEYED)
        second = run(spark, tmp_path / "b", SCHEMA, build, tmp_path / "spark-2")
    finally:
        held.close()
    assert sorted(first_sink.batches) == [0, 1] and sorted(second.batches) == [0]
    assert last_counts(first_sink.rows() + second.rows()) == _oracle(records)


@pytest.mark.spark
def test_3_a_query_whose_lease_expired_is_fenced_off_when_a_new_one_takes_over(
    spark: Any, tmp_path: Path
) -> None:
    records = keyed_records(0, 900, 30)
    location = tmp_path / "weir"
    lease_ms = 1_000
    build = _stage(location, lease_timeout=lease_ms)
    write_file(tmp_path / "a", records[:300], KEYED)
    old_sink = BatchSink()
    old = _start(spark, tmp_path / "a", build, tmp_path / "spark-1", old_sink)
    try:
        _wait(lambda: 0 in old_sink.batches, "the old query's batch 0")
        from weir.checkpoint.epochs import EpochStore
        from weir.checkpoint.ownership import Lineage

        lineage = Lineage(EpochStore(weir.CheckpointStorage(str(location)), "count").stage,
                          lease_ms)
        claim = lineage.head()
        assert claim is not None and claim.query == str(old.id), claim
        # idle: no batch renews its lease; it expires while the old query still runs
        _wait(lambda: not lineage.alive(claim), "the old query's lease to expire", timeout=30)
        assert not lineage.released(claim) and old.isActive  # expired, not given up
        write_file(tmp_path / "b", records[300:600], KEYED)
        new = run(spark, tmp_path / "b", SCHEMA, build, tmp_path / "spark-2")
        assert last_counts(new.rows()) == _oracle(records[:600])  # took over its state
        write_file(tmp_path / "a", records[600:], KEYED)  # the old query runs again
        with pytest.raises(Exception) as excinfo:
            old.awaitTermination(60)
    finally:
        old.stop()
    text = _error_text(excinfo)
    assert "FencedError" in text and f"query {old.id} was fenced off" in text
    assert sorted(old_sink.batches) == [0]  # the fenced batch emitted nothing


# ------------------------------------------------------------------ 4. zombie attempts


@pytest.mark.spark
def test_4_a_late_attempt_published_after_completion_never_replaces_the_acknowledged_state(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    records, location, build, sink = _first_run(spark, tmp_path, 900, 2, state_backend=backend)
    # a zombie: another run's part of batch 1 (other state) published late under a
    # new attempt id, with the earliest timestamp, and files that were swept
    other = tmp_path / "other"
    write_file(tmp_path / "other-in", keyed_records(5000, 50, 30), KEYED)
    write_file(tmp_path / "other-in", keyed_records(5050, 50, 30), KEYED)
    run(spark, tmp_path / "other-in", SCHEMA, _stage(other, state_backend=backend),
        tmp_path / "other-spark")
    (query,) = _query_dirs(location)
    from weir.checkpoint.format import encode_part

    # completion kept exactly the chosen parts (the next batch's tasks read their own)
    chosen = weir.load_checkpoint(str(query / "chk-1")).metadata.source_positions["spark"]
    assert sorted(p.name for p in query.glob("chk-1/_parts/*")) == sorted(
        f"{i}-{a}.part" for i, a in chosen["attempts"].items())
    injected = 0
    meta = weir.load_checkpoint(str(_query_dirs(other)[0] / "chk-1"), verify=False).metadata
    for handle in meta.operators["count"].subtasks:
        data = encode_part("count", 2, 128, handle, {"attempt": "0badc0de", "written_ms": 1,
                                                     "watermark": 0, "batch_time": 1})
        (query / "chk-1" / "_parts").mkdir(exist_ok=True)
        (query / "chk-1" / "_parts" / f"{handle.subtask_index}-0badc0de.part").write_bytes(data)
        injected += 1
    assert injected == 2
    write_file(tmp_path / "in", records[600:], KEYED)
    run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark", sink)
    assert _lmd(sink.rows(), list(range(900)), _oracle(records)) == (0, 0, 0)


# ------------------------------------------------------------------ 5. partly computed output


@pytest.mark.spark
def test_5_an_output_only_partly_computed_fails_naming_the_cause_and_the_fix(
    spark: Any, tmp_path: Path
) -> None:
    records = keyed_records(0, 600, 30)
    location = tmp_path / "weir"
    build = _stage(location)
    write_file(tmp_path / "in", records[:300], KEYED)
    write_file(tmp_path / "in", records[300:], KEYED)
    taken: dict[int, int] = {}

    def take_one(df: Any, batch: int) -> None:  # computes only the first partition
        taken[batch] = len(df.take(1))

    query = _start(spark, tmp_path / "in", build, tmp_path / "spark", take_one, once=True)
    with pytest.raises(Exception) as excinfo:
        query.awaitTermination(120)
    text = _error_text(excinfo)
    assert taken == {0: 1}  # the partial action happened, in batch 0 only
    assert "IncompleteBatchError" in text and "batch 0" in text
    assert "only partly computed" in text and "persist()" in text
    (qdir,) = _query_dirs(location)
    # the driver's listener saw it right after batch 0
    _wait(lambda: (qdir / "chk-0" / "_incomplete").exists(), "the listener's record")
    parts = sorted(p.name.split("-")[0] for p in (qdir / "chk-0" / "_parts").iterdir())
    assert parts == ["0"]  # subtask 0's state of batch 0 is kept, nothing rolled back
    assert not (qdir / "chk-1" / "_parts").exists()  # batch 1 published nothing


# ------------------------------------------------------------------ 6. rescale after a crash


class CrashInSubtask(Count):
    """In subtask ``subtask``, at its first record of a batch with seq >= ``start``,
    waits until the other subtasks published their parts of that batch, then raises:
    a batch that dies in the middle with the other subtasks' parts in storage."""

    def __init__(self, subtask: int, start: int, location: str) -> None:
        self.subtask, self.start, self.location = subtask, start, location

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        if ctx.subtask_index == self.subtask and value["seq"] >= self.start:
            deadline = time.monotonic() + 60
            others = set(range(ctx.parallelism)) - {self.subtask}
            while time.monotonic() < deadline:
                done = {int(p.name.split("-")[0])
                        for p in Path(self.location).glob("stages/*/queries/*/chk-1/_parts/*")}
                if others <= done:
                    break
                time.sleep(0.05)
            raise RuntimeError("injected crash")
        yield from super().process_element(value, ctx)


@pytest.mark.spark
def test_6_a_restart_at_another_parallelism_after_a_crash_mid_batch_goes_on(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    from weir.state.keygroups import assign_key_to_parallel_operator

    records = keyed_records(0, 900, 40)
    assert any(assign_key_to_parallel_operator(r["key"], 128, 4) == 3 for r in records[300:600])
    location = tmp_path / "weir"
    write_file(tmp_path / "in", records[:300], KEYED)
    sink = run(spark, tmp_path / "in", SCHEMA, _stage(location, parallelism=4,
                                                       state_backend=backend), tmp_path / "spark")
    write_file(tmp_path / "in", records[300:600], KEYED)

    def crashing(events: Any) -> Any:
        return weir.spark.process(
            events,
            key_by="key",
            function=CrashInSubtask(3, 300, str(location)),
            output_schema=COUNT_OUT,
            uid="count",
            config=weir.JobConfig(str(location), state_backend=backend),
            parallelism=4,
            heartbeat=False,
        )
    with pytest.raises(Exception, match="injected crash"):
        run(spark, tmp_path / "in", SCHEMA, crashing, tmp_path / "spark", sink)
    (query,) = _query_dirs(location)
    stale = sorted(p.name.split("-")[0] for p in (query / "chk-1" / "_parts").glob("*.part"))
    assert stale == ["0", "1", "2"]  # the crash left parts of 3 of 4 subtasks
    write_file(tmp_path / "in", records[600:], KEYED)
    run(spark, tmp_path / "in", SCHEMA, _stage(location, parallelism=2, state_backend=backend),
        tmp_path / "spark", sink)
    assert _lmd(sink.rows(), list(range(900)), _oracle(records)) == (0, 0, 0)
    assert {r[3] for r in sink.batches[2]} == {0, 1}


# ------------------------------------------------------------------ 7. time without rows

FIRED = weir.ValueStateDescriptor[bool]("armed")


class Clocked(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Emits the processing time each record and each timer sees; arms one
    processing-time timer per key, 1 ms after its first record."""

    def open(self, ctx: Any) -> None:
        self.armed = ctx.get_state(FIRED)

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        now = ctx.timer_service.current_processing_time
        if not self.armed.value():
            self.armed.update(True)
            ctx.timer_service.register_processing_time_timer(now + 1)
        yield ("record", value["key"], now, ctx.subtask_index)

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield ("timer", ctx.current_key, ctx.timer_service.current_processing_time,
               ctx.subtask_index)


class AttemptSink:
    """Keeps every attempt of every batch; fails the first attempt of ``fail_batch``
    after reading it (so Spark replays that batch)."""

    def __init__(self, fail_batch: int, pause_s: float) -> None:
        self.attempts: dict[int, list[list[tuple[Any, ...]]]] = {}
        self.fail_batch, self.pause_s = fail_batch, pause_s

    def __call__(self, df: Any, batch: int) -> None:
        rows = sorted(tuple(r) for r in df.collect())
        self.attempts.setdefault(batch, []).append(rows)
        time.sleep(self.pause_s)  # the next batch's timestamp is later
        if batch == self.fail_batch and len(self.attempts[batch]) == 1:
            raise RuntimeError("injected sink failure")


@pytest.mark.spark
def test_7_a_subtask_without_rows_sees_the_batch_time_and_a_replay_sees_the_same(
    spark: Any, tmp_path: Path
) -> None:
    from weir.state.keygroups import assign_key_to_parallel_operator

    owner = {k: assign_key_to_parallel_operator(k, 128, 2) for k in (f"k{i}" for i in range(50))}
    busy = next(k for k, i in owner.items() if i == 0)
    idle = next(k for k, i in owner.items() if i == 1)
    write_file(tmp_path / "in", [{"key": busy, "seq": 0}, {"key": idle, "seq": 1}], KEYED)
    write_file(tmp_path / "in", [{"key": busy, "seq": 2}], KEYED)  # nothing for subtask 1
    sink = AttemptSink(fail_batch=1, pause_s=0.05)

    def build(events: Any) -> Any:
        return weir.spark.process(events, key_by="key", function=Clocked(),
                                  output_schema="kind string, key string, t long, subtask int",
                                  uid="clocked", config=weir.JobConfig(str(tmp_path / "weir")),
                                  parallelism=2, heartbeat=False)
    for _ in range(2):  # the injected sink failure stops the first run in batch 1
        query = _start(spark, tmp_path / "in", build, tmp_path / "spark", sink, once=True)
        first_run = not sink.attempts.get(1)
        with pytest.raises(Exception, match="injected sink failure") if first_run else (
                contextlib.nullcontext()):
            query.awaitTermination()
        query.stop()
        weir.spark.finish(query)
    assert len(sink.attempts[1]) == 2  # batch 1 ran, failed in the sink, and was replayed
    first, replay = sink.attempts[1]
    assert first == replay  # the same records and times on replay
    batch_time = next(r[2] for r in first if r[0] == "record")
    timers = [r for r in first if r[0] == "timer"]
    # subtask 1 had no record in batch 1, yet its timer fired at batch 1's time
    assert ("timer", idle, batch_time, 1) in timers
    assert {r[2] for r in first} == {batch_time}


# ------------------------------------------------------------------ 8. savepoints


@pytest.mark.spark
def test_8_a_savepoint_pins_what_it_copies_records_sparks_offsets_and_leaves_nothing_on_failure(
    spark: Any, tmp_path: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    from typer.testing import CliRunner

    from weir.checkpoint.epochs import EpochStore
    from weir.checkpoint.savepoints import write_savepoint
    from weir.cli import app

    records, location, build, _ = _first_run(spark, tmp_path, 1500, 2, state_backend=backend,
                                             retained=1)
    store = EpochStore(weir.CheckpointStorage(str(location)), "count")
    (query,) = _query_dirs(location)
    chk1 = weir.load_checkpoint(str(query / "chk-1"), verify=False)
    pin = store.pin(chk1)  # what savepoint() does before it copies chk-1
    for start in (600, 900):
        write_file(tmp_path / "in", records[start:start + 300], KEYED)
    run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark")
    assert (query / "chk-1" / "_metadata").exists()  # retained=1, yet kept while pinned
    write_savepoint([weir.load_checkpoint(str(query / "chk-1"))], str(tmp_path / "sp-1"))
    store.unpin(pin)
    write_file(tmp_path / "in", records[1200:], KEYED)
    run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark")
    assert not (query / "chk-1").exists()  # unpinned: retention took it

    # a failed savepoint leaves no partial target (the injected failure: a corrupt file)
    victim = _own_largest_file(query, 4)
    good = victim.read_bytes()
    victim.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(weir.CorruptCheckpointError):
        weir.spark.savepoint(str(location), str(tmp_path / "sp-bad"))
    assert not (tmp_path / "sp-bad").exists()
    assert not list(tmp_path.glob("sp-bad*"))
    assert list(location.glob("stages/*/pins/*")) == []  # the pin went with it
    victim.write_bytes(good)

    target = weir.spark.savepoint(str(location), str(tmp_path / "sp-2"))
    positions = weir.load_checkpoint(target).metadata.source_positions
    offsets = positions["spark_stages"]["count"]["source_offsets"]
    assert offsets["batch"] == 4 and offsets["offsets"] == [{"logOffset": 4}]
    assert offsets["spark_checkpoint"].rstrip("/").endswith("spark")
    shown = CliRunner().invoke(app, ["checkpoint", "inspect", target])
    assert shown.exit_code == 0 and "state reflects Spark batch 4" in shown.stdout

    with caplog.at_level("WARNING", logger="weir.spark"):
        _stage(tmp_path / "weir-2", restore_from=target)(
            spark.readStream.schema(SCHEMA).parquet(str(tmp_path / "in")))
    assert "reflects the input up to Spark batch 4" in caplog.text
    assert '[{"logOffset": 4}]' in caplog.text


# ------------------------------------------------------------------ 9. corrupt newest checkpoint


@pytest.mark.spark
def test_9_a_corrupt_newest_checkpoint_names_the_file_and_the_option_that_goes_on(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    records, location, _, sink = _first_run(spark, tmp_path, 1200, 3, state_backend=backend)
    (query,) = _query_dirs(location)
    victim = _own_largest_file(query, 2)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the injected fault: one flipped bit in a state file
    victim.write_bytes(bytes(data))
    write_file(tmp_path / "in", records[900:], KEYED)
    # another parallelism: every subtask restores from storage (no worker-local copy)
    build = _stage(location, parallelism=3, state_backend=backend)
    with pytest.raises(Exception) as excinfo:
        run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark", sink)
    text = _error_text(excinfo)
    assert "CorruptCheckpointError" in text and victim.name in text
    assert "recover(" in text and "source='latest'" in text

    message = weir.spark.recover(str(location), "count", source="latest")
    assert "checkpoint 1" in message and "after batch 1 are dropped" in message
    assert "batches [2] are here" in message
    run(spark, tmp_path / "in", SCHEMA, build, tmp_path / "spark", sink)
    kept = records[:600] + records[900:]
    new_keys = {r["key"] for r in records[900:]}
    assert last_counts(sink.batches[3]) == {k: n for k, n in _oracle(kept).items()
                                            if k in new_keys}


# ------------------------------------------------------------------ 14. concurrent completion


@pytest.mark.spark
def test_14_completion_by_the_listener_and_finish_at_once_leaves_one_clean_checkpoint(
    spark: Any, tmp_path: Path
) -> None:
    import threading

    records = keyed_records(0, 1200, 30)
    location = tmp_path / "weir"
    for start in range(0, 1200, 300):
        write_file(tmp_path / "in", records[start:start + 300], KEYED)
    sink = BatchSink()
    query = _start(spark, tmp_path / "in", _stage(location), tmp_path / "spark", sink,
                   once=True)
    query.awaitTermination()
    # the listener completes the last batch now; so do eight finish() calls at once
    threads = [threading.Thread(target=weir.spark.finish, args=(query,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _lmd(sink.rows(), list(range(1200)), _oracle(records)) == (0, 0, 0)
    (qdir,) = _query_dirs(location)
    assert (qdir / "chk-3" / "_metadata").exists()
    assert [p for p in location.rglob("*") if ".tmp-" in p.name] == []
    chosen = weir.load_checkpoint(str(qdir / "chk-3")).metadata.source_positions["spark"]
    assert sorted(p.name for p in qdir.glob("chk-3/_parts/*")) == sorted(
        f"{i}-{a}.part" for i, a in chosen["attempts"].items())  # only the chosen parts


def _tree(root: Path) -> dict[str, int]:
    """Every path under ``root`` with its modification time (ns)."""
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.mark.spark
def test_14_after_finish_the_querys_late_listener_events_write_nothing(
    spark: Any, tmp_path: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark's listener bus delivers a query's progress and termination events
    asynchronously, possibly after finish() returned: they must not write into the
    location any more (a user who deletes it after finish() raced the stopped marker
    the late termination event wrote: test_1 failed so in CI)."""
    from weir.runtime.spark.listener import completion

    sink = BatchSink()
    records = keyed_records(0, 600, 30)
    for start in (0, 300):
        write_file(tmp_path / "in", records[start:start + 300], KEYED)
    location = tmp_path / "weir"
    query = _start(spark, tmp_path / "in", _stage(location, state_backend=backend),
                   tmp_path / "spark", sink, once=True)
    with caplog.at_level("INFO", logger="weir"):
        query.awaitTermination()
        assert weir.spark.finish(query) == 1
    completions = [r.getMessage() for r in caplog.records if " complete at " in r.getMessage()]
    # each batch completed once: by the driver's listener (logged here), or by a task of
    # the next batch that found it committed first (logged in its Python worker)
    lines = [m.split(" of query ")[0] for m in completions]
    assert len(lines) == len(set(lines)) and set(lines) <= {
        "weir: operator 'count': batch 0", "weir: operator 'count': batch 1"}, lines
    assert sorted(m.parent.name for m in location.glob("stages/*/queries/*/chk-*/_metadata")
                  ) == ["chk-0", "chk-1"]
    before = _tree(location)
    events = completion(spark)
    query_id, run = str(query.id), str(query.runId)
    events.listener_progress(query_id, run, 1, lambda: str(tmp_path / "spark"))  # late
    events.listener_terminated(query_id, run)
    assert _tree(location) == before
    assert sorted(sink.batches) == [0, 1]


@pytest.mark.spark
def test_14_metrics_false_leaves_the_progress_and_the_output_schema_as_they_were(
    spark: Any, tmp_path: Path
) -> None:
    write_file(tmp_path / "in", keyed_records(0, 300, 10), KEYED)
    sink = BatchSink()
    plain = _start(spark, tmp_path / "in", _stage(tmp_path / "weir", metrics=False),
                   tmp_path / "spark", sink, once=True)
    plain.awaitTermination()
    weir.spark.finish(plain)
    assert len(sink.rows()) == 300 and observed(plain, "count") == []
    schema = "key string not null, seq long, n long, subtask int"
    events = spark.readStream.schema(SCHEMA).parquet(str(tmp_path / "in"))
    for metrics in (False, True):
        out = weir.spark.process(events, key_by="key", function=Count(), output_schema=schema,
                                 uid="count", config=weir.JobConfig(str(tmp_path / "w2")),
                                 metrics=metrics)
        assert out.schema["key"].nullable is metrics  # the metrics rows make it nullable


# ------------------------------------------------------------------ 11. late and malformed


class Seen(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Emits every record it is given with its event time."""

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        yield (value["key"], ctx.timestamp, ctx.timer_service.current_watermark)


def _json_lines(directory: Path, lines: list[str]) -> None:
    """One JSON-lines file, published by rename with a strictly later mtime."""
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{len(list(directory.glob('*.json'))):04d}.json"
    tmp = directory.parent / f".{name}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    stamp = time.time_ns() + len(list(directory.glob("*.json"))) * 20_000_000
    import os

    os.utime(tmp, ns=(stamp, stamp))
    tmp.rename(directory / name)


@pytest.mark.spark
@pytest.mark.parametrize("policy", ["process", "dead_letter"])
def test_11_late_null_time_and_malformed_records_follow_the_policy_and_are_counted(
    spark: Any, tmp_path: Path, policy: str
) -> None:
    location = tmp_path / "weir"
    _json_lines(tmp_path / "in", [f'{{"key": "k{i}", "ts": {100 + i}}}' for i in range(11)])
    _json_lines(tmp_path / "in", [
        '{"key": "k1", "ts": 50}',                  # behind the watermark (110)
        '{"key": "k2", "ts": null}',                # no event time
        '{"key": "k3", "ts": "not a number"',       # malformed line
        '{"key": "k4", "ts": 200}',                 # on time
    ])
    first, second = (f.stat().st_mtime_ns // 1_000_000
                     for f in sorted((tmp_path / "in").glob("*.json")))
    assert second > first, (first, second)  # one file per batch, in this order
    schema = "key string, ts long, _corrupt_record string"
    sink = BatchSink()
    query = _start(
        spark, tmp_path / "in", lambda events: weir.spark.process(
            events, key_by="key", function=Seen(),
            output_schema="key string, ts long, watermark long", uid="late",
            checkpoint_location=str(location), parallelism=2, event_time="ts",
            late_records=policy, heartbeat=False),
        tmp_path / "spark", sink, once=True, schema=schema,
        reader=lambda stream: stream.option("mode", "PERMISSIVE").option(
            "columnNameOfCorruptRecord", "_corrupt_record").json(str(tmp_path / "in")))
    query.awaitTermination()
    weir.spark.finish(query)
    seen = sorted(r[0] for r in sink.batches[1])
    assert seen == (["k1", "k4"] if policy == "process" else ["k4"])
    dead = {d["record"]["key"] if d["record"]["key"] else "?": d["reason"]
            for d in weir.spark.read_dead_letters(str(location))}
    assert dead["k2"] == "null or invalid event time in column 'ts'"
    malformed = [d for d in weir.spark.read_dead_letters(str(location))
                 if d["reason"].startswith("malformed input")]
    assert len(malformed) == 1
    assert malformed[0]["record"]["_corrupt_record"] == '{"key": "k3", "ts": "not a number"'
    listed = subprocess.run(  # the same through the command line, from batch 1 on
        [str(Path(sys.executable).parent / "weir"), "dead-letters", str(location), "--since",
         "1", "--json"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == json.loads(json.dumps(  # (the one shape)
        weir.read_dead_letters(str(location)), default=str))
    later = subprocess.run([str(Path(sys.executable).parent / "weir"), "dead-letters",
                            str(location), "--since", "2", "--json"],
                           capture_output=True, text=True, timeout=120)
    assert later.returncode == 0 and json.loads(later.stdout) == []
    if policy == "dead_letter":
        assert dead["k1"] == "late: event time 50 is not after the watermark 110"
    else:
        assert "k1" not in dead
    (qdir,) = _query_dirs(location, "late")
    counts = weir.load_checkpoint(str(qdir / "chk-1"), verify=False).metadata.source_positions
    assert {k: counts["spark"][k] for k in ("late_records", "null_event_time", "malformed")} == {
        "late_records": 1, "null_event_time": 1, "malformed": 1}
    metrics = {m["batch"]: m for m in stage_metrics(location, "late", query)}
    assert {k: metrics[1][k] for k in ("records", "late_records", "dead_letters", "outputs",
                                       "subtasks")} == {
        "records": 3, "late_records": 1, "dead_letters": 2 + (policy == "dead_letter"),
        "outputs": len(seen), "subtasks": 2}
    assert metrics[1]["state_entries"] == 0 and metrics[0]["records"] == 11


# ------------------------------------------------------------------ 12. end of input: drain


class Sessions(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Per key, an event-time timer 1000 ms after its newest record: emits
    (key, timer time, records seen) when it fires."""

    def open(self, ctx: Any) -> None:
        self.seen = ctx.get_state(weir.ValueStateDescriptor[int]("seen"))
        self.due = ctx.get_state(weir.ValueStateDescriptor[int]("due"))

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        self.seen.update((self.seen.value() or 0) + 1)
        if self.due.value() is not None:
            ctx.timer_service.delete_event_time_timer(self.due.value())
        self.due.update(value["seq"] + 1000)
        ctx.timer_service.register_event_time_timer(value["seq"] + 1000)
        return ()

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield (ctx.current_key, timestamp, self.seen.value())
        self.seen.clear()


@pytest.mark.spark
def test_12_stop_with_savepoint_drain_fires_every_event_time_timer_once_into_the_sink(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    from weir.testing import KeyedOperatorHarness

    records = keyed_records(0, 400, 20)  # seq doubles as event time
    location = tmp_path / "weir"
    write_file(tmp_path / "in", records[:200], KEYED)
    write_file(tmp_path / "in", records[200:], KEYED)
    sink = BatchSink()
    query = _start(
        spark,
        tmp_path / "in",
        lambda events: weir.spark.process(
            events,
            key_by="key",
            function=Sessions(),
            output_schema="key string, t long, seen long",
            uid="sessions",
            config=weir.JobConfig(str(location), state_backend=backend,
                                  checkpointing=weir.CheckpointConfig(retained=10_000)),
            parallelism=2,
            event_time="seq",
        ),
        tmp_path / "spark",
        sink,
    )
    try:
        _wait(lambda: len(sink.batches) >= 3, "the input and one more batch")
        assert sink.rows() == []  # the last timers (seq + 1000) are beyond the watermark
        target = weir.spark.stop_with_savepoint(query, str(location), str(tmp_path / "sp"),
                                                drain=True)
    finally:
        query.stop()
    fired = sink.rows()
    last = {r["key"]: r["seq"] for r in records}
    # every key's timer fired exactly once, at its newest record + 1000, with all records
    assert sorted((k, t) for k, t, _ in fired) == sorted((k, s + 1000) for k, s in last.items())
    assert sum(n for _, _, n in fired) == 400
    metrics = stage_metrics(location, "sessions", query)  # heartbeats are not records
    assert sum(m["records"] for m in metrics) == 400
    assert sum(m["timers_fired"] for m in metrics) == len(fired) == 20
    assert sum(m["outputs"] for m in metrics) == 20
    assert all(m["checkpointed_size"] > 0 for m in metrics if m["records"])
    for i in range(2):
        with KeyedOperatorHarness.restore(Sessions(), lambda v: v["key"],
                                          weir.load_checkpoint(target), uid="sessions",
                                          parallelism=2, subtask_index=i) as h:
            assert h.event_time_timers() == []  # nothing left to fire


# ------------------------------------------------------------------ 13. flags that do something

SHORT = weir.ValueStateDescriptor[int]("short", ttl=weir.StateTtlConfig(ttl_ms=1))


class Remember(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Keeps each record's seq in a value with a 1 ms TTL (default cleanup)."""

    def open(self, ctx: Any) -> None:
        self.short = ctx.get_state(SHORT)

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        self.short.update(value["seq"])
        yield (value["key"], value["seq"], 1, ctx.subtask_index)


@pytest.mark.spark
def test_13_rocksdb_ttl_compaction_filter_cleanup_runs_in_the_spark_runtime(
    spark: Any, tmp_path: Path
) -> None:
    from weir.testing import KeyedOperatorHarness

    location = tmp_path / "weir"
    write_file(tmp_path / "in", keyed_records(0, 200, 50), KEYED)
    write_file(tmp_path / "in", [{"key": "late", "seq": 999}], KEYED)
    sink = AttemptSink(fail_batch=-1, pause_s=0.05)  # batch 1 runs 50 ms later: all expired
    query = _start(
        spark,
        tmp_path / "in",
        lambda events: weir.spark.process(
            events,
            key_by="key",
            function=Remember(),
            output_schema=COUNT_OUT,
            uid="ttl",
            config=weir.JobConfig(str(location), state_backend="rocksdb"),
            parallelism=2,
            heartbeat=False,
        ),
        tmp_path / "spark",
        sink,
        once=True,
    )
    query.awaitTermination()
    weir.spark.finish(query)
    assert sorted(sink.attempts) == [0, 1]
    weir.spark.savepoint(str(location), str(tmp_path / "sp"))
    stored = []
    for i in range(2):
        with KeyedOperatorHarness.restore(Remember(), lambda v: v["key"],
                                          weir.load_checkpoint(str(tmp_path / "sp")), uid="ttl",
                                          parallelism=2, subtask_index=i) as h:
            stored += h.keys(SHORT)
    assert set(stored) <= {"late"}  # the 50 expired keys were removed from RocksDB


@pytest.mark.spark
def test_13_max_parallelism_defaults_as_in_flink_and_then_comes_from_the_state(
    spark: Any, tmp_path: Path
) -> None:
    location = tmp_path / "weir"
    write_file(tmp_path / "in", keyed_records(0, 100, 10), KEYED)
    run(spark, tmp_path / "in", SCHEMA, _stage(location, parallelism=200), tmp_path / "spark")
    (query,) = _query_dirs(location)
    meta = weir.load_checkpoint(str(query / "chk-0"), verify=False).metadata
    assert meta.operators["count"].max_parallelism == 512  # Flink: next pow2 of 1.5 * 200
    write_file(tmp_path / "in", keyed_records(100, 100, 10), KEYED)
    run(spark, tmp_path / "in", SCHEMA, _stage(location, parallelism=2), tmp_path / "spark")
    meta = weir.load_checkpoint(str(query / "chk-1"), verify=False).metadata
    assert meta.operators["count"].max_parallelism == 512  # read back, not recomputed


@pytest.mark.spark
def test_13_a_renamed_uid_is_refused_unless_non_restored_state_is_allowed(
    spark: Any, tmp_path: Path
) -> None:
    write_file(tmp_path / "in", keyed_records(0, 100, 10), KEYED)
    run(spark, tmp_path / "in", SCHEMA, _stage(tmp_path / "weir"), tmp_path / "spark")
    target = weir.spark.savepoint(str(tmp_path / "weir"), str(tmp_path / "sp"))
    events = spark.readStream.schema(SCHEMA).parquet(str(tmp_path / "in"))
    with pytest.raises(weir.RestoreError, match=r"none of 'renamed'.*allow_non_restored_state"):
        _stage(tmp_path / "new", "renamed", restore_from=target)(events)
    out = _stage(tmp_path / "new", "renamed", restore_from=target,
                 allow_non_restored_state=True)(events)
    assert out.isStreaming
