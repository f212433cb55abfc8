"""Restart strategies: how long to wait before restarting a failed job, and when to give
up. Flink's four, with the defaults of Flink 1.19+ and 2.x (FLIP-364).

A :class:`RestartStrategy` is an immutable setting; its :meth:`~RestartStrategy.tracker`
is the restart state of one job: :meth:`RestartTracker.on_failure` is told each failure
(the time in seconds of a monotonic clock) and answers the seconds to wait before the
restart, or None: give up. The factories take durations as every weir setting does
(:mod:`weir.api.durations`: ``"1 s"``, a :class:`datetime.timedelta`); a bare number
is still read as seconds for one release, with a :class:`DeprecationWarning`. The
strategies keep them as float seconds.

* ``fixed_delay`` — Flink's ``restart-strategy.type: fixed-delay``
  (``restart-strategy.fixed-delay.attempts`` = 1, ``.delay`` = 1 s): restart after
  ``delay``, ``attempts`` times in the job's life; the failure after that gives up.
* ``failure_rate`` — ``failure-rate`` (``restart-strategy.failure-rate.max-failures-per-
  interval`` = 1, ``.failure-rate-interval`` = 1 min, ``.delay`` = 1 s): restart after
  ``delay``; give up on more than ``max_failures_per_interval`` failures within
  ``failure_rate_interval`` (this one and the max before it at most that far apart).
* ``exponential_delay`` — ``exponential-delay``, Flink's default when checkpointing is on
  (``restart-strategy.exponential-delay.initial-backoff`` = 1 s, ``.max-backoff`` = 1 min,
  ``.backoff-multiplier`` = 1.5, ``.reset-backoff-threshold`` = 1 h, ``.jitter-factor`` =
  0.1, ``.attempts-before-reset-backoff`` = unlimited): restart ``n`` since the last reset
  waits ``initial_backoff * backoff_multiplier ** (n - 1)`` plus a jitter uniform in +/-
  ``jitter_factor`` of that, the sum kept within ``[initial_backoff, max_backoff]``. A
  failure ``reset_backoff_threshold`` or more after the last restart (the previous
  failure plus its backoff) resets backoff and attempt count; the failure after
  ``attempts_before_reset_backoff`` restarts without a reset gives up.
* ``no_restart`` — ``none``: the first failure gives up.

Flink counts failures that arrive while a restart is pending (tasks failing together) as
one; a supervised query fails once per run, so each failure counts here.
"""

from __future__ import annotations

import abc
import math
import random
from collections import deque
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, ClassVar

from weir.api.durations import duration, warn_bare_seconds
from weir.errors import ConfigurationError

__all__ = ["Duration", "ExponentialDelayRestart", "FailureRateRestart", "FixedDelayRestart",
           "NoRestart", "RestartStrategy", "RestartTracker"]

Duration = str | timedelta | float
"""A duration: a string with a unit (``"1 s"``), a :class:`datetime.timedelta`, or
(deprecated) a bare number of seconds."""


def _seconds(value: object, name: str, *, zero: bool) -> float:
    s = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(s, bool) or not isinstance(s, int | float) or not 0 <= s < math.inf or (
            s == 0 and not zero):
        raise ConfigurationError(f"{name} must be seconds (a number) or a timedelta, finite and "
                                 f"{'>=' if zero else '>'} 0, got {value!r}")
    return float(s)


def _count(value: object, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")


def _dur(value: Duration, name: str) -> float:
    """Seconds of a factory's duration (a bare number: seconds, deprecated; the
    strategy's dataclass checks its range)."""
    if warn_bare_seconds(value, name):
        return value  # type: ignore[return-value]
    return duration(value, name).total_seconds()


class RestartTracker(abc.ABC):
    """The mutable restart state of one supervised job (see
    :meth:`RestartStrategy.tracker`); ``restarts`` counts the restarts it granted."""

    def __init__(self, strategy: Any, rng: random.Random) -> None:
        self.strategy, self.rng, self.restarts = strategy, rng, 0

    @abc.abstractmethod
    def on_failure(self, now_s: float) -> float | None:
        """Note a failure at ``now_s`` (seconds, monotonic): the seconds to wait before
        restarting the job, or None if the strategy gives up."""


class _Never(RestartTracker):  # NoRestartBackoffTimeStrategy
    def on_failure(self, now_s: float) -> float | None:
        return None


class _Fixed(RestartTracker):
    # FixedDelayRestartBackoffTimeStrategy: attempt += 1; restart while attempt <= max
    def on_failure(self, now_s: float) -> float | None:
        if self.restarts >= self.strategy.attempts:
            return None
        self.restarts += 1
        return float(self.strategy.delay)


class _FailureRate(RestartTracker):
    # FailureRateRestartBackoffTimeStrategy: keeps the last max + 1 failure times; gives
    # up once it holds max + 1 and the oldest is not more than the interval ago
    def __init__(self, strategy: Any, rng: random.Random) -> None:
        super().__init__(strategy, rng)
        self.failures: deque[float] = deque(maxlen=strategy.max_failures_per_interval + 1)

    def on_failure(self, now_s: float) -> float | None:
        self.failures.append(now_s)
        if len(self.failures) == self.failures.maxlen and (
                now_s - self.failures[0] <= self.strategy.failure_rate_interval):
            return None
        self.restarts += 1
        return float(self.strategy.delay)


class _Exponential(RestartTracker):
    # ExponentialDelayRestartBackoffTimeStrategy (FLIP-364), in seconds
    attempt = 0  # restarts since the last reset
    next_restart = -math.inf

    def on_failure(self, now_s: float) -> float | None:
        s = self.strategy
        if now_s - self.next_restart >= s.reset_backoff_threshold:
            self.attempt = 0
        try:
            base = s.initial_backoff * s.backoff_multiplier ** self.attempt
        except OverflowError:
            base = math.inf
        offset = base * s.jitter_factor
        jitter = self.rng.uniform(-offset, offset) if 0 < offset < math.inf else 0.0
        backoff = float(max(s.initial_backoff, min(base + jitter, s.max_backoff)))
        self.attempt += 1
        if s.attempts_before_reset_backoff is not None and (
                self.attempt > s.attempts_before_reset_backoff):
            return None
        self.next_restart = now_s + backoff
        self.restarts += 1
        return backoff


@dataclass(frozen=True)
class RestartStrategy:
    """A restart strategy (Flink's ``restart-strategy.type``) from :meth:`fixed_delay`,
    :meth:`exponential_delay`, :meth:`failure_rate` or :meth:`no_restart` (explained in
    the module documentation); ``str()`` gives Flink's name and the settings (seconds)."""

    _kind: ClassVar[str] = "none"
    _tracker: ClassVar[type[RestartTracker]] = _Never

    @staticmethod
    def fixed_delay(attempts: int = 1, delay: Duration = "1 s") -> FixedDelayRestart:
        """Restart after ``delay`` (>= 0), at most ``attempts`` (>= 0) times."""
        return FixedDelayRestart(attempts, _dur(delay, "delay"))

    @staticmethod
    def exponential_delay(
        initial_backoff: Duration = "1 s", max_backoff: Duration = "1 min",
        backoff_multiplier: float = 1.5, reset_backoff_threshold: Duration = "1 h",
        jitter_factor: float = 0.1, attempts_before_reset_backoff: int | None = None,
    ) -> ExponentialDelayRestart:
        """Backoff from ``initial_backoff`` to ``max_backoff`` (0 < initial <= max), times
        ``backoff_multiplier`` (> 1) per restart, jitter +/- ``jitter_factor`` (in [0, 1]);
        reset after ``reset_backoff_threshold`` (> 0); give up after
        ``attempts_before_reset_backoff`` (>= 1, None: never) restarts without a reset."""
        return ExponentialDelayRestart(
            _dur(initial_backoff, "initial_backoff"), _dur(max_backoff, "max_backoff"),
            backoff_multiplier, _dur(reset_backoff_threshold, "reset_backoff_threshold"),
            jitter_factor, attempts_before_reset_backoff)

    @staticmethod
    def failure_rate(max_failures_per_interval: int = 1,
                     failure_rate_interval: Duration = "1 min",
                     delay: Duration = "1 s") -> FailureRateRestart:
        """Restart after ``delay`` (>= 0) unless more than ``max_failures_per_interval``
        (>= 1) failures happened within ``failure_rate_interval`` (> 0)."""
        return FailureRateRestart(max_failures_per_interval,
                                  _dur(failure_rate_interval, "failure_rate_interval"),
                                  _dur(delay, "delay"))

    @staticmethod
    def no_restart() -> NoRestart:
        """Never restart: the first failure gives up."""
        return NoRestart()

    def tracker(self, rng: random.Random | None = None) -> RestartTracker:
        """A new tracker of this strategy's restarts for one job; ``rng`` draws the
        jitter of :meth:`exponential_delay` (default: a new ``random.Random()``)."""
        return self._tracker(self, rng if rng is not None else random.Random())

    def __str__(self) -> str:
        settings = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return f"{self._kind}({settings})"


@dataclass(frozen=True)
class FixedDelayRestart(RestartStrategy):
    """Flink's ``fixed-delay`` (see :meth:`RestartStrategy.fixed_delay`)."""

    _kind: ClassVar[str] = "fixed-delay"
    _tracker: ClassVar[type[RestartTracker]] = _Fixed
    attempts: int = 1
    delay: float = 1.0

    def __post_init__(self) -> None:
        _count(self.attempts, "attempts", 0)
        object.__setattr__(self, "delay", _seconds(self.delay, "delay", zero=True))


@dataclass(frozen=True)
class FailureRateRestart(RestartStrategy):
    """Flink's ``failure-rate`` (see :meth:`RestartStrategy.failure_rate`)."""

    _kind: ClassVar[str] = "failure-rate"
    _tracker: ClassVar[type[RestartTracker]] = _FailureRate
    max_failures_per_interval: int = 1
    failure_rate_interval: float = 60.0
    delay: float = 1.0

    def __post_init__(self) -> None:
        _count(self.max_failures_per_interval, "max_failures_per_interval", 1)
        for name, zero in (("failure_rate_interval", False), ("delay", True)):
            object.__setattr__(self, name, _seconds(getattr(self, name), name, zero=zero))


@dataclass(frozen=True)
class ExponentialDelayRestart(RestartStrategy):
    """Flink's ``exponential-delay`` (see :meth:`RestartStrategy.exponential_delay`);
    ``attempts_before_reset_backoff=None`` is unlimited (Flink's Integer.MAX_VALUE)."""

    _kind: ClassVar[str] = "exponential-delay"
    _tracker: ClassVar[type[RestartTracker]] = _Exponential
    initial_backoff: float = 1.0
    max_backoff: float = 60.0
    backoff_multiplier: float = 1.5
    reset_backoff_threshold: float = 3600.0
    jitter_factor: float = 0.1
    attempts_before_reset_backoff: int | None = None

    def __post_init__(self) -> None:
        for name in ("initial_backoff", "max_backoff", "reset_backoff_threshold"):
            object.__setattr__(self, name, _seconds(getattr(self, name), name, zero=False))
        if self.initial_backoff > self.max_backoff:
            raise ConfigurationError(f"initial_backoff must be <= max_backoff, got "
                                     f"{self.initial_backoff!r} > {self.max_backoff!r} seconds")
        m, j = self.backoff_multiplier, self.jitter_factor
        if isinstance(m, bool) or not isinstance(m, int | float) or not 1 < m < math.inf:
            raise ConfigurationError(f"backoff_multiplier must be a finite number > 1, got {m!r}")
        if isinstance(j, bool) or not isinstance(j, int | float) or not 0 <= j <= 1:
            raise ConfigurationError(f"jitter_factor must be a number in [0, 1], got {j!r}")
        if self.attempts_before_reset_backoff is not None:
            _count(self.attempts_before_reset_backoff,
                   "attempts_before_reset_backoff (None: unlimited)", 1)


@dataclass(frozen=True)
class NoRestart(RestartStrategy):
    """Flink's ``none`` (see :meth:`RestartStrategy.no_restart`)."""
