"""The continuous runtime on the main workload, side by side with its peers: a running
count per key, 1,000,000 records over ``--keys`` keys (10,000 and 200,000).

* weir: p = 2 (two source tasks, two keyed tasks: four processes), on both backends,
  with exactly-once checkpoints every second and with none during the run (the final
  checkpoint only): the checkpoint overhead;
* the raw limits: one Python process counting the same records in a dict, and in a
  bare ``rocksdict`` (a get and a put per record, WAL off) — no channels, no state
  backend, no checkpoints;
* the peers (``--peers``, on when ``.venv-peers`` exists: ``make peers`` installs them
  there, never into ``.venv``), each a script under ``bench/peers/`` run with
  ``.venv-peers/bin/python`` in a subprocess, on the same records (``0 .. N-1``, key
  ``(n * 7919) % K``) and the same count: PyFlink 2.3 (Python ``KeyedProcessFunction``
  with a ``ValueState``, parallelism 2, thread mode; checkpointing off and exactly-once
  every 1 s) and Bytewax 0.21 (``stateful_map``; one worker, and a cluster of two
  processes with one worker each, ``bytewax-2``; recovery off, and on with an epoch, so
  a snapshot, every 1 s).

Times include start-up, as a user's run has it: weir's from ``execute()`` (it starts
the task processes, forked from a zygote that imports weir first) to its end;
PyFlink's from starting its JVM to the end of ``execute()``; Bytewax's from building the
dataflow to the end of ``run_main`` (with two processes: from starting the second to
the end of both).
Besides, a steady-state rate: the keyed function of every run notes (monotonic time,
records so far) every ``records / 50`` records; steady records/s = the records all
keyed subtasks counted in the window where every one of them is between its first and
last note, over the window's length (interpolated between notes). Start-up, the first
``records / 50`` records of each subtask and the end are outside it. Each ratio is
weir's records/s over the peer's, at the same key count and checkpoint setting (no
checkpoints during the run for weir, PyFlink and Bytewax alike; weir's final
checkpoint is in its time). "checkpoints completed": weir's count; PyFlink's last
checkpoint id (its directory keeps the last one). Every peer and weir first run once on
20,000 records, unmeasured (cold caches, JIT). The load average before and after each
run is kept: the machines here are shared.

Latency at a fixed rate is ``bench/continuous_latency``.

``--runner spark``: weir runs also on Spark (``runner="spark"``: the same four tasks as
a barrier stage of a ``local[4]`` SparkSession, rows ``weir-<backend>-on-spark``),
beside the local runner in the same run; results in ``continuous_keyed_count_spark``.

Run: ``.venv/bin/python -m bench.continuous_keyed_count [--quick] [--keys 10000,200000]
[--no-peers] [--runner spark]`` (``make bench-continuous`` installs the peers first).
Results: ``bench/results/continuous_keyed_count.json`` and ``.png``; a markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

import weir
from weir.connectors import FileSink, SequenceSource
from weir.runtime.checkpoint_cpu import checkpoint_cpu_ns
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PEERS_DIR = ROOT / "bench" / "peers"
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
PEERS = ("pyflink", "bytewax", "bytewax-2")  # bytewax-2: a cluster of 2 processes
COUNT = weir.ValueStateDescriptor[int]("count", weir.IntSerializer())
Marks = list[tuple[float, int]]
#: (monotonic time, records so far, CPU seconds of the whole task process so far, of
#: which on checkpoints: ``weir.runtime.checkpoint_cpu``)
CpuMarks = list[tuple[float, int, float, float]]


class Count(weir.KeyedProcessFunction[int, Any]):
    """A running count per key; emits nothing (the sink stays out of the measure).
    Notes (time, records so far, the task process's CPU time so far: every thread,
    the snapshot uploads' too, and of it the checkpoints') every ``every`` records
    into ``marks_dir``."""

    def __init__(self, marks_dir: str | None = None, every: int = 20_000) -> None:
        self.marks_dir, self.every = marks_dir, every

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)
        self.n = 0
        self.marks: CpuMarks = []

    def process_element(self, value: int, ctx: Any) -> None:
        self.count.update((self.count.value() or 0) + 1)
        self.n += 1
        if self.n % self.every == 0:
            self.marks.append((time.monotonic(), self.n, time.process_time(),
                               checkpoint_cpu_ns() / 1e9))

    def close(self) -> None:
        if self.marks_dir:
            path = Path(self.marks_dir) / f"weir-{os.getpid()}-{id(self):x}.json"
            path.write_text(json.dumps(self.marks))


def steady_rate(subtasks: Sequence[Marks]) -> float | None:
    """Records/s of all subtasks together in the window where each is between its
    first and last mark (counts interpolated linearly between marks); None when there
    is no such window."""
    if not subtasks or any(len(m) < 2 for m in subtasks):
        return None
    lo = max(m[0][0] for m in subtasks)
    hi = min(m[-1][0] for m in subtasks)
    if hi - lo <= 0:
        return None

    def at(m: Marks, t: float) -> float:
        for (t0, n0), (t1, n1) in itertools.pairwise(m):
            if t0 <= t <= t1:
                return n0 + (n1 - n0) * (t - t0) / (t1 - t0) if t1 > t0 else float(n1)
        raise ValueError("time outside the marks")

    return sum(at(m, hi) - at(m, lo) for m in subtasks) / (hi - lo)


def read_marks(directory: Path) -> float | None:
    subtasks = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    rate = steady_rate([[(float(t), int(n)) for t, n, *_ in m] for m in subtasks if m])
    return None if rate is None else round(rate)


def read_cpu(directory: Path, field: int = 2) -> float | None:
    """CPU µs per record of the keyed task processes in the steady window (the one of
    :func:`read_marks`): their CPU time there over the records they counted there.
    Less noisy than a rate on shared cores: another process's load slows a run but
    adds little to the CPU time its records take. ``field=3``: only the CPU time the
    processes spent on checkpoints (``weir.runtime.checkpoint_cpu``), which a slow
    spell of the shared cores moves together with the rest."""
    subtasks = [[(float(t), int(n), float(c), float(k)) for t, n, c, k in json.loads(
        p.read_text())] for p in sorted(directory.glob("*.json"))]
    if not subtasks or any(len(m) < 2 for m in subtasks):
        return None
    lo, hi = max(m[0][0] for m in subtasks), min(m[-1][0] for m in subtasks)
    if hi <= lo:
        return None

    def at(m: CpuMarks, t: float, field: int) -> float:
        for a, b in itertools.pairwise(m):
            if a[0] <= t <= b[0]:
                share = (t - a[0]) / (b[0] - a[0]) if b[0] > a[0] else 1.0
                return a[field] + (b[field] - a[field]) * share
        raise ValueError("time outside the marks")

    records = sum(at(m, hi, 1) - at(m, lo, 1) for m in subtasks)
    cpu = sum(at(m, hi, field) - at(m, lo, field) for m in subtasks)
    return round(cpu / records * 1e6, 3) if records > 0 else None


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def weir_run(records: int, keys: int, backend: str, interval_ms: int | None,
             root: Path, spark: Any = None, snapshot: str | None = None) -> dict[str, Any]:
    """One continuous job (on ``spark``'s executors if given); its throughput and
    checkpoints."""
    work = Path(tempfile.mkdtemp(dir=root))
    marks = work / "marks"
    marks.mkdir()
    env = StreamEnvironment(weir.JobConfig(work / "chk", parallelism=2, state_backend=backend,
                                           checkpointing=CheckpointConfig(interval=interval_ms,
                                                                          snapshot=snapshot),
                                           restart_strategy=RestartStrategy.no_restart()))
    (env.from_source(SequenceSource(records), uid="numbers")
        .key_by(lambda n, k=keys: (n * 7919) % k)
        .process(Count(str(marks), max(1, records // 50)), uid="count")
        .sink_to(FileSink(work / "out"), uid="sink"))
    load = _load()
    started = time.perf_counter()
    client = env.execute_async("bench", runner="local" if spark is None else "spark",
                               spark=spark)
    result = client.wait()
    seconds = time.perf_counter() - started
    return {"peer": f"weir-{backend}" + (f"-{snapshot}" if snapshot else "")
            + ("" if spark is None else "-on-spark"),
            "sync_ms": sync_pauses(client.checkpoints(), "count"),
            "checkpoints": "1 s" if interval_ms else "final only",
            "interval_ms": interval_ms, "keys": keys, "records": records,
            "seconds": round(seconds, 2), "records_per_s": round(records / seconds),
            "steady_records_per_s": read_marks(marks), "cpu_us_per_record": read_cpu(marks),
            "checkpoint_cpu_us_per_record": read_cpu(marks, field=3),
            "completed": len(result.completed),
            "load": [load, _load()]}


def sync_pauses(history: Sequence[Any], vertex: str) -> dict[str, float] | None:
    """The synchronous pause of ``vertex``'s tasks per checkpoint (the snapshot's part
    in the task thread; ``JobClient.checkpoints()``): p50, p99 and max in ms, over
    every subtask of every checkpoint acknowledged (None: none)."""
    pauses = sorted(s.sync_ms for c in history for s in c.subtasks if s.vertex == vertex)
    if not pauses:
        return None

    def at(q: float) -> float:
        return round(float(pauses[min(len(pauses) - 1, int(q * len(pauses)))]), 2)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(pauses[-1], 2)}


def raw_limit(records: int, keys: int) -> dict[str, Any]:
    """One process, a dict: the Python floor of the same per-record work."""
    counts: dict[int, int] = {}
    load = _load()
    started = time.perf_counter()
    for n in range(records):
        key = (n * 7919) % keys
        counts[key] = counts.get(key, 0) + 1
    seconds = time.perf_counter() - started
    return {"peer": "dict (raw limit, 1 process)", "checkpoints": "none", "interval_ms": None,
            "keys": keys, "records": records, "seconds": round(seconds, 2),
            "records_per_s": round(records / seconds), "steady_records_per_s": None,
            "completed": 0, "load": [load, _load()]}


def raw_limit_rocksdb(records: int, keys: int, root: Path) -> dict[str, Any]:
    """One process, a bare ``rocksdict`` (WAL off, its default options): a get and a
    put of an 8-byte count per record, the floor of the RocksDB backend's work."""
    import rocksdict

    db = rocksdict.Rdict(tempfile.mkdtemp(dir=root), rocksdict.Options(raw_mode=True))
    write = rocksdict.WriteOptions()
    write.disable_wal = True  # type: ignore[method-assign,assignment]
    db.set_write_options(write)
    names = [k.to_bytes(8, "big") for k in range(keys)]
    get, put = db.get, db.put
    load = _load()
    started = time.perf_counter()
    for n in range(records):
        key = names[(n * 7919) % keys]
        old = get(key)
        put(key, (1 if old is None else int.from_bytes(old, "big") + 1).to_bytes(8, "big"))
    seconds = time.perf_counter() - started
    db.close()
    return {"peer": "rocksdict (raw limit, 1 process)", "checkpoints": "none",
            "interval_ms": None, "keys": keys, "records": records,
            "seconds": round(seconds, 2), "records_per_s": round(records / seconds),
            "steady_records_per_s": None, "completed": 0, "load": [load, _load()]}


def peer_run(peer: str, records: int, keys: int, interval_ms: int | None, root: Path,
             timeout: float) -> dict[str, Any]:
    """``bench/peers/<peer>_count.py`` with the peers' interpreter; its JSON line, or
    the error (the tail of its stderr) when it fails."""
    marks = Path(tempfile.mkdtemp(dir=root))
    flag = "--checkpoint-ms" if peer == "pyflink" else "--snapshot-ms"
    script, _, processes = peer.partition("-")
    cmd = [str(PEERS_PYTHON), str(PEERS_DIR / f"{script}_count.py"), "--records",
           str(records), "--keys", str(keys), flag, str(interval_ms or 0), "--marks",
           str(marks), "--mark-every", str(max(1, records // 50)),
           *(["--processes", processes] if processes else [])]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    row: dict[str, Any] = {
        "peer": peer, "interval_ms": interval_ms, "keys": keys, "records": records,
        "checkpoints": ("1 s" if peer == "pyflink" else "1 s epochs (snapshots)")
        if interval_ms else "off", "command": " ".join(cmd[1:])}
    load = _load()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timed out after {timeout:.0f} s"}
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        return {**row, "error": f"exit {done.returncode}: {tail or done.stdout[-2000:]}"}
    out = json.loads(lines[-1])
    return {**row, "seconds": out["seconds"], "records_per_s": out["records_per_s"],
            "steady_records_per_s": read_marks(marks),
            "completed": out.get("checkpoints"), "startup_s": out.get("startup_s"),
            "load": [load, _load()]}


def peer_versions() -> dict[str, str | None]:
    code = ("import json, importlib.metadata as m\n"
            "def v(n):\n"
            "    try:\n        return m.version(n)\n"
            "    except m.PackageNotFoundError:\n        return None\n"
            "print(json.dumps({n: v(n) for n in ('apache-flink', 'bytewax', 'pemja')}))")
    try:
        out = subprocess.run([str(PEERS_PYTHON), "-c", code], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        versions: dict[str, str | None] = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    java = subprocess.run(["java", "-version"], capture_output=True, text=True)
    versions["java"] = (java.stderr.splitlines() or [""])[0]
    return versions


def ratio(weir_row: dict[str, Any] | None, row: dict[str, Any]) -> str:
    """``weir ÷ row`` on job time (and on steady rates when both have one)."""
    if weir_row is None or not row.get("records_per_s"):
        return ""
    text = f"{weir_row['records_per_s'] / row['records_per_s']:.3g}x"
    a, b = weir_row.get("steady_records_per_s"), row.get("steady_records_per_s")
    if a and b:
        text += f" (steady {a / b:.3g}x)"
    return text


def match(runs: list[dict[str, Any]], backend: str, row: dict[str, Any]) -> dict[str, Any] | None:
    return next((r for r in runs if r["peer"] == f"weir-{backend}" and r["keys"] == row["keys"]
                 and r["interval_ms"] == row["interval_ms"]), None)


def print_table(runs: list[dict[str, Any]]) -> None:
    print("| keys | run | checkpoints | records/s | seconds | steady records/s | "
          "checkpoints completed | weir-hashmap ÷ this | weir-rocksdb ÷ this |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        mine = r["peer"].startswith("weir")
        if "error" in r:
            print(f"| {r['keys']:,} | {r['peer']} | {r['checkpoints']} | failed: "
                  f"{r['error'].splitlines()[-1][:120]} | | | | | |")
            continue
        steady = f"{r['steady_records_per_s']:,}" if r.get("steady_records_per_s") else ""
        done = "" if r.get("completed") is None else r["completed"]
        cells = ["", ""] if mine else [ratio(match(runs, b, r), r) for b in ("hashmap", "rocksdb")]
        print(f"| {r['keys']:,} | {r['peer']} | {r['checkpoints']} | {r['records_per_s']:,} | "
              f"{r['seconds']} | {steady} | {done} | {cells[0]} | {cells[1]} |")


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in doc["runs"] if "error" not in r]
    key_counts = sorted({r["keys"] for r in runs})
    names = [n for n in ("weir-hashmap", "weir-rocksdb", "weir-hashmap-on-spark",
                         "weir-rocksdb-on-spark", *PEERS)
             if any(r["peer"] == n for r in runs)]
    fig, axes = plt.subplots(1, len(key_counts), figsize=(5.5 * len(key_counts), 4.5),
                             sharey=True, squeeze=False)
    width = 0.38
    for ax, keys in zip(axes[0], key_counts, strict=True):
        for j, (interval, label, color) in enumerate(
                ((None, "no checkpoints during the run", "tab:blue"),
                 (1000, "checkpoints / snapshots every 1 s", "tab:orange"))):
            xs, ys, steady = [], [], []
            for i, name in enumerate(names):
                r = next((r for r in runs if r["peer"] == name and r["keys"] == keys
                          and r["interval_ms"] == interval), None)
                if r is not None:
                    xs.append(i + (j - 0.5) * width)
                    ys.append(r["records_per_s"])
                    steady.append(r.get("steady_records_per_s"))
            ax.bar(xs, ys, width, label=label, color=color)
            pts = [(x, s) for x, s in zip(xs, steady, strict=True) if s]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="_", s=300,
                           color="black", zorder=3,
                           label="steady state (start-up and end left out)" if j == 0 else None)
        raw = next((r for r in runs if r["peer"].startswith("dict") and r["keys"] == keys), None)
        title = f"{keys:,} keys"
        if raw is not None:
            title += f" (a bare dict, 1 process: {raw['records_per_s'] / 1e6:.1f} M/s)"
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("records/s (job time, start-up included)")
    axes[0][0].legend(fontsize=7, loc="upper right")
    fig.suptitle(f"keyed running count, {doc['params']['records']:,} records:\nweir's "
                 "continuous runtime (p = 2) vs PyFlink (p = 2, thread mode) and Bytewax "
                 "(1 worker; bytewax-2: 2 processes)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _int_list(s: str) -> list[int]:
    return [int(x.replace("_", "")) for x in s.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--keys", type=_int_list, default=[10_000, 200_000],
                   help="comma-separated key counts (default 10000,200000)")
    p.add_argument("--quick", action="store_true", help="200k records, 10k keys")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction,
                   default=PEERS_PYTHON.exists(),
                   help="run PyFlink and Bytewax too (default: when .venv-peers exists)")
    p.add_argument("--peer-timeout", type=float, default=1200, help="seconds per peer run")
    p.add_argument("--warmup-records", type=int, default=20_000,
                   help="an unmeasured run of weir and of each peer first (0: none)")
    p.add_argument("--runner", choices=("local", "spark"), default="local",
                   help="spark: weir also on a local[4] SparkSession, beside the local runner")
    args = p.parse_args(argv)
    key_counts = [10_000] if args.quick else args.keys
    records = 200_000 if args.quick else args.records
    if args.peers and not PEERS_PYTHON.exists():
        p.error(f"--peers: {PEERS_PYTHON} is missing; run `make peers` first")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = None
    if args.runner == "spark":
        from bench.spark_keyed_count import spark_session

        spark = spark_session("2g", "local[4]")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="weir-bench-continuous-") as tmp:
        root = Path(tmp)
        if args.warmup_records:
            weir_run(args.warmup_records, 1000, "hashmap", None, root)
            if spark is not None:
                weir_run(args.warmup_records, 1000, "hashmap", None, root, spark)
            for peer in PEERS if args.peers else ():
                peer_run(peer, args.warmup_records, 1000, None, root, args.peer_timeout)
        for keys in key_counts:
            runs.append(raw_limit(records, keys))
            runs.append(raw_limit_rocksdb(records, keys, root))
            for backend in ("hashmap", "rocksdb"):
                for interval in (None, 1000):
                    runs.append(weir_run(records, keys, backend, interval, root))
                    if spark is not None:
                        runs.append(weir_run(records, keys, backend, interval, root, spark))
            for peer in PEERS if args.peers else ():
                for interval in (None, 1000):
                    row = peer_run(peer, records, keys, interval, root, args.peer_timeout)
                    if "error" in row:
                        print(f"{peer} failed ({row['command']}):\n{row['error']}",
                              file=sys.stderr)
                    runs.append(row)
    doc = {"benchmark": "continuous_keyed_count",
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "cpus": os.cpu_count(),
                       "peers": peer_versions() if args.peers else None},
           "params": {"records": records, "keys": key_counts, "parallelism": 2,
                      "runner": args.runner,
                      "peers": list(PEERS) if args.peers else [],
                      "warmup_records": args.warmup_records},
           "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": runs}
    print_table(runs)
    stem = "continuous_keyed_count" + ("_spark" if spark is not None else "") + (
        "_quick" if args.quick else "")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, RESULTS / f"{stem}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
