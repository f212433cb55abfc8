"""State descriptors: a state's unique name, kind, serializer(s) and optional TTL.

Descriptors are frozen: :meth:`StateDescriptor.enable_time_to_live` returns a new
descriptor, so write ``desc = ValueStateDescriptor("count").enable_time_to_live(cfg)``
(or pass ``ttl=cfg``).
"""

from __future__ import annotations

import dataclasses
import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar

from weir.api.serializers import MsgpackSerializer, Serializer
from weir.api.ttl import StateTtlConfig
from weir.errors import ConfigurationError

__all__ = [
    "AggregateFunction",
    "AggregatingStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "StateKind",
    "ValueStateDescriptor",
]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
IN = TypeVar("IN")
ACC = TypeVar("ACC")
OUT = TypeVar("OUT")

#: Names starting with this prefix are weir's own (timers, internal bookkeeping).
RESERVED_PREFIX = "__weir"

DEFAULT_SERIALIZER: Serializer[Any] = MsgpackSerializer()


class StateKind(enum.Enum):
    """The kind of a keyed state; stored with every snapshot."""

    VALUE = "value"
    LIST = "list"
    MAP = "map"
    REDUCING = "reducing"
    AGGREGATING = "aggregating"


class AggregateFunction(ABC, Generic[IN, ACC, OUT]):
    """Incremental aggregation for :class:`AggregatingStateDescriptor` (Flink's
    ``AggregateFunction``)."""

    @abstractmethod
    def create_accumulator(self) -> ACC:
        """A new, empty accumulator."""

    @abstractmethod
    def add(self, value: IN, accumulator: ACC) -> ACC:
        """Fold ``value`` into ``accumulator`` and return the accumulator."""

    @abstractmethod
    def get_result(self, accumulator: ACC) -> OUT:
        """The aggregate of an accumulator."""

    @abstractmethod
    def merge(self, a: ACC, b: ACC) -> ACC:
        """Combine two accumulators."""


def _not_a_serializer(state: str, name: str, value: object) -> str:
    """Why ``value`` cannot be the ``name`` of state ``state``, and what to pass."""
    if isinstance(value, type) and issubclass(value, Serializer):
        fix = f"pass an instance: {value.__name__}()"
    elif isinstance(value, type):
        fix = (f"it takes a serializer, not the type of the values: leave it out (the "
               f"default, msgpack, stores {value.__name__} values"
               + (")" if value in (int, float, str, bytes, bool, list, tuple, dict) else
                  " if msgpack can encode them) or pass PickleSerializer() for any object"))
    else:
        fix = "pass a Serializer instance, or leave it out for the default (msgpack)"
    return f"state {state!r}: {name} must be a weir Serializer instance, got {value!r}; {fix}"


@dataclass(frozen=True)
class StateDescriptor(ABC):
    """Common part of every descriptor: a unique name and an optional TTL."""

    name: str
    ttl: StateTtlConfig | None = field(default=None, kw_only=True)
    #: the name live queries ask for this state by (:meth:`queryable`); None: not queryable
    queryable_as: str | None = field(default=None, kw_only=True)

    kind: StateKind = field(init=False, repr=False, compare=False, default=StateKind.VALUE)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(f"a state name must be a non-empty str, got {self.name!r}")
        if self.name.startswith(RESERVED_PREFIX):
            raise ConfigurationError(
                f"state name {self.name!r} starts with {RESERVED_PREFIX!r}, which weir reserves"
            )
        if self.queryable_as is not None and (
                not isinstance(self.queryable_as, str) or not self.queryable_as):
            raise ConfigurationError(f"state {self.name!r}: a queryable name must be a "
                                     f"non-empty str, got {self.queryable_as!r}")
        if self.ttl is not None and not isinstance(self.ttl, StateTtlConfig):
            raise ConfigurationError(f"ttl of state {self.name!r} must be a StateTtlConfig")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("serializer") and not (value is None or isinstance(
                    value, Serializer)):
                raise ConfigurationError(_not_a_serializer(self.name, f.name, value))

    def enable_time_to_live(self, ttl_config: StateTtlConfig) -> Self:
        """A copy of this descriptor whose values expire after ``ttl_config.ttl_ms``."""
        return dataclasses.replace(self, ttl=ttl_config)

    def queryable(self, name: str) -> Self:
        """A copy of this descriptor whose state a running continuous job answers live
        queries for under ``name`` (``JobClient.query_state``,
        ``weir.QueryableStateClient``; Flink's ``setQueryable``)."""
        return dataclasses.replace(self, queryable_as=name)

    @property
    @abstractmethod
    def value_serializer(self) -> Serializer[Any]:
        """The serializer of stored values (elements for list state)."""

    def serializer_ids(self) -> tuple[str, ...]:
        """The ``type_id`` of every serializer, as stored in snapshots."""
        return tuple(s.type_id for s in self.serializers())

    def serializers(self) -> tuple[Serializer[Any], ...]:
        """Every serializer of the state (a map state's user key serializer first)."""
        return (self.value_serializer,)


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor, Generic[T]):
    """A single value per key: :class:`~weir.ValueState`."""

    serializer: Serializer[T] | None = None
    kind: StateKind = field(init=False, repr=False, compare=False, default=StateKind.VALUE)

    @property
    def value_serializer(self) -> Serializer[Any]:
        return self.serializer or DEFAULT_SERIALIZER


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor, Generic[T]):
    """A list of elements per key: :class:`~weir.ListState`; also operator list state."""

    serializer: Serializer[T] | None = None
    kind: StateKind = field(init=False, repr=False, compare=False, default=StateKind.LIST)

    @property
    def value_serializer(self) -> Serializer[Any]:
        return self.serializer or DEFAULT_SERIALIZER


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor, Generic[K, V]):
    """A map per key (:class:`~weir.MapState`), or broadcast state."""

    key_serializer: Serializer[K] | None = None
    serializer: Serializer[V] | None = None
    kind: StateKind = field(init=False, repr=False, compare=False, default=StateKind.MAP)

    @property
    def value_serializer(self) -> Serializer[Any]:
        return self.serializer or DEFAULT_SERIALIZER

    @property
    def user_key_serializer(self) -> Serializer[Any]:
        """The serializer of the map's keys."""
        return self.key_serializer or DEFAULT_SERIALIZER

    def serializers(self) -> tuple[Serializer[Any], ...]:
        return (self.user_key_serializer, self.value_serializer)


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor, Generic[T]):
    """One value per key folded with ``reduce_function(a, b)``: :class:`~weir.ReducingState`."""

    reduce_function: Callable[[T, T], T] | None = None
    serializer: Serializer[T] | None = None
    kind: StateKind = field(init=False, repr=False, compare=False, default=StateKind.REDUCING)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.reduce_function):
            raise ConfigurationError(
                f"ReducingStateDescriptor {self.name!r} needs a reduce_function(a, b)"
            )

    @property
    def value_serializer(self) -> Serializer[Any]:
        return self.serializer or DEFAULT_SERIALIZER


@dataclass(frozen=True)
class AggregatingStateDescriptor(StateDescriptor, Generic[IN, ACC, OUT]):
    """An accumulator per key driven by an :class:`AggregateFunction`:
    :class:`~weir.AggregatingState`."""

    aggregate_function: AggregateFunction[IN, ACC, OUT] | None = None
    accumulator_serializer: Serializer[ACC] | None = None
    kind: StateKind = field(init=False, repr=False, compare=False, default=StateKind.AGGREGATING)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.aggregate_function, AggregateFunction):
            raise ConfigurationError(
                f"AggregatingStateDescriptor {self.name!r} needs an AggregateFunction instance"
            )

    @property
    def value_serializer(self) -> Serializer[Any]:
        return self.accumulator_serializer or DEFAULT_SERIALIZER
