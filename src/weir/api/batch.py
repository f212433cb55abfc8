"""Keyed functions that take a batch of records per call (columnar processing).

A :class:`KeyedBatchFunction` gets a ``pyarrow.RecordBatch`` of the records of one
subtask, in input order (all keys of the subtask mixed), and reads and writes the
state of many keys in one call each: ``state.get(keys)`` is an Arrow array with a
null where a key has no value, ``state.put(keys, values)`` and ``state.delete(keys)``
write them. The state is the same keyed state a :class:`~weir.KeyedProcessFunction`
keeps under the same descriptor (same entries, same checkpoints), so a savepoint of one
restores into the other when the descriptors agree. Outputs are Arrow batches in the
stage's output schema.

Within a call, ``put`` of a key given twice keeps the last value; a later call sees
everything earlier calls wrote. List, map, reducing and aggregating state work the same
way (:class:`BatchListState`, :class:`BatchMapState`, :class:`BatchAppendingState`).
Timers are registered from arrays of keys and times (``ctx.register_event_time_timers``);
the timers due when time advances reach ``on_timers`` together. An exception of
``process_batch`` fails the batch; a function that declares ``rejects_records`` sends
the rows it cannot process to the operator's dead letters instead
(``ctx.reject(rows, reason)``), and the job goes on.

A :class:`KeyedBroadcastBatchFunction` also takes a broadcast input, one element at a
time (``process_broadcast_element``, broadcast state writable, as a
:class:`~weir.KeyedBroadcastProcessFunction`'s); its batches read the broadcast state
(``ctx.get_broadcast_state``, read-only). The keyed records that arrived before a
broadcast element are processed before it, so each batch sees the broadcast state a
per-record function would have seen for each of its records.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeAlias, TypeVar

from weir.api.context import BroadcastContext, Instant, TimeDomain
from weir.api.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)

if TYPE_CHECKING:  # (``import weir`` imports no pyarrow: the Spark daemon sets up its
    # allocator before it does)
    import pyarrow as pa

    from weir.api.state import ReadOnlyBroadcastState

    #: keys as a batch function passes them: an Arrow array (one key column) or a
    #: sequence of Python keys (tuples for several key columns)
    Keys: TypeAlias = pa.Array | pa.ChunkedArray | Sequence[Any]
    #: what ``process_batch`` returns: a batch or table in the output schema, several,
    #: or None
    BatchOutput: TypeAlias = (pa.RecordBatch | pa.Table | Iterable[pa.RecordBatch | pa.Table]
                              | None)

__all__ = ["BatchAppendingState", "BatchListState", "BatchMapState", "BatchValueState",
           "KeyedBatchContext", "KeyedBatchFunction", "KeyedBroadcastBatchFunction"]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


class BatchValueState(ABC, Generic[T]):
    """One value per key, read and written for many keys at once."""

    @abstractmethod
    def get(self, keys: Keys, type: pa.DataType | None = None) -> pa.Array:
        """The values of ``keys`` in order, null where a key has none. The array's type
        is ``type``, else the descriptor's (int, float, str, bytes serializers), else
        inferred from the values."""

    @abstractmethod
    def put(self, keys: Keys, values: pa.Array | pa.ChunkedArray | Sequence[T]) -> None:
        """Set the value of each key (a key given twice keeps the last); a null value
        deletes the key's value."""

    @abstractmethod
    def delete(self, keys: Keys) -> None:
        """Remove the values of ``keys``."""


class BatchListState(ABC, Generic[T]):
    """A list of values per key, read and appended for many keys at once."""

    @abstractmethod
    def get(self, keys: Keys, type: pa.DataType | None = None) -> pa.Array:
        """Each key's list, in order, as an Arrow list array (an empty list where a key
        has none). The items' type is ``type``, else the descriptor's (int, float, str,
        bytes serializers), else inferred from the values."""

    @abstractmethod
    def add(self, keys: Keys, values: pa.Array | pa.ChunkedArray | Sequence[T]) -> None:
        """Append each value to the list of the key beside it, in order: a key given
        several times gets each of its values, in the order given."""

    @abstractmethod
    def update(self, keys: Keys, lists: pa.Array | pa.ChunkedArray | Sequence[Any]) -> None:
        """Replace each key's list with the list beside it (empty or null: no list; a
        key given twice keeps the last)."""

    @abstractmethod
    def delete(self, keys: Keys) -> None:
        """Remove the lists of ``keys``."""


class BatchMapState(ABC, Generic[K, V]):
    """A map per key, its entries read and written for many (key, user key) pairs at
    once."""

    @abstractmethod
    def get(self, keys: Keys, user_keys: Keys, type: pa.DataType | None = None
            ) -> pa.Array:
        """The value of each key's entry ``user_keys[i]``, null where it has none
        (typed as :meth:`BatchValueState.get` types values)."""

    @abstractmethod
    def put(self, keys: Keys, user_keys: Keys,
            values: pa.Array | pa.ChunkedArray | Sequence[V]) -> None:
        """Set each key's entry at the user key beside it (a pair given twice keeps
        the last value; a null value removes the entry)."""

    @abstractmethod
    def contains(self, keys: Keys, user_keys: Keys) -> pa.Array:
        """Whether each key has an entry at the user key beside it (a boolean array)."""

    @abstractmethod
    def delete(self, keys: Keys) -> None:
        """Remove the whole map of each of ``keys``."""


class BatchAppendingState(ABC, Generic[T]):
    """A reducing or aggregating state, values added and results read for many keys at
    once."""

    @abstractmethod
    def add(self, keys: Keys, values: pa.Array | pa.ChunkedArray | Sequence[Any]) -> None:
        """Add each value to the state of the key beside it, in order (a key given
        several times takes each of its values, in the order given)."""

    @abstractmethod
    def get(self, keys: Keys, type: pa.DataType | None = None) -> pa.Array:
        """Each key's result (reduced value, or the aggregate's result), null where a
        key has none (typed as :meth:`BatchValueState.get` types values)."""

    @abstractmethod
    def delete(self, keys: Keys) -> None:
        """Clear the state of ``keys``."""


class KeyedBatchContext(ABC):
    """What a :class:`KeyedBatchFunction` sees of its subtask."""

    @property
    @abstractmethod
    def keys(self) -> Keys:
        """In ``process_batch``: the key of each record, in the batch's row order; in
        ``on_timers``: the key of each timer, beside its timestamp. A key is a Python
        value as weir keys records (a tuple for several key columns). Empty otherwise."""

    @abstractmethod
    def reject(self, rows: Any, reason: str | Sequence[str]) -> None:
        """In ``process_batch`` of a function that declares ``rejects_records``: send
        ``rows`` of the batch to the operator's dead letters with ``reason`` (one for
        all, or one per row), as a per-record function's bad records go — each row as
        its record (as the runtime's other dead letters hold records), exactly-once with
        the batch. ``rows``: row indices (a sequence or array of ints, each once) or a
        boolean mask of the batch's length (no nulls). The state the call wrote for them
        stays; leave them out of the outputs."""

    @abstractmethod
    def get_state(self, descriptor: ValueStateDescriptor[T]) -> BatchValueState[T]:
        """The keyed value state of ``descriptor`` (register it in ``open``)."""

    @abstractmethod
    def get_list_state(self, descriptor: ListStateDescriptor[T]) -> BatchListState[T]:
        """The keyed list state of ``descriptor`` (register it in ``open``)."""

    @abstractmethod
    def get_map_state(self, descriptor: MapStateDescriptor[K, V]) -> BatchMapState[K, V]:
        """The keyed map state of ``descriptor`` (register it in ``open``)."""

    @abstractmethod
    def get_reducing_state(self, descriptor: ReducingStateDescriptor[T]
                           ) -> BatchAppendingState[T]:
        """The keyed reducing state of ``descriptor`` (register it in ``open``)."""

    @abstractmethod
    def get_aggregating_state(self, descriptor: AggregatingStateDescriptor[Any, Any, Any]
                              ) -> BatchAppendingState[Any]:
        """The keyed aggregating state of ``descriptor`` (register it in ``open``)."""

    @abstractmethod
    def get_broadcast_state(self, descriptor: MapStateDescriptor[K, V]
                            ) -> ReadOnlyBroadcastState[K, V]:
        """Read-only broadcast state (a :class:`KeyedBroadcastBatchFunction`'s, declared
        by the broadcast input it is connected to)."""

    @abstractmethod
    def register_event_time_timers(self, keys: Keys, timestamps: Any) -> None:
        """A timer for each key at the event time beside it (epoch ms; an Arrow array,
        a NumPy array or a sequence); a key's timer at a time it already has is one."""

    @abstractmethod
    def register_processing_time_timers(self, keys: Keys, timestamps: Any) -> None:
        """A processing-time timer for each key at the time beside it (epoch ms)."""

    @abstractmethod
    def delete_event_time_timers(self, keys: Keys, timestamps: Any) -> None:
        """Remove each key's event-time timer at the time beside it (if any)."""

    @abstractmethod
    def delete_processing_time_timers(self, keys: Keys, timestamps: Any) -> None:
        """Remove each key's processing-time timer at the time beside it (if any)."""

    @property
    @abstractmethod
    def time_domain(self) -> TimeDomain | None:
        """In ``on_timers``: the domain of the timers firing; else None."""

    @property
    @abstractmethod
    def subtask_index(self) -> int:
        """This subtask's index."""

    @property
    @abstractmethod
    def parallelism(self) -> int:
        """The operator's parallelism."""

    @property
    @abstractmethod
    def current_processing_time(self) -> Instant:
        """Processing time now (epoch ms): a micro-batch's timestamp on Spark."""

    @property
    @abstractmethod
    def current_watermark(self) -> Instant:
        """The event-time watermark (epoch ms)."""


class KeyedBatchFunction(ABC):
    """A keyed function that processes a batch of records per call, with keyed value
    state read and written for many keys at once (:class:`BatchValueState`)."""

    rejects_records: ClassVar[bool] = False
    """True: ``process_batch`` may send rows to the dead letters
    (:meth:`KeyedBatchContext.reject`) — the job's checkpoint storage, or the
    ``dead_letters`` sink given to ``process`` on the continuous runtime."""

    def open(self, ctx: KeyedBatchContext) -> None:
        """Called once before the first batch; register state here."""
        return None

    @abstractmethod
    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> BatchOutput:
        """Process the records of ``batch`` (their keys: ``ctx.keys``); return the
        outputs as Arrow in the stage's output schema, or None."""

    def on_timers(self, timestamps: pa.Array, ctx: KeyedBatchContext) -> BatchOutput:
        """The timers due when event time or processing time advances, all of one
        domain (``ctx.time_domain``), in the order they fire: their times, and their
        keys in ``ctx.keys``. A timer registered here at a time already passed fires
        at the next advance (a micro-batch: the next batch)."""
        return None

    def close(self) -> None:
        """Called once after the last batch."""
        return None


class KeyedBroadcastBatchFunction(KeyedBatchFunction):
    """A :class:`KeyedBatchFunction` that also receives a broadcast stream: broadcast
    elements one at a time may change broadcast state; batches of keyed records read it
    (``ctx.get_broadcast_state``). Connect it as a
    :class:`~weir.KeyedBroadcastProcessFunction` is connected (``key_by(...).connect(
    stream.broadcast(descriptors))`` on the continuous runtime, ``broadcast=`` on
    Spark)."""

    @abstractmethod
    def process_broadcast_element(self, value: Any, ctx: BroadcastContext) -> BatchOutput:
        """Process one broadcast element (broadcast state writable through
        ``ctx.get_broadcast_state``; keyed state through ``ctx.apply_to_keyed_state``);
        return outputs as Arrow in the stage's output schema, or None."""
