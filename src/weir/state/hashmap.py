"""The hash-map backend: keyed state as Python objects in dictionaries.

Each state is a dict ``prefixed_key -> value`` (``-> list`` for list state,
``-> dict`` for map state). Values are kept as objects and encoded with the state's
serializer only when a snapshot is taken; a write checks once per value type that
the serializer accepts it (``WriteCheck``). As in Flink's heap backend, a mutable
value returned by ``value()`` is the stored object: call ``update`` after changing it.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from weir.api.serializers import Serializer
from weir.errors import StateError
from weir.state.backend import KeyedStateBackend, ListTable, MapTable, ValueTable
from weir.state.hashmap_tables import (
    SAMPLE_MASK,
    SAMPLE_MIN_KEYS,
    AnyTable,
    HashMapListTable,
    HashMapMapTable,
    HashMapValueTable,
)
from weir.state.keycontext import KeyContext
from weir.state.packed import pairs

__all__ = ["SAMPLE_MASK", "SAMPLE_MIN_KEYS", "HashMapKeyedStateBackend"]


class HashMapKeyedStateBackend(KeyedStateBackend):
    """Keyed state in memory, as Python objects; serialized only in snapshots."""

    name = "hashmap"

    def __init__(self, key_context: KeyContext) -> None:
        super().__init__(key_context)
        self._tables: dict[str, AnyTable] = {}
        #: entries of states restored but not registered yet, flat: [key0, raw0, ...]
        self._restored: dict[str, list[bytes]] = defaultdict(list)
        self._tracking = False
        self._sample_mask = 0
        self._dirty_limit = 0
        self._rebase_share: float | None = None

    def _register(self, table: AnyTable) -> Any:
        table.load_flat(self._restored.pop(table.name, []))
        if self._tracking:  # what it loaded is in the snapshot changes apply to
            table.track_changes(self._sample_mask, self._dirty_limit)
        self._tables[table.name] = table
        return table

    def track_changes(self, sampled: bool = False, rebase_share: float | None = None) -> None:
        """Start (or start over) recording which keys are written: the state as of now
        is the base that :meth:`take_changes` reports changes against.

        ``sampled``: when the state holds at least ``SAMPLE_MIN_KEYS`` keys, record
        in a set only the keys in a fixed 1-in-``SAMPLE_MASK + 1`` sample by hash:
        :meth:`change_counts` estimates the keys written from it, and which keys
        changed is unknown once any is written (:meth:`changes_known`; the next
        snapshot is a full one). For a state most of whose keys change between
        snapshots (each one a full snapshot anyway): the exact record costs a set
        insert per write, 20-50% more per record of a keyed count at 5,000 to 100,000
        keys; the sample a hash test.

        ``rebase_share`` (an exact record of at least ``SAMPLE_MIN_KEYS`` keys held):
        once one state's record alone holds that share of the keys held now by every
        state, the checkpoint is a full one whatever else is written (the changelog's
        ``rebase_share``: at least that share was written, unless the state grew by
        the keys written), so that state's exact record stops there and only its
        sample is recorded: the changes are then unknown (the next snapshot is a full
        one) and the share estimated from the sample, high."""
        held = self.change_counts()[1]
        large = held >= SAMPLE_MIN_KEYS
        self._sample_mask = SAMPLE_MASK if sampled and large else 0
        self._rebase_share = None if sampled else rebase_share
        self._dirty_limit = self._limit(held)
        self._tracking = True
        for table in self._tables.values():
            table.track_changes(self._sample_mask, self._dirty_limit)

    def _limit(self, held: int) -> int:
        """The dirty limit of an exact record of ``held`` keys (0: none)."""
        share = self._rebase_share
        if share is None or held < SAMPLE_MIN_KEYS:
            return 0
        return max(1, math.ceil(share * held))

    def changes_known(self) -> bool:
        """Whether :meth:`take_changes` can report the changes: every written key was
        recorded (not sampled), or nothing was written since the record started over."""
        return all(t.changes_known() for t in self._tables.values())

    @property
    def sampled(self) -> bool:
        """Whether writes are recorded as a sample (see :meth:`track_changes`): since
        the record started over, or since a state's exact record reached its limit."""
        return any(t._sample_mask for t in self._tables.values())

    def change_counts(self) -> tuple[int, int]:
        """``(keys written since the last take_changes, keys held)`` over all states
        (0 written when changes are not tracked; estimated from the sample when
        sampled)."""
        written = sum(t.written_estimate() for t in self._tables.values())
        held = sum(len(t._data) for t in self._tables.values())
        return written, held + sum(
            len(e) // 2 for e in self._restored.values())

    def entry_count(self) -> int:
        """The keyed-state entries held now, as a snapshot holds them: one per key of a
        value or list state, one per (key, user key) of a map state, restored entries
        of states not registered yet included (timers are not keyed state). Exact and
        cheap: a dict's length per value and list state, the sizes of the keys' dicts
        summed in C for a map state (memory bound, 40-150 ns a key measured);
        nothing on the write path. Entries of a TTL state that expired but were not
        cleaned up yet count (a full snapshot with ``cleanup_full_snapshot`` leaves
        them out)."""
        return sum(t.entry_count() for t in self._tables.values()) + sum(
            len(e) // 2 for e in self._restored.values())

    def has_table(self, name: str) -> bool:
        """Whether state ``name`` is registered (its entries live in a table)."""
        return name in self._tables

    def replace_entries(
        self, name: str, primaries: Iterable[bytes], entries: Iterable[tuple[bytes, bytes]]
    ) -> None:
        """Apply one state's part of a changelog delta to registered state ``name``:
        every entry of the primary keys is removed, then ``entries`` are added."""
        table = self._tables[name]
        for key in primaries:
            table.clear_at(key)
        table.load(entries)

    def take_changes(
        self,
    ) -> Iterator[tuple[str, Iterator[tuple[bytes, Iterable[tuple[bytes, bytes]]]]]]:
        """Per state with changes since the last call (or :meth:`track_changes`):
        ``(name, ((prefixed key, its canonical entries now), ...))`` — no entry for a
        deleted key. Each table's record starts over as it is read, its dirty limit
        that of the keys held now."""
        self._dirty_limit = limit = self._limit(self.change_counts()[1])
        for table in self._tables.values():
            table._dirty_limit = limit
        for name, table in self._tables.items():
            if table._writes:  # (sampled: _dirty holds only the sample)
                yield name, table.take_changes()

    def create_value_table(
        self, name: str, serializer: Serializer[Any], check_writes: bool = True
    ) -> ValueTable:
        return self._register(HashMapValueTable(name, self.key_context, serializer, check_writes))  # type: ignore[no-any-return]

    def create_list_table(
        self, name: str, serializer: Serializer[Any], check_writes: bool = True
    ) -> ListTable:
        return self._register(HashMapListTable(name, self.key_context, serializer, check_writes))  # type: ignore[no-any-return]

    def create_map_table(
        self,
        name: str,
        key_serializer: Serializer[Any],
        serializer: Serializer[Any],
        check_writes: bool = True,
    ) -> MapTable:
        table = HashMapMapTable(name, self.key_context, key_serializer, serializer, check_writes)
        return self._register(table)  # type: ignore[no-any-return]

    def restore_entries(self, name: str, entries: Iterable[tuple[bytes, bytes]]) -> None:
        table = self._tables.get(name)
        if table is not None:
            table.load(entries)
        else:
            self._restored[name].extend(itertools.chain.from_iterable(entries))

    def restore_flat(self, name: str, flat: list[bytes]) -> None:
        table = self._tables.get(name)
        if table is not None:
            table.load_flat(flat)
        else:
            self._restored[name].extend(flat)

    def migrate_restored(self, name: str, rewrite: Callable[[bytes], bytes]) -> None:
        if name in self._tables:
            raise StateError(f"state {name!r} is registered already: it cannot be migrated")
        if name in self._restored:
            flat = self._restored[name]
            flat[1::2] = [rewrite(v) for v in flat[1::2]]

    def snapshot_sources(self) -> Iterable[tuple[str, Iterable[tuple[bytes, bytes]]]]:
        yield from ((name, table.snapshot_entries()) for name, table in self._tables.items())
        yield from ((name, pairs(flat)) for name, flat in self._restored.items())

    def frozen_sources(self) -> Iterable[tuple[str, Iterable[tuple[bytes, bytes]]]]:
        """Copy-on-snapshot: top-level dicts (and per-key lists and maps) are copied
        now and encoded later; values of types that can change in place (anything but
        int, float, str, bytes, bool, None — and every TTL state, whose stored tuples
        hold the user's value) are encoded now, since user code may mutate such an
        object and ``update`` it again while the snapshot is being written."""
        out: list[tuple[str, Iterable[tuple[bytes, bytes]]]] = [
            (name, table.freeze()) for name, table in self._tables.items()
        ]
        out.extend((name, pairs(flat)) for name, flat in self._restored.items())
        return out

    def close(self) -> None:
        self._tables.clear()
        self._restored.clear()
