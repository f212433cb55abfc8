"""Large state on Spark: what one micro-batch costs as the state grows.

One SparkSession (``local[2]``), one keyed running count per peer:

* ``weir-hashmap`` / ``weir-rocksdb`` — ``weir.spark.process`` (hash-map changelog
  checkpoints / incremental RocksDB checkpoints, the defaults), parallelism 2;
* ``tws-pandas`` — ``transformWithStateInPandas`` on Spark's RocksDB state store with
  changelog checkpointing on (``spark.sql.streaming.stateStore.rocksdb.
  changelogCheckpointing.enabled``), 2 shuffle partitions.

For each state size K (``--keys``): batch 0 loads K keys (one record each); then one
batch each changing 0% (one key), 1% and 10% of the keys, every batch one parquet
file (``maxFilesPerTrigger`` 1, ``availableNow``). Per batch: wall time (Spark's
``triggerExecution``) and the bytes of the files written into the peer's checkpoint
locations during the batch (weir's ``checkpoint_location``; Spark's checkpoint
directory, which holds the state store for tws). Then, for weir, an **idle run**: the
query restarted with its heartbeat on and a 1 s processing-time trigger, no input,
for ``--idle-batches`` batches: time and bytes per idle batch (the heartbeat keeps
batches running, so timers and TTL work without input). Restore: the time of the
first batch of a new query on the same location (same parallelism), and of one at
parallelism 3 (rescale). Peak RSS: the largest ``VmHWM`` of the Python workers, next
to the state's size (the bytes of a full copy: the load batch's checkpoint), the
baseline of a worker that only imported weir, and, for the hash map, the live state:
the memory the same state takes in weir's hash map, and as a plain ``dict``, each
built in a fresh process (:func:`live_state_mb`).

Targets (issue 10): idle batch <= 1% of the state's bytes, its time within 2x from 10k
to 1M keys; 1% churn <= 5% of the state's bytes; hash-map peak RSS <= 2x the state.

Run: ``.venv/bin/python -m bench.spark_large_state [--quick] [--keys 10000,1000000]
[--peers weir-hashmap,weir-rocksdb,tws-pandas]``. Results:
``bench/results/spark_large_state.json`` (``_quick``) and a PNG next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from bench.spark_keyed_count import PandasCount, _version

RESULTS = Path(__file__).resolve().parent / "results"
PEERS = ("weir-hashmap", "weir-rocksdb", "tws-pandas")
CHURN = (0.0, 0.01, 0.10)
console = Console(width=max(Console().width, 120))


def spark_session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("weir-bench-large-state")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
                "true")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def _write(directory: Path, index: int, ids: np.ndarray, seq0: int) -> None:
    keys = pc.binary_join_element_wise("k", pc.cast(pa.array(ids), pa.string()), "")
    table = pa.table({"key": keys, "seq": pa.array(np.arange(seq0, seq0 + len(ids)))})
    pq.write_table(table, directory / f"part-{index:04d}.parquet")


def _inputs(directory: Path, keys: int, seed: int) -> list[int]:
    """Batch files: all keys once, then 0% (one key), 1% and 10% of the keys.
    Returns the number of records per batch."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    sizes = [keys] + [max(1, int(keys * c)) for c in CHURN]
    seq = 0
    for i, n in enumerate(sizes):
        ids = np.arange(keys) if i == 0 else rng.choice(keys, n, replace=False)
        _write(directory, i, ids, seq)
        seq += n
    return sizes


class FileWatch:
    """Bytes of the files under some directories written since ``mark()``."""

    def __init__(self, *roots: Path) -> None:
        self.roots = roots
        self.seen: dict[str, tuple[float, int]] = {}
        self.mark()

    def _scan(self) -> dict[str, tuple[float, int]]:
        out = {}
        for root in self.roots:
            for dirpath, _, files in os.walk(root):
                for name in files:
                    path = os.path.join(dirpath, name)
                    try:
                        st = os.stat(path)
                    except FileNotFoundError:
                        continue
                    out[path] = (st.st_mtime, st.st_size)
        return out

    def mark(self) -> None:
        self.seen = self._scan()

    def written(self) -> int:
        now = self._scan()
        total = sum(size for path, (mtime, size) in now.items()
                    if self.seen.get(path, (None, None))[0] != mtime)
        self.seen = now
        return total


def _worker_rss_mb() -> float:
    """The largest peak RSS (VmHWM) of this machine's PySpark Python workers."""
    peak = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"pyspark.daemon" not in cmdline and b"pyspark.worker" not in cmdline:
                continue
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return peak / 1024


_LIVE_STATE = """
import gc, sys
from bench.spark_keyed_count import CountFunction
from weir.testing import KeyedOperatorHarness

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

n = int(sys.argv[1])
harness = KeyedOperatorHarness(CountFunction(), key_selector=lambda v: v["key"])
harness.open()
gc.collect()
base = rss()
for start in range(0, n, 100_000):
    keys = [f"k{i}" for i in range(start, min(n, start + 100_000))]
    harness.operator.process_keyed([{"key": k} for k in keys], keys, [None] * len(keys), [])
    del keys
gc.collect()
weir_bytes = rss() - base
plain = {f"k{i}": 1 for i in range(n)}
gc.collect()
print(weir_bytes, rss() - base - weir_bytes)
"""


def live_state_mb(keys: int) -> tuple[float, float]:
    """The memory (RSS growth, MB) of the benchmark's state held live in weir's hash
    map (one subtask, every key) and as a plain ``dict`` of the same keys and counts,
    each measured in a fresh process."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", _LIVE_STATE, str(keys)], check=True,
                         capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent).stdout.split()
    return int(out[0]) / 2**20, int(out[1]) / 2**20


def worker_baseline_mb(spark: Any) -> float:
    """The peak RSS of a Python worker that imported weir and ran one Arrow batch."""

    def touch(batches: Any) -> Any:
        import weir.spark  # noqa: F401

        yield from batches

    spark.range(2, numPartitions=2).mapInArrow(touch, "id long").collect()
    return _worker_rss_mb()


def _build(peer: str, events: Any, location: Path, parallelism: int,
           heartbeat: bool) -> Any:
    import weir.spark

    schema = "key string, count long"
    if peer == "tws-pandas":
        return events.groupBy("key").transformWithStateInPandas(
            statefulProcessor=PandasCount(), outputStructType=schema,
            outputMode="Update", timeMode="None")
    from bench.spark_keyed_count import CountFunction

    return weir.spark.process(
        events,
        key_by="key",
        function=CountFunction(),
        output_schema=schema,
        uid="count",
        config=weir.JobConfig(
            location.as_uri(), max_parallelism=128, state_backend=peer.removeprefix("weir-")
        ),
        parallelism=parallelism,
        heartbeat=heartbeat,
    )


def _run(spark: Any, peer: str, source: Path, location: Path, spark_dir: Path,
         parallelism: int, *, idle_batches: int = 0) -> list[dict[str, Any]]:
    """One query; per batch: rows, seconds, bytes written. ``idle_batches``: run with
    the heartbeat and a 1 s trigger until that many batches ran (no input)."""
    import weir.spark

    events = (spark.readStream.schema("key string, seq long")
              .option("maxFilesPerTrigger", 1).parquet(str(source)))
    watch = FileWatch(location, spark_dir)
    out: list[dict[str, Any]] = []
    # batch N's tasks run inside the sink: hold them until batch N-1 is measured, so
    # that no batch completes unseen between two polls and bytes are per batch
    measured = threading.Condition()
    last_measured = [-1]

    def sink(df: Any, batch: int) -> None:
        with measured:
            measured.wait_for(lambda: last_measured[0] >= batch - 1 or not running[0], 120)
        df.write.format("noop").mode("overwrite").save()

    running = [True]
    writer = (_build(peer, events, location, parallelism, idle_batches > 0)
              .writeStream.foreachBatch(sink).option("checkpointLocation", str(spark_dir)))
    if idle_batches:
        query = writer.trigger(processingTime="1 second").start()
    else:
        query = writer.trigger(availableNow=True).start()
    seen = -1
    try:
        while True:
            progress = query.lastProgress
            if progress is not None and progress["batchId"] > seen:
                if progress["batchId"] != seen + 1:
                    raise RuntimeError(f"batch {seen + 1} was not measured")
                seen = progress["batchId"]
                time.sleep(0.3)  # the listener's completion of the batch lands
                out.append({
                    "batch": seen, "rows": progress["numInputRows"],
                    "seconds": progress["durationMs"].get("triggerExecution", 0) / 1000,
                    "bytes": watch.written(),
                })
                with measured:
                    last_measured[0] = seen
                    measured.notify_all()
            if idle_batches and len(out) >= idle_batches:
                break
            if not query.isActive:
                query.awaitTermination()
                break
            time.sleep(0.05)
    finally:
        with measured:
            running[0] = False
            measured.notify_all()
        query.stop()
        if peer.startswith("weir"):
            weir.spark.finish(query)
    if peer.startswith("weir"):
        tasks = _task_io(location, str(query.id))
        for b in out:
            b.update(tasks.get(b["batch"], {}))
    return out


def _task_io(location: Path, query: str) -> dict[int, dict[str, Any]]:
    """Per completed batch of ``query``: how its tasks got their state (``restored``
    from storage, ``caught_up`` by the deltas since, else the worker's live copy) and
    the slowest task's restore/process/snapshot ms, from ``spark_io`` in ``_metadata``."""
    from weir.checkpoint.format import decode_metadata

    out: dict[int, dict[str, Any]] = {}
    for meta in location.glob(f"stages/*/queries/{query}/chk-*/_metadata"):
        positions = decode_metadata(meta.read_bytes(), str(meta)).source_positions
        io = positions.get("spark_io") or {}
        subtasks = io.get("subtasks") or {}
        if not subtasks:
            continue
        out[int(meta.parent.name.removeprefix("chk-"))] = {
            "restored": sum(int(t.get("restored") or 0) for t in subtasks.values()),
            "caught_up": sum(int(t.get("caught_up") or 0) for t in subtasks.values()),
            "workers": {i: t.get("worker_pid") for i, t in sorted(subtasks.items())},
            **{f"max_{k}": max(float(t.get(k) or 0) for t in subtasks.values())
               for k in ("restore_ms", "process_ms", "snapshot_ms")},
        }
    return out


def _from_first_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The batches from the first one with rows (the first the stage's tasks run)."""
    first = next((i for i, b in enumerate(runs) if b["rows"]), len(runs) - 1)
    return runs[first:]


def measure(spark: Any, peer: str, keys: int, work: Path, idle: int, seed: int
            ) -> dict[str, Any]:
    source = work / "in"
    sizes = _inputs(source, keys, seed)
    location, spark_dir = work / "weir", work / "spark"
    batches = _run(spark, peer, source, location, spark_dir, 2)
    if len(batches) != len(sizes):
        raise RuntimeError(f"{peer}: {len(batches)} batches for {len(sizes)} files")
    state_bytes = batches[0]["bytes"]
    doc: dict[str, Any] = {
        "peer": peer, "keys": keys, "state_bytes": state_bytes,
        "load_seconds": batches[0]["seconds"],
        "churn": [{"fraction": c, **b} for c, b in zip(CHURN, batches[1:], strict=True)],
        "worker_peak_rss_mb": _worker_rss_mb(),
    }
    if peer == "weir-hashmap":
        doc["live_state_mb"], doc["plain_dict_mb"] = live_state_mb(keys)
    if peer.startswith("weir"):
        empty = work / "empty"  # new queries: no input, only the heartbeat
        empty.mkdir()
        runs = _run(spark, peer, empty, location, work / "spark-idle", 2,
                    idle_batches=idle + 3)
        runs = _from_first_rows(runs)  # the rate source's first batch has no row
        doc["restore_seconds"] = runs[0]["seconds"]  # a new query: restores first
        doc["restore_bytes"] = runs[0]["bytes"]  # (and writes a new base)
        doc["idle"] = runs[1:]
        rescale = _from_first_rows(_run(spark, peer, empty, location,
                                        work / "spark-rescale", 3, idle_batches=3))
        doc["rescale_seconds"] = rescale[0]["seconds"]
    return doc


def _row(doc: dict[str, Any]) -> dict[str, Any]:
    state = max(1, doc["state_bytes"])
    churn = {c["fraction"]: c for c in doc["churn"]}
    idle = doc.get("idle") or []
    idle_bytes = float(np.median([b["bytes"] for b in idle])) if idle else None
    idle_s = float(np.median([b["seconds"] for b in idle])) if idle else None
    return {
        "peer": doc["peer"], "keys": doc["keys"], "state MB": state / 1e6,
        "0% s": churn[0.0]["seconds"], "0% KB": churn[0.0]["bytes"] / 1e3,
        "1% s": churn[0.01]["seconds"], "1% of state": churn[0.01]["bytes"] / state,
        "10% s": churn[0.1]["seconds"], "10% of state": churn[0.1]["bytes"] / state,
        "idle s": idle_s, "idle of state": None if idle_bytes is None else idle_bytes / state,
        "restore s": doc.get("restore_seconds"), "rescale s": doc.get("rescale_seconds"),
        "worker RSS MB": doc["worker_peak_rss_mb"],
        "live state MB": doc.get("live_state_mb"),
    }


def print_table(docs: list[dict[str, Any]]) -> None:
    table = Table(title="large state on Spark local[2]: one batch")
    rows = [_row(d) for d in docs]
    for col in rows[0]:
        table.add_column(col, justify="left" if col == "peer" else "right")
    for row in rows:
        table.add_row(*[
            "-" if v is None else f"{v:.1%}" if "of state" in k else
            f"{v:,.2f}" if isinstance(v, float) else str(v) for k, v in row.items()])
    console.print(table)


def plot(docs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for doc in docs:
        label = f"{doc['peer']} {doc['keys']:,}"
        fractions = [c["fraction"] * 100 for c in doc["churn"]]
        left.plot(fractions, [c["seconds"] for c in doc["churn"]], marker="o", label=label)
        right.plot(fractions, [c["bytes"] / max(1, doc["state_bytes"]) * 100
                               for c in doc["churn"]], marker="o", label=label)
    left.set(xlabel="% of keys changed", ylabel="batch seconds")
    right.set(xlabel="% of keys changed", ylabel="bytes written, % of the state")
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", default="10000,1000000")
    p.add_argument("--peers", default=",".join(PEERS))
    p.add_argument("--idle-batches", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="10k and 100k keys, 5 idle batches")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--name", default=None,
                   help="results file name in bench/results (default spark_large_state)")
    a = p.parse_args(argv)
    if a.quick:
        a.keys, a.idle_batches = "10000,100000", 5
    keys_list = [int(k) for k in a.keys.split(",")]
    peers = a.peers.split(",")
    spark = spark_session()
    baseline = worker_baseline_mb(spark)
    docs = []
    started = time.time()
    for keys in keys_list:
        for peer in peers:
            work = Path(tempfile.mkdtemp(prefix=f"weir-large-{peer}-"))
            try:
                console.print(f"[bold]{peer}[/] {keys:,} keys ...")
                docs.append(measure(spark, peer, keys, work, a.idle_batches, a.seed))
            finally:
                shutil.rmtree(work, ignore_errors=True)
    print_table(docs)
    RESULTS.mkdir(exist_ok=True)
    name = a.name or ("spark_large_state" + ("_quick" if a.quick else ""))
    out = {
        "benchmark": "spark_large_state", "params": vars(a), "runs": docs,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "pyspark": _version("pyspark"), "weir": _version("weir")},
        "seconds": round(time.time() - started, 1), "worker_baseline_rss_mb": baseline,
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2))
    plot(docs, RESULTS / f"{name}.png")
    console.print(f"wrote {RESULTS / name}.json and .png")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
