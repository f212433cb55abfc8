"""Job-level restarts, shared by both runtimes: run a job again after it failed, as a
:class:`~weir.api.restart.RestartStrategy` allows (Flink's job restart; the failover of
a job's *tasks* is each runtime's own).

:func:`restart_loop` is the one restart loop: it calls ``run()`` until a call returns,
tells each failure (an exception of ``run()``) to the strategy's tracker, and either
waits the delay the tracker answers — after one WARNING line on the ``weir`` logger:
what failed, the restart number, the strategy, the delay, the error's first line — or
raises :class:`~weir.errors.RestartsExhaustedError` from the last error. Each runtime
says what one run is:

* ``weir.spark.supervise`` (:mod:`weir.runtime.spark.supervise`): start a streaming
  query and wait for its end;
* ``weir.stream.supervise`` (:func:`supervise_job`, here: it needs nothing of the
  continuous runtime but its public entry point): build and execute a continuous job.
  Each run claims the job's checkpoint storage (:mod:`weir.checkpoint.protocol`): a
  failed run released its claim as it ended, so the next one takes the storage over at
  once (a driver killed outright is taken over as soon as its process is gone, on this
  machine, else when its lease expires) and continues the storage's state — the newest
  completed checkpoint, of the failed run or before it.
"""

from __future__ import annotations

import contextvars
import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from weir.api.restart import RestartStrategy
from weir.errors import ConfigurationError, RestartsExhaustedError

__all__ = ["FLINK_DEFAULT", "check_strategy", "first_line", "restart_loop", "resuming",
           "supervise_job"]

log = logging.getLogger("weir")

#: Flink's default restart strategy with checkpointing: exponential delay from 1 s to
#: 1 min, unlimited attempts
FLINK_DEFAULT = RestartStrategy.exponential_delay()

_T = TypeVar("_T")

#: True while a supervised continuous job runs again after a failure: its driver then
#: ignores ``restore_from`` and continues the checkpoint storage's state (Flink: a job
#: submitted from a savepoint fails over to its newest checkpoint, not the savepoint)
_RESUMING: contextvars.ContextVar[bool] = contextvars.ContextVar("weir_resuming",
                                                                 default=False)


def resuming() -> bool:
    """Whether this is a supervised job's run after a failure (see :func:`supervise_job`)."""
    return _RESUMING.get()


def check_strategy(restart: object) -> RestartStrategy:
    """``restart`` if it is a :class:`RestartStrategy`, else a ConfigurationError."""
    if not isinstance(restart, RestartStrategy):
        raise ConfigurationError(f"restart must be a RestartStrategy (RestartStrategy."
                                 f"fixed_delay(), exponential_delay(), ...), got {restart!r}")
    return restart


def restart_loop(
    run: Callable[[], _T],
    *,
    restart: RestartStrategy,
    what: Callable[[], str],
    fix: str,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    named: Callable[[BaseException], BaseException | None] = lambda error: None,
) -> tuple[int, _T]:
    """Call ``run()`` until a call returns; the number of restarts and what it returned.

    A call that raises an :class:`Exception` failed (``KeyboardInterrupt`` and the like
    propagate at once): the failure goes to ``restart``'s tracker (``rng`` draws the
    jitter of exponential delay) at ``clock()``. It answers a delay: one WARNING on the
    ``weir`` logger — ``weir: <what()> failed; restart <n> (<strategy>) in <delay> s:
    <the error's first line>`` — then ``sleep(delay)`` and the next call. Or it gives
    up: :class:`~weir.errors.RestartsExhaustedError`, ``<what()> failed after <n>
    restart(s) and its restart strategy <strategy> allows no more: <the error's first
    line>. <fix>``, raised from the error.

    ``named(error)`` may give the exception to name instead (a user's function's error
    found in a runtime's report of it): the warning ends with its first line, and the
    final error starts with it — ``<its first line>: <what()> failed after ...`` — and
    is raised from it. ``what()`` is called when a message is written (a run may
    learn its name as it starts)."""
    tracker = check_strategy(restart).tracker(rng)
    while True:
        try:
            return tracker.restarts, run()
        except Exception as exc:
            error: Exception = exc
        user = named(error)
        delay = tracker.on_failure(clock())
        if delay is None:
            gave_up = (f"{what()} failed after {tracker.restarts} restart(s) and its restart "
                       f"strategy {restart} allows no more")
            if user is not None:  # the user's exception first, chained from it
                raise RestartsExhaustedError(
                    f"{str(user).splitlines()[0]}: {gave_up}. {fix}") from user
            raise RestartsExhaustedError(f"{gave_up}: {first_line(error)}. {fix}") from error
        log.warning("weir: %s failed; restart %d (%s) in %.3g s: %s", what(),
                    tracker.restarts, restart, delay,
                    first_line(user if user is not None else error))
        sleep(delay)


def supervise_job(
    run_job: Callable[[], _T],
    *,
    restart: RestartStrategy = FLINK_DEFAULT,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> tuple[int, _T]:
    """Run a continuous job's driver — ``run_job()`` builds and executes the job, e.g.
    ``lambda: build(StreamEnvironment(config)).execute("count")`` — again after it
    failed, as ``restart`` allows; once a run returns, the number of restarts and what
    it returned (the :class:`~weir.stream.JobResult` of ``execute``).

    A run failed if ``run_job()`` raised: the job's own restart strategy (its tasks'
    failover) gave up (:class:`~weir.errors.JobFailedError`, which names the root
    cause first), or the driver failed before or around the job (another run owns the
    storage, the storage could not be reached, ...). Each failure goes to ``restart``'s
    tracker (the default: Flink's default, exponential delay from 1 s to 1 min,
    unlimited attempts) at ``clock()``: it answers a delay, and the job runs again after
    ``sleep(delay)`` with one WARNING line on the ``weir`` logger (the run, restart
    number, delay, the error's first line); or it gives up, and
    :class:`~weir.errors.RestartsExhaustedError` is raised from the last error. ``rng``
    draws the jitter of exponential delay. ``KeyboardInterrupt`` propagates at once
    (``execute`` stops the job's tasks as it ends).

    The first run starts as ``run_job`` says (from ``restore_from`` when it is given,
    in ``execute`` or the ``JobConfig``). Each run after a failure continues the
    checkpoint storage's state, ``restore_from`` or not (Flink: a job submitted from a
    savepoint fails over to its newest checkpoint): the newest completed checkpoint of
    the failed run, or what it started from if it completed none — going back to the
    savepoint would commit the output since it once more. The failed run released its
    claim on the storage as it ended, so the next one takes it over at once."""
    label = f"run by {getattr(run_job, '__qualname__', repr(run_job))}"
    runs = 0

    def run() -> _T:
        nonlocal runs
        runs += 1
        token = _RESUMING.set(runs > 1)
        try:
            return run_job()
        finally:
            _RESUMING.reset(token)

    return restart_loop(
        run, restart=restart, what=lambda: f"continuous job {label}",
        fix=("Fix the cause (the error this one is chained from) and run the job again: "
             "on the same checkpoint storage it continues from its newest completed "
             "checkpoint; or supervise it with a more lenient restart strategy "
             "(RestartStrategy.fixed_delay, failure_rate or exponential_delay)"),
        clock=clock, sleep=sleep, rng=rng)


def first_line(error: BaseException) -> str:
    """The error's type and the first line of its message. A Python traceback that
    message ends in (an error raised in ``foreachBatch`` or in a Python task, reported
    by Spark) is replaced by the line of the exception raised."""
    lines = str(error).splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    if first.endswith(_TRACEBACK):
        raised, in_traceback = None, True
        for line in lines[1:]:
            if line.rstrip().endswith(_TRACEBACK):
                in_traceback = True
            elif in_traceback and line.strip() and not line[0].isspace():
                raised, in_traceback = line.strip(), False  # the last one: the outermost
        if raised is not None:
            first = first[: -len(_TRACEBACK)] + raised
    return f"{type(error).__name__}: {first}"


_TRACEBACK = "Traceback (most recent call last):"
