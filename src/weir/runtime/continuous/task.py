"""The tasks of a continuous job, one per OS process (:mod:`.worker` starts it).

A **source task** reads its positions of the source and routes each record by key
group to a keyed task over credit-based channels. Between polls it serves the
coordinator: ``trigger`` — record the reader's positions in the source's operator
state, snapshot it, send the barrier on every channel, acknowledge once the upload is
done; ``finish`` (after the final checkpoint of a bounded job) — end its partitions
and stop.

A **keyed task** takes buffers and events from its input gate: records go through the
keyed operator (weir's operator core, the same as in the harness and on Spark) into the
sink's writer; events go to the barrier handler (aligned for exactly-once, tracking for
at-least-once), which triggers the snapshot once the barrier arrived on every channel:
the sink prepares its commit (the committable joins the sink's operator state), both
operators snapshot (synchronous part now, upload in the background), and the task
acknowledges both handles. A completed checkpoint commits every committable up to it;
a restore commits the recovered ones and drops what earlier attempts left open.

Every task acknowledges each checkpoint with a part per operator
(``weir.checkpoint.format.encode_part``), and reports a failure, its sources' end
and its own finish on the control connection.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from typing import Any

from weir.api.descriptors import ListStateDescriptor
from weir.api.functions import CheckpointedFunction, ProcessFunction
from weir.checkpoint.coordinator import load_checkpoint
from weir.checkpoint.format import encode_part
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import ChannelError
from weir.runtime.checkpointer import PendingSnapshot, SubtaskCheckpointer
from weir.runtime.continuous.barriers import (
    AbortReason,
    AlignedBarrierHandler,
    Barrier,
    BarrierTracker,
    barrier_event,
)
from weir.runtime.continuous.channels import OutputChannel
from weir.runtime.continuous.control import ControlClient
from weir.runtime.continuous.gates import ChannelServer, InputGate
from weir.runtime.continuous.graph import PipelineSpec, chain
from weir.runtime.continuous.wire import Kind
from weir.runtime.nonkeyed import NonKeyedOperator
from weir.runtime.operator import KeyedOperator
from weir.runtime.operator_base import MAX_WATERMARK, MIN_WATERMARK, OperatorConfig
from weir.state.keygroups import assign_key_to_parallel_operator

__all__ = ["KeyedTask", "SourceTask"]

EDGE = "keyed"  # the one hash edge of a pipeline


class _Stateful(ProcessFunction[Any, Any], CheckpointedFunction):
    """Holds a runtime component's operator state (source positions, sink
    committables) in a list state; ``union``: every subtask gets all of it back."""

    def __init__(self, union: bool) -> None:
        self.union = union
        self.values: list[Any] = []
        self.restored: list[Any] | None = None

    def initialize_state(self, ctx: Any) -> None:
        store = ctx.operator_state_store
        descriptor = ListStateDescriptor[Any]("values")
        self.state = (store.get_union_list_state(descriptor) if self.union
                      else store.get_list_state(descriptor))
        self.restored = list(self.state.get()) if ctx.is_restored else None

    def snapshot_state(self, ctx: Any) -> None:
        self.state.update(self.values)

    def process_element(self, value: Any, ctx: Any) -> None:
        raise AssertionError("a runtime component's state takes no records")


class _Task:
    """What both tasks share: control connection, checkpointers, acknowledgements."""

    def __init__(self, spec: PipelineSpec, uid: str, subtask: int, parallelism: int,
                 attempt: int, control: ControlClient) -> None:
        self.spec, self.uid, self.subtask, self.attempt = spec, uid, subtask, attempt
        self.parallelism = parallelism
        self.control = control
        self.storage = CheckpointStorage(spec.checkpoint_storage)
        self.checkpointers: list[SubtaskCheckpointer] = []
        self._next_heartbeat = 0.0

    def config(self, uid: str, parallelism: int, backend: str = "hashmap") -> OperatorConfig:
        return OperatorConfig(uid=uid, state_backend=backend,
                              max_parallelism=self.spec.max_parallelism,
                              parallelism=parallelism, subtask_index=self.subtask)

    def restore(self, op: Any, url: str | None, parallelism: int) -> None:
        if url is not None:
            completed = load_checkpoint(CheckpointStorage(url))
            op.restore(completed.load(op.config.uid, parallelism, self.subtask))
        op.open()

    def snapshot_and_ack(self, barrier: Barrier) -> None:
        """Snapshot every operator (synchronous parts now) and acknowledge once every
        upload is done, from a helper thread."""
        pending: list[tuple[SubtaskCheckpointer, PendingSnapshot]] = [
            (c, c.snapshot(barrier.checkpoint_id, barrier.timestamp_ms))
            for c in self.checkpointers]

        def ack() -> None:
            try:
                parts = [encode_part(c.uid, c.operator.config.parallelism,
                                     self.spec.max_parallelism, p.result(), {})
                         for c, p in pending]
                self.control.send({"kind": "ack", "id": barrier.checkpoint_id,
                                   "parts": parts})
            except Exception as exc:  # the upload failed: decline, the job goes on
                self.control.send({"kind": "decline", "id": barrier.checkpoint_id,
                                   "reason": "CHECKPOINT_ASYNC_EXCEPTION",
                                   "error": f"{type(exc).__name__}: {exc}"})

        threading.Thread(target=ack, name=f"ack {barrier.checkpoint_id}", daemon=True).start()

    def heartbeat(self) -> None:
        """Tell the coordinator the main loop is alive (at most once a second): a task
        stuck in a call for longer than the heartbeat timeout is taken as hung."""
        now = time.monotonic()
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + 1.0
            self.control.send({"kind": "heartbeat"})

    def notified(self, message: dict[str, Any]) -> None:
        kind, cid = message["kind"], int(message.get("id", 0))
        for c in self.checkpointers:
            if kind == "complete":
                c.notify_checkpoint_complete(cid)
            elif kind == "abort":
                c.notify_checkpoint_aborted(cid)

    def fail(self, exc: BaseException) -> None:
        with contextlib.suppress(ChannelError):  # else the coordinator sees it drop
            self.control.send({"kind": "failed", "error": f"{type(exc).__name__}: {exc}",
                               "trace": traceback.format_exc()})


class SourceTask(_Task):
    """A subtask of the source (see the module doc)."""

    def __init__(self, spec: PipelineSpec, subtask: int, attempt: int,
                 control: ControlClient) -> None:
        super().__init__(spec, spec.source_uid, subtask, spec.source_parallelism, attempt,
                         control)
        self.state = _Stateful(union=False)
        self.op = NonKeyedOperator(self.state, self.config(spec.source_uid,
                                                           spec.source_parallelism))

    def run(self, start: dict[str, Any], secret: bytes) -> None:
        spec = self.spec
        self.restore(self.op, start.get("restore"), spec.source_parallelism)
        self.checkpointers = [SubtaskCheckpointer(self.op, self.storage)]
        reader = spec.source.reader(self.subtask, spec.source_parallelism, self.state.restored)
        addresses = start["addresses"]
        outs = [OutputChannel(tuple(addresses[str(i)]), secret=secret, job=spec.job,
                              edge=EDGE, producer=self.subtask, consumer=i,
                              config=spec.channel) for i in range(spec.parallelism)]
        for out in outs:
            out.on_blocked = self.heartbeat
        route, key_of = spec.parallelism, spec.key_selector
        steps = chain(spec.before_key_by)
        m = spec.max_parallelism
        exhausted = False
        strategy = spec.watermarks
        stamp = strategy.timestamp_assigner if strategy is not None else None
        largest, sent = MIN_WATERMARK, MIN_WATERMARK
        next_watermark = time.monotonic()
        last_record, idle = time.monotonic(), False

        def send_watermark(watermark: int) -> None:
            nonlocal sent, idle
            if watermark > sent or (idle and watermark >= sent):
                sent, idle = watermark, False
                for out in outs:
                    out.emit_event({"kind": "watermark", "ts": watermark})

        while True:
            message = self.control.receive(0.05 if exhausted else 0)
            while message is not None:
                kind = message["kind"]
                if kind == "trigger":
                    barrier = Barrier(int(message["id"]), int(message["ts"]),
                                      bool(message.get("savepoint", False)))
                    self.state.values = reader.positions()
                    for out in outs:  # records before the barrier go first
                        out.emit_event(barrier_event(barrier))
                    self.snapshot_and_ack(barrier)
                elif kind == "finish":
                    for out in outs:
                        out.close()
                    self.op.close()
                    self.control.send({"kind": "finished"})
                    return
                else:
                    self.notified(message)
                message = self.control.receive(0)
            self.heartbeat()
            if exhausted:
                continue
            records = reader.poll(spec.source_batch)
            if records is None:
                exhausted = True
                if stamp is not None:  # every event-time timer fires before the end
                    send_watermark(MAX_WATERMARK)
                for out in outs:
                    out.flush(wait=False)
                self.control.send({"kind": "source_end"})
                continue
            if records:
                last_record = time.monotonic()
            for raw in records:
                for record in steps(raw):
                    out = outs[assign_key_to_parallel_operator(key_of(record), m, route)]
                    if stamp is None:
                        out.emit(record)
                    else:
                        ts = int(stamp(record))
                        largest = max(largest, ts)
                        out.emit((ts, record))
            if strategy is not None and time.monotonic() >= next_watermark:
                next_watermark = time.monotonic() + strategy.interval_ms / 1000
                quiet = strategy.idleness_ms is not None and (
                    time.monotonic() - last_record) * 1000 >= strategy.idleness_ms
                if quiet:
                    if not idle:
                        idle = True  # no longer holds event time back downstream
                        for out in outs:
                            out.emit_event({"kind": "idle"})
                elif largest > MIN_WATERMARK:  # (a watermark ends idleness downstream)
                    send_watermark(largest - strategy.max_out_of_orderness_ms - 1)


class KeyedTask(_Task):
    """A subtask of the keyed function, chained with the sink (see the module doc)."""

    def __init__(self, spec: PipelineSpec, subtask: int, attempt: int,
                 control: ControlClient) -> None:
        super().__init__(spec, spec.function_uid, subtask, spec.parallelism, attempt, control)
        self.op = KeyedOperator(spec.function, spec.key_selector,
                                self.config(spec.function_uid, spec.parallelism,
                                            spec.state_backend))
        self.sink_state = _Stateful(union=True)
        self.sink_op = NonKeyedOperator(self.sink_state,
                                        self.config(spec.sink_uid, spec.parallelism))
        #: (checkpoint id, committable) prepared and not yet committed
        self.committables: list[list[Any]] = []

    def notified(self, message: dict[str, Any]) -> None:
        """Also commit the sink's transactions up to a completed checkpoint."""
        if message["kind"] == "complete":
            done = int(message["id"])
            self.spec.sink.commit([c for cid, c in self.committables if cid <= done])
            self.committables = [e for e in self.committables if e[0] > done]
        super().notified(message)

    def listen(self, secret: bytes) -> tuple[ChannelServer, InputGate]:
        server = ChannelServer(secret=secret, job=self.spec.job)
        gate = server.gate(EDGE, self.subtask, self.spec.source_parallelism, self.spec.channel)
        return server, gate

    def run(self, start: dict[str, Any], gate: InputGate) -> None:
        spec = self.spec
        url = start.get("restore")
        self.restore(self.op, url, spec.parallelism)
        self.restore(self.sink_op, url, spec.parallelism)
        mode = "incremental" if spec.state_backend == "rocksdb" else "full"
        self.checkpointers = [SubtaskCheckpointer(self.op, self.storage, mode=mode),
                              SubtaskCheckpointer(self.sink_op, self.storage)]
        recovered = [list(c) for c in self.sink_state.restored or []]
        spec.sink.commit([c for _, c in recovered])  # their checkpoint completed
        spec.sink.abort_attempts(self.attempt, [c for _, c in recovered])
        writer = spec.sink.writer(self.subtask, spec.parallelism, self.attempt)
        task = self

        class Actions:
            def trigger_checkpoint(self, barrier: Barrier) -> None:
                committable = writer.prepare_commit(barrier.checkpoint_id)
                if committable is not None:
                    task.committables.append([barrier.checkpoint_id, committable])
                task.sink_state.values = list(task.committables)
                task.snapshot_and_ack(barrier)

            def abort_checkpoint(self, checkpoint_id: int, reason: AbortReason) -> None:
                task.control.send({"kind": "decline", "id": checkpoint_id,
                                   "reason": "CHECKPOINT_DECLINED", "error": reason.value})

        handler: AlignedBarrierHandler | BarrierTracker = (
            BarrierTracker(spec.source_parallelism, Actions()) if spec.at_least_once
            else AlignedBarrierHandler(spec.source_parallelism, gate, Actions()))
        process, after = self.op.process_element, chain(spec.after_process)

        def write(out: Any) -> None:
            for record in after(out):
                writer.write(record)

        next_tick = time.monotonic()
        event_time = spec.watermarks is not None
        watermarks = [MIN_WATERMARK] * spec.source_parallelism

        idle: set[int] = set()

        def advance() -> None:
            active = [w for c, w in enumerate(watermarks) if c not in idle]
            if active:  # all idle: event time stands still
                for out in self.op.advance_watermark(min(active)):
                    write(out)

        while not gate.finished:
            message = self.control.receive(0)
            while message is not None:
                self.notified(message)
                message = self.control.receive(0)
            got = gate.poll(0.02)
            if got is not None:
                channel, kind, item = got
                if kind is Kind.DATA:
                    if event_time:
                        for ts, record in item:
                            for out in process(record, ts):
                                write(out)
                    else:
                        for record in item:
                            for out in process(record):
                                write(out)
                elif item.get("kind") == "watermark":
                    watermarks[channel] = max(watermarks[channel], int(item["ts"]))
                    idle.discard(channel)
                    advance()
                elif item.get("kind") == "idle":
                    idle.add(channel)
                    advance()
                else:
                    handler.on_event(channel, item)
                    if item.get("kind") == "end":
                        watermarks[channel] = MAX_WATERMARK  # no longer holds time back
                        advance()
            if time.monotonic() >= next_tick:  # processing-time timers, heartbeat
                for out in self.op.advance_processing_time():
                    write(out)
                next_tick = time.monotonic() + 0.1
                self.heartbeat()
        # every input ended (after the final checkpoint): wait for its notification
        while self.committables:
            message = self.control.receive(30.0)
            if message is None:  # never finish with prepared transactions uncommitted
                raise ChannelError(
                    f"task {spec.function_uid}[{self.subtask}]: its inputs ended but no "
                    f"checkpoint completed the transactions {self.committables} for 30 s; "
                    f"the job restarts from its latest checkpoint")
            self.notified(message)
        writer.close()
        self.op.close()  # the function's close(); an error fails the task
        self.sink_op.close()
        self.control.send({"kind": "finished"})

