"""A task of a continuous job: one subtask of a vertex, in its own OS process
(:mod:`.worker` starts it).

A task runs its vertex's operator chain (:mod:`.chain`). Its outputs are the channels
of the vertex's output edges, routed by each edge's partitioner (forward, by key group,
round robin, broadcast). A **source task** reads its source between checks of the
control connection; a **task with inputs** takes buffers and events from its one input
gate, whose channels are every producer subtask of every input edge.

Checkpoints (Flink's task side): a source task starts one on the coordinator's
``trigger`` (the reader's positions become its state; a savepoint's trigger names its
storage, and every snapshot of it is written there in full); a task with inputs when its
barrier handler has the barrier from every channel (aligned for exactly-once, tracking
for at-least-once). Then it (1) prepares its sinks' commits (the committables join the
sinks' state), (2) forwards the barrier on every output channel, after every record
emitted before it, (3) snapshots every stateful operator of the chain (synchronous part
now, upload in the background) and (4) acknowledges with their parts once the uploads
are done. **Unaligned** (``CheckpointConfig(unaligned=True)``): a task with inputs
checkpoints on the first barrier (or when its alignment times out), its barrier
overtakes the buffers queued on its output channels, and the ack waits for the channel
state — the buffers overtaken, and per input channel those before that channel's barrier
which the task had not processed (:mod:`.gates`) — written as one file
(:mod:`.inflight`); a task restored from such a checkpoint processes the records it now
owns of them before any new input. Savepoints and the final checkpoint are aligned. A
checkpoint it cannot take is declined, and a cancellation marker goes downstream so
nobody waits for its barrier. A completed checkpoint commits every
committable up to it; a restore commits the recovered ones and drops what earlier
attempts left open.

Event time: records travel as ``(timestamp, record)`` when a source has a watermark
strategy; a task's event time is its input's :class:`~.valve.WatermarkValve` (Flink's
``StatusWatermarkValve``): the minimum watermark of its input channels that are neither
idle nor behind it, and once every channel is idle the largest watermark of all; when it
advances, the keyed operators' event-time timers fire in chain order and the watermark
is forwarded, and so is the valve's idleness (every input idle) and its return to
activity.

End: a source that ran out (or was told to ``stop`` for a stop-with-savepoint) sends the
maximum watermark — unless a stop does not drain — and reports its end. After the job's
final checkpoint (or savepoint) the coordinator tells the sources to finish; each
task whose inputs all ended waits until its sinks' transactions are committed, closes
its operators, ends its output channels and reports ``finished``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
import traceback
from concurrent.futures import Future
from typing import Any

from weir.api.connectors import SinkContext, SinkLineageError
from weir.checkpoint.changelog import ChangelogPolicy
from weir.checkpoint.channel_state import ChannelState
from weir.checkpoint.coordinator import load_checkpoint
from weir.checkpoint.format import SubtaskStateHandle, encode_part
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import ChannelError, SinkError
from weir.runtime.checkpoint_cpu import counted, counting
from weir.runtime.checkpointer import PendingSnapshot, SubtaskCheckpointer
from weir.runtime.continuous.barriers import (
    AbortReason,
    AlignedBarrierHandler,
    Barrier,
    BarrierTracker,
    barrier_event,
    cancel_event,
    decline_message,
)
from weir.runtime.continuous.chain import OperatorChain, Push
from weir.runtime.continuous.channels import OutputChannel
from weir.runtime.continuous.control import ControlClient
from weir.runtime.continuous.gates import ChannelServer, InputGate
from weir.runtime.continuous.graph import JobGraph, OpKind, Partitioner
from weir.runtime.continuous.inflight import replay_records, write_channel_state
from weir.runtime.continuous.metrics import sample
from weir.runtime.continuous.queries import answer
from weir.runtime.continuous.routing import discard, route
from weir.runtime.continuous.source_loop import read_source
from weir.runtime.continuous.valve import WatermarkValve
from weir.runtime.continuous.wire import Kind
from weir.runtime.operator import KeyedOperator

#: changelog checkpoints of keyed tasks: materialize once the deltas hold 8 times the
#: base (a restore reads at most about 9 times the state), and at least every
#: ``CheckpointConfig.materialization_interval`` (Flink's: every 10 minutes, whatever
#: the changelog holds by then; :func:`changelog_policy`). At 1 s checkpoints a hot state
#: changes most of its keys per delta, and a materialization's CPU per second is its
#: cost per key times the keys changed per second, divided by this ratio, whatever the
#: state's size: at 1x (every second or third checkpoint) full scans cost RocksDB 10%
#: of its CPU, at 4x 3.4% (py-spy, 200,000 keys)
CHANGELOG_POLICY = ChangelogPolicy(size_ratio=8.0)


def changelog_policy(graph: JobGraph) -> ChangelogPolicy:
    """The changelog policy of ``graph``'s keyed tasks: :data:`CHANGELOG_POLICY` with the
    job's materialization interval."""
    return dataclasses.replace(CHANGELOG_POLICY,
                               interval_ms=graph.materialization_interval_ms)

__all__ = ["Task", "report_failure", "task_address"]


def report_failure(control: ControlClient, exc: BaseException) -> bool:
    """Report ``exc`` (being handled: its traceback goes with it) to the coordinator;
    whether the report was sent (False: the control connection is gone)."""
    try:
        control.send({"kind": "failed", "error": f"{type(exc).__name__}: {exc}",
                      "trace": traceback.format_exc()})
    except ChannelError:
        return False
    return True


def with_alignment(handle: SubtaskStateHandle, alignment_ms: float | None
                   ) -> SubtaskStateHandle:
    """``handle`` with its task's alignment in its stats (kept in ``_metadata``)."""
    if alignment_ms is None:
        return handle
    return dataclasses.replace(handle, stats=dataclasses.replace(
        handle.stats, alignment_ms=alignment_ms))


def task_address(vertex: str, subtask: int) -> str:
    """How the coordinator's ``start`` names a task's data address."""
    return f"{vertex}/{subtask}"


class Task:
    """Subtask ``subtask`` of vertex ``vertex_id`` (see the module doc)."""

    def __init__(self, graph: JobGraph, vertex_id: str, subtask: int, attempt: int,
                 control: ControlClient) -> None:
        self.graph, self.subtask, self.attempt = graph, subtask, attempt
        self.vertex = graph.vertex(vertex_id)
        self.name = f"{vertex_id}[{subtask}]"
        self.control = control
        self.storage = self.open_storage(graph.checkpoint_storage)
        self.chain = OperatorChain(graph, self.vertex, subtask)
        self.inputs = graph.inputs(vertex_id)
        self.checkpointers: list[SubtaskCheckpointer] = []
        self.outs: list[OutputChannel] = []
        self._next_heartbeat = 0.0
        #: per gate channel: whether it is a broadcast-side input
        self._broadcast_side: list[bool] = []
        #: per gate channel (edge, producer subtask); per output (edge, consumer subtask)
        self._in_ids: list[tuple[str, int]] = []
        self._out_ids: list[tuple[str, int]] = []
        self._gate: InputGate | None = None
        self._keyed_ops: dict[str, KeyedOperator] = {}
        self._handler: AlignedBarrierHandler | BarrierTracker | None = None
        #: records in flight in the checkpoint restored, to replay first (edge, records)
        self._replay: list[tuple[str, list[Any]]] = []
        #: metrics (:mod:`.metrics`): ns waiting for input, records a source read, the
        #: task's event time
        self.idle_ns = 0
        self.backpressured_ns = 0  # (waiting for output availability, not inside emit)
        self.records_read = 0
        self.watermark: int | None = None

    # -- set-up

    def open_storage(self, url: str) -> CheckpointStorage:
        """The storage at ``url`` (the job's checkpoint storage, a checkpoint or savepoint
        to restore, a savepoint's target), opened with the job's storage options."""
        return CheckpointStorage(url, storage_options=self.graph.storage_options)

    def listen(self, secret: bytes, host: str = "127.0.0.1"
               ) -> tuple[ChannelServer, InputGate] | None:
        """The input gate (on a new channel server listening on ``host``) of a task with
        inputs."""
        if not self.inputs:
            return None
        server = ChannelServer(secret=secret, job=self.graph.job, host=host)
        inputs = []
        for edge in self.inputs:
            producers = edge.producers_of(self.subtask,
                                          self.graph.vertex(edge.producer).parallelism)
            inputs.append((edge.name, producers))
            self._broadcast_side += [edge.broadcast_side] * len(producers)
            self._in_ids += [(edge.name, j) for j in producers]
        self._gate = server.input_gate(self.subtask, inputs, self.graph.channel)
        return server, self._gate

    def _open(self, start: dict[str, Any], secret: bytes) -> None:
        """Restore and open the chain, open the sinks' writers and the outputs."""
        url = start.get("restore")
        completed = load_checkpoint(self.open_storage(url)) if url is not None else None
        if completed is not None and self.inputs:
            self._replay = replay_records(completed, self.graph, self.vertex.id, self.subtask)
        policy = changelog_policy(self.graph)
        for op in self.chain.stateful:
            assert op.core is not None
            if completed is not None:
                op.core.restore(completed.load(op.spec.name, self.vertex.parallelism,
                                               self.subtask))
            op.core.open()
            mode = self.graph.snapshot if op.kind is OpKind.KEYED else "full"
            # a checkpoint may be aborted while the job goes on: a changelog extends
            # only checkpoints known complete
            self.checkpointers.append(SubtaskCheckpointer(
                op.core, self.storage, mode=mode, changelog=policy,
                confirmed_only=True))
        p = self.vertex.parallelism
        # the job's lineage, decided by the driver (weir.checkpoint.protocol): every sink
        # checks it before anything else, never skipped nor guessed here
        lineage = str(start["lineage"])
        for op in self.chain.all:
            if op.kind is OpKind.SOURCE:
                assert op.state is not None
                op.reader = op.spec.fn.reader(self.subtask, p, op.state.restored)
            elif op.kind is OpKind.SINK:
                assert op.state is not None
                sink = op.spec.fn
                context = SinkContext(self.graph.run_id, self.subtask, p, self.attempt,
                                      uid=op.spec.name, lineage=lineage)
                try:
                    sink.claim(context)
                except SinkLineageError as exc:  # no restart can help: the job ends
                    self.control.send({"kind": "failed", "fatal": True,
                                       "error_type": type(exc).__name__,
                                       "error": f"{type(exc).__name__}: {exc}"})
                    raise
                recovered = [c for _, c in op.state.restored or []]
                sink.commit_after_recovery(recovered)  # their checkpoint completed
                sink.abort_attempts(context, recovered)
                op.writer = sink.writer(context)
        self.chain.wire(self._router(start["addresses"], secret))
        self._keyed_ops = {op.spec.name: op.core for op in self.chain.stateful
                           if isinstance(op.core, KeyedOperator)}  # (live state queries)

    def _router(self, addresses: dict[str, list[Any]], secret: bytes) -> Push:
        """Open the output channels; the function that routes a record to them."""
        routes: list[Push] = []
        event_time = self.graph.event_time
        batches = self.graph.may_emit_batches(self.vertex.id)
        for edge in self.graph.outputs(self.vertex.id):
            consumer = self.graph.vertex(edge.consumer)
            targets = ([self.subtask] if edge.partitioner is Partitioner.FORWARD
                       else list(range(consumer.parallelism)))
            channels = [OutputChannel(tuple(addresses[task_address(consumer.id, i)]),
                                      secret=secret, job=self.graph.job, edge=edge.name,
                                      producer=self.subtask, consumer=i,
                                      config=self.graph.channel) for i in targets]
            for channel in channels:
                channel.on_blocked = self.heartbeat
            self.outs += channels
            self._out_ids += [(edge.name, i) for i in targets]
            head = consumer.chain[0]  # (a keyed head calls the key selector again)
            rejects = head.kind is OpKind.KEYED and bool(head.bad_record_exceptions)
            routes.append(route(edge, channels, self.graph.max_parallelism, self.subtask,
                                event_time, rejects, batches))
        if not routes:
            return discard
        if len(routes) == 1:
            return routes[0]

        def to_every_edge(value: Any, ts: int | None) -> None:
            for r in routes:
                r(value, ts)
        return to_every_edge

    # -- checkpoints

    def checkpoint(self, barrier: Barrier, in_order: frozenset[int] | None = None) -> None:
        """Take checkpoint ``barrier`` (see the module doc): aligned, or unaligned
        (``in_order``: the input channels whose barrier came in order)."""
        with counting():
            self._checkpoint(barrier, in_order)

    def _checkpoint(self, barrier: Barrier, in_order: frozenset[int] | None) -> None:
        cid = barrier.checkpoint_id
        for sink in self.chain.sinks:
            committable = sink.writer.prepare_commit(cid)
            if committable is not None:
                sink.committables.append([cid, committable])
            assert sink.state is not None
            sink.state.values = list(sink.committables)
        event = barrier_event(barrier)
        unaligned = self.graph.unaligned and not barrier.must_align
        outputs: list[Future[list[bytes]]] = []
        if not unaligned:
            for out in self.outs:  # records before the barrier go first
                out.emit_event(event)
        else:  # the barrier overtakes queued buffers now, or once its alignment times out
            overtake = in_order is not None or self.graph.aligned_timeout_ms == 0
            deadline = None if overtake else time.monotonic() + max(
                0.0, barrier.timestamp_ms + self.graph.aligned_timeout_ms
                - time.time() * 1000) / 1000
            outputs = [out.emit_barrier(event, unaligned=overtake, deadline=deadline)
                       for out in self.outs]
        inputs = None
        aligned_s = started = None  # (its alignment: done, or under way since started)
        if in_order is not None:
            assert self._gate is not None and self._handler is not None
            inputs = self._gate.record(cid, in_order)
            started = self._handler.alignment_started
        elif self._handler is not None:
            aligned_s = self._handler.last_alignment
        target = None if barrier.savepoint is None else self.open_storage(barrier.savepoint)
        pending: list[tuple[SubtaskCheckpointer, PendingSnapshot]] = [
            (c, c.snapshot(cid, barrier.timestamp_ms, target=target,
                           savepoint=target is not None)) for c in self.checkpointers]

        def ack() -> None:
            try:
                message: dict[str, Any] = {"kind": "ack", "id": cid}
                alignment_ms = None if aligned_s is None else aligned_s * 1000
                if unaligned:
                    received = [] if inputs is None else inputs.result()
                    if started is not None:  # every barrier is in: the alignment ended
                        alignment_ms = (time.monotonic() - started) * 1000
                    state = ChannelState(dict(zip(self._in_ids, received, strict=False)),
                                         dict(zip(self._out_ids, (f.result() for f in outputs),
                                                  strict=False)))
                    ref = write_channel_state(self.storage, cid, self.vertex.id,
                                              self.subtask, state)
                    message["unaligned"] = True
                    if ref is not None:
                        message["channels"] = ref.to_json()
                if alignment_ms is not None:
                    message["alignment_ms"] = alignment_ms
                message["parts"] = [
                    encode_part(c.uid, self.vertex.parallelism, self.graph.max_parallelism,
                                with_alignment(p.result(), alignment_ms), {})
                    for c, p in pending]
                self.control.send(message)
            except Exception as exc:  # the upload failed: decline, the job goes on
                # (unless the control connection is gone — this attempt is ending and
                # the coordinator knows — so there is no one to tell)
                with contextlib.suppress(ChannelError):
                    self.control.send({"kind": "decline", "id": cid,
                                       "reason": "CHECKPOINT_ASYNC_EXCEPTION",
                                       "error": f"{type(exc).__name__}: {exc}"})

        threading.Thread(target=counted(ack), name=f"ack {cid}", daemon=True).start()

    def decline(self, checkpoint_id: int, reason: AbortReason) -> None:
        """Decline a checkpoint at its barriers; downstream learns by a cancellation
        marker (Flink's abortCheckpointOnBarrier)."""
        self.control.send(decline_message(checkpoint_id, reason))
        if self._gate is not None:  # (an unaligned one records its input state no more)
            self._gate.stop_recording(checkpoint_id, reason.value)
        event = cancel_event(checkpoint_id)
        for out in self.outs:
            out.emit_event(event)

    def notified(self, message: dict[str, Any]) -> None:
        """A message from the coordinator other than trigger / finish."""
        kind, cid = message["kind"], int(message.get("id", 0))
        if kind == "query":  # a live state query, between two buffers of input
            self.control.send(answer(self._keyed_ops, message))
            return
        with counting():
            self._notified(kind, cid)

    def _notified(self, kind: str, cid: int) -> None:
        if kind == "complete":
            for sink in self.chain.sinks:
                try:
                    sink.spec.fn.commit([c for i, c in sink.committables if i <= cid])
                except SinkError as exc:
                    raise SinkError(f"sink {sink.spec.name!r} (subtask {self.subtask}), "
                                    f"checkpoint {cid}: {exc}") from exc
                sink.committables = [e for e in sink.committables if e[0] > cid]
            for op in self.chain.all:  # (a source task's reader: Flink's SourceOperator)
                if op.reader is not None:
                    op.reader.notify_checkpoint_complete(cid)
        for c in self.checkpointers:
            if kind == "complete":
                c.notify_checkpoint_complete(cid)
            elif kind == "abort":
                c.notify_checkpoint_aborted(cid)

    def heartbeat(self) -> None:
        """Tell the coordinator the main loop is alive (at most once a second): a task
        stuck in a call for longer than the heartbeat timeout is taken as hung."""
        now = time.monotonic()
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + 1.0
            self.control.send({"kind": "heartbeat", "metrics": sample(
                idle_ns=self.idle_ns, records_in=self.records_read, gate=self._gate,
                outs=self.outs, watermark=self.watermark,
                backpressured_ns=self.backpressured_ns)})

    def fail(self, exc: BaseException) -> bool:
        """Report a failure (else the coordinator sees the connection drop); whether
        the report was sent (:func:`report_failure`)."""
        return report_failure(self.control, exc)

    def forward_event(self, event: dict[str, Any]) -> None:
        """Send a watermark or idleness event on every output channel."""
        for out in self.outs:
            out.emit_event(event)

    # -- the end

    def finish(self) -> None:
        """Wait for the sinks' last commits, close the chain and the outputs."""
        self.chain.flush()  # (a batch function's last records: flushed at their end)
        while any(s.committables for s in self.chain.sinks):
            message = self.control.receive(30.0)
            if message is None:  # never finish with prepared transactions uncommitted
                raise ChannelError(
                    f"task {self.name}: its input ended but no checkpoint completed the "
                    f"transactions {[s.committables for s in self.chain.sinks]} for 30 s; "
                    f"the job restarts from its latest checkpoint")
            if message["kind"] not in ("trigger", "finish"):
                self.notified(message)
        for c in self.checkpointers:  # (uploads or a materialization still running end
            while not c.ended(1.0):     # before the state they read closes; the task
                self.heartbeat()        # stays alive for the coordinator meanwhile)
            c.close()
        for op in self.chain.all:
            if op.writer is not None:
                op.writer.close()
            if op.reader is not None:
                op.reader.close()
        for op in self.chain.stateful:
            assert op.core is not None
            op.core.close()  # the function's close(); an error fails the task
        for out in self.outs:
            out.close()
        self.control.send({"kind": "finished"})

    # -- main loops

    def run(self, start: dict[str, Any], secret: bytes, gate: InputGate | None) -> None:
        """Run until the task finishes (raises when it fails)."""
        self._open(start, secret)
        if gate is None:
            read_source(self)
        else:
            self._take_inputs(gate)
        self.finish()

    def _take_inputs(self, gate: InputGate) -> None:
        task = self

        class Actions:
            def trigger_checkpoint(self, barrier: Barrier,
                                   in_order: frozenset[int] | None = None) -> None:
                task.checkpoint(barrier, in_order)

            def abort_checkpoint(self, checkpoint_id: int, reason: AbortReason) -> None:
                task.decline(checkpoint_id, reason)

        channels = gate.producers
        aligner = AlignedBarrierHandler(channels, gate, Actions(), time.monotonic,
                                        unaligned=self.graph.unaligned,
                                        aligned_timeout_ms=self.graph.aligned_timeout_ms)
        handler: AlignedBarrierHandler | BarrierTracker = (
            BarrierTracker(channels, Actions(), time.monotonic) if self.graph.at_least_once
            else aligner)
        self._handler = handler
        may_time_out = self.graph.unaligned and self.graph.aligned_timeout_ms > 0
        overtakes, priority = self.graph.unaligned, gate.priority
        next_due = 0.0
        head = self.chain.ops[0]
        push = self.chain.push[0]
        broadcast_side = self._broadcast_side
        two_inputs = any(broadcast_side)
        keyed_head = head.keyed
        if two_inputs:
            assert keyed_head is not None
            process_broadcast = (head.guard(keyed_head.process_broadcast_element)
                                 if head.batch is None else head.batch.broadcast)
            after = self.chain.after[0]
        event_time = self.graph.event_time
        valve = WatermarkValve(channels)
        valve_events = ("watermark", "idle", "active")

        def advance(channel: int, event: dict[str, Any]) -> None:
            for out in valve.on_event(channel, event):
                if out["kind"] == "watermark":  # timers fire before it goes on
                    self.watermark = out["ts"]
                    self.chain.fire_watermark(out["ts"])
                self.forward_event(out)

        idle_flush = self.outs if self.graph.channel.flush_when_idle else []
        # a batch function's records are processed before anything that must see them
        # (.batching): a barrier, a time advance, a message, a pause of the input
        flush = self.chain.flush  # (nothing to do without batch functions)
        next_tick = time.monotonic()
        sides = {e.name: e.broadcast_side for e in self.inputs}
        for edge, records in self._replay:  # records in flight at the checkpoint first
            if sides[edge]:
                for ts, record in (records if event_time else zip(
                        itertools.repeat(None), records)):
                    for out in process_broadcast(record, ts):
                        after(out, ts)
            elif event_time:
                for ts, record in records:
                    push(record, ts)
            else:
                for record in records:
                    push(record, None)
        self._replay = []
        flush()
        while not gate.finished:
            message = self.control.receive(0)
            if message is not None:
                flush()
            while message is not None:
                self.notified(message)
                message = self.control.receive(0)
            if may_time_out:  # aligned checkpoints that time out into unaligned ones
                if aligner.received:
                    flush()
                    aligner.check_timeout()
                if time.monotonic() >= next_due:  # (barriers still queued behind data)
                    gate.overtake_due(time.time() * 1000, self.graph.aligned_timeout_ms)
                    next_due = time.monotonic() + 0.01
            got = gate.poll(0)
            if got is None:  # no input waiting: send what waits, then wait for input
                flush()
                for out in idle_flush:
                    out.flush_idle()
                waited = time.perf_counter_ns()
                got = gate.poll(0.02)
                self.idle_ns += time.perf_counter_ns() - waited
            if got is not None:
                channel, kind, item = got
                if kind is Kind.DATA:
                    if two_inputs and broadcast_side[channel]:
                        for ts, record in (item if event_time else zip(
                                itertools.repeat(None), item)):
                            for out in process_broadcast(record, ts):
                                after(out, ts)
                    elif overtakes:  # an unaligned barrier may stop the buffer midway
                        for i, record in enumerate(item):
                            if event_time:
                                push(record[1], record[0])
                            else:
                                push(record, None)
                            if priority and i + 1 < len(item):
                                gate.unread(channel, item[i + 1:])
                                break
                    elif event_time:
                        for ts, record in item:
                            push(record, ts)
                    else:
                        for record in item:
                            push(record, None)
                elif item.get("kind") in valve_events:
                    flush()
                    advance(channel, item)
                else:  # barrier, cancellation marker, end of partition
                    flush()
                    handler.on_event(channel, item)
            if time.monotonic() >= next_tick:  # processing-time timers, heartbeat
                flush()
                self.chain.fire_processing_time()
                next_tick = time.monotonic() + 0.1
                self.heartbeat()
