"""What the RocksDB backend records between changelog checkpoints.

A RocksDB subtask in changelog mode (``SnapshotMode.CHANGELOG``,
``weir.checkpoint.changelog``) writes per checkpoint only the keys changed since the
previous one, instead of a native checkpoint that flushes the memtables: a flush every
second leaves reads going to fresh level-0 files, which costs more than the
checkpoint itself (``bench/continuous_checkpoint_overhead``). Every write of a state
goes through its table (``weir.state.rocksdb_tables``) or the backend's compaction
filter step, and each records what it did in the table's :class:`ChangeRecord`:

* value and list states (one entry per key): the bytes written last for each key,
  ``None`` once deleted. The bytes stored are the canonical entry
  (``weir.state.backend``), so a delta needs no read of the database and is packed
  in C (``pack_changes``);
* map states (one entry per key and user key): the primary keys (prefixed keys)
  touched; their maps are read back when the changes are taken, as a delta replaces
  a changed key's whole map.

The hot writes (a value's update, a list's add) record inline: a dict store per write
while changes are tracked, an attribute test otherwise, nothing per read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from weir.state.backend import split_map_key

__all__ = ["ChangeRecord"]


class ChangeRecord:
    """The writes a table made since changes were last taken (nothing recorded until
    :meth:`track`)."""

    _cf: Any
    is_map = False
    #: value and list states: prefixed key -> bytes written last (None: deleted)
    _written: dict[bytes, bytes | None] | None = None
    #: map states: prefixed keys whose map changed
    _touched: set[bytes] | None = None

    def track(self) -> None:
        """Start (or start over) recording writes."""
        if self.is_map:
            self._touched = set()
        else:
            self._written = {}

    def changed(self) -> int:
        """The number of keys recorded since the last :meth:`take` (0: not tracked)."""
        return len(self._touched or ()) if self.is_map else len(self._written or ())

    def note(self, stored_key: bytes, data: bytes | None) -> None:
        """Record a write of a stored entry made outside the table (compaction
        filters): ``data`` None for a delete."""
        if self._written is not None:
            self._written[stored_key] = data
        elif self._touched is not None:
            self._touched.add(split_map_key(stored_key)[0])

    def _put(self, key: bytes, data: bytes) -> None:
        self._cf.put(key, data)
        if self._written is not None:
            self._written[key] = data

    def _delete(self, key: bytes) -> None:
        self._cf.delete(key)
        if self._written is not None:
            self._written[key] = None

    def _touch(self, primary: bytes) -> None:
        if self._touched is not None:
            self._touched.add(primary)

    def take(
        self,
    ) -> dict[bytes, bytes | None] | Iterator[tuple[bytes, list[tuple[bytes, bytes]]]]:
        """What was recorded since the last call; the record starts over. A value or
        list state: the dict of prefixed key -> bytes written last (None: deleted). A
        map state: ``(prefixed key, its canonical entries now)`` per key touched (no
        entry: gone), read now — this call is the synchronous part of a checkpoint."""
        if self.is_map:
            touched, self._touched = self._touched or set(), set()
            return iter([(key, list(self._scan(key))) for key in touched])
        written, self._written = self._written or {}, {}
        return written

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The stored entries whose keys start with ``prefix`` (the table's)."""
        raise NotImplementedError
