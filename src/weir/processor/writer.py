"""Writing state from DataFrames: :func:`write_savepoint` (Flink's State Processor API
``SavepointWriter``: bootstrap a new savepoint, or rewrite an existing one).

Tables have the columns :func:`~weir.read_state` gives (``weir.processor.decoding``),
so a table read, modified and written back round-trips exactly. Each state is
declared by its descriptor (kind, serializers, TTL) or, when rewriting, taken from
the state as stored in ``base``. The savepoint is the canonical, self-contained
format of ``weir.checkpoint`` (full files, no shared ones): it restores into both
backends, both runtimes and the test harness, at any parallelism up to
``max_parallelism``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weir.api.descriptors import ListStateDescriptor, MapStateDescriptor, StateDescriptor
from weir.api.serializers import Serializer
from weir.checkpoint.channel_state import ChannelStateHandle
from weir.checkpoint.coordinator import CompletedCheckpoint, PendingCheckpoint
from weir.checkpoint.format import (
    CheckpointKind,
    CheckpointMetadata,
    SubtaskStateHandle,
    encode_metadata,
    uid_dir,
)
from weir.checkpoint.publish import write_new_directory
from weir.checkpoint.savepoints import canonical_keyed, copy_channel_state, copy_subtask
from weir.checkpoint.storage import CheckpointStorage
from weir.checkpoint.subtask_files import write_snapshot
from weir.errors import ConfigurationError
from weir.processor.decoding import SerializerSet
from weir.processor.encoding import (
    GroupedEntries,
    by_subtask,
    columns_of,
    encode_all,
    keyed_entries,
    timer_entries,
)
from weir.processor.locate import locate
from weir.processor.spark_writer import is_spark_frame, timer_states_of, write_on_executors
from weir.state.keyed import meta_of
from weir.state.keygroups import check_parallelism, key_group_range_for_operator
from weir.state.snapshot import (
    BroadcastStateSnapshot,
    KeyedStateSnapshot,
    OperatorListStateSnapshot,
    OperatorSubtaskSnapshot,
    RedistributionMode,
    StateMeta,
    assign_broadcast_state,
    assign_operator_state,
    schema_json,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["write_savepoint"]


def write_savepoint(
    target: str | Path,
    *,
    uid: str,
    states: Mapping[str, Any] | None = None,
    descriptors: Iterable[StateDescriptor] = (),
    timers: Any = None,
    operator_states: Mapping[str, Any] | None = None,
    union_states: Collection[str] = (),
    broadcast_states: Mapping[str, Any] | None = None,
    base: str | Path | None = None,
    max_parallelism: int | None = None,
    parallelism: int | None = None,
    serializers: Iterable[Serializer[Any]] = (),
    storage_options: dict[str, Any] | None = None,
) -> str:
    """Write a savepoint into the new directory ``target`` holding the state of
    operator ``uid`` from DataFrames, pandas or Spark; its URL. Keyed state and timers
    given as Spark DataFrames are encoded and written on the executors, one task per
    subtask (``weir.processor.spark_writer``; then ``target`` must be reachable by them),
    operator and broadcast state (small by nature) are collected.

    ``states`` maps keyed state names to tables (``key, value``; list ``key, index,
    value``; map ``key, map_key, value``; plus ``ttl_timestamp_ms`` for a state with
    TTL), ``timers`` is a ``key, domain, timestamp_ms`` table, ``operator_states``
    map operator list state names to ``subtask, index, value`` tables (redistributed
    by union if named in ``union_states``, else split) and ``broadcast_states`` map
    names to ``key, value`` tables. A state is declared by the descriptor of the same
    name in ``descriptors`` (the one the job registers: its kind, serializers and
    TTL), or else as ``base`` stores it.

    With ``base`` (a savepoint, checkpoint, a checkpoint storage root — a continuous
    job's: its current state, what its next run would restore — or a Spark checkpoint
    location), the result is ``base`` rewritten: its other operators and ``uid``'s
    states not given here are copied as they are, the given ones replaced or added, and
    so are the records an unaligned checkpoint had in flight (replayed on restore, as
    from ``base`` itself); ``max_parallelism`` and by
    default ``parallelism`` are ``base``'s. Without it, ``max_parallelism`` is
    required (it can never change afterwards) and ``parallelism`` defaults to 1 (any
    parallelism restores it).

    >>> counts = pd.DataFrame({"key": ["a", "b"], "value": [3, 5]})   # doctest: +SKIP
    >>> weir.write_savepoint("/sp/boot", uid="count", max_parallelism=128,
    ...     states={"count": counts},
    ...     descriptors=[ValueStateDescriptor("count", IntSerializer())])  # doctest: +SKIP
    """
    known = SerializerSet(serializers)
    located = None
    if base is not None:
        located = locate(str(base), storage_options=storage_options)
    based = located.checkpoints.get(uid) if located is not None else None
    base_op = based.metadata.operators[uid] if based is not None else None
    if base_op is not None:
        if max_parallelism not in (None, base_op.max_parallelism):
            raise ConfigurationError(
                f"operator {uid!r} in {base} has max_parallelism={base_op.max_parallelism}; "
                f"it cannot change (got max_parallelism={max_parallelism})")
        max_parallelism = base_op.max_parallelism
        parallelism = parallelism or base_op.parallelism
    if max_parallelism is None:
        raise ConfigurationError(
            f"write_savepoint of operator {uid!r}: pass max_parallelism= (the job's; it "
            f"can never change afterwards) or base= (a savepoint to rewrite)")
    parallelism = parallelism or 1
    check_parallelism(parallelism, max_parallelism)
    old = _load(based, uid) if based is not None else []
    built = _Build(uid, max_parallelism, {d.name: d for d in descriptors}, known, old)
    built.keyed(states or {}, timers)
    built.operator(operator_states or {}, set(union_states))
    built.broadcast(broadcast_states or {})
    snaps = [built.subtask(i, parallelism) for i in range(parallelism)]

    def write(storage: CheckpointStorage) -> None:
        checkpoint_id = based.checkpoint_id if based is not None else 0
        now = int(time.time() * 1000)
        pending = PendingCheckpoint(checkpoint_id, now, CheckpointKind.SAVEPOINT, storage, "")
        written: dict[int, SubtaskStateHandle] = {}
        if built.spark_tables or built.spark_timers is not None:
            written = write_on_executors(
                built.spark_tables, built.spark_timers, snaps, uid=uid, storage=storage,
                storage_options=storage_options)
        for snap in snaps:
            handle = written.get(snap.subtask_index)
            if handle is None:
                kgr = key_group_range_for_operator(max_parallelism, parallelism,
                                                   snap.subtask_index)
                prefix = f"{uid_dir(uid)}/{snap.subtask_index}-savepoint"
                handle = write_snapshot(snap, storage, prefix, kgr)
            pending.acknowledge(uid, parallelism, max_parallelism, handle)
        positions: dict[str, Any] = {}
        owner: dict[str, Any] = {}  # (the base's job lineage: its sinks accept the result)
        channels: dict[str, ChannelStateHandle] = {}
        if located is not None:
            for completed in {c.url: c for c in located.checkpoints.values()}.values():
                channels.update(copy_channel_state(completed, storage))
            for other, completed in sorted(located.checkpoints.items()):
                positions.update(completed.metadata.source_positions)
                if completed.metadata.owner.get("lineage"):
                    owner = {"lineage": completed.metadata.owner["lineage"]}
                if other == uid:
                    continue
                op = completed.metadata.operators[other]
                for handle in op.subtasks:
                    copy_subtask(completed, other, op, handle, storage, pending)
        storage.write("_metadata", encode_metadata(CheckpointMetadata(
            checkpoint_id, CheckpointKind.SAVEPOINT, now, int(time.time() * 1000),
            pending._operators(), positions, channel_state=channels, owner=owner)))

    return write_new_directory(str(target), write, storage_options=storage_options)


def _load(completed: CompletedCheckpoint, uid: str) -> list[OperatorSubtaskSnapshot]:
    """Every subtask snapshot of ``uid`` in canonical form (native RocksDB read out)."""
    op = completed.metadata.operators[uid]
    out = []
    for handle in op.subtasks:
        i = handle.subtask_index
        snaps = completed.load(uid, op.parallelism, i)
        own = next(s for s in snaps if s.subtask_index == i)
        if own.keyed is not None:
            own = dataclasses.replace(own, keyed=canonical_keyed(
                own.keyed, f"rewrite of operator {uid!r} subtask {i}"))
        out.append(own)
    return out


def _frame(table: Any) -> pd.DataFrame:
    """A pandas DataFrame of ``table`` (a Spark DataFrame of operator or broadcast state,
    small by nature, is collected)."""
    to_pandas = getattr(table, "toPandas", None)
    return table if to_pandas is None else to_pandas()


class _Build:
    """The subtask snapshots of one operator, from tables and the base's snapshots."""

    def __init__(self, uid: str, max_parallelism: int, descriptors: dict[str, StateDescriptor],
                 serializers: SerializerSet, old: list[OperatorSubtaskSnapshot]) -> None:
        self.uid = uid
        self.max_parallelism = max_parallelism
        self.descriptors = descriptors
        self.serializers = serializers
        self.old = old
        self.metas: dict[str, StateMeta] = {}
        self.timer_states: tuple[str, ...] = ()
        self.groups: GroupedEntries = {}
        self.is_keyed = any(s.keyed is not None for s in old)
        #: operator list states given: name -> (the empty state, subtask -> its state)
        self.op_states: dict[
            str, tuple[OperatorListStateSnapshot, dict[int, OperatorListStateSnapshot]]] = {}
        self.bc_states: dict[str, BroadcastStateSnapshot] = {}
        #: keyed tables given as Spark DataFrames: name -> (meta, serializers, DataFrame)
        self.spark_tables: dict[str, tuple[StateMeta, list[Serializer[Any]], Any]] = {}
        self.spark_timers: Any = None

    def _what(self, scope: str, name: str) -> str:
        return f"{scope} state {name!r} of operator {self.uid!r}"

    def keyed(self, tables: Mapping[str, Any], timers: Any) -> None:
        replaced = set(tables)
        for snap in self.old:  # the base's states that stay
            keyed = snap.keyed
            if keyed is None:
                continue
            for name, meta in keyed.metas.items():
                if name not in replaced:
                    self.metas[name] = meta
            keep_timers = timers is None
            if keep_timers:
                self.timer_states = tuple(sorted({*self.timer_states, *keyed.timer_states}))
            for group, per in keyed.groups.items():
                for name, entries in per.items():
                    if name in replaced or (name in keyed.timer_states and not keep_timers):
                        continue
                    self.groups.setdefault(group, {})[name] = list(entries)
        stored = {m.name: m for s in self.old if s.keyed for m in s.keyed.metas.values()}
        for name, table in tables.items():
            what = self._what("keyed", name)
            descriptor = self.descriptors.get(name)
            if descriptor is not None:
                meta = meta_of(descriptor)
                sers = _descriptor_serializers(descriptor)
            elif name in stored:
                meta = stored[name]
                sers = [self.serializers.of_state(meta, i, what)
                        for i in range(len(meta.serializers))]
            else:
                raise ConfigurationError(
                    f"{what} is new: declare it with its descriptor, e.g. "
                    f"descriptors=[ValueStateDescriptor({name!r}, IntSerializer())]")
            if is_spark_frame(table):  # encoded and written on the executors
                self.spark_tables[name] = (meta, sers, table)
            else:
                keyed_entries(meta, table, sers, self.max_parallelism, self.groups, what)
            self.metas[name] = meta
        what = f"timers of operator {self.uid!r}"
        if is_spark_frame(timers):
            self.spark_timers = timers
            self.timer_states = timer_states_of(timers, what)
        elif timers is not None:
            self.timer_states = timer_entries(timers, self.max_parallelism, self.groups, what)
        self.is_keyed = self.is_keyed or bool(self.metas) or bool(self.timer_states)

    def operator(self, tables: Mapping[str, Any], union: set[str]) -> None:
        stored = {n: st for s in self.old for n, st in s.operator_states.items()}
        for name, table in tables.items():
            what = self._what("operator", name)
            descriptor = self.descriptors.get(name)
            if isinstance(descriptor, ListStateDescriptor):
                ser = descriptor.value_serializer
                mode = RedistributionMode.UNION if name in union else (
                    RedistributionMode.SPLIT_DISTRIBUTE)
            elif name in stored:
                ser = self.serializers.of(stored[name].serializer, stored[name].schema, what)
                mode = stored[name].mode if not union or name not in union else (
                    RedistributionMode.UNION)
            else:
                raise ConfigurationError(
                    f"{what} is new: declare it with its descriptor, e.g. "
                    f"descriptors=[ListStateDescriptor({name!r}, IntSerializer())]")
            cols = columns_of(_frame(table), ["subtask", "index", "value"], [], what)
            per = by_subtask(cols, what)
            empty = OperatorListStateSnapshot(name, mode, ser.type_id, (), schema_json(ser))
            self.op_states[name] = (empty, {
                i: dataclasses.replace(empty, elements=tuple(encode_all(ser, values, what)))
                for i, values in per.items()})

    def broadcast(self, tables: Mapping[str, Any]) -> None:
        stored = {n: st for s in self.old[:1] for n, st in s.broadcast_states.items()}
        for name, table in tables.items():
            what = self._what("broadcast", name)
            descriptor = self.descriptors.get(name)
            if isinstance(descriptor, MapStateDescriptor):
                ks, vs = descriptor.user_key_serializer, descriptor.value_serializer
            elif name in stored:
                ks, vs = (self.serializers.of(t, schema, what) for t, schema in zip(
                    stored[name].serializers, stored[name].schemas, strict=True))
            else:
                raise ConfigurationError(
                    f"{what} is new: declare it with its descriptor, e.g. "
                    f"descriptors=[MapStateDescriptor({name!r})]")
            cols = columns_of(_frame(table), ["key", "value"], [], what)
            entries = tuple(zip(encode_all(ks, cols["key"], what),
                                encode_all(vs, cols["value"], what), strict=True))
            if len({k for k, _ in entries}) != len(entries):
                raise ConfigurationError(f"{what}: two rows for the same key")
            self.bc_states[name] = BroadcastStateSnapshot(name, (ks.type_id, vs.type_id),
                                                          entries, (schema_json(ks),
                                                                    schema_json(vs)))

    def subtask(self, i: int, parallelism: int) -> OperatorSubtaskSnapshot:
        keyed = None
        if self.is_keyed:
            kgr = key_group_range_for_operator(self.max_parallelism, parallelism, i)
            groups = {g: {n: tuple(e) for n, e in per.items()}
                      for g, per in self.groups.items() if g in kgr}
            keyed = KeyedStateSnapshot(self.max_parallelism, kgr, dict(self.metas),
                                       self.timer_states, groups)
        op_states: dict[str, OperatorListStateSnapshot] = {}
        bc_states: dict[str, BroadcastStateSnapshot] = {}
        if self.old:
            kept_op = assign_operator_state(self.old, parallelism, i)
            op_states = {n: s for n, s in kept_op.items() if n not in self.op_states}
            kept_bc = assign_broadcast_state(self.old, i, parallelism)
            bc_states = {n: s for n, s in kept_bc.items() if n not in self.bc_states}
        for name, (empty, per) in self.op_states.items():
            if any(j >= parallelism for j in per):
                raise ConfigurationError(
                    f"{self._what('operator', name)}: rows of subtask {max(per)} but "
                    f"parallelism={parallelism}; pass parallelism={max(per) + 1}")
            op_states[name] = per.get(i, empty)
        bc_states.update(self.bc_states)
        return OperatorSubtaskSnapshot(self.uid, 0, 0, parallelism, i, self.max_parallelism,
                                       keyed, op_states, bc_states)


def _descriptor_serializers(descriptor: StateDescriptor) -> list[Serializer[Any]]:
    if isinstance(descriptor, MapStateDescriptor):
        return [descriptor.user_key_serializer, descriptor.value_serializer]
    return [descriptor.value_serializer]
