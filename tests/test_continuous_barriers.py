"""Barrier handlers of the continuous runtime (Flink's rules, CONTINUOUS.md): aligned
exactly-once — block, trigger once all arrived, newer barrier aborts, cancellation
markers, end of input — and at-least-once tracking, which never blocks; a model test
over random interleavings of channels checks that a checkpoint never contains a
record behind its barrier (exactly-once) and that nothing deadlocks."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from weir.runtime.continuous.barriers import (
    AbortReason,
    AlignedBarrierHandler,
    Barrier,
    BarrierTracker,
    barrier_event,
    cancel_event,
)


class Recorder:
    """Gate and task in one: what the handler blocked, triggered and aborted."""

    def __init__(self, channels: int) -> None:
        self.blocked: set[int] = set()
        self.calls: list[tuple[Any, ...]] = []
        self.channels = channels

    def block(self, channel: int) -> None:
        self.blocked.add(channel)
        self.calls.append(("block", channel))

    def unblock(self, channel: int | None = None) -> None:
        self.blocked -= set(range(self.channels)) if channel is None else {channel}

    def trigger_checkpoint(self, barrier: Barrier) -> None:
        self.calls.append(("trigger", barrier.checkpoint_id))

    def abort_checkpoint(self, checkpoint_id: int, reason: AbortReason) -> None:
        self.calls.append(("abort", checkpoint_id, reason))

    def outcomes(self) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] != "block"]


def b(n: int) -> Barrier:
    return Barrier(n, 1000 + n)


def aligned(channels: int = 3) -> tuple[AlignedBarrierHandler, Recorder]:
    rec = Recorder(channels)
    return AlignedBarrierHandler(channels, rec, rec), rec


def test_aligned_blocks_each_channel_until_all_delivered_then_triggers_once() -> None:
    handler, rec = aligned()
    handler.on_barrier(0, b(1))
    handler.on_barrier(2, b(1))
    assert rec.blocked == {0, 2} and rec.outcomes() == []
    handler.on_barrier(1, b(1))
    assert rec.outcomes() == [("trigger", 1)] and rec.blocked == set()
    handler.on_barrier(0, b(1))  # a duplicate of a checkpoint taken: ignored
    assert rec.outcomes() == [("trigger", 1)] and not handler.aligning


def test_a_newer_barrier_while_aligning_aborts_the_older_checkpoint() -> None:
    handler, rec = aligned()
    handler.on_barrier(0, b(1))
    handler.on_barrier(1, b(2))
    assert rec.outcomes() == [("abort", 1, AbortReason.CHECKPOINT_DECLINED_SUBSUMED)]
    assert rec.blocked == {1}  # only the new checkpoint's channel
    handler.on_barrier(2, b(1))  # late barrier of the aborted checkpoint: dropped
    assert rec.blocked == {1}
    handler.on_barrier(0, b(2))
    handler.on_barrier(2, b(2))
    assert rec.outcomes()[-1] == ("trigger", 2) and rec.blocked == set()


def test_cancellation_markers_abort_newer_or_started_checkpoints_only() -> None:
    handler, rec = aligned()
    handler.on_cancellation(0, 3)  # newer than anything: aborted, passed on
    assert rec.outcomes() == [("abort", 3, AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)]
    handler.on_barrier(1, b(3))  # its late barriers are dropped
    assert rec.blocked == set() and not handler.aligning
    handler.on_barrier(0, b(4))
    handler.on_cancellation(1, 4)  # equal, a barrier already received: aborted
    assert rec.outcomes()[-1][:2] == ("abort", 4) and rec.blocked == set()
    handler.on_cancellation(2, 4)  # once only
    handler.on_cancellation(2, 2)  # older: ignored
    assert len(rec.outcomes()) == 2


def test_the_end_of_an_input_aborts_the_alignment_and_is_not_waited_for_again() -> None:
    handler, rec = aligned()
    handler.on_barrier(0, b(1))
    handler.on_end_of_partition(2)
    assert rec.outcomes() == [("abort", 1, AbortReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM)]
    assert rec.blocked == set()
    handler.on_barrier(0, b(2))
    handler.on_barrier(1, b(2))  # channel 2 has ended: two barriers suffice
    assert rec.outcomes()[-1] == ("trigger", 2)


def test_one_channel_triggers_without_blocking() -> None:
    handler, rec = aligned(1)
    handler.on_event(0, barrier_event(b(5)))
    assert rec.calls == [("trigger", 5)]


def test_alignment_time_is_measured_with_the_injected_clock() -> None:
    now = [10.0]
    rec = Recorder(2)
    handler = AlignedBarrierHandler(2, rec, rec, clock=lambda: now[0])
    handler.on_barrier(0, b(1))
    now[0] = 12.5
    handler.on_barrier(1, b(1))
    assert handler.last_alignment == 2.5


def test_at_least_once_never_blocks_and_triggers_when_all_arrived() -> None:
    rec = Recorder(3)
    tracker = BarrierTracker(3, rec)
    for channel in (0, 1):
        tracker.on_event(channel, barrier_event(b(1)))
        tracker.on_event(channel, barrier_event(b(2)))
    tracker.on_barrier(2, b(2))  # 2 complete: 1 can never complete, forgotten
    assert rec.calls == [("trigger", 2)] and rec.blocked == set()
    tracker.on_barrier(2, b(1))  # old: ignored
    tracker.on_event(0, cancel_event(3))
    tracker.on_barrier(1, b(3))
    tracker.on_barrier(2, b(3))
    assert rec.calls[-1] == ("abort", 3, AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)
    tracker.on_barrier(0, b(4))
    tracker.on_end_of_partition(1)
    tracker.on_end_of_partition(2)  # the open channel delivered it: taken
    assert rec.calls[-1] == ("trigger", 4) and not tracker.pending


# ------------------------------------------------------------------ model test

@st.composite
def inputs(draw: st.DrawFn) -> tuple[int, list[list[Any]], list[int]]:
    """Per channel: records and barriers of checkpoints 1..n in order (a channel may
    carry a cancellation marker instead of a barrier), then end of partition; and the
    order in which a fair scheduler picks channels."""
    channels = draw(st.integers(1, 4))
    checkpoints = draw(st.integers(1, 5))
    queues = []
    for c in range(channels):
        queue: list[Any] = []
        seq = 0
        for n in range(1, checkpoints + 1):
            for _ in range(draw(st.integers(0, 3))):
                queue.append(("r", c, seq))
                seq += 1
            cancel = draw(st.booleans()) and draw(st.integers(0, 9)) == 0
            queue.append(cancel_event(n) if cancel else barrier_event(b(n)))
        for _ in range(draw(st.integers(0, 2))):
            queue.append(("r", c, seq))
            seq += 1
        queue.append({"kind": "end"})
        queues.append(queue)
    picks = draw(st.lists(st.integers(0, channels - 1), max_size=200))
    return channels, queues, picks


@settings(max_examples=300, deadline=None)
@given(inputs())
def test_model_aligned_snapshots_hold_exactly_the_records_before_their_barriers(
    case: tuple[int, list[list[Any]], list[int]]
) -> None:
    channels, queues, picks = case
    rec = Recorder(channels)
    handler = AlignedBarrierHandler(channels, rec, rec)
    processed: set[tuple[int, int]] = set()
    position = [0] * channels
    # where each channel's barrier n sits: records before it are those with seq < cut
    cut = {(c, ev["id"]): sum(1 for x in q[:i] if isinstance(x, tuple))
           for c, q in enumerate(queues) for i, ev in enumerate(q)
           if isinstance(ev, dict) and ev["kind"] in ("barrier", "cancel")}
    steps = 0
    pick_iter = iter(picks)
    while any(position[c] < len(queues[c]) for c in range(channels)):
        steps += 1
        assert steps < 10_000, "deadlock: a blocked channel is never released"
        ready = [c for c in range(channels)
                 if c not in rec.blocked and position[c] < len(queues[c])]
        assert ready, f"deadlock: blocked {rec.blocked} with input left"
        wanted = next(pick_iter, ready[0])
        c = wanted if wanted in ready else ready[0]
        item = queues[c][position[c]]
        position[c] += 1
        if isinstance(item, tuple):
            processed.add((item[1], item[2]))
            continue
        before = len(rec.outcomes())
        handler.on_event(c, item)
        for outcome in rec.outcomes()[before:]:
            if outcome[0] == "trigger":  # snapshot n: exactly the records before barrier n
                n = outcome[1]
                for ch in range(channels):
                    if (ch, n) in cut:
                        behind = {(ch, s) for s in range(cut[(ch, n)])}
                        assert behind <= processed, "a record before the barrier is missing"
                        assert not any(p[0] == ch and p[1] >= cut[(ch, n)] for p in processed), (
                            "a record behind the barrier is in the snapshot")
    outcomes = rec.outcomes()
    ids = [o[1] for o in outcomes]
    assert ids == sorted(ids) and len(ids) == len(set(ids))  # once each, in order
    assert rec.blocked == set()
    cancelled = {ev["id"] for q in queues for ev in q
                 if isinstance(ev, dict) and ev["kind"] == "cancel"}
    for n in cancelled:
        assert ("trigger", n) not in outcomes
