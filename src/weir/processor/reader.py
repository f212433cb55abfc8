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
from collections.abc import Iterable, Iterator
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

__all__ = ["StateInfo", "StateReader", "StateScope", "read_state"]


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
    return StateReader(located.checkpoints, located.description, SerializerSet(serializers))


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
        meta = self._meta(uid, name)
        what = f"keyed state {name!r} of operator {uid!r} in {self.description}"
        rows: list[tuple[Any, ...]] = []
        for _, entries in self._keyed_entries(uid, {name}):
            rows.extend(keyed_rows(meta, entries, self._serializers, what))
        return to_frame(rows, keyed_columns(meta))

    def timers(self, uid: str) -> pd.DataFrame:
        """Registered timers of ``uid``: ``key, domain ("event" or "processing"),
        timestamp_ms``, in domain and time order."""
        names = {n for sub in self._handles(uid) for n in sub.timer_states}
        rows: list[tuple[Any, ...]] = []
        for name, entries in self._keyed_entries(uid, names, timers=True):
            rows.extend(timer_rows(name, entries))
        rows.sort(key=lambda r: (r[1], r[2]))
        return to_frame(rows, list(TIMER_COLUMNS))

    def operator_state(self, uid: str, name: str) -> pd.DataFrame:
        """Operator list state ``name`` of ``uid``: ``subtask, index, value`` (as each
        subtask stored it; union state too)."""
        rows: list[tuple[Any, ...]] = []
        what = f"operator state {name!r} of operator {uid!r} in {self.description}"
        known = False
        for snap in self._operator_snapshots(uid):
            state = snap.operator_states.get(name)
            if state is None:
                continue
            known = True
            decode = self._serializers.get(state.serializer, what).decode
            rows.extend((snap.subtask_index, i, decode(e)) for i, e in enumerate(state.elements))
        if not known:
            self._unknown(uid, name, StateScope.OPERATOR)
        return to_frame(rows, ["subtask", "index", "value"])

    def broadcast_state(self, uid: str, name: str) -> pd.DataFrame:
        """Broadcast state ``name`` of ``uid``: ``key, value`` (every subtask holds the
        same copy; subtask 0's is read)."""
        what = f"broadcast state {name!r} of operator {uid!r} in {self.description}"
        state = next((snap.broadcast_states.get(name)
                      for snap in self._operator_snapshots(uid, first_only=True)), None)
        if state is None:
            self._unknown(uid, name, StateScope.BROADCAST)
        ks, vs = (self._serializers.get(s, what).decode for s in state.serializers)
        return to_frame([(ks(k), vs(v)) for k, v in state.entries], ["key", "value"])

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

    def _operator_snapshots(self, uid: str, first_only: bool = False
                            ) -> Iterator[OperatorSubtaskSnapshot]:
        completed = self.checkpoint(uid)
        for sub in sorted(self._handles(uid), key=lambda s: s.subtask_index):
            if sub.operator_file is None:
                continue
            yield completed.load_subtask(uid, sub.subtask_index, KeyGroupRange.empty())
            if first_only:
                return

    def _keyed_entries(self, uid: str, names: set[str], timers: bool = False
                       ) -> Iterator[tuple[str, Any]]:
        """``(state name, entries)`` of the states ``names`` over every subtask."""
        completed = self.checkpoint(uid)
        for sub in sorted(self._handles(uid), key=lambda s: s.subtask_index):
            if sub.keyed is None:
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

