"""Checkpoint costs: full vs incremental RocksDB checkpoints at 1% key churn, the
synchronous pause of the hash-map snapshot, restore throughput, and rescale vs restore.

Workloads (all on the local filesystem, one process = one core):

1. **incremental** — ``--keys`` keys (default 1M) in a RocksDB ValueState, one
   incremental checkpoint (the base), then 1% of the keys updated: the next
   incremental checkpoint's *uploaded* bytes vs a full (canonical) checkpoint of the
   same state. Target: ≤ 5%.
2. **sync-pause** — the hash-map backend with ``--keys`` int values (shared by
   reference) and with dict values (encoded in the synchronous part): the
   synchronous part of a snapshot (p50 / p99 over ``--repeat`` snapshots) and the
   asynchronous remainder; a blocking full snapshot for comparison.
3. **restore** — restore MB/s per core of a full checkpoint into each backend and of an
   incremental checkpoint into RocksDB; the raw limit for the RocksDB restore is a
   bare ``rocksdict`` write-batch load of the same entries, measured side by side.
   Target: ≥ 100 MB/s per core.
4. **rescale** — a checkpoint taken at parallelism 2, restored at 2 (plain restore)
   and at 4 (rescale): total seconds over all subtasks (the work, on one core) and
   the slowest subtask (the wall time when every subtask restores on its own core).
   Target: rescale ≤ 1.2 x plain.

Run: ``.venv/bin/python -m bench.checkpoint [--quick] [--keys N] [--repeat R]``.
Results: ``bench/results/checkpoint.json``; a markdown table is printed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import rocksdict
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from weir import CheckpointCoordinator, KeyedProcessFunction, ValueStateDescriptor, take_checkpoint
from weir.runtime.checkpointer import SubtaskCheckpointer
from weir.testing import KeyedOperatorHarness

RESULTS = Path(__file__).resolve().parent / "results"
MAX_PARALLELISM = 128
VALUE = ValueStateDescriptor("v")
#: value payloads (set from --value-bytes; random hex, so RocksDB's block compression
#: does not shrink them unrealistically): per-entry costs dominate with tiny values,
#: so MB/s is quoted for a stated entry size
PAYLOADS = [os.urandom(50).hex() for _ in range(1000)]


def payload(i: int) -> str:
    """The value written for key ``i``."""
    return PAYLOADS[i % len(PAYLOADS)]


class Store(KeyedProcessFunction[Any, Any]):
    """``(key, value)`` records: store ``value`` under ``key``."""

    def open(self, ctx: Any) -> None:
        self.state = ctx.get_state(VALUE)

    def process_element(self, value: Any, ctx: Any) -> None:
        self.state.update(value[1])


def _key(record: Any) -> Any:
    return record[0]


def _harness(backend: str, parallelism: int = 1, index: int = 0) -> KeyedOperatorHarness:
    h = KeyedOperatorHarness(
        Store(), _key, state_backend=backend, max_parallelism=MAX_PARALLELISM,
        parallelism=parallelism, subtask_index=index,
    )
    h.open()
    return h


def _fill(harnesses: list[KeyedOperatorHarness], keys: int, value: Any, progress: Any) -> None:
    """Write ``keys`` keys through the operators (each key to its owner)."""
    from weir.state.keygroups import assign_to_key_group, compute_operator_index_for_key_group

    p = len(harnesses)
    task = progress.add_task(f"fill {keys:,} keys (p={p})", total=keys)
    ops = [h.operator for h in harnesses]
    for i in range(keys):
        k = f"key-{i}"
        owner = 0 if p == 1 else compute_operator_index_for_key_group(
            MAX_PARALLELISM, p, assign_to_key_group(k, MAX_PARALLELISM))
        ops[owner].process_element((k, value(i)))
        if i % 50_000 == 0:
            progress.advance(task, 50_000 if i else 1)
    progress.update(task, completed=keys)


def _checkpoint(coord: CheckpointCoordinator, cps: list[SubtaskCheckpointer]) -> tuple[Any, float]:
    start = time.perf_counter()
    completed = take_checkpoint(coord, cps)
    return completed, time.perf_counter() - start


def _new_bytes(completed: Any) -> int:
    return sum(s.stats.new_bytes for op in completed.metadata.operators.values()
               for s in op.subtasks)


def bench_incremental(keys: int, progress: Any, tmp: Path) -> dict[str, Any]:
    h = _harness("rocksdb")
    _fill([h], keys, payload, progress)
    inc = CheckpointCoordinator(tmp / "inc", retained=2)
    full = CheckpointCoordinator(tmp / "full", retained=2)
    inc_cp = h.checkpointer(inc.storage, "incremental")
    full_cp = h.checkpointer(full.storage, "full")
    base, base_s = _checkpoint(inc, [inc_cp])
    churn = max(1, keys // 100)
    step = keys // churn
    for i in range(0, keys, step):
        h.operator.process_element((f"key-{i}", payload(i + 1)))
    second, inc_s = _checkpoint(inc, [inc_cp])
    full_ckpt, full_s = _checkpoint(full, [full_cp])
    h.close()
    out = {
        "keys": keys,
        "churned_keys": churn,
        "base_incremental_bytes": _new_bytes(base),
        "base_incremental_s": base_s,
        "incremental_uploaded_bytes": _new_bytes(second),
        "incremental_total_referenced_bytes": second.metadata.total_bytes,
        "incremental_s": inc_s,
        "full_bytes": full_ckpt.metadata.total_bytes,
        "full_s": full_s,
    }
    out["incremental_vs_full_bytes"] = out["incremental_uploaded_bytes"] / out["full_bytes"]
    return out


def bench_sync_pause(keys: int, repeat: int, progress: Any, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, value in (
        ("str values", payload),
        ("dict values", lambda i: {"n": i, "p": payload(i)}),
    ):
        h = _harness("hashmap")
        _fill([h], keys, value, progress)
        coord = CheckpointCoordinator(tmp / f"sync-{label[:3]}", retained=1)
        cp = h.checkpointer(coord.storage, "full")
        syncs, asyncs = [], []
        for n in range(repeat):
            gc.collect()
            pending = cp.snapshot(1000 + n, 0)
            syncs.append(pending.sync_ms)
            # keep processing while the upload runs: the point of the async part
            i = 0
            while not pending.future.done():
                h.operator.process_element((f"key-{i % keys}", value(i)))
                i += 1
            asyncs.append(pending.result().stats.async_ms)
        start = time.perf_counter()
        h.operator.snapshot(99)  # blocking canonical snapshot, for comparison
        blocking_ms = (time.perf_counter() - start) * 1000
        h.close()
        out[label] = {
            "sync_ms_p50": statistics.median(syncs),
            "sync_ms_p99": max(syncs) if len(syncs) < 100 else
            statistics.quantiles(syncs, n=100)[98],
            "async_ms_p50": statistics.median(asyncs),
            "blocking_snapshot_ms": blocking_ms,
        }
    return out


def _restore_time(completed: Any, backend: str, parallelism: int) -> tuple[float, float]:
    """Seconds to restore every subtask one after the other: (sum, slowest subtask).
    The sum is the work on one core; the slowest subtask is the wall time when each
    subtask restores on its own core, as it does in any runtime."""
    times = []
    for i in range(parallelism):
        gc.collect()
        start = time.perf_counter()
        h = KeyedOperatorHarness.restore(
            Store(), _key, completed, parallelism=parallelism, subtask_index=i,
            state_backend=backend, max_parallelism=MAX_PARALLELISM,
        )
        times.append(time.perf_counter() - start)
        h.close()
    return sum(times), max(times)


def _raw_rocksdb_load(completed: Any, tmp: Path) -> float:
    """The raw limit: read + verify the same files and load their entries into a bare
    rocksdict with write batches."""
    from weir.checkpoint.format import decode_keyed

    path = tmp / "raw-db"
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    start = time.perf_counter()
    db = rocksdict.Rdict(str(path), opts)
    wo = rocksdict.WriteOptions()
    wo.disable_wal = True
    for op in completed.metadata.operators.values():
        for sub in op.subtasks:
            data = completed.storage.read(sub.keyed.file)
            groups = decode_keyed(data, sub.keyed.key_groups, None, "raw")
            batch = rocksdict.WriteBatch(raw_mode=True)
            for per in groups.values():
                for entries in per.values():
                    for k, v in entries:
                        batch.put(k, v)
            db.write(batch, wo)
    elapsed = time.perf_counter() - start
    db.close()
    shutil.rmtree(path, ignore_errors=True)
    return elapsed


def bench_restore(keys: int, progress: Any, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    hs = [_harness("rocksdb", 2, i) for i in range(2)]
    _fill(hs, keys, payload, progress)
    full = CheckpointCoordinator(tmp / "r-full", retained=1)
    inc = CheckpointCoordinator(tmp / "r-inc", retained=1)
    full_ckpt, _ = _checkpoint(full, [h.checkpointer(full.storage, "full") for h in hs])
    inc_ckpt, _ = _checkpoint(inc, [h.checkpointer(inc.storage, "incremental") for h in hs])
    for h in hs:
        h.close()
    # MB/s is per MB of state (the canonical full checkpoint's size) for every row, so
    # the compressed SST files of the incremental checkpoint are compared fairly
    mb_full = mb_inc = full_ckpt.metadata.total_bytes / 1e6
    task = progress.add_task("restore / rescale", total=7)
    rows = {}
    for label, completed, backend, mb in (
        ("full -> rocksdb", full_ckpt, "rocksdb", mb_full),
        ("full -> hashmap", full_ckpt, "hashmap", mb_full),
        ("incremental -> rocksdb", inc_ckpt, "rocksdb", mb_inc),
    ):
        plain, plain_wall = _restore_time(completed, backend, 2)
        progress.advance(task)
        rescale, rescale_wall = _restore_time(completed, backend, 4)
        progress.advance(task)
        rows[label] = {
            "state_mb": mb,
            "checkpoint_mb": completed.metadata.total_bytes / 1e6,
            "restore_p2_s": plain,
            "restore_mb_per_s_per_core": mb / plain,
            "rescale_2_to_4_s": rescale,
            "rescale_vs_restore": rescale / plain,
            "restore_p2_slowest_subtask_s": plain_wall,
            "rescale_2_to_4_slowest_subtask_s": rescale_wall,
            "rescale_vs_restore_wall": rescale_wall / plain_wall,
        }
    raw = _raw_rocksdb_load(full_ckpt, tmp)
    progress.advance(task)
    rows["full -> rocksdb"]["raw_rocksdict_load_s"] = raw
    rows["full -> rocksdb"]["vs_raw_rocksdict_load"] = rows["full -> rocksdb"]["restore_p2_s"] / raw
    out.update(rows)
    return out


def print_results(doc: dict[str, Any]) -> None:
    console = Console()
    inc = doc["incremental"]
    t = Table(title=f"incremental vs full, RocksDB, {inc['keys']:,} keys, 1% churn")
    for col in ("checkpoint", "bytes uploaded", "seconds", "vs full bytes", "target"):
        t.add_column(col)
    t.add_row("full", f"{inc['full_bytes']:,}", f"{inc['full_s']:.2f}", "1", "")
    t.add_row("incremental (after churn)", f"{inc['incremental_uploaded_bytes']:,}",
              f"{inc['incremental_s']:.2f}", f"{inc['incremental_vs_full_bytes']:.2%}", "≤ 5%")
    console.print(t)
    t = Table(title="hash-map snapshot: synchronous pause")
    for col in ("values", "sync p50 ms", "sync p99 ms", "async p50 ms", "blocking snapshot ms"):
        t.add_column(col)
    for label, r in doc["sync_pause"].items():
        t.add_row(label, f"{r['sync_ms_p50']:.1f}", f"{r['sync_ms_p99']:.1f}",
                  f"{r['async_ms_p50']:.0f}", f"{r['blocking_snapshot_ms']:.0f}")
    console.print(t)
    params = doc["params"]
    t = Table(title=f"restore and rescale (p=2 checkpoint, {params['keys']:,} keys, "
              f"{params['value_bytes']}-byte values)")
    for col in ("restore", "state MB", "restore s", "state MB/s/core",
                "rescale 2→4 s", "rescale/restore (work)", "rescale/restore (wall)"):
        t.add_column(col)
    for label, r in doc["restore"].items():
        t.add_row(label, f"{r['state_mb']:.1f}", f"{r['restore_p2_s']:.2f}",
                  f"{r['restore_mb_per_s_per_core']:.0f}", f"{r['rescale_2_to_4_s']:.2f}",
                  f"{r['rescale_vs_restore']:.2f}", f"{r['rescale_vs_restore_wall']:.2f}")
    console.print(t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="100k keys, 5 repeats")
    args = p.parse_args(argv)
    if args.quick:
        args.keys, args.repeat = 100_000, 5
    PAYLOADS[:] = [os.urandom(args.value_bytes // 2).hex() for _ in range(1000)]
    tmp = Path(tempfile.mkdtemp(prefix="weir-bench-ckpt-"))
    try:
        with Progress() as progress:
            doc = {
                "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                            "cpus": os.cpu_count()},
                "params": {"keys": args.keys, "repeat": args.repeat,
                           "value_bytes": args.value_bytes},
                "incremental": bench_incremental(args.keys, progress, tmp),
                "sync_pause": bench_sync_pause(args.keys, args.repeat, progress, tmp),
                "restore": bench_restore(args.keys, progress, tmp),
            }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_results(doc)
    RESULTS.mkdir(exist_ok=True)
    name = "checkpoint_quick.json" if args.quick else "checkpoint.json"
    (RESULTS / name).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {RESULTS / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
