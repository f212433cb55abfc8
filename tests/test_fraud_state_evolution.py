"""The fraud example's state evolves (issue 41): its detector keeps dataclasses in state
(``Recent``, ``WaitingLarge``, ``PendingLimit``), and ``Recent`` gained a field
(``merchant``) in its second version. A savepoint of the previous version — the same
detector keeping ``RecentV1`` records — restores into today's detector, on both
backends, and the job goes on: every alert and every state value match the oracle,
the migrated records with ``merchant`` at its default (None)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Any

import weir
from weir import ListStateDescriptor, RecordSerializer
from weir.examples.fraud import (
    CATEGORY_LIMITS,
    NEWEST,
    CardFraudDetector,
    InvalidTransaction,
    Recent,
)
from weir.examples.fraud_stream import Expected, generate, oracle
from weir.examples.fraud_verify import check_alerts, state_checks
from weir.testing import KeyedBroadcastOperatorHarness

WATERMARK_DELAY_MS = 30_000


@dataclasses.dataclass
class RecentV1:
    """``Recent`` as version 1 of the example had it (no merchant)."""

    ts: int
    txn_id: str
    amount: float


class DetectorV1(CardFraudDetector):
    """Version 1 of the detector: the same rules, ``RecentV1`` in state."""

    newest_state = ListStateDescriptor("newest", RecordSerializer(RecentV1), ttl=NEWEST.ttl)

    def _recent(self, ts: int, txn: Any, amount: float) -> Any:
        return RecentV1(ts, txn["txn_id"], amount)


def feed(harness: KeyedBroadcastOperatorHarness, events: list[Any], watermark: int
         ) -> tuple[list[Any], int]:
    """``events`` in arrival order, the watermark following them at the stream's
    delay; what the detector emitted and the watermark reached."""
    out: list[Any] = []
    newest_ts = watermark + WATERMARK_DELAY_MS
    for i, txn in enumerate(events):
        if txn["card_id"] is None:
            continue  # (no key: the runtimes dead-letter it before the detector)
        with contextlib.suppress(InvalidTransaction):  # (the runtimes dead-letter it)
            out += harness.process_element(txn, timestamp=txn["ts"])
        newest_ts = max(newest_ts, txn["ts"] or newest_ts)
        if i % 100 == 99 and newest_ts - WATERMARK_DELAY_MS > watermark:
            watermark = newest_ts - WATERMARK_DELAY_MS
            out += harness.advance_watermark(watermark)
    return out, watermark


def test_a_savepoint_of_the_previous_detector_restores_into_todays(
        tmp_path: Any, backend: str) -> None:
    stream = generate(3_000, 400, seed=11)
    expected = oracle(stream)
    half = len(stream.events) // 2
    first, second = stream.events[:half], stream.events[half:]

    key = lambda txn: txn["card_id"]  # noqa: E731
    with KeyedBroadcastOperatorHarness(DetectorV1(), key, state_backend=backend, uid="fraud",
                                       broadcast_state_descriptors=[CATEGORY_LIMITS]) as old:
        for rules in stream.rules:
            for rule in rules:
                old.process_broadcast_element(rule)
        alerts, watermark = feed(old, first, -(2**62))
        url = old.savepoint(weir.CheckpointCoordinator(tmp_path / "chk"), tmp_path / "v1").url

    with KeyedBroadcastOperatorHarness.restore(
            CardFraudDetector(), key, weir.load_checkpoint(url), parallelism=1,
            subtask_index=0, uid="fraud", state_backend=backend,
            broadcast_state_descriptors=[CATEGORY_LIMITS]) as new:
        more, watermark = feed(new, second, watermark)
        alerts += more
        newest = {card: new.state_of(card, NEWEST) for card in expected.cards}
        checks = [check_alerts(alerts, expected),
                  *state_checks(new, migrated(expected, first), watermark)]

    assert [c for c in checks if not c.ok] == []
    assert alerts and all(c.lost == c.duplicated == c.wrong == 0 for c in checks)
    records = [r for rs in newest.values() for r in rs]
    assert {type(r) for r in records} == {Recent}
    assert {r.merchant is None for r in records} == {True, False}  # (both versions' records)


def migrated(expected: Expected, first: list[Any]) -> Expected:
    """The oracle's answer with the merchant of the first half's transactions at the
    default of the field added in version 2."""
    before = {txn["txn_id"] for txn in first}
    out = copy.deepcopy(expected)
    for state in out.cards.values():
        state.newest = [[ts, i, amount, None if i in before else merchant]
                        for ts, i, amount, merchant in state.newest]
    return out
