"""``make demo``: the fraud detector on weir's state layer, with a rescale in the middle.

1. Generate a deterministic card-transaction stream with planted fraud patterns.
2. Run the first half on one subtask with the hash-map backend; take a snapshot.
3. Restore that snapshot at parallelism 3 on the RocksDB backend (rescaling by key
   groups, switching backends) and run the second half, routing each record to the
   subtask that owns its key.
4. Compare the alerts with an oracle computed in plain Python: lost, duplicated and
   wrong alerts must all be zero.

Runs through ``weir.testing``'s harness until the Spark runtime replaces it.
"""

from __future__ import annotations

import random
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from weir.examples.fraud import FLAG, MERCHANTS, TOTAL, FraudDetector, Txn, oracle_alerts
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.testing import KeyedOperatorHarness

MAX_PARALLELISM = 128


def transactions(n: int, cards: int, seed: int = 7) -> list[Txn]:
    """A stream with ~1% small 'probe' transactions, some followed by a large one."""
    rng = random.Random(seed)
    merchants = [f"m{i:03d}" for i in range(40)]
    out: list[Txn] = []
    ts = 1_700_000_000_000
    for _ in range(n):
        ts += rng.randint(1, 400)
        card = f"card-{rng.randrange(cards):04d}"
        roll = rng.random()
        if roll < 0.01:
            amount = round(rng.uniform(0.01, 0.99), 2)
        elif roll < 0.02:
            amount = round(rng.uniform(501, 3000), 2)
        else:
            amount = round(rng.uniform(1, 300), 2)
        out.append({"card": card, "ts": ts, "amount": amount, "merchant": rng.choice(merchants)})
        if amount < 1 and rng.random() < 0.5:  # the fraud pattern, within the minute
            ts += rng.randint(1_000, 50_000)
            out.append({"card": card, "ts": ts, "amount": round(rng.uniform(600, 5000), 2),
                        "merchant": rng.choice(merchants)})
    return out


def _run(
    harnesses: list[KeyedOperatorHarness], stream: list[Txn], progress: Progress, label: str
) -> tuple[list[dict[str, Any]], float]:
    p = len(harnesses)
    alerts: list[dict[str, Any]] = []
    task = progress.add_task(label, total=len(stream))
    start = time.perf_counter()
    for i, txn in enumerate(stream):
        ts = txn["ts"]
        for h in harnesses:  # the watermark reaches every subtask
            alerts.extend(h.advance_watermark(ts - 1))
        owner = assign_key_to_parallel_operator(txn["card"], MAX_PARALLELISM, p)
        alerts.extend(harnesses[owner].process_element(txn, timestamp=ts))
        if i % 500 == 0:
            progress.update(task, completed=i)
    progress.update(task, completed=len(stream))
    return alerts, time.perf_counter() - start


def main() -> int:
    """Run the demo; exit status 0 only if the alerts equal the oracle."""
    console = Console()
    stream = transactions(40_000, cards=500)
    half = len(stream) // 2
    console.rule("[bold]weir demo: card fraud detection with keyed state, TTL and timers")
    console.print(f"{len(stream):,} transactions over 500 cards; max parallelism {MAX_PARALLELISM}")

    def key(t: Txn) -> str:
        return str(t["card"])

    with Progress(console=console, transient=True) as progress:
        first = KeyedOperatorHarness(FraudDetector(), key, state_backend="hashmap",
                                     max_parallelism=MAX_PARALLELISM, uid="fraud-detector")
        first.open()
        alerts1, t1 = _run([first], stream[:half], progress, "phase 1: 1 subtask, hashmap")
        snapshot = first.snapshot()
        first.close()
        console.print(
            f"phase 1: {half:,} records on 1 subtask (hashmap) in {t1:.2f}s "
            f"({half / t1:,.0f} rec/s), {len(alerts1)} alerts; snapshot "
            f"{snapshot.checkpoint_id}: {snapshot.keyed.entry_count() if snapshot.keyed else 0:,}"
            f" entries in {len(snapshot.keyed.groups) if snapshot.keyed else 0} key groups"
        )
        second = [
            KeyedOperatorHarness.restore(
                FraudDetector(), key, [snapshot], parallelism=3, subtask_index=i,
                state_backend="rocksdb", uid="fraud-detector",
            )
            for i in range(3)
        ]
        alerts2, t2 = _run(second, stream[half:], progress, "phase 2: 3 subtasks, rocksdb")
        n2 = len(stream) - half
        console.print(
            f"phase 2: restored at parallelism 3 on RocksDB; {n2:,} records in {t2:.2f}s "
            f"({n2 / t2:,.0f} rec/s), {len(alerts2)} alerts"
        )

    table = Table(title="state per subtask after the rescale")
    for col in ("subtask", "key groups", "cards", "flagged", "merchant maps", "spend"):
        table.add_column(col, justify="right")
    for i, h in enumerate(second):
        cards = h.keys(TOTAL)
        spend = sum(h.state_of(c, TOTAL) or 0 for c in cards)
        table.add_row(
            str(i), str(h.operator.config.key_group_range), str(len(cards)),
            str(len(h.keys(FLAG))), str(len(h.keys(MERCHANTS))), f"{spend:,.2f}",
        )
    console.print(table)
    for h in second:
        h.close()

    got = [(a["card"], a["at"]) for a in alerts1 + alerts2]
    want = oracle_alerts(stream)
    lost = len(set(want) - set(got))
    duplicated = len(got) - len(set(got))
    wrong = len(set(got) - set(want))
    console.print(f"alerts: {len(got)} from weir, {len(want)} from the oracle")
    for a in (alerts1 + alerts2)[:3]:
        console.print(f"  e.g. {a['card']}: {a['amount']:.2f} after {a['recent'][:-1]}")
    ok = lost == duplicated == wrong == 0 and len(want) > 0
    style = "bold green" if ok else "bold red"
    console.print(
        f"[{style}]verification: lost={lost} duplicated={duplicated} wrong={wrong} "
        f"-> {'OK' if ok else 'MISMATCH'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
