"""The driver's side of a continuous job's checkpoints (see :mod:`.master`): a decision
of the :class:`~.scheduling.CheckpointScheduler` becomes a trigger at the sources (into
a fresh savepoint directory for a savepoint), the tasks' acknowledgements become a
completed checkpoint published exclusively under the run's claim
(:mod:`weir.checkpoint.protocol`; a failed publish is Flink's
``FINALIZE_CHECKPOINT_FAILURE``), and the tasks are told — except for a savepoint of a
running job, which commits no side effects (Flink >= 1.15)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from weir.checkpoint.coordinator import CheckpointCoordinator, PendingCheckpoint
from weir.checkpoint.format import CheckpointKind, decode_part
from weir.checkpoint.protocol import JobOwnership, new_savepoint_directory
from weir.checkpoint.storage import FileRef
from weir.errors import CheckpointError, FencedError, JobFailedError, WeirError
from weir.runtime.continuous.client import Command, JobResult
from weir.runtime.continuous.control import ControlServer, TaskId
from weir.runtime.continuous.graph import JobGraph
from weir.runtime.continuous.scheduling import (
    AbortedCheckpoint,
    CheckpointFailureReason,
    CheckpointScheduler,
    Decision,
    DroppedRequest,
    JobFailure,
    RequestKind,
    StartCheckpoint,
)
from weir.runtime.continuous.stats import CheckpointHistory, CheckpointStats, CheckpointStatus

__all__ = ["Attempt", "CheckpointRounds"]

log = logging.getLogger("weir")


@dataclass
class Attempt:
    """What the driver loop of one attempt works with."""

    server: ControlServer
    scheduler: CheckpointScheduler
    tasks: set[TaskId]
    sources: set[TaskId]
    ended: set[TaskId] = field(default_factory=set)
    #: the final checkpoint's id once started (-1: completed, the sources told)
    final_id: int | None = None



class CheckpointRounds:
    """The driver's side of checkpoints and savepoints (mixed into
    :class:`~.master.LocalJob`): the scheduler's decisions carried out, the tasks'
    acknowledgements collected and completed, the client's savepoint requests."""

    graph: JobGraph
    coordinator: CheckpointCoordinator
    ownership: JobOwnership
    history: CheckpointHistory
    result: JobResult
    _lock: threading.Lock
    _commands: list[Command]
    _requested: dict[int, Command]
    _savepoints: dict[int, Command]
    _stopping: Command | None
    _pending: dict[int, tuple[PendingCheckpoint, set[TaskId]]]
    _aborted: list[PendingCheckpoint]

    def _fail_commands(self, why: str) -> None:
        """Fail every savepoint request not answered yet (the attempt or job ended)."""
        with self._lock:
            waiting = [*self._commands, *self._requested.values(), *self._savepoints.values()]
            if self._stopping is not None:
                waiting.append(self._stopping)
            self._commands, self._requested, self._savepoints = [], {}, {}
            self._stopping = None
        for command in waiting:
            if not command.future.done():
                command.future.set_exception(CheckpointError(
                    f"{'stop-with-savepoint' if command.kind == 'stop' else 'savepoint'} "
                    f"into {command.target} did not complete: {why}"))

    def _request_final(self, run: Attempt) -> None:
        """Every source ended: the final checkpoint (or stop-with-savepoint's savepoint)."""
        if self._stopping is not None:
            self._requested[run.scheduler.request(RequestKind.SYNC_SAVEPOINT)] = self._stopping
        else:
            run.scheduler.request(RequestKind.FORCED)

    def _take_commands(self, run: Attempt) -> None:
        with self._lock:
            commands, self._commands = self._commands, []
        for command in commands:
            if command.kind == "savepoint":
                self._requested[run.scheduler.request(RequestKind.SAVEPOINT)] = command
            elif self._stopping is not None or run.ended == run.sources:
                command.future.set_exception(CheckpointError(
                    f"job {self.graph.job!r} is already ending; no stop-with-savepoint into "
                    f"{command.target}"))
            else:
                self._stopping = command
                for source in run.sources:
                    run.server.send(source, {"kind": "stop", "drain": command.drain})

    def _decide(self, decision: Decision, run: Attempt) -> int | None:
        if isinstance(decision, StartCheckpoint):
            cid = decision.checkpoint_id
            try:
                self.ownership.check(f"checkpoint {cid}")
            except FencedError:
                raise  # (a savepoint request stays in _requested: the job's end fails it)
            except (OSError, CheckpointError) as exc:  # (the storage did not answer)
                log.warning("weir: job %r: checkpoint %d not triggered: %s",
                            self.graph.job, cid, exc)
                for then in run.scheduler.failed(cid, CheckpointFailureReason.IO_EXCEPTION):
                    self._decide(then, run)
                return None
            command = self._requested.pop(decision.request_id, None)
            try:
                pending = (self.coordinator.trigger(decision.timestamp_ms) if command is None
                           else self.coordinator.trigger_savepoint(
                               new_savepoint_directory(command.target, self.graph.job,
                                                       self.graph.storage_options),
                               timestamp_ms=decision.timestamp_ms, fresh_directory=True))
            except (OSError, WeirError) as exc:  # (a savepoint's target)
                assert command is not None
                self.coordinator.trigger(decision.timestamp_ms)  # (its id is used up)
                command.future.set_exception(exc)
                for then in run.scheduler.failed(
                        cid, CheckpointFailureReason.TRIGGER_CHECKPOINT_FAILURE):
                    self._decide(then, run)
                return None
            assert pending.checkpoint_id == cid, (pending, decision)
            self._pending[cid] = (pending, set())
            location = None if command is None else pending.storage.url
            if command is not None:
                self._savepoints[cid] = command
            self.history.started(CheckpointStats(
                cid, "checkpoint" if command is None else decision.kind.value,
                CheckpointStatus.IN_PROGRESS, decision.timestamp_ms, location=location))
            # the final checkpoint (every source ended) is aligned, so that no record is
            # in flight past it (with unaligned checkpoints too, as savepoints)
            final = run.ended == run.sources
            for source in run.sources:
                run.server.send(source, {"kind": "trigger", "id": cid, "ts": pending.timestamp_ms,
                                         "savepoint": location, "aligned": final})
            return cid
        if isinstance(decision, AbortedCheckpoint):
            entry = self._pending.pop(decision.checkpoint_id, None)
            if entry is not None:
                savepoint = entry[0].kind is CheckpointKind.SAVEPOINT
                if savepoint or self.ownership.holds():  # (fenced: delete nothing shared)
                    self.coordinator.abort(entry[0])
                if entry[0].kind is CheckpointKind.SAVEPOINT:
                    self._aborted.append(entry[0])
                self.result.aborted.append((decision.checkpoint_id, decision.reason.name))
                self.history.update(decision.checkpoint_id, status=CheckpointStatus.FAILED,
                                    failure=decision.reason.message,
                                    duration_ms=(time.perf_counter() - entry[0].started) * 1000)
                for task in run.tasks:
                    run.server.send(task, {"kind": "abort", "id": decision.checkpoint_id})
            command = self._savepoints.pop(decision.checkpoint_id, None)
            if command is not None:
                command.future.set_exception(CheckpointError(
                    f"savepoint {decision.checkpoint_id} into {command.target} failed: "
                    f"{decision.reason.message}"))
        elif isinstance(decision, DroppedRequest):
            command = self._requested.pop(decision.request_id, None)
            if command is not None:
                command.future.set_exception(CheckpointError(
                    f"savepoint into {command.target} was not started: "
                    f"{decision.reason.message}"))
        elif isinstance(decision, JobFailure):
            error = decision.error()
            raise JobFailedError(f"job {self.graph.job!r}: {error}") from error
        return None

    def _ack(self, task: TaskId, message: dict[str, Any], run: Attempt) -> list[Decision]:
        cid = int(message["id"])
        entry = self._pending.get(cid)
        if entry is None:
            return []  # aborted or expired meanwhile
        pending, acked = entry
        where = f"acknowledgement of checkpoint {cid} by {task[0]}[{task[1]}]"
        handles = []
        for part in message["parts"]:
            uid, parallelism, max_parallelism, handle, _ = decode_part(bytes(part), where)
            pending.acknowledge(uid, parallelism, max_parallelism, handle)
            handles.append(handle)
        channels = message.get("channels")
        channel_file = None if channels is None else FileRef.from_json(channels, where)
        if message.get("unaligned"):  # the records it had in flight, if any
            pending.acknowledge_channel_state(
                task[0], self.graph.vertex(task[0]).parallelism, task[1], channel_file)
        self.history.acknowledged(
            # (on the clock the checkpoint's duration is measured with: an
            # acknowledgement never reads later than the completion that follows it)
            cid, task[0], task[1],
            acknowledged_ms=(time.perf_counter() - pending.started) * 1000,
            alignment_ms=message.get("alignment_ms"), handles=handles,
            channel_state_bytes=0 if channel_file is None else channel_file.size)
        acked.add(task)
        if acked != run.tasks:
            return []
        try:
            self.ownership.check(f"completing checkpoint {cid}")
            completed = self.coordinator.complete(pending, owner=self.ownership.owner_record(),
                                                  exclusive=True, subsume=False)
        except (OSError, CheckpointError) as exc:  # Flink's FINALIZE_CHECKPOINT_FAILURE
            log.warning("weir: job %r: checkpoint %d could not be finalized: %s",
                        self.graph.job, cid, exc)
            return run.scheduler.failed(cid, CheckpointFailureReason.FINALIZE_CHECKPOINT_FAILURE)
        # published; checked once more before anything is committed or deleted: a run
        # that took over after our first check read the storage after its claim, so it
        # restores this checkpoint, whose transactions it commits itself
        self.ownership.check(f"committing checkpoint {cid}")
        if pending.kind is CheckpointKind.CHECKPOINT:
            self.ownership.last_completed = cid
            self.coordinator.enforce_retention()
        del self._pending[cid]
        self.result.completed.append(cid)
        self.history.completed(cid, completed.metadata)
        command = self._savepoints.pop(cid, None)
        # a savepoint of a running job commits no side effects (Flink >= 1.15): its
        # tasks hear of it from the next checkpoint; stop-with-savepoint commits
        if command is None or command is self._stopping:
            for t in run.tasks:
                run.server.send(t, {"kind": "complete", "id": cid})
        if command is not None:
            if command is self._stopping:
                self.result.savepoint = pending.storage.url
                self.ownership.stopped_with = pending.storage.url  # (the next run's start)
            command.future.set_result(pending.storage.url)
        return run.scheduler.completed(cid)
