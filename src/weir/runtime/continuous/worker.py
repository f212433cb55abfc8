"""The process of one task of a continuous job::

    python -m weir.runtime.continuous.worker GRAPH_FILE VERTEX SUBTASK ATTEMPT

with the coordinator's address in ``WEIR_COORDINATOR`` (``host:port``) and the job's
shared secret in ``WEIR_JOB_SECRET`` (hex; never on the command line, where other
users of the machine could read it); its channels listen on ``WEIR_BIND_HOST``
(loopback when unset). The graph file is the job's
:class:`~weir.runtime.continuous.graph.JobGraph`, pickled by the driver that
launched the job (the user's functions travel by value).

The task registers (a task with inputs with the address of its input gate), waits for the
coordinator's ``start`` (the data addresses of every task, the checkpoint to restore),
and runs until it finishes, fails (reported, exit status 1) or loses the coordinator.
A task that stops because a channel or the coordinator went away (the failure is
another task's) says so in one line instead of a traceback. The process is named
``weir <vertex>[<subtask>]`` (``ps``, ``/proc/<pid>/comm``; 15 bytes).
"""

from __future__ import annotations

import os
import pickle
import sys

from weir.errors import ChannelError
from weir.runtime.continuous.control import ControlClient
from weir.runtime.continuous.graph import JobGraph
from weir.runtime.continuous.processes import name_process
from weir.runtime.continuous.task import Task


def main(argv: list[str]) -> int:
    """Run the task ``argv`` names (graph file, vertex, subtask, attempt); its exit
    status."""
    with open(argv[0], "rb") as f:
        graph: JobGraph = pickle.load(f)  # written by this job's own driver
    return run(graph, argv[1], int(argv[2]), int(argv[3]))


def run(graph: JobGraph, vertex: str, subtask: int, attempt: int) -> int:
    """Run task ``vertex[subtask]`` of ``graph``; its exit status."""
    name_process(f"weir {vertex}[{subtask}]")
    secret = bytes.fromhex(os.environ["WEIR_JOB_SECRET"])
    host, port = os.environ["WEIR_COORDINATOR"].rsplit(":", 1)
    control = ControlClient((host, int(port)), secret=secret, job=graph.job, task=vertex,
                            subtask=subtask)
    task: Task | None = None
    try:
        task = Task(graph, vertex, subtask, attempt, control)
        listening = task.listen(secret, os.environ.get("WEIR_BIND_HOST", "127.0.0.1"))
        control.send({"kind": "registered", "pid": os.getpid(),
                      "address": None if listening is None else list(listening[0].address)})
        start = control.receive(None)
        if start is None or start.get("kind") != "start":
            raise RuntimeError(f"expected start from the coordinator, got {start!r}")
        task.run(start, secret, None if listening is None else listening[1])
    except BaseException as exc:
        if task is not None:
            task.fail(exc)
        if not isinstance(exc, ChannelError):
            raise
        # a peer or the coordinator went away: the job's failure is elsewhere, so one
        # line, not a traceback
        print(f"weir: task {vertex}[{subtask}] (attempt {attempt}) stops: "
              f"{str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        control.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
