"""Per-split watermarks of a source task (Flink's split-local watermark generators
combined by ``WatermarkOutputMultiplexer``), for a reader that tells its records'
splits apart (:meth:`weir.api.connectors.SourceReader.live_splits`, a Kafka partition).

Each live split has its own watermark: its largest timestamp minus the strategy's
out-of-orderness (minus 1), or the minimum (holding event time back) while it has read
no timestamped record. A split is *idle* (Flink's ``WatermarksWithIdleness`` per split)
once it has read nothing for ``idleness_ms`` — counted from its last record, or from its
assignment for one that read none — and it never is at a check with records since the
previous check. The task's watermark is the smallest of the splits that are not idle;
the task is idle when every split is. A split the reader no longer lists (a bounded
split at its end) is released: it holds nothing back any more. A reader with no split
at all is idle after ``idleness_ms`` without records (what an idle reader of a source
with fewer splits than subtasks is); without idleness it holds event time back, as in
Flink.

The combined watermark goes out only as it rises (the source loop's ``send_watermark``):
a split that was idle and reads records behind it holds the task's watermark where it
is until the split catches up, never sends it back."""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from weir.api.watermarks import MIN_WATERMARK, WatermarkStrategy

__all__ = ["SplitWatermarks"]


class _Split:
    """One split's watermark generator with its idleness timer."""

    __slots__ = ("fresh", "largest", "last_record")

    def __init__(self, now: float) -> None:
        self.largest = MIN_WATERMARK  # (the largest timestamp read)
        self.last_record = now  # (its last record's time; its assignment before one)
        self.fresh = False  # (records since the previous check)


class SplitWatermarks:
    """The watermark of a source task over its splits (see the module doc); times are
    ``time.monotonic()`` seconds."""

    def __init__(self, strategy: WatermarkStrategy, splits: Iterable[Hashable],
                 now: float) -> None:
        self._lag = strategy.max_out_of_orderness_ms + 1
        self._idleness_s = (None if strategy.idleness_ms is None
                            else strategy.idleness_ms / 1000)
        self._splits = {split: _Split(now) for split in splits}
        #: for a reader without splits: its last record's time, records since a check
        self._last_record, self._fresh = now, False

    @property
    def splits(self) -> list[Hashable]:
        """The splits tracked now."""
        return list(self._splits)

    def read(self, split: Hashable, largest: int, now: float) -> None:
        """Records of ``split`` were read at ``now``; ``largest`` is their largest
        timestamp (``MIN_WATERMARK`` if none had one). A split not seen before is
        assigned now."""
        state = self._splits.get(split)
        if state is None:
            state = self._splits[split] = _Split(now)
        if largest > state.largest:
            state.largest = largest
        state.last_record, state.fresh = now, True
        self._last_record, self._fresh = now, True

    def check(self, now: float, live: Iterable[Hashable]) -> tuple[int | None, bool]:
        """The periodic check at ``now`` with the reader's live splits: (the task's
        watermark, or None while a split holds it at the minimum; whether the task is
        idle). Splits not live any more are released, new ones assigned now."""
        splits = self._splits
        live = set(live)
        for gone in [s for s in splits if s not in live]:
            del splits[gone]
        for split in live:
            if split not in splits:
                splits[split] = _Split(now)
        idleness = self._idleness_s
        fresh, self._fresh = self._fresh, False
        if not splits:
            return None, (idleness is not None and not fresh
                          and now - self._last_record >= idleness)
        lowest: int | None = None
        for state in splits.values():
            if (idleness is not None and not state.fresh
                    and now - state.last_record >= idleness):
                continue  # idle: holds nothing back
            state.fresh = False
            mark = (state.largest - self._lag if state.largest > MIN_WATERMARK
                    else MIN_WATERMARK)
            if lowest is None or mark < lowest:
                lowest = mark
        if lowest is None:
            return None, True
        return (lowest if lowest > MIN_WATERMARK else None), False
