"""Task metrics of the continuous runtime: where each task's time goes and how full its
channels are (Flink's ``busyTimeMsPerSecond`` / ``idleTimeMsPerSecond`` /
``backPressuredTimeMsPerSecond``, ``numRecordsInPerSecond`` / ``OutPerSecond``, buffers
queued per channel, ``currentInputWatermark``).

A task counts, from its start: the time its main loop waited for input with none
there (*idle*; a source task: the time its reader had nothing to read — polls that
returned no record and a short wait for a message after each — and the time after its
end), the time it waited for credit to send (*backpressured*; the output channels'
``backpressured_ns``), the records it took in and sent out. Its heartbeat (at
most once a second) carries a :func:`sample` of them with the buffers queued on each
input channel, each output channel's backlog and its watermark; the driver's
:class:`MetricsBoard` turns two consecutive samples into rates: *busy* is the rest of
the interval. ``JobClient.metrics()`` returns the newest :class:`TaskMetrics` of every
running task.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from weir.runtime.task_metrics import TaskMetrics

__all__ = ["MetricsBoard", "TaskMetrics", "sample"]


class _Gate(Protocol):
    @property
    def records_in(self) -> int: ...

    @property
    def producers(self) -> int: ...

    def queued(self, channel: int) -> int: ...


class _Out(Protocol):
    @property
    def records_out(self) -> int: ...

    @property
    def backpressured_ns(self) -> int: ...

    @property
    def backlog(self) -> int: ...


def sample(*, idle_ns: int, records_in: int, gate: _Gate | None, outs: Sequence[_Out],
           watermark: int | None, backpressured_ns: int = 0) -> dict[str, Any]:
    """A task's counters now, as its heartbeat carries them (``backpressured_ns``: time
    the task waited for its outputs outside emit)."""
    return {
        "t_ns": time.monotonic_ns(), "ts": int(time.time() * 1000),
        "idle_ns": idle_ns,
        "backpressured_ns": backpressured_ns + sum(o.backpressured_ns for o in outs),
        "in": records_in if gate is None else gate.records_in,
        "out": sum(o.records_out for o in outs),
        "queued": [] if gate is None else [gate.queued(c) for c in range(gate.producers)],
        "backlog": [o.backlog for o in outs],
        "watermark": watermark,
    }


class MetricsBoard:
    """The driver's view: the last two samples of every task (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[tuple[str, int], tuple[dict[str, Any], dict[str, Any]]] = {}

    def update(self, task: tuple[str, int], counters: dict[str, Any]) -> None:
        """A heartbeat of ``task`` carried ``counters`` (a :func:`sample`)."""
        with self._lock:
            last = self._samples.get(task)
            if last is not None and counters["t_ns"] < last[1]["t_ns"]:
                last = None  # a restarted task counts from zero
            self._samples[task] = (counters if last is None else last[1], counters)

    def forget(self) -> None:
        """The attempt ended: its tasks are gone."""
        with self._lock:
            self._samples.clear()

    def snapshot(self) -> list[TaskMetrics]:
        """Every task's latest metrics, by vertex and subtask."""
        with self._lock:
            samples = dict(self._samples)
        out = []
        for (vertex, subtask), (old, new) in sorted(samples.items()):
            dt = new["t_ns"] - old["t_ns"]
            if dt <= 0:
                continue
            pressured = min(1.0, max(0, new["backpressured_ns"] - old["backpressured_ns"]) / dt)
            idle = min(1.0 - pressured, max(0, new["idle_ns"] - old["idle_ns"]) / dt)
            out.append(TaskMetrics(
                vertex, subtask, round((new["in"] - old["in"]) * 1e9 / dt, 1),
                round((new["out"] - old["out"]) * 1e9 / dt, 1), new["watermark"], new["ts"],
                backpressured=round(pressured, 4), idle=round(idle, 4),
                busy=round(max(0.0, 1.0 - pressured - idle), 4),
                input_queued=tuple(new["queued"]), output_backlog=tuple(new["backlog"])))
        return out
