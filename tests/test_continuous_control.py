"""The continuous runtime's control plane over real TCP: tasks connect to the
coordinator with the job's secret, messages both ways in order, a second connection of
a task refused, a task process killed with SIGKILL noticed at once, the coordinator's
end noticed by every task."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from weir.errors import ChannelError
from weir.runtime.continuous.control import ControlClient, ControlServer, TaskId

SECRET = b"job-secret"


class Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[TaskId, dict[str, Any]]] = []
        self.cond = threading.Condition()

    def __call__(self, task: TaskId, message: dict[str, Any]) -> None:
        with self.cond:
            self.messages.append((task, message))
            self.cond.notify_all()

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[tuple[TaskId, Any]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.messages) >= count, timeout_s), (
                self.messages)
            return list(self.messages)


@pytest.fixture
def coordinator() -> Iterator[tuple[ControlServer, Inbox]]:
    inbox = Inbox()
    server = ControlServer(inbox, secret=SECRET, job="job")
    yield server, inbox
    server.close()


def client(server: ControlServer, task: str, subtask: int, **kw: Any) -> ControlClient:
    args: dict[str, Any] = {"secret": SECRET, "job": "job", "task": task,
                            "subtask": subtask, **kw}
    return ControlClient(server.address, **args)


def test_messages_flow_both_ways_in_order(coordinator: tuple[ControlServer, Inbox]) -> None:
    server, inbox = coordinator
    tasks = [client(server, "count", i) for i in range(3)]
    for i, task in enumerate(tasks):
        for n in range(5):
            task.send({"kind": "ack", "subtask": i, "n": n})
    got = inbox.wait_for(15)
    for i in range(3):
        assert [m["n"] for t, m in got if t == ("count", i)] == list(range(5))
    assert server.tasks == {("count", 0), ("count", 1), ("count", 2)}
    for n in range(3):
        assert server.send(("count", 1), {"kind": "trigger", "id": n})
    assert [tasks[1].receive(10.0) for _ in range(3)] == [
        {"kind": "trigger", "id": n} for n in range(3)]
    assert tasks[0].receive(0.05) is None
    assert not server.send(("nobody", 0), {"kind": "trigger"})


def test_impostors_and_second_connections_are_refused(
    coordinator: tuple[ControlServer, Inbox]
) -> None:
    server, _ = coordinator
    with pytest.raises(ChannelError, match="secret"):
        client(server, "count", 0, secret=b"guess")
    with pytest.raises(ChannelError, match="not 'other'"):
        client(server, "count", 0, job="other")
    first = client(server, "count", 0)
    with pytest.raises(ChannelError, match="connected already"):
        client(server, "count", 0)
    assert server.refused == 3 and server.tasks == {("count", 0)}
    first.close()


TASK = """
import os, sys, time
from weir.runtime.continuous.control import ControlClient
c = ControlClient((sys.argv[1], int(sys.argv[2])), secret=os.environb[b"S"], job="job",
                  task="count", subtask=7)
c.send({"kind": "ready", "pid": os.getpid()})
time.sleep(600)
"""


def test_a_killed_task_process_is_noticed_at_once(
    coordinator: tuple[ControlServer, Inbox]
) -> None:
    server, inbox = coordinator
    proc = subprocess.Popen([sys.executable, "-c", TASK, *map(str, server.address)],
                            env={**os.environ, "S": SECRET.decode()})
    try:
        ((task, ready),) = inbox.wait_for(1)
        assert task == ("count", 7) and ready["pid"] == proc.pid
        killed = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        got = inbox.wait_for(2)
        assert got[1][0] == ("count", 7) and got[1][1]["kind"] == "disconnected"
        assert time.monotonic() - killed < 10
        assert server.tasks == set()
    finally:
        proc.kill()
        proc.wait()


def test_the_coordinators_end_reaches_every_task(
    coordinator: tuple[ControlServer, Inbox]
) -> None:
    server, _ = coordinator
    tasks = [client(server, "src", i) for i in range(2)]
    server.close()
    for task in tasks:
        with pytest.raises(ChannelError):
            task.receive(10.0)
        with pytest.raises(ChannelError):  # and stays ended
            task.receive(0.1)
