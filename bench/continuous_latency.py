"""End-to-end latency of the continuous runtime at a fixed input rate, beside its peers.

Two source subtasks emit ``--rates`` records/s in total (1,000 and 10,000; each record
stamped with the wall-clock time it was made: every process is on this machine, one
clock), keyed over ``--keys`` keys into a running count in ``ValueState`` (p = 2), into a
sink whose writer notes ``now - stamp`` for every record it receives. Exactly-once
checkpoints every ``--interval-ms`` (1 s) on both backends; the default channels (10 ms
buffer timeout, a partial buffer sent as soon as its task is idle).

The peers (``--peers``, on when ``.venv-peers`` exists: ``make peers``) run the same
shape with the peers' interpreter, each a script under ``bench/peers/``: PyFlink 2.3
(``pyflink_latency.py``: thread mode, p = 2, exactly-once checkpoints every 1 s, tuned
for latency with a 10 ms buffer timeout and 10 ms Python bundles) and Bytewax 0.21
(``bytewax_latency.py``: one worker, and two processes as ``bytewax-2``; recovery on with
a 1 s epoch).

The window starts ``--warmup`` s after the first record was stamped (process start-up,
cold state) and covers ``--seconds`` s; reported: p50, p99, p99.9 and max in ms, and
the records the window saw. A runtime that cannot keep up with a rate shows it as a
latency that grows over the window. The micro-batch runtime's latency at a 1 s trigger
is in ``bench/results/spark_keyed_count_latency.json`` (``bench.spark_keyed_count
--latency``).

``--runner spark``: weir's tasks run as a barrier-mode stage of a ``local[4]``
SparkSession (``runner="spark"``); results in ``continuous_latency_spark.json``. On the
same session and at the same rates and keys (``--micro-batch``, on by default there),
the micro-batch runtimes as ``bench.spark_keyed_count --latency`` measures them (parquet
files dropped 10 times a second, each row stamped when its file was made; latency =
when ``foreachBatch`` sees the row minus the stamp): ``weir.spark.process`` (hash map) and
Spark's ``transformWithState`` (RocksDB state store), each with a processing-time
trigger of 1 s and of 100 ms (rows ``<peer>-trigger-<ms>ms``).

Run: ``.venv/bin/python -m bench.continuous_latency [--quick] [--rates 1000,10000]
[--no-peers] [--runner spark]``. Results: ``bench/results/continuous_latency.json``
and ``.png``; a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

import weir
from bench.continuous_keyed_count import PEERS, PEERS_DIR, PEERS_PYTHON, ROOT, peer_versions
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


def summary(notes: list[tuple[float, float]], args: argparse.Namespace) -> dict[str, Any]:
    """Percentiles of the latencies of the records stamped in the window: from
    ``--warmup`` s after the first stamp, for ``--seconds`` s."""
    if not notes:
        return {"records_in_window": 0, "error": "no record reached the sink"}
    begin = min(stamp for stamp, _ in notes) + args.warmup
    window = sorted(lat * 1000 for stamp, lat in notes if begin <= stamp < begin + args.seconds)
    if not window:
        return {"records_in_window": 0, "error": "no record in the window"}
    return {
        "records_in_window": len(window),
        "p50_ms": round(percentile(window, 0.50), 2),
        "p99_ms": round(percentile(window, 0.99), 2),
        "p999_ms": round(percentile(window, 0.999), 2),
        "max_ms": round(window[-1], 2),
    }


def read_notes(directory: Path) -> list[tuple[float, float]]:
    return [(n[0], n[1]) for f in directory.glob("*.json") for n in json.loads(f.read_text())]


def run(backend: str, rate: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / f"latency-{backend}-{rate}"
    out.mkdir()
    env = StreamEnvironment(
        weir.JobConfig(
            work / f"chk-{backend}-{rate}",
            parallelism=2,
            max_parallelism=128,
            state_backend=backend,
            checkpointing=CheckpointConfig(interval=args.interval_ms),
            restart_strategy=RestartStrategy.no_restart(),
        )
    )
    total = args.warmup + args.seconds
    (env.from_source(Stamped(rate / 2, total, args.keys), uid="stamped")
        .key_by(lambda r, keys=args.keys: int(r[1]) % keys)
        .process(Count(args.keys), uid="count")
        .sink_to(LatencySink(str(out)), uid="latency"))
    result = env.execute(f"latency-{backend}", timeout=total + 120,
                         runner=args.runner, spark=args.spark)
    name = f"weir-{backend}" + ("-on-spark" if args.runner == "spark" else "")
    return {"peer": name, "rate": rate, "keys": args.keys,
            "interval_ms": args.interval_ms,
            "checkpoints_completed": len(result.completed),
            **summary(read_notes(out), args), "load_after": os.getloadavg()}


def peer_run(peer: str, rate: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``bench/peers/<peer>_latency.py`` with the peers' interpreter."""
    notes = work / f"notes-{peer}-{rate}"
    notes.mkdir()
    script, _, processes = peer.partition("-")
    flag = "--checkpoint-ms" if script == "pyflink" else "--snapshot-ms"
    cmd = [str(PEERS_PYTHON), str(PEERS_DIR / f"{script}_latency.py"), "--rate", str(rate),
           "--seconds", str(args.warmup + args.seconds), "--keys", str(args.keys), flag,
           str(args.interval_ms), "--notes", str(notes),
           *(["--processes", processes] if processes else [])]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    row: dict[str, Any] = {"peer": peer, "rate": rate, "keys": args.keys,
                           "interval_ms": args.interval_ms, "command": " ".join(cmd[1:])}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=args.warmup + args.seconds + 300)
    except subprocess.TimeoutExpired:
        return {**row, "records_in_window": 0, "error": "timed out"}
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        return {**row, "records_in_window": 0, "error": f"exit {done.returncode}: {tail}"}
    return {**row, **summary(read_notes(notes), args), "load_after": os.getloadavg()}


#: (peer of bench.spark_keyed_count, processing-time trigger ms) for --micro-batch
MICRO_BATCH = (("weir-hashmap", 1000), ("weir-hashmap", 100), ("tws-row", 1000),
               ("tws-row", 100))


def micro_batch_run(peer: str, trigger_ms: int, rate: int, args: argparse.Namespace,
                    work: Path) -> dict[str, Any]:
    """A micro-batch runtime on the same session (``bench.spark_keyed_count``'s latency
    run, the trigger set to ``trigger_ms``)."""
    from bench.spark_keyed_count import run_latency

    settings = argparse.Namespace(
        latency_keys=args.keys, latency_source="files", files_per_second=10,
        latency_warmup=args.warmup, latency_seconds=args.seconds, latency_grace=60.0,
        latency_trigger_ms=trigger_ms, verbose=False)
    r = run_latency(args.spark, peer, rate, settings, work)
    row = {"peer": f"{peer}-trigger-{trigger_ms}ms", "rate": rate, "keys": args.keys,
           "trigger_ms": trigger_ms, "records_in_window": r.get("rows_measured", 0),
           **{k: r[k] for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms", "kept_up",
                                "batch_ms_p50", "error") if k in r}}
    return row


def _ints(s: str) -> list[int]:
    return [int(x.replace("_", "")) for x in s.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=_ints, default=[1_000, 10_000],
                        help="records/s in total, comma-separated (default 1000,10000)")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--interval-ms", type=int, default=1_000)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true", help="5 s window")
    parser.add_argument("--runner", choices=("local", "spark"), default="local",
                        help="spark: weir's tasks as a barrier stage of a local[4] "
                             "SparkSession (the peers are unchanged)")
    parser.add_argument("--micro-batch", action=argparse.BooleanOptionalAction, default=None,
                        help="with --runner spark (default there): the micro-batch "
                             "runtimes on the same session")
    parser.add_argument("--peers", action=argparse.BooleanOptionalAction,
                        default=PEERS_PYTHON.exists(),
                        help="run PyFlink and Bytewax too (default: when .venv-peers exists)")
    args = parser.parse_args(argv)
    if args.quick:
        args.warmup, args.seconds = 3.0, 5.0
    if args.peers and not PEERS_PYTHON.exists():
        parser.error(f"--peers: {PEERS_PYTHON} is missing; run `make peers` first")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    args.spark = None
    if args.micro_batch is None:
        args.micro_batch = args.runner == "spark"
    if args.micro_batch and args.runner != "spark":
        parser.error("--micro-batch runs on the Spark session of --runner spark")
    if args.runner == "spark":
        from bench.spark_keyed_count import spark_session

        # the executors import weir from this interpreter; transformWithState's store:
        # RocksDB
        args.spark = spark_session("2g", "local[4]")
    rows = []
    with tempfile.TemporaryDirectory(prefix="weir-latency-") as tmp:
        for rate in args.rates:
            for backend in ("hashmap", "rocksdb"):
                rows.append(run(backend, rate, args, Path(tmp)))
            for peer in PEERS if args.peers else ():
                rows.append(peer_run(peer, rate, args, Path(tmp)))
                if "error" in rows[-1]:
                    print(f"{peer} failed: {rows[-1]['error']}", file=sys.stderr)
            for peer, trigger_ms in MICRO_BATCH if args.micro_batch else ():
                rows.append(micro_batch_run(peer, trigger_ms, rate, args, Path(tmp)))
                if "error" in rows[-1]:
                    print(f"{rows[-1]['peer']} failed: {rows[-1]['error']}", file=sys.stderr)
    print("| runtime | rate | records measured | p50 ms | p99 ms | p99.9 ms | max ms |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        cells = [r.get(k, "-") for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms")]
        print(f"| {r['peer']} | {r['rate']:,}/s | {r['records_in_window']:,} | "
              + " | ".join(str(c) for c in cells) + " |")
    RESULTS.mkdir(exist_ok=True)
    name = "continuous_latency" + ("_spark" if args.runner == "spark" else "") + (
        "_quick" if args.quick else "")
    (RESULTS / f"{name}.json").write_text(json.dumps({
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "peers": peer_versions() if args.peers else None},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "args": {k: v for k, v in vars(args).items() if k != "spark"}, "rows": rows},
        indent=2))
    plot(rows, RESULTS / f"{name}.png")
    return 0


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["rate"] for r in rows})
    fig, axes = plt.subplots(1, len(rates), figsize=(5 * len(rates), 3.5), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=True):
        at = [r for r in rows if r["rate"] == rate and "p50_ms" in r]
        xs = range(len(at))
        ax.bar([x - 0.2 for x in xs], [r["p50_ms"] for r in at], width=0.4, label="p50")
        ax.bar([x + 0.2 for x in xs], [r["p99_ms"] for r in at], width=0.4, label="p99")
        ax.set_xticks(list(xs), [r["peer"] for r in at], rotation=20, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("end-to-end latency (ms)")
        ax.set_title(f"{rate:,} records/s, checkpoints every "
                     f"{rows[0]['interval_ms']} ms", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
