"""Helpers shared by the behaviour suites: a function that runs per-element actions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from weir import AggregateFunction, KeyedProcessFunction

Action = Callable[[Any], Any]


class Actions(KeyedProcessFunction[tuple[Any, Action], Any]):
    """Runs each element's action against the context; ``on_open`` runs in ``open``."""

    def __init__(self, on_open: Action | None = None) -> None:
        self.on_open = on_open

    def open(self, ctx: Any) -> None:
        if self.on_open is not None:
            self.on_open(ctx)

    def process_element(self, value: tuple[Any, Action], ctx: Any) -> list[Any]:
        return [value[1](ctx)]


def key_of(element: tuple[Any, Action]) -> Any:
    return element[0]


class Average(AggregateFunction[float, list[float], float]):
    def create_accumulator(self) -> list[float]:
        return [0, 0]

    def add(self, value: float, accumulator: list[float]) -> list[float]:
        return [accumulator[0] + value, accumulator[1] + 1]

    def get_result(self, accumulator: list[float]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: list[float], b: list[float]) -> list[float]:
        return [a[0] + b[0], a[1] + b[1]]


def write_state(state: Any, kind: str, value: Any) -> None:
    """Write ``value`` the way state of ``kind`` takes one (map state: under ``"k"``)."""
    if kind == "value":
        state.update(value)
    elif kind == "map":
        state.put("k", value)
    else:
        state.add(value)
