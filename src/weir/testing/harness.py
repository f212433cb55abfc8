"""Harness implementations; see :mod:`weir.testing`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pyarrow as pa

from weir.api.batch import KeyedBatchFunction
from weir.api.descriptors import MapStateDescriptor, StateDescriptor, StateKind
from weir.api.functions import (
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    ProcessFunction,
)
from weir.checkpoint.coordinator import CheckpointCoordinator, CompletedCheckpoint
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import ConfigurationError
from weir.runtime.batch_function import BatchFunctionAdapter, adapter_for, rejected_rows
from weir.runtime.checkpointer import SnapshotMode, SubtaskCheckpointer
from weir.runtime.drivers import take_checkpoint, take_savepoint
from weir.runtime.operator import (
    KeyedOperator,
    NonKeyedOperator,
    OperatorConfig,
    StateBackendKind,
)
from weir.state.rocksdb import RocksDBMemory
from weir.state.snapshot import OperatorSubtaskSnapshot

__all__ = [
    "CheckpointedFunctionHarness",
    "KeyedBroadcastOperatorHarness",
    "KeyedOperatorHarness",
    "ManualClock",
]


class ManualClock:
    """A processing-time clock moved by hand (epoch milliseconds)."""

    def __init__(self, start_ms: int = 0) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def set(self, now_ms: int) -> None:
        """Jump to ``now_ms`` (never backwards)."""
        if now_ms < self.now_ms:
            raise ConfigurationError(
                f"ManualClock cannot go back in time ({self.now_ms} -> {now_ms})"
            )
        self.now_ms = now_ms

    def advance(self, delta_ms: int) -> int:
        """Move forward by ``delta_ms``; returns the new time."""
        self.set(self.now_ms + delta_ms)
        return self.now_ms


class _HarnessBase:
    _op: KeyedOperator | NonKeyedOperator
    _next_checkpoint_id: int

    def __enter__(self) -> Self:
        if not self._op._opened:
            self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open(self) -> None:
        """Open the operator (restored state first, then ``initialize_state``/``open``)."""
        self._op.open()

    def close(self) -> None:
        """Close the function and release its state backend."""
        for checkpointer in self.__dict__.get("_checkpointers", {}).values():
            checkpointer.close()
        self._op.close()

    def snapshot(self, checkpoint_id: int | None = None) -> OperatorSubtaskSnapshot:
        """Take a snapshot of this subtask (ids count up from 1 unless given), then
        run the background TTL cleanup as a runtime does once per checkpoint."""
        cid = self._next_checkpoint_id if checkpoint_id is None else checkpoint_id
        self._next_checkpoint_id = cid + 1
        snapshot = self._op.snapshot(cid)
        self._op.run_background_cleanup()
        return snapshot

    def checkpointer(
        self, storage: CheckpointStorage, mode: SnapshotMode | str = SnapshotMode.FULL
    ) -> SubtaskCheckpointer:
        """The checkpointer writing this subtask into ``storage`` (one per storage and
        mode, kept across checkpoints so incremental snapshots share files)."""
        key = (id(storage), SnapshotMode(mode))
        cache: dict[Any, SubtaskCheckpointer] = self.__dict__.setdefault("_checkpointers", {})
        if key not in cache:
            cache[key] = SubtaskCheckpointer(self._op, storage, mode=mode)
        return cache[key]

    def checkpoint(
        self, coordinator: CheckpointCoordinator, *, mode: SnapshotMode | str = "full"
    ) -> CompletedCheckpoint:
        """Take a durable checkpoint of this (single) subtask through ``coordinator``.
        For several subtasks use ``weir.take_checkpoint`` with each harness's
        :meth:`checkpointer` (and call each operator's ``run_background_cleanup``
        after it, as this method does)."""
        completed = take_checkpoint(coordinator, [self.checkpointer(coordinator.storage, mode)])
        self._op.run_background_cleanup()
        return completed

    def savepoint(
        self, coordinator: CheckpointCoordinator, target: str | Path | CheckpointStorage
    ) -> CompletedCheckpoint:
        """Write a savepoint of this (single) subtask into the directory ``target``,
        then run the background TTL cleanup (as after a checkpoint)."""
        completed = take_savepoint(coordinator, [self.checkpointer(coordinator.storage)], target)
        self._op.run_background_cleanup()
        return completed

    def operator_state_of(self, name: str) -> list[Any]:
        """The elements of an operator list state the function registered."""
        store = self._op.operator_state
        states = store._states if store is not None else {}
        if name not in states:
            raise KeyError(f"no operator state {name!r} registered; known: {sorted(states)}")
        return states[name].get()

    @property
    def operator(self) -> KeyedOperator | NonKeyedOperator:
        """The hosted operator (for runtimes and advanced tests)."""
        return self._op


def _clock_and_config(
    clock: Callable[[], int] | None, **config: Any
) -> tuple[Callable[[], int], OperatorConfig]:
    return (clock if clock is not None else ManualClock()), OperatorConfig(**config)


class KeyedOperatorHarness(_HarnessBase):
    """Runs one subtask of a :class:`~weir.KeyedProcessFunction`, or of a
    :class:`~weir.KeyedBatchFunction` (fed by :meth:`process_batch`).

    ``clock`` is the processing-time clock (a :class:`ManualClock` at 0 unless
    given); :meth:`advance_processing_time` moves a ManualClock and fires timers.
    A key whose key group belongs to another subtask raises
    :class:`~weir.errors.KeyGroupError`, as on a real subtask.
    """

    def __init__(
        self,
        function: KeyedProcessFunction[Any, Any] | KeyedBroadcastProcessFunction[Any, Any, Any]
        | KeyedBatchFunction,
        key_selector: Callable[[Any], Any],
        *,
        state_backend: StateBackendKind | str = "hashmap",
        max_parallelism: int = 128,
        parallelism: int = 1,
        subtask_index: int = 0,
        clock: Callable[[], int] | None = None,
        uid: str = "operator",
        rocksdb_path: str | Path | None = None,
        broadcast_state_descriptors: Iterable[MapStateDescriptor[Any, Any]] = (),
        rocksdb_memory: RocksDBMemory | None = None,
    ) -> None:
        self.clock, config = _clock_and_config(
            clock, uid=uid, state_backend=state_backend, max_parallelism=max_parallelism,
            parallelism=parallelism, subtask_index=subtask_index, rocksdb_path=rocksdb_path,
            rocksdb_memory=rocksdb_memory,
        )
        if isinstance(function, KeyedBatchFunction):
            function = adapter_for(function)
        self._op: KeyedOperator = KeyedOperator(
            function, key_selector, config, clock=self.clock,
            broadcast_state_descriptors=broadcast_state_descriptors,
        )
        self._next_checkpoint_id = 1
        #: (record, reason) of every row a batch function rejected (``ctx.reject``)
        self.rejected: list[tuple[Any, str]] = []

    @classmethod
    def restore(
        cls,
        function: Any,
        key_selector: Callable[[Any], Any],
        snapshots: Sequence[OperatorSubtaskSnapshot] | CompletedCheckpoint,
        *,
        parallelism: int,
        subtask_index: int,
        allow_non_restored_state: bool = False,
        open: bool = True,
        **kwargs: Any,
    ) -> Self:
        """A harness for subtask ``subtask_index`` of ``parallelism``, restored from
        the snapshots of every subtask of an earlier run (at any parallelism) or from
        a durable checkpoint or savepoint (``weir.load_checkpoint``,
        ``CheckpointCoordinator.latest``), and opened unless ``open=False``."""
        snapshots = _snapshots_of(
            snapshots, kwargs.get("uid", "operator"), parallelism, subtask_index,
            allow_non_restored_state,
        )
        kwargs.setdefault("max_parallelism", _max_parallelism_of(snapshots))
        harness = cls(
            function, key_selector, parallelism=parallelism, subtask_index=subtask_index,
            **kwargs,
        )
        harness._op.restore(snapshots, allow_non_restored_state=allow_non_restored_state)
        harness._next_checkpoint_id = max((s.checkpoint_id for s in snapshots), default=0) + 1
        if open:
            harness.open()
        return harness

    def process_element(self, value: Any, timestamp: int | None = None) -> list[Any]:
        """Feed one element; returns what the function emitted."""
        self._op._require_open()
        return self._op.process_element(value, timestamp)

    def process_batch(self, batch: pa.RecordBatch | pa.Table, keys: Sequence[Any] | None = None
                      ) -> list[pa.RecordBatch | pa.Table]:
        """Feed a batch to a :class:`~weir.KeyedBatchFunction` (its records' keys: ``keys``,
        else the key selector applied to each row as a dict); returns its outputs. The
        rows it rejects (``ctx.reject``) are appended to :attr:`rejected`, each as a
        ``dict`` of its columns."""
        self._op._require_open()
        adapter = self._op.function
        if not isinstance(adapter, BatchFunctionAdapter):
            raise ConfigurationError(
                f"process_batch needs a KeyedBatchFunction, got {type(adapter).__name__}")
        if isinstance(batch, pa.Table):
            batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else (
                pa.RecordBatch.from_pylist([], schema=batch.schema))
        if keys is None:
            keys = [self._op.key_selector(row) for row in batch.to_pylist()]
        out = adapter.process_batch(batch, list(keys))
        rejected = adapter.rejected()
        if rejected:  # (each row as a dict of its columns)
            rows = rejected_rows(batch, rejected).to_pylist()
            self.rejected += [(row, reason) for row, (_, reason) in zip(rows, rejected,
                                                                        strict=True)]
        return out

    def process_elements(self, values: Iterable[Any]) -> list[Any]:
        """Feed several elements (no timestamps); returns all outputs."""
        out: list[Any] = []
        for value in values:
            out.extend(self.process_element(value))
        return out

    def advance_watermark(self, watermark: int) -> list[Any]:
        """Move event time; returns outputs of the event-time timers that fired (a
        batch function's: the Arrow outputs of its ``on_timers``)."""
        self._op._require_open()
        return self._batch_timers(self._op.advance_watermark(watermark))

    def advance_processing_time(self, now_ms: int) -> list[Any]:
        """Move processing time to ``now_ms``; returns outputs of the timers that fired
        (a batch function's: the Arrow outputs of its ``on_timers``)."""
        self._op._require_open()
        if isinstance(self.clock, ManualClock):
            self.clock.set(now_ms)
        return self._batch_timers(self._op.advance_processing_time(now_ms))

    def _batch_timers(self, out: list[Any]) -> list[Any]:
        adapter = self._op.function
        return adapter.fire_timers() if isinstance(adapter, BatchFunctionAdapter) else out

    # inspection ---------------------------------------------------------------------
    def state_of(self, key: Any, descriptor: StateDescriptor) -> Any:
        """What the function would read from ``descriptor`` for ``key`` right now:
        a value, a list, a dict, or a reduced/aggregated result (None if absent)."""
        op = self._op
        op._require_open()
        saved = op.key_context.key_bytes
        state = op.keyed_state.get_state(descriptor)
        op.key_context.set_current_key(key)
        try:
            kind = descriptor.kind
            if kind is StateKind.VALUE:
                return state.value()
            if kind is StateKind.MAP:
                return dict(state.items())
            return state.get()
        finally:
            if isinstance(saved, bytes):
                op.key_context.set_current_prefixed_key(saved)
            else:
                op.key_context.clear()

    def keys(self, descriptor: StateDescriptor) -> list[Any]:
        """Keys of this subtask that have entries in ``descriptor``'s state."""
        from weir.state.keycontext import split_prefixed

        self._op.keyed_state.get_state(descriptor)
        return [split_prefixed(k)[1] for k in self._op.keyed_state.keys(descriptor.name)]

    def event_time_timers(self) -> list[tuple[int, Any]]:
        """Pending event-time timers as ``(timestamp, key)`` in firing order."""
        return self._timers(self._op.event_timers)

    def processing_time_timers(self) -> list[tuple[int, Any]]:
        """Pending processing-time timers as ``(timestamp, key)`` in firing order."""
        return self._timers(self._op.processing_timers)

    @staticmethod
    def _timers(queue: Any) -> list[tuple[int, Any]]:
        from weir.state.keycontext import split_prefixed

        return [(ts, split_prefixed(k)[1]) for ts, k in queue.timers()]

    @property
    def watermark(self) -> int:
        """The current event-time watermark."""
        return self._op.watermark

    def broadcast_state_of(self, descriptor: MapStateDescriptor[Any, Any]) -> dict[Any, Any]:
        """The entries of a declared broadcast state, as a dict."""
        self._op._require_open()
        assert self._op.broadcast is not None
        return dict(self._op.broadcast.read_only(descriptor).items())

    def compact_state(self) -> int:
        """Compact the state backend now with the RocksDB TTL compaction filter over
        all entries (unbounded, unlike the ``run_background_cleanup`` that snapshots
        and checkpoints trigger); returns the number of entries dropped."""
        return self._op.keyed_state.compact()


class KeyedBroadcastOperatorHarness(KeyedOperatorHarness):
    """Runs one subtask of a :class:`~weir.KeyedBroadcastProcessFunction`; declare
    its broadcast states with ``broadcast_state_descriptors``."""

    def process_broadcast_element(self, value: Any, timestamp: int | None = None) -> list[Any]:
        """Feed one element of the broadcast input."""
        self._op._require_open()
        return self._op.process_broadcast_element(value, timestamp)


class CheckpointedFunctionHarness(_HarnessBase):
    """Runs one subtask of a non-keyed :class:`~weir.ProcessFunction` that is also a
    :class:`~weir.CheckpointedFunction` (operator list / union list state)."""

    def __init__(
        self,
        function: ProcessFunction[Any, Any],
        *,
        max_parallelism: int = 128,
        parallelism: int = 1,
        subtask_index: int = 0,
        clock: Callable[[], int] | None = None,
        uid: str = "operator",
    ) -> None:
        self.clock, config = _clock_and_config(
            clock, uid=uid, max_parallelism=max_parallelism, parallelism=parallelism,
            subtask_index=subtask_index,
        )
        self._op: NonKeyedOperator = NonKeyedOperator(function, config, clock=self.clock)
        self._next_checkpoint_id = 1

    @classmethod
    def restore(
        cls,
        function: ProcessFunction[Any, Any],
        snapshots: Sequence[OperatorSubtaskSnapshot] | CompletedCheckpoint,
        *,
        parallelism: int,
        subtask_index: int,
        allow_non_restored_state: bool = False,
        open: bool = True,
        **kwargs: Any,
    ) -> Self:
        """A harness for subtask ``subtask_index`` of ``parallelism`` restored from the
        snapshots of every subtask of an earlier run, or from a durable checkpoint."""
        snapshots = _snapshots_of(
            snapshots, kwargs.get("uid", "operator"), parallelism, subtask_index,
            allow_non_restored_state,
        )
        kwargs.setdefault("max_parallelism", _max_parallelism_of(snapshots))
        harness = cls(function, parallelism=parallelism, subtask_index=subtask_index, **kwargs)
        harness._op.restore(snapshots, allow_non_restored_state=allow_non_restored_state)
        harness._next_checkpoint_id = max((s.checkpoint_id for s in snapshots), default=0) + 1
        if open:
            harness.open()
        return harness

    def process_element(self, value: Any, timestamp: int | None = None) -> list[Any]:
        """Feed one element; returns what the function emitted."""
        self._op._require_open()
        return self._op.process_element(value, timestamp)


def _snapshots_of(
    source: Sequence[OperatorSubtaskSnapshot] | CompletedCheckpoint,
    uid: str,
    parallelism: int,
    subtask_index: int,
    allow_non_restored_state: bool,
) -> Sequence[OperatorSubtaskSnapshot]:
    if not isinstance(source, CompletedCheckpoint):
        return source
    source.check_operators([uid], allow_non_restored_state)
    return source.load(uid, parallelism, subtask_index)


def _max_parallelism_of(snapshots: Sequence[OperatorSubtaskSnapshot]) -> int:
    return snapshots[0].max_parallelism if snapshots else 128
