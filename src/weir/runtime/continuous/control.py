"""The control plane of a continuous job: one connection from every task to the job's
coordinator (in the driver process), carrying msgpack messages in ``CONTROL`` frames
(:mod:`.wire`), with the channels' handshake (the job's shared secret).

The coordinator's :class:`ControlServer` listens (loopback by default); each task's
:class:`ControlClient` connects as ``(task, subtask)``. Messages are dicts with a
``"kind"``; which kinds exist is the business of the coordinator and the tasks (trigger
a checkpoint at a source, acknowledge with state handles, decline, notify complete or
aborted, report a failure, exchange data addresses). A task whose connection drops —
its process died, or it closed — is reported to the server's handler as
``{"kind": "disconnected", "error": ...}``, so a killed task is noticed at once, not
after a heartbeat timeout; a coordinator that disappears ends every task's
:meth:`ControlClient.receive` with a :class:`~weir.errors.ChannelError`.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

import msgpack

from weir.errors import ChannelError, ConfigurationError
from weir.runtime.continuous.wire import (
    VERSION,
    Kind,
    Listener,
    Refused,
    dial,
    greet,
    read_frame,
    refuse,
    write_frame,
)

__all__ = ["ControlClient", "ControlServer", "TaskId"]

TaskId = tuple[str, int]
"""A task: its vertex (operator uid of its head) and subtask index."""


class ControlServer:
    """The coordinator's end: accepts the tasks of ``job`` (refusing any without the
    secret, and a second connection of the same task), and calls ``handler(task,
    message)`` from the connection's reader thread for every message."""

    def __init__(self, handler: Callable[[TaskId, dict[str, Any]], None], *, secret: bytes,
                 job: str, host: str = "127.0.0.1", port: int = 0) -> None:
        if not secret:
            raise ConfigurationError("a ControlServer needs the job's shared secret")
        self.handler, self.secret, self.job = handler, secret, job
        self._lock = threading.Lock()
        self._tasks: dict[TaskId, tuple[socket.socket, threading.Lock]] = {}
        self.refused = 0
        self._listener = Listener(host, port, self._serve, "weir-control-server")
        self.address = self._listener.address

    @property
    def tasks(self) -> set[TaskId]:
        """The tasks connected now."""
        with self._lock:
            return set(self._tasks)

    def send(self, task: TaskId, message: dict[str, Any]) -> bool:
        """Send ``message`` to ``task``; False if it is not connected (or just went)."""
        with self._lock:
            entry = self._tasks.get(task)
        if entry is None:
            return False
        sock, send_lock = entry
        try:
            with send_lock:
                write_frame(sock, Kind.CONTROL, msgpack.packb(message))
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Stop accepting and close every task's connection."""
        self._listener.close()
        with self._lock:
            entries = list(self._tasks.values())
        for sock, _ in entries:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _serve(self, sock: socket.socket) -> None:
        where = f"a task connecting to the coordinator at {self.address[0]}:{self.address[1]}"
        try:
            hello = greet(sock, secret=self.secret, job=self.job, where=where)
            task = (str(hello.get("task")), int(hello.get("subtask", -1)))
            with self._lock:
                if task in self._tasks:
                    raise Refused(f"task {task[0]}[{task[1]}] is connected already")
                write_frame(sock, Kind.WELCOME)
                sock.settimeout(None)
                self._tasks[task] = (sock, threading.Lock())
        except Refused as exc:
            self.refused += 1
            refuse(sock, str(exc))
            return
        except (ChannelError, OSError, ValueError, TypeError):
            self.refused += 1
            with contextlib.suppress(OSError):
                sock.close()
            return
        error = "closed"
        try:
            while True:
                kind, body = read_frame(sock, f"task {task[0]}[{task[1]}]")
                if kind is not Kind.CONTROL:
                    raise ChannelError(f"unexpected {kind.name} from task {task[0]}[{task[1]}]")
                self.handler(task, msgpack.unpackb(body))
        except (ChannelError, OSError, ValueError) as exc:
            error = str(exc)
        finally:
            with self._lock:
                self._tasks.pop(task, None)
            with contextlib.suppress(OSError):
                sock.close()
        if not self._listener.closed:
            self.handler(task, {"kind": "disconnected", "error": error})


class ControlClient:
    """A task's end: connects to the coordinator as ``(task, subtask)``;
    :meth:`receive` returns the coordinator's messages in order."""

    def __init__(self, address: tuple[str, int], *, secret: bytes, job: str, task: str,
                 subtask: int, connect_timeout_s: float = 30.0) -> None:
        self.task: TaskId = (task, subtask)
        self.where = f"task {task}[{subtask}] of job {job!r}, coordinator at " \
                     f"{address[0]}:{address[1]}"
        self._sock = dial(address, secret=secret, timeout_s=connect_timeout_s,
                          where=self.where, fields={"v": VERSION, "job": job, "task": task,
                                                    "subtask": subtask})
        self._send_lock = threading.Lock()
        self._inbox: queue.Queue[dict[str, Any] | BaseException] = queue.Queue()
        threading.Thread(target=self._read, name=f"control {task}[{subtask}]",
                         daemon=True).start()

    def send(self, message: dict[str, Any]) -> None:
        """Send ``message`` to the coordinator."""
        try:
            with self._send_lock:
                write_frame(self._sock, Kind.CONTROL, msgpack.packb(message))
        except OSError as exc:
            raise ChannelError(f"{self.where}: cannot send: {exc}") from exc

    def receive(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """The coordinator's next message; None after ``timeout_s`` without one. The
        connection's end is a :class:`~weir.errors.ChannelError`."""
        try:
            item = self._inbox.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            self._inbox.put(item)  # every later call fails the same way
            raise ChannelError(f"{self.where}: {item}") from item
        return item

    def close(self) -> None:
        """Close the connection (the coordinator sees the task disconnect)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()

    def _read(self) -> None:
        try:
            while True:
                kind, body = read_frame(self._sock, self.where)
                if kind is not Kind.CONTROL:
                    raise ChannelError(f"unexpected {kind.name} from the coordinator")
                self._inbox.put(msgpack.unpackb(body))
        except (ChannelError, OSError, ValueError) as exc:
            self._inbox.put(exc)
