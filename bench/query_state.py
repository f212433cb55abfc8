"""Point lookups of state in a checkpoint (``weir.query_state``) at 1M keys: latency and
bytes read per lookup, against reading the whole state (``weir.read_state``) and the
raw limit (the one key group's bytes read by range and unpacked by hand).

A running count over ``--keys`` keys (default 1,000,000) in ``max_parallelism`` 128,
checkpointed as a full hash-map checkpoint, a hash-map changelog (a base plus a delta
of 1% of the keys) and a RocksDB incremental checkpoint, on the local filesystem. Per
checkpoint: ``query_state`` of 1 key and of 100 keys (median of ``--repeat`` runs, ms,
and the bytes read), ``read_state(...).keyed_state`` of everything once, and the raw
limit for the full checkpoint.

Run: ``.venv/bin/python -m bench.query_state [--quick] [--keys N] [--repeat R]``.
Results: ``bench/results/query_state.json`` and ``.png``; a markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

import weir
from weir.checkpoint.format import KeyedFullHandle
from weir.checkpoint.storage import storage_counts
from weir.state.keybytes import canonical_key_bytes
from weir.state.keygroups import assign_to_key_group
from weir.testing import KeyedOperatorHarness

RESULTS = Path(__file__).resolve().parent / "results"
MAXP = 128
COUNT = weir.ValueStateDescriptor[int]("count", weir.IntSerializer())


class Count(weir.KeyedProcessFunction[Any, Any]):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: Any, ctx: Any) -> None:
        self.count.update((self.count.value() or 0) + 1)


def build(kind: str, keys: int, root: Path) -> str:
    """A checkpoint of ``keys`` counts; returns its URL."""
    backend = "rocksdb" if kind == "rocksdb-incremental" else "hashmap"
    mode = {"hashmap-full": "full", "hashmap-changelog": "changelog",
            "rocksdb-incremental": "incremental"}[kind]
    coord = weir.CheckpointCoordinator(root / kind)
    with KeyedOperatorHarness(Count(), lambda k: k, uid="count", max_parallelism=MAXP,
                              state_backend=backend) as h:
        h.process_elements(f"key-{i}" for i in range(keys))
        done = h.checkpoint(coord, mode=mode)
        if mode != "full":
            h.process_elements(f"key-{i}" for i in range(0, keys, 100))  # 1% churn
            done = h.checkpoint(coord, mode=mode)
    return done.url


def timed(fn: Any, repeat: int) -> tuple[float, int]:
    """Median ms of ``fn()`` and the bytes one call reads."""
    times, read = [], 0
    for _ in range(repeat):
        before = storage_counts()
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
        read = (storage_counts() - before).read_bytes
    return statistics.median(times), read


def raw_limit(url: str, key: str) -> Any:
    """The key's group read by range from the full file and unpacked, the entry found:
    no metadata parse, no checks, no DataFrame."""
    completed = weir.load_checkpoint(url, verify=False)
    handle = completed.metadata.operators["count"].subtasks[0].keyed
    assert isinstance(handle, KeyedFullHandle)
    storage, path, index = completed.storage, handle.file.path, handle.key_groups

    def lookup() -> None:
        group = assign_to_key_group(key, MAXP)
        offset, length = index[group]
        body = msgpack.unpackb(storage.read_range(path, 10 + offset, length), raw=False)
        flat = body["count"]
        wanted = group.to_bytes(2, "big") + canonical_key_bytes(key)
        assert any(flat[i] == wanted for i in range(0, len(flat), 2))

    return lookup


def run(kind: str, keys: int, repeat: int, root: Path) -> dict[str, Any]:
    url = build(kind, keys, root)
    rng = random.Random(7)
    one = [f"key-{rng.randrange(keys)}"]
    hundred = [f"key-{rng.randrange(keys)}" for _ in range(100)]
    one_ms, one_bytes = timed(lambda: weir.query_state(url, "count", "count", one), repeat)
    many_ms, many_bytes = timed(lambda: weir.query_state(url, "count", "count", hundred),
                                repeat)
    whole_ms, whole_bytes = timed(
        lambda: weir.read_state(url).keyed_state("count", "count"), 1)
    out = {"checkpoint": kind, "keys": keys, "lookup_1_ms": round(one_ms, 2),
           "lookup_1_bytes": one_bytes, "lookup_100_ms": round(many_ms, 2),
           "lookup_100_bytes": many_bytes, "read_all_ms": round(whole_ms, 1),
           "read_all_bytes": whole_bytes}
    if kind == "hashmap-full":
        raw_ms, raw_bytes = timed(raw_limit(url, one[0]), repeat)
        out.update({"raw_limit_1_ms": round(raw_ms, 2), "raw_limit_1_bytes": raw_bytes})
    return out


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    fig, ax = plt.subplots(figsize=(8, 4))
    names = [r["checkpoint"] for r in runs]
    for i, (field, label) in enumerate([("lookup_1_ms", "query_state, 1 key"),
                                        ("lookup_100_ms", "query_state, 100 keys"),
                                        ("read_all_ms", "read_state, every key")]):
        ax.bar([j + i * 0.27 for j in range(len(runs))], [r[field] for r in runs], 0.27,
               label=label)
    ax.set_xticks([j + 0.27 for j in range(len(runs))], names)
    ax.set_yscale("log")
    ax.set_ylabel("ms (log)")
    ax.set_title(f"point lookups at {runs[0]['keys']:,} keys")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=21)
    p.add_argument("--quick", action="store_true", help="100k keys, 5 repeats")
    args = p.parse_args(argv)
    if args.quick:
        args.keys, args.repeat = 100_000, 5
    with tempfile.TemporaryDirectory(prefix="weir-bench-lookup-") as tmp:
        runs = [run(kind, args.keys, args.repeat, Path(tmp))
                for kind in ("hashmap-full", "hashmap-changelog", "rocksdb-incremental")]
    doc = {"benchmark": "query_state", "machine": {"python": platform.python_version(),
                                                   "platform": platform.platform()},
           "params": {"keys": args.keys, "repeat": args.repeat, "max_parallelism": MAXP},
           "runs": runs}
    print("| checkpoint | 1 key ms | bytes | 100 keys ms | bytes | whole state ms | bytes |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        print(f"| {r['checkpoint']} | {r['lookup_1_ms']} | {r['lookup_1_bytes']:,} | "
              f"{r['lookup_100_ms']} | {r['lookup_100_bytes']:,} | {r['read_all_ms']} | "
              f"{r['read_all_bytes']:,} |")
    raw = runs[0]
    print(f"raw limit (hash-map full, 1 key): {raw['raw_limit_1_ms']} ms, "
          f"{raw['raw_limit_1_bytes']:,} bytes")
    stem = "query_state_quick" if args.quick else "query_state"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, RESULTS / f"{stem}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
