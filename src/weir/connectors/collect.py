"""An idempotent sink for tests and small results: the newest record per key, in SQLite.

:class:`CollectSink` upserts every record under its key (``key(record)``; without a
``key``, the record itself), so a record replayed after a restore overwrites what its
first delivery wrote: the table converges to the newest record per key, with no
transaction and no wait for a checkpoint — Flink's *idempotent* sink, the other way to
end-to-end exactly-once beside two-phase commit. The price is the idempotent sink's
usual one: between a restore and the end of the replay, a key may show an older record
than before the failure.

Layout: one table (``table``, default ``collected``) in the SQLite database ``path``
(WAL mode; every subtask writes to it)::

    key   TEXT PRIMARY KEY   canonical JSON of the key (sorted object keys)
    value TEXT NOT NULL      JSON of the record

A writer batches its upserts (up to 1,000) and flushes them at every checkpoint's
barrier (before the checkpoint can complete, so a completed checkpoint never relies on
records still in a buffer) and when it closes. Records and keys must be JSON values.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weir.api.connectors import Sink, SinkContext, SinkWriter
from weir.connectors.sqlite_db import open_database

__all__ = ["CollectSink"]


def _hashable(value: Any) -> Any:
    """A decoded JSON key as a dict key: arrays become tuples, objects sorted tuples."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


class _CollectWriter(SinkWriter[Any]):
    def __init__(self, sink: CollectSink) -> None:
        self.sink = sink
        self._rows: dict[str, str] = {}
        self._conn = sink._connect()

    def write(self, record: Any) -> None:
        key = record if self.sink.key is None else self.sink.key(record)
        self._rows[json.dumps(key, sort_keys=True)] = json.dumps(record)
        if len(self._rows) >= 1_000:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            with self._conn:
                self._conn.executemany(
                    f"INSERT INTO {self.sink.table} (key, value) VALUES (?, ?) "
                    f"ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    list(self._rows.items()))
            self._rows = {}

    def prepare_commit(self, checkpoint_id: int) -> None:
        self._flush()  # nothing to commit later: written is final
        return None

    def close(self) -> None:
        try:
            self._flush()
        finally:
            self._conn.close()


class CollectSink(Sink[Any]):
    """The newest record per key in table ``table`` of the SQLite database ``path``,
    idempotent: a replayed record overwrites itself (see the module doc). ``key`` maps
    a record to its key (a JSON value); without one a record is its own key, so the
    table holds the distinct records. Read it with :meth:`collected` or :meth:`records`."""

    def __init__(self, path: str | Path, *, key: Callable[[Any], Any] | None = None,
                 table: str = "collected") -> None:
        if not table.isidentifier():
            raise ValueError(f"table must be an identifier, got {table!r}")
        self.path, self.key, self.table = str(path), key, table

    def _connect(self) -> Any:
        conn = open_database(self.path)
        with conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} "
                         f"(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        return conn

    def writer(self, context: SinkContext) -> SinkWriter[Any]:
        return _CollectWriter(self)

    def commit(self, committables: list[Any]) -> None:
        """Nothing to commit: every write is final."""

    def abort_attempts(self, context: SinkContext, keep: list[Any]) -> None:
        """Nothing to abort: a failed attempt's writes are overwritten by the replay."""

    def collected(self) -> dict[Any, Any]:
        """Key → newest record (keys that were JSON arrays or objects as tuples); empty
        before anything was written."""
        if not Path(self.path).exists():
            return {}
        conn = self._connect()
        try:
            rows = conn.execute(f"SELECT key, value FROM {self.table}").fetchall()
        finally:
            conn.close()
        return {_hashable(json.loads(k)): json.loads(v) for k, v in rows}

    def records(self) -> list[Any]:
        """The newest record of every key, in the order of their keys' JSON."""
        collected = self.collected()
        return [collected[k] for k in sorted(collected, key=lambda k: json.dumps(k))]
