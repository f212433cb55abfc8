"""The driver of a continuous job on this machine: launches one OS process per task,
hosts the coordinator, and runs the checkpoints.

1. **Launch.** The pipeline is pickled by value into the job's work directory; every
   task is a process forked by the :mod:`.zygote` (which imported the task code once)
   running ``weir.runtime.continuous.worker`` with the coordinator's address and the
   job's secret in its environment.
2. **Address exchange.** Each task registers on the control connection (a task with inputs
   with the address of its input gate); once all have, every task gets ``start``: the
   data addresses, the checkpoint to restore and the job's lineage (both decided by
   the one checkpoint protocol, :mod:`weir.checkpoint.protocol`: ``restore_from`` when
   given, else the storage's current state; after a restart, the run's own newest
   completed checkpoint). Tasks find each other by host:port only, never by
   assuming one machine — the same exchange ``BarrierTaskContext.allGather`` does
   on Spark.

   Before anything, the run claims the checkpoint storage (one owner; a running one
   refuses this run with ``OwnershipError``), renews the claim while it runs, checks
   it before every checkpoint, completion and clean-up (``FencedError`` once another
   run took over: this one stops and deletes nothing), and releases it at its end.
3. **Checkpoints.** A :class:`~.scheduling.CheckpointScheduler` decides; a started
   checkpoint is a ``trigger`` to every source task; every task acknowledges with its
   operators' parts; when all have, the metadata is published
   (:class:`~weir.checkpoint.coordinator.CheckpointCoordinator`, exclusively) and every
   task is notified (sinks commit). Declines, expiry and a failure to publish the
   metadata (Flink's ``FINALIZE_CHECKPOINT_FAILURE``) abort it and count against
   ``tolerable_failures``.
4. **End.** A bounded job's sources report their end; then a final checkpoint is
   forced (so every sink commits what it wrote), the sources are told to finish, and
   the job ends when every task has.

5. **Requests** from the job's client (:mod:`.client`, in another thread): a savepoint
   is a savepoint request to the scheduler; its checkpoint writes every snapshot in
   full into a fresh ``savepoint-<job>-<random>`` directory inside the target. A
   savepoint of a running job commits no side effects and is no recovery point (Flink
   >= 1.15): its tasks are not notified, their sinks commit its transactions with the
   next checkpoint. Stop-with-savepoint tells the sources to stop
   (draining or not); once every source reported its end, a synchronous savepoint
   takes the final checkpoint's place (its failure fails the job, as in Flink). Cancel
   kills every task at once and deletes the retained checkpoints unless
   ``retain_on_cancel``.

Any task failing or disappearing (a killed process is noticed at once through its
control connection) fails the attempt: every task process is killed, the attempt's
pending checkpoints are aborted, and — as the restart strategy allows (Flink's
default with checkpointing: exponential delay) — every task starts again from the
latest completed checkpoint (a global restart: sources rewound to its positions, sinks
committing what it holds and dropping what the failed attempt left open). When the
strategy gives up, :class:`~weir.errors.JobFailedError` names the root cause first and
is chained from it: the exception the failed task reported, rebuilt in the driver
(:mod:`.processes`; a ``KeyError`` of the user's function is a ``KeyError``).

A ``timeout`` (``execute(timeout=...)``) is a deadline for the whole run, restarts and
the waits before them included: when it passes, every task is stopped at once and
:class:`~weir.errors.JobTimeoutError` says so — naming, and chained from, the failure
the job was restarting after, if any.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

from weir.api.checkpointing import CheckpointConfig, CheckpointingMode
from weir.api.restart import RestartStrategy
from weir.checkpoint.coordinator import CheckpointCoordinator, PendingCheckpoint
from weir.checkpoint.format import CheckpointKind
from weir.checkpoint.protocol import JobOwnership, RestorePoint
from weir.errors import ConfigurationError, JobFailedError, JobTimeoutError, SinkLineageError
from weir.runtime.continuous import zygote
from weir.runtime.continuous.client import Command, JobResult
from weir.runtime.continuous.control import ControlServer, TaskId
from weir.runtime.continuous.graph import JobGraph, OpKind
from weir.runtime.continuous.inflight import check_edges
from weir.runtime.continuous.metrics import MetricsBoard
from weir.runtime.continuous.processes import check_heartbeats, root_cause, stop_processes
from weir.runtime.continuous.queries import QueryRouter, QueryServer, QueryServerConfig
from weir.runtime.continuous.rounds import Attempt, CheckpointRounds
from weir.runtime.continuous.scheduling import (
    CheckpointFailureReason,
    CheckpointScheduler,
    monotonic_ms,
)
from weir.runtime.continuous.spark_launcher import SparkLauncher, SparkStage
from weir.runtime.continuous.stats import CheckpointHistory, CheckpointStats, CheckpointStatus
from weir.runtime.continuous.task import task_address

__all__ = ["JobResult", "LocalJob"]

log = logging.getLogger("weir")


class LocalJob(CheckpointRounds):
    """Runs a :class:`JobGraph` with a process per task (see the module doc)."""

    def __init__(self, graph: JobGraph, checkpointing: CheckpointConfig, *,
                 restart: RestartStrategy | None = None, workdir: str | Path | None = None,
                 retained: int = 3, sleep: Callable[[float], None] | None = None,
                 restore_from: str | Path | None = None,
                 allow_non_restored_state: bool = False,
                 launcher: SparkLauncher | None = None,
                 query_server: QueryServerConfig | None = None,
                 lease_timeout_ms: int = 60_000) -> None:
        self.graph, self.checkpointing = graph, checkpointing
        #: where the tasks run: None, processes forked here; else a Spark barrier stage
        self.launcher = launcher
        self.restore_from = None if restore_from is None else str(restore_from)
        self.allow_non_restored_state = allow_non_restored_state
        #: Flink's default with checkpointing on: exponential delay
        self.restart = restart if restart is not None else RestartStrategy.exponential_delay()
        self._cancel = threading.Event()
        #: waits between attempts (default: until the delay passed or a cancel)
        self.sleep: Callable[[float], Any] = sleep or self._cancel.wait
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"weir-{graph.job}-"))
        self._made_workdir = workdir is None  # (private to this user: mkdtemp's 0700)
        # (no side effect before the storage is claimed: clean-up only by its owner)
        self.coordinator = CheckpointCoordinator(graph.checkpoint_storage, retained=retained,
                                                 storage_options=graph.storage_options,
                                                 clean_up=False)
        #: the run's claim on the checkpoint storage, and what it restores
        self.ownership = JobOwnership(self.coordinator, graph.job, graph.run_id,
                                      lease_timeout_ms=lease_timeout_ms)
        self.attempt = 0
        self._inbox: queue.Queue[tuple[TaskId, dict[str, Any]]] = queue.Queue()
        self._procs: dict[TaskId, zygote.TaskProcess | SparkStage] = {}
        #: the OS process id each task of the attempt registered with (on Spark: on
        #: its executor's host)
        self.task_pids: dict[TaskId, int] = {}
        self._pending: dict[int, tuple[PendingCheckpoint, set[TaskId]]] = {}
        #: savepoints aborted while the attempt's tasks ran (deleted again at its end)
        self._aborted: list[PendingCheckpoint] = []
        self._finished: set[TaskId] = set()
        self._heard: dict[TaskId, float] = {}  # when each task was last heard from
        #: what the running tasks' heartbeats report (JobClient.metrics())
        self.metrics = MetricsBoard()
        #: live state queries: routed to the owning task; the endpoint while running
        self.queries = QueryRouter(graph, lambda: self._inbox.put((CLIENT, {"kind": "query"})))
        self.query_config = query_server or QueryServerConfig()
        self.query_server: QueryServer | None = None
        self.result = JobResult()
        self._lock = threading.Lock()
        self._commands: list[Command] = []  # from the client, not yet taken up
        self._requested: dict[int, Command] = {}  # savepoint requests by request id
        self._savepoints: dict[int, Command] = {}  # started ones by checkpoint id
        self._stopping: Command | None = None
        self.history = CheckpointHistory()
        #: the run's timeout (seconds; None: none) and the failure it last restarted after
        self._timeout_s: float | None = None
        self._last_failure: JobFailedError | None = None

    # -- what the client asks (from its thread)

    def submit(self, command: Command) -> None:
        """Take up ``command`` (a savepoint, or stop-with-savepoint) in the driver loop."""
        with self._lock:
            self._commands.append(command)
        self._inbox.put((CLIENT, {"kind": "command"}))  # wakes the loop

    def cancel(self) -> None:
        """Stop every task now (the job ends cancelled)."""
        self._cancel.set()
        self._inbox.put((CLIENT, {"kind": "cancel"}))

    def checkpoint_stats(self) -> list[CheckpointStats]:
        """Every checkpoint and savepoint triggered so far, oldest first."""
        return self.history.snapshot()

    def run(self, timeout_s: float | None = None) -> JobResult:
        """Run the job to its end (bounded sources), restarting every task from the
        latest completed checkpoint after a failure as the restart strategy allows;
        raises :class:`~weir.errors.JobFailedError` once it gives up, and
        :class:`~weir.errors.JobTimeoutError` once ``timeout_s`` seconds passed (its
        tasks stopped)."""
        started = time.monotonic()
        deadline = math.inf if timeout_s is None else started + timeout_s
        self._timeout_s, self._last_failure = timeout_s, None
        tracker = self.restart.tracker()
        finished = discarded = False
        self.claim()
        try:
            self.query_server = QueryServer(self.queries, self.query_config,
                                            metrics=self.metrics.snapshot,
                                            checkpoints=self.history.snapshot)
            while not self._cancel.is_set():  # (a cancel during a restart's delay)
                try:
                    self._run_attempt(deadline)
                    finished = True
                    break
                except _Cancelled:
                    break
                except _DeadlinePassed:
                    raise self._timed_out(tracker.restarts, running=True) from (
                        _cause(self._last_failure))
                except JobFailedError as exc:
                    self._on_failure(exc, tracker, deadline)
            if not finished:  # cancelled
                self.result.cancelled = True
                if not self.checkpointing.retain_on_cancel and self.ownership.holds():
                    self.coordinator.discard_all(still_owner=self.ownership.holds)
                    discarded = True
        finally:
            self._remove_graph_file()
            self.ownership.release(discarded=discarded)
            self._fail_commands(f"job {self.graph.job!r} ended")
            self.queries.set_running(False, f"job {self.graph.job!r} ended")
            if self.query_server is not None:
                self.query_server.close()
        self.result.restarts = tracker.restarts
        self.result.duration_s = time.monotonic() - started
        return self.result

    def claim(self) -> None:
        """Claim the checkpoint storage and decide what the run starts from (raises
        OwnershipError, or CorruptCheckpointError for a corrupt newest checkpoint);
        then delete what no checkpoint references (as its owner). Once per run:
        :meth:`run` claims unless this was called before."""
        if self.ownership.start is not None:
            return
        start = self.ownership.claim(self.restore_from, self.graph.storage_options)
        try:
            if start.checkpoint is not None:
                start.checkpoint.check_operators(
                    self.graph.uids(), self.allow_non_restored_state)
                check_edges(start.checkpoint, self.graph, self.allow_non_restored_state)
            self.coordinator.clean_up_orphans(still_owner=self.ownership.holds)
        except BaseException:
            self.ownership.release()
            raise

    def _on_failure(self, exc: JobFailedError, tracker: Any, deadline: float) -> None:
        """An attempt failed with ``exc``: wait and restart (return) as the restart
        strategy allows, else raise the job's error, chained from the root cause."""
        first = str(exc).splitlines()[0]
        self.result.failures.append(first)
        self._last_failure = exc
        done = tracker.restarts  # (on_failure counts the one it grants)
        delay = tracker.on_failure(time.monotonic())
        if delay is None:
            raise JobFailedError(_amended(
                exc, f"its restart strategy {self.restart} allows no more restarts after "
                     f"{tracker.restarts}; the latest completed checkpoint is in "
                     f"{self.graph.checkpoint_storage}")) from _cause(exc)
        left = deadline - time.monotonic()
        if delay >= left:  # the timeout comes first: wait for it, not past it
            log.warning("weir: %s; restart %d would be in %.3g s, after the job's timeout "
                        "(in %.3g s)", first, tracker.restarts, delay, left)
            self.sleep(max(left, 0.0))
            if not self._cancel.is_set():
                raise self._timed_out(done, running=False) from _cause(exc)
            return
        log.warning("weir: %s; restart %d in %.3g s from the latest completed checkpoint",
                    first, tracker.restarts, delay)
        self.sleep(delay)
        if not self._cancel.is_set():  # (cancelled while waiting: no next attempt)
            self.attempt += 1

    def _timed_out(self, restarts: int, *, running: bool) -> JobTimeoutError:
        """The error of a run whose timeout passed: while an attempt ran
        (``running``), or while the job waited to restart after a failure."""
        timeout = f"timeout of {self._timeout_s:g} s"
        last = self._last_failure
        if last is None:
            return JobTimeoutError(f"job {self.graph.job!r} did not finish within its {timeout} "
                                   f"(execute(timeout=...)); its tasks were stopped")
        if not running:
            return JobTimeoutError(_amended(
                last, f"the job's {timeout} passed before it could restart (after "
                      f"{restarts} restart(s)); its tasks were stopped"))
        return JobTimeoutError(
            f"job {self.graph.job!r} did not finish within its {timeout}; its tasks were "
            f"stopped. It had restarted {restarts} time(s), the last after: "
            f"{str(last).splitlines()[0]}")

    def _run_attempt(self, deadline: float) -> None:
        """One attempt: launch every task, run to the end; JobFailedError on failure
        (every process killed, the attempt's pending checkpoints aborted)."""
        self._inbox = queue.Queue()
        if self._commands or self._cancel.is_set():
            self._inbox.put((CLIENT, {"kind": "command"}))
        self._procs, self._finished, self._heard = {}, set(), {}
        self.metrics.forget()
        self.task_pids = {}
        secret = os.urandom(32)
        inbox = self._inbox
        server = ControlServer(lambda t, m: inbox.put((t, m)), secret=secret,
                               job=self.graph.job,
                               host="127.0.0.1" if self.launcher is None else self.launcher.host)
        finished = False
        try:
            self._launch(server, secret)
            self._run(server, deadline)
            finished = True
        except JobFailedError as exc:
            self._fail_commands(str(exc).splitlines()[0])
            raise
        finally:
            self.queries.set_running(False, f"job {self.graph.job!r} is restarting (attempt "
                                            f"{self.attempt} ended)")
            server.close()
            stop_processes(self._procs.values(), grace_s=5.0 if finished else 0.0)
            owner = self.ownership.holds()  # (fenced off: delete nothing)
            for cid, (pending, _) in self._pending.items():
                if owner or pending.kind is CheckpointKind.SAVEPOINT:
                    self.coordinator.abort(pending)
                self.history.update(cid, status=CheckpointStatus.FAILED,
                                    failure="the attempt ended")
            self._pending.clear()
            # the attempt's tasks are stopped, no checkpoint is in flight: delete what
            # they wrote that nothing references (an upload that ended after its
            # checkpoint's abort, a materialization no checkpoint completed with)
            for pending in self._aborted:  # (a savepoint's files: in its own directory)
                self.coordinator.abort(pending)
            self._aborted.clear()
            try:
                if owner:
                    self.coordinator.clean_up_orphans(still_owner=self.ownership.holds)
            except OSError as exc:  # (never in place of the attempt's own outcome)
                log.warning("weir: job %r: cleaning up the checkpoint storage after attempt "
                            "%d failed (%s); the next start deletes what is left",
                            self.graph.job, self.attempt, exc)

    # -- phases

    def _launch(self, server: ControlServer, secret: bytes) -> None:
        config = self.checkpointing
        graph = dataclasses.replace(
            self.graph, at_least_once=config.mode is CheckpointingMode.AT_LEAST_ONCE,
            unaligned=config.unaligned, aligned_timeout_ms=config.aligned_timeout_ms,
            snapshot=config.snapshot_for(self.graph.state_backend).value,
            materialization_interval_ms=config.materialization_interval_ms)
        pickled: bytes = cloudpickle.dumps(graph)  # type: ignore[no-untyped-call]
        job_env = {"WEIR_JOB_SECRET": secret.hex(),
                   "WEIR_COORDINATOR": f"{server.address[0]}:{server.address[1]}"}
        if self.launcher is not None:
            inbox = self._inbox
            self._procs.update(self.launcher.launch(
                pickled, job_env, list(self.graph.tasks()), self.graph.job, self.attempt,
                lambda task, message: inbox.put((task, message)), self.graph.checkpoint_storage,
                self._sink_locations(), storage_options=self.graph.storage_options))
            return
        self.workdir.mkdir(mode=0o700, exist_ok=True)
        graph_file = self.workdir / "graph.pickle"
        graph_file.write_bytes(pickled)
        env = {**os.environ, **job_env}
        for vertex, subtask in self.graph.tasks():
            self._procs[(vertex, subtask)] = zygote.launch(
                [str(graph_file), vertex, str(subtask), str(self.attempt)], env)

    def _remove_graph_file(self) -> None:
        """Delete the graph file (the job's functions and storage options) once no task
        runs, and the work directory if this job made it."""
        with contextlib.suppress(OSError):
            (self.workdir / "graph.pickle").unlink(missing_ok=True)
            if self._made_workdir:
                self.workdir.rmdir()

    def _sink_locations(self) -> tuple[tuple[str, str], ...]:
        """(uid, location) of every place the job's sinks write (``Sink.locations``)."""
        ops = [op for v in self.graph.vertices for op in v.chain]
        ops += [op.dead_letters for op in ops if op.dead_letters is not None]
        return tuple((str(op.uid), location) for op in ops if op.kind is OpKind.SINK
                     for location in op.fn.locations())

    def _next(self, deadline: float, wait_s: float | None = None
              ) -> tuple[TaskId, dict[str, Any]] | None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _DeadlinePassed
        check_heartbeats(self._heard, self._finished, self.graph)
        try:
            wait = left if wait_s is None else min(left, wait_s)
            item = self._inbox.get(timeout=None if wait == math.inf else wait)
        except queue.Empty:
            return None
        task, message = item
        if task == CLIENT:
            if self._cancel.is_set():
                raise _Cancelled
            return item
        self._heard[task] = time.monotonic()
        if "metrics" in message:  # (a heartbeat)
            self.metrics.update(task, message["metrics"])
        log.debug("job %s: %s[%d]: %s", self.graph.job, task[0], task[1],
                  {k: v for k, v in message.items() if k != "parts"})
        if message["kind"] == "disconnected" and task in self._finished:
            return None  # it finished and closed its connection
        if message["kind"] == "failed" and message.get("fatal"):
            error = (SinkLineageError if message.get("error_type") == "SinkLineageError"
                     else ConfigurationError)
            raise error(f"job {self.graph.job!r}: {message['error']}")
        if message["kind"] in ("failed", "disconnected"):
            raise root_cause(item, self._inbox, self._finished, self.graph.job,
                             self._exit_status)
        return item

    def _exit_status(self, task: TaskId) -> int | None:
        """How the process of ``task`` ended (``Popen.returncode``), once it ended
        within a second; None if it runs on, or runs in a Spark stage."""
        proc = self._procs.get(task)
        if not isinstance(proc, (zygote.TaskProcess, subprocess.Popen)):
            return None
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return None

    def _restore_point(self) -> RestorePoint:
        """What every task of this attempt restores (:mod:`weir.checkpoint.protocol`):
        the run's own newest completed checkpoint, else the state the run started from
        (``restore_from``, or the storage's state when the run claimed it)."""
        point = self.ownership.restart_point()
        log.info("weir: job %r attempt %d restores %s", self.graph.job, self.attempt,
                 point.note)
        self.result.restored.append(point.note)
        return point

    def _run(self, server: ControlServer, deadline: float) -> None:
        graph = self.graph
        tasks = set(graph.tasks())
        addresses: dict[str, list[Any]] = {}
        registered: set[TaskId] = set()
        while registered != tasks:
            got = self._next(deadline)
            if got is not None and got[1]["kind"] == "registered":
                registered.add(got[0])
                self.task_pids[got[0]] = int(got[1].get("pid") or 0)
                if got[1]["address"] is not None:
                    addresses[task_address(*got[0])] = got[1]["address"]
        start = {"kind": "start", "addresses": addresses, "restore": self._restore_point().url,
                 "lineage": self.ownership.lineage_id}
        for task in tasks:
            server.send(task, start)
        self.queries.set_running(True)
        # (intervals, pauses and timeouts on the monotonic clock; the wall clock only for
        # the trigger timestamps that go into the metadata)
        scheduler = CheckpointScheduler(self.checkpointing, monotonic_ms, wall_clock=_clock,
                                        first_id=self.coordinator.next_id)
        scheduler.start()
        run = Attempt(server, scheduler, tasks, set(graph.sources()))
        while self._finished != tasks:
            self._take_commands(run)
            self.queries.dispatch(server.send)
            for decision in scheduler.poll():
                started_id = self._decide(decision, run)
                if started_id is not None and run.final_id is None and run.ended == run.sources:
                    run.final_id = started_id
            delay_ms = scheduler.wakeup_delay_ms()
            wait = 0.5 if delay_ms is None else delay_ms / 1000
            got = self._next(deadline, min(wait, 0.5))
            if got is None:
                continue
            task, message = got
            kind = message["kind"]
            if kind == "ack":
                for decision in self._ack(task, message, run):
                    self._decide(decision, run)
                if run.final_id is not None and run.final_id in self.result.completed:
                    for source in run.sources:
                        server.send(source, {"kind": "finish"})
                    run.final_id = -1
            elif kind == "decline":
                for decision in scheduler.declined(int(message["id"]),
                                                     CheckpointFailureReason.of_decline(message)):
                    self._decide(decision, run)
            elif kind == "source_end":
                run.ended.add(task)
                if run.ended == run.sources:
                    self._request_final(run)
            elif kind == "finished":
                self._finished.add(task)
            elif kind == "query_result":
                self.queries.answered(message)
            if run.final_id not in (None, -1) and run.final_id not in self._pending and (
                    run.final_id not in self.result.completed):
                if self._stopping is not None:  # Flink: a failed sync savepoint fails the job
                    raise JobFailedError(f"job {graph.job!r}: the savepoint of "
                                         f"stop-with-savepoint {run.final_id} failed")
                run.final_id = None  # the final checkpoint was aborted: force another
                self._request_final(run)

class _Cancelled(Exception):
    """The client cancelled the job."""


class _DeadlinePassed(Exception):
    """The run's timeout passed while an attempt ran."""


def _cause(error: BaseException | None) -> BaseException | None:
    """What a job's error is chained from: the root cause of ``error`` (the exception
    a task reported, rebuilt), else ``error`` itself."""
    if error is None:
        return None
    return error.__cause__ if error.__cause__ is not None else error


def _amended(error: BaseException, more: str) -> str:
    """``error``'s message with `` — more`` at the end of its first line."""
    first, _, rest = str(error).partition("\n")
    return f"{first} — {more}" + (f"\n{rest}" if rest else "")


#: the sender of the client's wake-ups in the driver's inbox
CLIENT: TaskId = ("", -1)


def _clock() -> int:
    return int(time.time() * 1000)

