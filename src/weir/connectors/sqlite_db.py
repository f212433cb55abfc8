"""Opening the SQLite database of a continuous job's SQLite sinks from many task
processes at once."""

from __future__ import annotations

import sqlite3
import time

__all__ = ["open_database"]


def open_database(path: str, timeout_s: float = 60.0) -> sqlite3.Connection:
    """A connection to ``path`` (created if missing) in WAL mode, waiting up to
    ``timeout_s`` for locks.

    Switching a database to WAL needs it to itself, and when connections opening it at
    the same moment collide SQLite answers "database is locked" at once, without
    waiting (its busy handler is skipped where waiting could deadlock). So the switch
    is retried until ``timeout_s``; once a database is in WAL mode it stays so and
    the switch is a no-op."""
    conn = sqlite3.connect(path, timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return conn
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                conn.close()
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
