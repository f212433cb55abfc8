"""Durations and sizes, read the same way by every setting of both runtimes.

A duration is a :class:`datetime.timedelta`, a string with a unit (``"10 s"``,
``"500 ms"``, ``"2 min"``, ``"1 h"``, ``"7 days"``) or an int of milliseconds; it is
kept as a timedelta (whole milliseconds). A size is an int of bytes or a string like
Spark's memory settings (``"512m"``, ``"2g"``).

Before issue 39, restart strategies and ``execute(timeout=)`` read a bare number as
seconds. For one release they still do, with a :class:`DeprecationWarning`
(:func:`legacy_seconds`): give ``"1 s"`` or a timedelta instead.
"""

from __future__ import annotations

import re
import warnings
from datetime import timedelta
from typing import TypeAlias

from weir.errors import ConfigurationError

__all__ = ["Duration", "byte_size", "duration", "duration_ms", "legacy_seconds",
           "warn_bare_seconds"]

Duration: TypeAlias = "timedelta | str | int"
"""A duration: a timedelta, a string with a unit (``"10 s"``) or int milliseconds."""

_UNITS_MS = {
    "ms": 1, "millisecond": 1, "milliseconds": 1, "s": 1000, "second": 1000,
    "seconds": 1000, "sec": 1000, "secs": 1000, "m": 60_000, "min": 60_000, "mins": 60_000,
    "minute": 60_000, "minutes": 60_000, "h": 3_600_000, "hour": 3_600_000,
    "hours": 3_600_000, "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}


def duration_ms(value: object, what: str) -> int:
    """Whole milliseconds (>= 0) of a duration; a :class:`ConfigurationError` naming
    ``what`` for anything else."""
    if isinstance(value, timedelta) and value >= timedelta(0):
        return value // timedelta(milliseconds=1)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*", value.lower())
        if match and match.group(2) in _UNITS_MS:
            return int(float(match.group(1)) * _UNITS_MS[match.group(2)])
    raise ConfigurationError(
        f"{what} must be a duration: a datetime.timedelta, a string with a unit like "
        f"'10 s', '500 ms' or '2 min', or int milliseconds (>= 0); got {value!r}"
    )


def duration(value: object, what: str) -> timedelta:
    """A duration as a timedelta of whole milliseconds (see :func:`duration_ms`)."""
    return timedelta(milliseconds=duration_ms(value, what))


def warn_bare_seconds(value: object, what: str) -> bool:
    """Whether ``value`` is a bare number (read as seconds, as before issue 39); warns
    with a :class:`DeprecationWarning` if so."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        warnings.warn(
            f"{what}={value!r}: a bare number as seconds is deprecated; give a duration "
            f"('{value} s' or datetime.timedelta(seconds={value})). From the next release "
            f"an int is milliseconds, as everywhere else in weir",
            DeprecationWarning, stacklevel=4,
        )
        return True
    return False


def legacy_seconds(value: object, what: str) -> timedelta:
    """A duration of a setting that read bare numbers as seconds before issue 39: a
    number still means seconds, with a :class:`DeprecationWarning`; anything else is a
    :func:`duration`."""
    if warn_bare_seconds(value, what):
        assert isinstance(value, int | float)
        if value != value or not 0 <= value < float("inf"):
            raise ConfigurationError(f"{what} must be a finite duration >= 0, got {value!r}")
        return timedelta(seconds=value)
    return duration(value, what)


_UNITS_BYTES = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
                "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def byte_size(value: object, what: str) -> int:
    """Bytes (> 0) from an int or a string like Spark's memory settings ('512m', '2g')."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", value.lower())
        if match and match.group(2) in _UNITS_BYTES and float(match.group(1)) > 0:
            return int(float(match.group(1)) * _UNITS_BYTES[match.group(2)])
    raise ConfigurationError(
        f"{what} must be bytes (int > 0) or a string like '512m' or '2g', got {value!r}"
    )
