"""Keyed count on Spark: weir vs Spark's own transformWithState, in one SparkSession.

N records over K keys; each peer keeps a running count per key in keyed state and emits
one row ``(key, count)`` per input record. Peers (``--peers``, all by default):

* ``tws-pandas`` — ``GroupedData.transformWithStateInPandas`` with a ``StatefulProcessor``
  holding a ``ValueState`` count (RocksDB state store provider, output mode update);
* ``tws-row`` — the row-based ``GroupedData.transformWithState`` (PySpark 4.1+), same logic;
* ``weir-hashmap`` / ``weir-rocksdb`` — ``weir.spark.process`` with a
  ``KeyedProcessFunction`` and a ``ValueState``, on each state backend. Skipped with a
  message when ``weir.spark`` cannot be imported;
* ``weir-hashmap-tuple`` / ``weir-rocksdb-tuple`` — the same with records as tuples
  (``record_format="tuple"``: what a user picks who needs no column names; no dict
  per record);
* ``weir-batch-hashmap`` / ``weir-batch-rocksdb`` — the same count as a
  ``KeyedBatchFunction``: per call, one ``get`` of the batch's distinct keys, the
  per-record counts by NumPy, one ``put`` (issue 43);
* ``dict`` — the raw limit of a Python stateful stage on Spark: the same shuffle of the
  same input rows (every column, as weir's function receives them) into p = 2
  partitions (``repartition(2, "key")``) and a ``mapInArrow`` keeping the running count
  in a plain dict per Python worker and partition; no persistence, no key groups, no
  records as dicts. Its counts restart when Spark runs a partition's task in another
  Python worker (it keeps no state across them), so only its rows per key are verified,
  not its count sequences.
* ``dict-routed`` — ``dict`` with weir's route in front, as weir plans it for a string
  key (``weir.runtime.spark.jvm_route``: key groups and routes as Spark expressions, a
  stream's rows numbered by a Java UDF, clock rows by ``explode``, the batch time kept
  out of the generated code; then the shuffle by route): the ceiling of any stage that
  routes by weir's key groups;
* ``dict-route-pass`` — the same with weir's Python route pass instead (a
  ``mapInArrow`` over every column; what keys the JVM cannot hash take).

**Throughput** (default): the records are generated once (fixed seed, uniform keys, or
bounded Zipf with ``--zipf S``) as parquet files, read with ``readStream.parquet`` and
``trigger(availableNow=True)`` (``--files-per-trigger`` files per micro-batch, so state is
carried across batches). The sink is a ``foreachBatch`` that aggregates each batch per key
(rows, min/max/sum of count) and checks, for every key, that the counts continue the
previous batch with no gap or repeat; at the end the rows per key must equal the input's
per-key counts and the total must equal N. Time = wall time from ``start()`` to the end of
``awaitTermination()``; records/s = N / time. Every peer runs once on a small input first
(unmeasured, ``--warmup-records``) so JVM warm-up does not land on the first peer.

**Latency** (``--latency``): input at each of ``--rate`` rows/s (default 500 and 2,000)
over ``--latency-keys`` keys, processing-time trigger 1 s. By default a thread drops one
small parquet file every 100 ms (``--files-per-second``) into the directory the query
reads, each row stamped with the wall-clock ms it was made (``--latency-source rate``
uses Spark's ``rate`` source instead; its offsets advance in whole seconds, which adds up
to a second that varies with the phase between its seconds and the trigger).
Latency = the time the ``foreachBatch`` sink holds the batch's rows minus the row's
stamp. The window starts ``--latency-warmup`` s after the first non-empty batch (a new
query pays for worker start-up first) and covers ``--latency-seconds`` of stamps; the
query runs until all of the window's rows are out, so p50/p99 cover every row of the
window. A peer that cannot sustain the rate shows a growing backlog: ``drift`` (median
latency of the window's last quarter minus its first) above one trigger interval = fell
behind.

Run: ``.venv/bin/python -m bench.spark_keyed_count [--quick] [--records N] [--keys 10000,200000]
[--peers tws-row,weir-hashmap] [--latency]``. Results: ``bench/results/spark_keyed_count.json``
(``_quick``, ``_latency`` variants) and a PNG next to it; a rich table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import TimerValues
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import weir
import weir.api.config

RESULTS = Path(__file__).resolve().parent / "results"
#: the weir peers' snapshot strategy (--snapshot; None: CheckpointConfig's default)
SNAPSHOT: str | None = None
PEERS = ("tws-pandas", "tws-row", "weir-hashmap", "weir-rocksdb", "dict", "dict-routed",
         "dict-route-pass", "weir-hashmap-observed", "weir-rocksdb-observed",
         "weir-batch-hashmap", "weir-batch-rocksdb", "weir-hashmap-tuple",
         "weir-rocksdb-tuple")
#: peers whose count sequences are not checked (no state across Python workers)
UNCHECKED_SEQUENCE = ("dict", "dict-routed", "dict-route-pass")
LATENCY_PEERS = ("tws-row", "weir-hashmap", "weir-rocksdb")
BASELINE = "tws-row"  # the ratio column is records/s relative to this peer
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
INPUT_SCHEMA = "key string, seq long"
console = Console(width=max(Console().width, 120))


# --------------------------------------------------------------------------- the peers
# Defined at module level: pickled by value (this module runs as __main__, or is
# registered with cloudpickle below), so Spark's Python workers need not import `bench`.


class PandasCount(StatefulProcessor):
    """transformWithStateInPandas: running count per key, one output row per input row."""

    def __init__(self, with_ts: bool = False) -> None:
        self.with_ts = with_ts

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        current = self.count.get()  # one round trip; None when the key is new
        n = current[0] if current is not None else 0
        for pdf in rows:
            m = len(pdf)
            out = {"key": key[0], "count": np.arange(n + 1, n + m + 1, dtype=np.int64)}
            if self.with_ts:
                out["ts"] = pdf["ts"].to_numpy()
            n += m
            yield pd.DataFrame(out)
        self.count.update((n,))

    def close(self) -> None:
        pass


class RowCount(StatefulProcessor):
    """Row-based transformWithState: the same logic, one ``Row`` at a time."""

    def __init__(self, with_ts: bool = False) -> None:
        self.with_ts = with_ts

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(
        self, key: Any, rows: Iterator[Row], timerValues: TimerValues
    ) -> Iterator[Row]:
        current = self.count.get()
        n = current[0] if current is not None else 0
        k = key[0]
        if self.with_ts:
            for r in rows:
                n += 1
                yield Row(key=k, count=n, ts=r.ts)
        else:
            for _ in rows:
                n += 1
                yield Row(key=k, count=n)
        self.count.update((n,))

    def close(self) -> None:
        pass


COUNT = weir.ValueStateDescriptor[int]("count")


class CountFunction(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """weir: records arrive as dicts; running count in a ValueState."""

    def __init__(self, with_ts: bool = False) -> None:
        self.with_ts = with_ts

    def open(self, ctx: weir.KeyedContext) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(
        self, value: dict[str, Any], ctx: weir.KeyedContext
    ) -> Iterator[tuple[Any, ...]]:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        if self.with_ts:
            yield (value["key"], n, value["ts"])
        else:
            yield (value["key"], n)


class TupleCountFunction(CountFunction):
    """:class:`CountFunction` over records as tuples (``record_format="tuple"``: the
    input's columns in order, the key first)."""

    def process_element(  # type: ignore[override]
        self, value: tuple[Any, ...], ctx: weir.KeyedContext
    ) -> Iterator[tuple[Any, ...]]:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        if self.with_ts:
            yield (value[0], n, value[2])
        else:
            yield (value[0], n)


class BatchCountFunction(weir.KeyedBatchFunction):
    """weir, a batch at a time: the count of each record is its key's count before the
    batch plus its occurrence in the batch; one get and one put of the distinct keys."""

    def __init__(self, with_ts: bool = False) -> None:
        self.with_ts = with_ts

    def open(self, ctx: weir.KeyedBatchContext) -> None:
        self.count = ctx.get_state(COUNT)

    def process_batch(self, batch: pa.RecordBatch, ctx: weir.KeyedBatchContext) -> Any:
        encoded = pc.dictionary_encode(batch.column("key"))
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        distinct = encoded.dictionary
        before = pc.fill_null(self.count.get(distinct, type=pa.int64()), 0).to_numpy()
        order = np.argsort(codes, kind="stable")
        runs = np.bincount(codes, minlength=len(distinct))
        starts = np.concatenate(([0], np.cumsum(runs)[:-1]))
        occurrence = np.empty(len(codes), dtype=np.int64)
        occurrence[order] = np.arange(len(codes)) - np.repeat(starts, runs)
        counts = before[codes] + occurrence + 1
        self.count.put(distinct, before + runs)
        columns = [batch.column("key"), pa.array(counts, pa.int64())]
        names = ["key", "count"]
        if self.with_ts:
            columns.append(batch.column("ts"))
            names.append("ts")
        return pa.record_batch(columns, names=names)


if __name__ != "__main__":  # imported (tests, REPL): still ship the classes by value
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def weir_spark() -> tuple[Any, str | None]:
    """``(weir.spark module, None)`` or ``(None, why it is unavailable)``."""
    try:
        import weir.spark as ws
    except Exception as e:  # ImportError, or anything raised while importing it
        return None, f"import weir.spark failed: {type(e).__name__}: {e}"
    if not hasattr(ws, "process"):
        return None, "weir.spark has no process()"
    return ws, None


def _dict_counts(run: str, routed: bool = False) -> Any:
    """The ``dict`` peer's ``mapInArrow`` function: a running count per key in a plain
    dict that lives in the Python worker (per run and partition), nothing else.
    ``routed``: the rows come from weir's route pass (records only are counted)."""

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import builtins

        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx is not None else 0
        stores = builtins.__dict__.setdefault("_weir_bench_dict_peer", {})
        counts = stores.setdefault((run, part), {})
        get = counts.get
        for batch in batches:
            if routed:
                # records only: the row's kind rides in bits 61-62 of its order
                # (weir.runtime.spark.routing.KIND_SHIFT; spelled out: pickled by value)
                kinds = pc.shift_right(batch.column("_weir_order"), 61)
                batch = batch.filter(pc.equal(kinds, 1))
            keys = batch.column(0)
            out: list[int] = []
            append = out.append
            for key in keys.to_pylist():
                n = get(key, 0) + 1
                counts[key] = n
                append(n)
            yield pa.record_batch([keys, pa.array(out, pa.int64())], names=["key", "count"])

    return count


def build(peer: str, events: Any, with_ts: bool, weir_dir: str) -> Any:
    """The peer's output DataFrame (``key, count[, ts]``) over ``events``."""
    schema = "key string, count long" + (", ts long" if with_ts else "")
    if peer == "dict":
        if with_ts:
            raise ValueError("the dict peer runs the throughput workload only")
        return events.repartition(2, "key").mapInArrow(
            _dict_counts(weir_dir), schema)
    if peer in ("dict-routed", "dict-route-pass"):  # the raw limit with weir's route
        from pyspark.sql import functions as F

        from weir.runtime.spark.jvm_route import jvm_keyed_route
        from weir.runtime.spark.jvm_udfs import opaque_millis
        from weir.runtime.spark.routing import NOW, ROUTE, keyed_route_pass
        from weir.spark import _with_internal  # weir's route pass's output schema

        # the batch time as weir.spark.process passes it (out of the generated code)
        now = opaque_millis(F.unix_millis(F.current_timestamp()))
        jvm = jvm_keyed_route(events, ["key"], 128, 2, now) if peer == "dict-routed" else None
        if jvm is not None:  # partitioned by the route expression, as weir's stage is
            shuffled = jvm.rows.repartition(2, jvm.route)
        else:
            stamped = events.select("*", now.alias(NOW))
            shuffled = stamped.mapInArrow(keyed_route_pass(["key"], 128, 2),
                                          _with_internal(stamped.schema)).repartition(2, ROUTE)
        return shuffled.mapInArrow(_dict_counts(weir_dir, True), schema)
    if peer == "tws-pandas":
        return events.groupBy("key").transformWithStateInPandas(
            statefulProcessor=PandasCount(with_ts), outputStructType=schema,
            outputMode="Update", timeMode="None")
    if peer == "tws-row":
        return events.groupBy("key").transformWithState(
            statefulProcessor=RowCount(with_ts), outputStructType=schema,
            outputMode="Update", timeMode="None")
    ws, why = weir_spark()
    if ws is None:
        raise RuntimeError(why)
    backend = (peer.removeprefix("weir-").removeprefix("batch-").removesuffix("-observed")
               .removesuffix("-tuple"))
    tuples = peer.endswith("-tuple")
    # (diagnostic peers: the stage's metrics also in Spark's progress, spark.weir.metrics)
    events.sparkSession.conf.set("spark.weir.metrics",
                                 "true" if peer.endswith("-observed") else "false")
    return ws.process(
        events,
        key_by="key",
        function=(BatchCountFunction(with_ts) if peer.startswith("weir-batch-")
                  else TupleCountFunction(with_ts) if tuples else CountFunction(with_ts)),
        record_format="tuple" if tuples else "dict",
        output_schema=schema,
        uid="count",
        config=weir.JobConfig(Path(weir_dir).as_uri(), max_parallelism=128,
                              state_backend=weir.api.config.state_backend_of(backend),
                              checkpointing=weir.CheckpointConfig(snapshot=SNAPSHOT)),
        parallelism=2,
        heartbeat=None,
    )


# --------------------------------------------------------------------------- session

def spark_session(driver_memory: str, master: str = "local[2]") -> Any:
    # the Python workers must run this interpreter (the venv has pyarrow, protobuf)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master(master)
        .appName("weir-bench-keyed-count")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


# --------------------------------------------------------------------------- input

def key_ids(records: int, keys: int, zipf: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if zipf <= 0:
        return rng.integers(0, keys, records, dtype=np.int64)
    weights = 1.0 / np.arange(1, keys + 1, dtype=np.float64) ** zipf
    ranks = rng.choice(keys, records, p=weights / weights.sum())
    return rng.permutation(keys)[ranks]  # hot keys spread over the key space


def write_input(ids: np.ndarray, files: int, directory: Path) -> None:
    """``ids`` as parquet files ``key string, seq long`` (key ``"k<id>"``)."""
    directory.mkdir(parents=True)
    keys = pc.binary_join_element_wise("k", pc.cast(pa.array(ids), pa.string()), "")
    table = pa.table({"key": keys, "seq": pa.array(np.arange(len(ids), dtype=np.int64))})
    per = -(-len(ids) // files)
    for i in range(files):
        pq.write_table(table.slice(i * per, per), directory / f"part-{i:04d}.parquet")


class Verifier:
    """foreachBatch sink: per batch and key, the counts must be exactly
    ``previous + 1 .. previous + rows``; totals are checked at the end."""

    def __init__(self, keys: int, on_rows: Callable[[int], None]) -> None:
        self.hi = np.zeros(keys, dtype=np.int64)
        self.rows = np.zeros(keys, dtype=np.int64)
        self.bad_keys = 0
        self.total = 0
        self.batches = 0
        self.on_rows = on_rows
        self.error: str | None = None

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        try:
            t = (
                df.groupBy("key")
                .agg(F.count(F.lit(1)).alias("rows"), F.min("count").alias("lo"),
                     F.max("count").alias("hi"), F.sum("count").alias("total"))
                .toArrow()
            )
            if t.num_rows == 0:
                return
            ids = pc.cast(pc.utf8_slice_codeunits(t["key"], 1), pa.int64()).to_numpy()
            rows, lo, hi, total = (t[c].to_numpy() for c in ("rows", "lo", "hi", "total"))
            prev = self.hi[ids]
            ok = (lo == prev + 1) & (hi == prev + rows) & (2 * total == rows * (lo + hi))
            self.bad_keys += int((~ok).sum())
            self.hi[ids] = hi
            self.rows[ids] += rows
            n = int(rows.sum())
            self.total += n
            self.batches += 1
            self.on_rows(n)
        except Exception as e:  # recorded; raising here would only kill the query
            self.error = f"{type(e).__name__}: {e}"
            raise


# --------------------------------------------------------------------------- throughput

_TASK_STATS = ("restored", "caught_up", "restore_ms", "process_ms", "snapshot_ms")


def weir_task_stats(location: Path, query: str) -> list[dict[str, Any]]:
    """Per completed batch of the weir stage: its tasks' restores (from storage, or a
    copy caught up by deltas) and their time in restore, processing and checkpoint (ms;
    summed over the subtasks, and the slowest), from the batch's checkpoint."""
    from weir.checkpoint.epochs import EpochStore
    from weir.checkpoint.storage import CheckpointStorage

    storage = CheckpointStorage(location.as_uri())
    stats = []
    for directory in EpochStore.stage_dirs(storage):
        for batch, done in EpochStore.at(storage, directory).completed_checkpoints(query):
            io = done.metadata.source_positions["spark_io"]  # (every weir task records it)
            stats.append({"batch": batch, **{k: io["total"][k] for k in _TASK_STATS},
                          "max_process_ms": io["max"]["process_ms"]})
    return stats


def run_throughput(
    spark: Any, peer: str, data_dir: Path, expected: np.ndarray, args: argparse.Namespace,
    work: Path, progress: Progress | None, label: str,
) -> dict[str, Any]:
    records = int(expected.sum())
    task = progress.add_task(label, total=records) if progress is not None else None

    def advance(n: int) -> None:
        if progress is not None and task is not None:
            progress.advance(task, n)

    tag = f"{peer}-{time.monotonic_ns()}"
    verifier = Verifier(len(expected), advance)
    result: dict[str, Any] = {"peer": peer, "records": records, "keys": len(expected),
                              "loadavg_1m_before": round(os.getloadavg()[0], 2)}
    try:
        events = (
            spark.readStream.schema(INPUT_SCHEMA)
            .option("maxFilesPerTrigger", args.files_per_trigger)
            .parquet(str(data_dir))
        )
        out = build(peer, events, False, str(work / f"weir-state-{tag}"))
        writer = (
            out.writeStream.foreachBatch(verifier)
            .outputMode("update")
            .option("checkpointLocation", str(work / f"ckpt-{tag}"))
            .trigger(availableNow=True)
        )
        start, cpu_start = time.perf_counter(), tree_cpu_by_kind()
        query = writer.start()
        finished = query.awaitTermination(args.timeout)
        elapsed = time.perf_counter() - start
        cpu_end = tree_cpu_by_kind()
        cpu_kinds = None if cpu_start is None or cpu_end is None else {
            k: round(cpu_end[k] - cpu_start[k], 3) for k in cpu_end}
        if not finished:
            query.stop()
            raise TimeoutError(f"not finished after {args.timeout} s")
        progress_log = [json.loads(p.json) for p in query.recentProgress]
        if peer.startswith("weir-"):
            result["task_stats"] = weir_task_stats(work / f"weir-state-{tag}", str(query.id))
    except Exception as e:
        result["error"] = verifier.error or f"{type(e).__name__}: {str(e).splitlines()[0]}"
        if args.verbose:
            traceback.print_exc()
        return result
    finally:
        if progress is not None and task is not None:
            progress.remove_task(task)
    missing = int((verifier.rows != expected).sum())
    bad = 0 if peer in UNCHECKED_SEQUENCE else verifier.bad_keys
    verified = verifier.total == records and missing == 0 and bad == 0
    batches = [p for p in progress_log if p.get("numInputRows", 0) > 0]
    result.update({
        "seconds": round(elapsed, 3),
        # CPU of this process, the JVM and its Python workers (less noisy than wall time
        # on a shared machine; a tool for changes, not the measure)
        "cpu_s": None if cpu_kinds is None else round(sum(cpu_kinds.values()), 3),
        "cpu_us_per_record": None if cpu_kinds is None else round(
            sum(cpu_kinds.values()) / records * 1e6, 3),
        "cpu_s_by_process": cpu_kinds,
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "records_per_s": round(records / elapsed, 1),
        "output_rows": verifier.total,
        "batches": verifier.batches,
        "keys_with_wrong_total": missing,
        "keys_with_bad_sequence": verifier.bad_keys,
        "sequence_checked": peer not in UNCHECKED_SEQUENCE,
        "verified": verified,
        "batch_ms": [p["durationMs"].get("triggerExecution") for p in batches],
        "add_batch_ms": [p["durationMs"].get("addBatch") for p in batches],
    })
    if not verified:
        result["error"] = (f"verification failed: {verifier.total:,} rows of {records:,}, "
                           f"{missing} keys with a wrong total, "
                           f"{verifier.bad_keys} keys with a bad count sequence")
    return result


def throughput(spark: Any, args: argparse.Namespace, peers: list[str], work: Path
               ) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with _progress() as progress:
        warm_up(spark, args, peers, work, progress)
        for keys in args.keys:
            data = work / f"input-{keys}"
            ids = key_ids(args.records, keys, args.zipf, args.seed)
            write_input(ids, args.files, data)
            expected = np.bincount(ids, minlength=keys)
            console.print(f"[bold]{args.records:,} records, {keys:,} keys "
                          f"({int((expected > 0).sum()):,} present, max {expected.max():,} "
                          f"per key), {args.files} files[/]")
            for rep in range(args.repeat):
                # odd repeats run the peers in reverse order: a peer that runs later runs
                # on a warmer JVM, so with --repeat 2 every peer gets both positions
                for peer in (peers if rep % 2 == 0 else peers[::-1]):
                    r = run_throughput(spark, peer, data, expected, args, work, progress,
                                       f"{peer} {keys:,} keys #{rep + 1}")
                    r["repeat"] = rep
                    runs.append(r)
                    if "error" in r:
                        console.print(f"  {peer}: [red]{r['error']}[/]")
                    else:
                        console.print(f"  {peer}: {r['records_per_s']:,.0f} records/s "
                                      f"({r['seconds']:.1f} s, {r['batches']} batches, "
                                      f"verified, load {r['loadavg_1m_before']:.1f}→"
                                      f"{r['loadavg_1m_after']:.1f})")
            shutil.rmtree(data, ignore_errors=True)
    return {"runs": runs, "summary": summarize(runs, args.keys, peers)}


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(),
                    TextColumn("{task.completed:,}/{task.total:,}"), TimeElapsedColumn(),
                    console=console)


def warm_up(spark: Any, args: argparse.Namespace, peers: list[str], work: Path,
            progress: Progress) -> None:
    """One small unmeasured throughput run per peer: JIT, Python worker imports and the
    state store code paths are warm before anything is measured."""
    if args.warmup_records <= 0:
        return
    directory = work / "warmup-input"
    ids = key_ids(args.warmup_records, 1000, 0.0, args.seed + 1)
    if not directory.exists():
        write_input(ids, 2, directory)
    expected = np.bincount(ids, minlength=1000)
    for peer in peers:
        r = run_throughput(spark, peer, directory, expected, args, work, progress,
                           f"warm-up {peer}")
        note = r.get("error") or f"{r['seconds']:.1f} s"
        console.print(f"warm-up {peer}: {note}")


def tree_cpu_by_kind() -> dict[str, float] | None:
    """User + system CPU seconds of this process and every process under it, from
    ``/proc``, by kind: ``jvm`` (java), ``python_workers`` (the Python processes under
    the JVM: Spark's daemon and workers) and ``driver`` (this process and anything
    else); None where there is no ``/proc`` (the run then records no CPU)."""
    if not Path("/proc/self/stat").exists():
        return None
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parents: dict[int, int] = {}
    cpu: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            head, tail = (entry / "stat").read_text().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        cpu[pid] = int(fields[11]) + int(fields[12])
        names[pid] = head.split("(", 1)[-1]
    mine = {os.getpid()}
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in mine} - mine
        grew = bool(more)
        mine |= more
    out = {"jvm": 0.0, "python_workers": 0.0, "driver": 0.0}
    for pid in mine:
        kind = ("jvm" if names.get(pid) == "java" else "python_workers"
                if pid != os.getpid() and names.get(pid, "").startswith("python") else "driver")
        out[kind] += cpu.get(pid, 0) / ticks
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def paired_raw_shares(runs: list[dict[str, Any]], keys: int, peer: str) -> list[float]:
    """``peer``'s records/s over the ``dict`` peer's in the same repeat (the two ran
    back to back on the same JVM and input), one share per repeat both completed."""
    by_rep: dict[int, dict[str, float]] = {}
    for r in runs:
        if r["keys"] == keys and "error" not in r and r["peer"] in (peer, "dict"):
            by_rep.setdefault(r["repeat"], {})[r["peer"]] = r["records_per_s"]
    return [got[peer] / got["dict"] for _, got in sorted(by_rep.items())
            if peer in got and "dict" in got]


def summarize(runs: list[dict[str, Any]], keys_list: list[int], peers: list[str]
              ) -> list[dict[str, Any]]:
    """Best run per (keys, peer), with the ratio to the baseline peer of the same keys;
    and the median over repeats of each peer's share of the raw limit (``dict``) in the
    same repeat (issue 42's measure: paired, so the machine's drift hits both)."""
    rows = []
    for keys in keys_list:
        best: dict[str, dict[str, Any]] = {}
        for peer in peers:
            ok = [r for r in runs if r["keys"] == keys and r["peer"] == peer and "error" not in r]
            if ok:
                best[peer] = max(ok, key=lambda r: r["records_per_s"])
        base, raw = best.get(BASELINE), best.get("dict")
        for peer in peers:
            if peer in best:
                r = best[peer]
                shares = paired_raw_shares(runs, keys, peer)
                rows.append({
                    "keys": keys, "peer": peer, "records_per_s": r["records_per_s"],
                    "seconds": r["seconds"],
                    "vs_" + BASELINE.replace("-", "_"):
                        round(r["records_per_s"] / base["records_per_s"], 2) if base else None,
                    # the share of the raw limit (the dict peer) measured in the same run
                    "of_raw_limit":
                        round(r["records_per_s"] / raw["records_per_s"], 3) if raw else None,
                    "cpu_us_per_record_median": _median([
                        x["cpu_us_per_record"] for x in runs if x["keys"] == keys
                        and x["peer"] == peer and "error" not in x
                        and x.get("cpu_us_per_record") is not None]),
                    "records_per_s_median": _median([
                        x["records_per_s"] for x in runs if x["keys"] == keys
                        and x["peer"] == peer and "error" not in x]),
                    "of_raw_limit_paired": [round(x, 3) for x in shares],
                    "of_raw_limit_median": (round(m, 3) if (m := _median(shares)) is not None
                                            else None),
                })
            else:
                errs = [r["error"] for r in runs if r["keys"] == keys and r["peer"] == peer]
                rows.append({"keys": keys, "peer": peer, "error": errs[-1] if errs else "not run"})
    return rows


# --------------------------------------------------------------------------- latency

class FileDropper(threading.Thread):
    """Drops ``rate / per_second`` rows as one parquet file every ``1 / per_second`` s into
    ``directory`` (written beside it, then renamed in, so the file source never sees a
    partial file). ``ts`` is the wall-clock ms at which the file's rows were made; keys
    cycle through ``keys`` keys (``"k<seq % keys>"``)."""

    def __init__(self, directory: Path, rate: int, per_second: int, keys: int) -> None:
        super().__init__(name="file-dropper", daemon=True)
        self.directory = directory
        self.staging = directory.with_name(directory.name + "-staging")
        self.rows = max(1, rate // per_second)
        self.interval = 1.0 / per_second
        self.keys = keys
        self.halt = threading.Event()
        self.files = 0
        self.late_ms_max = 0.0  # how far behind its schedule the writer fell (noise)
        self.error: str | None = None
        directory.mkdir(parents=True)
        self.staging.mkdir(parents=True)

    def run(self) -> None:
        try:
            start, seq = time.monotonic(), 0
            while not self.halt.is_set():
                delay = start + self.files * self.interval - time.monotonic()
                if delay > 0 and self.halt.wait(delay):
                    break
                self.late_ms_max = max(self.late_ms_max, -delay * 1000.0)
                seqs = np.arange(seq, seq + self.rows, dtype=np.int64)
                ts = np.full(self.rows, int(time.time() * 1000), dtype=np.int64)
                keys = pc.binary_join_element_wise(
                    "k", pc.cast(pa.array(seqs % self.keys), pa.string()), "")
                name = f"part-{self.files:07d}.parquet"
                pq.write_table(pa.table({"key": keys, "seq": seqs, "ts": ts}),
                               self.staging / name)
                os.rename(self.staging / name, self.directory / name)
                seq += self.rows
                self.files += 1
        except Exception as e:  # pragma: no cover - reported with the run
            self.error = f"{type(e).__name__}: {e}"


def run_latency(spark: Any, peer: str, rate: int, args: argparse.Namespace, work: Path
                ) -> dict[str, Any]:
    """One latency run. The measured window starts ``--latency-warmup`` s after the
    first non-empty batch reached the sink (a new query's first batches pay for worker
    start-up and cold state) and covers ``--latency-seconds`` of row creation times; the
    query then runs until every row created in the window is out (or the grace period
    ends), so the percentiles cover all of the window's rows, not the ones that were
    fast enough to come out before a stop."""
    from pyspark.sql import functions as F

    tag = f"{peer}-{rate}-{time.monotonic_ns()}"
    lock = threading.Lock()
    chunks: list[tuple[np.ndarray, np.ndarray]] = []  # (creation ms, latency ms)
    window = {"start": float("inf"), "end": float("inf"), "newest": 0.0, "rows": 0}

    def sink(df: Any, batch_id: int) -> None:
        ts = df.select("ts").toArrow()["ts"].to_numpy()
        now_ms = time.time() * 1000.0
        if not len(ts):
            return
        with lock:
            if window["start"] == float("inf"):
                window["start"] = now_ms + args.latency_warmup * 1000.0
                window["end"] = window["start"] + args.latency_seconds * 1000.0
            window["rows"] += len(ts)
            window["newest"] = max(window["newest"], float(ts.max()))
            keep = (ts >= window["start"]) & (ts < window["end"])
            if keep.any():
                chunks.append((ts[keep], now_ms - ts[keep]))

    result: dict[str, Any] = {"peer": peer, "rate": rate, "keys": args.latency_keys,
                              "source": args.latency_source,
                              "loadavg_1m_before": round(os.getloadavg()[0], 2)}
    dropper: FileDropper | None = None
    try:
        if args.latency_source == "rate":
            events = (
                spark.readStream.format("rate").option("rowsPerSecond", rate)
                .option("numPartitions", 2).load()
                .select(
                    F.concat(F.lit("k"), (F.col("value") % args.latency_keys).cast("string"))
                    .alias("key"),
                    F.col("value").alias("seq"),
                    F.unix_millis("timestamp").alias("ts"),
                )
            )
        else:
            dropper = FileDropper(work / f"drop-{tag}", rate, args.files_per_second,
                                  args.latency_keys)
            events = (spark.readStream.schema("key string, seq long, ts long")
                      .parquet(str(dropper.directory)))
        out = build(peer, events, True, str(work / f"weir-state-{tag}"))
        query = (
            out.writeStream.foreachBatch(sink).outputMode("update")
            .option("checkpointLocation", str(work / f"ckpt-{tag}"))
            .trigger(processingTime=f"{getattr(args, 'latency_trigger_ms', 1000)} milliseconds")
            .start()
        )
        if dropper is not None:
            dropper.start()
        began = time.time()
        status = "ok"
        with Progress(TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task(f"latency {peer} @ {rate:,}/s: starting")
            while True:
                time.sleep(0.5)
                if query.exception() is not None or not query.isActive:
                    break
                now_ms = time.time() * 1000.0
                with lock:
                    start, end, newest = window["start"], window["end"], window["newest"]
                    rows = window["rows"]
                if start == float("inf"):
                    phase = "waiting for the first batch"
                    if time.time() - began > args.latency_grace + 60:
                        status = "no output"
                        break
                elif now_ms < start:
                    phase = "warm-up"
                elif now_ms < end:
                    phase = f"measuring {int((now_ms - start) / 1000)}/{args.latency_seconds:g} s"
                elif newest >= end:
                    break  # every row created in the window is out
                elif now_ms > end + args.latency_grace * 1000.0:
                    status = "drain timed out"
                    break
                else:
                    phase = "draining"
                progress.update(task, description=f"latency {peer} @ {rate:,}/s: {phase}, "
                                                  f"{rows:,} rows out")
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()).splitlines()[0])
        progress_log = [json.loads(p.json) for p in query.recentProgress]
        query.stop()
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        if args.verbose:
            traceback.print_exc()
        return result
    finally:
        if dropper is not None:
            dropper.halt.set()
            dropper.join()
            result.update(files_dropped=dropper.files,
                          dropper_late_ms_max=round(dropper.late_ms_max, 1))
            if dropper.error:
                result["error"] = f"file dropper: {dropper.error}"
    with lock:
        created = np.concatenate([c[0] for c in chunks]) if chunks else np.empty(0)
        values = np.concatenate([c[1] for c in chunks]) if chunks else np.empty(0)
    if not len(values):
        result["error"] = f"no output rows in the measured window ({status})"
        return result
    # backlog trend: median latency of the window's last quarter minus its first quarter
    q = (window["end"] - window["start"]) / 4
    first = values[created < window["start"] + q]
    last = values[created >= window["end"] - q]
    drift = float(np.median(last) - np.median(first)) if len(first) and len(last) else None
    expected = rate * args.latency_seconds
    batches = [p for p in progress_log if p.get("numInputRows", 0) > 0]
    batch_ms = [p["durationMs"]["triggerExecution"] for p in batches]
    result.update({
        "status": status,
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "measured_s": args.latency_seconds,
        "rows_measured": len(values),
        "rows_created_in_window": int(expected),
        "complete": status == "ok" and len(values) >= 0.99 * expected,
        "p50_ms": round(float(np.percentile(values, 50)), 1),
        "p99_ms": round(float(np.percentile(values, 99)), 1),
        "p999_ms": round(float(np.percentile(values, 99.9)), 1),
        "max_ms": round(float(values.max()), 1),
        "drift_ms": round(drift, 1) if drift is not None else None,
        "kept_up": status == "ok" and drift is not None and drift < 1000.0,
        "batch_ms_p50": float(np.median(batch_ms)) if batch_ms else None,
        "batch_ms_max": max(batch_ms) if batch_ms else None,
    })
    return result


def latency(spark: Any, args: argparse.Namespace, peers: list[str], work: Path
            ) -> dict[str, Any]:
    runs = []
    with _progress() as progress:
        warm_up(spark, args, peers, work, progress)
    for rate in args.rate:
        for peer in peers:
            r = run_latency(spark, peer, rate, args, work)
            runs.append(r)
            if "error" in r:
                console.print(f"  {peer} @ {rate:,}/s: [red]{r['error']}[/]")
            else:
                console.print(
                    f"  {peer} @ {rate:,}/s: p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms"
                    f" ({r['rows_measured']:,} rows, batch p50 {r['batch_ms_p50']:.0f} ms, "
                    f"drift {r['drift_ms']:+.0f} ms"
                    f"{'' if r['kept_up'] else ', [red]FELL BEHIND[/]'})")
    return {"runs": runs}


# --------------------------------------------------------------------------- report

def print_throughput(doc: dict[str, Any]) -> None:
    p = doc["params"]
    t = Table(title=f"keyed count on Spark: {p['records']:,} records, best of {p['repeat']} "
              f"(local[2], {'zipf ' + str(p['zipf']) if p['zipf'] > 0 else 'uniform'} keys)")
    ratio = "vs_" + BASELINE.replace("-", "_")
    for col in ("keys", "peer", "records/s", "seconds", f"vs {BASELINE}", "of raw limit",
                "median paired"):
        t.add_column(col, justify="left" if col == "peer" else "right")
    for r in doc["throughput"]["summary"]:
        if "error" in r:
            t.add_row(f"{r['keys']:,}", r["peer"], "[yellow]skipped[/]" if "weir.spark" in
                      r["error"] else "[red]error[/]", "", "", "", "")
        else:
            raw = r.get("of_raw_limit")
            t.add_row(f"{r['keys']:,}", r["peer"], f"{r['records_per_s']:,.0f}",
                      f"{r['seconds']:.1f}", f"{r[ratio]:.2f}x" if r[ratio] else "",
                      f"{raw:.0%}" if raw else "",
                      f"{m:.0%}" if (m := r.get("of_raw_limit_median")) else "")
    console.print(t)


def print_latency(doc: dict[str, Any]) -> None:
    p = doc["params"]
    t = Table(title=f"end-to-end latency: {p['latency_source']} source, "
              f"{p['latency_keys']:,} keys, trigger 1 s, {p['latency_seconds']:g} s of rows "
              f"measured after {p['latency_warmup']:g} s warm-up")
    for col in ("rows/s", "peer", "p50 ms", "p99 ms", "max ms", "rows", "batch p50 ms",
                "drift ms", "kept up"):
        t.add_column(col, justify="left" if col == "peer" else "right")
    for r in doc["latency"]["runs"]:
        if "error" in r:
            t.add_row(f"{r['rate']:,}", r["peer"], "[yellow]skipped[/]" if "weir.spark" in
                      r["error"] else "[red]error[/]", *[""] * 6)
        else:
            t.add_row(f"{r['rate']:,}", r["peer"], f"{r['p50_ms']:.0f}", f"{r['p99_ms']:.0f}",
                      f"{r['max_ms']:.0f}", f"{r['rows_measured']:,}",
                      f"{r['batch_ms_p50']:.0f}" if r["batch_ms_p50"] is not None else "",
                      f"{r['drift_ms']:+.0f}" if r["drift_ms"] is not None else "",
                      "yes" if r["kept_up"] else "[red]no[/]")
    console.print(t)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    if "throughput" in doc:
        rows = [r for r in doc["throughput"]["summary"] if "error" not in r]
        keys = doc["params"]["keys"]
        peers = [p for p in doc["params"]["peers"] if any(r["peer"] == p for r in rows)]
        width = 0.8 / max(1, len(peers))
        for i, peer in enumerate(peers):
            vals = {r["keys"]: r["records_per_s"] for r in rows if r["peer"] == peer}
            xs = [j + (i - (len(peers) - 1) / 2) * width for j in range(len(keys))]
            bars = ax.bar(xs, [vals.get(k, 0) for k in keys], width, label=peer)
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_xticks(range(len(keys)), [f"{k:,} keys" for k in keys])
        ax.set_ylabel("records/s (higher is better)")
        ax.set_title(f"keyed count on Spark local[2], {doc['params']['records']:,} records")
    else:
        rows = [r for r in doc["latency"]["runs"] if "error" not in r]
        xs = range(len(rows))
        for off, q, color in ((-0.2, "p50_ms", "tab:blue"), (0.2, "p99_ms", "tab:orange")):
            bars = ax.bar([x + off for x in xs], [r[q] for r in rows], 0.4,
                          label=q.removesuffix("_ms"), color=color)
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_xticks(list(xs), [f"{r['peer']}\n@ {r['rate']:,}/s"
                                 + ("" if r["kept_up"] else "\n(fell behind)") for r in rows])
        ax.set_ylabel("end-to-end latency ms (lower is better)")
        ax.set_title(f"keyed count latency, {doc['params']['latency_source']} source, "
                     f"{doc['params']['latency_keys']:,} keys, trigger 1 s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine_info(spark: Any) -> dict[str, Any]:
    conf = spark.sparkContext.getConf()
    return {
        "python": sys.version.split()[0], "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "packages": {p: _version(p) for p in ("pyspark", "pyarrow", "pandas", "protobuf",
                                               "weir")},
        "spark_conf": {k: conf.get(k) for k in (
            "spark.master", "spark.sql.shuffle.partitions", "spark.driver.memory",
            "spark.sql.streaming.stateStore.providerClass")},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _int_list(s: str) -> list[int]:
    return [int(x.replace("_", "")) for x in s.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=lambda s: int(s.replace("_", "")), default=1_000_000)
    p.add_argument("--keys", type=_int_list, default=[10_000, 200_000],
                   help="comma-separated key counts (default 10000,200000)")
    p.add_argument("--peers", default=None,
                   help=f"comma-separated, from {','.join(PEERS)} (default: all; "
                        f"--latency: {','.join(LATENCY_PEERS)})")
    p.add_argument("--zipf", type=float, default=0.0, help="Zipf exponent (0 = uniform keys)")
    p.add_argument("--files", type=int, default=20, help="parquet input files")
    p.add_argument("--files-per-trigger", type=int, default=5, help="files per micro-batch")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per peer and size (best kept; every other one in reverse "
                        "peer order)")
    p.add_argument("--warmup-records", type=int, default=20_000,
                   help="unmeasured warm-up run per peer (0 = none)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per query")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--name", default=None,
                   help="results file stem in bench/results (default spark_keyed_count[_quick])")
    p.add_argument("--driver-memory", default="3g")
    p.add_argument("--quick", action="store_true",
                   help="100k records (latency: 10 s measured after 5 s)")
    p.add_argument("--latency", action="store_true",
                   help="run the latency workload instead of the throughput one")
    p.add_argument("--rate", type=_int_list, default=[500, 2_000],
                   help="latency: comma-separated input rates, rows/s (default 500,2000)")
    p.add_argument("--latency-keys", type=int, default=10_000)
    p.add_argument("--latency-seconds", type=float, default=30.0)
    p.add_argument("--latency-warmup", type=float, default=10.0,
                   help="seconds after the first output batch before the window starts")
    p.add_argument("--latency-source", choices=("files", "rate"), default="files",
                   help="latency input: parquet files dropped at a fixed rate (default), or "
                        "Spark's rate source (its offsets are whole seconds: up to 1 s more, "
                        "varying with the phase between the source's seconds and the trigger)")
    p.add_argument("--files-per-second", type=int, default=10,
                   help="latency, files source: files dropped per second")
    p.add_argument("--latency-grace", type=float, default=60.0,
                   help="seconds to wait for the window's rows after it ends")
    p.add_argument("-v", "--verbose", action="store_true", help="print tracebacks")
    p.add_argument("--snapshot", choices=("full", "incremental", "changelog"), default=None,
                   help="the weir peers' SnapshotStrategy (default: CheckpointConfig's)")
    args = p.parse_args(argv)
    global SNAPSHOT
    SNAPSHOT = args.snapshot
    if args.quick:
        args.records = min(args.records, 100_000)
        args.latency_seconds, args.latency_warmup = 10.0, 5.0
    peers = (args.peers.split(",") if args.peers
             else list(LATENCY_PEERS if args.latency else PEERS))
    unknown = set(peers) - set(PEERS)
    if unknown:
        p.error(f"unknown peers {sorted(unknown)}; choose from {', '.join(PEERS)}")
    if any(x.startswith("weir-") for x in peers):
        _, why = weir_spark()
        if why:
            console.print(f"[yellow]weir rows skipped: {why}[/]")

    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="weir-bench-spark-"))
    spark = spark_session(args.driver_memory)
    try:
        doc: dict[str, Any] = {"machine": machine_info(spark)}
        doc["params"] = {
            k: getattr(args, k) for k in (
                "records", "keys", "zipf", "files", "files_per_trigger", "repeat",
                "warmup_records", "seed", "quick", "rate", "latency_keys", "latency_seconds",
                "latency_warmup", "latency_grace", "latency_source", "files_per_second")}
        doc["params"]["peers"] = peers
        if args.latency:
            doc["latency"] = latency(spark, args, peers, work)
        else:
            doc["throughput"] = throughput(spark, args, peers, work)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    doc["params"]["elapsed_s"] = round(time.perf_counter() - started, 1)
    (print_latency if args.latency else print_throughput)(doc)
    stem = args.name or "spark_keyed_count" + ("_latency" if args.latency else "") + (
        "_quick" if args.quick else "")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, RESULTS / f"{stem}.png")
    console.print(f"wrote {RESULTS / stem}.json and .png ({doc['params']['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
