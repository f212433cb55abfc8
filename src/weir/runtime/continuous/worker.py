"""The process of one task of a continuous job::

    python -m weir.runtime.continuous.worker SPEC_FILE VERTEX SUBTASK ATTEMPT

with the coordinator's address in ``WEIR_COORDINATOR`` (``host:port``) and the job's
shared secret in ``WEIR_JOB_SECRET`` (hex; never on the command line, where other
users of the machine could read it). The spec file is the job's
:class:`~weir.runtime.continuous.graph.PipelineSpec`, pickled by the driver that
launched the job (the user's functions travel by value).

The task registers (a keyed task with the address of its input gate), waits for the
coordinator's ``start`` (the data addresses of every task, the checkpoint to restore),
and runs until it finishes, fails (reported, exit status 1) or loses the coordinator.
"""

from __future__ import annotations

import os
import pickle
import sys

from weir.runtime.continuous.control import ControlClient
from weir.runtime.continuous.graph import PipelineSpec
from weir.runtime.continuous.task import KeyedTask, SourceTask


def main(argv: list[str]) -> int:
    """Run one task; its exit status."""
    spec_file, vertex, subtask, attempt = argv[0], argv[1], int(argv[2]), int(argv[3])
    with open(spec_file, "rb") as f:
        spec: PipelineSpec = pickle.load(f)  # written by this job's own driver
    secret = bytes.fromhex(os.environ["WEIR_JOB_SECRET"])
    host, port = os.environ["WEIR_COORDINATOR"].rsplit(":", 1)
    control = ControlClient((host, int(port)), secret=secret, job=spec.job, task=vertex,
                            subtask=subtask)
    task: SourceTask | KeyedTask
    try:
        if vertex == spec.source_uid:
            task = SourceTask(spec, subtask, attempt, control)
            control.send({"kind": "registered", "address": None})
        else:
            task = KeyedTask(spec, subtask, attempt, control)
            server, gate = task.listen(secret)
            control.send({"kind": "registered", "address": list(server.address)})
        start = control.receive(None)
        if start is None or start.get("kind") != "start":
            raise RuntimeError(f"expected start from the coordinator, got {start!r}")
        if isinstance(task, SourceTask):
            task.run(start, secret)
        else:
            task.run(start, gate)
    except BaseException as exc:
        task_fail = locals().get("task")
        if task_fail is not None:
            task_fail.fail(exc)
        raise
    finally:
        control.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
