"""Shared parts of the ``weir`` commands: keys from the command line, sizes and times
a person reads, JSON output."""

from __future__ import annotations

import base64
import datetime as dt
import json
import sys
from typing import Any

__all__ = ["KEYS_HELP", "json_default", "print_json", "parse_key", "readable_size", "readable_time"]

KEYS_HELP = (
    "Keys; JSON values (42, '[\"a\", 1]') are parsed (a JSON list is a composite key, a "
    "tuple), anything else is taken as a string."
)


def parse_key(raw: str) -> Any:
    """A key from the command line: JSON if it parses (lists become tuples), else the
    string itself."""
    try:
        key = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    return tuple(key) if isinstance(key, list) else key


def readable_size(n: int) -> str:
    """``1.5 MiB`` and the like."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)  # pragma: no cover


def readable_time(epoch_ms: int | None) -> str:
    """Epoch milliseconds as a UTC time, ``2026-11-23 10:15:02.120Z``."""
    if epoch_ms is None:
        return "-"
    moment = dt.datetime.fromtimestamp(epoch_ms / 1000, tz=dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def json_default(value: Any) -> Any:
    """``json.dumps``'s ``default``: bytes in base64, times in ISO 8601, sets sorted,
    numpy scalars as Python ones, anything else as its string."""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if hasattr(value, "item"):  # numpy scalars from pandas
        return value.item()
    return str(value)


def print_json(doc: Any) -> None:
    """``doc`` as indented JSON on stdout (bytes in base64, times in ISO 8601, anything
    else JSON cannot hold as its string)."""
    sys.stdout.write(json.dumps(doc, indent=2, default=json_default) + "\n")
