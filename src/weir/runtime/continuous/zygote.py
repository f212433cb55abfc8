"""Task processes forked from a zygote: a process that imported the task code once.

A fresh ``python -m weir.runtime.continuous.worker`` spends about 0.3 s of CPU
importing weir before it runs a record, and a job starts every task at once (and
again at every restart): on a two-core machine a four-task job waited about a
second for its imports. The zygote imports the task code once, then forks a task
per request; a fork shares the imported modules copy-on-write and starts in
milliseconds. The same design as ``multiprocessing``'s forkserver and Android's
zygote; Linux and macOS only, like the rest of the continuous runtime.

One zygote serves every job of the driver process (started at the first launch,
restarted if it died). Its protocol, over two pipes:

* requests (its stdin), one JSON line each:
  ``{"argv": [...], "env": {...}, "cwd": "..."}``: fork a task with that environment
  and directory and run ``worker.main(argv)`` in it (the n-th fork is launch n);
  ``{"kill": n}``: SIGKILL launch n if it has not ended;
* replies (the file descriptor named on its command line), one JSON line each:
  ``{"pid": n}`` answers a fork request, in order; ``{"exit": n, "status": s}`` reports
  a task that ended (``s`` as ``Popen.returncode``: negative for a signal).

Only the zygote kills its tasks: it is their parent, so a task it has not reaped still
holds its pid, and a kill never reaches another process that got the pid of a task
that ended (Linux hands out a reaped pid again; a full test run goes round the pid
space several times). The zygote stays single-threaded, so a fork never copies a lock
held by another thread; it opens no RocksDB and no socket. When the driver goes away
(its end of the request pipe closes) the zygote kills the tasks still running and
exits; when the zygote dies, its tasks die with it (``PR_SET_PDEATHSIG``; elsewhere
the driver kills them), so no task outlives its driver (tasks also exit when they
lose the coordinator).

A forked task ends with ``os._exit`` once its output streams are flushed: no
interpreter teardown (freeing every object of the task's state, exit handlers,
joining threads), which the driver waited for at the end of every job (0.3 s of a job
of one batch). What a finished task must end it ends itself first (``Task.finish``:
its checkpoint uploads and materialization, its operators and sinks; weir's own
threads are daemons); a thread or exit handler of a user's function that must finish
its work is ended by that function's ``close``. A failed task ends as a killed one
does, which every fault test covers.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from typing import Any

from weir.runtime.continuous.processes import die_with_parent, pdeathsig_available

__all__ = ["TaskProcess", "launch"]

#: how long a launch waits for the zygote's answer before replacing it (seconds)
ANSWER_TIMEOUT_S = 60.0
#: a task gets SIGKILL when its zygote dies (Linux with glibc: ``PR_SET_PDEATHSIG``;
#: elsewhere the driver kills a dead zygote's tasks)
_DIE_WITH_ZYGOTE = pdeathsig_available()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class TaskProcess:
    """A task process forked by the zygote, with the part of ``subprocess.Popen``'s
    interface the driver uses (``pid``, ``poll``, ``wait``, ``kill``)."""

    def __init__(self, pid: int, launch: int, zygote: _Zygote) -> None:
        self.pid = pid
        #: which of the zygote's launches this is (a pid is reused once reaped)
        self._launch = launch
        self._zygote = zygote

    @property
    def returncode(self) -> int | None:
        """The exit status once the process ended (negative: killed by that signal)."""
        return self._zygote.exits.get(self._launch)

    def poll(self) -> int | None:
        """The exit status, or None while the process runs."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end; ``subprocess.TimeoutExpired`` after ``timeout``."""
        with self._zygote.ended:
            if not self._zygote.ended.wait_for(lambda: self._launch in self._zygote.exits,
                                               timeout):
                raise subprocess.TimeoutExpired(f"task process {self.pid}", timeout or 0.0)
            return self._zygote.exits[self._launch]

    def kill(self) -> None:
        """SIGKILL the process (nothing if it already ended); the zygote, its parent,
        sends the signal (see the module's doc)."""
        self._zygote.kill(self._launch)


class _Zygote:
    """The driver's handle on a zygote process."""

    def __init__(self) -> None:
        read, write = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "weir.runtime.continuous.zygote", str(write)],
                stdin=subprocess.PIPE, pass_fds=(write,))
        finally:
            os.close(write)
        self._follow(os.fdopen(read, "rb"))

    def _follow(self, replies: Any) -> None:
        """Read the zygote's ``replies`` in a thread from now on.

        Exits are kept by launch, not by pid: the zygote reaps a task before it can
        fork another that gets the same pid, so a pid's exit report always comes
        before the answer that hands the pid out again."""
        self.replies = replies
        self.exits: dict[int, int] = {}  # launch -> exit status
        self.running: dict[int, int] = {}  # pid -> the launch running under it
        self.answers: list[tuple[int, int]] = []  # (pid, launch), in request order
        self.launches = 0
        #: how long a launch waits for this zygote's answer (then it is replaced)
        self.answer_timeout_s = ANSWER_TIMEOUT_S
        self.ended = threading.Condition()
        self._writing = threading.Lock()
        self.alive = True
        self.reader = threading.Thread(target=self._read, name="weir-zygote", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.replies:
            reply = json.loads(line)
            with self.ended:
                if "pid" in reply:
                    self.launches += 1
                    self.running[reply["pid"]] = self.launches
                    self.answers.append((reply["pid"], self.launches))
                else:
                    launch = self.running.pop(reply["exit"], None)
                    if launch is not None:
                        self.exits[launch] = reply["status"]
                self.ended.notify_all()
        with self.ended:  # the zygote is gone (it kills its tasks when it goes)
            self.alive = False
            for pid, launch in self.running.items():
                if not _DIE_WITH_ZYGOTE:  # (by pid: racing its reaping by init)
                    _kill(pid)
                self.exits[launch] = -signal.SIGKILL
            self.running.clear()
            self.ended.notify_all()

    def launch(self, argv: list[str], env: dict[str, str]) -> TaskProcess:
        self._request({"argv": argv, "env": env, "cwd": os.getcwd()})
        return self._answer()

    def kill(self, launch: int) -> None:
        """Have the zygote SIGKILL ``launch`` unless it ended."""
        with self.ended:
            if launch in self.exits or not self.alive:
                return
        with contextlib.suppress(OSError, ValueError):  # (gone: its tasks went with it)
            self._request({"kill": launch})

    def _request(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        with self._writing:  # (a kill from another thread: one whole line each)
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()

    def _answer(self) -> TaskProcess:
        """The task of the oldest request not answered yet, once the zygote answers."""
        with self.ended:
            if not self.ended.wait_for(lambda: self.answers or not self.alive,
                                       self.answer_timeout_s) or not self.answers:
                raise OSError("the zygote that forks task processes did not answer "
                              f"(exit status {self.proc.poll()})")
            pid, launch = self.answers.pop(0)
            return TaskProcess(pid, launch, self)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()
        self.reader.join()

    def discard(self) -> None:
        """Kill a zygote that did not answer (its tasks die with it): a fork it still
        had to make would be a task nobody tracks."""
        self.proc.kill()
        self.proc.wait()
        self.reader.join(timeout=10.0)


_lock = threading.Lock()
_zygote: _Zygote | None = None


def launch(argv: list[str], env: dict[str, str]) -> TaskProcess:
    """Fork a task process running ``worker.main(argv)`` with environment ``env``
    (all of it: the zygote's own is replaced) in this process's working directory."""
    global _zygote
    with _lock:
        if _zygote is None or not _zygote.alive or _zygote.proc.poll() is not None:
            _zygote = _Zygote()
        try:
            return _zygote.launch(argv, env)
        except (OSError, ValueError):  # it died between the check and the request, or hangs
            _zygote.discard()
            _zygote = _Zygote()
            return _zygote.launch(argv, env)


@atexit.register
def _close() -> None:
    with _lock:
        if _zygote is not None:
            _zygote.close()


# ------------------------------------------------------------------ the zygote itself


def _serve(replies: Any) -> list[str] | None:
    """The zygote's loop: in a forked task, the task's ``argv``; in the zygote, None
    once the driver closed the request pipe."""
    running: dict[int, int] = {}  # pid -> launch, of the tasks not reaped yet
    launches = 0
    pending = b""
    me = os.getpid()

    def reap() -> None:
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            running.pop(pid, None)
            code = os.waitstatus_to_exitcode(status)
            replies.write(json.dumps({"exit": pid, "status": code}) + "\n")

    while True:
        ready, _, _ = select.select([0], [], [], 0.05 if running else 1.0)
        reap()
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:  # the driver is gone: so are its tasks
            for pid in running:
                _kill(pid)
            return None
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            if "kill" in request:
                for victim in [p for p, n in running.items() if n == request["kill"]]:
                    _kill(victim)  # (not reaped yet: still this task's pid)
                continue
            launches += 1
            pid = os.fork()
            if pid == 0:  # the task
                if _DIE_WITH_ZYGOTE:
                    die_with_parent()
                    if os.getppid() != me:  # (the zygote died before that)
                        os._exit(1)
                os.close(0)
                replies.close()
                os.environ.clear()
                os.environ.update(request["env"])
                os.chdir(request["cwd"])
                return list(request["argv"])
            running[pid] = launches
            replies.write(json.dumps({"pid": pid}) + "\n")


def main(reply_fd: int) -> int:
    """Import the task code, then serve fork requests until the driver goes away."""
    import ctypes  # noqa: F401  (die_with_parent's, once: not in every fork)

    import pyspark.cloudpickle  # noqa: F401  (a task's graph unpickles with it)

    from weir.runtime.continuous import worker  # what every task runs, imported once

    assert threading.active_count() == 1, "a zygote forks only while single-threaded"
    replies = os.fdopen(reply_fd, "w", buffering=1)
    argv = _serve(replies)
    if argv is None:
        return 0
    # a forked task ends with os._exit once its streams are flushed (see the module's
    # doc): the interpreter's teardown is work nobody needs but the driver waits for
    status = 1
    try:
        status = worker.main(argv)
    except SystemExit as exc:  # (as the interpreter reads it)
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
