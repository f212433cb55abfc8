"""Live state lookups in a running continuous job: latency of ``JobClient.query_state``
(in the driver's process) and of ``weir.QueryableStateClient`` (over the job's endpoint,
TCP on loopback), while the job processes records.

The job: two source subtasks emitting ``--rate`` records/s in total, keyed over
``--keys`` keys into a running count in a queryable ``ValueState`` (p = 2), into a
``FileSink``, exactly-once checkpoints every second; on each backend. After a 3 s warm-up,
``--lookups`` lookups of random keys each way, one at a time; reported: p50 / p99 / max
in ms. A lookup goes client -> driver -> the owning task's control connection, is
answered between two buffers of the task's input, and back.

Run: ``.venv/bin/python -m bench.live_query [--quick]``. Results:
``bench/results/live_query.json`` and ``.png``; a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import weir
from bench.continuous_keyed_count import RESULTS
from weir.connectors.stream import FileSink, SequenceSource
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

COUNT = weir.ValueStateDescriptor[int]("count", weir.IntSerializer()).queryable("count")


class Count(weir.KeyedProcessFunction[int, list[int]]):
    """A running count per key, queryable as ``count``."""

    def __init__(self, keys: int) -> None:
        self.keys = keys

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: int, ctx: Any) -> Any:
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        yield [value % self.keys, count]


def _summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {"p50_ms": round(statistics.median(ordered), 3),
            "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))], 3),
            "max_ms": round(ordered[-1], 3), "lookups": len(ordered)}


def run(backend: str, rate: float, keys: int, lookups: int, root: Path) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(dir=root))
    env = StreamEnvironment(weir.JobConfig(work / "chk", parallelism=2, state_backend=backend,
                                           checkpointing=CheckpointConfig(interval=1000),
                                           restart_strategy=RestartStrategy.no_restart()))
    (env.from_source(SequenceSource(10**10, rate), uid="numbers")
        .key_by(lambda v, k=keys: v % k).process(Count(keys), uid="count")
        .sink_to(FileSink(work / "out"), uid="sink"))
    job = env.execute_async("live-query")
    rows = []
    try:
        time.sleep(3.0)
        pick = random.Random(7)
        with weir.QueryableStateClient(job.query_address, job.query_secret) as client:
            for way, ask in (("JobClient.query_state", lambda k: job.query_state("count",
                                                                                 "count", k)),
                             ("QueryableStateClient", lambda k: client.get("count", "count",
                                                                           k))):
                took = []
                for _ in range(lookups):
                    key = pick.randrange(keys)
                    started = time.perf_counter()
                    ask(key)
                    took.append((time.perf_counter() - started) * 1000)
                rows.append({"backend": backend, "way": way, "rate": rate, "keys": keys,
                             **_summary(took), "load": os.getloadavg()[0]})
                print(f"{backend}, {way}: {rows[-1]}", file=sys.stderr)
    finally:
        job.cancel()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=10_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--lookups", type=int, default=2_000)
    p.add_argument("--quick", action="store_true", help="300 lookups, hash map only")
    args = p.parse_args(argv)
    backends = ["hashmap"] if args.quick else ["hashmap", "rocksdb"]
    if args.quick:
        args.lookups = 300
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="weir-bench-live-query-") as tmp:
        for backend in backends:
            rows += run(backend, args.rate, args.keys, args.lookups, Path(tmp))
    print("| backend | lookup | p50 | p99 | max |\n|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['backend']} | `{r['way']}` | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms "
              f"| {r['max_ms']:.1f} ms |")
    doc = {"benchmark": "live_query",
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "cpus": os.cpu_count()},
           "params": {"rate": args.rate, "keys": args.keys, "lookups": args.lookups,
                      "parallelism": 2, "backends": backends},
           "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": rows}
    stem = "live_query" + ("_quick" if args.quick else "")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(rows, RESULTS / f"{stem}.png")
    return 0


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels = [f"{r['backend']}\n{r['way']}" for r in rows]
    xs = list(range(len(rows)))
    ax.bar([x - 0.2 for x in xs], [r["p50_ms"] for r in rows], width=0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], [r["p99_ms"] for r in rows], width=0.4, label="p99")
    ax.set_xticks(xs, labels, fontsize=7)
    ax.set_ylabel("lookup latency (ms)")
    ax.set_title("live state lookups in a running job (10,000 records/s, p = 2)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
