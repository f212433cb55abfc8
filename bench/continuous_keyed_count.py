"""The continuous runtime on the main workload: a running count per key, 1,000,000
records over ``--keys`` keys (10,000 and 200,000), p = 2 (two source tasks, two keyed
tasks: four processes), exactly-once checkpoints every second against none (the
checkpoint overhead), on both backends; side by side in the same run, the raw limit:
one Python process counting the same records in a dict (no channels, no state
backend, no checkpoints).

Not yet here (issue 12): the peers (PyFlink 2.3 thread mode, Bytewax 0.21) installed by
``make bench-continuous``, and latency at a fixed rate. Job times include starting the
task processes (about a second), as a user's run does.

Run: ``.venv/bin/python -m bench.continuous_keyed_count [--quick]``.
Results: ``bench/results/continuous_keyed_count.json`` and ``.png``; a markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

import weir
from weir.connectors import FileSink, SequenceSource
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

RESULTS = Path(__file__).resolve().parent / "results"
COUNT = weir.ValueStateDescriptor[int]("count", weir.IntSerializer())


class Count(weir.KeyedProcessFunction[int, Any]):
    """A running count per key; emits nothing (the sink stays out of the measure)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: int, ctx: Any) -> None:
        self.count.update((self.count.value() or 0) + 1)


def weir_run(records: int, keys: int, backend: str, interval_ms: int | None,
             root: Path) -> dict[str, Any]:
    """One continuous job; its throughput and checkpoints."""
    work = Path(tempfile.mkdtemp(dir=root))
    env = StreamEnvironment(
        parallelism=2, state_backend=backend, checkpoint_storage=work / "chk",
        checkpointing=CheckpointConfig(interval_ms=interval_ms),
        restart_strategy=RestartStrategy.no_restart())
    (env.from_source(SequenceSource(records), uid="numbers")
        .key_by(lambda n, k=keys: (n * 7919) % k)
        .process(Count(), uid="count")
        .sink_to(FileSink(work / "out"), uid="sink"))
    started = time.perf_counter()
    result = env.execute("bench")
    seconds = time.perf_counter() - started
    return {"peer": f"weir-{backend}", "checkpoints": "1 s" if interval_ms else "final only",
            "keys": keys, "records": records, "seconds": round(seconds, 2),
            "records_per_s": round(records / seconds), "completed": len(result.completed)}


def raw_limit(records: int, keys: int) -> dict[str, Any]:
    """One process, a dict: the Python floor of the same per-record work."""
    counts: dict[int, int] = {}
    started = time.perf_counter()
    for n in range(records):
        key = (n * 7919) % keys
        counts[key] = counts.get(key, 0) + 1
    seconds = time.perf_counter() - started
    return {"peer": "dict (raw limit, 1 process)", "checkpoints": "none", "keys": keys,
            "records": records, "seconds": round(seconds, 2),
            "records_per_s": round(records / seconds), "completed": 0}


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in doc["runs"] if r["peer"].startswith("weir")]
    labels = [f"{r['peer'][5:]}\n{r['checkpoints']}\n{r['keys'] // 1000}k keys" for r in runs]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(range(len(runs)), [r["records_per_s"] for r in runs])
    ax.set_xticks(range(len(runs)), labels, fontsize=8)
    ax.set_ylabel("records/s")
    ax.set_title("continuous runtime: keyed count, 1M records, p = 2 (local)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--quick", action="store_true", help="200k records, 10k keys")
    args = p.parse_args(argv)
    key_counts = [10_000] if args.quick else [10_000, 200_000]
    records = 200_000 if args.quick else args.records
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    runs = []
    with tempfile.TemporaryDirectory(prefix="weir-bench-continuous-") as tmp:
        for keys in key_counts:
            runs.append(raw_limit(records, keys))
            for backend in ("hashmap", "rocksdb"):
                for interval in (None, 1000):
                    runs.append(weir_run(records, keys, backend, interval, Path(tmp)))
    doc = {"benchmark": "continuous_keyed_count",
           "machine": {"python": platform.python_version(), "platform": platform.platform()},
           "params": {"records": records, "parallelism": 2}, "runs": runs}
    print("| keys | peer | checkpoints | records/s | seconds | checkpoints completed |")
    print("|---:|---|---|---:|---:|---:|")
    for r in runs:
        print(f"| {r['keys']:,} | {r['peer']} | {r['checkpoints']} | {r['records_per_s']:,} | "
              f"{r['seconds']} | {r['completed']} |")
    stem = "continuous_keyed_count_quick" if args.quick else "continuous_keyed_count"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, RESULTS / f"{stem}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
