"""The changelog side of a keyed operator (mixed into ``KeyedOperator``): recording
which keys and timers change (every key, or for a large hash-map state a sample), the
changes as a snapshot, applying another copy's changes, and freezing the
state for a materialization. The checkpointer's side is
``weir.runtime.changelog_snapshots``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from weir.runtime.operator_base import OperatorBase
from weir.state.backend import KeyedStateBackend
from weir.state.hashmap import HashMapKeyedStateBackend
from weir.state.keyed import KeyedStateStore
from weir.state.snapshot import KeyedStateSnapshot, OperatorSubtaskSnapshot
from weir.state.timers import EVENT_TIMERS, PROCESSING_TIMERS, TimerQueue

__all__ = ["KeyedChanges", "StateChange"]

#: one state's part of a changelog delta: (primary keys replaced, their entries now)
StateChange = tuple[Sequence[bytes], Sequence[tuple[bytes, bytes]]]


class KeyedChanges(OperatorBase):
    """Changelog snapshots of a keyed operator (``KeyedOperator`` sets these fields)."""

    backend: KeyedStateBackend
    keyed_state: KeyedStateStore
    event_timers: TimerQueue
    processing_timers: TimerQueue

    def track_changes(self, sampled: bool = False, rebase_share: float | None = None) -> None:
        """Start recording keyed-state and timer changes (hash map, RocksDB): the state as
        of now is the base of the next :meth:`snapshot_changes`. ``sampled``: a large
        hash-map state records only a sample of its written keys, for
        :meth:`changed_share` (the changes can then be taken only if nothing was
        written: :meth:`changes_known`); timers and RocksDB always record every change.
        ``rebase_share``: a large hash-map state's exact record turns into the sample
        once it holds that share of the keys (the next snapshot is a full one then)."""
        if isinstance(self.backend, HashMapKeyedStateBackend):
            self.backend.track_changes(sampled, rebase_share)
        else:
            self.backend.track_changes()
        self.event_timers.track_changes()
        self.processing_timers.track_changes()

    def changes_sampled(self) -> bool:
        """Whether keyed-state writes are recorded as a sample (see :meth:`track_changes`)."""
        return isinstance(self.backend, HashMapKeyedStateBackend) and self.backend.sampled

    def changes_known(self) -> bool:
        """Whether :meth:`snapshot_changes` can be taken: every change since changes
        were last taken was recorded (see :meth:`track_changes`)."""
        return (not isinstance(self.backend, HashMapKeyedStateBackend)
                or self.backend.changes_known())

    def apply_changes(self, changes: Sequence[Mapping[str, StateChange]],
                      rebase_share: float | None = None) -> bool:
        """Bring the live hash-map state forward by changelog deltas (each: state name
        -> (primary keys replaced, their entries now), this subtask's key groups), in
        order; the state as of the last one is the base of the next changes
        (``rebase_share`` as :meth:`track_changes` takes it). False,
        with nothing applied, if a delta names a state that is not registered here
        (or the backend is not the hash map). If it raises (a value that cannot be
        decoded), the live state is part way: discard this operator."""
        backend = self.backend
        queues = {EVENT_TIMERS: self.event_timers, PROCESSING_TIMERS: self.processing_timers}
        if not isinstance(backend, HashMapKeyedStateBackend) or not all(
            name in queues or backend.has_table(name) for delta in changes for name in delta
        ):
            return False
        for delta in changes:
            for name, (primaries, entries) in delta.items():
                queue = queues.get(name)
                if queue is not None:
                    queue.replace_entries(primaries, entries)
                else:
                    backend.replace_entries(name, primaries, entries)
        self.track_changes(rebase_share=rebase_share)
        return True

    def changed_share(self) -> float:
        """The share of the keyed state's keys written since changes were last taken
        (hash map with changes tracked, estimated when sampled; else 0): near 1, a
        changelog delta is about as large as the whole state."""
        if not isinstance(self.backend, HashMapKeyedStateBackend):
            return 0.0
        written, held = self.backend.change_counts()
        return written / held if held else 0.0

    def snapshot_changes(
        self, checkpoint_id: int, timestamp: int | None = None
    ) -> tuple[OperatorSubtaskSnapshot, dict[int, dict[str, Any]],
               dict[str, dict[bytes, bytes | None]]]:
        """A changelog snapshot: operator and broadcast state in full, keyed state as
        the changes since the last snapshot (``KeyedStateStore.changes``: by key group,
        and the states reported as the bytes written last; the snapshot's ``keyed``
        holds the state metadata and no entries)."""
        self._require_open()
        ts = self.clock() if timestamp is None else timestamp
        common = self._snapshot_common(checkpoint_id, ts)
        written: dict[str, dict[bytes, bytes | None]] = {}
        changes = self.keyed_state.changes({
            EVENT_TIMERS: self.event_timers.take_changes(),
            PROCESSING_TIMERS: self.processing_timers.take_changes(),
        }, written)
        cfg = self.config
        keyed = KeyedStateSnapshot(cfg.max_parallelism, cfg.key_group_range,
                                   self.keyed_state.metas, (EVENT_TIMERS, PROCESSING_TIMERS), {})
        return OperatorSubtaskSnapshot(
            cfg.uid, checkpoint_id, ts, cfg.parallelism, cfg.subtask_index,
            cfg.max_parallelism, keyed, **common,
        ), changes, written

    def prepare_materialization(self) -> Callable[[], KeyedStateSnapshot]:
        """Freeze the keyed state and timers now (no ``snapshot_state`` call); the
        result encodes them when called, off the processing path."""
        self._require_open()
        timers = {
            EVENT_TIMERS: self.event_timers.snapshot_entries(),
            PROCESSING_TIMERS: self.processing_timers.snapshot_entries(),
        }
        return self.keyed_state.prepare_snapshot(timers, self.config.key_group_range)
