"""Bytewax peer of ``bench/continuous_keyed_count.py``: a running count per key.

The numbers ``0 .. N-1`` from a one-partition source (batches of ``--batch`` numbers,
its position the snapshot), keyed by ``str((n * 7919) % K)`` (Bytewax keys are strings;
the same keys as weir's bench), into ``stateful_map`` keeping the count (a Python int
per key in Bytewax's state); its output, one count per record, goes into a sink that
discards it. One worker (``run_main``: in this process and thread); ``--processes N``:
a cluster of N processes with one worker each (``cluster_main`` on loopback; the
source has N partitions, partition j emits j, j+N, …; this process is process 0 and
starts the others). ``--snapshot-ms``
> 0: recovery on (a SQLite recovery partition in a temporary directory, initialised
first) with an epoch, and so a state snapshot, every that many milliseconds; 0: no
recovery (Bytewax's default epoch, nothing written).

Run it with the peers' interpreter (``make peers``):
``.venv-peers/bin/python bench/peers/bytewax_count.py --records 1000000 --keys 200000``.
Prints one JSON line: ``records``, ``seconds`` (building and running the dataflow),
``records_per_s``. ``--marks DIR``: the mapper writes ``(monotonic time, records so
far)`` every ``--mark-every`` records into DIR (the caller computes a steady-state
rate from them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=1000, help="numbers per source batch")
    p.add_argument("--snapshot-ms", type=int, default=0, help="0: recovery off")
    p.add_argument("--marks", default=None, help="directory for progress marks")
    p.add_argument("--mark-every", type=int, default=20_000)
    add_cluster_arguments(p)
    args = p.parse_args(argv)
    try:
        import bytewax.operators as op
        from bytewax.dataflow import Dataflow
        from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
        from bytewax.outputs import DynamicSink, StatelessSinkPartition
    except ImportError as e:
        raise SystemExit(f"bytewax_count: cannot import Bytewax ({e}); run `make peers` and "
                         f"use .venv-peers/bin/python") from e

    records, keys, batch, procs = args.records, args.keys, args.batch, args.processes

    class Numbers(StatefulSourcePartition[int, int]):
        def __init__(self, first: int, at: int | None) -> None:
            self.at = first if at is None else at

        def next_batch(self) -> list[int]:
            if self.at >= records:
                raise StopIteration
            end = min(self.at + batch * procs, records)
            out = list(range(self.at, end, procs))
            self.at = out[-1] + procs
            return out

        def snapshot(self) -> int:
            return self.at

    class Sequence(FixedPartitionedSource[int, int]):
        def list_parts(self) -> list[str]:
            return [f"numbers-{j}" for j in range(procs)]

        def build_part(self, step_id: str, for_part: str, resume_state: int | None
                       ) -> Numbers:
            return Numbers(int(for_part.rsplit("-", 1)[1]), resume_state)

    class Discard(StatelessSinkPartition[Any]):
        def write_batch(self, items: list[Any]) -> None:
            pass

    class DiscardSink(DynamicSink[Any]):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Discard:
            return Discard()

    marks: list[tuple[float, int]] = []
    seen = [0]
    every = args.mark_every

    def count(state: int | None, _n: int) -> tuple[int, int]:
        c = 1 if state is None else state + 1
        seen[0] += 1
        if seen[0] % every == 0:
            marks.append((time.monotonic(), seen[0]))
        return c, c

    started = time.perf_counter()
    flow = Dataflow("weir_bench_count")
    numbers = op.input("numbers", flow, Sequence())
    keyed = op.key_on("key", numbers, lambda n: str((n * 7919) % keys))
    counts = op.stateful_map("count", keyed, count)
    op.output("discard", counts, DiscardSink())
    children, work = run_dataflow(flow, args, argv, __file__, subprocess.PIPE)
    if args.marks:
        (Path(args.marks) / f"bytewax-{args.proc_id}.json").write_text(json.dumps(marks))
    if args.addresses is not None:  # one of the other processes
        print(json.dumps({"seen": seen[0]}), flush=True)
        return 0
    total = seen[0]
    for child in children:
        out, _ = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"bytewax_count: process exited {child.returncode}")
        total += json.loads(out.strip().splitlines()[-1])["seen"]
    seconds = time.perf_counter() - started
    shutil.rmtree(work, ignore_errors=True)
    if total != records:
        raise SystemExit(f"bytewax_count: counted {total} records, expected {records}")
    print(json.dumps({"peer": "bytewax", "records": records, "keys": keys,
                      "processes": procs, "seconds": round(seconds, 2),
                      "records_per_s": round(records / seconds)}), flush=True)
    return 0


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """``--processes`` and the arguments the main process gives the others."""
    p.add_argument("--processes", type=int, default=1, help="a cluster of N processes")
    p.add_argument("--proc-id", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--addresses", default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)


def run_dataflow(flow: Any, args: argparse.Namespace, argv: list[str] | None, script: str,
                 stdout: int | None = None) -> tuple[list[subprocess.Popen[str]], Path]:
    """Run ``flow`` as process ``args.proc_id`` of ``args.processes`` (``cluster_main`` on
    loopback; ``run_main`` for one), with recovery on and an epoch every
    ``args.snapshot_ms`` when > 0. The main process first starts the others (``script``
    again with this run's arguments, their output to ``stdout``). Returns those others
    (none but in the main process) and the recovery directory."""
    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.testing import cluster_main, run_main

    procs = args.processes
    work = Path(args.work or tempfile.mkdtemp(prefix="weir-bench-bytewax-"))
    addresses: list[str] = []
    if procs > 1:
        addresses = args.addresses.split(",") if args.addresses else [
            f"127.0.0.1:{_free_port()}" for _ in range(procs)]
    children: list[subprocess.Popen[str]] = []
    if args.addresses is None:  # the main process
        if args.snapshot_ms > 0:
            init_db_dir(work, procs)
        for k in range(1, procs):
            children.append(subprocess.Popen(
                [sys.executable, script, *(argv if argv is not None else sys.argv[1:]),
                 "--proc-id", str(k), "--addresses", ",".join(addresses),
                 "--work", str(work)], stdout=stdout, text=True))
    options: dict[str, Any] = {}
    if args.snapshot_ms > 0:
        options = {"epoch_interval": timedelta(milliseconds=args.snapshot_ms),
                   "recovery_config": RecoveryConfig(work)}
    if procs > 1:
        cluster_main(flow, addresses, args.proc_id, **options)
    else:
        run_main(flow, **options)
    return children, work


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    raise SystemExit(main())
