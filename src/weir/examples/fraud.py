"""Card fraud detection, Flink's classic walkthrough, written against weir's API.

A card is flagged when a small transaction (< 1.00) is followed within one minute
(event time) by a large one (> 500.00). Per card it keeps:

* ``flag`` (value state): a small transaction was seen; cleared by an event-time
  timer one minute later;
* ``recent`` (list state, TTL 10 min per element): the latest amounts, for context
  in the alert;
* ``merchants`` (map state, TTL 10 min per entry): transactions per merchant;
* ``total`` (reducing state): lifetime spend.

:class:`CardFraudDetector` is the variant the Spark demo (``make demo``) runs: the
same pattern defined on event time (independent of arrival order and batching), plus
per-merchant-category limits from a broadcast stream of versioned rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, ClassVar

from weir import (
    BroadcastContext,
    KeyedBroadcastProcessFunction,
    KeyedContext,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    RecordSerializer,
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


# ------------------------------------------------------------------------------------
# The Spark demo's detector (``make demo``): the same small-then-large pattern, but
# defined on event time, so that its alerts do not depend on arrival order, on how
# the stream is cut into micro-batches or on when timers fire; plus per-merchant-
# category limits that arrive as a broadcast stream of versioned rules.


@dataclasses.dataclass
class Recent:
    """One of a card's newest transactions (state ``newest``). Version 2 of this
    record added ``merchant``: a restore from a savepoint of version 1 migrates the
    stored records, whose merchant is then None (docs: "Changing your state")."""

    ts: int
    txn_id: str
    amount: float
    merchant: str | None = None


@dataclasses.dataclass
class WaitingLarge:
    """A large transaction no small one has matched yet (state ``waiting-large``)."""

    ts: int
    amount: float


@dataclasses.dataclass
class PendingLimit:
    """A transaction whose limit is checked once the watermark passes it."""

    ts: int
    amount: float
    category: str


SPEND = ReducingStateDescriptor[float]("spend", lambda a, b: round(a + b, 2))
TXN_COUNT = ValueStateDescriptor[int]("txn-count")
#: the 5 newest transactions by event time
NEWEST = ListStateDescriptor[Recent](
    "newest", RecordSerializer(Recent),
    ttl=StateTtlConfig(ttl_ms=86_400_000).cleanup_in_full_snapshot(),
)
#: transactions per merchant (kept for a day after the card's last purchase there)
PER_MERCHANT = MapStateDescriptor[str, int](
    "per-merchant",
    ttl=StateTtlConfig(ttl_ms=86_400_000).cleanup_in_rocksdb_compact_filter()
    .cleanup_in_full_snapshot(),
)
#: small transactions whose one-minute window is still open: txn_id -> ts
OPEN_SMALL = MapStateDescriptor[str, int]("open-small")
#: large transactions no small one has matched yet (a small one, earlier in event time,
#: may still arrive until the watermark passes them): txn_id -> WaitingLarge
WAITING_LARGE = MapStateDescriptor[str, WaitingLarge](
    "waiting-large", serializer=RecordSerializer(WaitingLarge))
#: ``limits_at_watermark``: transactions whose limit is checked once the watermark
#: passes them: txn_id -> PendingLimit
PENDING_LIMIT = MapStateDescriptor[str, PendingLimit](
    "pending-limit", serializer=RecordSerializer(PendingLimit))
#: broadcast: merchant category -> [(effective_from_ms, limit or None), ...] ascending
CATEGORY_LIMITS = MapStateDescriptor[str, list[tuple[int, float | None]]]("category-limits")
NEWEST_KEPT = 5


class InvalidTransaction(ValueError):
    """A transaction the detector refuses (dead-lettered by the Spark stage)."""


def validate(txn: Txn, timestamp: int | None) -> float:
    """The transaction's amount, or :class:`InvalidTransaction` (checked before any
    state is touched, so a refused record leaves no trace in state)."""
    amount = txn.get("amount")
    if timestamp is None:
        raise InvalidTransaction(f"transaction {txn.get('txn_id')!r} has no event time")
    if not isinstance(amount, int | float) or not amount > 0 or amount == float("inf"):
        raise InvalidTransaction(f"transaction {txn.get('txn_id')!r}: bad amount {amount!r}")
    if not txn.get("merchant") or not txn.get("category"):
        raise InvalidTransaction(f"transaction {txn.get('txn_id')!r} has no merchant/category")
    return float(amount)


def limit_at(versions: list[tuple[int, float | None]] | None, ts: int) -> float | None:
    """The limit in force at event time ``ts`` (None: no limit)."""
    limit = None
    for effective_from, value in versions or ():
        if effective_from > ts:
            break
        limit = value
    return limit


def add_version(
    versions: list[tuple[int, float | None]] | None, effective_from: int, limit: float | None
) -> list[tuple[int, float | None]]:
    """``versions`` with ``(effective_from, limit)`` added (replacing one that takes
    effect at the same time), ascending."""
    kept = [(int(f), v) for f, v in versions or () if f != effective_from]
    return sorted([*kept, (int(effective_from), limit)], key=lambda fv: fv[0])


def _by_time(recent: Any) -> tuple[int, str, float]:
    return recent.ts, recent.txn_id, recent.amount


def alert(card: str, rule: str, txn_id: str, amount: float, ts: int, detail: str) -> Txn:
    """One output row of :class:`CardFraudDetector` (the demo's ``output_schema``)."""
    return {"card_id": card, "rule": rule, "txn_id": txn_id, "amount": amount, "ts_ms": ts,
            "detail": detail}


ALERT_SCHEMA = (
    "card_id string, rule string, txn_id string, amount double, ts_ms long, detail string"
)


class CardFraudDetector(KeyedBroadcastProcessFunction[Txn, Txn, Txn]):
    """Two rules per card (records: ``card_id, txn_id, ts, amount, merchant,
    category``; broadcast rules: ``category, limit, effective_from``):

    * **small-then-large** — a large transaction (> 500.00) alerts if the card made a
      small one (< 1.00) in the minute before it, in event time: ``ts_large - 60 s <=
      ts_small < ts_large``. Transactions may arrive out of order (as long as they are
      not behind the watermark): a large one that no small one matches yet waits in
      state until the watermark passes it (an event-time timer), a small one until
      the watermark passes the end of its minute;
    * **over-category-limit** — the amount exceeds the limit of the merchant category
      in force at the transaction's event time (broadcast state of versioned limits,
      so a rule published ahead of time applies from its ``effective_from``).

    It also keeps lifetime spend (reducing state), a transaction count (value state),
    the five newest transactions (list state with TTL) and per-merchant counts (map
    state with TTL). Which alerts fire (all but their ``detail`` text) and every state
    value are independent of arrival order and batching, so the demo can compare
    them with a plain-Python oracle.

    ``limits_at_watermark``: check a transaction's limit when the watermark passes it
    (an event-time timer) instead of on arrival. On Spark a micro-batch applies its
    rules before its transactions; on the continuous runtime the rules and the
    transactions flow at once, and a transaction may arrive before a rule that applies
    to it. The watermark is the minimum over both inputs, so once it passes a
    transaction every rule that precedes it has arrived."""

    bad_record_exceptions = (InvalidTransaction,)
    #: the state of the newest transactions (a class attribute: a test restores a
    #: savepoint of the previous version of :class:`Recent`)
    newest_state: ClassVar[ListStateDescriptor[Any]] = NEWEST

    def __init__(self, limits_at_watermark: bool = False) -> None:
        self.limits_at_watermark = limits_at_watermark

    def open(self, ctx: KeyedContext) -> None:
        self.spend = ctx.get_reducing_state(SPEND)
        self.count = ctx.get_state(TXN_COUNT)
        self.newest = ctx.get_list_state(self.newest_state)
        self.per_merchant = ctx.get_map_state(PER_MERCHANT)
        self.open_small = ctx.get_map_state(OPEN_SMALL)
        self.waiting_large = ctx.get_map_state(WAITING_LARGE)
        if self.limits_at_watermark:
            self.pending_limit = ctx.get_map_state(PENDING_LIMIT)

    def _over_limit(self, card: str, txn_id: str, amount: float, ts: int, category: str,
                    ctx: KeyedContext) -> Iterator[Txn]:
        limit = limit_at(ctx.get_broadcast_state(CATEGORY_LIMITS).get(category), ts)
        if limit is not None and amount > limit:
            yield alert(card, "over-category-limit", txn_id, amount, ts,
                        f"{category} limit {limit:.2f}")

    def process_element(self, txn: Txn, ctx: KeyedContext) -> Iterator[Txn]:
        amount = validate(txn, ctx.timestamp)
        ts: int = ctx.timestamp  # type: ignore[assignment]  # validate() checked it
        card, txn_id = ctx.current_key, txn["txn_id"]
        self.count.update((self.count.value() or 0) + 1)
        self.spend.add(amount)
        merchant = txn["merchant"]
        self.per_merchant.put(merchant, self.per_merchant.get(merchant, 0) + 1)
        self.newest.update(sorted([*self.newest.get(), self._recent(ts, txn, amount)],
                                  key=_by_time)[-NEWEST_KEPT:])

        timers = ctx.timer_service
        if self.limits_at_watermark:
            self.pending_limit.put(txn_id, PendingLimit(ts, amount, txn["category"]))
            timers.register_event_time_timer(ts)
        else:
            yield from self._over_limit(card, txn_id, amount, ts, txn["category"], ctx)
        if amount < SMALL:
            for large_id, large in list(self.waiting_large.items()):
                if ts < large.ts <= ts + WINDOW_MS:  # the small one arrived after it
                    self.waiting_large.remove(large_id)
                    self._release_timer(large.ts, ctx)
                    yield alert(card, "small-then-large", large_id, large.amount, large.ts,
                                f"{(large.ts - ts) / 1000:.1f} s after a small one of "
                                f"{amount:.2f}, which arrived after it")
            self.open_small.put(txn_id, ts)
            timers.register_event_time_timer(ts + WINDOW_MS)
        elif amount > LARGE:
            small = max((s for s in self.open_small.values() if ts - WINDOW_MS <= s < ts),
                        default=None)
            if small is not None:
                yield alert(card, "small-then-large", txn_id, amount, ts,
                            f"{(ts - small) / 1000:.1f} s after a small one")
            else:
                self.waiting_large.put(txn_id, WaitingLarge(ts, amount))
                timers.register_event_time_timer(ts)

    def _recent(self, ts: int, txn: Txn, amount: float) -> Any:
        """The ``newest`` entry of a transaction."""
        return Recent(ts, txn["txn_id"], amount, txn["merchant"])

    def _release_timer(self, timestamp: int, ctx: KeyedContext) -> None:
        """Delete the timer at ``timestamp`` unless a waiting entry still needs it."""
        if any(w.ts == timestamp for w in self.waiting_large.values()) or any(
            ts + WINDOW_MS == timestamp for ts in self.open_small.values()
        ) or (self.limits_at_watermark
              and any(p.ts == timestamp for p in self.pending_limit.values())):
            return
        ctx.timer_service.delete_event_time_timer(timestamp)

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> Iterator[Txn]:
        """The watermark passed ``timestamp``: no transaction that could still match
        a closed window can arrive any more (it would be late); with
        ``limits_at_watermark``, the limits of the transactions it passed are checked."""
        if self.limits_at_watermark:
            for txn_id, pending in sorted(self.pending_limit.items(), key=lambda e: e[0]):
                if pending.ts <= timestamp:
                    self.pending_limit.remove(txn_id)
                    yield from self._over_limit(ctx.current_key, txn_id, pending.amount,
                                                pending.ts, pending.category, ctx)
        for txn_id, ts in list(self.open_small.items()):
            if ts + WINDOW_MS <= timestamp:
                self.open_small.remove(txn_id)
        for txn_id, large in list(self.waiting_large.items()):
            if large.ts <= timestamp:
                self.waiting_large.remove(txn_id)

    def process_broadcast_element(self, rule: Txn, ctx: BroadcastContext) -> None:
        limits = ctx.get_broadcast_state(CATEGORY_LIMITS)
        category = rule["category"]
        limits.put(category, add_version(limits.get(category), int(rule["effective_from"]),
                                         rule["limit"]))
