"""Keyed state of one operator subtask: registration, TTL, reduce/aggregate, snapshots.

:class:`KeyedStateStore` turns descriptors into state objects over a backend's
tables, wrapping them with TTL where the descriptor asks for it, checks that a name
is never registered twice with another kind, serializer or TTL (also against what
a restored snapshot says), and produces and restores :class:`KeyedStateSnapshot`.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from weir.api.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
)
from weir.api.state import AggregatingState, ReducingState, State
from weir.errors import StateMigrationError, StateRegistrationError
from weir.state.backend import EntryFilter, KeyedStateBackend
from weir.state.keygroups import KeyGroupRange
from weir.state.migration import AS_IS, migration
from weir.state.packed import PackedGroups, pack_sources, pairs
from weir.state.snapshot import KeyedStateSnapshot, NativeRocksDBState, StateMeta, canonical_schema
from weir.state.ttl import (
    IncrementalCleaner,
    TtlListState,
    TtlMapState,
    TtlSerializer,
    TtlValueState,
    expired_entry_filter,
)

__all__ = ["AggregatingStateImpl", "KeyedStateStore", "ReducingStateImpl"]

Clock = Callable[[], int]


class ReducingStateImpl(ReducingState[Any]):
    """Reducing state over a value cell (plain table or TTL value state)."""

    def __init__(self, cell: Any, reduce_function: Callable[[Any, Any], Any]) -> None:
        self._read = cell.value
        self._read_for_update = getattr(cell, "value_unexpired", cell.value)
        self._write = cell.update
        self.clear = cell.clear  # type: ignore[method-assign]
        self._reduce = reduce_function
        fast = getattr(cell, "reduce_add", None)
        if fast is not None:  # the backend folds in one lookup
            self.add = partial(fast, reduce_function)  # type: ignore[method-assign]

    def get(self) -> Any:
        return self._read()

    def add(self, value: Any) -> None:
        current = self._read_for_update()
        self._write(value if current is None else self._reduce(current, value))

    def clear(self) -> None:  # replaced per instance in __init__
        raise NotImplementedError


class AggregatingStateImpl(AggregatingState[Any, Any]):
    """Aggregating state over a value cell holding the accumulator."""

    def __init__(self, cell: Any, function: Any) -> None:
        self._read = cell.value
        self._read_for_update = getattr(cell, "value_unexpired", cell.value)
        self._write = cell.update
        self.clear = cell.clear  # type: ignore[method-assign]
        self._function = function
        fast = getattr(cell, "aggregate_add", None)
        if fast is not None:  # the backend folds in one lookup
            self.add = partial(  # type: ignore[method-assign]
                fast, function.add, function.create_accumulator
            )

    def get(self) -> Any:
        acc = self._read()
        return None if acc is None else self._function.get_result(acc)

    def add(self, value: Any) -> None:
        acc = self._read_for_update()
        if acc is None:
            acc = self._function.create_accumulator()
        self._write(self._function.add(value, acc))

    def clear(self) -> None:  # replaced per instance in __init__
        raise NotImplementedError


def meta_of(descriptor: StateDescriptor) -> StateMeta:
    """The snapshot metadata a descriptor registers."""
    schemas = tuple(s.schema() for s in descriptor.serializers())
    return StateMeta(
        descriptor.name, descriptor.kind, descriptor.serializer_ids(), descriptor.ttl is not None,
        () if all(x is None for x in schemas) else tuple(
            None if x is None else canonical_schema(x) for x in schemas),
    )


class KeyedStateStore:
    """Registered keyed states of one subtask over one backend."""

    def __init__(self, backend: KeyedStateBackend, clock: Clock, owner: str) -> None:
        self.backend = backend
        self._clock = clock
        self._owner = owner
        self._states: dict[str, tuple[StateDescriptor, StateMeta, State]] = {}
        self._metas: dict[str, StateMeta] = {}
        self._restored_metas: dict[str, StateMeta] = {}
        self._snapshot_filters: dict[str, Callable[[], EntryFilter]] = {}
        self._compaction_filters: dict[str, Callable[[], EntryFilter]] = {}
        self._record_cleaners: list[IncrementalCleaner] = []
        #: where run_compaction_filters continues: (state name, first key or None)
        self._compaction_cursor: tuple[str, bytes | None] = ("", None)
        self._tables: dict[str, Any] = {}
        #: after :meth:`restore`: whether the timers restored all came from RocksDB
        #: timer column families of at most one native checkpoint (then the backend's
        #: mirror of them is exact)
        self.timers_mirrored = False

    # registration -----------------------------------------------------------------

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The state object of ``descriptor`` (registered on first use)."""
        known = self._states.get(descriptor.name)
        meta = meta_of(descriptor)
        if known is not None:
            if known[1] != meta or known[0].ttl != descriptor.ttl:
                raise StateRegistrationError(
                    f"{self._owner}: state {descriptor.name!r} is already registered as "
                    f"{_describe(known[1], known[0])}; it cannot be registered again as "
                    f"{_describe(meta, descriptor)}. Use another name for the new state"
                )
            return known[2]
        restored = self._restored_metas.get(descriptor.name)
        if restored is not None and restored != meta:
            rewrite = migration(self._owner, restored, descriptor)
            if rewrite is None:  # (not one the serializers can read: refused)
                raise StateMigrationError(
                    f"{self._owner}: state {descriptor.name!r} was restored as "
                    f"{_describe(restored, None)} but is now registered as "
                    f"{_describe(meta, descriptor)}; weir cannot read the old bytes with the "
                    f"new descriptor. Keep the old kind/serializer/TTL setting, or use a new "
                    f"state name")
            if rewrite is not AS_IS:
                self.backend.migrate_restored(descriptor.name, rewrite)
            self._restored_metas[descriptor.name] = meta
        state = self._create(descriptor)
        self._states[descriptor.name] = (descriptor, meta, state)
        self._metas[descriptor.name] = meta
        return state

    def queryable(self) -> dict[str, tuple[StateDescriptor, State]]:
        """The registered states declared queryable, by their queryable name."""
        return {d.queryable_as: (d, state) for d, _, state in self._states.values()
                if d.queryable_as is not None}

    def _create(self, d: StateDescriptor) -> State:
        backend, name, ttl = self.backend, d.name, d.ttl
        serializer = d.value_serializer
        kind = d.kind
        storage_kind = kind if kind in (StateKind.LIST, StateKind.MAP) else StateKind.VALUE
        table_serializer = serializer if ttl is None else TtlSerializer(serializer, name)
        check = ttl is None  # TTL states check the user value themselves
        table: Any
        if isinstance(d, MapStateDescriptor):
            table = backend.create_map_table(name, d.user_key_serializer, table_serializer, check)
        elif isinstance(d, ListStateDescriptor):
            table = backend.create_list_table(name, table_serializer, check)
        else:
            table = backend.create_value_table(name, table_serializer, check)
        self._tables[name] = table
        cell: Any = table
        if ttl is not None:
            cleaner = None
            # Flink's defaults: incremental cleanup where the backend iterates state
            # (the heap), the compaction filter on RocksDB; chosen ones always run.
            incremental = (
                ttl.incremental_cleanup
                if backend.name == "rocksdb"
                else ttl.incremental_cleanup_strategy
            )
            if incremental is not None:
                cleaner = IncrementalCleaner(storage_kind, table, ttl, self._clock, incremental)
                if cleaner.for_every_record:
                    self._record_cleaners.append(cleaner)
            if ttl.cleanup_full_snapshot:
                self._snapshot_filters[name] = lambda: expired_entry_filter(
                    storage_kind, ttl.ttl_ms, self._clock
                )
            compaction = ttl.rocksdb_compact_filter_cleanup_strategy
            if compaction is not None:
                every = compaction.query_time_after_num_entries
                self._compaction_filters[name] = lambda: expired_entry_filter(
                    storage_kind, ttl.ttl_ms, self._clock, every
                )
            args = (name, ttl, self._clock, serializer, cleaner)
            if isinstance(d, MapStateDescriptor):
                return TtlMapState(table, d.user_key_serializer, *args)
            if isinstance(d, ListStateDescriptor):
                return TtlListState(table, *args)
            cell = TtlValueState(table, *args)
        if isinstance(d, ReducingStateDescriptor):
            return ReducingStateImpl(cell, d.reduce_function)  # type: ignore[arg-type]
        if isinstance(d, AggregatingStateDescriptor):
            return AggregatingStateImpl(cell, d.aggregate_function)
        return cell  # type: ignore[no-any-return]

    def keys(self, name: str) -> list[bytes]:
        """Prefixed keys that currently have state ``name`` (empty if not registered)."""
        table = self._tables.get(name)
        return table.keys_snapshot() if table is not None else []

    # maintenance ------------------------------------------------------------------

    @property
    def record_cleaners(self) -> list[IncrementalCleaner]:
        """The cleaners :meth:`on_record` runs (the live list; empty: no work)."""
        return self._record_cleaners

    def on_record(self) -> None:
        """Run per-record incremental TTL cleanup, where configured."""
        for cleaner in self._record_cleaners:
            cleaner.step()

    def compact(self) -> int:
        """Compact the backend with TTL compaction filters; returns entries dropped."""
        return self.backend.compact({n: f() for n, f in self._compaction_filters.items()})

    def run_compaction_filters(self, max_entries: int) -> int:
        """Run the TTL compaction filters over at most ``max_entries`` stored entries,
        continuing where the last call stopped: one cursor walks the column families
        of the TTL states in name order and wraps around after the last one; a call
        also ends when it has gone round once. Returns the entries deleted. Only the
        RocksDB backend has entries to filter (see ``KeyedStateBackend.compact_step``)."""
        names = sorted(self._compaction_filters)
        if not names:
            return 0
        at_name, cursor = self._compaction_cursor
        i = bisect.bisect_left(names, at_name)
        if i == len(names) or names[i] != at_name:
            i, cursor = i % len(names), None  # first call, or that state is gone
        budget, dropped = max_entries, 0
        for _ in range(len(names)):
            name = names[i]
            seen, gone, cursor = self.backend.compact_step(
                name, cursor, budget, self._compaction_filters[name]()
            )
            budget -= seen
            dropped += gone
            if cursor is not None:  # the budget ran out inside this state
                self._compaction_cursor = (name, cursor)
                return dropped
            i = (i + 1) % len(names)
            if budget <= 0:
                break
        self._compaction_cursor = (names[i], None)
        return dropped

    # snapshot / restore -----------------------------------------------------------

    def snapshot(
        self, timer_entries: dict[str, list[tuple[bytes, bytes]]], key_group_range: Any
    ) -> KeyedStateSnapshot:
        """Canonical snapshot of every state (registered or only restored) and timers."""
        return self._build(timer_entries, key_group_range, None)

    def prepare_snapshot(
        self, timer_entries: dict[str, list[tuple[bytes, bytes]]], key_group_range: Any
    ) -> Callable[[], KeyedStateSnapshot]:
        """The synchronous part of an asynchronous snapshot: freezes the state now;
        the returned function encodes it (off the processing path) when called."""
        sources = self.backend.frozen_sources()
        filters = {name: make() for name, make in self._snapshot_filters.items()}
        return lambda: self._build(timer_entries, key_group_range, sources, filters)

    def changes(
        self, timer_changes: Mapping[str, Iterable[tuple[bytes, Iterable[tuple[bytes, bytes]]]]],
        written: dict[str, dict[bytes, bytes | None]],
    ) -> dict[int, dict[str, tuple[list[bytes], list[tuple[bytes, bytes]]]]]:
        """What changed since the last call (or the backend's ``track_changes``), by
        key group and state: the primary keys changed and their canonical entries now
        (after the full-snapshot TTL filter) — the body of a changelog delta. States
        the backend reports as a dict of the bytes written last (RocksDB values and
        lists) and that have no filter go into ``written`` as they are."""
        filters = {name: make() for name, make in self._snapshot_filters.items()}
        out: dict[int, dict[str, tuple[list[bytes], list[tuple[bytes, bytes]]]]] = {}
        sources = itertools.chain(self.backend.take_changes(), timer_changes.items())
        for name, changed in sources:
            keep = filters.get(name)
            if isinstance(changed, dict):
                if keep is None:
                    written[name] = changed
                    continue
                changed = [(k, [] if v is None else [(k, v)]) for k, v in changed.items()]
            for primary, entries in changed:
                group = (primary[0] << 8) | primary[1]
                per = out.get(group)
                if per is None:
                    per = out[group] = {}
                slot = per.get(name)
                if slot is None:
                    slot = per[name] = ([], [])
                slot[0].append(primary)
                for key, data in entries:
                    if keep is not None:
                        kept = keep(key, data)
                        if kept is None:
                            continue
                        data = kept
                    slot[1].append((key, data))
        return out

    def native_snapshot(
        self,
        timer_entries: dict[str, list[tuple[bytes, bytes]]],
        key_group_range: KeyGroupRange,
        path: str | Path,
    ) -> KeyedStateSnapshot:
        """Timers in canonical form plus the native RocksDB checkpoint written at
        ``path`` (which holds every state)."""
        snap = self._build(timer_entries, key_group_range, (), {})
        return dataclasses.replace(snap, native=NativeRocksDBState(str(path), key_group_range))

    @property
    def metas(self) -> dict[str, StateMeta]:
        """What every state (registered, or restored and not registered) was registered as."""
        return {**self._restored_metas, **self._metas}

    def _build(
        self,
        timer_entries: dict[str, list[tuple[bytes, bytes]]],
        key_group_range: Any,
        sources: Any,
        filters: dict[str, EntryFilter] | None = None,
    ) -> KeyedStateSnapshot:
        if filters is None:
            filters = {name: make() for name, make in self._snapshot_filters.items()}
        states = self.backend.snapshot_sources() if sources is None else sources
        groups = pack_sources(itertools.chain(states, timer_entries.items()), filters,
                              self.backend.snapshot_chunk)
        ctx = self.backend.key_context
        return KeyedStateSnapshot(
            ctx.max_parallelism, key_group_range, self.metas, tuple(timer_entries), groups
        )

    def restore(
        self, snapshots: Sequence[KeyedStateSnapshot], timer_names: Sequence[str]
    ) -> dict[str, list[tuple[bytes, bytes]]]:
        """Load keyed snapshots (already clipped to this subtask); returns timer entries."""
        timers: dict[str, list[tuple[bytes, bytes]]] = {n: [] for n in timer_names}
        canonical_timers = False
        per_state: dict[str, list[tuple[bytes, bytes]]] = {}
        #: states' entries of packed groups (a data file's), flat: [key0, raw0, ...]
        flat_state: dict[str, list[bytes]] = {}
        for snap in snapshots:
            for name, meta in snap.metas.items():
                known = self._restored_metas.setdefault(name, meta)
                if known != meta:
                    raise StateMigrationError(
                        f"{self._owner}: snapshots disagree on state {name!r}: "
                        f"{_describe(known, None)} vs {_describe(meta, None)}"
                    )
            groups = snap.groups
            if isinstance(groups, PackedGroups):
                for group in groups:
                    for name, flat in groups.flat(group).items():
                        if name in timers:
                            canonical_timers = True
                            timers[name].extend(pairs(flat))
                        else:
                            flat_state.setdefault(name, []).extend(flat)
                continue
            for per in groups.values():
                for name, entries in per.items():
                    if name in timers:
                        canonical_timers = True
                    target = timers if name in timers else per_state
                    target.setdefault(name, []).extend(entries)
        natives = [snap.native for snap in snapshots if snap.native is not None]
        # timers mirrored into column families (RocksDB backend)
        for name, mirrored in self.backend.restore_native(natives).items():
            if name in timers:
                timers[name].extend(mirrored)
        #: the RocksDB timer mirror holds exactly the restored timers (one native
        #: checkpoint adopted, no timer from elsewhere): changes can go on from it
        self.timers_mirrored = not canonical_timers and len(natives) <= 1
        for name, state_entries in per_state.items():
            self.backend.restore_entries(name, state_entries)
        for name, flat in flat_state.items():
            self.backend.restore_flat(name, flat)
        return timers


def _describe(meta: StateMeta, descriptor: StateDescriptor | None) -> str:
    ttl = "with TTL" if meta.ttl else "without TTL"
    if descriptor is not None and descriptor.ttl is not None:
        ttl = f"with TTL {descriptor.ttl.ttl_ms} ms"
    return f"{meta.kind.value} state, serializers {list(meta.serializers)}, {ttl}"
