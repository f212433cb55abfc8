"""Restart supervision of a Spark streaming query with Flink's restart strategies.

Spark restarts failed *tasks* (``spark.task.maxFailures``) but not a failed *query*: one
exception ends it. :func:`supervise` plays Flink's job-level restart: it starts the query,
waits for it, and when it fails asks the :class:`~weir.api.restart.RestartStrategy`
whether and when to start it again. A restarted query with the same Spark
``checkpointLocation`` resumes from its last committed batch (and weir's stages from
that batch's checkpoint), so a restart replays at most the failed batch. The restart
loop — the tracker, the delay, the WARNING, giving up — is the one both runtimes share
(:mod:`weir.runtime.supervision`; the continuous runtime's driver: ``weir.stream.supervise``).

A query that failed because a weir function raised (Spark's error holds a
:class:`~weir.errors.UserFunctionError`, the task's report of it) is restarted like any
other — Flink restarts on user exceptions as its restart strategy allows — but it is
named by the user's exception, not by Spark's wall of text: in the WARNING of each
restart, and in the final :class:`~weir.errors.RestartsExhaustedError`, whose message
starts with it and which is chained from the ``UserFunctionError`` (rebuilt on the
driver, itself chained from the user's exception rebuilt: ``KeyError`` and the like).

:func:`report_failures_once` (:func:`weir.spark.session` calls it) keeps Spark's log
from repeating a task's failure in every report of it.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from weir.api.restart import RestartStrategy
from weir.errors import ConfigurationError, UserFunctionError
from weir.runtime.spark.lifecycle import finish
from weir.runtime.spark.listener import COMPLETIONS
from weir.runtime.supervision import FLINK_DEFAULT, check_strategy, restart_loop

__all__ = ["report_failures_once", "supervise"]

log = logging.getLogger("weir")


def supervise(
    start_query: Callable[[], Any],
    *,
    restart: RestartStrategy = FLINK_DEFAULT,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    poll_s: float | None = 1.0,
) -> int:
    """Run the streaming query that ``start_query()`` starts (it must build and start a
    new ``StreamingQuery`` each call, e.g. ``lambda: out.writeStream...start()``),
    restarting it after failures as ``restart`` allows; return the number of restarts
    once a run of it ends without an error (``stop()``, ``trigger(availableNow=True)``
    done).

    A run failed if ``awaitTermination()`` raises (Spark's ``StreamingQueryException``)
    or ``exception()`` is set after it, or if ``start_query()`` itself raises. Each
    failure goes to ``restart``'s tracker (the default: Flink's default, exponential
    delay from 1 s to 1 min, unlimited attempts) at ``clock()``: it answers a delay, and
    the query is started again after ``sleep(delay)`` with one WARNING line on the
    ``weir`` logger (query, restart number, delay, the error's first line); or it gives
    up, and :class:`~weir.errors.RestartsExhaustedError` is raised from the last error
    (a weir function's: its :class:`~weir.errors.UserFunctionError`, rebuilt, named
    first in the message).
    ``rng`` draws the jitter of exponential delay; ``poll_s`` is how often (seconds) the
    wait looks up from ``awaitTermination`` (None: one blocking call).

    On ``KeyboardInterrupt`` the running query is stopped and the interrupt re-raised.
    A failed run's weir stages are given up at once (not when Spark's listener event
    comes), so that the restarted query may take them over even when ``start_query``
    reuses a DataFrame built by :func:`weir.spark.process` once; after a run that ended
    without error, :func:`weir.spark.finish` completes the checkpoint of its last batch
    (its errors propagate)."""
    check_strategy(restart)
    if poll_s is not None and not poll_s > 0:
        raise ConfigurationError(f"poll_s must be seconds > 0 or None, got {poll_s!r}")
    label = f"started by {getattr(start_query, '__qualname__', repr(start_query))}"
    running: list[Any] = [None]  # the query of the current run

    def run() -> Any:
        nonlocal label
        running[0] = None
        query = running[0] = start_query()
        label = _label(query)
        try:
            error = _wait(query, poll_s)
        except Exception:
            _settle(query, label)
            raise
        if error is not None:
            _settle(query, label)
            raise error
        return query

    try:
        restarts, query = restart_loop(
            run, restart=restart, what=lambda: f"streaming query {label}",
            fix=("Fix the cause (the error this one is chained from) and start the query "
                 "again: with the same checkpointLocation it resumes from its last "
                 "committed batch; or supervise it with a more lenient restart strategy "
                 "(RestartStrategy.fixed_delay, failure_rate or exponential_delay)"),
            clock=clock, sleep=sleep, rng=rng, named=UserFunctionError.from_error)
        finish(query)
    except KeyboardInterrupt:
        if running[0] is not None:
            with contextlib.suppress(Exception):
                running[0].stop()
        raise
    return restarts


def _wait(query: Any, poll_s: float | None) -> BaseException | None:
    """Wait until ``query`` ends; its error, or None if it ended without one."""
    if poll_s is None:
        query.awaitTermination()
    else:
        while not query.awaitTermination(poll_s):
            pass
    error = query.exception()
    return error if isinstance(error, BaseException) else None


def _settle(query: Any, label: str) -> None:
    """Complete the last batch the failed ``query`` committed and give its stages up,
    as the query listener does when the query's termination event comes."""
    for completion in list(COMPLETIONS.values()):
        try:
            completion.settle(query)
        except Exception as exc:  # the listener's event settles it again
            log.warning("weir: settling the failed streaming query %s: %s", label, exc)


def _label(query: Any) -> str:
    """The query's name (if it has one) and id."""
    try:
        name, query_id = query.name, query.id
    except Exception:
        return repr(query)
    return f"{name!r} (id {query_id})" if name else f"(id {query_id})"


#: Spark's log lines that repeat a task's failure which the driver reports anyway
#: (regular expressions over the whole message; see report_failures_once)
_REPEATS = (
    # the executor's own reports of a failed task (Utils: its writer's; Executor: the
    # task's): TaskSetManager reports the failure on the driver, the first time with
    # its stack (in local mode both are in the one log, with the same stack)
    r"(?s)(\[[^\]]*\] )*Aborting task",
    r"(?s)(\[[^\]]*\] )*Exception in task \S+ in stage \S+ \(TID \d+\)",
    r"(?s)(\[[^\]]*\] )*Abort(ing|ed) commit for partition .*",
    # each task attempt failed (or killed) by a weir function's exception: the query's
    # end reports it once (MicroBatchExecution's error, and the error raised to the
    # program); "Task ... failed N times; aborting job" still says how often it failed
    r"(?s)(\[[^\]]*\] )*Lost task .*weir\.errors\.UserFunctionError: .*",
)
_FILTERED = "weir.failureReportsFiltered"


def report_failures_once(spark: Any) -> bool:
    """Keep the log of ``spark``'s JVM (log4j 2) from repeating a task's failure: its
    executor's own reports of it, and each task attempt's report of a weir function's
    error (the query's failure reports it, once, with the user's exception first). A
    filter on each appender of the root logger; once per JVM. On the Python side,
    py4j's ERROR for a ``foreachBatch`` function that failed because a weir function did
    is dropped too (the query's failure reports it). False (the JVM's log left as it
    is) for a session without a JVM here (Spark Connect) or another logging backend."""
    py4j = logging.getLogger("py4j.clientserver")
    if not any(isinstance(f, _ReportedByTheQuery) for f in py4j.filters):
        py4j.addFilter(_ReportedByTheQuery())
    try:
        jvm = spark._jvm
        system = jvm.java.lang.System
        if system.getProperty(_FILTERED) is not None:
            return True
        log4j = jvm.org.apache.logging.log4j
        config = log4j.LogManager.getContext(False).getConfiguration()
        result = log4j.core.Filter.Result
        targets = list(config.getRootLogger().getAppenders().values())  # (py4j: a dict)
        for regex in _REPEATS:
            drop = log4j.core.filter.RegexFilter.createFilter(
                regex, None, False, result.DENY, result.NEUTRAL)
            for appender in targets:
                appender.addFilter(drop)
        system.setProperty(_FILTERED, "true")
        return True
    except Exception as exc:  # no py4j JVM (Spark Connect), no log4j 2 core
        log.debug("weir: Spark's log is left as it is: %s", exc)
        return False


class _ReportedByTheQuery(logging.Filter):
    """Drops a log record whose exception holds a weir function's error (py4j's report
    of a ``foreachBatch`` function that failed because of it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or "weir.errors.UserFunctionError: " not in str(error)
