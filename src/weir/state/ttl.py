"""State TTL as a layer over any backend table (the backend never knows about TTL).

A TTL state stores ``(value, timestamp)`` pairs; in bytes (RocksDB, snapshots) a
pair is ``int64_be(timestamp_ms) + value_bytes`` (:class:`TtlSerializer`). List
elements and map entries carry their own timestamps, so they expire one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from weir.api.descriptors import StateKind
from weir.api.serializers import Serializer
from weir.api.state import ListState, MapState, ValueState
from weir.api.ttl import IncrementalCleanup, StateTtlConfig
from weir.errors import StateError
from weir.state.backend import (
    EntryFilter,
    ListTable,
    MapTable,
    ValueTable,
    WriteCheck,
    encode_checked,
    frame,
    unframe,
)

__all__ = [
    "IncrementalCleaner",
    "TtlListState",
    "TtlMapState",
    "TtlSerializer",
    "TtlValueState",
    "expired_entry_filter",
]

Clock = Callable[[], int]
_MISSING: Any = object()


class TtlSerializer(Serializer[tuple[Any, int]]):
    """``(value, timestamp_ms)`` as ``int64_be(timestamp) + inner.encode(value)``."""

    def __init__(self, inner: Serializer[Any], state_name: str = "") -> None:
        self.inner = inner
        self.state_name = state_name
        self.type_id = f"ttl({inner.type_id})"

    def encode(self, value: tuple[Any, int]) -> bytes:
        # Encode the user's value through encode_checked so that a failure names the
        # state and the user's type, not the internal (value, timestamp) pair.
        data = encode_checked(self.state_name, self.inner, value[0])
        return value[1].to_bytes(8, "big", signed=True) + data

    def decode(self, data: bytes) -> tuple[Any, int]:
        return self.inner.decode(data[8:]), int.from_bytes(data[:8], "big", signed=True)


def _timestamp(data: bytes) -> int:
    return int.from_bytes(data[:8], "big", signed=True)


def expired_entry_filter(
    kind: StateKind, ttl_ms: int, clock: Clock, query_time_every: int = 1
) -> EntryFilter:
    """A snapshot/compaction filter that drops expired values (elements for lists),
    reading the clock again after every ``query_time_every`` entries."""
    seen = 0
    now = clock()

    def current_time() -> int:
        nonlocal seen, now
        seen += 1
        if seen >= query_time_every:
            seen = 0
            now = clock()
        return now

    if kind is StateKind.LIST:

        def keep_list(key: bytes, data: bytes) -> bytes | None:
            limit = current_time() - ttl_ms
            elements = unframe(data)
            alive = [e for e in elements if _timestamp(e) > limit]
            if len(alive) == len(elements):
                return data
            return frame(alive) if alive else None

        return keep_list

    def keep_value(key: bytes, data: bytes) -> bytes | None:
        return data if _timestamp(data) + ttl_ms > current_time() else None

    return keep_value


class IncrementalCleaner:
    """Walks a state's keys, ``n`` per step, removing what has expired; the walk
    wraps around when it reaches the end (Flink's incremental cleanup)."""

    def __init__(
        self,
        kind: StateKind,
        table: Any,
        config: StateTtlConfig,
        clock: Clock,
        strategy: IncrementalCleanup,
    ) -> None:
        self._kind = kind
        self._table = table
        self._ttl = config.ttl_ms
        self._size = strategy.cleanup_size
        self.for_every_record = strategy.run_cleanup_for_every_record
        self._clock = clock
        self._cursor: Any = None

    def step(self) -> int:
        """Check the next ``n`` keys; returns how many values were removed."""
        batch, self._cursor = self._table.keys_page(self._cursor, self._size)
        table = self._table
        filter_at = getattr(table, "filter_at", None)
        if filter_at is not None:  # bytes-native table (RocksDB): no value decoding
            keep = expired_entry_filter(self._kind, self._ttl, self._clock)
            return sum(filter_at(key, keep) for key in batch)
        limit = self._clock() - self._ttl
        removed = 0
        for key in batch:
            if self._kind is StateKind.LIST:
                elements = table.get_at(key)
                alive = [e for e in elements if e[1] > limit]
                if len(alive) != len(elements):
                    removed += len(elements) - len(alive)
                    table.update_at(key, alive)
            elif self._kind is StateKind.MAP:
                for user_key, (_, ts) in table.items_at(key):
                    if ts <= limit:
                        table.remove_at(key, user_key)
                        removed += 1
            else:
                stored = table.value_at(key)
                if stored is not None and stored[1] <= limit:
                    table.clear_at(key)
                    removed += 1
        return removed


class _TtlState:
    def __init__(
        self,
        name: str,
        config: StateTtlConfig,
        clock: Clock,
        serializer: Serializer[Any],
        cleaner: IncrementalCleaner | None,
    ) -> None:
        self.name = name
        self._ttl = config.ttl_ms
        self._return_expired = config.return_expired
        self._update_on_read = config.update_on_read
        self._clock = clock
        self._check = WriteCheck(name, serializer)
        self._cleaner = cleaner

    def _accessed(self) -> None:
        if self._cleaner is not None:
            self._cleaner.step()


class TtlValueState(_TtlState, ValueState[Any]):
    """Value state with TTL over a value table of ``(value, timestamp)``."""

    def __init__(self, table: ValueTable, *args: Any) -> None:
        super().__init__(*args)
        self._table = table

    def value(self) -> Any:
        self._accessed()
        stored = self._table.value()
        if stored is None:
            return None
        value, ts = stored
        now = self._clock()
        if ts + self._ttl <= now:
            self._table.clear()
            return value if self._return_expired else None
        if self._update_on_read:
            self._table.update((value, now))
        return value

    def value_unexpired(self) -> Any:
        """The value if not expired, regardless of visibility (for reduce/aggregate)."""
        self._accessed()
        stored = self._table.value()
        if stored is None or stored[1] + self._ttl <= self._clock():
            return None
        return stored[0]

    def update(self, value: Any) -> None:
        self._accessed()
        if value is None:
            self._table.clear()
            return
        self._check(value)
        self._table.update((value, self._clock()))

    def clear(self) -> None:
        self._table.clear()


class TtlListState(_TtlState, ListState[Any]):
    """List state whose elements expire one by one."""

    def __init__(self, table: ListTable, *args: Any) -> None:
        super().__init__(*args)
        self._table = table

    def get(self) -> list[Any]:
        self._accessed()
        stored = self._table.get()
        if not stored:
            return []
        now = self._clock()
        limit = now - self._ttl
        alive = [e for e in stored if e[1] > limit]
        result = [e[0] for e in (stored if self._return_expired else alive)]
        if self._update_on_read and alive:
            self._table.update([(e[0], now) for e in alive])
        elif len(alive) != len(stored):
            self._table.update(alive)
        return result

    def _wrap(self, values: Iterable[Any]) -> list[tuple[Any, int]]:
        now = self._clock()
        out = []
        for value in values:
            if value is None:
                raise StateError(f"list state {self.name!r}: cannot add None")
            self._check(value)
            out.append((value, now))
        return out

    def add(self, value: Any) -> None:
        self._accessed()
        self._table.add_all(self._wrap((value,)))

    def add_all(self, values: Iterable[Any]) -> None:
        self._accessed()
        self._table.add_all(self._wrap(values))

    def update(self, values: Iterable[Any]) -> None:
        self._accessed()
        self._table.update(self._wrap(values))

    def clear(self) -> None:
        self._table.clear()


class TtlMapState(_TtlState, MapState[Any, Any]):
    """Map state whose entries expire one by one."""

    def __init__(self, table: MapTable, key_serializer: Serializer[Any], *args: Any) -> None:
        super().__init__(*args)
        self._table = table
        self._key_check = WriteCheck(self.name, key_serializer)

    def get(self, key: Any, default: Any = None) -> Any:
        self._accessed()
        stored = self._table.get(key)
        if stored is None:
            return default
        value, ts = stored
        now = self._clock()
        if ts + self._ttl <= now:
            self._table.remove(key)
            return value if self._return_expired else default
        if self._update_on_read:
            self._table.put(key, (value, now))
        return value

    def put(self, key: Any, value: Any) -> None:
        self._accessed()
        self._key_check(key)
        self._check(value)
        self._table.put(key, (value, self._clock()))

    def remove(self, key: Any) -> None:
        self._accessed()
        self._table.remove(key)

    def contains(self, key: Any) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def items(self) -> Iterator[tuple[Any, Any]]:
        self._accessed()
        entries = list(self._table.items())
        now = self._clock()
        limit = now - self._ttl
        out = []
        for key, (value, ts) in entries:
            if ts <= limit:
                self._table.remove(key)
                if not self._return_expired:
                    continue
            elif self._update_on_read:
                self._table.put(key, (value, now))
            out.append((key, value))
        return iter(out)

    def is_empty(self) -> bool:
        return next(self.items(), None) is None

    def clear(self) -> None:
        self._table.clear()
