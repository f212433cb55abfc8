"""Reading state offline as pandas DataFrames: :func:`read_state` (Flink's State
Processor API reader, Spark's ``statestore`` data source).

A :class:`StateReader` holds, per operator uid, the checkpoint or savepoint its state
is read from (``weir.processor.locate``); each table is read subtask by subtask, every
file through its checksum, and decoded with the state's declared serializer
(``weir.processor.decoding``: the columns of each kind). Full, incremental (RocksDB:
its native files are downloaded into a temporary directory and scanned) and changelog
checkpoints and savepoints all read the same.
"""

from __future__ import annotations

import enum
import shutil
import tempfile
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from weir.api.descriptors import StateKind
from weir.api.serializers import Serializer
from weir.checkpoint.coordinator import CompletedCheckpoint
from weir.errors import ConfigurationError, NoCheckpointError
from weir.processor.decoding import (
    TIMER_COLUMNS,
    SerializerSet,
    keyed_columns,
    keyed_rows,
    timer_rows,
    to_frame,
)
from weir.processor.locate import locate
from weir.state.keygroups import KeyGroupRange
from weir.state.rocksdb import TIMER_CF_PREFIX, scan_native
from weir.state.snapshot import OperatorSubtaskSnapshot, RedistributionMode, StateMeta

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TIMERS", "StateInfo", "StateReader", "StateScope", "read_state"]

#: the ``scope`` of :meth:`StateReader.rows` that reads the timers
TIMERS = "timers"


class StateScope(enum.Enum):
    """Where a state lives in an operator."""

    KEYED = "keyed"
    OPERATOR = "operator"
    BROADCAST = "broadcast"


@dataclass(frozen=True)
class StateInfo:
    """One state of an operator as stored: ``kind`` is the keyed state's kind, the
    operator list state's redistribution mode, or None for broadcast state (a map);
    ``serializers`` are the ``type_id`` of its serializers (map and broadcast state:
    user key, value)."""

    uid: str
    name: str
    scope: StateScope
    kind: StateKind | RedistributionMode | None
    serializers: tuple[str, ...]
    ttl: bool = False


def read_state(
    path: str | Path,
    *,
    uid: str | None = None,
    checkpoint_id: int | None = None,
    query: str | None = None,
    serializers: Iterable[Serializer[Any]] = (),
    storage_options: dict[str, Any] | None = None,
) -> StateReader:
    """Open the state in ``path`` for reading: a checkpoint or savepoint directory, a
    :class:`~weir.CheckpointCoordinator`'s storage root (its latest completed
    checkpoint, or ``checkpoint_id``), or a Spark stage's ``checkpoint_location`` (each
    stage's current state, or batch ``checkpoint_id`` of ``query``). ``uid`` keeps
    one operator; ``serializers`` decode states written with serializers of your own.

    >>> reader = weir.read_state("/chk/fraud")               # doctest: +SKIP
    >>> reader.keyed_state("fraud-detector", "count")        # doctest: +SKIP
           key  value
    0  acct-17      3
    """
    located = locate(str(path), uid=uid, checkpoint_id=checkpoint_id, query=query,
                     storage_options=storage_options)
    return StateReader(located.checkpoints, located.description,
                       SerializerSet(serializers, reading=True))


class StateReader:
    """The state of one or more operators in checkpoints; see :func:`read_state`."""

    def __init__(self, checkpoints: dict[str, CompletedCheckpoint], description: str,
                 serializers: SerializerSet) -> None:
        self._checkpoints = checkpoints
        self.description = description
        self._serializers = serializers

    def __repr__(self) -> str:
        return f"StateReader({self.description})"

    @property
    def uids(self) -> list[str]:
        """The operator uids with state here."""
        return sorted(self._checkpoints)

    def checkpoint(self, uid: str) -> CompletedCheckpoint:
        """The checkpoint or savepoint ``uid``'s state is read from."""
        found = self._checkpoints.get(uid)
        if found is None:
            raise NoCheckpointError(
                f"{self.description} has no state of operator {uid!r} (operators: "
                f"{self.uids})")
        return found

    def states(self, uid: str) -> list[StateInfo]:
        """Every state of ``uid``: keyed, operator list and broadcast states."""
        out: dict[tuple[StateScope, str], StateInfo] = {}
        for sub in self._handles(uid):
            for meta in sub.metas.values():
                out.setdefault((StateScope.KEYED, meta.name), StateInfo(
                    uid, meta.name, StateScope.KEYED, meta.kind, meta.serializers, meta.ttl))
            for name, (mode, ser) in sub.operator_states.items():
                out.setdefault((StateScope.OPERATOR, name), StateInfo(
                    uid, name, StateScope.OPERATOR, mode, (ser,)))
            for name, sers in sub.broadcast_states.items():
                out.setdefault((StateScope.BROADCAST, name), StateInfo(
                    uid, name, StateScope.BROADCAST, None, tuple(sers)))
        return [out[k] for k in sorted(out, key=lambda k: (k[0].value, k[1]))]

    # tables -----------------------------------------------------------------------------
    def keyed_state(self, uid: str, name: str) -> pd.DataFrame:
        """Keyed state ``name`` of ``uid``: one row per key (list: per element; map: per
        entry), columns by kind (``weir.processor.decoding``)."""
        return to_frame(*self._materialize(self.rows(uid, StateScope.KEYED, name)))

    def timers(self, uid: str) -> pd.DataFrame:
        """Registered timers of ``uid``: ``key, domain ("event" or "processing"),
        timestamp_ms``, in domain and time order."""
        rows, columns = self._materialize(self.rows(uid, TIMERS))
        rows.sort(key=lambda r: (r[1], r[2]))
        return to_frame(rows, columns)

    def operator_state(self, uid: str, name: str) -> pd.DataFrame:
        """Operator list state ``name`` of ``uid``: ``subtask, index, value`` (as each
        subtask stored it; union state too)."""
        return to_frame(*self._materialize(self.rows(uid, StateScope.OPERATOR, name)))

    def broadcast_state(self, uid: str, name: str) -> pd.DataFrame:
        """Broadcast state ``name`` of ``uid``: ``key, value`` (every subtask holds the
        same copy; subtask 0's is read)."""
        return to_frame(*self._materialize(self.rows(uid, StateScope.BROADCAST, name)))

    def rows(
        self, uid: str, scope: StateScope | str, name: str = "",
        subtasks: Collection[int] | None = None,
    ) -> tuple[list[str], Iterator[tuple[Any, ...]]]:
        """The columns of a table and an iterator over its rows, read subtask by
        subtask (only ``subtasks``, if given): keyed state ``name``, the timers
        (``scope`` ``"timers"``), operator state ``name`` or broadcast state ``name``
        (stored by every subtask alike: only the first subtask's copy is read). What a
        data source reads in parallel."""
        if scope == TIMERS:
            return list(TIMER_COLUMNS), self._timer_rows(uid, subtasks)
        scope = StateScope(scope)
        if scope is StateScope.KEYED:
            meta = self._meta(uid, name)
            return keyed_columns(meta), self._keyed_rows(uid, meta, subtasks)
        if name not in {s.name for s in self.states(uid) if s.scope is scope}:
            self._unknown(uid, name, scope)
        if scope is StateScope.OPERATOR:
            return ["subtask", "index", "value"], self._operator_rows(uid, name, subtasks)
        return ["key", "value"], self._broadcast_rows(uid, name, subtasks)

    @staticmethod
    def _materialize(table: tuple[list[str], Iterator[tuple[Any, ...]]]
                     ) -> tuple[list[tuple[Any, ...]], list[str]]:
        columns, rows = table
        return list(rows), columns

    def _keyed_rows(self, uid: str, meta: StateMeta, subtasks: Collection[int] | None
                    ) -> Iterator[tuple[Any, ...]]:
        what = f"keyed state {meta.name!r} of operator {uid!r} in {self.description}"
        for _, entries in self._keyed_entries(uid, {meta.name}, subtasks=subtasks):
            yield from keyed_rows(meta, entries, self._serializers, what)

    def _timer_rows(self, uid: str, subtasks: Collection[int] | None
                    ) -> Iterator[tuple[Any, ...]]:
        names = {n for sub in self._handles(uid) for n in sub.timer_states}
        for name, entries in self._keyed_entries(uid, names, timers=True, subtasks=subtasks):
            yield from timer_rows(name, entries)

    def _operator_rows(self, uid: str, name: str, subtasks: Collection[int] | None
                       ) -> Iterator[tuple[Any, ...]]:
        what = f"operator state {name!r} of operator {uid!r} in {self.description}"
        for snap in self._operator_snapshots(uid, subtasks=subtasks):
            state = snap.operator_states.get(name)
            if state is not None:
                decode = self._serializers.of(state.serializer, state.schema, what).decode
                for i, element in enumerate(state.elements):
                    yield snap.subtask_index, i, decode(element)

    def _broadcast_rows(self, uid: str, name: str, subtasks: Collection[int] | None
                        ) -> Iterator[tuple[Any, ...]]:
        what = f"broadcast state {name!r} of operator {uid!r} in {self.description}"
        for snap in self._operator_snapshots(uid, first_only=True, subtasks=subtasks):
            state = snap.broadcast_states.get(name)
            if state is not None:
                ks, vs = (self._serializers.of(s, schema, what).decode for s, schema in zip(
                    state.serializers, state.schemas, strict=True))
                for k, v in state.entries:
                    yield ks(k), vs(v)

    # internals --------------------------------------------------------------------------
    def _handles(self, uid: str) -> list[Any]:
        return list(self.checkpoint(uid).metadata.operators[uid].subtasks)

    def _meta(self, uid: str, name: str) -> StateMeta:
        """What keyed state ``name`` of ``uid`` was registered as."""
        for sub in self._handles(uid):
            if name in sub.metas:
                return sub.metas[name]  # type: ignore[no-any-return]
        self._unknown(uid, name, StateScope.KEYED)

    def _unknown(self, uid: str, name: str, scope: StateScope) -> NoReturn:
        states = [f"{s.name!r} ({s.scope.value})" for s in self.states(uid)]
        raise ConfigurationError(
            f"operator {uid!r} in {self.description} has no {scope.value} state {name!r}; "
            f"its states: {states or 'none'}")

    def _operator_snapshots(self, uid: str, first_only: bool = False,
                            subtasks: Collection[int] | None = None,
                            ) -> Iterator[OperatorSubtaskSnapshot]:
        completed = self.checkpoint(uid)
        for sub in sorted(self._handles(uid), key=lambda s: s.subtask_index):
            if sub.operator_file is None or (
                    subtasks is not None and sub.subtask_index not in subtasks):
                continue
            yield completed.load_subtask(uid, sub.subtask_index, KeyGroupRange.empty())
            if first_only:
                return

    def _keyed_entries(self, uid: str, names: set[str], timers: bool = False,
                       subtasks: Collection[int] | None = None,
                       ) -> Iterator[tuple[str, Any]]:
        """``(state name, entries)`` of the states ``names`` over every subtask (or
        ``subtasks``)."""
        completed = self.checkpoint(uid)
        for sub in sorted(self._handles(uid), key=lambda s: s.subtask_index):
            if sub.keyed is None or (subtasks is not None and sub.subtask_index not in subtasks):
                continue
            local = tempfile.mkdtemp(prefix="weir-read-")
            try:
                snap = completed.load_subtask(uid, sub.subtask_index, local_dir=local)
                keyed = snap.keyed
                if keyed is None:
                    continue
                for per in keyed.groups.values():
                    for name, entries in per.items():
                        if name in names:
                            yield name, entries
                if keyed.native is not None:
                    scanned = (scan_native(keyed.native, TIMER_CF_PREFIX) if timers
                               else scan_native(keyed.native))
                    for name, scanned_entries in scanned:
                        if name in names:
                            yield name, scanned_entries
            finally:
                shutil.rmtree(local, ignore_errors=True)

