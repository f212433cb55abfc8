"""Typed records in state (issue 41): snapshot and restore of a value state of
``--records`` keys holding a dataclass (``RecordSerializer``) vs the same fields as
dicts under the default ``MsgpackSerializer``, side by side in one run.

Each key ``i`` holds ``Card(card=f"card-{i}", count=i, total=i / 4, flagged=i % 2 == 0,
note=None or a str)`` — or the dict of those fields. The states are filled through the
operator's state directly (``set_current_key`` + ``update``, no process_element), then:

* **snapshot** — ``KeyedOperatorHarness.snapshot()``: a blocking full snapshot (for the
  hash map every value is encoded by its serializer here; RocksDB copies its stored
  bytes);
* **restore** — ``KeyedOperatorHarness.restore(...)`` of that snapshot into a new
  harness whose function registers the state in ``open`` (the hash map decodes every
  value then; RocksDB loads the bytes).

* **restore, migrating** — the record snapshot restored with the next version of the
  class (``CardNext``: a field added with a default), which rewrites every stored
  record during the restore (issue 41: "costs about what a restore costs").

Best of ``--repeat``; the two serializers alternate (which goes first flips every
repeat) so machine noise hits both. Target (hash map): record <= 2x msgpack dicts, for
both the snapshot and the restore.

Run: ``.venv/bin/python -m bench.record_state [--records N] [--repeat R]
[--backends hashmap,rocksdb]``. Results: ``bench/results/record_state.json`` and
``.png``; see bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from weir import KeyedProcessFunction, RecordSerializer, ValueStateDescriptor
from weir.api.serializers import MsgpackSerializer
from weir.testing import KeyedOperatorHarness

from .state_ops import machine_info

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 2.0  # max record / msgpack-dict time (hash map), snapshot and restore


@dataclass
class Card:
    card: str
    count: int
    total: float
    flagged: bool
    note: str | None


@dataclass
class CardNext:
    """``Card``'s next version: a field added with a default."""

    card: str
    count: int
    total: float
    flagged: bool
    note: str | None
    limit: float = 500.0


def card_of(i: int) -> Card:
    return Card(f"card-{i}", i, i / 4, i % 2 == 0, None if i % 3 else f"note {i}")


def dict_of(i: int) -> dict[str, Any]:
    return {"card": f"card-{i}", "count": i, "total": i / 4, "flagged": i % 2 == 0,
            "note": None if i % 3 else f"note {i}"}


SERIALIZERS: dict[str, tuple[Any, Any]] = {
    "record": (RecordSerializer(Card), card_of),
    "msgpack dict": (MsgpackSerializer(), dict_of),
}


class Holds(KeyedProcessFunction[Any, Any]):
    """Registers the value state in ``open`` (a restore decodes into it there)."""

    def __init__(self, descriptor: ValueStateDescriptor[Any]) -> None:
        self.descriptor = descriptor

    def open(self, ctx: Any) -> None:
        self.state = ctx.get_state(self.descriptor)

    def process_element(self, value: Any, ctx: Any) -> None:
        return None


def _key(element: Any) -> Any:
    return element


def _harness(kind: str, backend: str, workdir: Path) -> KeyedOperatorHarness:
    serializer = SERIALIZERS[kind][0]
    path = workdir / f"{kind.replace(' ', '-')}-{backend}" if backend == "rocksdb" else None
    return KeyedOperatorHarness(Holds(ValueStateDescriptor("card", serializer)), _key,
                                state_backend=backend, rocksdb_path=path)


def _fill(h: KeyedOperatorHarness, kind: str, records: int) -> None:
    h.open()
    op = h.operator
    state = op.function.state  # type: ignore[union-attr]
    setk, make = op.key_context.set_current_key, SERIALIZERS[kind][1]
    for i in range(records):
        setk(i)
        state.update(make(i))


def _timed(fn: Any) -> tuple[float, Any]:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        out = fn()
        return time.perf_counter() - start, out
    finally:
        gc.enable()


def _restore(kind: str, backend: str, snapshot: Any, path: Path | None,
             serializer: Any = None) -> KeyedOperatorHarness:
    descriptor = ValueStateDescriptor("card", serializer or SERIALIZERS[kind][0])
    return KeyedOperatorHarness.restore(
        Holds(descriptor), _key, [snapshot], parallelism=1, subtask_index=0,
        state_backend=backend, rocksdb_path=path)


def _size(snapshot: Any) -> int | None:
    body = getattr(getattr(snapshot.keyed, "groups", None), "body", None)
    return None if body is None else len(body)


def measure(records: int, repeat: int, backends: list[str], workdir: Path
            ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend in backends:
        harnesses = {}
        for kind in SERIALIZERS:
            harnesses[kind] = h = _harness(kind, backend, workdir)
            fill_s, _ = _timed(partial(_fill, h, kind, records))
            print(f"  {backend}: filled {records:,} {kind} values in {fill_s:.1f} s")
        best: dict[str, dict[str, float]] = {k: {"snapshot_s": float("inf"),
                                                 "restore_s": float("inf")}
                                             for k in SERIALIZERS}
        migrating_s = float("inf")
        sizes: dict[str, int | None] = {}
        for rep in range(repeat):
            kinds = list(SERIALIZERS) if rep % 2 == 0 else list(reversed(SERIALIZERS))
            for kind in kinds:
                snap_s, snapshot = _timed(harnesses[kind].snapshot)
                sizes[kind] = _size(snapshot)
                path = (workdir / f"restored-{kind.replace(' ', '-')}-{rep}"
                        if backend == "rocksdb" else None)
                restore_s, restored = _timed(partial(_restore, kind, backend, snapshot, path))
                state = restored.operator.function.state
                restored.operator.key_context.set_current_key(records - 1)
                assert state.value() == SERIALIZERS[kind][1](records - 1)
                restored.close()
                if kind == "record":
                    path = None if path is None else path.with_name(path.name + "-next")
                    took, restored = _timed(partial(_restore, kind, backend, snapshot, path,
                                                    RecordSerializer(CardNext)))
                    restored.operator.key_context.set_current_key(records - 1)
                    assert restored.operator.function.state.value().limit == 500.0
                    restored.close()
                    migrating_s = min(migrating_s, took)
                    print(f"  {backend} {kind:>12} #{rep + 1}: restore migrating to "
                          f"CardNext {took:6.2f} s")
                del snapshot, restored
                cur = best[kind]
                cur["snapshot_s"] = min(cur["snapshot_s"], snap_s)
                cur["restore_s"] = min(cur["restore_s"], restore_s)
                print(f"  {backend} {kind:>12} #{rep + 1}: snapshot {snap_s:6.2f} s, "
                      f"restore {restore_s:6.2f} s")
        for h in harnesses.values():
            h.close()
        rec, dic = best["record"], best["msgpack dict"]
        out[backend] = {
            "record": {**rec, "snapshot_bytes": sizes["record"]},
            "msgpack dict": {**dic, "snapshot_bytes": sizes["msgpack dict"]},
            "snapshot_ratio": rec["snapshot_s"] / dic["snapshot_s"],
            "restore_ratio": rec["restore_s"] / dic["restore_s"],
            "restore_migrating_s": migrating_s,
            "migrating_ratio": migrating_s / rec["restore_s"],
        }
    return out


def print_rich(results: dict[str, Any], records: int) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"value state of {records:,} keys: record vs msgpack dict (best of runs)")
    for col in ("backend", "step", "record s", "msgpack dict s", "ratio", "target"):
        t.add_column(col, justify="left" if col in ("backend", "step") else "right")
    for backend, row in results.items():
        for step in ("snapshot", "restore"):
            ratio = row[f"{step}_ratio"]
            target = f"<= {TARGET:g}x" if backend == "hashmap" else "-"
            verdict = "" if backend != "hashmap" else (
                " [green]pass[/]" if ratio <= TARGET else " [red]FAIL[/]")
            t.add_row(backend, step, f"{row['record'][f'{step}_s']:.2f}",
                      f"{row['msgpack dict'][f'{step}_s']:.2f}", f"{ratio:.2f}x",
                      target + verdict)
    Console(width=max(Console().width, 100)).print(t)
    for backend, row in results.items():
        print(f"{backend}: restore migrating every record to CardNext "
              f"{row['restore_migrating_s']:.2f} s = {row['migrating_ratio']:.2f}x the "
              f"record restore")


def plot(results: dict[str, Any], records: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{b}\n{step}\nrecord / dict {results[b][f'{step}_ratio']:.2f}x"
              for b in results for step in ("snapshot", "restore")]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.38
    for i, (kind, color) in enumerate((("record", "tab:blue"),
                                       ("msgpack dict", "tab:gray"))):
        values = [results[b][kind][f"{step}_s"] for b in results
                  for step in ("snapshot", "restore")]
        xs = [j + (i - 0.5) * width for j in range(len(labels))]
        bars = ax.bar(xs, values, width, label=kind, color=color)
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("seconds (best of runs)")
    ax.set_title(f"value state of {records:,} keys: RecordSerializer vs msgpack dicts "
                 f"(target {TARGET:g}x)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000, help="keys (one record each)")
    p.add_argument("--repeat", type=int, default=3, help="runs per cell (best is kept)")
    p.add_argument("--backends", default="hashmap,rocksdb",
                   help="comma-separated: hashmap, rocksdb")
    a = p.parse_args(argv)
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    workdir = Path(tempfile.mkdtemp(prefix="weir-bench-records-"))
    started = time.perf_counter()
    try:
        results = measure(a.records, a.repeat, backends, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_rich(results, a.records)
    RESULTS.mkdir(parents=True, exist_ok=True)
    params = {"records": a.records, "repeat": a.repeat, "backends": backends,
              "target": TARGET, "elapsed_s": round(time.perf_counter() - started, 1)}
    doc = {"machine": machine_info(), "parameters": params, "results": results}
    (RESULTS / "record_state.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(results, a.records, RESULTS / "record_state.png")
    print(f"\nwrote {RESULTS / 'record_state.json'} and record_state.png "
          f"({params['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
