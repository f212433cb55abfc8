"""The driver of a continuous job on this machine: launches one OS process per task,
hosts the coordinator, and runs the checkpoints.

1. **Launch.** The pipeline is pickled by value into the job's work directory; every
   task is started as ``python -m weir.runtime.continuous.worker`` with the
   coordinator's address and the job's secret in its environment.
2. **Address exchange.** Each task registers on the control connection (a task with inputs
   with the address of its input gate); once all have, every task gets ``start``: the
   data addresses and the checkpoint to restore (the latest completed one in the
   checkpoint storage, or none). Tasks find each other by host:port only, never by
   assuming one machine — the same exchange ``BarrierTaskContext.allGather`` will do
   on Spark.
3. **Checkpoints.** A :class:`~.scheduling.CheckpointScheduler` decides; a started
   checkpoint is a ``trigger`` to every source task; every task acknowledges with its
   operators' parts; when all have, the metadata is published
   (:class:`~weir.checkpoint.coordinator.CheckpointCoordinator`) and every task is
   notified (sinks commit). Declines and expiry abort it.
4. **End.** A bounded job's sources report their end; then a final checkpoint is
   forced (so every sink commits what it wrote), the sources are told to finish, and
   the job ends when every task has.

Any task failing or disappearing (a killed process is noticed at once through its
control connection) fails the attempt: every task process is killed, the attempt's
pending checkpoints are aborted, and — as the restart strategy allows (Flink's
default with checkpointing: exponential delay) — every task starts again from the
latest completed checkpoint (a global restart: sources rewound to its positions, sinks
committing what it holds and dropping what the failed attempt left open). When the
strategy gives up, :class:`~weir.errors.JobFailedError` names the root cause.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

from weir.api.checkpointing import CheckpointConfig, CheckpointingMode
from weir.api.restart import RestartStrategy
from weir.checkpoint.coordinator import (
    CheckpointCoordinator,
    PendingCheckpoint,
    load_checkpoint,
)
from weir.checkpoint.format import decode_part
from weir.errors import ConfigurationError, JobFailedError, WeirError
from weir.runtime.continuous.control import ControlServer, TaskId
from weir.runtime.continuous.graph import JobGraph
from weir.runtime.continuous.scheduling import (
    AbortedCheckpoint,
    CheckpointFailureReason,
    CheckpointScheduler,
    Decision,
    JobFailure,
    RequestKind,
    StartCheckpoint,
)
from weir.runtime.continuous.task import task_address

__all__ = ["JobResult", "LocalJob"]

log = logging.getLogger("weir")


@dataclass
class JobResult:
    """What a finished job did."""

    completed: list[int] = field(default_factory=list)
    aborted: list[tuple[int, str]] = field(default_factory=list)
    #: the first line of each failure that caused a restart (or ended the job)
    failures: list[str] = field(default_factory=list)
    restarts: int = 0
    duration_s: float = 0.0


class LocalJob:
    """Runs a :class:`JobGraph` with a process per task (see the module doc)."""

    def __init__(self, graph: JobGraph, checkpointing: CheckpointConfig, *,
                 restart: RestartStrategy | None = None, workdir: str | Path | None = None,
                 retained: int = 3, sleep: Callable[[float], None] = time.sleep,
                 restore_from: str | Path | None = None,
                 allow_non_restored_state: bool = False) -> None:
        self.graph, self.checkpointing = graph, checkpointing
        self.restore_from = None if restore_from is None else str(restore_from)
        self.allow_non_restored_state = allow_non_restored_state
        #: Flink's default with checkpointing on: exponential delay
        self.restart = restart if restart is not None else RestartStrategy.exponential_delay()
        self.sleep = sleep
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"weir-{graph.job}-"))
        self.coordinator = CheckpointCoordinator(graph.checkpoint_storage, retained=retained)
        self.attempt = 0
        self._inbox: queue.Queue[tuple[TaskId, dict[str, Any]]] = queue.Queue()
        self._procs: dict[TaskId, subprocess.Popen[bytes]] = {}
        self._pending: dict[int, tuple[PendingCheckpoint, set[TaskId]]] = {}
        self._finished: set[TaskId] = set()
        self._heard: dict[TaskId, float] = {}  # when each task was last heard from
        self.result = JobResult()

    def run(self, timeout_s: float = 600.0) -> JobResult:
        """Run the job to its end (bounded sources), restarting every task from the
        latest completed checkpoint after a failure as the restart strategy allows;
        raises :class:`~weir.errors.JobFailedError` once it gives up."""
        started = time.monotonic()
        tracker = self.restart.tracker()
        while True:
            try:
                self._run_attempt(started + timeout_s)
                break
            except JobFailedError as exc:
                self.result.failures.append(str(exc).splitlines()[0])
                delay = tracker.on_failure(time.monotonic())
                if delay is None or time.monotonic() >= started + timeout_s:
                    raise JobFailedError(
                        f"{exc} — and its restart strategy {self.restart} allows no more "
                        f"restarts after {tracker.restarts}; the latest completed "
                        f"checkpoint is in {self.graph.checkpoint_storage}") from exc
                log.warning("weir: job %s: %s; restart %d in %.3g s from the latest completed "
                            "checkpoint", self.graph.job, str(exc).splitlines()[0],
                            tracker.restarts, delay)
                self.sleep(delay)
                self.attempt += 1
        self.result.restarts = tracker.restarts
        self.result.duration_s = time.monotonic() - started
        return self.result

    def _run_attempt(self, deadline: float) -> None:
        """One attempt: launch every task, run to the end; JobFailedError on failure
        (every process killed, the attempt's pending checkpoints aborted)."""
        self._inbox = queue.Queue()
        self._procs, self._finished, self._heard = {}, set(), {}
        secret = os.urandom(32)
        inbox = self._inbox
        server = ControlServer(lambda t, m: inbox.put((t, m)), secret=secret,
                               job=self.graph.job)
        finished = False
        try:
            self._launch(server, secret)
            self._run(server, deadline)
            finished = True
        finally:
            server.close()
            self._stop_processes(grace_s=5.0 if finished else 0.0)
            for pending, _ in self._pending.values():
                self.coordinator.abort(pending)
            self._pending.clear()

    # -- phases

    def _launch(self, server: ControlServer, secret: bytes) -> None:
        graph_file = self.workdir / "graph.pickle"
        graph = dataclasses.replace(
            self.graph, at_least_once=self.checkpointing.mode is CheckpointingMode.AT_LEAST_ONCE)
        graph_file.write_bytes(cloudpickle.dumps(graph))  # type: ignore[no-untyped-call]
        env = {**os.environ, "WEIR_JOB_SECRET": secret.hex(),
               "WEIR_COORDINATOR": f"{server.address[0]}:{server.address[1]}"}
        for vertex, subtask in self.graph.tasks():
            self._procs[(vertex, subtask)] = subprocess.Popen(
                [sys.executable, "-m", "weir.runtime.continuous.worker", str(graph_file),
                 vertex, str(subtask), str(self.attempt)], env=env)

    def _next(self, deadline: float, wait_s: float | None = None
              ) -> tuple[TaskId, dict[str, Any]] | None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise JobFailedError(f"job {self.graph.job!r} did not finish in time")
        self._check_heartbeats()
        try:
            item = self._inbox.get(timeout=min(left, wait_s if wait_s is not None else left))
        except queue.Empty:
            return None
        task, message = item
        self._heard[task] = time.monotonic()
        log.debug("job %s: %s[%d]: %s", self.graph.job, task[0], task[1],
                  {k: v for k, v in message.items() if k != "parts"})
        if message["kind"] == "disconnected" and task in self._finished:
            return None  # it finished and closed its connection
        if message["kind"] in ("failed", "disconnected"):
            raise self._failure(item)
        return item

    def _restore_url(self) -> str | None:
        """What every task restores: the latest completed checkpoint of this job, else
        ``restore_from`` (a savepoint or checkpoint of any runtime, at any parallelism),
        whose operators must all be in the job unless ``allow_non_restored_state``."""
        latest = self.coordinator.latest()
        if latest is not None:
            return latest.url
        if self.restore_from is None:
            return None
        try:
            found = load_checkpoint(self.restore_from)
        except (OSError, WeirError) as exc:
            raise ConfigurationError(
                f"job {self.graph.job!r}: cannot restore from {self.restore_from}: {exc}"
            ) from exc
        found.check_operators(self.graph.uids(), self.allow_non_restored_state)
        return found.url

    def _check_heartbeats(self) -> None:
        """A running task not heard from within the heartbeat timeout is hung."""
        now = time.monotonic()
        for task, heard in self._heard.items():
            if task not in self._finished and now - heard > self.graph.heartbeat_timeout_s:
                raise JobFailedError(
                    f"job {self.graph.job!r}: task {task[0]}[{task[1]}] is hung: nothing "
                    f"from its main loop for {now - heard:.1f} s (heartbeat timeout "
                    f"{self.graph.heartbeat_timeout_s} s)")

    def _failure(self, first: tuple[TaskId, dict[str, Any]]) -> JobFailedError:
        """The job's error, naming its root cause: one failure drags others along (the
        neighbours of a killed task lose their channels), so the reports of the next
        half second are gathered and a task that died, or failed on its own, is named
        before one that lost a channel."""
        reports = [first]
        until = time.monotonic() + 0.5
        while (left := until - time.monotonic()) > 0:
            try:
                task, message = self._inbox.get(timeout=left)
            except queue.Empty:
                break
            if message["kind"] == "finished":
                self._finished.add(task)
            elif message["kind"] == "failed" or (
                    message["kind"] == "disconnected" and task not in self._finished):
                reports.append((task, message))  # (a finished task's close is no failure)
        failed = {t for t, m in reports if m["kind"] == "failed"}

        def rank(report: tuple[TaskId, dict[str, Any]]) -> int:
            task, message = report
            if message["kind"] == "disconnected" and task not in failed:
                return 0  # died without a word: killed, or lost
            return 2 if "ChannelError" in str(message.get("error")) else 1

        task, message = min(reports, key=rank)
        others = sorted({f"{t[0]}[{t[1]}]" for t, _ in reports} - {f"{task[0]}[{task[1]}]"})
        return JobFailedError(
            f"job {self.graph.job!r}: task {task[0]}[{task[1]}] "
            f"{'failed' if message['kind'] == 'failed' else 'disappeared'}: "
            f"{message.get('error')}"
            + (f" (then {', '.join(others)} failed too)" if others else "")
            + (f"\n{message['trace']}" if message.get("trace") else ""))

    def _run(self, server: ControlServer, deadline: float) -> None:
        graph = self.graph
        tasks = set(graph.tasks())
        addresses: dict[str, list[Any]] = {}
        registered: set[TaskId] = set()
        while registered != tasks:
            got = self._next(deadline)
            if got is not None and got[1]["kind"] == "registered":
                registered.add(got[0])
                if got[1]["address"] is not None:
                    addresses[task_address(*got[0])] = got[1]["address"]
        start = {"kind": "start", "addresses": addresses, "restore": self._restore_url()}
        for task in tasks:
            server.send(task, start)
        def clock() -> int:
            return int(time.time() * 1000)

        scheduler = CheckpointScheduler(self.checkpointing, clock,
                                        first_id=self.coordinator.next_id)
        scheduler.start()
        sources = set(graph.sources())
        ended: set[TaskId] = set()
        final_id: int | None = None
        finished = self._finished
        while finished != tasks:
            for decision in scheduler.poll():
                started_id = self._decide(decision, server, tasks, sources)
                if started_id is not None and final_id is None and ended == sources:
                    final_id = started_id
            wake = scheduler.next_wakeup_ms()
            wait = 0.5 if wake is None else max(0.0, (wake - clock()) / 1000)
            got = self._next(deadline, min(wait, 0.5))
            if got is None:
                continue
            task, message = got
            kind = message["kind"]
            if kind == "ack":
                decisions = self._ack(task, message, scheduler, server, tasks)
                for decision in decisions:
                    self._decide(decision, server, tasks, sources)
                if final_id is not None and final_id in self.result.completed:
                    for source in sources:
                        server.send(source, {"kind": "finish"})
                    final_id = -1
            elif kind == "decline":
                for decision in scheduler.declined(int(message["id"]), _reason(message)):
                    self._decide(decision, server, tasks, sources)
            elif kind == "source_end":
                ended.add(task)
                if ended == sources:
                    scheduler.request(RequestKind.FORCED)  # the final checkpoint
            elif kind == "finished":
                finished.add(task)
            if final_id not in (None, -1) and final_id not in self._pending and (
                    final_id not in self.result.completed):
                final_id = None  # the final checkpoint was aborted: force another
                scheduler.request(RequestKind.FORCED)

    def _decide(self, decision: Decision, server: ControlServer, tasks: set[TaskId],
                sources: set[TaskId]) -> int | None:
        if isinstance(decision, StartCheckpoint):
            pending = self.coordinator.trigger(decision.timestamp_ms)
            assert pending.checkpoint_id == decision.checkpoint_id, (pending, decision)
            self._pending[pending.checkpoint_id] = (pending, set())
            for source in sources:
                server.send(source, {"kind": "trigger", "id": pending.checkpoint_id,
                                     "ts": pending.timestamp_ms, "savepoint": False})
            return pending.checkpoint_id
        if isinstance(decision, AbortedCheckpoint):
            entry = self._pending.pop(decision.checkpoint_id, None)
            if entry is not None:
                self.coordinator.abort(entry[0])
                self.result.aborted.append((decision.checkpoint_id, decision.reason.name))
                for task in tasks:
                    server.send(task, {"kind": "abort", "id": decision.checkpoint_id})
        elif isinstance(decision, JobFailure):
            raise JobFailedError(f"job {self.graph.job!r}: {decision.error()}")
        return None

    def _ack(self, task: TaskId, message: dict[str, Any], scheduler: CheckpointScheduler,
             server: ControlServer, tasks: set[TaskId]) -> list[Decision]:
        cid = int(message["id"])
        entry = self._pending.get(cid)
        if entry is None:
            return []  # aborted or expired meanwhile
        pending, acked = entry
        for part in message["parts"]:
            uid, parallelism, max_parallelism, handle, _ = decode_part(
                bytes(part), f"acknowledgement of checkpoint {cid} by {task[0]}[{task[1]}]")
            pending.acknowledge(uid, parallelism, max_parallelism, handle)
        acked.add(task)
        if acked != tasks:
            return []
        del self._pending[cid]
        self.coordinator.complete(pending)
        self.result.completed.append(cid)
        for t in tasks:
            server.send(t, {"kind": "complete", "id": cid})
        return scheduler.completed(cid)

    def _stop_processes(self, grace_s: float) -> None:
        """Wait ``grace_s`` for the task processes to exit (they finished), then kill
        what is left (after a failure: at once)."""
        deadline = time.monotonic() + grace_s
        for proc in self._procs.values():
            if proc.poll() is None:
                try:
                    proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
                except subprocess.TimeoutExpired:
                    proc.kill()
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _reason(message: dict[str, Any]) -> CheckpointFailureReason:
    try:
        return CheckpointFailureReason[str(message.get("reason"))]
    except KeyError:
        return CheckpointFailureReason.CHECKPOINT_DECLINED
