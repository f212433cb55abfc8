"""Shared parts of the ``weir`` commands: keys from the command line, sizes and times
a person reads, JSON output, and a console that cuts nothing (:func:`wide_console`)."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from weir.checkpoint.storage import observe_io

__all__ = ["KEYS_HELP", "json_default", "print_json", "parse_key", "readable_size",
           "readable_time", "transfer_progress", "wide_console"]

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


#: the width of a console that is not a terminal (:func:`wide_console`): wider than
#: any line a command prints
UNBOUNDED_WIDTH = 1 << 15


def wide_console(*, stderr: bool = False) -> Console:
    """A console that cuts nothing. On a terminal, the terminal's width (a table too
    wide for it wraps its cells; give its columns ``overflow="fold"`` so that a long
    word is folded, not cut with an ellipsis). Anywhere else (a pipe, a file, a test
    runner) rich would assume 80 columns (or ``COLUMNS``) and shrink tables to them,
    cutting values: there, lines are as long as their content."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=UNBOUNDED_WIDTH)


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


PROGRESS_MIN_BYTES = 4 << 20
"""A command shows its progress once it has read or written this much
(``WEIR_PROGRESS_MIN_BYTES`` overrides)."""


@contextlib.contextmanager
def transfer_progress(what: str) -> Iterator[None]:
    """While the block reads or writes checkpoint storage: once more than a few MB moved
    (:data:`PROGRESS_MIN_BYTES`), a live line on stderr with the bytes read and written
    and the rate (on a terminal), and at the end one summary line (anywhere)."""
    threshold = int(os.environ.get("WEIR_PROGRESS_MIN_BYTES", PROGRESS_MIN_BYTES))
    console = Console(stderr=True)
    moved = [0, 0]
    lock = threading.Lock()
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                        TimeElapsedColumn(), console=console, transient=True)
    task = progress.add_task(what, total=None)
    shown, started = [False], [False]
    start = time.monotonic()

    def line() -> str:
        elapsed = max(time.monotonic() - start, 1e-9)
        return (f"{what}: read {readable_size(moved[0])}, wrote {readable_size(moved[1])} "
                f"({readable_size(int((moved[0] + moved[1]) / elapsed))}/s)")

    def observe(read: int, written: int) -> None:
        with lock:
            moved[0] += read
            moved[1] += written
            if not shown[0] and moved[0] + moved[1] >= threshold:
                shown[0] = True
                if console.is_terminal:
                    progress.start()
                    started[0] = True
            if shown[0]:
                progress.update(task, description=line())

    try:
        with observe_io(observe):
            yield
    finally:
        with lock:
            if started[0]:
                progress.stop()
            if shown[0]:
                console.print(line(), highlight=False)
