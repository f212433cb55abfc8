"""Restart strategies (weir.api.restart): Flink's defaults, each strategy's delays and
give-up points on an injected clock, validation, and the bounds of exponential delay."""

from __future__ import annotations

import dataclasses
import math
import random
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import weir
from weir.api.restart import (
    ExponentialDelayRestart,
    FailureRateRestart,
    FixedDelayRestart,
    NoRestart,
    RestartStrategy,
)
from weir.errors import ConfigurationError


def _delays(strategy: RestartStrategy, times: list[float], rng: Any = None) -> list[Any]:
    tracker = strategy.tracker(rng)
    return [tracker.on_failure(t) for t in times]


# ------------------------------------------------------------------ Flink's defaults


def test_defaults_are_flinks() -> None:
    # RestartStrategyOptions of Flink 1.19+/2.x
    assert RestartStrategy.fixed_delay() == FixedDelayRestart(attempts=1, delay=1.0)
    assert RestartStrategy.failure_rate() == FailureRateRestart(
        max_failures_per_interval=1, failure_rate_interval=60.0, delay=1.0)
    e = RestartStrategy.exponential_delay()
    assert isinstance(e, ExponentialDelayRestart)
    assert (e.initial_backoff, e.max_backoff, e.backoff_multiplier) == (1.0, 60.0, 1.5)
    assert (e.reset_backoff_threshold, e.jitter_factor) == (3600.0, 0.1)
    assert e.attempts_before_reset_backoff is None  # Integer.MAX_VALUE: unlimited
    assert RestartStrategy.no_restart() == NoRestart()


def test_strategies_are_frozen_and_printable() -> None:
    s = RestartStrategy.fixed_delay(3, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.attempts = 4  # type: ignore[misc]
    assert str(s) == "fixed-delay(attempts=3, delay=2.0)"
    assert str(RestartStrategy.no_restart()) == "none()"
    assert str(RestartStrategy.failure_rate()).startswith("failure-rate(")
    assert "attempts_before_reset_backoff=None" in str(RestartStrategy.exponential_delay())
    assert weir.RestartStrategy is RestartStrategy
    assert issubclass(weir.RestartsExhaustedError, weir.WeirError)


def test_durations_take_seconds_or_timedelta() -> None:
    assert RestartStrategy.fixed_delay(delay=timedelta(milliseconds=1500)).delay == 1.5
    assert RestartStrategy.fixed_delay(delay=2).delay == 2.0
    assert RestartStrategy.failure_rate(failure_rate_interval=timedelta(minutes=2)) \
        .failure_rate_interval == 120.0
    e = RestartStrategy.exponential_delay(initial_backoff=timedelta(seconds=2),
                                          max_backoff=timedelta(minutes=1),
                                          reset_backoff_threshold=timedelta(hours=2))
    assert (e.initial_backoff, e.max_backoff, e.reset_backoff_threshold) == (2.0, 60.0, 7200.0)
    # the dataclasses normalize too when built directly
    assert FixedDelayRestart(delay=timedelta(seconds=3)).delay == 3.0  # type: ignore[arg-type]


# ------------------------------------------------------------------ fixed delay, none


def test_fixed_delay_restarts_attempts_times_then_gives_up() -> None:
    assert _delays(RestartStrategy.fixed_delay(3, 2.5), [0, 1, 2, 3, 4]) == [
        2.5, 2.5, 2.5, None, None]
    assert _delays(RestartStrategy.fixed_delay(), [0, 1e6]) == [1.0, None]
    assert _delays(RestartStrategy.fixed_delay(0), [0]) == [None]
    tracker = RestartStrategy.fixed_delay(2).tracker()
    tracker.on_failure(0)
    assert tracker.restarts == 1


def test_no_restart_gives_up_at_the_first_failure() -> None:
    tracker = RestartStrategy.no_restart().tracker()
    assert tracker.on_failure(0.0) is None
    assert tracker.restarts == 0


# ------------------------------------------------------------------ failure rate


def test_failure_rate_gives_up_on_more_than_max_failures_in_the_interval() -> None:
    s = RestartStrategy.failure_rate(2, 10.0, delay=0.5)
    assert _delays(s, [0, 1, 2]) == [0.5, 0.5, None]
    # the oldest of the last three more than 10 s ago: go on
    assert _delays(s, [0, 5, 10.5, 16, 20]) == [0.5, 0.5, 0.5, 0.5, None]
    # exactly the interval apart still counts as within it (Flink: restart if > interval)
    assert _delays(s, [0, 5, 10]) == [0.5, 0.5, None]
    assert _delays(s, [0, 5, 10.001]) == [0.5, 0.5, 0.5]


def test_failure_rate_default_is_one_failure_per_minute() -> None:
    s = RestartStrategy.failure_rate()
    assert _delays(s, [0, 61, 122, 183]) == [1.0] * 4
    assert _delays(s, [0, 60]) == [1.0, None]
    assert _delays(s, [0, 30]) == [1.0, None]


# ------------------------------------------------------------------ exponential delay


def test_exponential_delay_grows_by_the_multiplier_up_to_max() -> None:
    s = RestartStrategy.exponential_delay(initial_backoff=1, max_backoff=10,
                                          backoff_multiplier=2, jitter_factor=0)
    tracker = s.tracker()
    now, delays = 0.0, []
    for _ in range(7):
        delay = tracker.on_failure(now)
        assert delay is not None
        delays.append(delay)
        now += delay + 0.5  # restarted, ran half a second, failed
    assert delays == [1, 2, 4, 8, 10, 10, 10]
    assert tracker.restarts == 7


def test_exponential_delay_jitter_comes_from_the_injected_rng() -> None:
    s = RestartStrategy.exponential_delay()  # Flink's defaults: 1 s * 1.5^n, +/- 10%
    times = [0.0, 2.0, 5.0, 9.0, 15.0]
    a = _delays(s, times, random.Random(7))
    assert a == _delays(s, times, random.Random(7))
    assert a != _delays(s, times, random.Random(8))
    expected, rng = [], random.Random(7)
    for n in range(len(times)):
        base = 1.5 ** n
        expected.append(max(1.0, min(base + rng.uniform(-0.1 * base, 0.1 * base), 60.0)))
    assert a == pytest.approx(expected)
    assert 1.0 <= a[0] <= 1.1  # never below initial_backoff, as in Flink


def test_exponential_delay_resets_after_the_threshold_since_the_last_restart() -> None:
    s = RestartStrategy.exponential_delay(initial_backoff=1, max_backoff=100,
                                          backoff_multiplier=2, reset_backoff_threshold=60,
                                          jitter_factor=0)
    tracker = s.tracker()
    assert tracker.on_failure(0) == 1  # restart at 1
    assert tracker.on_failure(10) == 2  # restart at 12
    assert tracker.on_failure(12 + 59.9) == 4  # 59.9 s after the restart: no reset
    # restart at 75.9; 60 s after it the backoff starts again
    assert tracker.on_failure(75.9 + 60) == 1
    assert tracker.on_failure(137) == 2
    assert tracker.restarts == 5


def test_exponential_delay_gives_up_after_attempts_before_reset_backoff() -> None:
    s = RestartStrategy.exponential_delay(initial_backoff=1, max_backoff=100,
                                          backoff_multiplier=2, reset_backoff_threshold=60,
                                          jitter_factor=0, attempts_before_reset_backoff=3)
    assert _delays(s, [0, 5, 10, 20]) == [1, 2, 4, None]
    # a reset in between counts the attempts from zero again
    assert _delays(s, [0, 5, 10, 200, 205, 210, 215]) == [1, 2, 4, 1, 2, 4, None]


def test_exponential_delay_unlimited_attempts_stay_at_max() -> None:
    s = RestartStrategy.exponential_delay(backoff_multiplier=10.0)
    tracker = s.tracker(random.Random(0))
    now = 0.0
    for _ in range(2000):  # 10 ** 2000 overflows a float
        delay = tracker.on_failure(now)
        assert delay is not None and 1.0 <= delay <= 60.0
        now += delay + 1
    assert delay == 60.0
    assert tracker.restarts == 2000


@settings(max_examples=200, deadline=None)
@given(
    initial=st.floats(0.001, 100.0), ratio=st.floats(1.0, 1e4),
    multiplier=st.floats(1.0001, 50.0), jitter=st.floats(0.0, 1.0),
    threshold=st.floats(0.001, 1e4), seed=st.integers(0, 2**32),
    gaps=st.lists(st.floats(0.0, 2e4), min_size=1, max_size=40),
)
def test_exponential_delay_stays_within_its_bounds(
    initial: float, ratio: float, multiplier: float, jitter: float, threshold: float,
    seed: int, gaps: list[float],
) -> None:
    s = RestartStrategy.exponential_delay(
        initial_backoff=initial, max_backoff=initial * ratio, backoff_multiplier=multiplier,
        reset_backoff_threshold=threshold, jitter_factor=jitter)
    tracker = s.tracker(random.Random(seed))
    now = 0.0
    for gap in gaps:
        delay = tracker.on_failure(now)
        assert delay is not None and math.isfinite(delay)
        assert initial * (1 - jitter) <= delay <= s.max_backoff * (1 + jitter)
        assert initial <= delay <= s.max_backoff  # Flink clamps the jittered backoff
        now += delay + gap


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(("make", "argument", "allowed"), [
    (lambda: RestartStrategy.fixed_delay(attempts=-1), "attempts", ">= 0"),
    (lambda: RestartStrategy.fixed_delay(attempts=1.5), "attempts", "int"),
    (lambda: RestartStrategy.fixed_delay(attempts=True), "attempts", "int"),
    (lambda: RestartStrategy.fixed_delay(delay=-1), "delay", ">= 0"),
    (lambda: RestartStrategy.fixed_delay(delay="one second"), "delay", "timedelta"),
    (lambda: RestartStrategy.fixed_delay(delay=math.nan), "delay", "finite"),
    (lambda: RestartStrategy.fixed_delay(delay=timedelta(seconds=-1)), "delay", ">= 0"),
    (lambda: RestartStrategy.failure_rate(max_failures_per_interval=0),
     "max_failures_per_interval", ">= 1"),
    (lambda: RestartStrategy.failure_rate(failure_rate_interval=0),
     "failure_rate_interval", "> 0"),
    (lambda: RestartStrategy.failure_rate(delay=math.inf), "delay", "finite"),
    (lambda: RestartStrategy.exponential_delay(initial_backoff=0), "initial_backoff", "> 0"),
    (lambda: RestartStrategy.exponential_delay(max_backoff=-5), "max_backoff", "> 0"),
    (lambda: RestartStrategy.exponential_delay(initial_backoff=120),
     "initial_backoff", "<= max_backoff"),
    (lambda: RestartStrategy.exponential_delay(backoff_multiplier=1), "backoff_multiplier",
     "> 1"),
    (lambda: RestartStrategy.exponential_delay(backoff_multiplier=0.5),
     "backoff_multiplier", "> 1"),
    (lambda: RestartStrategy.exponential_delay(jitter_factor=1.5), "jitter_factor", "[0, 1]"),
    (lambda: RestartStrategy.exponential_delay(jitter_factor=-0.1), "jitter_factor",
     "[0, 1]"),
    (lambda: RestartStrategy.exponential_delay(reset_backoff_threshold=0),
     "reset_backoff_threshold", "> 0"),
    (lambda: RestartStrategy.exponential_delay(attempts_before_reset_backoff=0),
     "attempts_before_reset_backoff", ">= 1"),
    (lambda: ExponentialDelayRestart(jitter_factor=2.0), "jitter_factor", "[0, 1]"),
])
def test_invalid_arguments_are_configuration_errors(
    make: Any, argument: str, allowed: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        make()
    assert argument in str(info.value) and allowed in str(info.value)
    assert isinstance(info.value, ValueError)
