"""Checkpoints under backpressure (the vicious circle of aligned checkpoints): the last
stage of a job slowed step by step, and how long checkpoints take — aligned, unaligned,
and aligned with a timeout that switches to unaligned — as the backlog grows.

The job: two source subtasks (``SequenceSource``, as fast as they may send) keyed over
1,000 keys into a running count in ``ValueState`` whose function sleeps 1 ms every
``k`` records (``--slowdowns``, per keyed subtask: none, then 20 k/s, 5 k/s, 2 k/s,
1 k/s), chained to a two-phase-commit ``FileSink``; p = 2, hash map, checkpoints every
second, the default channels (512-record buffers, 2 exclusive + 8 floating credits). Each
setting runs ``--seconds`` s (the first 2 s not measured) and reports the median and
maximum end-to-end duration of the checkpoints triggered in the window, the bytes of
records in flight they stored, and the sources' time backpressured
(``JobClient.metrics()``). Target (issue 14): unaligned and aligned-with-timeout stay at
most 1 s while aligned grows with the backlog.

Run: ``.venv/bin/python -m bench.backpressure [--quick] [--seconds S]``. Results:
``bench/results/backpressure.json`` and ``.png``; a markdown table.
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

import weir
from bench.continuous_keyed_count import RESULTS
from weir.connectors.stream import FileSink, SequenceSource
from weir.stream import CheckpointConfig, CheckpointStatus, RestartStrategy, StreamEnvironment

#: checkpointing modes compared: name -> CheckpointConfig settings
MODES: dict[str, dict[str, Any]] = {
    "aligned": {},
    "unaligned": {"unaligned": True},
    "aligned, 200 ms timeout": {"unaligned": True, "aligned_timeout_ms": 200},
}
COUNT = weir.ValueStateDescriptor[int]("count", weir.IntSerializer())


class SlowCount(weir.KeyedProcessFunction[int, list[int]]):
    """A running count per key that sleeps 1 ms every ``every`` records (0: never)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.n = 0

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: int, ctx: Any) -> Any:
        self.n += 1
        if self.every and self.n % self.every == 0:
            time.sleep(0.001)
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        yield [value % 1000, count]


def run(mode: str, every: int, seconds: float, root: Path) -> dict[str, Any]:
    """One setting: the checkpoints triggered after the warm-up, and backpressure."""
    work = Path(tempfile.mkdtemp(dir=root))
    env = StreamEnvironment(
        weir.JobConfig(
            work / "chk",
            parallelism=2,
            checkpointing=CheckpointConfig(interval=1000, **MODES[mode]),
            restart_strategy=RestartStrategy.no_restart(),
        )
    )
    (env.from_source(SequenceSource(10**10), uid="numbers")
        .key_by(lambda v: v % 1000).process(SlowCount(every), uid="count")
        .sink_to(FileSink(work / "out"), uid="sink"))
    job = env.execute_async("backpressure")
    started = time.time() * 1000
    warm = started + 2000
    pressured: list[float] = []
    time.sleep(2.0)
    deadline = time.monotonic() + seconds - 2
    while time.monotonic() < deadline:
        time.sleep(1.0)
        sources = [m for m in job.metrics() if m.vertex == "numbers"]
        if sources:
            pressured.append(statistics.mean(m.backpressured for m in sources))
    end = time.time() * 1000
    time.sleep(min(30.0, 2 + 3 * max(1.0, _latest_duration_s(job))))  # let them finish
    stats = [s for s in job.checkpoints() if warm <= s.trigger_timestamp_ms <= end]
    job.cancel()
    done = [s for s in stats if s.status is CheckpointStatus.COMPLETED]
    durations = [s.duration_ms or 0.0 for s in done]
    return {"mode": mode, "sleep_every": every, "triggered": len(stats), "completed": len(done),
            "failed": sum(s.status is CheckpointStatus.FAILED for s in stats),
            "median_ms": round(statistics.median(durations), 1) if durations else None,
            "max_ms": round(max(durations), 1) if durations else None,
            "median_in_flight_bytes": round(statistics.median(
                [s.channel_state_bytes or 0 for s in done])) if done else None,
            "backpressured": round(statistics.mean(pressured), 3) if pressured else None,
            "load": os.getloadavg()[0]}


def _latest_duration_s(job: Any) -> float:
    done = [s for s in job.checkpoints() if s.duration_ms is not None]
    return (done[-1].duration_ms or 0) / 1000 if done else 1.0


def _label(every: int) -> str:
    return "not slowed" if not every else f"1 ms sleep / {every} records"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--slowdowns", default="0,50,20,5,2,1",
                   help="sleep 1 ms every k records (0: never)")
    p.add_argument("--quick", action="store_true", help="3 slowdowns, 8 s each")
    args = p.parse_args(argv)
    slowdowns = [int(x) for x in args.slowdowns.split(",")]
    if args.quick:
        args.seconds, slowdowns = 8.0, [0, 5, 1]
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rows = []
    with tempfile.TemporaryDirectory(prefix="weir-bench-backpressure-") as tmp:
        for every in slowdowns:
            for mode in MODES:
                row = run(mode, every, args.seconds, Path(tmp))
                rows.append(row)
                print(f"{_label(every)}, {mode}: checkpoints median {row['median_ms']} ms, "
                      f"max {row['max_ms']} ms ({row['completed']}/{row['triggered']}), "
                      f"in flight {row['median_in_flight_bytes']} B, sources backpressured "
                      f"{row['backpressured']}", file=sys.stderr)
    print("| last stage | sources backpressured | " + " | ".join(
        f"{m}: median / max" for m in MODES) + " |")
    print("|---|---:|" + "---:|" * len(MODES))
    for every in slowdowns:
        cells = []
        pressure = None
        for mode in MODES:
            row = next(r for r in rows if r["sleep_every"] == every and r["mode"] == mode)
            pressure = row["backpressured"] if mode == "aligned" else pressure
            cells.append("-" if row["median_ms"] is None else
                         f"{row['median_ms']:,.0f} / {row['max_ms']:,.0f} ms"
                         + ("" if not row["failed"] else f" ({row['failed']} failed)"))
        shown = "-" if pressure is None else f"{100 * pressure:.0f}%"
        print(f"| {_label(every)} | {shown} | " + " | ".join(cells) + " |")
    doc = {"benchmark": "backpressure",
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "cpus": os.cpu_count()},
           "params": {"seconds": args.seconds, "slowdowns": slowdowns, "parallelism": 2,
                      "interval_ms": 1000, "modes": MODES},
           "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": rows}
    stem = "backpressure" + ("_quick" if args.quick else "")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(rows, slowdowns, RESULTS / f"{stem}.png")
    return 0


def plot(rows: list[dict[str, Any]], slowdowns: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = list(range(len(slowdowns)))
    for mode in MODES:
        ys = [next((r["median_ms"] for r in rows
                    if r["sleep_every"] == every and r["mode"] == mode), None) or 0
              for every in slowdowns]
        ax.plot(xs, [y / 1000 for y in ys], marker="o", label=mode)
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xticks(xs, [_label(e).replace(" / ", "/\n") for e in slowdowns], fontsize=7)
    ax.set_ylabel("median checkpoint duration (s)")
    ax.set_yscale("log")
    ax.set_title("continuous runtime: checkpoints as the last stage slows (p = 2)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
