"""The task processes of a job on this machine: stopping them, and naming the root
cause when one fails."""

from __future__ import annotations

import queue
import subprocess
import time
from collections.abc import Iterable
from typing import Any, Protocol

from weir.errors import JobFailedError
from weir.runtime.continuous.control import TaskId

__all__ = ["root_cause", "stop_processes"]


Report = tuple[TaskId, dict[str, Any]]


def root_cause(first: Report, inbox: queue.Queue[Report], finished: set[TaskId],
               job: str) -> JobFailedError:
    """The job's error, naming its root cause: one failure drags others along (the
    neighbours of a killed task lose their channels), so the reports of the next
    half second are gathered and a task that died, or failed on its own, is named
    before one that lost a channel."""
    reports = [first]
    until = time.monotonic() + 0.5
    while (left := until - time.monotonic()) > 0:
        try:
            task, message = inbox.get(timeout=left)
        except queue.Empty:
            break
        if message["kind"] == "finished":
            finished.add(task)
        elif message["kind"] == "failed" or (
                message["kind"] == "disconnected" and task not in finished):
            reports.append((task, message))  # (a finished task's close is no failure)
    failed = {t for t, m in reports if m["kind"] == "failed"}

    def rank(report: tuple[TaskId, dict[str, Any]]) -> int:
        task, message = report
        if message["kind"] == "disconnected" and task not in failed:
            return 0  # died without a word: killed, or lost
        return 2 if "ChannelError" in str(message.get("error")) else 1

    task, message = min(reports, key=rank)
    others = sorted({f"{t[0]}[{t[1]}]" for t, _ in reports} - {f"{task[0]}[{task[1]}]"})
    return JobFailedError(
        f"job {job!r}: task {task[0]}[{task[1]}] "
        f"{'failed' if message['kind'] == 'failed' else 'disappeared'}: "
        f"{message.get('error')}"
        + (f" (then {', '.join(others)} failed too)" if others else "")
        + (f"\n{message['trace']}" if message.get("trace") else ""))


class Process(Protocol):
    """What stopping needs of a task process (``subprocess.Popen`` and
    :class:`~.zygote.TaskProcess` have it)."""

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


def stop_processes(procs: Iterable[Process], grace_s: float) -> None:
    """Wait ``grace_s`` for the task processes to exit (they finished), then kill
    what is left (after a failure: at once)."""
    deadline = time.monotonic() + grace_s
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                proc.kill()
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
