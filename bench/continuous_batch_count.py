"""Columnar keyed processing on the continuous runtime: the keyed running count as a
``KeyedBatchFunction`` over records that travel as Arrow batches, side by side with the
same count per record and with the raw limit, in one run.

* ``weir-batch-<backend>``: ``SequenceSource(n, batch_size=16384)`` (each record a
  ``RecordBatch`` of numbers) → a chained ``map`` adding the key column
  ``(n * 7919) % K`` → ``key_by("key")`` (each batch split by key group, the routes in
  C) → the batch count (one ``get`` and one ``put`` of the distinct keys per batch, no
  output) → a file sink; p = 2 (four task processes), exactly-once checkpoints every
  second, ``--batch-records`` records (default 20,000,000);
* ``weir-<backend>``: ``bench.continuous_keyed_count``'s per-record count on the same
  settings, ``--records`` records (default 1,000,000);
* the raw limit: one Python process counting the numbers in a dict, one at a time (the
  per-record floor every Python peer is bound by).

Times include start-up (from ``execute()`` to its end); the steady rate leaves out
start-up and the end (the keyed function notes its records so far 50 times a run:
``bench.continuous_keyed_count.steady_rate``). Targets (PERFORMANCE.md): the batch count
at >= 3M records/s on 2 cores with checkpoints every 1 s.

Run: ``.venv/bin/python -m bench.continuous_batch_count [--quick] [--keys 10000,200000]``
(``make bench-continuous-batch``). Results: ``bench/results/continuous_batch_count.json``
and ``.png``; a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle

import weir
from bench.continuous_keyed_count import (
    COUNT,
    CpuMarks,
    _int_list,
    _load,
    raw_limit,
    read_cpu,
    read_marks,
    weir_run,
)
from weir.connectors import FileSink, SequenceSource
from weir.runtime.checkpoint_cpu import checkpoint_cpu_ns
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BATCH_SIZE = 16_384


class BatchCount(weir.KeyedBatchFunction):
    """A running count per key, a batch at a time: the distinct keys' counts read, the
    batch's occurrences added, written back; no output. Notes (time, records so far,
    CPU, checkpoint CPU) every ``every`` records into ``marks_dir``."""

    def __init__(self, marks_dir: str | None = None, every: int = 400_000) -> None:
        self.marks_dir, self.every = marks_dir, every

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)
        self.n = 0
        self.next_mark = self.every
        self.marks: CpuMarks = []

    def process_batch(self, batch: pa.RecordBatch, ctx: Any) -> None:
        encoded = pc.dictionary_encode(ctx.keys)
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        distinct = encoded.dictionary
        before = pc.fill_null(self.count.get(distinct), 0).to_numpy()
        self.count.put(distinct, before + np.bincount(codes, minlength=len(distinct)))
        self.n += batch.num_rows
        if self.n >= self.next_mark:
            self.next_mark += self.every
            self.marks.append((time.monotonic(), self.n, time.process_time(),
                               checkpoint_cpu_ns() / 1e9))

    def close(self) -> None:
        if self.marks_dir:
            path = Path(self.marks_dir) / f"weir-{os.getpid()}-{id(self):x}.json"
            path.write_text(json.dumps(self.marks))


def with_key(keys: int) -> Any:
    """The chained map: a batch of numbers with its key column ``(n * 7919) % keys``."""
    def add_key(batch: pa.RecordBatch) -> pa.RecordBatch:
        numbers = batch.column("value").to_numpy()
        return batch.append_column("key", pa.array((numbers * 7919) % keys))
    return add_key


def batch_run(records: int, keys: int, backend: str, root: Path) -> dict[str, Any]:
    """The batch count as a continuous job, checkpoints every second."""
    work = Path(tempfile.mkdtemp(dir=root))
    marks = work / "marks"
    marks.mkdir()
    env = StreamEnvironment(weir.JobConfig(work / "chk", parallelism=2, state_backend=backend,
                                           checkpointing=CheckpointConfig(interval=1000),
                                           restart_strategy=RestartStrategy.no_restart()))
    (env.from_source(SequenceSource(records, batch_size=BATCH_SIZE), uid="numbers")
        .map(with_key(keys)).key_by("key")
        .process(BatchCount(str(marks), max(BATCH_SIZE, records // 100)), uid="count",
                 output_batches=True)
        .sink_to(FileSink(work / "out"), uid="sink"))
    load = _load()
    started = time.perf_counter()
    result = env.execute("bench-batch")
    seconds = time.perf_counter() - started
    return {"peer": f"weir-batch-{backend}", "checkpoints": "1 s", "interval_ms": 1000,
            "keys": keys, "records": records, "seconds": round(seconds, 2),
            "records_per_s": round(records / seconds),
            "steady_records_per_s": read_marks(marks), "cpu_us_per_record": read_cpu(marks),
            "completed": len(result.completed), "load": [load, _load()]}


def print_table(runs: list[dict[str, Any]]) -> None:
    print("| keys | run | records | records/s | steady records/s | checkpoints completed | "
          "of the raw limit (steady) |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in runs:
        raw = next(x for x in runs if x["keys"] == r["keys"] and x["peer"].startswith("dict"))
        rate = r.get("steady_records_per_s") or r["records_per_s"]
        steady = f"{r['steady_records_per_s']:,}" if r.get("steady_records_per_s") else ""
        print(f"| {r['keys']:,} | {r['peer']} | {r['records']:,} | {r['records_per_s']:,} | "
              f"{steady} | {r.get('completed', '')} | {rate / raw['records_per_s']:.2f}x |")


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    key_counts = sorted({r["keys"] for r in runs})
    names = list(dict.fromkeys(r["peer"] for r in runs))
    fig, axes = plt.subplots(1, len(key_counts), figsize=(5.5 * len(key_counts), 4.5),
                             sharey=True, squeeze=False)
    for ax, keys in zip(axes[0], key_counts, strict=True):
        rows = [next(r for r in runs if r["peer"] == n and r["keys"] == keys) for n in names]
        ax.bar(range(len(names)), [r.get("steady_records_per_s") or r["records_per_s"]
                                   for r in rows], color="tab:blue")
        ax.axhline(3e6, color="tab:red", linestyle="--", linewidth=1, label="target: 3M/s")
        ax.set_title(f"{keys:,} keys", fontsize=9)
        ax.set_xticks(range(len(names)), names, fontsize=7, rotation=20)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("records/s (steady state; the dict: whole run)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("keyed running count on the continuous runtime (p = 2, checkpoints every "
                 "1 s): a batch function over Arrow batches vs per record vs a bare dict",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-records", type=int, default=20_000_000)
    p.add_argument("--records", type=int, default=1_000_000, help="the per-record runs'")
    p.add_argument("--keys", type=_int_list, default=[10_000, 200_000])
    p.add_argument("--quick", action="store_true", help="2M batch records, 10k keys")
    args = p.parse_args(argv)
    keys_list = [10_000] if args.quick else args.keys
    batch_records = 2_000_000 if args.quick else args.batch_records
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="weir-bench-batch-") as tmp:
        root = Path(tmp)
        batch_run(200_000, 1000, "hashmap", root)  # unmeasured: cold caches
        for keys in keys_list:
            runs.append(raw_limit(args.records, keys))
            for backend in ("hashmap", "rocksdb"):
                runs.append(weir_run(args.records, keys, backend, 1000, root))
                runs.append(batch_run(batch_records, keys, backend, root))
    doc = {"benchmark": "continuous_batch_count",
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "cpus": os.cpu_count()},
           "params": {"batch_records": batch_records, "records": args.records,
                      "keys": keys_list, "parallelism": 2, "batch_size": BATCH_SIZE},
           "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": runs}
    print_table(runs)
    stem = "continuous_batch_count" + ("_quick" if args.quick else "")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, RESULTS / f"{stem}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
