"""Durations and sizes as the Spark runtime's settings take them."""

from __future__ import annotations

import re
from datetime import timedelta

from weir.errors import ConfigurationError

__all__ = ["byte_size", "duration_ms"]

_UNITS_MS = {
    "ms": 1, "millisecond": 1, "milliseconds": 1, "s": 1000, "second": 1000,
    "seconds": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "minute": 60_000,
    "minutes": 60_000, "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}


def duration_ms(value: int | str | timedelta, what: str) -> int:
    """Milliseconds from an int (ms), a timedelta or a string like '10 seconds'."""
    if isinstance(value, timedelta) and value >= timedelta(0):
        return int(value / timedelta(milliseconds=1))
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+)\s*([a-z]+)\s*", value.lower())
        if match and match.group(2) in _UNITS_MS:
            return int(match.group(1)) * _UNITS_MS[match.group(2)]
    raise ConfigurationError(
        f"{what} must be milliseconds (int >= 0), a timedelta or a string like '10 seconds', "
        f"got {value!r}"
    )


_UNITS_BYTES = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
                "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def byte_size(value: int | str, what: str) -> int:
    """Bytes from an int or a string like Spark's memory settings ('512m', '2g')."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", value.lower())
        if match and match.group(2) in _UNITS_BYTES and float(match.group(1)) > 0:
            return int(float(match.group(1)) * _UNITS_BYTES[match.group(2)])
    raise ConfigurationError(
        f"{what} must be bytes (int > 0) or a string like '512m' or '2g', got {value!r}"
    )
