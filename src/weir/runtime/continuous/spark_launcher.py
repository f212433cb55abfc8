"""Hosting a continuous job's tasks on Spark: one barrier-mode stage per attempt.

``StreamEnvironment.execute(..., runner="spark", spark=session)`` runs the job's driver
(the checkpoint coordinator, :mod:`.master`) in this process as on the local runner,
and its tasks as the Spark tasks of one barrier stage (``rdd.barrier().mapPartitions``,
one partition per weir task, all scheduled at once): Spark task ``i`` starts weir task
``i`` (``python -m weir.runtime.continuous.worker``) in a process of its own on its
executor and waits for it. A weir task registers its channel address with the
coordinator, which hands every address out in the ``start`` message — the address
exchange Spark's ``allGather`` would do, through the coordinator the tasks need anyway.

The stage runs in a thread of the driver under a job group of its own. When the
attempt ends — finished, or failed and to be restarted under the job's restart
strategy — the driver cancels the group, which kills the stage's tasks and their
Python workers; each weir task process dies with the Python worker that started it
(``PR_SET_PDEATHSIG``) and, failing that, once the coordinator it talks to closes its
connection. Spark does not retry a failed barrier result stage; a restart is a new
stage (Flink's global restart).

All of a job's tasks need a task slot at the same time: a job with more tasks than the
application has slots is refused at once (Spark would re-check for ten minutes). The
coordinator and the channels listen on loopback, so the executors must be on this host
(``local[N]``, ``local-cluster[...]``); other masters are refused with a clear error.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from weir.errors import ConfigurationError

__all__ = ["SparkLauncher"]

TaskId = tuple[str, int]


class SparkLauncher:
    """Starts an attempt's tasks as one barrier stage of ``spark``'s application."""

    def __init__(self, spark: Any) -> None:
        self.sc = spark.sparkContext
        master = str(self.sc.master)
        if not master.startswith(("local[", "local-cluster[")) and master != "local":
            raise ConfigurationError(
                f"the continuous runtime on Spark runs on local[N] and local-cluster[...] "
                f"masters for now (the coordinator and the channels listen on loopback); "
                f"this session's master is {master!r}: use runner='local' or a local master")

    def slots(self) -> int:
        """Task slots of the application (what a barrier stage may use at once)."""
        return int(self.sc.defaultParallelism)

    def launch(self, graph: bytes, env: dict[str, str], tasks: list[TaskId], job: str,
               attempt: int, report: Callable[[TaskId, dict[str, Any]], None]
               ) -> dict[TaskId, SparkStage]:
        """Submit the stage running ``tasks`` (``graph``: the pickled job graph; ``env``:
        the coordinator's address and the job's secret); the stage's handle per task.
        A stage that fails on Spark's side is reported through ``report`` as the
        failure of the first task."""
        if len(tasks) > self.slots():
            raise ConfigurationError(
                f"job {job!r} needs {len(tasks)} task slots at once (one per task: "
                f"{', '.join(f'{v}[{s}]' for v, s in tasks)}) and the Spark application "
                f"has {self.slots()}; give it more cores (local[{len(tasks)}], more "
                f"executors or executor cores) or lower the job's parallelism")
        stage = SparkStage(self.sc, graph, env, tasks, job, attempt, report)
        return dict.fromkeys(tasks, stage)


class SparkStage:
    """One attempt's barrier stage; what stopping an attempt needs of its tasks
    (``poll``, ``wait``, ``kill``: all of the stage at once)."""

    #: no OS process of this one's own (its tasks run on executors)
    pid = 0

    def __init__(self, sc: Any, graph: bytes, env: dict[str, str], tasks: list[TaskId],
                 job: str, attempt: int,
                 report: Callable[[TaskId, dict[str, Any]], None]) -> None:
        self.sc = sc
        self.group = f"weir-{job}-{attempt}-{uuid.uuid4().hex[:8]}"
        self.code: int | None = None
        self._killed = False
        self._thread = threading.Thread(
            target=self._run, args=(graph, env, tasks, job, attempt, report),
            name=f"spark stage {self.group}", daemon=True)
        self._thread.start()

    def _run(self, graph: bytes, env: dict[str, str], tasks: list[TaskId], job: str,
             attempt: int, report: Callable[[TaskId, dict[str, Any]], None]) -> None:
        sc = self.sc
        sc.setJobGroup(self.group, f"weir continuous job {job}, attempt {attempt}",
                       interruptOnCancel=True)
        try:
            codes = (sc.parallelize(range(len(tasks)), len(tasks)).barrier()
                     .mapPartitions(_task_runner(graph, env, tasks, attempt)).collect())
            self.code = next((c for c in codes if c != 0), 0)
        except Exception as exc:
            self.code = 1
            if not self._killed:
                report(tasks[0], {"kind": "failed", "error": (
                    f"the Spark barrier stage running the job's tasks failed: "
                    f"{_cause(exc)}")})

    def poll(self) -> int | None:
        """None while the stage runs; then 0 if every task exited with 0."""
        return self.code

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the stage's end (``subprocess.TimeoutExpired`` after ``timeout``)."""
        self._thread.join(timeout)
        if self._thread.is_alive() or self.code is None:
            raise subprocess.TimeoutExpired(self.group, timeout or 0.0)
        return self.code

    def kill(self) -> None:
        """Cancel the stage (every task of the attempt)."""
        self._killed = True
        self.sc.cancelJobGroup(self.group)


def _cause(exc: BaseException) -> str:
    """What a failed stage says: the Python error of its tasks when Spark carries one
    (a ``Py4JJavaError``'s first line says only which call failed), with the fix for
    executors whose Python cannot import weir."""
    text = str(exc)
    errors = re.findall(r"^(\w[\w.]*(?:Error|Exception): .*)$", text, re.MULTILINE)
    python = next((e for e in errors if not e.startswith(("py4j", "org.", "java."))), None)
    cause = python or (text.strip().splitlines() or [type(exc).__name__])[0]
    if "No module named 'weir'" in cause:
        cause += (" (the executors' Python cannot import weir: set spark.pyspark.python or "
                  "PYSPARK_PYTHON to an interpreter that has it, before the session starts)")
    return cause


def _task_runner(graph: bytes, env: dict[str, str], tasks: list[TaskId], attempt: int
                 ) -> Callable[[Iterator[Any]], Iterator[int]]:
    """The function of the stage's partitions: partition ``i`` runs weir task ``i``."""

    def run(_: Iterator[Any]) -> Iterator[int]:
        from pyspark import BarrierTaskContext

        vertex, subtask = tasks[BarrierTaskContext.get().partitionId()]
        workdir = tempfile.mkdtemp(prefix=f"weir-task-{vertex}-{subtask}-")
        try:
            path = os.path.join(workdir, "graph.pickle")
            with open(path, "wb") as f:
                f.write(graph)
            proc = subprocess.Popen(
                [sys.executable, "-m", "weir.runtime.continuous.worker", path, vertex,
                 str(subtask), str(attempt)],
                env={**os.environ, **env}, preexec_fn=_die_with_parent)
            try:
                code = proc.wait()
            finally:
                if proc.poll() is None:  # this Python worker is being stopped
                    proc.kill()
                    proc.wait()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        yield code

    return run


def _die_with_parent() -> None:
    """(In the child, before exec.) SIGKILL this process when its parent — the Spark
    Python worker — dies (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere the task ends
    when the coordinator closes its connection)."""
    with contextlib.suppress(Exception):
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
