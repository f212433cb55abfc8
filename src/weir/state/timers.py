"""Timers, kept as keyed state: per key, deduplicated, fired in timestamp order.

Each time domain has a queue of ``(timestamp, prefixed_key)``: a heap for order and
a set for deduplication and deletion (deleted timers are skipped when popped).
Timers are snapshotted with the keyed state of their key group as entries
``(prefixed_key + int64_be(timestamp), b"")`` of the internal states
``__weir_timers/event`` and ``__weir_timers/processing``, so they move with their
keys when the parallelism changes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

__all__ = ["EVENT_TIMERS", "PROCESSING_TIMERS", "TimerQueue"]

EVENT_TIMERS = "__weir_timers/event"
PROCESSING_TIMERS = "__weir_timers/processing"


class TimerQueue:
    """Timers of one time domain of one subtask."""

    __slots__ = ("_dirty", "_heap", "_live")

    def __init__(self) -> None:
        self._heap: list[tuple[int, bytes]] = []
        self._live: set[tuple[int, bytes]] = set()
        #: timers registered, deleted or fired since the last ``take_changes`` (None:
        #: not tracked)
        self._dirty: set[tuple[int, bytes]] | None = None

    def __len__(self) -> int:
        return len(self._live)

    def register(self, timestamp: int, key: bytes) -> None:
        """Add a timer; a second registration of the same (timestamp, key) is a no-op."""
        timer = (timestamp, key)
        if timer not in self._live:
            self._live.add(timer)
            heapq.heappush(self._heap, timer)
            if self._dirty is not None:
                self._dirty.add(timer)

    def delete(self, timestamp: int, key: bytes) -> None:
        """Remove a timer if present."""
        timer = (timestamp, key)
        if timer in self._live:
            self._live.discard(timer)
            if self._dirty is not None:
                self._dirty.add(timer)

    def pop_due(self, time: int) -> tuple[int, bytes] | None:
        """The earliest timer with ``timestamp <= time``, removed; None if none is due."""
        heap, live = self._heap, self._live
        while heap and heap[0][0] <= time:
            timer = heapq.heappop(heap)
            if timer in live:
                live.discard(timer)
                if self._dirty is not None:
                    self._dirty.add(timer)
                return timer
        return None

    def track_changes(self) -> None:
        """Start (or start over) recording which timers change: the timers as of now
        are the base that :meth:`take_changes` reports changes against."""
        self._dirty = set()

    def take_changes(self) -> list[tuple[bytes, list[tuple[bytes, bytes]]]]:
        """``(entry key, [its canonical entry] or [] if gone)`` of every timer
        registered, deleted or fired since the last call; the record starts over."""
        dirty, self._dirty = self._dirty or set(), set()
        live = self._live
        out = []
        for timer in dirty:
            ts, key = timer
            composite = key + ts.to_bytes(8, "big", signed=True)
            out.append((composite, [(composite, b"")] if timer in live else []))
        return out

    def timers(self) -> list[tuple[int, bytes]]:
        """All pending timers in firing order."""
        return sorted(self._live)

    def snapshot_entries(self) -> list[tuple[bytes, bytes]]:
        """Canonical snapshot entries."""
        return [(key + ts.to_bytes(8, "big", signed=True), b"") for ts, key in self._live]

    def replace_entries(
        self, primaries: Iterable[bytes], entries: Iterable[tuple[bytes, bytes]]
    ) -> None:
        """Apply a changelog delta's timer changes: the timers named by ``primaries``
        (entry keys) are deleted, then those of ``entries`` registered."""
        for composite in primaries:
            self.delete(int.from_bytes(composite[-8:], "big", signed=True), composite[:-8])
        self.restore_entries(entries)

    def restore_entries(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        """Add timers from snapshot entries."""
        for composite, _ in entries:
            self.register(int.from_bytes(composite[-8:], "big", signed=True), composite[:-8])
