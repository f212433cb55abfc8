"""Bytewax peer of ``bench/continuous_keyed_count.py``: a running count per key.

The numbers ``0 .. N-1`` from a one-partition source (batches of ``--batch`` numbers,
its position the snapshot), keyed by ``str((n * 7919) % K)`` (Bytewax keys are strings;
the same keys as weir's bench), into ``stateful_map`` keeping the count (a Python int
per key in Bytewax's state); its output, one count per record, goes into a sink that
discards it. One worker (``run_main``: in this process and thread). ``--snapshot-ms``
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
    args = p.parse_args(argv)
    try:
        import bytewax.operators as op
        from bytewax.dataflow import Dataflow
        from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
        from bytewax.outputs import DynamicSink, StatelessSinkPartition
        from bytewax.recovery import RecoveryConfig, init_db_dir
        from bytewax.testing import run_main
    except ImportError as e:
        raise SystemExit(f"bytewax_count: cannot import Bytewax ({e}); run `make peers` and "
                         f"use .venv-peers/bin/python") from e

    records, keys, batch = args.records, args.keys, args.batch

    class Numbers(StatefulSourcePartition[int, int]):
        def __init__(self, at: int | None) -> None:
            self.at = at or 0

        def next_batch(self) -> list[int]:
            if self.at >= records:
                raise StopIteration
            end = min(self.at + batch, records)
            out = list(range(self.at, end))
            self.at = end
            return out

        def snapshot(self) -> int:
            return self.at

    class Sequence(FixedPartitionedSource[int, int]):
        def list_parts(self) -> list[str]:
            return ["numbers"]

        def build_part(self, step_id: str, for_part: str, resume_state: int | None
                       ) -> Numbers:
            return Numbers(resume_state)

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

    work = Path(tempfile.mkdtemp(prefix="weir-bench-bytewax-"))
    started = time.perf_counter()
    flow = Dataflow("weir_bench_count")
    numbers = op.input("numbers", flow, Sequence())
    keyed = op.key_on("key", numbers, lambda n: str((n * 7919) % keys))
    counts = op.stateful_map("count", keyed, count)
    op.output("discard", counts, DiscardSink())
    if args.snapshot_ms > 0:
        init_db_dir(work, 1)
        run_main(flow, epoch_interval=timedelta(milliseconds=args.snapshot_ms),
                 recovery_config=RecoveryConfig(work))
    else:
        run_main(flow)
    seconds = time.perf_counter() - started
    shutil.rmtree(work, ignore_errors=True)
    if seen[0] != records:
        raise SystemExit(f"bytewax_count: counted {seen[0]} records, expected {records}")
    if args.marks:
        (Path(args.marks) / "bytewax.json").write_text(json.dumps(marks))
    print(json.dumps({"peer": "bytewax", "records": records, "keys": keys,
                      "seconds": round(seconds, 2),
                      "records_per_s": round(records / seconds)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
