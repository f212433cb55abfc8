"""The demo's event stream (seeded transactions with planted fraud, late and
invalid records) and its oracle, computed without weir."""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from weir.examples.fraud import (
    LARGE,
    NEWEST_KEPT,
    SMALL,
    WINDOW_MS,
)
from weir.examples.fraud_job import (
    WATERMARK_DELAY_MS,
    Paths,
)

Txn = dict[str, Any]
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MAX_DELAY_MS = 20_000  # how late (event time behind arrival) a transaction may arrive
assert MAX_DELAY_MS < WATERMARK_DELAY_MS, "out-of-orderness within the watermark delay: none late"
CATEGORIES = {  # category: (initial limit, typical amount scale)
    "grocery": (600.0, 40.0), "fuel": (300.0, 50.0), "restaurant": (800.0, 35.0),
    "pharmacy": (700.0, 25.0), "electronics": (4_000.0, 150.0), "travel": (4_500.0, 200.0),
    "jewelry": (3_500.0, 120.0), "online-gaming": (400.0, 20.0),
}



# ---------------------------------------------------------------------------- data


@dataclass
class Stream:
    """The generated input, in arrival order, and the rules."""

    events: list[Txn]
    rules: list[list[Txn]]  # one list per rules file
    merchants: dict[str, str]  # merchant -> category


def generate(events: int, cards: int, seed: int = 7) -> Stream:
    """``events`` transactions over ``cards`` cards, deterministic for ``seed``.

    Each transaction arrives at a time ``a`` (increasing) and carries an event time
    ``ts`` in ``[a - 20 s, a]``: the stream is out of order, but never by more than
    the stage's watermark delay (30 s), so no transaction is late. About 0.3% start a
    planted fraud pattern (a small "probe", then a large purchase within the minute; a
    quarter of them arrive large-first); 0.1% are invalid (no card, no amount, a
    negative amount, no event time)."""
    rng = random.Random(seed)
    names = sorted(CATEGORIES)
    merchants = {f"m{i:03d}": names[i % len(names)] for i in range(240)}
    merchant_ids = sorted(merchants)
    arrivals: list[tuple[int, int, Txn]] = []  # (arrival, sequence, txn)

    def add(arrival: int, t: Txn) -> None:
        arrivals.append((arrival, len(arrivals), t))

    def txn(card: str | None, ts: int | None, amount: float | None) -> Txn:
        merchant = rng.choice(merchant_ids)
        return {"card_id": card, "ts": ts, "amount": amount, "merchant": merchant,
                "category": merchants[merchant]}

    def small() -> float:
        return round(rng.uniform(0.01, 0.99), 2)

    now = START_MS
    while len(arrivals) < events:
        now += rng.randint(1, 100)
        card = f"card-{rng.randrange(cards):05d}"
        late = rng.randint(0, 1_500) if rng.random() < 0.95 else rng.randint(0, MAX_DELAY_MS)
        roll = rng.random()
        if roll < 0.001:  # invalid
            kind = rng.randrange(4)
            add(now, txn(None if kind == 0 else card, None if kind == 3 else now - late,
                         None if kind == 1 else (-12.5 if kind == 2 else 20.0)))
        elif roll < 0.004:  # planted: small, then large within the minute
            if rng.random() < 0.75:
                ts_small = now - late
                ts_large = ts_small + rng.randint(3_000, 55_000)
                add(now, txn(card, ts_small, small()))
                add(ts_large + rng.randint(0, 2_000),
                    txn(card, ts_large, round(rng.uniform(600, 5_000), 2)))
            else:  # the large one arrives first, the small one (earlier in event time) after
                add(now, txn(card, now, round(rng.uniform(600, 5_000), 2)))
                add(now + rng.randint(100, 4_000),
                    txn(card, now - rng.randint(3_000, 15_000), small()))
        else:
            t = txn(card, now - late, 0.0)
            r = rng.random()
            if r < 0.005:
                t["amount"] = small()
            elif r < 0.015:
                t["amount"] = round(rng.uniform(501, 3_000), 2)
            else:
                scale = CATEGORIES[t["category"]][1]
                t["amount"] = max(1.0, round(rng.lognormvariate(math.log(scale), 1.0), 2))
            add(now, t)
    arrivals.sort(key=lambda a: (a[0], a[1]))
    ordered: list[Txn] = []
    for arrival, _, t in arrivals[:events]:
        assert t["ts"] is None or 0 <= arrival - t["ts"] <= MAX_DELAY_MS
        t["txn_id"] = f"t{len(ordered):08d}"
        ordered.append(t)
    span = max(t["ts"] for t in ordered if t["ts"] is not None) - START_MS
    rules = [
        [{"category": c, "limit": limit, "effective_from": 0}
         for c, (limit, _) in sorted(CATEGORIES.items())],
        # a fraud wave in online gaming: a lower limit from the middle of the stream on
        [{"category": "online-gaming", "limit": 150.0, "effective_from": START_MS + span // 2}],
        # later: jewelry gets a higher limit, fuel none at all
        [{"category": "jewelry", "limit": 5_000.0, "effective_from": START_MS + 3 * span // 4},
         {"category": "fuel", "limit": None, "effective_from": START_MS + 3 * span // 4}],
    ]
    return Stream(ordered, rules, merchants)


def write_stream(stream: Stream, paths: Paths, files: int) -> None:
    """Drop the events into ``events/`` as ``files`` parquet files (arrival order;
    increasing modification times, which is the order Spark's file source takes them
    in) and the rules into ``rules/`` as JSON lines. Each file is written under a
    hidden name and renamed, so the file source never sees half a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("card_id", pa.string()), ("txn_id", pa.string()), ("ts", pa.timestamp("ms", tz="UTC")),
        ("amount", pa.float64()), ("merchant", pa.string()), ("category", pa.string()),
    ])
    paths.events.mkdir(parents=True)
    paths.rules.mkdir(parents=True)
    base = time.time() - 3_600
    per = -(-len(stream.events) // files)
    for i in range(files):
        chunk = stream.events[i * per : (i + 1) * per]
        table = pa.Table.from_pylist(chunk, schema=schema)
        final = paths.events / f"part-{i:05d}.parquet"
        hidden = paths.events / f".part-{i:05d}.parquet.tmp"
        pq.write_table(table, hidden)
        os.replace(hidden, final)
        os.utime(final, (base + i, base + i))
    for i, rules in enumerate(stream.rules):
        final = paths.rules / f"rules-{i:03d}.json"
        hidden = paths.rules / f".rules-{i:03d}.json.tmp"
        hidden.write_text("".join(json.dumps(r) + "\n" for r in rules))
        os.replace(hidden, final)
        os.utime(final, (base + i, base + i))


# ---------------------------------------------------------------------------- oracle


@dataclass
class CardState:
    """What the detector should hold for one card at the end."""

    count: int = 0
    spend_cents: int = 0
    per_merchant: Counter[str] = field(default_factory=Counter)
    newest: list[list[Any]] = field(default_factory=list)  # [ts, txn_id, amount, merchant]
    smalls: list[tuple[int, str]] = field(default_factory=list)
    larges: list[tuple[int, str, float]] = field(default_factory=list)


@dataclass
class Expected:
    """The oracle's answer, computed from the generated stream alone."""

    alerts: dict[tuple[str, str], tuple[Any, ...]]  # (txn_id, rule) -> alert fields
    dead: set[str]
    cards: dict[str, CardState]
    limits: dict[str, list[tuple[int, float | None]]]
    unmatched: set[str]  # large transactions no small one precedes within the minute

    def open_small(self, card: str, watermark: int) -> dict[str, int]:
        """Small transactions whose window the watermark has not closed yet."""
        return {i: ts for ts, i in self.cards[card].smalls if ts + WINDOW_MS > watermark}

    def waiting_large(self, card: str, watermark: int) -> dict[str, tuple[int, float]]:
        """Unmatched large transactions the watermark has not passed yet."""
        return {i: (ts, a) for ts, i, a in self.cards[card].larges
                if i in self.unmatched and ts > watermark}

    def timers(self, watermark: int) -> set[tuple[int, str]]:
        """Event-time timers still pending at ``watermark``."""
        out: set[tuple[int, str]] = set()
        for card in self.cards:
            out |= {(ts + WINDOW_MS, card) for ts in self.open_small(card, watermark).values()}
            out |= {(ts, card) for ts, _ in self.waiting_large(card, watermark).values()}
        return out


def oracle(stream: Stream) -> Expected:
    """The detector's rules in plain Python over the whole stream (no weir, no Spark,
    no notion of batches, arrival order or timers)."""
    versions: dict[str, dict[int, float | None]] = defaultdict(dict)
    for rules in stream.rules:
        for r in rules:
            versions[r["category"]][int(r["effective_from"])] = r["limit"]
    limits = {c: sorted(v.items()) for c, v in versions.items()}

    def limit_in_force(category: str, ts: int) -> float | None:
        found = None
        for effective_from, limit in limits.get(category, []):
            if effective_from <= ts:
                found = limit
        return found

    alerts: dict[tuple[str, str], tuple[Any, ...]] = {}
    dead: set[str] = set()
    cards: dict[str, CardState] = defaultdict(CardState)
    for t in stream.events:
        card, ts, amount = t["card_id"], t["ts"], t["amount"]
        if card is None or ts is None or amount is None or amount <= 0:
            dead.add(t["txn_id"])
            continue
        state = cards[card]
        state.count += 1
        state.spend_cents += round(amount * 100)
        state.per_merchant[t["merchant"]] += 1
        state.newest = sorted([*state.newest, [ts, t["txn_id"], amount, t["merchant"]]],
                              key=lambda n: n[:3])[-NEWEST_KEPT:]
        limit = limit_in_force(t["category"], ts)
        if limit is not None and amount > limit:
            alerts[(t["txn_id"], "over-category-limit")] = (card, amount, ts)
        if amount < SMALL:
            state.smalls.append((ts, t["txn_id"]))
        elif amount > LARGE:
            state.larges.append((ts, t["txn_id"], amount))
    unmatched: set[str] = set()
    for card, state in cards.items():
        for ts, txn_id, amount in state.larges:
            if any(ts - WINDOW_MS <= s < ts for s, _ in state.smalls):
                alerts[(txn_id, "small-then-large")] = (card, amount, ts)
            else:
                unmatched.add(txn_id)
    return Expected(alerts, dead, dict(cards), limits, unmatched)


