"""The state interfaces users program against.

Keyed state objects are obtained once (usually in ``open``) and are bound to the
*current key* of the operator at every call: the same object reads and writes the
state of whichever key the record or timer being processed has.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar, overload

__all__ = [
    "AggregatingState",
    "BroadcastState",
    "ListState",
    "MapState",
    "ReadOnlyBroadcastState",
    "ReducingState",
    "State",
    "ValueState",
]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")
IN = TypeVar("IN")
OUT = TypeVar("OUT")


class State(ABC):
    """Any managed state."""

    @abstractmethod
    def clear(self) -> None:
        """Remove the state's value(s) for the current key."""


class ValueState(State, Generic[T]):
    """One value per key; ``None`` when absent."""

    @abstractmethod
    def value(self) -> T | None:
        """The current key's value, or ``None``."""

    @abstractmethod
    def update(self, value: T | None) -> None:
        """Set the current key's value (``None`` clears it, as in Flink)."""


class ListState(State, Generic[T]):
    """A list of elements per key."""

    @abstractmethod
    def get(self) -> list[T]:
        """The current key's elements (a new list; empty when absent)."""

    @abstractmethod
    def add(self, value: T) -> None:
        """Append one element."""

    @abstractmethod
    def add_all(self, values: Iterable[T]) -> None:
        """Append several elements."""

    @abstractmethod
    def update(self, values: Iterable[T]) -> None:
        """Replace the elements."""


class _AppendingState(State, Generic[IN, OUT]):
    @abstractmethod
    def get(self) -> OUT | None:
        """The current key's aggregate, or ``None`` when nothing was added."""

    @abstractmethod
    def add(self, value: IN) -> None:
        """Fold one value into the current key's aggregate."""


class ReducingState(_AppendingState[T, T]):
    """Values folded with the descriptor's reduce function."""


class AggregatingState(_AppendingState[IN, OUT]):
    """Values folded with the descriptor's :class:`~weir.AggregateFunction`."""


class MapState(State, Generic[K, V]):
    """A map per key. Also usable as ``state[k]``, ``k in state``, ``for k in state``."""

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    @abstractmethod
    def get(self, key: K, default: Any = None) -> Any:
        """The value under ``key`` or ``default``."""

    @abstractmethod
    def put(self, key: K, value: V) -> None:
        """Set the value under ``key``."""

    def put_all(self, entries: Mapping[K, V] | Iterable[tuple[K, V]]) -> None:
        """Set several entries."""
        items = entries.items() if isinstance(entries, Mapping) else entries
        for key, value in items:
            self.put(key, value)

    @abstractmethod
    def remove(self, key: K) -> None:
        """Remove ``key`` (no error if absent)."""

    @abstractmethod
    def contains(self, key: K) -> bool:
        """Whether ``key`` is present."""

    @abstractmethod
    def items(self) -> Iterator[tuple[K, V]]:
        """The current key's entries."""

    def keys(self) -> Iterator[K]:
        """The current key's map keys."""
        return (k for k, _ in self.items())

    def values(self) -> Iterator[V]:
        """The current key's map values."""
        return (v for _, v in self.items())

    @abstractmethod
    def is_empty(self) -> bool:
        """Whether the current key's map has no entry."""

    def __getitem__(self, key: K) -> V:
        marker = _MISSING
        value = self.get(key, marker)
        if value is marker:
            raise KeyError(key)
        return value  # type: ignore[return-value]

    def __setitem__(self, key: K, value: V) -> None:
        self.put(key, value)

    def __delitem__(self, key: K) -> None:
        if not self.contains(key):
            raise KeyError(key)
        self.remove(key)

    def __contains__(self, key: object) -> bool:
        return self.contains(key)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[K]:
        return self.keys()


class ReadOnlyBroadcastState(Generic[K, V]):
    """Broadcast state as the keyed side sees it: readable, never writable."""

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    @abstractmethod
    def get(self, key: K, default: Any = None) -> Any:
        """The value under ``key`` or ``default``."""

    @abstractmethod
    def contains(self, key: K) -> bool:
        """Whether ``key`` is present."""

    @abstractmethod
    def items(self) -> Iterator[tuple[K, V]]:
        """All entries."""

    def keys(self) -> Iterator[K]:
        """All keys."""
        return (k for k, _ in self.items())

    def values(self) -> Iterator[V]:
        """All values."""
        return (v for _, v in self.items())

    def is_empty(self) -> bool:
        """Whether there is no entry."""
        return next(iter(self.items()), None) is None

    def __getitem__(self, key: K) -> V:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        return self.contains(key)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[K]:
        return self.keys()


class BroadcastState(ReadOnlyBroadcastState[K, V]):
    """Broadcast state as the broadcast side sees it: readable and writable."""

    @abstractmethod
    def put(self, key: K, value: V) -> None:
        """Set the value under ``key``."""

    def put_all(self, entries: Mapping[K, V] | Iterable[tuple[K, V]]) -> None:
        """Set several entries."""
        items = entries.items() if isinstance(entries, Mapping) else entries
        for key, value in items:
            self.put(key, value)

    @abstractmethod
    def remove(self, key: K) -> None:
        """Remove ``key`` (no error if absent)."""

    @abstractmethod
    def clear(self) -> None:
        """Remove every entry."""

    def __setitem__(self, key: K, value: V) -> None:
        self.put(key, value)

    def __delitem__(self, key: K) -> None:
        if not self.contains(key):
            raise KeyError(key)
        self.remove(key)


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()
