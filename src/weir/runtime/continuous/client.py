"""A running continuous job, seen from the program that started it (Flink's
``JobClient``): :meth:`JobClient.trigger_savepoint`, :meth:`JobClient.stop_with_savepoint`,
:meth:`JobClient.cancel`, :meth:`JobClient.checkpoints`, :meth:`JobClient.wait`.

The job's driver (:class:`~.master.LocalJob`) runs in a background thread; a request is
a :class:`Command` it takes up in its loop, answered through the command's future.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weir.errors import ConfigurationError, QueryError
from weir.runtime.continuous.queries import QueryServer
from weir.runtime.continuous.stats import CheckpointStats, CheckpointStatus
from weir.runtime.task_metrics import TaskMetrics

if TYPE_CHECKING:
    from weir.runtime.continuous.master import LocalJob

__all__ = [
    "CheckpointStats", "CheckpointStatus", "Command", "JobClient", "JobResult",
    "TaskInfo", "run_job",
]

def run_job(job: LocalJob, timeout_s: float | None) -> JobResult:
    """Run ``job`` to its end in this thread; ``timeout_s``: its deadline in seconds,
    restarts included, None for none (Flink's ``execute`` has none): past it, its
    tasks are stopped and :class:`~weir.errors.JobTimeoutError` is raised."""
    return job.run(timeout_s=timeout_s)


@dataclass
class JobResult:
    """What a finished job did."""

    completed: list[int] = field(default_factory=list)
    aborted: list[tuple[int, str]] = field(default_factory=list)
    #: the first line of each failure that caused a restart (or ended the job)
    failures: list[str] = field(default_factory=list)
    restarts: int = 0
    duration_s: float = 0.0
    #: the job was cancelled (JobClient.cancel)
    cancelled: bool = False
    #: the savepoint stop-with-savepoint ended it with
    savepoint: str | None = None
    #: what each attempt restored (which checkpoint or savepoint, or empty state)
    restored: list[str] = field(default_factory=list)


@dataclass
class Command:
    """A request to the job's driver: ``savepoint`` (into ``target``), ``stop``
    (stop-with-savepoint into ``target``, ``drain`` or not); answered through
    ``future`` (the savepoint's URL)."""

    kind: str
    target: str
    drain: bool = False
    future: Future[str] = field(default_factory=Future)


@dataclass(frozen=True)
class TaskInfo:
    """One running task process of a job on this machine."""

    #: the task's vertex (its chain's first operator's uid) and subtask index
    vertex: str
    subtask: int
    #: its OS process id
    pid: int
    #: the job's attempt it belongs to (0, then one more per restart)
    attempt: int


def _seconds(timeout: float | timedelta | None) -> float | None:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else timeout


class JobClient:
    """A job started by :meth:`weir.stream.StreamEnvironment.execute_async`, run in a
    background thread with a deadline of ``timeout_s`` seconds (None: none)."""

    def __init__(self, job: LocalJob, timeout_s: float | None = None) -> None:
        self._job = job
        self._result: Future[JobResult] = Future()
        self._thread = threading.Thread(target=self._run, args=(timeout_s,),
                                        name=f"weir job {job.graph.job}", daemon=True)
        self._thread.start()

    def _run(self, timeout_s: float | None) -> None:
        try:
            self._result.set_result(run_job(self._job, timeout_s))
        except BaseException as exc:
            self._result.set_exception(exc)

    @property
    def job_name(self) -> str:
        """The job's name (with the suffix that makes it unique)."""
        return self._job.graph.job

    @property
    def done(self) -> bool:
        """Whether the job ended (finished, failed or cancelled)."""
        return self._result.done()

    def wait(self, timeout: float | timedelta | None = None) -> JobResult:
        """Wait for the job's end; what it did (``cancelled`` if it was). Raises
        :class:`~weir.errors.JobFailedError` if it failed (chained from the exception
        its failed task raised, rebuilt here: a ``KeyError`` of the user's function is
        a ``KeyError``), :class:`~weir.errors.JobTimeoutError` if it ran past the job's
        own timeout (its tasks stopped), TimeoutError if it is still running after
        ``timeout`` (this wait's; the job goes on)."""
        return self._result.result(_seconds(timeout))

    def checkpoints(self) -> list[CheckpointStats]:
        """Every checkpoint and savepoint triggered so far, oldest first."""
        return self._job.checkpoint_stats()

    def metrics(self) -> list[TaskMetrics]:
        """Every running task's recent metrics — time backpressured, idle and busy,
        records in and out per second, buffers queued per channel, watermark — from
        its latest heartbeats (about once a second; none between attempts)."""
        return self._job.metrics.snapshot()

    def query_state(self, uid: str, state: str, key: Any,
                    timeout: float | timedelta = 30.0) -> Any:
        """The live value of queryable ``state`` (``descriptor.queryable(state)``) of the
        keyed operator ``uid`` for ``key``, read by the task that owns the key between
        two buffers of its input (None when the key has none). Raises
        :class:`~weir.errors.QueryError` for an unknown operator or state, or while the
        job restarts."""
        return self._job.queries.ask(uid, state, key).result(_seconds(timeout))

    @property
    def query_address(self) -> str:
        """``host:port`` of the job's query endpoint (``weir.QueryableStateClient``);
        waits until the job started it."""
        server = self._wait_for_query_server()
        return f"{server.address[0]}:{server.address[1]}"

    @property
    def query_secret(self) -> str:
        """The secret query clients prove (``QueryServerConfig.secret``, or random)."""
        return self._wait_for_query_server().secret

    def _wait_for_query_server(self) -> QueryServer:
        deadline = time.monotonic() + 30
        while self._job.query_server is None:
            if time.monotonic() > deadline or self.done:
                raise QueryError(f"job {self.job_name!r} has no query endpoint (it is "
                                 f"not running)")
            time.sleep(0.01)
        return self._job.query_server

    def tasks(self) -> list[TaskInfo]:
        """The job's task processes running now, by vertex and subtask (none between
        attempts and after the end; on Spark, only those that registered their pid)."""
        job = self._job
        attempt, procs, pids = job.attempt, dict(job._procs), dict(job.task_pids)
        running = [(task, pids.get(task) or proc.pid)  # (a Spark stage has pid 0)
                   for task, proc in sorted(procs.items()) if proc.poll() is None]
        return [TaskInfo(vertex, subtask, pid, attempt)
                for (vertex, subtask), pid in running if pid > 0]

    def trigger_savepoint(self, target: str | Path,
                          timeout: float | timedelta | None = 600.0) -> str:
        """Take a savepoint into a new directory ``savepoint-<job>-<random>`` inside the
        directory ``target`` (self-contained, canonical: it restores on any runtime at
        any parallelism) while the job goes on; its URL. As in Flink (>= 1.15) it
        commits no side effects — the sinks commit its transactions with the next
        checkpoint — and a failure restores the latest checkpoint, not it. Raises
        :class:`~weir.errors.CheckpointError` if it fails (it then deletes only its own
        directory)."""
        return self._submit(Command("savepoint", str(target)), timeout)

    def stop_with_savepoint(self, target: str | Path, *, drain: bool = False,
                            timeout: float | timedelta | None = 600.0) -> str:
        """Stop the sources, take a last savepoint into a new directory inside
        ``target`` (as :meth:`trigger_savepoint`), commit the sinks and end the job; the
        savepoint's URL. With ``drain`` event time first jumps to
        the end, so every event-time timer fires (for a job that will not resume);
        without, pending timers stay in the savepoint (to resume it later)."""
        return self._submit(Command("stop", str(target), drain), timeout)

    def cancel(self) -> JobResult:
        """Stop every task now, with no final checkpoint; the job's result. The
        retained checkpoints are deleted unless ``retain_on_cancel``."""
        self._job.cancel()
        return self.wait()

    def _submit(self, command: Command, timeout: float | timedelta | None) -> str:
        if not command.target:
            raise ConfigurationError("a savepoint needs a target directory")
        if self.done:
            raise ConfigurationError(f"job {self.job_name!r} has ended")
        self._job.submit(command)
        return command.future.result(_seconds(timeout))

    def __repr__(self) -> str:
        state = "ended" if self.done else "running"
        return f"JobClient({self.job_name!r}, {state})"

    def __enter__(self) -> JobClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.done:
            self.cancel()
