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
A task that fails reports its exception with its traceback to the coordinator, which
hands it to the program that runs the job (``JobFailedError``, chained from it), and
says so in one line on its stderr instead of printing the traceback too — one wall of
text per failed attempt of every restart; only a failure it could not report is
printed in full. A task that stops because a channel or the coordinator went away (the
failure is another task's) says so in one line as well. The process is named
``weir <vertex>[<subtask>]`` (``ps``, ``/proc/<pid>/comm``; 15 bytes). A crash in
native code (SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE) prints the Python stack of
every thread to its stderr (``faulthandler``): such a task cannot report, and the
driver only sees it disappear, killed by the signal.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import sys

from weir.errors import ChannelError
from weir.runtime.continuous.control import ControlClient
from weir.runtime.continuous.graph import JobGraph
from weir.runtime.continuous.processes import name_process
from weir.runtime.continuous.task import Task, report_failure


def main(argv: list[str]) -> int:
    """Run the task ``argv`` names (graph file, vertex, subtask, attempt); its exit
    status."""
    with open(argv[0], "rb") as f:
        graph: JobGraph = pickle.load(f)  # written by this job's own driver
    return run(graph, argv[1], int(argv[2]), int(argv[3]))


def run(graph: JobGraph, vertex: str, subtask: int, attempt: int) -> int:
    """Run task ``vertex[subtask]`` of ``graph``; its exit status."""
    name_process(f"weir {vertex}[{subtask}]")
    faulthandler.enable(all_threads=True)
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
        reported = task.fail(exc) if task is not None else report_failure(control, exc)
        where = f"weir: task {vertex}[{subtask}] (attempt {attempt})"
        if isinstance(exc, ChannelError):
            # a peer or the coordinator went away: the job's failure is elsewhere, so one
            # line, not a traceback
            _say(f"{where} stops: {_first_line(exc)}")
            return 1
        if not reported:  # nobody else has it: the traceback is printed here
            raise
        # the driver has the error and its traceback, and gives them to the program
        # that runs the job: one line here, not a traceback per failed attempt
        _say(f"{where} failed: {type(exc).__name__}: {_first_line(exc)} (reported to the "
             f"job's driver)")
        return 1
    finally:
        control.close()
    return 0


def _say(line: str) -> None:
    """Write ``line`` to stderr in one piece (one write: not split by the lines other
    processes of the job write to the same stderr at the same time)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of ``exc``'s message, at most ``limit`` characters."""
    lines = str(exc).splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
