"""Contexts handed to user functions: state access, timers, time, operator state."""

from __future__ import annotations

import enum
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar, overload

from weir.api.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from weir.api.state import (
    AggregatingState,
    BroadcastState,
    ListState,
    MapState,
    ReadOnlyBroadcastState,
    ReducingState,
    ValueState,
)

__all__ = [
    "Instant",
    "BroadcastContext",
    "Context",
    "FunctionInitializationContext",
    "FunctionSnapshotContext",
    "KeyedContext",
    "OperatorStateStore",
    "TimeDomain",
    "TimerService",
]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


class TimeDomain(enum.Enum):
    """Which clock a timer belongs to."""

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


class Instant(int):
    """A time in epoch milliseconds (an ``int``). ``current_watermark`` and
    ``current_processing_time`` were methods before issue 39 and are properties now
    (plain values are properties on every weir object); calling one still works for one
    release, with a :class:`DeprecationWarning`."""

    __slots__ = ()

    def __call__(self) -> int:
        warnings.warn("current_watermark() and current_processing_time() are properties "
                      "now: drop the parentheses", DeprecationWarning, stacklevel=2)
        return int(self)


class TimerService(ABC):
    """Timers of the current key, and the operator's notion of time (epoch ms)."""

    @property
    @abstractmethod
    def current_processing_time(self) -> Instant:
        """Processing time now, from the operator's clock."""

    @property
    @abstractmethod
    def current_watermark(self) -> Instant:
        """The current event-time watermark (``-2**63`` before the first one)."""

    @abstractmethod
    def register_event_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer`` for the current key once the watermark reaches ``timestamp``."""

    @abstractmethod
    def register_processing_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer`` for the current key once processing time reaches ``timestamp``."""

    @abstractmethod
    def delete_event_time_timer(self, timestamp: int) -> None:
        """Remove an event-time timer of the current key (no error if absent)."""

    @abstractmethod
    def delete_processing_time_timer(self, timestamp: int) -> None:
        """Remove a processing-time timer of the current key (no error if absent)."""


class Context(ABC):
    """What every function sees: its subtask and time."""

    @property
    @abstractmethod
    def subtask_index(self) -> int:
        """Index of this parallel instance."""

    @property
    @abstractmethod
    def parallelism(self) -> int:
        """Number of parallel instances."""

    @property
    @abstractmethod
    def timestamp(self) -> int | None:
        """Timestamp of the record (or timer) being processed, if it has one."""

    @property
    @abstractmethod
    def current_processing_time(self) -> Instant:
        """Processing time now (epoch ms)."""

    @property
    @abstractmethod
    def current_watermark(self) -> Instant:
        """The current watermark."""


class KeyedContext(Context):
    """The context of a keyed function: ``open``, ``process_element`` and ``on_timer``
    all receive it. State objects are bound to :attr:`current_key` at every call."""

    @overload
    def get_state(self, descriptor: ValueStateDescriptor[T]) -> ValueState[T]: ...
    @overload
    def get_state(self, descriptor: ListStateDescriptor[T]) -> ListState[T]: ...
    @overload
    def get_state(self, descriptor: MapStateDescriptor[K, V]) -> MapState[K, V]: ...
    @overload
    def get_state(self, descriptor: ReducingStateDescriptor[T]) -> ReducingState[T]: ...
    @overload
    def get_state(
        self, descriptor: AggregatingStateDescriptor[Any, Any, Any]
    ) -> AggregatingState[Any, Any]: ...
    @abstractmethod
    def get_state(self, descriptor: Any) -> Any:
        """The state of any descriptor, of the descriptor's kind (value state for a
        ``ValueStateDescriptor``, list state for a ``ListStateDescriptor``, ...).
        The typed getters below do the same and also check the descriptor's kind."""

    @abstractmethod
    def get_list_state(self, descriptor: ListStateDescriptor[T]) -> ListState[T]:
        """List state of ``descriptor``."""

    @abstractmethod
    def get_map_state(self, descriptor: MapStateDescriptor[K, V]) -> MapState[K, V]:
        """Map state of ``descriptor``."""

    @abstractmethod
    def get_reducing_state(self, descriptor: ReducingStateDescriptor[T]) -> ReducingState[T]:
        """Reducing state of ``descriptor``."""

    @abstractmethod
    def get_aggregating_state(
        self, descriptor: AggregatingStateDescriptor[Any, Any, Any]
    ) -> AggregatingState[Any, Any]:
        """Aggregating state of ``descriptor``."""

    @property
    @abstractmethod
    def current_key(self) -> Any:
        """The key of the record or timer being processed (None in ``open``)."""

    @property
    @abstractmethod
    def timer_service(self) -> TimerService:
        """Timers of the current key."""

    @property
    @abstractmethod
    def time_domain(self) -> TimeDomain | None:
        """In ``on_timer``: the firing timer's domain; otherwise None."""

    @abstractmethod
    def get_broadcast_state(
        self, descriptor: MapStateDescriptor[K, V]
    ) -> ReadOnlyBroadcastState[K, V]:
        """Read-only broadcast state (keyed broadcast functions only)."""


class BroadcastContext(Context):
    """The context of ``process_broadcast_element``: broadcast state is writable,
    keyed state is reachable only through :meth:`apply_to_keyed_state`."""

    @abstractmethod
    def get_broadcast_state(self, descriptor: MapStateDescriptor[K, V]) -> BroadcastState[K, V]:
        """Writable broadcast state."""

    @abstractmethod
    def apply_to_keyed_state(
        self, descriptor: Any, function: Callable[[Any, Any], None]
    ) -> None:
        """Call ``function(key, state)`` for every key of this subtask that has state
        ``descriptor``, with the state bound to that key."""


class OperatorStateStore(ABC):
    """Operator (non-keyed) state of a :class:`~weir.CheckpointedFunction`."""

    @abstractmethod
    def get_list_state(self, descriptor: ListStateDescriptor[T]) -> ListState[T]:
        """List state redistributed by even split on rescale."""

    @abstractmethod
    def get_union_list_state(self, descriptor: ListStateDescriptor[T]) -> ListState[T]:
        """List state of which every subtask receives all elements on restore."""


class FunctionInitializationContext(ABC):
    """Passed to :meth:`~weir.CheckpointedFunction.initialize_state`."""

    @property
    @abstractmethod
    def is_restored(self) -> bool:
        """Whether the operator is being restored from a snapshot."""

    @property
    @abstractmethod
    def operator_state_store(self) -> OperatorStateStore:
        """Where operator list state is registered."""


class FunctionSnapshotContext(ABC):
    """Passed to :meth:`~weir.CheckpointedFunction.snapshot_state`."""

    @property
    @abstractmethod
    def checkpoint_id(self) -> int:
        """Id of the checkpoint being taken."""

    @property
    @abstractmethod
    def checkpoint_timestamp(self) -> int:
        """When the checkpoint was triggered (epoch ms)."""
