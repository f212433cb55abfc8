"""Checking a fraud demo run against the plain-Python oracle, shared by the Spark demo
(:mod:`.fraud_demo`) and the continuous one (:mod:`.fraud_continuous`): alerts, dead
letters and the final state, each as lost / duplicated / wrong counts; the demo's
work directory; the verification table."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from weir.examples.fraud import (
    CATEGORY_LIMITS,
    NEWEST,
    OPEN_SMALL,
    PER_MERCHANT,
    SPEND,
    TXN_COUNT,
    WAITING_LARGE,
)
from weir.examples.fraud_stream import Expected


@dataclass
class Check:
    """One verified quantity: what the oracle expects and what weir produced."""

    what: str
    expected: int
    got: int
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0

    @property
    def ok(self) -> bool:
        return self.lost == self.duplicated == self.wrong == 0


def check_alerts(rows: list[dict[str, Any]], expected: Expected) -> Check:
    """The sink's committed alert rows against the oracle's alerts."""
    counts = Counter((r["txn_id"], r["rule"]) for r in rows)
    values = {(r["txn_id"], r["rule"]): (r["card_id"], r["amount"], r["ts_ms"]) for r in rows}
    wrong = len(set(counts) - set(expected.alerts)) + sum(
        1 for k, v in values.items() if k in expected.alerts and expected.alerts[k] != v
    )
    return Check("alerts in the sink", len(expected.alerts), len(rows),
                 lost=len(set(expected.alerts) - set(counts)),
                 duplicated=sum(n - 1 for n in counts.values()), wrong=wrong)


def check_dead_letters(letters: list[dict[str, Any]], expected: Expected) -> Check:
    """The dead letters (each with the refused ``record``) against the oracle's
    invalid transactions."""
    counts = Counter(str(d["record"].get("txn_id")) for d in letters)
    return Check("dead letters", len(expected.dead), len(letters),
                 lost=len(expected.dead - set(counts)),
                 duplicated=sum(n - 1 for n in counts.values()),
                 wrong=len(set(counts) - expected.dead))


def state_checks(harness: Any, expected: Expected, watermark: int) -> list[Check]:
    """Every card's state, the broadcast state and the pending timers of ``harness``
    (a :class:`~weir.testing.KeyedBroadcastOperatorHarness` holding every key group)
    against the oracle, given the final ``watermark``."""
    cards = set(expected.cards) | set(harness.keys(TXN_COUNT))
    bad_cards = 0
    for card in cards:
        want = expected.cards.get(card)
        if want is None:
            bad_cards += 1
            continue
        got = (
            harness.state_of(card, TXN_COUNT),
            round((harness.state_of(card, SPEND) or 0) * 100),
            harness.state_of(card, PER_MERCHANT),
            [[r.ts, r.txn_id, r.amount, r.merchant]
             for r in harness.state_of(card, NEWEST) or []],
            harness.state_of(card, OPEN_SMALL),
            {k: (w.ts, w.amount) for k, w in harness.state_of(card, WAITING_LARGE).items()},
        )
        if got != (want.count, want.spend_cents, dict(want.per_merchant), want.newest,
                   expected.open_small(card, watermark),
                   expected.waiting_large(card, watermark)):
            bad_cards += 1
    limits = {c: [tuple(v) for v in vs]
              for c, vs in harness.broadcast_state_of(CATEGORY_LIMITS).items()}
    want_limits = {c: [tuple(v) for v in vs] for c, vs in expected.limits.items()}
    bad_limits = sum(1 for c in set(limits) | set(want_limits)
                     if limits.get(c) != want_limits.get(c))
    timers = set(harness.event_time_timers())
    want_timers = expected.timers(watermark)
    return [
        Check("card state", len(expected.cards), len(cards), wrong=bad_cards),
        Check("broadcast state (limits)", len(want_limits), len(limits), wrong=bad_limits),
        Check("pending event-time timers", len(want_timers), len(timers),
              lost=len(want_timers - timers), wrong=len(timers - want_timers)),
    ]


def verification_table(checks: list[Check], title: str) -> Table:
    """The checks as the demos print them (counts in green when zero)."""
    table = Table(title=title)
    for col in ("", "oracle", "weir", "lost", "duplicated", "wrong"):
        table.add_column(col, justify="left" if not col else "right")
    for c in checks:
        style = "green" if c.ok else "red"
        table.add_row(c.what, f"{c.expected:,}", f"{c.got:,}", f"[{style}]{c.lost}",
                      f"[{style}]{c.duplicated}", f"[{style}]{c.wrong}")
    return table


def in_work_directory(work: str | None, keep: bool, prefix: str, console: Console,
                      demo: Callable[[Path], int]) -> int:
    """Run ``demo`` in the work directory ``work`` (which must be new or empty; else
    exit status 2) or a new temporary one; delete it afterwards unless ``keep``."""
    if work:
        directory = Path(work)
        if directory.exists() and any(directory.iterdir()):
            console.print(f"[red]{directory} is not empty; give a new or empty --work "
                          f"directory[/]")
            return 2
        directory.mkdir(parents=True, exist_ok=True)
    else:
        directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        return demo(directory)
    finally:
        if keep:
            console.print(f"work directory kept: {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
