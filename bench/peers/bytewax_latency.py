"""Bytewax peer of ``bench/continuous_latency.py``: end-to-end latency at a fixed rate.

A one-partition source emits ``--rate`` records/s for ``--seconds`` s, each record
``[wall-clock seconds at creation, n]`` (paced with ``next_awake``, as Bytewax asks,
never sleeping in ``next_batch``), keyed by ``str(n % K)`` into ``stateful_map`` keeping
a count per key, into a sink whose ``write_batch`` notes ``(stamp, now - stamp)`` per
record. ``--processes N``: a cluster of N processes with one worker each (``cluster_main``
on loopback, N source partitions at ``rate / N`` each). ``--snapshot-ms`` > 0: recovery
on with an epoch, so a snapshot, every that many milliseconds (the peer of weir's
exactly-once checkpoints); 0: no recovery.

Run it with the peers' interpreter (``make peers``): ``.venv-peers/bin/python
bench/peers/bytewax_latency.py --rate 10000 --seconds 35 --notes DIR``. Each process
writes its notes to ``DIR/bytewax-<process>.json``; the caller computes percentiles.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

try:
    from bytewax_count import add_cluster_arguments, run_dataflow
except ImportError:  # imported as bench.peers.bytewax_latency
    from bench.peers.bytewax_count import add_cluster_arguments, run_dataflow


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=10_000, help="records/s in total")
    p.add_argument("--seconds", type=float, default=35.0)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--snapshot-ms", type=int, default=1000, help="0: recovery off")
    p.add_argument("--notes", required=True, help="directory for the latency notes")
    add_cluster_arguments(p)
    args = p.parse_args(argv)
    try:
        import bytewax.operators as op
        from bytewax.dataflow import Dataflow
        from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
        from bytewax.outputs import DynamicSink, StatelessSinkPartition
    except ImportError as e:
        raise SystemExit(f"bytewax_latency: cannot import Bytewax ({e}); run `make peers` "
                         f"and use .venv-peers/bin/python") from e

    procs, keys = args.processes, args.keys
    per_partition = args.rate / procs
    notes: list[tuple[float, float]] = []

    class Stamped(StatefulSourcePartition[list[float], int]):
        def __init__(self, first: int, at: int | None) -> None:
            self.n = first if at is None else at
            self.started = time.monotonic()
            self.emitted = 0

        def next_batch(self) -> list[list[float]]:
            elapsed = time.monotonic() - self.started
            if elapsed >= args.seconds:
                raise StopIteration
            due = int(elapsed * per_partition) - self.emitted
            out = []
            for _ in range(max(0, due)):
                out.append([time.time(), float(self.n)])
                self.n += procs
            self.emitted += len(out)
            return out

        def next_awake(self) -> datetime:
            # the next record is due at (emitted + 1) / rate after the start
            wait = (self.emitted + 1) / per_partition - (time.monotonic() - self.started)
            return datetime.now(UTC) + timedelta(seconds=max(0.0, wait))

        def snapshot(self) -> int:
            return self.n

    class Source(FixedPartitionedSource[list[float], int]):
        def list_parts(self) -> list[str]:
            return [f"stamped-{j}" for j in range(procs)]

        def build_part(self, step_id: str, for_part: str, resume_state: int | None
                       ) -> Stamped:
            return Stamped(int(for_part.rsplit("-", 1)[1]), resume_state)

    class Note(StatelessSinkPartition[Any]):
        def write_batch(self, items: list[Any]) -> None:
            now = time.time()
            for _key, record in items:
                notes.append((record[0], now - record[0]))

    class LatencySink(DynamicSink[Any]):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Note:
            return Note()

    def count(state: int | None, record: list[float]) -> tuple[int, list[float]]:
        return (1 if state is None else state + 1), record

    flow = Dataflow("weir_bench_latency")
    stamped = op.input("stamped", flow, Source())
    keyed = op.key_on("key", stamped, lambda r: str(int(r[1]) % keys))
    counts = op.stateful_map("count", keyed, count)
    op.output("latency", counts, LatencySink())
    children, work = run_dataflow(flow, args, argv, __file__)
    (Path(args.notes) / f"bytewax-{args.proc_id}.json").write_text(json.dumps(notes))
    for child in children:
        if child.wait() != 0:
            raise SystemExit(f"bytewax_latency: process exited {child.returncode}")
    if args.addresses is None:  # the main process
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
