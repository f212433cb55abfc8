"""End-to-end latency of the continuous runtime at a fixed input rate.

Two source subtasks emit ``--rate`` records/s in total (each record stamped with the
wall-clock time it was made: every task process is on this machine, one clock), keyed
over ``--keys`` keys into a running count in ``ValueState`` (p = 2), into a sink whose
writer notes ``now - stamp`` for every record it receives. Exactly-once checkpoints every
``--interval-ms`` (1 s) on both backends; the default channel buffer timeout (10 ms).
The window starts ``--warmup`` s after the job started (process start-up, cold state)
and covers ``--seconds`` s; reported: p50, p99, p99.9 and max in ms, and the records
the window saw. The micro-batch runtime's latency at a 1 s trigger is in
``bench/results/spark_keyed_count_latency.json`` (``bench.spark_keyed_count
--latency``).

Run: ``.venv/bin/python -m bench.continuous_latency [--quick]``. Results:
``bench/results/continuous_latency.json`` and ``.png``; a markdown table.
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

from pyspark import cloudpickle

import weir
from weir.api.connectors import Sink, SinkContext, SinkWriter, Source, SourceReader
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

RESULTS = Path(__file__).resolve().parent / "results"
COUNT = weir.ValueStateDescriptor[int]("count", weir.IntSerializer())


class Stamped(Source[list[float]]):
    """``[wall-clock seconds at creation, n]`` at ``rate`` records/s per subtask, for
    ``seconds`` s (positions: the next n)."""

    def __init__(self, rate: float, seconds: float, keys: int) -> None:
        self.rate, self.seconds, self.keys = rate, seconds, keys

    def reader(self, subtask: int, parallelism: int, positions: list[Any] | None
               ) -> SourceReader[list[float]]:
        return _StampedReader(self, subtask, parallelism)


class _StampedReader(SourceReader[list[float]]):
    def __init__(self, source: Stamped, subtask: int, parallelism: int) -> None:
        self.source, self.n, self.step = source, subtask, parallelism
        self.started = time.monotonic()
        self.emitted = 0

    def poll(self, max_records: int) -> list[list[float]] | None:
        elapsed = time.monotonic() - self.started
        if elapsed >= self.source.seconds:
            return None
        due = int(elapsed * self.source.rate) - self.emitted
        if due <= 0:
            time.sleep(min(0.001, 1 / self.source.rate))
            return []
        out = []
        for _ in range(min(due, max_records)):
            out.append([time.time(), self.n])
            self.n += self.step
        self.emitted += len(out)
        return out

    def positions(self) -> list[Any]:
        return [[self.n, self.step]]


class Count(weir.KeyedProcessFunction[list[float], list[float]]):
    def __init__(self, keys: int) -> None:
        self.keys = keys

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: list[float], ctx: Any) -> Any:
        self.count.update((self.count.value() or 0) + 1)
        yield value


class LatencySink(Sink[list[float]]):
    """Notes ``(stamp, latency)`` per record; each writer writes its notes to
    ``<directory>/<run>-<subtask>-<attempt>.json`` when it closes."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def writer(self, context: SinkContext) -> SinkWriter[list[float]]:
        return _LatencyWriter(self.directory, context)

    def commit(self, committables: list[Any]) -> None:
        pass

    def abort_attempts(self, context: SinkContext, keep: list[Any]) -> None:
        pass


class _LatencyWriter(SinkWriter[list[float]]):
    def __init__(self, directory: str, context: SinkContext) -> None:
        self.path = os.path.join(directory, f"{context.run_id}-{context.subtask}-"
                                            f"{context.attempt}.json")
        self.notes: list[tuple[float, float]] = []

    def write(self, record: list[float]) -> None:
        self.notes.append((record[0], time.time() - record[0]))

    def prepare_commit(self, checkpoint_id: int) -> Any:
        return None

    def close(self) -> None:
        with open(self.path, "w") as f:
            json.dump(self.notes, f)


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run(backend: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / f"latency-{backend}"
    out.mkdir()
    env = StreamEnvironment(parallelism=2, max_parallelism=128, state_backend=backend,
                            checkpoint_storage=work / f"chk-{backend}",
                            checkpointing=CheckpointConfig(interval_ms=args.interval_ms),
                            restart_strategy=RestartStrategy.no_restart())
    total = args.warmup + args.seconds
    (env.from_source(Stamped(args.rate / 2, total, args.keys), uid="stamped")
        .key_by(lambda r: int(r[1]) % args.keys)
        .process(Count(args.keys), uid="count")
        .sink_to(LatencySink(str(out)), uid="latency"))
    started = time.time()
    result = env.execute(f"latency-{backend}", timeout=total + 120)
    notes = [n for f in out.glob("*.json") for n in json.loads(f.read_text())]
    begin = started + args.warmup
    window = sorted(lat * 1000 for stamp, lat in notes if begin <= stamp < begin + args.seconds)
    return {
        "backend": backend, "rate": args.rate, "keys": args.keys,
        "interval_ms": args.interval_ms, "records_in_window": len(window),
        "checkpoints_completed": len(result.completed),
        "p50_ms": round(percentile(window, 0.50), 2),
        "p99_ms": round(percentile(window, 0.99), 2),
        "p999_ms": round(percentile(window, 0.999), 2),
        "max_ms": round(window[-1], 2),
        "load_after": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=10_000, help="records/s in total")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--interval-ms", type=int, default=1_000)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true", help="5 s window")
    args = parser.parse_args(argv)
    if args.quick:
        args.warmup, args.seconds = 3.0, 5.0
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rows = []
    with tempfile.TemporaryDirectory(prefix="weir-latency-") as tmp:
        for backend in ("hashmap", "rocksdb"):
            rows.append(run(backend, args, Path(tmp)))
    print("| backend | rate | checkpoints | records measured | p50 ms | p99 ms | "
          "p99.9 ms | max ms |\n|---|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['backend']} | {r['rate']:,}/s | every {r['interval_ms']} ms "
              f"({r['checkpoints_completed']} done) | {r['records_in_window']:,} | "
              f"{r['p50_ms']} | {r['p99_ms']} | {r['p999_ms']} | {r['max_ms']} |")
    RESULTS.mkdir(exist_ok=True)
    name = "continuous_latency_quick" if args.quick else "continuous_latency"
    (RESULTS / f"{name}.json").write_text(json.dumps({
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "args": vars(args), "rows": rows}, indent=2))
    plot(rows, RESULTS / f"{name}.png")
    return 0


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = ["p50_ms", "p99_ms", "p999_ms", "max_ms"]
    for i, r in enumerate(rows):
        ax.bar([x + i * 0.4 for x in range(len(names))], [r[n] for n in names], width=0.4,
               label=r["backend"])
    ax.set_xticks([x + 0.2 for x in range(len(names))], ["p50", "p99", "p99.9", "max"])
    ax.set_ylabel("end-to-end latency (ms)")
    ax.set_title(f"continuous runtime, {rows[0]['rate']:,} records/s, exactly-once, "
                 f"checkpoints every {rows[0]['interval_ms']} ms", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
