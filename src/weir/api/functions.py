"""Function base classes users extend.

Processing methods return an iterable of outputs (a list, a tuple or a generator;
``None`` means no output).

A function class names the exceptions that mark a record as bad in
``bad_record_exceptions``: a record for which ``process_element`` raises one of them
goes to the dead letters with the reason, and the job goes on (on both runtimes); any
other exception fails the job (which restarts as its restart strategy allows).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar, Generic, TypeVar

from weir.api.context import (
    BroadcastContext,
    Context,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedContext,
)

__all__ = [
    "CheckpointedFunction",
    "KeyedBroadcastProcessFunction",
    "KeyedProcessFunction",
    "ProcessFunction",
]

IN = TypeVar("IN")
OUT = TypeVar("OUT")
BC = TypeVar("BC")


class KeyedProcessFunction(ABC, Generic[IN, OUT]):
    """A function over a keyed stream with keyed state and timers."""

    bad_record_exceptions: ClassVar[tuple[type[BaseException], ...]] = ()
    """Exceptions of ``process_element`` that send the record to the dead letters."""

    def open(self, ctx: KeyedContext) -> None:
        """Called once before the first element; register state here."""

    @abstractmethod
    def process_element(self, value: IN, ctx: KeyedContext) -> Iterable[OUT] | None:
        """Process one element of the current key (``ctx.current_key``)."""

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> Iterable[OUT] | None:
        """Called when a timer of ``ctx.current_key`` fires."""
        return None

    def close(self) -> None:
        """Called once after the last element."""


class KeyedBroadcastProcessFunction(ABC, Generic[IN, BC, OUT]):
    """A keyed function that also receives a broadcast stream: broadcast elements may
    change broadcast state, keyed elements read it."""

    bad_record_exceptions: ClassVar[tuple[type[BaseException], ...]] = ()
    """Exceptions of ``process_element`` that send the record to the dead letters."""

    def open(self, ctx: KeyedContext) -> None:
        """Called once before the first element."""

    @abstractmethod
    def process_element(self, value: IN, ctx: KeyedContext) -> Iterable[OUT] | None:
        """Process one keyed element; broadcast state is read-only here."""

    @abstractmethod
    def process_broadcast_element(
        self, value: BC, ctx: BroadcastContext
    ) -> Iterable[OUT] | None:
        """Process one broadcast element; broadcast state is writable here."""

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> Iterable[OUT] | None:
        """Called when a timer of ``ctx.current_key`` fires."""
        return None

    def close(self) -> None:
        """Called once after the last element."""


class ProcessFunction(ABC, Generic[IN, OUT]):
    """A function over a non-keyed stream (operator state through
    :class:`CheckpointedFunction`)."""

    bad_record_exceptions: ClassVar[tuple[type[BaseException], ...]] = ()
    """Exceptions of ``process_element`` that send the record to the dead letters."""

    def open(self, ctx: Context) -> None:
        """Called once before the first element."""

    @abstractmethod
    def process_element(self, value: IN, ctx: Context) -> Iterable[OUT] | None:
        """Process one element."""

    def close(self) -> None:
        """Called once after the last element."""


class CheckpointedFunction(ABC):
    """Mix-in for functions with operator state (Flink's ``CheckpointedFunction``).

    ``initialize_state`` runs before ``open``, on a fresh start and on restore
    (``ctx.is_restored``); ``snapshot_state`` runs at every snapshot and should
    write the function's in-memory state into its operator state.
    """

    @abstractmethod
    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        """Register operator state and read what was restored."""

    @abstractmethod
    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        """Copy in-memory state into operator state for snapshot ``ctx.checkpoint_id``."""


def outputs(result: Iterable[Any] | None) -> list[Any]:
    """Materialize what a processing method returned."""
    if result is None:
        return []
    if isinstance(result, list):
        return result
    return list(result)
