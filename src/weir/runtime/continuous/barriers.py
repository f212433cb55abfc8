"""What a task does with the checkpoint barriers arriving on its input channels: Flink's
barrier handlers, as state machines over the events of an input gate.

Events (on the wire, in order with the records of their channel): a barrier
``{"kind": "barrier", "id": n, "ts": ms, "savepoint": url or None}``, a cancellation marker
``{"kind": "cancel", "id": n}``, the end of a channel's partition ``{"kind": "end"}``.

**Exactly-once: aligned** (:class:`AlignedBarrierHandler`, Flink's
``SingleCheckpointBarrierHandler`` with aligned barriers). A channel that delivered
barrier n is blocked (the gate withholds its credit) until every open channel did; then
the task takes checkpoint n (:meth:`BarrierActions.trigger_checkpoint`: snapshot,
forward the barrier) and every channel is unblocked. A barrier of a checkpoint already
taken or aborted is ignored. A barrier of a newer checkpoint while aligning aborts the
current one (:meth:`BarrierActions.abort_checkpoint`: decline it, send a cancellation
marker downstream), unblocks everything and starts aligning the new one. A cancellation
marker aborts the checkpoint if its id is newer than the current one, or equal with at
least one barrier already received; later barriers of an aborted id are dropped. The end
of a channel's input during a pending alignment aborts it; afterwards that channel is
no longer waited for.

**Exactly-once: unaligned** (the same handler with ``unaligned=True``; Flink's
``SingleCheckpointBarrierHandler`` with unaligned and timeout-able barriers). A barrier
marked ``unaligned`` (it overtook the buffers queued before it), or any barrier when
``aligned_timeout_ms`` is 0, triggers the checkpoint at once
(:meth:`BarrierActions.trigger_checkpoint` with the channels whose barrier came in
order): nothing is blocked, and the gate records, per channel, the buffers before that
channel's barrier as the checkpoint's input state. With ``aligned_timeout_ms`` > 0 a
checkpoint starts aligned and switches to unaligned when an unaligned barrier comes or
:meth:`AlignedBarrierHandler.check_timeout` finds that long passed since the barrier's
trigger timestamp. Savepoints and the final checkpoint (``Barrier.aligned``) are always
aligned. The checkpoint is done when every open channel delivered its barrier.

**At-least-once: tracking** (:class:`BarrierTracker`, Flink's
``CheckpointBarrierTracker``). Nothing is ever blocked: barriers are counted per
checkpoint id, and when every open channel delivered barrier n, the task takes
checkpoint n and forgets the older ids still counting (they can never complete).
Records behind barrier n on a fast channel may be in snapshot n, so they are replayed
after a restore: duplicates, on operators with several input channels only.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "AbortReason", "AlignedBarrierHandler", "Barrier", "BarrierActions", "BarrierTracker",
    "GateControl", "barrier_event", "cancel_event",
]


@dataclass(frozen=True, slots=True)
class Barrier:
    """Checkpoint barrier ``checkpoint_id``, triggered at ``timestamp_ms``; of a savepoint
    into the storage at URL ``savepoint`` when that is given."""

    checkpoint_id: int
    timestamp_ms: int
    savepoint: str | None = None
    #: it overtook the buffers queued before it (an unaligned checkpoint's barrier)
    unaligned: bool = False
    #: a checkpoint that is aligned even when checkpoints are unaligned (the final one)
    aligned: bool = False

    @staticmethod
    def of(event: Mapping[str, Any]) -> Barrier:
        """The barrier of a ``{"kind": "barrier", ...}`` event."""
        target = event.get("savepoint")
        return Barrier(int(event["id"]), int(event["ts"]),
                       str(target) if target is not None else None,
                       bool(event.get("unaligned", False)), bool(event.get("aligned", False)))

    @property
    def must_align(self) -> bool:
        """Whether this checkpoint is aligned whatever the settings: savepoints and the
        final checkpoint."""
        return self.savepoint is not None or self.aligned


def barrier_event(barrier: Barrier) -> dict[str, Any]:
    """The event that carries ``barrier`` on a channel."""
    event = {"kind": "barrier", "id": barrier.checkpoint_id, "ts": barrier.timestamp_ms,
             "savepoint": barrier.savepoint}
    if barrier.aligned:
        event["aligned"] = True
    return event


def cancel_event(checkpoint_id: int) -> dict[str, Any]:
    """The cancellation marker of ``checkpoint_id``."""
    return {"kind": "cancel", "id": checkpoint_id}


class AbortReason(enum.Enum):
    """Why a task gave a checkpoint up (Flink's ``CheckpointFailureReason`` names)."""

    #: a barrier of a newer checkpoint came while aligning this one
    CHECKPOINT_DECLINED_SUBSUMED = "a barrier of a newer checkpoint arrived"
    #: a cancellation marker came from upstream
    CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER = "an upstream task declined it"
    #: a channel ended while aligning
    CHECKPOINT_DECLINED_INPUT_END_OF_STREAM = "an input ended during the alignment"


def decline_message(checkpoint_id: int, reason: AbortReason) -> dict[str, Any]:
    """A task's ``decline`` of ``checkpoint_id`` at its barriers, for the coordinator:
    the reason is the handler's (``CheckpointFailureReason`` by name), none of which
    counts against ``tolerable_failures`` — a checkpoint given up at the barriers is
    not a failed one (Flink's ``abortCheckpointOnBarrier`` declines with the
    handler's ``CheckpointException`` reason)."""
    return {"kind": "decline", "id": checkpoint_id, "reason": reason.name,
            "error": reason.value}


class GateControl(Protocol):
    """What a handler may do to the task's input gate."""

    def block(self, channel: int) -> None:
        """Take nothing more from ``channel``."""

    def unblock(self, channel: int | None = None) -> None:
        """Take from ``channel`` (None: every channel) again."""


class BarrierActions(Protocol):
    """What a handler asks its task to do."""

    def trigger_checkpoint(self, barrier: Barrier,
                           in_order: frozenset[int] | None = None) -> None:
        """Snapshot and forward ``barrier`` downstream: aligned (``in_order`` None:
        every open channel delivered it), or unaligned (``in_order``: the channels
        whose barrier the task took in order; the others' input state is recorded)."""

    def abort_checkpoint(self, checkpoint_id: int, reason: AbortReason) -> None:
        """Give ``checkpoint_id`` up: decline it, send its cancellation marker on."""


class _Handler:
    """What both handlers share: channels open or ended, the alignment clock."""

    def __init__(self, channels: int, actions: BarrierActions,
                 clock: Callable[[], float] | None = None) -> None:
        self.channels = channels
        self.actions = actions
        self.ended: set[int] = set()
        self._clock = clock
        self._started: float | None = None
        #: how long the last completed alignment took (first barrier to the last), in
        #: the clock's unit; None before any
        self.last_alignment: float | None = None

    @property
    def alignment_started(self) -> float | None:
        """When the alignment under way started (the clock's reading), if one is."""
        return self._started

    @property
    def open_channels(self) -> int:
        """Channels whose input has not ended."""
        return self.channels - len(self.ended)

    def on_event(self, channel: int, event: Mapping[str, Any]) -> None:
        """Hand an event of ``channel`` to the handler (other kinds are ignored)."""
        kind = event.get("kind")
        if kind == "barrier":
            self.on_barrier(channel, Barrier.of(event))
        elif kind == "cancel":
            self.on_cancellation(channel, int(event["id"]))
        elif kind == "end":
            self.on_end_of_partition(channel)

    def on_barrier(self, channel: int, barrier: Barrier) -> None:
        raise NotImplementedError

    def on_cancellation(self, channel: int, checkpoint_id: int) -> None:
        raise NotImplementedError

    def on_end_of_partition(self, channel: int) -> None:
        raise NotImplementedError

    def _start_clock(self) -> None:
        self._started = self._clock() if self._clock is not None else None

    def _stop_clock(self) -> None:
        if self._clock is not None and self._started is not None:
            self.last_alignment = self._clock() - self._started
        self._started = None


class AlignedBarrierHandler(_Handler):
    """Exactly-once barrier alignment (see the module doc)."""

    def __init__(self, channels: int, gate: GateControl, actions: BarrierActions,
                 clock: Callable[[], float] | None = None, *, unaligned: bool = False,
                 aligned_timeout_ms: int = 0,
                 wall_ms: Callable[[], float] = lambda: time.time() * 1000) -> None:
        super().__init__(channels, actions, clock)
        self.gate = gate
        self.unaligned, self.aligned_timeout_ms, self._wall_ms = (
            unaligned, aligned_timeout_ms, wall_ms)
        #: the checkpoint being aligned, or the last one taken or aborted
        self.current_id = 0
        #: channels that delivered the current checkpoint's barrier (empty: not aligning)
        self.received: set[int] = set()
        #: of those, the channels whose barrier came in order (not overtaking)
        self.in_order: set[int] = set()
        #: the current checkpoint was taken unaligned; its other barriers are awaited
        self.triggered = False
        self._barrier: Barrier | None = None

    @property
    def aligning(self) -> bool:
        """Whether a checkpoint's barriers are being aligned."""
        return bool(self.received)

    def on_barrier(self, channel: int, barrier: Barrier) -> None:
        """Barrier ``barrier`` arrived on ``channel``."""
        if barrier.checkpoint_id < self.current_id or (
                barrier.checkpoint_id == self.current_id and not self.received):
            return  # an older checkpoint's, or one taken or aborted already
        if barrier.checkpoint_id > self.current_id:
            if self.received:
                self._abort(self.current_id, AbortReason.CHECKPOINT_DECLINED_SUBSUMED)
            self.current_id = barrier.checkpoint_id
            self._barrier = barrier
            self.in_order = set()
            self._start_clock()
        self.received.add(channel)
        if not barrier.unaligned:
            self.in_order.add(channel)
        if self.triggered:
            self._done_if_all()
        elif self.unaligned and not barrier.must_align and (
                barrier.unaligned or self.aligned_timeout_ms == 0 or self._timed_out()):
            self._trigger_unaligned()
        elif self.received >= set(range(self.channels)) - self.ended:
            self._complete()
        else:
            self.gate.block(channel)

    def check_timeout(self) -> None:
        """Switch the checkpoint being aligned to unaligned if its alignment timed out
        (the task calls this while it waits for input)."""
        if self.received and not self.triggered and self.unaligned and self._timed_out():
            self._trigger_unaligned()

    def _timed_out(self) -> bool:
        barrier = self._barrier
        return (barrier is not None and not barrier.must_align
                and self._wall_ms() - barrier.timestamp_ms >= self.aligned_timeout_ms)

    def _trigger_unaligned(self) -> None:
        assert self._barrier is not None
        self.triggered = True
        self.gate.unblock()
        self.actions.trigger_checkpoint(self._barrier, frozenset(self.in_order))
        self._done_if_all()

    def _done_if_all(self) -> None:
        if self.received >= set(range(self.channels)) - self.ended:
            self.received.clear()
            self.triggered = False
            self._stop_clock()

    def on_cancellation(self, channel: int, checkpoint_id: int) -> None:
        """The cancellation marker of ``checkpoint_id`` arrived on ``channel``."""
        if checkpoint_id > self.current_id or (
                checkpoint_id == self.current_id and self.received):
            if self.received:
                self.received.clear()
                self.triggered = False
                self.gate.unblock()
                self._stop_clock()
            self.current_id = checkpoint_id
            self.actions.abort_checkpoint(
                checkpoint_id, AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)

    def on_end_of_partition(self, channel: int) -> None:
        """``channel``'s input ended."""
        self.ended.add(channel)
        if self.triggered:
            self._done_if_all()
        elif self.received:
            self._abort(self.current_id, AbortReason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM)

    def _complete(self) -> None:
        assert self._barrier is not None
        barrier = self._barrier
        self.received.clear()
        self._stop_clock()
        self.actions.trigger_checkpoint(barrier)
        self.gate.unblock()

    def _abort(self, checkpoint_id: int, reason: AbortReason) -> None:
        self.received.clear()
        self.triggered = False
        self.gate.unblock()
        self._stop_clock()
        self.actions.abort_checkpoint(checkpoint_id, reason)


class BarrierTracker(_Handler):
    """At-least-once barrier tracking (see the module doc): never blocks."""

    #: checkpoints counted at once; beyond it the oldest is forgotten (Flink: 50)
    MAX_TRACKED = 50

    def __init__(self, channels: int, actions: BarrierActions,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(channels, actions, clock)
        #: checkpoint id -> (its barrier, channels that delivered it, aborted)
        self.pending: dict[int, tuple[Barrier, set[int], bool]] = {}
        self.latest_id = 0  # the newest id seen

    def on_barrier(self, channel: int, barrier: Barrier) -> None:
        """Barrier ``barrier`` arrived on ``channel``."""
        cid = barrier.checkpoint_id
        entry = self.pending.get(cid)
        if entry is None:
            if cid <= self.latest_id:
                return  # an old checkpoint's, dropped already
            self.latest_id = cid
            entry = (barrier, set(), False)
            self.pending[cid] = entry
            if len(self.pending) > self.MAX_TRACKED:
                del self.pending[min(self.pending)]
            if len(self.pending) == 1:
                self._start_clock()
        entry[1].add(channel)
        self._check(cid)

    def on_cancellation(self, channel: int, checkpoint_id: int) -> None:
        """The cancellation marker of ``checkpoint_id`` arrived on ``channel``."""
        entry = self.pending.get(checkpoint_id)
        if entry is None:
            if checkpoint_id <= self.latest_id:
                return
            self.latest_id = checkpoint_id
            self.pending[checkpoint_id] = (Barrier(checkpoint_id, 0), {channel}, True)
            self._forget_before(checkpoint_id)
            self.actions.abort_checkpoint(
                checkpoint_id, AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)
        elif not entry[2]:
            self.pending[checkpoint_id] = (entry[0], entry[1] | {channel}, True)
            self.actions.abort_checkpoint(
                checkpoint_id, AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)
        self._check(checkpoint_id)

    def on_end_of_partition(self, channel: int) -> None:
        """``channel``'s input ended: later checkpoints do not wait for it."""
        self.ended.add(channel)
        for cid in sorted(self.pending):
            if cid in self.pending:
                self._check(cid)

    def _check(self, checkpoint_id: int) -> None:
        barrier, seen, aborted = self.pending[checkpoint_id]
        if not seen | self.ended >= set(range(self.channels)):
            return
        self._forget_before(checkpoint_id)
        del self.pending[checkpoint_id]
        self._stop_clock()
        if not aborted:
            self.actions.trigger_checkpoint(barrier)
        if self.pending:
            self._start_clock()

    def _forget_before(self, checkpoint_id: int) -> None:
        for cid in [c for c in self.pending if c < checkpoint_id]:
            del self.pending[cid]
