"""When checkpoints start, and what follows when they end: Flink's checkpoint scheduling
rules as pure logic over injected millisecond clocks (no threads, no I/O, no sleep).

Two clocks, as Flink's ``CheckpointCoordinator`` has (``clock.relativeTimeMillis()``
and ``clock.absoluteTimeMillis()``): every interval, minimum pause, timeout, wake-up
time and the queue's age order are measured on a **monotonic** clock, so a step of the
wall clock (NTP, a suspended VM, an operator's ``date -s``) neither stalls checkpoints
(and the sink commits that follow them) for as long as it stepped back nor expires the
pending ones when it steps forward; the **wall clock** only gives the trigger timestamp
each started checkpoint carries (recorded in its metadata).

The job's driver loop owns one :class:`CheckpointScheduler`. It calls :meth:`~
CheckpointScheduler.poll` whenever :meth:`~CheckpointScheduler.next_wakeup_ms` says (or
sooner) and carries out the decisions it returns; it tells the scheduler of requests
(:meth:`~CheckpointScheduler.request`) and of the end of each checkpoint it started
(:meth:`~CheckpointScheduler.completed`, :meth:`~CheckpointScheduler.failed`,
:meth:`~CheckpointScheduler.declined`), which return their consequences. Writing,
completing and retaining checkpoints is :mod:`weir.checkpoint.coordinator`'s business.

The rules, and the Flink class each comes from:

* Requests (``CheckpointCoordinator.triggerCheckpoint``, ``CheckpointRequestDecider``).
  A request waits in a queue ordered savepoints first, then forced requests, then
  manual (non-periodic) ones, then periodic ones, oldest first within each. Savepoints
  are forced unless checkpoints are unaligned (``CheckpointProperties.forSavepoint(
  !unaligned)``), and so is the job's final checkpoint (``FORCED``): unaligned ones run
  one at a time. The queue holds at most 1000 requests: a request beyond that is
  dropped with ``TOO_MANY_CHECKPOINT_REQUESTS`` — the new one if every queued request
  is non-periodic, else the queue's last (the newest periodic one).
* Start (``CheckpointRequestDecider.chooseRequestToExecute``). While ``max_concurrent``
  checkpoints are pending, only a forced request at the head of the queue starts; the
  others wait. Otherwise the head starts, except a periodic one (the pause applies to
  no other) less than ``min_pause_ms`` after the last completion: it is dropped with
  ``MINIMUM_TIME_BETWEEN_CHECKPOINTS`` and the periodic trigger rescheduled to the end
  of the pause (``rescheduleTrigger``). A started checkpoint gets the next id.
* Periodic trigger (``CheckpointCoordinator.startCheckpointScheduler``): from
  :meth:`~CheckpointScheduler.start`, a periodic request every ``interval_ms`` (at
  least ``min_pause_ms``) at a fixed rate, the first after ``interval_ms`` or, given an
  ``rng``, after Flink's random initial delay in ``[min_pause_ms, interval_ms]``. One
  made while periodic scheduling is stopped is dropped with
  ``PERIODIC_SCHEDULER_SHUTDOWN`` (``preCheckGlobalState``).
* Expiry (``CheckpointCoordinator.CheckpointCanceller``): a checkpoint still pending
  ``timeout_ms`` after its trigger is aborted with ``CHECKPOINT_EXPIRED``.
* Completion (``completePendingCheckpoint``, ``dropSubsumedCheckpoints``): records the
  time (for the pause); unless it is a savepoint that is not synchronous, every older
  pending checkpoint that is not a savepoint is aborted with ``CHECKPOINT_SUBSUMED``.
* Failures (``CheckpointFailureManager``). Only ``IO_EXCEPTION``,
  ``CHECKPOINT_ASYNC_EXCEPTION``, ``CHECKPOINT_DECLINED``, ``CHECKPOINT_EXPIRED`` and
  ``FINALIZE_CHECKPOINT_FAILURE`` count, each checkpoint id once; a failure of an id at
  or below the last completed one is ignored; a completion resets the count. A count
  above ``tolerable_failures`` fails the job (:class:`JobFailure`) and resets the
  count. A failure on the coordinator's side (:meth:`~CheckpointScheduler.failed`,
  expiry, subsumption, or a pre-flight reason) of a savepoint never counts; a failure
  reported by a task (:meth:`~CheckpointScheduler.declined`) of a synchronous savepoint
  (stop-with-savepoint) fails the job at once.

Where weir differs: :meth:`~CheckpointScheduler.poll` decides until nothing more can
happen at that instant (Flink decides once per event, so there a second stale periodic
request queued behind one dropped for the pause starts with the rescheduled trigger
instead of being dropped too); a periodic tick missed because poll came late is not
caught up (Java's fixed-rate timer fires missed ticks back to back); Flink's wait while
more than ``max_concurrent`` checkpoints are being cleaned up is the storage's concern.
"""

from __future__ import annotations

import bisect
import enum
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from weir.api.checkpointing import CheckpointConfig
from weir.errors import CheckpointError, ConfigurationError

__all__ = ["MAX_QUEUED_REQUESTS", "AbortedCheckpoint", "CheckpointFailureReason",
           "CheckpointScheduler", "Decision", "DroppedRequest", "JobFailure", "RequestKind",
           "StartCheckpoint", "monotonic_ms", "wall_clock_ms"]

MAX_QUEUED_REQUESTS = 1000
"""Flink's bound of the request queue (``CheckpointRequestDecider``)."""


def monotonic_ms() -> int:
    """Monotonic time in int milliseconds (any origin): the scheduler's default clock
    for every interval, pause and timeout."""
    return time.monotonic_ns() // 1_000_000


def wall_clock_ms() -> int:
    """Wall-clock time in epoch milliseconds: the scheduler's default clock for the
    trigger timestamps of the checkpoints it starts."""
    return time.time_ns() // 1_000_000


class RequestKind(enum.Enum):
    """What is requested; savepoints rank first, then forced, manual, periodic."""

    SAVEPOINT = "savepoint"
    """A savepoint (user-owned, never subsumed); forced unless checkpoints are unaligned."""
    SYNC_SAVEPOINT = "sync_savepoint"
    """The savepoint of stop-with-savepoint: a task's failure of it fails the job."""
    FORCED = "forced"
    """A checkpoint that starts even with ``max_concurrent`` checkpoints pending (the
    job's final one), unless checkpoints are unaligned."""
    MANUAL = "manual"
    """A checkpoint asked for now (Flink's REST trigger): no minimum pause."""
    PERIODIC = "periodic"
    """A checkpoint of the periodic trigger."""

    @property
    def savepoint(self) -> bool:  # SAVEPOINT or SYNC_SAVEPOINT
        return self in (RequestKind.SAVEPOINT, RequestKind.SYNC_SAVEPOINT)


class CheckpointFailureReason(enum.Enum):
    """Why a checkpoint failed or a request was dropped (Flink's names and messages)."""

    def __init__(self, pre_flight: bool, message: str, counted: bool = False) -> None:
        self.pre_flight = pre_flight  # before the checkpoint reached any task
        self.message = message
        self.counted = counted  # counts against tolerable_failures

    PERIODIC_SCHEDULER_SHUTDOWN = (True, "Periodic checkpoint scheduler is shut down.")
    TOO_MANY_CHECKPOINT_REQUESTS = (True, "The maximum number of queued checkpoint requests "
                                    "exceeded")
    MINIMUM_TIME_BETWEEN_CHECKPOINTS = (True, "The minimum time between checkpoints is still "
                                        "pending. Checkpoint will be triggered after the "
                                        "minimum time.")
    NOT_ALL_REQUIRED_TASKS_RUNNING = (True, "Not all required tasks are currently running.")
    IO_EXCEPTION = (True, "An Exception occurred while triggering the checkpoint. "
                    "IO-problem detected.", True)
    CHECKPOINT_ASYNC_EXCEPTION = (False, "Asynchronous task checkpoint failed.", True)
    CHECKPOINT_EXPIRED = (False, "Checkpoint expired before completing.", True)
    CHECKPOINT_SUBSUMED = (False, "Checkpoint has been subsumed.")
    CHECKPOINT_DECLINED = (False, "Checkpoint was declined.", True)
    CHECKPOINT_DECLINED_TASK_NOT_READY = (False, "Checkpoint was declined (tasks not ready)")
    CHECKPOINT_DECLINED_TASK_CLOSING = (False, "Checkpoint was declined (task is closing)")
    CHECKPOINT_DECLINED_SUBSUMED = (False, "Checkpoint was canceled because a barrier from "
                                    "newer checkpoint was received.")
    CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER = (False, "Task received cancellation from "
                                                   "one of its inputs")
    CHECKPOINT_DECLINED_INPUT_END_OF_STREAM = (False, "Checkpoint was declined because one "
                                               "input stream is finished")
    CHECKPOINT_COORDINATOR_SHUTDOWN = (False, "CheckpointCoordinator shutdown.")
    CHECKPOINT_COORDINATOR_SUSPEND = (False, "Checkpoint Coordinator is suspending.")
    TASK_FAILURE = (False, "Task has failed.")
    FINALIZE_CHECKPOINT_FAILURE = (False, "Failure to finalize checkpoint.", True)
    TRIGGER_CHECKPOINT_FAILURE = (False, "Trigger checkpoint failure.")

    @staticmethod
    def of_decline(message: Mapping[str, Any]) -> CheckpointFailureReason:
        """The reason a task's ``decline`` message names (declined, if none known)."""
        try:
            return CheckpointFailureReason[str(message.get("reason"))]
        except KeyError:
            return CheckpointFailureReason.CHECKPOINT_DECLINED


@dataclass(frozen=True)
class StartCheckpoint:
    """Start checkpoint ``checkpoint_id`` of ``kind`` now (``timestamp_ms``: its trigger
    time on the wall clock, epoch ms, for its metadata), for request ``request_id``."""

    checkpoint_id: int
    kind: RequestKind
    timestamp_ms: int
    request_id: int


@dataclass(frozen=True)
class DroppedRequest:
    """Request ``request_id`` of ``kind`` will not start: ``reason``."""

    request_id: int
    kind: RequestKind
    reason: CheckpointFailureReason


@dataclass(frozen=True)
class AbortedCheckpoint:
    """Pending checkpoint ``checkpoint_id`` ended without completing: ``reason``."""

    checkpoint_id: int
    kind: RequestKind
    reason: CheckpointFailureReason


@dataclass(frozen=True)
class JobFailure:
    """Checkpoint failures fail the job: the driver fails (restarts) it."""

    message: str
    reason: CheckpointFailureReason
    checkpoint_id: int

    def error(self) -> CheckpointError:
        """The error to fail the job with."""
        return CheckpointError(self.message)


Decision = StartCheckpoint | DroppedRequest | AbortedCheckpoint | JobFailure
"""What the scheduler asks of the driver."""


@dataclass(frozen=True)
class _Request:
    key: tuple[bool, bool, bool, int, int]  # the decider's order; request_id last
    request_id: int
    kind: RequestKind
    forced: bool


class CheckpointScheduler:
    """The checkpoint scheduling of one job under ``config`` (rules in the module
    documentation). ``clock()`` gives monotonic time in int milliseconds: every timing
    decision (intervals, minimum pause, timeouts, :meth:`next_wakeup_ms`) is on it.
    ``wall_clock()`` gives epoch milliseconds, used only for the trigger timestamp of
    each :class:`StartCheckpoint` (default: the system's wall clock); it may step back
    or forward without changing any decision. Checkpoint ids start at ``first_id``
    (after a restore: the restored id + 1); ``rng`` draws Flink's random initial delay
    (None: the first periodic trigger is ``interval_ms`` after :meth:`start`)."""

    def __init__(self, config: CheckpointConfig, clock: Callable[[], int] = monotonic_ms, *,
                 wall_clock: Callable[[], int] = wall_clock_ms,
                 first_id: int = 1, rng: random.Random | None = None,
                 max_queued: int = MAX_QUEUED_REQUESTS) -> None:
        if not isinstance(config, CheckpointConfig):
            raise ConfigurationError(f"config must be a CheckpointConfig, got {config!r}")
        for name, value in (("first_id", first_id), ("max_queued", max_queued)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be an int >= 1, got {value!r}")
        for name, fn in (("clock", clock), ("wall_clock", wall_clock)):
            if not callable(fn):
                raise ConfigurationError(f"{name} must be a function giving int "
                                         f"milliseconds, got {fn!r}")
        self.config, self._clock, self._rng, self._max_queued = config, clock, rng, max_queued
        self._wall_clock = wall_clock
        # Flink's base interval: never shorter than the minimum pause
        self._interval = (None if config.interval_ms is None
                          else max(config.interval_ms, config.min_pause_ms))
        self._next_id, self._next_request = first_id, 1
        self._queue: list[_Request] = []
        self._pending: dict[int, StartCheckpoint] = {}
        #: when each pending checkpoint expires (monotonic ms: its trigger + timeout)
        self._expiry: dict[int, int] = {}
        self._outbox: list[Decision] = []
        self._running = False
        self._next_periodic: int | None = None  # monotonic ms
        self._last_completion: int | None = None  # monotonic ms
        # CheckpointFailureManager
        self._failures, self._last_success = 0, first_id - 1
        self._counted: set[int] = set()

    # the driver's view ----------------------------------------------------------------

    @property
    def pending(self) -> Mapping[int, StartCheckpoint]:
        """The pending checkpoints by id (read-only view)."""
        return MappingProxyType(self._pending)

    @property
    def queued(self) -> int:
        """How many requests wait in the queue."""
        return len(self._queue)

    @property
    def consecutive_failures(self) -> int:
        """Counted checkpoint failures since the last completion."""
        return self._failures

    def start(self) -> None:
        """Start periodic checkpoints (when every task runs): the first periodic
        request comes after the initial delay. Nothing to do if ``interval_ms`` is None."""
        self._running = True
        if self._interval is not None:
            delay = (self._interval if self._rng is None
                     else self._rng.randint(self.config.min_pause_ms, self._interval))
            self._next_periodic = self._clock() + delay

    def stop(self, reason: CheckpointFailureReason =
             CheckpointFailureReason.CHECKPOINT_COORDINATOR_SUSPEND) -> list[Decision]:
        """Stop periodic checkpoints and end everything (the job left RUNNING): queued
        requests are dropped and pending checkpoints aborted with ``reason``."""
        self._running, self._next_periodic = False, None
        out, self._outbox = self._outbox, []
        out += [DroppedRequest(r.request_id, r.kind, reason) for r in self._queue]
        self._queue.clear()
        for cid in sorted(self._pending):
            out += self._abort(cid, reason, by_task=False)
        return out

    def request(self, kind: RequestKind) -> int:
        """Queue a request of ``kind``; returns its request id. Whether it starts or is
        dropped, :meth:`poll` tells (one beyond the queue's bound: at the next poll)."""
        if not isinstance(kind, RequestKind):
            raise TypeError(f"kind must be a RequestKind, got {kind!r}")
        rid, self._next_request = self._next_request, self._next_request + 1
        # unaligned checkpoints run one at a time: a second barrier would reach a task
        # that took the pending one unaligned before that one's last barrier did, and
        # the task would give the pending one up (subsumed)
        forced = (kind is RequestKind.FORCED or kind.savepoint) and not self.config.unaligned
        periodic = kind is RequestKind.PERIODIC
        new = _Request((not kind.savepoint, not forced, periodic, self._clock(), rid),
                       rid, kind, forced)
        too_many = CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS
        if len(self._queue) >= self._max_queued and not self._queue[-1].key[2]:  # not periodic
            self._outbox.append(DroppedRequest(rid, kind, too_many))
            return rid
        bisect.insort(self._queue, new, key=lambda r: r.key)
        if len(self._queue) > self._max_queued:
            last = self._queue.pop()
            self._outbox.append(DroppedRequest(last.request_id, last.kind, too_many))
        return rid

    def poll(self) -> list[Decision]:
        """Everything due now: dropped requests, expired checkpoints, then the requests
        that start now or are dropped (the periodic trigger's request among them)."""
        now = self._clock()
        if self._interval and self._next_periodic is not None and now >= self._next_periodic:
            missed = (now - self._next_periodic) // self._interval  # not caught up
            self._next_periodic += (missed + 1) * self._interval
            self.request(RequestKind.PERIODIC)
        out, self._outbox = self._outbox, []
        for cid in sorted(self._pending):
            if now >= self._expiry[cid]:
                out += self._abort(cid, CheckpointFailureReason.CHECKPOINT_EXPIRED, by_task=False)
        while (decision := self._choose(now)) is not None:
            out.append(decision)
        return out

    def next_wakeup_ms(self) -> int | None:
        """When :meth:`poll` has something to do next (time of ``clock``, the monotonic
        one, in ms; the current time if it has now): the next periodic trigger, the end
        of the pause, the earliest expiry, or None (nothing until a request or an end of
        checkpoint). A driver waits :meth:`wakeup_delay_ms` instead of comparing this
        with a clock of its own."""
        times = list(self._expiry.values())
        if self._next_periodic is not None:
            times.append(self._next_periodic)
        if self._outbox or (self._queue and (len(self._pending) < self.config.max_concurrent
                                             or self._queue[0].forced)):
            times.append(self._clock())
        return min(times, default=None)

    def wakeup_delay_ms(self) -> int | None:
        """How long from now (ms, >= 0, on the monotonic ``clock``) until :meth:`poll`
        has something to do: 0 if it has now, None if nothing happens until a request
        or the end of a checkpoint."""
        wakeup = self.next_wakeup_ms()
        return None if wakeup is None else max(0, wakeup - self._clock())

    # the end of a checkpoint ------------------------------------------------------------

    def completed(self, checkpoint_id: int) -> list[Decision]:
        """Checkpoint ``checkpoint_id`` completed (its metadata is published): resets the
        failure count; returns the older pending checkpoints aborted as subsumed. An id
        not pending (expired, aborted, unknown) is ignored: returns []."""
        if (done := self._pending.pop(checkpoint_id, None)) is None:
            return []
        del self._expiry[checkpoint_id]
        if checkpoint_id > self._last_success:  # handleCheckpointSuccess
            self._last_success = checkpoint_id
            self._failures = 0
            self._counted.clear()
        self._last_completion = self._clock()
        out: list[Decision] = []
        if done.kind is not RequestKind.SAVEPOINT:  # checkpoints and sync savepoints subsume
            for cid in sorted(self._pending):
                if cid < checkpoint_id and not self._pending[cid].kind.savepoint:
                    out += self._abort(cid, CheckpointFailureReason.CHECKPOINT_SUBSUMED,
                                       by_task=False)
        return out

    def failed(self, checkpoint_id: int, reason: CheckpointFailureReason) -> list[Decision]:
        """Checkpoint ``checkpoint_id`` failed on the coordinator's side (triggering,
        writing its metadata: ``IO_EXCEPTION``, ``FINALIZE_CHECKPOINT_FAILURE``...; a task
        died: ``TASK_FAILURE``). Returns its abort, and a :class:`JobFailure` if it is one
        failure too many. An id not pending is ignored: returns []."""
        return self._end(checkpoint_id, reason, by_task=False)

    def declined(self, checkpoint_id: int, reason: CheckpointFailureReason =
                 CheckpointFailureReason.CHECKPOINT_DECLINED) -> list[Decision]:
        """A task declined checkpoint ``checkpoint_id`` (``CHECKPOINT_DECLINED``,
        ``CHECKPOINT_ASYNC_EXCEPTION``, ``CHECKPOINT_DECLINED_*``...). Returns its abort, and
        a :class:`JobFailure` if it is one failure too many or a synchronous savepoint.
        An id not pending is ignored: returns []."""
        return self._end(checkpoint_id, reason, by_task=True)

    # internals ------------------------------------------------------------------------

    def _end(self, checkpoint_id: int, reason: CheckpointFailureReason,
             by_task: bool) -> list[Decision]:
        if not isinstance(reason, CheckpointFailureReason):
            raise TypeError(f"reason must be a CheckpointFailureReason, got {reason!r}")
        if checkpoint_id not in self._pending:
            return []
        return self._abort(checkpoint_id, reason, by_task=by_task)

    def _choose(self, now: int) -> StartCheckpoint | DroppedRequest | None:
        # CheckpointRequestDecider.chooseRequestToExecute, then preCheckGlobalState
        if not self._queue:
            return None
        head = self._queue[0]
        if len(self._pending) >= self.config.max_concurrent and not head.forced:
            return None
        del self._queue[0]
        reason = None
        if head.kind is RequestKind.PERIODIC:  # never forced
            pause_end = (None if self._last_completion is None
                         else self._last_completion + self.config.min_pause_ms)
            if pause_end is not None and pause_end > now:
                reason = CheckpointFailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS
                if self._running and self._interval:  # rescheduleTrigger: from pause end
                    self._next_periodic = pause_end
            elif not self._running:
                reason = CheckpointFailureReason.PERIODIC_SCHEDULER_SHUTDOWN
        if reason is not None:
            return DroppedRequest(head.request_id, head.kind, reason)
        # the trigger timestamp is wall-clock time (for the metadata); its expiry is
        # measured on the monotonic clock
        start = StartCheckpoint(self._next_id, head.kind, self._wall_clock(), head.request_id)
        self._next_id += 1
        self._pending[start.checkpoint_id] = start
        self._expiry[start.checkpoint_id] = now + self.config.timeout_ms
        return start

    def _abort(self, checkpoint_id: int, reason: CheckpointFailureReason,
               by_task: bool) -> list[Decision]:
        # CheckpointCoordinator.abortPendingCheckpoint + CheckpointFailureManager
        kind = self._pending.pop(checkpoint_id).kind
        del self._expiry[checkpoint_id]
        out: list[Decision] = [AbortedCheckpoint(checkpoint_id, kind, reason)]
        if by_task and not reason.pre_flight:  # handleTaskLevelCheckpointException
            if kind is RequestKind.SYNC_SAVEPOINT:
                return [*out, JobFailure(f"synchronous savepoint {checkpoint_id} (stop-with-"
                                         f"savepoint) failed in a task: {reason.message}",
                                         reason, checkpoint_id)]
        elif kind.savepoint:  # handleJobLevelCheckpointException: savepoints don't count
            return out
        if checkpoint_id <= self._last_success:  # checkFailureAgainstCounter
            return out
        if reason.counted and checkpoint_id not in self._counted:
            self._counted.add(checkpoint_id)
            self._failures += 1
        if self._failures > self.config.tolerable_failures:
            failures, self._failures = self._failures, 0
            self._counted.clear()
            out.append(JobFailure(
                f"checkpoint {checkpoint_id} failed: {reason.message} With {failures} failed "
                f"since the last completed one, the job exceeded checkpoint tolerable failure "
                f"threshold {self.config.tolerable_failures} (CheckpointConfig."
                f"tolerable_failures; raise it to tolerate more).", reason, checkpoint_id))
        return out
