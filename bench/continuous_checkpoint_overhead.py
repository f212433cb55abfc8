"""Checkpoint overhead of the continuous runtime (PERFORMANCE.md workload 3): the keyed
count of ``bench/continuous_keyed_count`` (``--records`` records over ``--keys`` keys,
p = 2, into a two-phase-commit ``FileSink``) with exactly-once checkpoints every 1 s,
every 10 s, and none during the run (the final checkpoint only), on both backends.

One run of a few seconds on shared cores varies by more than the overhead it would
measure, so the three settings run ``--repeat`` times in turn (rotating which goes
first) and each is summarised by the median of its steady records/s (the window where
every keyed subtask is past its first progress note and before its last:
``bench.continuous_keyed_count.read_marks``). Overhead = 1 - median(with checkpoints) /
median(none), and paired: the median over repeats of the overhead within one repeat
(its settings run back to back, so a slow spell of the shared cores moves them
together). Target (PERFORMANCE.md): ≤ 5% at 1 s.

Also the synchronous pause of the keyed tasks per checkpoint (the part of a snapshot
in the task thread, from ``JobClient.checkpoints()``): the median run's p50 and the
worst run's p99 (target, PERFORMANCE.md: p99 ≤ 50 ms).

Beside it, what checkpoints cost in CPU: the keyed task processes' CPU time per record
in the same window (every thread, so the snapshot encode and upload too;
``read_cpu``), median per setting; CPU overhead = median(with) / median(none) - 1. A
rate on shared cores moves by ±15% between runs with the load of other processes; the
CPU a record takes moves much less, but still by about as much as the overhead.
Hence, measured where the work runs: the CPU the keyed tasks spend on checkpoints in
the window (``weir.runtime.checkpoint_cpu``: synchronous parts, acknowledgements,
uploads, materializations, sink commits; every thread) over the CPU they spend on the
rest — checkpoint CPU, median over runs. A slow spell moves both sides of that ratio
together. It leaves out what checkpoints add to each record (a changelog's tracking of
the keys written) and RocksDB's own threads.

Run: ``.venv/bin/python -m bench.continuous_checkpoint_overhead [--quick]
[--records N] [--keys 10000,200000] [--repeat R]``. Results:
``bench/results/continuous_checkpoint_overhead.json`` and ``.png``; a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

from bench import continuous_keyed_count as kc

INTERVALS: tuple[int | None, ...] = (None, 10_000, 1_000)


def _label(interval: int | None) -> str:
    return "none" if interval is None else f"{interval // 1000} s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--keys", type=kc._int_list, default=[10_000, 200_000])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--backends", default="hashmap,rocksdb",
                   help="backends, each optionally with a snapshot strategy: "
                        "hashmap:full,hashmap:changelog,rocksdb:incremental (default: "
                        "CheckpointConfig's)")
    p.add_argument("--quick", action="store_true", help="500k records, 10k keys, 2 repeats")
    args = p.parse_args(argv)
    if args.quick:
        args.records, args.keys, args.repeat = 500_000, [10_000], 2
    backends = [b for b in args.backends.split(",") if b]
    cloudpickle.register_pickle_by_value(kc)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="weir-bench-overhead-") as tmp:
        root = Path(tmp)
        kc.weir_run(20_000, 1000, "hashmap", None, root)  # warm caches, unmeasured
        for keys in args.keys:
            for backend in backends:
                for rep in range(args.repeat):
                    order = INTERVALS[rep % 3:] + INTERVALS[:rep % 3]
                    for interval in order:
                        name, _, snapshot = backend.partition(":")
                        row = kc.weir_run(args.records, keys, name, interval, root,
                                          snapshot=snapshot or None)
                        runs.append({**row, "repeat": rep})
                        print(f"{backend} {keys:,} keys, checkpoints {_label(interval)}: "
                              f"{row['steady_records_per_s']:,} records/s steady, "
                              f"{row['cpu_us_per_record']} CPU µs/record "
                              f"({row['checkpoint_cpu_us_per_record']} on checkpoints), "
                              f"{row['completed']} checkpoints, sync pause "
                              f"{row['sync_ms']} ms", file=sys.stderr)
    summary = summarise(runs)
    print("| backend | keys | checkpoints | median steady records/s | runs | overhead | "
          "paired overhead | median CPU µs/record | CPU overhead | checkpoint CPU | "
          "sync pause p50 / p99 ms |\n"
          "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for s in summary:
        print(f"| {s['backend']} | {s['keys']:,} | {s['checkpoints']} | "
              f"{s['median_records_per_s']:,} | "
              f"{', '.join(f'{r:,}' for r in s['runs_records_per_s'])} | "
              f"{s['overhead_pct']:+.1f}% | {s['paired_overhead_pct']:+.1f}% | "
              f"{s['median_cpu_us_per_record']} | "
              f"{s['cpu_overhead_pct']:+.1f}% | {s['checkpoint_cpu_pct']}% | "
              f"{s['sync_ms_p50']} / {s['sync_ms_p99']} |")
    doc = {"benchmark": "continuous_checkpoint_overhead",
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "cpus": os.cpu_count()},
           "params": {"records": args.records, "keys": args.keys, "repeat": args.repeat,
                      "parallelism": 2, "backends": backends},
           "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "summary": summary, "runs": runs}
    stem = "continuous_checkpoint_overhead" + ("_quick" if args.quick else "")
    kc.RESULTS.mkdir(exist_ok=True)
    (kc.RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(summary, kc.RESULTS / f"{stem}.png")
    return 0


def paired_overhead(runs: list[dict[str, Any]], peer: str, keys: int,
                    interval: int | None) -> float | None:
    """Median over repeats of 1 - rate(with) / rate(none) within the same repeat: the
    two runs of a repeat are seconds apart, so a slow spell of the shared cores that
    lasts minutes (seen here: 2x) moves both."""
    per: dict[int, dict[int | None, float]] = {}
    for r in runs:
        if r["peer"] == peer and r["keys"] == keys and r["steady_records_per_s"]:
            per.setdefault(r["repeat"], {})[r["interval_ms"]] = r["steady_records_per_s"]
    ratios = [1 - p[interval] / p[None] for p in per.values() if None in p and interval in p]
    return round(100 * statistics.median(ratios), 1) if ratios else None


def checkpoint_cpu_pct(runs: list[dict[str, Any]]) -> float | None:
    """The CPU the keyed tasks spent on checkpoints over the CPU they spent on the rest
    (the records), median over runs: what checkpoints add to the CPU a record takes,
    measured inside the tasks (``weir.runtime.checkpoint_cpu``), so that the machine's
    speed, which moves both, cancels out."""
    shares = [100 * k / (c - k) for r in runs
              if (c := r.get("cpu_us_per_record")) and (k := r.get(
                  "checkpoint_cpu_us_per_record")) is not None and c > k]
    return round(statistics.median(shares), 2) if shares else None


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    groups = sorted({(r["peer"].removeprefix("weir-"), r["keys"]) for r in runs})
    for backend, keys in groups:
        base = base_cpu = None
        for interval in INTERVALS:
            def of_runs(interval: int | None = interval, backend: str = backend,
                        keys: int = keys) -> list[dict[str, Any]]:
                """Every run of this setting."""
                return [r for r in runs if r["peer"] == f"weir-{backend}"
                        and r["keys"] == keys and r["interval_ms"] == interval]

            def of(field: str) -> list[Any]:
                """``field`` of every run of this setting that has it."""
                return [r[field] for r in of_runs() if r.get(field)]

            rates, cpus, pauses = of("steady_records_per_s"), of("cpu_us_per_record"), of(
                "sync_ms")
            median = round(statistics.median(rates))
            cpu = statistics.median(cpus)
            base = median if interval is None else base
            base_cpu = cpu if interval is None else base_cpu
            assert base is not None and base_cpu is not None
            out.append({"backend": backend, "keys": keys, "checkpoints": _label(interval),
                        "interval_ms": interval, "median_records_per_s": median,
                        "runs_records_per_s": rates,
                        "overhead_pct": round(100 * (1 - median / base), 1),
                        "paired_overhead_pct": paired_overhead(
                            runs, f"weir-{backend}", keys, interval),
                        "median_cpu_us_per_record": round(cpu, 3), "runs_cpu_us_per_record": cpus,
                        "cpu_overhead_pct": round(100 * (cpu / base_cpu - 1), 1),
                        "checkpoint_cpu_pct": checkpoint_cpu_pct(of_runs()),
                        # the median run's p50; the worst run's p99
                        "sync_ms_p50": round(statistics.median(p["p50"] for p in pauses), 2)
                        if pauses else None,
                        "sync_ms_p99": max(p["p99"] for p in pauses) if pauses else None})
    return out


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(s["backend"], s["keys"]) for s in summary})
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(INTERVALS)
    for i, interval in enumerate(INTERVALS):
        values = [next(s["median_records_per_s"] for s in summary
                       if (s["backend"], s["keys"]) == g and s["interval_ms"] == interval)
                  for g in groups]
        ax.bar([x + i * width for x in range(len(groups))], values, width=width,
               label=f"checkpoints: {_label(interval)}")
    ax.set_xticks([x + width for x in range(len(groups))],
                  [f"{b}\n{k:,} keys" for b, k in groups], fontsize=8)
    ax.set_ylabel("median steady records/s")
    ax.set_title("continuous runtime: checkpoint overhead (p = 2)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
