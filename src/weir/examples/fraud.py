"""Card fraud detection, Flink's classic walkthrough, written against weir's API.

A card is flagged when a small transaction (< 1.00) is followed within one minute
(event time) by a large one (> 500.00). Per card it keeps:

* ``flag`` (value state): a small transaction was seen; cleared by an event-time
  timer one minute later;
* ``recent`` (list state, TTL 10 min per element): the latest amounts, for context
  in the alert;
* ``merchants`` (map state, TTL 10 min per entry): transactions per merchant;
* ``total`` (reducing state): lifetime spend.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from weir import (
    KeyedContext,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

SMALL, LARGE, WINDOW_MS = 1.00, 500.00, 60_000
# Expired entries are dropped when read, when RocksDB compacts, and from snapshots.
TEN_MINUTES = (
    StateTtlConfig(ttl_ms=600_000).cleanup_in_rocksdb_compact_filter().cleanup_in_full_snapshot()
)

FLAG = ValueStateDescriptor[bool]("flag")
TIMER = ValueStateDescriptor[int]("timer")
RECENT = ListStateDescriptor[float]("recent", ttl=TEN_MINUTES)
MERCHANTS = MapStateDescriptor[str, int]("merchants", ttl=TEN_MINUTES)
TOTAL = ReducingStateDescriptor[float]("total", lambda a, b: round(a + b, 2))

Txn = dict[str, Any]


class FraudDetector(KeyedProcessFunction[Txn, dict[str, Any]]):
    """Alerts on a small transaction followed by a large one within a minute."""

    def open(self, ctx: KeyedContext) -> None:
        self.flag = ctx.get_state(FLAG)
        self.timer = ctx.get_state(TIMER)
        self.recent = ctx.get_list_state(RECENT)
        self.merchants = ctx.get_map_state(MERCHANTS)
        self.total = ctx.get_reducing_state(TOTAL)

    def process_element(self, txn: Txn, ctx: KeyedContext) -> Iterator[dict[str, Any]]:
        amount = txn["amount"]
        self.recent.add(amount)
        self.merchants[txn["merchant"]] = self.merchants.get(txn["merchant"], 0) + 1
        self.total.add(amount)
        if self.flag.value():
            if amount > LARGE:
                yield {
                    "card": ctx.current_key,
                    "alert": "small-then-large",
                    "amount": amount,
                    "recent": self.recent.get()[-3:],
                    "at": ctx.timestamp,
                }
            self._reset(ctx)
        if amount < SMALL:
            assert ctx.timestamp is not None, "the demo stream carries event timestamps"
            self.flag.update(True)
            deadline = ctx.timestamp + WINDOW_MS
            ctx.timer_service.register_event_time_timer(deadline)
            self.timer.update(deadline)

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> None:
        self.flag.clear()
        self.timer.clear()

    def _reset(self, ctx: KeyedContext) -> None:
        deadline = self.timer.value()
        if deadline is not None:
            ctx.timer_service.delete_event_time_timer(deadline)
        self.flag.clear()
        self.timer.clear()


def oracle_alerts(transactions: list[Txn]) -> list[tuple[str, int]]:
    """The same rule computed with plain Python (no weir), for verification.

    Transactions are processed in order; a flag expires when a later watermark
    passes its deadline (the demo advances the watermark to each timestamp)."""
    flags: dict[str, int] = {}
    alerts = []
    for txn in transactions:
        card, ts, amount = txn["card"], txn["ts"], txn["amount"]
        deadline = flags.get(card)
        if deadline is not None and deadline <= ts - 1:
            del flags[card]
            deadline = None
        if deadline is not None:
            if amount > LARGE:
                alerts.append((card, ts))
            del flags[card]
        if amount < SMALL:
            flags[card] = ts + WINDOW_MS
    return alerts
