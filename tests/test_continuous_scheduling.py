"""Checkpoint scheduling of the continuous runtime (weir.runtime.continuous.scheduling) and
its settings (weir.api.checkpointing), on a manual clock: Flink's CheckpointConfig
defaults and validation, periodic cadence, minimum pause, max concurrent with forced
requests, queue order and bound, expiry, subsumption, the failure manager's counting,
and a hypothesis state machine over random sequences checking the invariants."""

from __future__ import annotations

import dataclasses
import random
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from weir.api.checkpointing import CheckpointConfig, CheckpointingMode, SnapshotStrategy
from weir.errors import CheckpointError, ConfigurationError
from weir.runtime.continuous.barriers import AbortReason, decline_message
from weir.runtime.continuous.scheduling import (
    MAX_QUEUED_REQUESTS,
    AbortedCheckpoint,
    CheckpointFailureReason,
    CheckpointScheduler,
    Decision,
    DroppedRequest,
    JobFailure,
    RequestKind,
    StartCheckpoint,
)

R = CheckpointFailureReason
K = RequestKind
THRESHOLD = "exceeded checkpoint tolerable failure threshold"


class Clock:
    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _scheduler(clock: Clock | None = None, **config: Any) -> tuple[CheckpointScheduler, Clock]:
    # one manual clock for timing and trigger timestamps alike (the two differ in
    # tests/test_continuous_protocol_time.py and in SchedulerMachine below)
    clock = clock or Clock()
    return CheckpointScheduler(CheckpointConfig(**config), clock, wall_clock=clock), clock


def _starts(decisions: list[Decision]) -> list[tuple[int, RequestKind]]:
    return [(d.checkpoint_id, d.kind) for d in decisions if isinstance(d, StartCheckpoint)]


def _start(s: CheckpointScheduler, kind: RequestKind) -> int:
    s.request(kind)
    (started,) = _starts(s.poll())
    return started[0]


def _failures(decisions: list[Decision]) -> list[JobFailure]:
    return [d for d in decisions if isinstance(d, JobFailure)]


# ------------------------------------------------------------------ CheckpointConfig


def test_config_defaults_are_flinks() -> None:
    c = CheckpointConfig()
    assert (c.interval_ms, c.mode, c.timeout_ms, c.min_pause_ms, c.max_concurrent,
            c.tolerable_failures, c.retain_on_cancel, c.unaligned, c.aligned_timeout_ms) == (
        None, CheckpointingMode.EXACTLY_ONCE, 600_000, 0, 1, 0, False, False, 0)
    assert (c.snapshot, c.retained, c.lease_timeout_ms) == (None, 3, 60_000)
    assert not c.periodic and CheckpointConfig(10).periodic
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.timeout = timedelta(seconds=5)  # type: ignore[misc]


def test_config_durations_are_timedeltas_strings_or_int_milliseconds() -> None:
    c = CheckpointConfig(timedelta(seconds=2), timeout="1 min",
                         min_pause=timedelta(milliseconds=500, microseconds=900),
                         aligned_timeout=0)
    assert (c.interval_ms, c.timeout_ms, c.min_pause_ms, c.aligned_timeout_ms) == (
        2000, 60_000, 500, 0)  # truncated to whole ms, as Duration.toMillis
    assert all(type(v) is int for v in (c.interval_ms, c.timeout_ms, c.min_pause_ms))
    assert c == CheckpointConfig(2000, timeout=60_000, min_pause="500 ms")
    assert c.interval == timedelta(seconds=2)
    assert CheckpointConfig(unaligned=True, aligned_timeout="30 ms").aligned_timeout_ms == 30


def test_config_keywords_of_earlier_releases_warn_and_still_work() -> None:
    with pytest.warns(DeprecationWarning, match="interval_ms=.*use interval="):
        c = CheckpointConfig(interval_ms=2000, timeout_ms=60_000, min_pause_ms=500)
    assert c == CheckpointConfig("2 s", timeout="1 min", min_pause="500 ms")
    with pytest.warns(DeprecationWarning, match="changelog=.*SnapshotStrategy"):
        assert CheckpointConfig(changelog=True).snapshot is SnapshotStrategy.CHANGELOG


@pytest.mark.parametrize(("settings_", "allowed"), [
    ({"interval": 0}, "interval must be at least 10 ms"),
    ({"interval": 9}, "at least 10 ms (or None"),
    ({"interval": "5 ms"}, "at least 10 ms"),
    ({"interval": timedelta(milliseconds=-5)}, "interval must be a duration"),
    ({"interval": 1.5}, "interval must be a duration"),
    ({"interval": True}, "interval must be a duration"),
    ({"interval": "ten seconds"}, "a string with a unit like '10 s'"),
    ({"timeout": 0}, "timeout must be at least 10 ms"),
    ({"timeout": None}, "timeout must be a duration"),
    ({"min_pause": -1}, "min_pause must be a duration"),
    ({"aligned_timeout": -1}, "aligned_timeout"),
    ({"retained": 0}, "retained must be an int >= 1"),
    ({"lease_timeout": "10 ms"}, "lease_timeout must be at least 1 s"),
    ({"snapshot": "sometimes"}, "snapshot must be a SnapshotStrategy"),
    ({"max_concurrent": 0}, "max_concurrent must be an int >= 1"),
    ({"tolerable_failures": -1}, "tolerable_failures must be an int >= 0"),
    ({"tolerable_failures": 1.0}, "tolerable_failures must be an int >= 0"),
    ({"mode": "exactly_once"}, "mode must be a CheckpointingMode"),
    ({"unaligned": 1}, "unaligned must be a bool"),
    ({"unaligned": True, "mode": CheckpointingMode.AT_LEAST_ONCE},
     "unaligned checkpoints need mode EXACTLY_ONCE"),
    ({"unaligned": True, "max_concurrent": 2}, "unaligned checkpoints need max_concurrent == 1"),
])
def test_config_validation_says_what_is_allowed(settings_: dict[str, Any], allowed: str) -> None:
    with pytest.raises(ConfigurationError, match=allowed.replace("(", r"\(")):
        CheckpointConfig(**settings_)


def test_config_edge_values_are_allowed() -> None:
    c = CheckpointConfig(10, timeout=10, max_concurrent=5, tolerable_failures=7,
                         mode=CheckpointingMode.AT_LEAST_ONCE, retain_on_cancel=True)
    assert (c.interval_ms, c.timeout_ms, c.max_concurrent) == (10, 10, 5)


def test_scheduler_arguments_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="first_id must be an int >= 1"):
        CheckpointScheduler(CheckpointConfig(), Clock(), first_id=0)
    with pytest.raises(ConfigurationError, match="config must be a CheckpointConfig"):
        CheckpointScheduler({}, Clock())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="wall_clock must be a function"):
        CheckpointScheduler(CheckpointConfig(), Clock(), wall_clock=0)  # type: ignore[arg-type]
    s, _ = _scheduler()
    with pytest.raises(TypeError, match="RequestKind"):
        s.request("savepoint")  # type: ignore[arg-type]
    cid = _start(s, K.MANUAL)
    with pytest.raises(TypeError, match="CheckpointFailureReason"):
        s.failed(cid, "IO")  # type: ignore[arg-type]


# ------------------------------------------------------------------ periodic trigger


def test_periodic_checkpoints_at_a_fixed_rate() -> None:
    s, clock = _scheduler(interval_ms=100)
    s.start()
    assert s.poll() == [] and s.next_wakeup_ms() == 100
    clock.now = 99
    assert s.poll() == []
    clock.now = 100
    assert s.poll() == [StartCheckpoint(1, K.PERIODIC, 100, 1)]
    assert s.next_wakeup_ms() == 200  # the next trigger (expiry: 600_100)
    clock.now = 170
    assert s.completed(1) == []
    assert s.next_wakeup_ms() == 200  # fixed rate: not 100 after the completion
    clock.now = 200
    assert _starts(s.poll()) == [(2, K.PERIODIC)]
    clock.now = 300
    s.completed(2)
    assert _starts(s.poll()) == [(3, K.PERIODIC)]


def test_next_wakeup_is_the_earliest_of_trigger_and_expiry() -> None:
    s, clock = _scheduler(interval_ms=100, timeout_ms=150)
    assert s.next_wakeup_ms() is None  # not started
    s.start()
    clock.now = 100
    s.poll()
    clock.now = 120
    assert s.next_wakeup_ms() == 200
    clock.now = 200  # checkpoint 1 pending: the periodic request waits in the queue
    assert s.poll() == [] and s.queued == 1
    assert s.next_wakeup_ms() == 250  # expiry of checkpoint 1 (trigger 100 + 150)


def test_a_late_poll_makes_one_periodic_request_and_keeps_the_phase() -> None:
    s, clock = _scheduler(interval_ms=100)
    s.start()
    clock.now = 350
    assert _starts(s.poll()) == [(1, K.PERIODIC)]
    assert s.queued == 0 and s.next_wakeup_ms() == 400


def test_interval_is_at_least_the_min_pause() -> None:
    s, clock = _scheduler(interval_ms=100, min_pause_ms=250)
    s.start()
    assert s.next_wakeup_ms() == 250
    clock.now = 250
    assert _starts(s.poll()) == [(1, K.PERIODIC)]
    assert s.next_wakeup_ms() == 500


@given(seed=st.integers(0, 2**32), pause=st.integers(0, 1000), interval=st.integers(10, 1000))
def test_random_initial_delay_is_between_min_pause_and_interval(
        seed: int, pause: int, interval: int) -> None:
    clock = Clock(1000)
    config = CheckpointConfig(interval=interval, min_pause=pause)
    s = CheckpointScheduler(config, clock, rng=random.Random(seed))
    s.start()
    first = s.next_wakeup_ms()
    assert first is not None
    assert 1000 + pause <= first <= 1000 + max(interval, pause)
    assert first == 1000 + random.Random(seed).randint(pause, max(interval, pause))


def test_no_interval_means_no_periodic_checkpoints() -> None:
    s, clock = _scheduler()
    s.start()
    clock.now = 10**9
    assert s.poll() == [] and s.next_wakeup_ms() is None
    assert _starts(s.poll()) == []
    assert _start(s, K.MANUAL) == 1


def test_periodic_request_without_periodic_scheduling_is_dropped() -> None:
    s, _ = _scheduler(interval_ms=100)
    rid = s.request(K.PERIODIC)  # before start()
    assert s.poll() == [DroppedRequest(rid, K.PERIODIC, R.PERIODIC_SCHEDULER_SHUTDOWN)]
    assert _start(s, K.SAVEPOINT) == 1  # savepoints need no periodic scheduling


# ------------------------------------------------------------------ minimum pause


def test_min_pause_drops_the_periodic_request_and_reschedules_the_trigger() -> None:
    s, clock = _scheduler(interval_ms=100, min_pause_ms=80)
    s.start()
    clock.now = 100
    assert _starts(s.poll()) == [(1, K.PERIODIC)]
    clock.now = 150
    s.completed(1)
    clock.now = 200
    (dropped,) = s.poll()
    assert isinstance(dropped, DroppedRequest)
    assert (dropped.kind, dropped.reason) == (K.PERIODIC, R.MINIMUM_TIME_BETWEEN_CHECKPOINTS)
    assert "minimum time between checkpoints" in dropped.reason.message
    assert s.next_wakeup_ms() == 230  # the end of the pause: completion 150 + 80
    clock.now = 229
    assert s.poll() == []
    clock.now = 230
    assert s.poll() == [StartCheckpoint(2, K.PERIODIC, 230, 3)]
    assert s.next_wakeup_ms() == 330  # the fixed rate goes on from the rescheduled trigger


def test_min_pause_drop_without_an_interval_schedules_nothing() -> None:
    # found by the state machine: a periodic request asked for by hand, no interval set
    s, _ = _scheduler(min_pause_ms=5)
    s.start()
    s.completed(_start(s, K.SAVEPOINT))
    rid = s.request(K.PERIODIC)
    assert s.poll() == [DroppedRequest(rid, K.PERIODIC, R.MINIMUM_TIME_BETWEEN_CHECKPOINTS)]
    assert s.next_wakeup_ms() is None


@pytest.mark.parametrize("kind", [K.MANUAL, K.FORCED, K.SAVEPOINT, K.SYNC_SAVEPOINT])
def test_min_pause_applies_to_periodic_requests_only(kind: RequestKind) -> None:
    s, clock = _scheduler(interval_ms=1000, min_pause_ms=500)
    cid = _start(s, K.MANUAL)
    clock.now = 10
    s.completed(cid)
    clock.now = 11
    assert _start(s, kind) == 2


def test_min_pause_counts_from_a_savepoint_completion_too() -> None:
    s, clock = _scheduler(interval_ms=100, min_pause_ms=50)
    s.start()
    sp = _start(s, K.SAVEPOINT)
    clock.now = 90
    s.completed(sp)
    clock.now = 100
    (dropped,) = s.poll()
    assert isinstance(dropped, DroppedRequest)
    assert dropped.reason is R.MINIMUM_TIME_BETWEEN_CHECKPOINTS
    assert s.next_wakeup_ms() == 140


# ------------------------------------------------------------------ max concurrent, order


def test_max_concurrent_queues_all_but_forced_requests() -> None:
    s, clock = _scheduler(max_concurrent=1)
    first = _start(s, K.MANUAL)
    manual = s.request(K.MANUAL)
    assert s.poll() == [] and s.queued == 1
    assert s.next_wakeup_ms() == 600_000  # only the expiry of the first
    assert _start(s, K.FORCED) == 2  # forced: starts beyond max_concurrent
    assert _start(s, K.SAVEPOINT) == 3  # savepoints are forced (aligned checkpoints)
    assert len(s.pending) == 3 and s.queued == 1
    clock.now = 5
    s.completed(first)  # subsumes nothing older; 2 pending remain (>= max)
    assert s.poll() == []
    s.completed(2)
    s.completed(3)
    assert s.next_wakeup_ms() == 5  # a request can start now
    assert s.poll() == [StartCheckpoint(4, K.MANUAL, 5, manual)]
    assert s.next_wakeup_ms() == 600_005


def test_max_concurrent_two() -> None:
    s, _ = _scheduler(max_concurrent=2)
    for kind in (K.MANUAL, K.MANUAL, K.MANUAL):
        s.request(kind)
    assert _starts(s.poll()) == [(1, K.MANUAL), (2, K.MANUAL)]
    s.failed(1, R.TRIGGER_CHECKPOINT_FAILURE)
    assert _starts(s.poll()) == [(3, K.MANUAL)]


def test_with_unaligned_checkpoints_nothing_is_forced() -> None:
    """Unaligned checkpoints run one at a time: a savepoint or the job's final (forced)
    checkpoint waits for the pending one. Started beside it, its barrier would reach a
    task that took the pending one unaligned before that one's last barrier, and the
    task would give the pending one up (subsumed)."""
    s, _ = _scheduler(unaligned=True)
    first = _start(s, K.MANUAL)
    s.request(K.SAVEPOINT)
    assert s.poll() == [] and s.queued == 1
    s.request(K.FORCED)  # Flink looks at the head only: the savepoint ranks first and waits
    assert s.poll() == [] and s.queued == 2
    s.completed(first)
    assert _starts(s.poll()) == [(2, K.SAVEPOINT)]
    assert s.poll() == [] and s.queued == 1  # the forced one waits for the savepoint
    s.completed(2)
    assert _starts(s.poll()) == [(3, K.FORCED)]


def test_queue_order_savepoints_forced_manual_periodic_oldest_first() -> None:
    s, clock = _scheduler(interval_ms=100, unaligned=True)  # savepoints not forced: they queue
    s.start()
    blocker = _start(s, K.MANUAL)
    for t, kind in enumerate([K.MANUAL, K.PERIODIC, K.SAVEPOINT, K.MANUAL, K.SYNC_SAVEPOINT]):
        clock.now = t + 1
        s.request(kind)
    assert s.poll() == [] and s.queued == 5
    order = []
    done = blocker
    for _ in range(5):
        s.completed(done)
        ((done, kind),) = _starts(s.poll())
        order.append(kind)
    assert order == [K.SAVEPOINT, K.SYNC_SAVEPOINT, K.MANUAL, K.MANUAL, K.PERIODIC]


def test_forced_requests_rank_after_savepoints() -> None:
    s, clock = _scheduler()
    _start(s, K.MANUAL)
    s.request(K.MANUAL)
    s.request(K.FORCED)
    clock.now = 1
    s.request(K.SAVEPOINT)
    assert _starts(s.poll()) == [(2, K.SAVEPOINT), (3, K.FORCED)]  # the manual one waits
    assert s.queued == 1


def test_start_carries_the_request_id_and_trigger_time() -> None:
    s, clock = _scheduler()
    clock.now = 42
    rid = s.request(K.SAVEPOINT)
    assert s.poll() == [StartCheckpoint(1, K.SAVEPOINT, 42, rid)]
    assert s.pending[1] == StartCheckpoint(1, K.SAVEPOINT, 42, rid)


def test_checkpoint_ids_continue_from_first_id() -> None:
    s = CheckpointScheduler(CheckpointConfig(), Clock(), first_id=7)
    assert _start(s, K.MANUAL) == 7
    assert _start(s, K.FORCED) == 8


# ------------------------------------------------------------------ queue bound


def test_queue_bound_default_is_flinks() -> None:
    assert MAX_QUEUED_REQUESTS == 1000
    s, _ = _scheduler()
    _start(s, K.MANUAL)
    rids = [s.request(K.MANUAL) for _ in range(1001)]
    assert s.queued == 1000
    assert s.poll() == [DroppedRequest(rids[-1], K.MANUAL, R.TOO_MANY_CHECKPOINT_REQUESTS)]


def test_full_queue_of_user_requests_drops_the_new_one() -> None:
    s = CheckpointScheduler(CheckpointConfig(unaligned=True), Clock(), max_queued=3)
    _start(s, K.MANUAL)
    kept = [s.request(K.MANUAL) for _ in range(3)]
    new = s.request(K.SAVEPOINT)  # even a savepoint: user requests already queued are kept
    assert s.poll() == [DroppedRequest(new, K.SAVEPOINT, R.TOO_MANY_CHECKPOINT_REQUESTS)]
    assert s.queued == 3 and len(kept) == 3


def test_full_queue_drops_its_last_periodic_request() -> None:
    clock = Clock()
    s = CheckpointScheduler(CheckpointConfig(interval=100), clock, max_queued=3)
    s.start()
    _start(s, K.MANUAL)
    old = s.request(K.PERIODIC)
    clock.now = 1
    newest = s.request(K.PERIODIC)
    s.request(K.MANUAL)
    manual = s.request(K.MANUAL)  # beyond the bound: the newest periodic request goes
    assert s.poll() == [DroppedRequest(newest, K.PERIODIC, R.TOO_MANY_CHECKPOINT_REQUESTS)]
    clock.now = 2
    periodic = s.request(K.PERIODIC)  # the new periodic one is itself the last
    assert s.poll() == [DroppedRequest(periodic, K.PERIODIC, R.TOO_MANY_CHECKPOINT_REQUESTS)]
    assert s.queued == 3 and old < manual


# ------------------------------------------------------------------ expiry


def test_a_checkpoint_expires_after_the_timeout() -> None:
    s, clock = _scheduler(timeout_ms=50, tolerable_failures=1)
    clock.now = 100
    cid = _start(s, K.MANUAL)
    clock.now = 149
    assert s.poll() == [] and s.next_wakeup_ms() == 150
    clock.now = 150
    assert s.poll() == [AbortedCheckpoint(cid, K.MANUAL, R.CHECKPOINT_EXPIRED)]
    assert s.pending == {} and s.consecutive_failures == 1
    assert s.completed(cid) == []  # late: ignored
    assert s.declined(cid) == [] and s.failed(cid, R.IO_EXCEPTION) == []


def test_expiry_frees_the_slot_for_a_queued_request() -> None:
    s, clock = _scheduler(timeout_ms=50, tolerable_failures=5)
    _start(s, K.MANUAL)
    waiting = s.request(K.MANUAL)
    clock.now = 60
    assert s.poll() == [AbortedCheckpoint(1, K.MANUAL, R.CHECKPOINT_EXPIRED),
                        StartCheckpoint(2, K.MANUAL, 60, waiting)]


def test_expiry_counts_and_fails_the_job_past_the_threshold() -> None:
    s, clock = _scheduler(timeout_ms=50)
    _start(s, K.MANUAL)
    clock.now = 50
    aborted, failure = s.poll()
    assert aborted == AbortedCheckpoint(1, K.MANUAL, R.CHECKPOINT_EXPIRED)
    assert isinstance(failure, JobFailure) and THRESHOLD in failure.message


def test_an_expired_savepoint_never_counts() -> None:
    s, clock = _scheduler(timeout_ms=50)
    _start(s, K.SAVEPOINT)
    _start(s, K.SYNC_SAVEPOINT)
    clock.now = 50
    assert s.poll() == [AbortedCheckpoint(1, K.SAVEPOINT, R.CHECKPOINT_EXPIRED),
                        AbortedCheckpoint(2, K.SYNC_SAVEPOINT, R.CHECKPOINT_EXPIRED)]
    assert s.consecutive_failures == 0


# ------------------------------------------------------------------ subsumption


def test_completion_subsumes_older_pending_checkpoints_but_not_savepoints() -> None:
    s, _ = _scheduler(max_concurrent=5)
    ids = {kind: _start(s, kind) for kind in (K.MANUAL, K.SAVEPOINT, K.FORCED)}
    mid = _start(s, K.MANUAL)
    newer = _start(s, K.MANUAL)
    assert s.completed(mid) == [
        AbortedCheckpoint(ids[K.MANUAL], K.MANUAL, R.CHECKPOINT_SUBSUMED),
        AbortedCheckpoint(ids[K.FORCED], K.FORCED, R.CHECKPOINT_SUBSUMED)]
    assert sorted(s.pending) == [ids[K.SAVEPOINT], newer]
    assert s.consecutive_failures == 0


def test_a_savepoint_completion_subsumes_nothing() -> None:
    s, _ = _scheduler(max_concurrent=5)
    older = _start(s, K.MANUAL)
    sp = _start(s, K.SAVEPOINT)
    assert s.completed(sp) == []
    assert list(s.pending) == [older]


def test_a_synchronous_savepoint_completion_subsumes_older_checkpoints() -> None:
    s, _ = _scheduler(max_concurrent=5)
    older = _start(s, K.MANUAL)
    sp = _start(s, K.SAVEPOINT)
    sync = _start(s, K.SYNC_SAVEPOINT)
    assert s.completed(sync) == [AbortedCheckpoint(older, K.MANUAL, R.CHECKPOINT_SUBSUMED)]
    assert list(s.pending) == [sp]


def test_subsumption_never_fails_the_job() -> None:
    s, _ = _scheduler(max_concurrent=5)
    for _ in range(4):
        _start(s, K.MANUAL)
    assert _failures(s.completed(4)) == []


# ------------------------------------------------------------------ failure manager

COUNTED = [R.IO_EXCEPTION, R.CHECKPOINT_ASYNC_EXCEPTION, R.CHECKPOINT_DECLINED,
           R.CHECKPOINT_EXPIRED, R.FINALIZE_CHECKPOINT_FAILURE]


def test_which_reasons_count() -> None:
    assert {r for r in R if r.counted} == set(COUNTED)
    assert {r for r in R if r.pre_flight} == {
        R.PERIODIC_SCHEDULER_SHUTDOWN, R.TOO_MANY_CHECKPOINT_REQUESTS,
        R.MINIMUM_TIME_BETWEEN_CHECKPOINTS, R.NOT_ALL_REQUIRED_TASKS_RUNNING, R.IO_EXCEPTION}


@pytest.mark.parametrize("reason", COUNTED)
@pytest.mark.parametrize("by_task", [False, True])
def test_a_counted_failure_beyond_the_threshold_fails_the_job(
        reason: CheckpointFailureReason, by_task: bool) -> None:
    s, _ = _scheduler()
    cid = _start(s, K.MANUAL)
    out = s.declined(cid, reason) if by_task else s.failed(cid, reason)
    assert out[0] == AbortedCheckpoint(cid, K.MANUAL, reason)
    (failure,) = _failures(out)
    assert THRESHOLD in failure.message
    assert f"checkpoint {cid}" in failure.message and reason.message in failure.message
    assert (failure.reason, failure.checkpoint_id) == (reason, cid)
    assert isinstance(failure.error(), CheckpointError)
    assert str(failure.error()) == failure.message
    assert s.consecutive_failures == 0  # the count is reset once the job fails


@pytest.mark.parametrize("reason", [r for r in R if not r.counted])
def test_other_reasons_never_count(reason: CheckpointFailureReason) -> None:
    s, _ = _scheduler(max_concurrent=10)
    declined = s.declined(_start(s, K.MANUAL), reason)
    failed = s.failed(_start(s, K.MANUAL), reason)
    assert _failures(declined + failed) == [] and s.consecutive_failures == 0


@pytest.mark.parametrize("abort", list(AbortReason), ids=lambda r: r.name)
def test_a_task_declining_at_its_barriers_says_why_and_the_job_goes_on(
        abort: AbortReason) -> None:
    """A task gives a checkpoint up at its barriers for the reason its handler names
    (subsumed by a newer barrier, a cancellation marker, an input ended): the decline
    message carries that reason, and none counts against ``tolerable_failures``, as in
    Flink (``CheckpointFailureManager`` ignores every ``CHECKPOINT_DECLINED_*``)."""
    s, _ = _scheduler()  # tolerable_failures=0: a counted failure would fail the job
    cid = _start(s, K.MANUAL)
    message = decline_message(cid, abort)
    assert message["id"] == cid and message["error"] == abort.value
    reason = CheckpointFailureReason.of_decline(message)
    assert reason.name == abort.name and not reason.counted
    assert s.declined(cid, reason) == [AbortedCheckpoint(cid, K.MANUAL, reason)]
    assert s.consecutive_failures == 0


def test_failures_count_up_to_the_threshold() -> None:
    s, _ = _scheduler(tolerable_failures=2, max_concurrent=10)
    assert _failures(s.declined(_start(s, K.MANUAL))) == []
    assert _failures(s.failed(_start(s, K.MANUAL), R.CHECKPOINT_EXPIRED)) == []
    assert s.consecutive_failures == 2
    assert _failures(s.failed(_start(s, K.MANUAL), R.TASK_FAILURE)) == []  # not counted
    out = s.declined(_start(s, K.MANUAL), R.CHECKPOINT_ASYNC_EXCEPTION)
    (failure,) = _failures(out)
    assert THRESHOLD in failure.message and "With 3 failed" in failure.message
    assert s.consecutive_failures == 0


def test_a_checkpoint_id_counts_once() -> None:
    s, _ = _scheduler(tolerable_failures=1)
    cid = _start(s, K.MANUAL)
    assert _failures(s.declined(cid)) == []
    assert s.declined(cid) == [] and s.failed(cid, R.IO_EXCEPTION) == []  # no longer pending
    assert s.consecutive_failures == 1


def test_a_completion_resets_the_count() -> None:
    s, _ = _scheduler(tolerable_failures=1, max_concurrent=10)
    s.declined(_start(s, K.MANUAL))
    assert s.consecutive_failures == 1
    s.completed(_start(s, K.MANUAL))
    assert s.consecutive_failures == 0
    assert _failures(s.declined(_start(s, K.MANUAL))) == []
    assert len(_failures(s.declined(_start(s, K.MANUAL)))) == 1


def test_failures_at_or_below_the_last_completed_id_are_ignored() -> None:
    s, _ = _scheduler(max_concurrent=10)
    sp = _start(s, K.SAVEPOINT)  # savepoints are not subsumed: still pending afterwards
    s.completed(_start(s, K.MANUAL))
    out = s.declined(sp, R.CHECKPOINT_DECLINED)
    assert out == [AbortedCheckpoint(sp, K.SAVEPOINT, R.CHECKPOINT_DECLINED)]
    assert s.consecutive_failures == 0


def test_a_savepoint_completion_resets_the_count() -> None:
    s, _ = _scheduler(tolerable_failures=1, max_concurrent=10)
    s.declined(_start(s, K.MANUAL))
    s.completed(_start(s, K.SAVEPOINT))
    assert s.consecutive_failures == 0


def test_a_savepoint_declined_by_a_task_counts() -> None:
    s, _ = _scheduler()
    out = s.declined(_start(s, K.SAVEPOINT), R.CHECKPOINT_ASYNC_EXCEPTION)
    assert len(_failures(out)) == 1 and THRESHOLD in _failures(out)[0].message


@pytest.mark.parametrize("reason", [R.IO_EXCEPTION, R.FINALIZE_CHECKPOINT_FAILURE,
                                    R.CHECKPOINT_DECLINED])
def test_a_savepoint_failed_on_the_coordinators_side_never_counts(
        reason: CheckpointFailureReason) -> None:
    s, _ = _scheduler()
    assert _failures(s.failed(_start(s, K.SAVEPOINT), reason)) == []
    assert _failures(s.failed(_start(s, K.SYNC_SAVEPOINT), reason)) == []
    assert s.consecutive_failures == 0


def test_a_pre_flight_reason_from_a_task_is_a_coordinator_failure() -> None:
    s, _ = _scheduler()
    assert _failures(s.declined(_start(s, K.SAVEPOINT), R.IO_EXCEPTION)) == []
    assert _failures(s.declined(_start(s, K.SYNC_SAVEPOINT), R.IO_EXCEPTION)) == []
    assert len(_failures(s.declined(_start(s, K.MANUAL), R.IO_EXCEPTION))) == 1


@pytest.mark.parametrize("reason", [R.CHECKPOINT_DECLINED, R.CHECKPOINT_DECLINED_TASK_NOT_READY,
                                    R.CHECKPOINT_DECLINED_SUBSUMED, R.TASK_FAILURE])
def test_a_synchronous_savepoint_failing_in_a_task_fails_the_job(
        reason: CheckpointFailureReason) -> None:
    s, _ = _scheduler(tolerable_failures=100, max_concurrent=10)
    s.completed(_start(s, K.MANUAL))
    sync = _start(s, K.SYNC_SAVEPOINT)
    out = s.declined(sync, reason)
    assert out[0] == AbortedCheckpoint(sync, K.SYNC_SAVEPOINT, reason)
    (failure,) = _failures(out)
    assert f"synchronous savepoint {sync}" in failure.message
    assert reason.message in failure.message and failure.checkpoint_id == sync


def test_a_job_failure_resets_the_count() -> None:
    s, _ = _scheduler(tolerable_failures=1, max_concurrent=10)
    s.declined(_start(s, K.MANUAL))
    assert len(_failures(s.declined(_start(s, K.MANUAL)))) == 1
    assert _failures(s.declined(_start(s, K.MANUAL))) == []  # counting starts over


# ------------------------------------------------------------------ stop


def test_stop_drops_queued_requests_and_aborts_pending_checkpoints() -> None:
    s, clock = _scheduler(interval_ms=100)
    s.start()
    first = _start(s, K.MANUAL)
    sp = _start(s, K.SAVEPOINT)
    queued = s.request(K.MANUAL)
    out = s.stop()
    assert out == [DroppedRequest(queued, K.MANUAL, R.CHECKPOINT_COORDINATOR_SUSPEND),
                   AbortedCheckpoint(first, K.MANUAL, R.CHECKPOINT_COORDINATOR_SUSPEND),
                   AbortedCheckpoint(sp, K.SAVEPOINT, R.CHECKPOINT_COORDINATOR_SUSPEND)]
    assert s.pending == {} and s.queued == 0 and s.next_wakeup_ms() is None
    clock.now = 1000
    assert s.poll() == []
    assert s.stop(R.CHECKPOINT_COORDINATOR_SHUTDOWN) == []
    s.start()
    assert s.next_wakeup_ms() == 1100
    clock.now = 1100
    assert _starts(s.poll()) == [(3, K.PERIODIC)]


# ------------------------------------------------------------------ random sequences

KINDS = list(RequestKind)
REASONS = list(CheckpointFailureReason)


class SchedulerMachine(RuleBasedStateMachine):
    """Random requests, polls, clock advances, wall-clock steps (back and forward by up
    to an hour) and checkpoint ends; every decision is checked against what happened
    before, timing on the monotonic clock, trigger timestamps on the wall clock."""

    @initialize(interval=st.none() | st.integers(10, 300), timeout=st.integers(10, 600),
                pause=st.integers(0, 200), max_concurrent=st.integers(1, 3),
                tolerable=st.integers(0, 3), unaligned=st.booleans(),
                seed=st.none() | st.integers(0, 100), first_id=st.integers(1, 5))
    def setup(self, interval: int | None, timeout: int, pause: int, max_concurrent: int,
              tolerable: int, unaligned: bool, seed: int | None, first_id: int) -> None:
        self.config = CheckpointConfig(
            interval=interval, timeout=timeout, min_pause=pause,
            max_concurrent=1 if unaligned else max_concurrent, tolerable_failures=tolerable,
            unaligned=unaligned)
        self.clock = Clock(1000)
        self.wall = Clock(1_700_000_000_000)
        self.s = CheckpointScheduler(self.config, self.clock, wall_clock=self.wall,
                                     first_id=first_id,
                                     rng=None if seed is None else random.Random(seed),
                                     max_queued=4)
        self.s.start()
        self.last_id = first_id - 1
        self.started: dict[int, StartCheckpoint] = {}
        self.ended: set[int] = set()
        self.requests: dict[int, RequestKind] = {}
        self.resolved: set[int] = set()
        self.last_completion: int | None = None

    def _absorb(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, StartCheckpoint):
                assert d.checkpoint_id > self.last_id  # ids strictly increase
                self.last_id = d.checkpoint_id
                assert d.request_id in self.requests or d.kind is K.PERIODIC
                assert d.request_id not in self.resolved
                assert d.timestamp_ms == self.wall.now  # started now, stamped by the wall
                if d.kind is K.PERIODIC and self.last_completion is not None:
                    assert self.clock.now >= self.last_completion + self.config.min_pause_ms
                self.resolved.add(d.request_id)
                self.started[d.checkpoint_id] = d
            elif isinstance(d, DroppedRequest):
                assert d.request_id not in self.resolved  # dropped once, never started
                self.resolved.add(d.request_id)
            elif isinstance(d, AbortedCheckpoint):
                assert d.checkpoint_id in self.started and d.checkpoint_id not in self.ended
                assert d.kind is self.started[d.checkpoint_id].kind
                self.ended.add(d.checkpoint_id)
            else:
                assert THRESHOLD in d.message or "synchronous savepoint" in d.message

    def _pick(self, index: int) -> int | None:
        pending = sorted(self.s.pending)
        return pending[index % len(pending)] if pending else None

    @rule(ms=st.integers(0, 400))
    def advance(self, ms: int) -> None:
        self.clock.now += ms
        self.wall.now += ms

    @rule(ms=st.integers(-3_600_000, 3_600_000))
    def step_wall_clock(self, ms: int) -> None:
        before = self.s.next_wakeup_ms()
        self.wall.now += ms
        assert self.s.next_wakeup_ms() == before

    @rule()
    def poll(self) -> None:
        self._absorb(self.s.poll())
        wakeup = self.s.next_wakeup_ms()
        assert wakeup is None or wakeup > self.clock.now  # nothing left to do now

    @rule()
    def wake_up(self) -> None:
        wakeup = self.s.next_wakeup_ms()
        if wakeup is not None:
            self.clock.now = max(self.clock.now, wakeup)
            self.poll()

    @rule(kind=st.sampled_from(KINDS))
    def request(self, kind: RequestKind) -> None:
        self.requests[self.s.request(kind)] = kind

    @rule(index=st.integers(0, 10))
    def complete(self, index: int) -> None:
        cid = self._pick(index)
        if cid is not None:
            out = self.s.completed(cid)
            self.ended.add(cid)
            self.last_completion = self.clock.now
            assert all(isinstance(d, AbortedCheckpoint) and d.reason is R.CHECKPOINT_SUBSUMED
                       and d.checkpoint_id < cid and not d.kind.savepoint for d in out)
            self._absorb(out)
            assert self.s.consecutive_failures == 0

    @rule(index=st.integers(0, 10), reason=st.sampled_from(REASONS), by_task=st.booleans())
    def fail(self, index: int, reason: CheckpointFailureReason, by_task: bool) -> None:
        cid = self._pick(index)
        if cid is not None:
            out = self.s.declined(cid, reason) if by_task else self.s.failed(cid, reason)
            assert out[0] == AbortedCheckpoint(cid, self.started[cid].kind, reason)
            assert len(out) <= 2
            self._absorb(out)

    @rule(offset=st.integers(0, 3), ended=st.booleans())
    def end_one_not_pending(self, offset: int, ended: bool) -> None:
        # an id that ended already, or one not started yet: ignored
        cid = min(self.ended, default=0) if ended else self.last_id + 1 + offset
        assert self.s.completed(cid) == []
        assert self.s.failed(cid, R.IO_EXCEPTION) == [] and self.s.declined(cid) == []

    @rule()
    def restart(self) -> None:
        out = self.s.stop()
        self._absorb(out)
        assert all(not isinstance(d, (StartCheckpoint, JobFailure)) for d in out)
        self._check_all_ended()
        self.s.start()

    def _check_all_ended(self) -> None:
        assert self.s.pending == {} and self.s.queued == 0
        assert set(self.started) == self.ended  # each ended exactly once (_absorb)
        assert set(self.requests) <= self.resolved

    @invariant()
    def pending_are_started_and_not_ended(self) -> None:
        if hasattr(self, "s"):
            assert set(self.s.pending) == set(self.started) - self.ended
            assert self.s.queued <= 4

    @invariant()
    def at_most_max_concurrent_non_forced_pending(self) -> None:
        if hasattr(self, "s"):
            forced = (set() if self.config.unaligned
                      else {K.FORCED, K.SAVEPOINT, K.SYNC_SAVEPOINT})
            non_forced = [p for p in self.s.pending.values() if p.kind not in forced]
            assert len(non_forced) <= self.config.max_concurrent

    def teardown(self) -> None:
        if hasattr(self, "s"):
            self._absorb(self.s.stop(R.CHECKPOINT_COORDINATOR_SHUTDOWN))
            self._check_all_ended()


SchedulerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                              deadline=None)
test_scheduler_state_machine = SchedulerMachine.TestCase
