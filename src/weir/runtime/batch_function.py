"""A :class:`~weir.KeyedBatchFunction` inside a keyed operator.

:class:`BatchFunctionAdapter` is the keyed function a :class:`KeyedOperator` runs for a
batch function: its ``open`` hands the function a :class:`KeyedBatchContext` over the
operator, and :meth:`BatchFunctionAdapter.process_batch` is what a runtime calls per
batch of records. The batch states read and write the operator's keyed state under the
same descriptors, so their entries and checkpoints are a per-record function's. Timers
go into the operator's timer queues; the operator fires due timers one by one through
the adapter's ``on_timer``, which gathers them, and a runtime calls
:meth:`BatchFunctionAdapter.fire_timers` after each advance of event or processing time
to pass them to the function's ``on_timers`` together.

The batch states (:class:`~weir.runtime.batch_state.BatchStateView`) read and write
the state's tables for many keys at once (:mod:`weir.runtime.batch_state`).

A :class:`~weir.KeyedBroadcastBatchFunction` runs in a
:class:`BroadcastBatchFunctionAdapter`, which is a
:class:`~weir.KeyedBroadcastProcessFunction` too: the operator passes it broadcast
elements as it passes them a per-record function (``process_broadcast_element``), and
its outputs are Arrow, as ``process_batch``'s. :func:`adapter_for` picks the adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from weir.api.batch import (
    BatchAppendingState,
    BatchListState,
    BatchMapState,
    BatchValueState,
    KeyedBatchContext,
    KeyedBatchFunction,
    KeyedBroadcastBatchFunction,
)
from weir.api.context import BroadcastContext, Instant, KeyedContext, TimeDomain
from weir.api.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from weir.api.functions import KeyedBroadcastProcessFunction, KeyedProcessFunction
from weir.errors import ConfigurationError
from weir.runtime.batch_state import (
    BatchAppendingView,
    BatchListView,
    BatchMapView,
    BatchStateView,
    pylist,
)

if TYPE_CHECKING:
    from weir.api.batch import BatchOutput, Keys

__all__ = ["BatchFunctionAdapter", "BroadcastBatchFunctionAdapter", "adapter_for",
           "rejected_rows"]

class _BatchContext(KeyedBatchContext):
    def __init__(self, op: Any, rejects: bool) -> None:
        self._op = op
        #: the batch's keys, or a function that makes them (on first use)
        self.batch_keys: Keys | Callable[[], Keys] = []
        #: the domain of the timers ``on_timers`` gets, while it runs
        self.firing: TimeDomain | None = None
        #: whether the function declares ``rejects_records``
        self.rejects = rejects
        #: the rows of the batch ``process_batch`` has (None: not in process_batch)
        self.rows: int | None = None
        #: (row, reason) of the rows rejected by this call
        self.rejected: list[tuple[int, str]] = []

    @property
    def keys(self) -> Keys:
        if callable(self.batch_keys):
            self.batch_keys = self.batch_keys()
        return self.batch_keys

    def reject(self, rows: Any, reason: str | Sequence[str]) -> None:
        where = self._op.config.describe()
        if not self.rejects:
            raise ConfigurationError(
                f"{where}: reject needs a KeyedBatchFunction that declares "
                f"rejects_records = True (so that the job keeps dead letters for it)")
        if self.rows is None:
            raise ConfigurationError(f"{where}: reject is for the rows of process_batch")
        indices = _row_indices(rows, self.rows, where)
        reasons = [reason] * len(indices) if isinstance(reason, str) else list(reason)
        if len(reasons) != len(indices):
            raise ValueError(f"{where}: {len(reasons)} reasons for {len(indices)} rows")
        seen, twice = {i for i, _ in self.rejected}, set()
        for i in indices:
            if i in seen:
                twice.add(i)
            seen.add(i)
        if twice:
            raise ValueError(f"{where}: rows {sorted(twice)} rejected twice in one batch")
        self.rejected += zip(indices, map(str, reasons), strict=True)

    def get_state(self, descriptor: ValueStateDescriptor[Any]) -> BatchValueState[Any]:
        self._check(descriptor, ValueStateDescriptor, "get_state")
        return BatchStateView(self._op, self._op.get_state(descriptor), descriptor)

    def get_list_state(self, descriptor: ListStateDescriptor[Any]) -> BatchListState[Any]:
        self._check(descriptor, ListStateDescriptor, "get_list_state")
        return BatchListView(self._op, self._op.get_state(descriptor), descriptor)

    def get_map_state(self, descriptor: MapStateDescriptor[Any, Any]
                      ) -> BatchMapState[Any, Any]:
        self._check(descriptor, MapStateDescriptor, "get_map_state")
        return BatchMapView(self._op, self._op.get_state(descriptor), descriptor)

    def get_reducing_state(self, descriptor: ReducingStateDescriptor[Any]
                           ) -> BatchAppendingState[Any]:
        self._check(descriptor, ReducingStateDescriptor, "get_reducing_state")
        return BatchAppendingView(self._op, self._op.get_state(descriptor), descriptor.name)

    def get_aggregating_state(self, descriptor: AggregatingStateDescriptor[Any, Any, Any]
                              ) -> BatchAppendingState[Any]:
        self._check(descriptor, AggregatingStateDescriptor, "get_aggregating_state")
        return BatchAppendingView(self._op, self._op.get_state(descriptor), descriptor.name)

    def get_broadcast_state(self, descriptor: MapStateDescriptor[Any, Any]) -> Any:
        if not isinstance(self._op.function, BroadcastBatchFunctionAdapter):
            raise ConfigurationError(
                f"{self._op.config.describe()}: get_broadcast_state is for a "
                f"KeyedBroadcastBatchFunction connected to a broadcast input")
        return self._op.get_broadcast_state(descriptor)

    def _check(self, descriptor: Any, kind: type, getter: str) -> None:
        if type(descriptor) is not kind and not isinstance(descriptor, kind):
            raise ConfigurationError(
                f"{self._op.config.describe()}: {getter} takes a {kind.__name__}, got "
                f"{type(descriptor).__name__} {getattr(descriptor, 'name', '')!r} (a "
                f"KeyedBatchFunction's getters: get_state, get_list_state, get_map_state, "
                f"get_reducing_state, get_aggregating_state)")

    def _timers(self, keys: Keys, timestamps: Any, act: Callable[[int, bytes], None]) -> None:
        times = pylist(timestamps)
        ctx = self._op.key_context
        try:
            prefixed = ctx.prefixed_keys(pylist(keys))
        finally:
            ctx.clear()
        if len(prefixed) != len(times):
            raise ValueError(f"{len(prefixed)} keys with {len(times)} timer timestamps")
        for key, at in zip(prefixed, times, strict=True):
            act(int(at), key)

    def register_event_time_timers(self, keys: Keys, timestamps: Any) -> None:
        self._timers(keys, timestamps, self._op.event_timers.register)

    def register_processing_time_timers(self, keys: Keys, timestamps: Any) -> None:
        self._timers(keys, timestamps, self._op.processing_timers.register)

    def delete_event_time_timers(self, keys: Keys, timestamps: Any) -> None:
        self._timers(keys, timestamps, self._op.event_timers.delete)

    def delete_processing_time_timers(self, keys: Keys, timestamps: Any) -> None:
        self._timers(keys, timestamps, self._op.processing_timers.delete)

    @property
    def time_domain(self) -> TimeDomain | None:
        return self.firing

    @property
    def subtask_index(self) -> int:
        return self._op.subtask_index  # type: ignore[no-any-return]

    @property
    def parallelism(self) -> int:
        return self._op.parallelism  # type: ignore[no-any-return]

    @property
    def current_processing_time(self) -> Instant:
        return Instant(self._op.clock())

    @property
    def current_watermark(self) -> Instant:
        return Instant(self._op.watermark)


class BatchFunctionAdapter(KeyedProcessFunction[Any, Any]):
    """The keyed function a keyed operator runs for ``function``: a runtime calls
    :meth:`process_batch`, never ``process_element``."""

    def __init__(self, function: KeyedBatchFunction) -> None:
        if not isinstance(function, KeyedBatchFunction):
            raise ConfigurationError(
                f"expected a KeyedBatchFunction, got {type(function).__name__}")
        self.function = function
        self._ctx: _BatchContext | None = None
        #: (key, timestamp, domain) of timers fired and not yet passed to on_timers
        self._fired: list[tuple[Any, int, TimeDomain | None]] = []

    def open(self, ctx: KeyedContext) -> None:
        self._ctx = _BatchContext(ctx, bool(getattr(self.function, "rejects_records", False)))
        self.function.open(self._ctx)

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> Iterable[Any] | None:
        """The operator fires due timers one by one: gathered for :meth:`fire_timers`."""
        self._fired.append((ctx.current_key, timestamp, ctx.time_domain))
        return None

    @property
    def fired_until(self) -> int | None:
        """The latest time of the timers fired and not yet passed (None: none)."""
        return max((t for _, t, _ in self._fired), default=None)

    def fire_timers(self) -> list[pa.RecordBatch | pa.Table]:
        """``on_timers`` of the timers fired since the last call (one domain: a
        runtime calls this after each advance of event or processing time)."""
        fired, self._fired = self._fired, []
        if not fired:
            return []
        ctx = self._ctx
        if ctx is None:  # (the operator fires timers only once it is open)
            raise ConfigurationError("fire_timers before open")
        ctx.batch_keys = [key for key, _, _ in fired]
        ctx.firing = fired[0][2]
        try:
            result = self.function.on_timers(pa.array([t for _, t, _ in fired], pa.int64()), ctx)
        finally:
            ctx.batch_keys = []
            ctx.firing = None
            ctx._op.key_context.clear()
        return _outputs(result)

    def process_element(self, value: Any, ctx: KeyedContext) -> Iterable[Any] | None:
        raise ConfigurationError(
            f"{type(self.function).__name__} is a KeyedBatchFunction: it processes batches "
            f"(process_batch), on a runtime that passes them"
        )

    def close(self) -> None:
        self.function.close()

    def process_batch(self, batch: pa.RecordBatch, keys: Keys | Callable[[], Keys]
                      ) -> list[pa.RecordBatch | pa.Table]:
        """The function's outputs for ``batch``, whose records have ``keys`` (or the
        keys a function makes, called only if the function reads ``ctx.keys``)."""
        ctx = self._ctx
        if ctx is None:
            raise ConfigurationError("process_batch before open")
        ctx.batch_keys = keys
        ctx.rows, ctx.rejected = batch.num_rows, []
        op = ctx._op
        try:
            result: BatchOutput = self.function.process_batch(batch, ctx)
        finally:
            ctx.batch_keys = []
            ctx.rows = None
            op.key_context.clear()
        if op.keyed_state.record_cleaners:
            op.keyed_state.on_record()
        return _outputs(result)


    def rejected(self) -> list[tuple[int, str]]:
        """(row, reason) of each row of its batch the last ``process_batch`` rejected,
        in the order rejected (each runtime makes its records of them, as it makes the
        records of its other dead letters)."""
        ctx = self._ctx
        if ctx is None or not ctx.rejected:
            return []
        rejected, ctx.rejected = ctx.rejected, []
        return rejected


class BroadcastBatchFunctionAdapter(BatchFunctionAdapter,
                                    KeyedBroadcastProcessFunction[Any, Any, Any]):
    """:class:`BatchFunctionAdapter` for a :class:`~weir.KeyedBroadcastBatchFunction`:
    also the keyed broadcast function the operator passes broadcast elements to."""

    function: KeyedBroadcastBatchFunction

    def __init__(self, function: KeyedBroadcastBatchFunction) -> None:
        super().__init__(function)

    def process_broadcast_element(self, value: Any, ctx: BroadcastContext
                                  ) -> list[pa.RecordBatch | pa.Table]:
        """The function's outputs (Arrow) for one broadcast element."""
        return _outputs(self.function.process_broadcast_element(value, ctx))


def rejected_rows(batch: pa.RecordBatch, rejected: list[tuple[int, str]]) -> pa.RecordBatch:
    """The rows of ``batch`` that ``rejected`` (``BatchFunctionAdapter.rejected``) names,
    in its order."""
    return batch.take(pa.array([i for i, _ in rejected], pa.int64()))


def _row_indices(rows: Any, count: int, where: str) -> list[int]:
    """The row indices ``rows`` names in a batch of ``count`` rows: indices, or a mask
    of ``count`` booleans (Python's or NumPy's; a null is an error)."""
    given = pylist(rows)
    if None in given:
        raise ValueError(f"{where}: the rows to reject include a null (a mask over a "
                         f"nullable column: fill its nulls first)")
    kinds = {type(r) for r in given}
    if kinds & {bool, np.bool_}:
        if not kinds <= {bool, np.bool_}:
            raise ValueError(f"{where}: rows to reject mix booleans and indices: give a "
                             f"mask or row indices")
        if len(given) != count:
            raise ValueError(f"{where}: a mask of {len(given)} rows for a batch of {count}")
        return [i for i, r in enumerate(given) if r]
    indices = [int(r) for r in given]
    if any(not 0 <= i < count for i in indices):
        raise IndexError(f"{where}: rows {indices} are not all rows of a batch of {count}")
    return indices


def adapter_for(function: KeyedBatchFunction) -> BatchFunctionAdapter:
    """The adapter a keyed operator runs ``function`` in."""
    if isinstance(function, KeyedBroadcastBatchFunction):
        return BroadcastBatchFunctionAdapter(function)
    return BatchFunctionAdapter(function)


def _outputs(result: BatchOutput) -> list[pa.RecordBatch | pa.Table]:
    if result is None:
        return []
    if isinstance(result, pa.RecordBatch | pa.Table):
        return [result]
    return list(result)
