"""Test harnesses for users' own functions (public: import from ``weir.testing``).

A harness hosts one parallel instance of a function exactly as a runtime does —
same state backends, key groups, timers and snapshots — and lets a test feed
elements, move time and take and restore snapshots::

    with KeyedOperatorHarness(CountPerKey(), key_selector=lambda e: e["user"]) as h:
        assert h.process_element({"user": "a"}) == [("a", 1)]
        snapshot = h.snapshot()
    restored = KeyedOperatorHarness.restore(
        CountPerKey(), lambda e: e["user"], [snapshot], parallelism=2, subtask_index=0
    )
"""

from weir.testing.harness import (
    CheckpointedFunctionHarness,
    KeyedBroadcastOperatorHarness,
    KeyedOperatorHarness,
    ManualClock,
)

__all__ = [
    "CheckpointedFunctionHarness",
    "KeyedBroadcastOperatorHarness",
    "KeyedOperatorHarness",
    "ManualClock",
]
