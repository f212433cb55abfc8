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

:class:`_BatchValueState` reads and writes key by key through the state's own table
(every backend, TTL included), except the hash map's plain value state, which it
reads and writes as one dict operation over the keys' prefixed bytes (the same
entries, the same write check and change tracking as ``ValueState.update``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from weir.api.batch import BatchValueState, KeyedBatchContext, KeyedBatchFunction
from weir.api.context import Instant, KeyedContext, TimeDomain
from weir.api.descriptors import ValueStateDescriptor
from weir.api.functions import KeyedProcessFunction
from weir.api.serializers import BytesSerializer, FloatSerializer, IntSerializer, StrSerializer
from weir.errors import ConfigurationError, StateError
from weir.state.hashmap_tables import HashMapValueTable

if TYPE_CHECKING:
    from weir.api.batch import BatchOutput, Keys

__all__ = ["BatchFunctionAdapter"]

_ARROW_TYPES: dict[type, pa.DataType] = {
    IntSerializer: pa.int64(), FloatSerializer: pa.float64(), StrSerializer: pa.string(),
    BytesSerializer: pa.binary(),
}


def _pylist(values: Any) -> list[Any]:
    """Python values of an Arrow array, a NumPy array (``tolist``: Python ints, not
    NumPy scalars, reach the state) or any sequence."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.to_pylist()  # type: ignore[no-any-return]
    if isinstance(values, list):
        return values
    tolist = getattr(values, "tolist", None)
    return tolist() if callable(tolist) else list(values)


class _BatchValueState(BatchValueState[Any]):
    def __init__(self, op: Any, state: Any, descriptor: ValueStateDescriptor[Any]) -> None:
        self._op = op
        self._state = state
        self._name = descriptor.name
        self._type = _ARROW_TYPES.get(type(descriptor.serializer))
        # the hash map's plain value state: one dict operation over the keys
        self._table = state if type(state) is HashMapValueTable else None
        #: the Arrow keys of the last call, their Python values and prefixed bytes
        self._last: tuple[Any, list[Any], list[bytes]] | None = None

    def _prefixed(self, keys: list[Any]) -> list[bytes]:
        """Each key's prefixed bytes (checked: a key of this subtask's key groups)."""
        ctx = self._op.key_context
        try:
            return ctx.prefixed_keys(keys)  # type: ignore[no-any-return]
        finally:
            ctx.clear()

    def _keys(self, keys: Any) -> tuple[list[Any], list[bytes] | None]:
        """``keys`` as Python values, and their prefixed bytes when the hash map's path
        needs them: an Arrow array (immutable) given again, as a ``get`` and then a
        ``put`` of the same keys do, reuses the last call's."""
        if self._table is None:
            return _pylist(keys), None
        last = self._last
        if last is not None and last[0] is keys:
            return last[1], last[2]
        values = _pylist(keys)
        prefixed = self._prefixed(values)
        self._last = ((keys, values, prefixed) if isinstance(keys, pa.Array | pa.ChunkedArray)
                      else None)
        return values, prefixed

    def get(self, keys: Keys, type: pa.DataType | None = None) -> pa.Array:
        keys, prefixed = self._keys(keys)
        if self._table is not None and prefixed is not None:
            values = list(map(self._table._data.get, prefixed))
        else:
            values = self._each(keys, lambda: self._state.value())
        kind = type or self._type
        try:
            return pa.array(values, type=kind)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
            raise StateError(
                f"state {self._name!r}: its values do not make one Arrow array ({exc}); "
                f"pass get(keys, type=...)"
            ) from None

    def put(self, keys: Keys, values: pa.Array | pa.ChunkedArray | Sequence[Any]) -> None:
        keys, prefixed = self._keys(keys)
        values = _pylist(values)
        if len(keys) != len(values):
            raise ValueError(f"state {self._name!r}: put of {len(keys)} keys with "
                             f"{len(values)} values")
        table = self._table
        if table is None:
            state = self._state
            try:
                for key, value in zip(keys, values, strict=True):
                    self._at(key)
                    if value is None:
                        state.clear()
                    else:
                        state.update(value)
            finally:
                self._op.key_context.clear()
            return
        assert prefixed is not None
        if None in values:  # a null deletes, as update(None) does; each key's last counts
            last = dict(zip(prefixed, values, strict=True))
            self._remove([k for k, v in last.items() if v is None])
            prefixed = [k for k, v in last.items() if v is not None]
            values = [last[k] for k in prefixed]
        check, ok = table._check, table._ok
        for kind in set(map(type, values)) - ok:  # the write check, once per new type
            check(next(v for v in values if type(v) is kind))
        table._data.update(zip(prefixed, values, strict=True))
        self._mark(prefixed)

    def delete(self, keys: Keys) -> None:
        keys, prefixed = self._keys(keys)
        if prefixed is None:
            try:
                for key in keys:
                    self._at(key)
                    self._state.clear()
            finally:
                self._op.key_context.clear()
            return
        self._remove(prefixed)

    # helpers ---------------------------------------------------------------------------
    def _at(self, key: Any) -> None:
        self._op.key_context.set_current_key(key)

    def _each(self, keys: list[Any], read: Any) -> list[Any]:
        out: list[Any] = []
        try:
            for key in keys:
                self._at(key)
                out.append(read())
        finally:
            self._op.key_context.clear()
        return out

    def _remove(self, prefixed: list[bytes]) -> None:
        assert self._table is not None
        pop = self._table._data.pop
        for key in prefixed:
            pop(key, None)
        self._mark(prefixed)

    def _mark(self, prefixed: list[bytes]) -> None:
        """Record the writes as ``ValueState.update`` does (``HashMapTable._mark``)."""
        table = self._table
        assert table is not None
        dirty = table._dirty
        if dirty is None:
            return
        table._writes += len(prefixed)
        mask = table._sample_mask
        dirty.update(prefixed if not mask else (k for k in prefixed if not hash(k) & mask))


class _BatchContext(KeyedBatchContext):
    def __init__(self, op: Any) -> None:
        self._op = op
        #: the batch's keys, or a function that makes them (on first use)
        self.batch_keys: Keys | Callable[[], Keys] = []
        #: the domain of the timers ``on_timers`` gets, while it runs
        self.firing: TimeDomain | None = None

    @property
    def keys(self) -> Keys:
        if callable(self.batch_keys):
            self.batch_keys = self.batch_keys()
        return self.batch_keys

    def get_state(self, descriptor: ValueStateDescriptor[Any]) -> BatchValueState[Any]:
        if not isinstance(descriptor, ValueStateDescriptor):
            raise ConfigurationError(
                f"{self._op.config.describe()}: a KeyedBatchFunction keeps ValueState only "
                f"for now, got {type(descriptor).__name__} {getattr(descriptor, 'name', '')!r}"
            )
        return _BatchValueState(self._op, self._op.get_state(descriptor), descriptor)

    def _timers(self, keys: Keys, timestamps: Any, act: Callable[[int, bytes], None]) -> None:
        times = _pylist(timestamps)
        ctx = self._op.key_context
        try:
            prefixed = ctx.prefixed_keys(_pylist(keys))
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
        self._ctx = _BatchContext(ctx)
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
        op = ctx._op
        try:
            result: BatchOutput = self.function.process_batch(batch, ctx)
        finally:
            ctx.batch_keys = []
            op.key_context.clear()
        if op.keyed_state.record_cleaners:
            op.keyed_state.on_record()
        return _outputs(result)


def _outputs(result: BatchOutput) -> list[pa.RecordBatch | pa.Table]:
    if result is None:
        return []
    if isinstance(result, pa.RecordBatch | pa.Table):
        return [result]
    return list(result)
