"""The task processes of a job: stopping them, naming the root cause when one fails or
hangs, and what a task process sets on itself (its name, dying with its parent).

A task that fails reports its exception as text (``Type: message`` and the traceback);
the driver's :class:`~weir.errors.JobFailedError` is chained from it, rebuilt
(:func:`~weir.errors.rebuild_exception`: a ``KeyError`` of the user's function is a
``KeyError`` again) with the task's traceback as a note, less the frames of weir that
called the user's code."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import weir.errors
from weir.errors import JobFailedError, rebuild_exception
from weir.runtime.continuous.control import TaskId
from weir.runtime.continuous.graph import JobGraph

__all__ = ["check_heartbeats", "describe_exit", "die_with_parent", "name_process",
           "pdeathsig_available", "reported_exception", "root_cause", "stop_processes"]


Report = tuple[TaskId, dict[str, Any]]


def root_cause(first: Report, inbox: queue.Queue[Report], finished: set[TaskId],
               job: str, exit_status: Callable[[TaskId], int | None] = lambda task: None
               ) -> JobFailedError:
    """The job's error, naming its root cause: one failure drags others along (the
    neighbours of a killed task lose their channels), so the reports of the next
    half second are gathered and a task that died, or failed on its own, is named
    before one that lost a channel. A task that disappeared is named with how its
    process ended (``exit_status``: as ``Popen.returncode``, None if unknown)."""
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
        if message["kind"] == "disconnected":
            # died without a word: killed, or lost; else the close after its own report
            # (which says more, whichever came first: the order of reports from two
            # tasks is not the order of their failures)
            return 0 if task not in failed else 3
        return 2 if "ChannelError" in str(message.get("error")) else 1

    task, message = min(reports, key=rank)
    others = sorted({f"{t[0]}[{t[1]}]" for t, _ in reports} - {f"{task[0]}[{task[1]}]"})
    cause = (reported_exception(message, f"{task[0]}[{task[1]}]")
             if message["kind"] == "failed" else None)
    ended = ""
    if message["kind"] == "disconnected" and (code := exit_status(task)) is not None:
        ended = f" (its process {describe_exit(code)})"
    error = JobFailedError(
        f"job {job!r}: task {task[0]}[{task[1]}] "
        f"{'failed' if message['kind'] == 'failed' else 'disappeared'}: "
        f"{message.get('error')}{ended}"
        + (f" (then {', '.join(others)} failed too)" if others else "")
        # (the traceback goes with the rebuilt cause, as a note, when there is one)
        + (f"\n{message['trace']}" if message.get("trace") and cause is None else ""))
    error.__cause__ = cause
    return error


def describe_exit(code: int) -> str:
    """How a process ended, from its exit status as ``Popen.returncode`` (negative: the
    signal that killed it): ``was killed by SIGKILL``, ``exited with status 1``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


_REPORTED = re.compile(r"([A-Za-z_][\w.]*): ?(.*)\Z", re.DOTALL)


def reported_exception(message: dict[str, Any], task: str) -> BaseException | None:
    """The exception a task reported failing with (``error``: ``Type: message``;
    ``trace``: its traceback), rebuilt here; None if the report names none."""
    found = _REPORTED.match(str(message.get("error") or ""))
    if found is None:
        return None
    name, text = found.groups()
    trace = str(message.get("trace") or "")
    # the traceback's last line names the type with its module (the report: its name)
    for line in reversed(trace.splitlines()):
        if re.match(rf"(?:\w+\.)*{re.escape(name)}: ", line) or line == name:
            name = line.split(":", 1)[0]
            break
    notes = [f"(raised in task {task}:)\n{user_traceback(trace).rstrip()}"] if trace else []
    return rebuild_exception(name, text, notes)


# the weir package's directory (weir/errors.py lives in it)
_WEIR_DIR = os.path.dirname(os.path.abspath(weir.errors.__file__)) + os.sep
_FRAME = re.compile(r'  File "(?P<file>[^"]+)", line \d+')


def user_traceback(trace: str) -> str:
    """A formatted traceback less the frames of weir above the first frame outside it
    (the task's loop that called the user's function), in each of its sections; a
    section whose frames are all weir's is kept whole."""
    lines = trace.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        if lines[i] != "Traceback (most recent call last):":
            i += 1
            continue
        i += 1
        frames: list[list[str]] = []  # each: the File line and its indented lines
        while i < len(lines) and lines[i].startswith("  "):
            if lines[i].startswith('  File "') or not frames:
                frames.append([])
            frames[-1].append(lines[i])
            i += 1
        first = next((k for k, frame in enumerate(frames)
                      if not _weir_frame(frame[0])), 0)
        for frame in frames[first:]:
            out += frame
    return "\n".join(out)


def _weir_frame(line: str) -> bool:
    found = _FRAME.match(line)
    return found is not None and os.path.abspath(found["file"]).startswith(_WEIR_DIR)


class Process(Protocol):
    """What stopping needs of a task process (``subprocess.Popen`` and
    :class:`~.zygote.TaskProcess` have it)."""

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


def check_heartbeats(heard: dict[TaskId, float], finished: set[TaskId],
                     graph: JobGraph) -> None:
    """A running task not heard from within the heartbeat timeout (``heard``: when each
    was last, ``time.monotonic()``) is hung: :class:`~weir.errors.JobFailedError`."""
    now = time.monotonic()
    for task, last in heard.items():
        if task not in finished and now - last > graph.heartbeat_timeout_s:
            raise JobFailedError(
                f"job {graph.job!r}: task {task[0]}[{task[1]}] is hung: nothing from its "
                f"main loop for {now - last:.1f} s (heartbeat timeout "
                f"{graph.heartbeat_timeout_s} s)")


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


def _prctl(option: int, arg: Any) -> None:
    """Linux ``prctl(option, arg)`` on this process; nothing elsewhere."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, arg)


def name_process(name: str) -> None:
    """Show ``name`` (15 bytes at most) as this process's name in ``ps``, ``top`` and
    ``/proc/<pid>/comm`` (``PR_SET_NAME``)."""
    _prctl(15, name.encode()[:15])


def pdeathsig_available() -> bool:
    """Whether a process here can have Linux SIGKILL it when its parent dies
    (``PR_SET_PDEATHSIG`` through glibc's ``prctl``): what :func:`die_with_parent`
    needs to work."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return hasattr(ctypes.CDLL("libc.so.6"), "prctl")
    except OSError:
        return False


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``; elsewhere a
    task still ends once the coordinator closes its connection)."""
    _prctl(1, signal.SIGKILL)
