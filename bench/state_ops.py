"""Cost of ONE keyed-state call per state type and backend, as a ratio to the raw limit.

hashmap backend vs a bare ``dict`` keyed by the same prefixed key bytes; rocksdb
backend vs a bare ``rocksdict.Rdict`` (raw mode, WAL off, one column family per
state, msgpack-encoded values) doing the equivalent operation. The ``record`` rows: a
value state of typed records (``RecordSerializer`` of a dataclass of five fields)
against a dict holding the same objects, and a rocksdict holding their fields packed
by hand as a msgpack array.

For every key (fixed shuffled order) the loop sets the current key once and then
makes the state call ``--ops`` times, unrolled. The cost of the same loop with only
the key step (``set_current_key`` for weir, ``k = key`` for the baseline) is measured
separately and subtracted; the rest is divided by the number of state calls (and by
the entries per map for ``map iterate``). Best of ``--repeat``; weir and baseline
runs are interleaved so machine noise hits both.

Run: ``.venv/bin/python -m bench.state_ops [--quick] [--keys N] [--ops M] [--repeat R]``;
see bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import msgpack
import rocksdict

from weir import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    RecordSerializer,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from weir.testing import KeyedOperatorHarness

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {"hashmap": 3.0, "rocksdb": 2.0}  # max weir/baseline ratio (PERFORMANCE targets)
LIST_LEN = MAP_LEN = 4
USER_KEYS = ["a", "b", "c", "d"]

# operation -> (weir call on state `s`, bare-dict call on `d`, bare-rocksdict call on
# `db`, state name, divisor per call). `k` is the current key's prefixed bytes.
OPS: dict[str, tuple[str, str, str, str, int]] = {
    "value get": ("s.value()", "d.get(k)", "unpackb(db.get(k))", "value", 1),
    "value update": ("s.update(v)", "d[k] = v", "db.put(k, pack(v))", "value", 1),
    "list add": (
        "s.add(v)", "d[k].append(v)",
        "o = db.get(k)\ne = pack(v)\ndb.put(k, ARR1 + e if o is None else\n"
        "       b'\\xdd' + (int.from_bytes(o[1:5]) + 1).to_bytes(4) + o[5:] + e)",
        "list_add", 1,
    ),
    # get() returns a new list (a caller's change to the stored one would bypass the
    # changelog), so the baseline makes one too, the fastest way a dict can
    "list get": (
        "s.get()", "d.get(k).copy()", "unpackb(db.get(k))", "list", 1,
    ),
    "map put": ("s.put(uk, v)", "d[k][uk] = v", "db.put(k + pack(uk), pack(v))", "map", 1),
    "map get": ("s.get(uk)", "d[k].get(uk)", "unpackb(db.get(k + pack(uk)))", "map", 1),
    "map iterate": (
        "for e in s.items():\n    pass",
        "for e in d[k].items():\n    pass",
        "n = len(k)\nfor kk, vv in db.items(from_key=k):\n    if not kk.startswith(k):\n"
        "        break\n    e = (unpackb(kk[n:]), unpackb(vv))",
        "map", MAP_LEN,
    ),
    "reducing add": (
        "s.add(v)", "c = d.get(k)\nd[k] = v if c is None else f(c, v)",
        "c = db.get(k)\ndb.put(k, pack(v if c is None else f(unpackb(c), v)))", "reducing", 1,
    ),
    "aggregating add": (
        "s.add(v)",
        "c = d.get(k)\nd[k] = agg.add(v, agg.create_accumulator() if c is None else c)",
        "c = db.get(k)\n"
        "db.put(k, pack(agg.add(v, agg.create_accumulator() if c is None else unpackb(c))))",
        "aggregating", 1,
    ),
    # a typed record (RecordSerializer(Card)) as the value: the bare dict holds the same
    # objects; bare rocksdict the record's fields packed by hand as a msgpack array
    # (unchecked), and a get builds the record from them
    "record get": ("s.value()", "d.get(k)", "Card(*unpackb(db.get(k)))", "record", 1),
    "record update": (
        "s.update(r)", "d[k] = r",
        "db.put(k, pack([r.card, r.count, r.total, r.flagged, r.note]))", "record", 1,
    ),
}


class _Noop(KeyedProcessFunction[Any, Any]):
    def process_element(self, value: Any, ctx: Any) -> None:
        return None


class _Sum(AggregateFunction[int, int, int]):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: int, accumulator: int) -> int:
        return accumulator + value

    get_result = staticmethod(lambda acc: acc)  # type: ignore[assignment]
    merge = staticmethod(lambda a, b: a + b)  # type: ignore[assignment]


def _add(a: int, b: int) -> int:
    return a + b


@dataclass
class Card:
    """The record of the ``record`` rows: str, int, float, bool, optional str."""

    card: str
    count: int
    total: float
    flagged: bool
    note: str | None


def card_of(key: int) -> Card:
    return Card(f"card-{key}", key, key * 0.5, key % 2 == 0, None if key % 3 else f"n{key}")


DESCRIPTORS = {
    "value": ValueStateDescriptor("value"),
    "list_add": ListStateDescriptor("list_add"),
    "list": ListStateDescriptor("list"),
    "map": MapStateDescriptor("map"),
    "reducing": ReducingStateDescriptor("reducing", reduce_function=_add),
    "aggregating": AggregatingStateDescriptor("aggregating", aggregate_function=_Sum()),
    "record": ValueStateDescriptor("record", RecordSerializer(Card)),
}

_PACKER = msgpack.Packer()
NAMESPACE = {"pack": _PACKER.pack, "unpackb": msgpack.unpackb, "ARR1": b"\xdd\0\0\0\1",
             "f": _add, "agg": _Sum(), "v": 7, "uk": "b", "Card": Card, "r": card_of(7)}


def _array32(values: list[Any]) -> bytes:
    """A msgpack array32: its 4-byte count can be patched in place, so an append is
    ``header + old elements + packed value`` and a read is one ``unpackb``."""
    return b"\xdd" + len(values).to_bytes(4, "big") + b"".join(map(_PACKER.pack, values))


def compile_loop(head: str, stmt: str | None, ops: int) -> Any:
    """``run(keys, setk, s, d, db) -> ns``: per key run ``head`` then ``stmt`` x ops."""
    body = "" if stmt is None else textwrap.indent(stmt, " " * 8) + "\n"
    src = (
        "def run(keys, setk, s, d, db):\n    t0 = now()\n    for key in keys:\n"
        f"        {head}\n{body * ops}    return now() - t0\n"
    )
    ns = dict(NAMESPACE, now=time.perf_counter_ns)
    exec(compile(src, "<bench loop>", "exec"), ns)
    return ns["run"]


class Setup:
    """One weir operator on ``backend`` plus its bare baseline, both pre-populated."""

    def __init__(self, backend: str, keys: list[int], workdir: Path) -> None:
        self.backend = backend
        self.keys = keys
        self.harness = KeyedOperatorHarness(
            _Noop(), lambda e: e, state_backend=backend,
            rocksdb_path=workdir / "weir" if backend == "rocksdb" else None,
        )
        op = self.op = self.harness.operator
        op.open()
        self.states = {n: op.keyed_state.get_state(d) for n, d in DESCRIPTORS.items()}
        self.setk = op.key_context.set_current_key
        self.key_bytes: list[bytes] = []
        for key in keys:
            self.setk(key)
            self.key_bytes.append(op.key_context.key_bytes)
            self._populate_weir(key)
        self.bare: dict[str, Any] = {name: {} for name in DESCRIPTORS}
        self.db: Any = None
        if backend == "rocksdb":
            self._open_bare_rocksdb(workdir / "bare")
        self._populate_bare()

    def _populate_weir(self, key: int) -> None:
        st = self.states
        st["value"].update(key)
        for i in range(LIST_LEN):
            st["list"].add(key + i)
            st["list_add"].add(key + i)
        for i, uk in enumerate(USER_KEYS[:MAP_LEN]):
            st["map"].put(uk, key + i)
        st["reducing"].add(key)
        st["aggregating"].add(key)
        st["record"].update(card_of(key))

    def _open_bare_rocksdb(self, path: Path) -> None:
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        self.db = rocksdict.Rdict(str(path), opts)
        wo = rocksdict.WriteOptions()
        wo.disable_wal = True
        self.db.set_write_options(wo)
        for name in DESCRIPTORS:
            self.bare[name] = self.db.create_column_family(name, opts)
            self.bare[name].set_write_options(wo)

    def _populate_bare(self) -> None:
        pack, rocks, b = _PACKER.pack, self.db is not None, self.bare
        for key, kb in zip(self.keys, self.key_bytes, strict=True):
            lst = [key + i for i in range(LIST_LEN)]
            entries = {uk: key + i for i, uk in enumerate(USER_KEYS[:MAP_LEN])}
            card = card_of(key)
            if rocks:
                for name, val in (("value", key), ("reducing", key), ("aggregating", key)):
                    b[name].put(kb, pack(val))
                b["record"].put(kb, pack([card.card, card.count, card.total, card.flagged,
                                          card.note]))
                for name in ("list", "list_add"):
                    b[name].put(kb, _array32(lst))
                for uk, val in entries.items():
                    b["map"].put(kb + pack(uk), pack(val))
            else:
                for name in ("value", "reducing", "aggregating"):
                    b[name][kb] = key
                b["record"][kb] = card
                b["list"][kb], b["list_add"][kb], b["map"][kb] = lst, list(lst), entries

    def close(self) -> None:
        self.harness.close()
        if self.db is not None:
            self.db.close()


@dataclass
class Cell:
    operation: str
    backend: str
    weir_ns: float
    baseline_ns: float
    ratio: float
    target: float
    passed: bool
    calls: int
    loops_ns: dict[str, int]  # best loop totals: weir, weir overhead, baseline, baseline ovh.


def measure(setups: dict[str, Setup], keys: list[int], ops: int, repeat: int) -> list[Cell]:
    weir_ovh = compile_loop("setk(key)", None, ops)
    base_ovh = compile_loop("k = key", None, ops)
    loops = {op: (compile_loop("setk(key)", w, ops), compile_loop("k = key", h, ops),
                  compile_loop("k = key", r, ops)) for op, (w, h, r, _, _) in OPS.items()}
    best: dict[tuple[str, str], list[float]] = {}
    gc.disable()
    try:
        for rep in range(repeat):
            for op, name in ((o, v[3]) for o, v in OPS.items()):
                for backend, su in setups.items():
                    w_loop, h_loop, r_loop = loops[op]
                    b_loop = r_loop if backend == "rocksdb" else h_loop
                    kb, state, bare = su.key_bytes, su.states[name], su.bare[name]
                    runs = [
                        (w_loop, keys, su.setk, state), (b_loop, kb, None, bare),
                        (weir_ovh, keys, su.setk, None), (base_ovh, kb, None, None),
                    ]
                    order = [0, 1, 2, 3] if rep % 2 == 0 else [1, 0, 3, 2]
                    times = [0.0] * 4
                    for i in order:
                        fn, ks, setk, obj = runs[i]
                        times[i] = fn(ks, setk, obj, obj, obj)
                    cur = best.setdefault((op, backend), [float("inf")] * 4)
                    best[(op, backend)] = [min(a, b) for a, b in zip(cur, times, strict=True)]
            gc.collect()
    finally:
        gc.enable()
    cells = []
    for (op, backend), (wl, bl, wo, bo) in best.items():
        calls = len(keys) * ops * OPS[op][4]
        w_ns, b_ns = (wl - wo) / calls, (bl - bo) / calls
        ratio = w_ns / b_ns if b_ns > 0 else float("inf")
        target = TARGETS[backend]
        raw = {"weir": int(wl), "weir_overhead": int(wo), "baseline": int(bl),
               "baseline_overhead": int(bo)}
        cells.append(Cell(op, backend, round(w_ns, 1), round(b_ns, 1), round(ratio, 2),
                          target, ratio <= target, calls, raw))
    return cells


def machine_info() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0], "implementation": platform.python_implementation(),
        "platform": platform.platform(), "machine": platform.machine(),
        "processor": platform.processor(), "cpu_count": os.cpu_count(),
        "packages": {p: metadata.version(p) for p in ("weir", "rocksdict", "msgpack")},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def print_rich(cells: list[Cell]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="weir keyed state: ns per state call vs raw limit (best of runs)")
    for col in ("operation", "backend", "weir ns/call", "baseline ns/call", "ratio", "target",
                "pass/fail"):
        t.add_column(col, justify="left" if col in ("operation", "backend") else "right")
    for c in cells:
        verdict = "[green]pass[/]" if c.passed else "[red]FAIL[/]"
        t.add_row(c.operation, c.backend, f"{c.weir_ns:.0f}", f"{c.baseline_ns:.0f}",
                  f"{c.ratio:.2f}x", f"<= {c.target:g}x", verdict)
    Console(width=max(Console().width, 110)).print(t)


def markdown(cells: list[Cell]) -> str:
    lines = ["| operation | backend | weir ns/call | baseline ns/call | ratio | target | pass |",
             "|---|---|---:|---:|---:|---:|---|"]
    lines += [f"| {c.operation} | {c.backend} | {c.weir_ns:.0f} | {c.baseline_ns:.0f} | "
              f"{c.ratio:.2f}x | <= {c.target:g}x | {'pass' if c.passed else '**FAIL**'} |"
              for c in cells]
    return "\n".join(lines)


def plot(cells: list[Cell], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(OPS)
    fig, ax = plt.subplots(figsize=(13, 5))
    width = 0.38
    for i, (backend, color) in enumerate((("hashmap", "tab:blue"), ("rocksdb", "tab:orange"))):
        ratios = {c.operation: c.ratio for c in cells if c.backend == backend}
        xs = [j + (i - 0.5) * width for j in range(len(ops))]
        bars = ax.bar(xs, [ratios.get(o, 0) for o in ops], width, label=backend, color=color)
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.axhline(TARGETS[backend], color=color, linestyle="--", linewidth=1.2,
                   label=f"{backend} target {TARGETS[backend]:g}x")
    ax.set_xticks(range(len(ops)), ops, rotation=20)
    ax.set_ylabel("weir ns/call ÷ baseline ns/call")
    ax.set_title("weir state call cost relative to bare dict / bare rocksdict")
    top = max([c.ratio for c in cells if c.ratio != float("inf")] + list(TARGETS.values()))
    ax.set_ylim(0, top * 1.25)  # (room for the legend above the bars)
    ax.legend(loc="upper center", ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=10_000, help="keys per backend")
    p.add_argument("--ops", type=int, default=8, help="state calls per key (unrolled)")
    p.add_argument("--repeat", type=int, default=5, help="runs per cell (best is kept)")
    p.add_argument("--quick", action="store_true", help="2000 keys, 3 repeats")
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    if a.quick:
        a.keys, a.repeat = min(a.keys, 2_000), min(a.repeat, 3)
    keys = list(range(a.keys))
    random.Random(a.seed).shuffle(keys)
    workdir = Path(tempfile.mkdtemp(prefix="weir-bench-"))
    started = time.perf_counter()
    setups: dict[str, Setup] = {}
    try:
        for backend in ("hashmap", "rocksdb"):
            setups[backend] = Setup(backend, keys, workdir)
        cells = measure(setups, keys, a.ops, a.repeat)
    finally:
        for su in setups.values():
            su.close()
        shutil.rmtree(workdir, ignore_errors=True)
    order = {op: i for i, op in enumerate(OPS)}
    cells.sort(key=lambda c: (order[c.operation], c.backend))
    print_rich(cells)
    RESULTS.mkdir(parents=True, exist_ok=True)
    params = {"keys": a.keys, "ops_per_key": a.ops, "repeat": a.repeat, "quick": a.quick,
              "seed": a.seed, "list_len": LIST_LEN, "map_len": MAP_LEN, "targets": TARGETS,
              "elapsed_s": round(time.perf_counter() - started, 1)}
    doc = {"machine": machine_info(), "parameters": params,
           "cells": [asdict(c) for c in cells]}
    (RESULTS / "state_ops.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(cells, RESULTS / "state_ops.png")
    print(f"\nwrote {RESULTS / 'state_ops.json'} and state_ops.png "
          f"({params['elapsed_s']} s)\n")
    print(markdown(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
