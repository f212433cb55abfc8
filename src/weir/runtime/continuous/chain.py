"""The operators of one task: a vertex's chain made runnable.

Each :class:`~.graph.OperatorSpec` becomes a :class:`ChainedOperator`: stateless steps
are plain functions; a process function runs in weir's operator core
(:class:`~weir.runtime.nonkeyed.NonKeyedOperator` or
:class:`~weir.runtime.operator.KeyedOperator`, the same as in the harness and on
Spark); a source and a sink keep their positions and committables as operator state of
their uid (even-split list state for a source's positions, or union list state when the
source asks for it; union list state for a sink's committables, so every subtask
recovers every pending transaction).

:meth:`OperatorChain.wire` joins them into ``push`` functions, one per operator, that
take ``(record, timestamp)`` and hand each output to the next operator; the last one
hands it to the task's network outputs (``route``). A record's timestamp follows it
through the chain (outputs of a timer carry the timer's time). A process function with
``bad_record_exceptions`` has a dead-letter sink beside the chain (the job's checkpoint
storage unless ``dead_letters=`` names one; always wrapped in
:class:`~weir.connectors.dead_letters.DeadLetterSink`): a record for which it raises one
of them goes there — ``{"uid", "subtask", "reason", "record", "where": {"job",
"checkpoint"}}``, the checkpoint filled in at the barrier that closes its transaction —
and the job goes on.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from weir.api.descriptors import ListStateDescriptor
from weir.api.functions import CheckpointedFunction, ProcessFunction
from weir.api.watermarks import WatermarkStrategy
from weir.errors import ConfigurationError
from weir.runtime.continuous.graph import JobGraph, OperatorSpec, OpKind, Vertex
from weir.runtime.nonkeyed import NonKeyedOperator
from weir.runtime.operator import KeyedOperator
from weir.runtime.operator_base import OperatorConfig

if TYPE_CHECKING:  # (pyarrow is imported only by a chain with a batch function)
    from weir.runtime.continuous.batching import BatchBuffer

__all__ = ["ChainedOperator", "OperatorChain", "Push", "dead_letter"]

#: feeds one record (and its timestamp, None without event time) to an operator
Push = Callable[[Any, "int | None"], None]


class _Stateful(ProcessFunction[Any, Any], CheckpointedFunction):
    """Holds a source's positions or a sink's committables in a list state;
    ``union``: every subtask gets all of it back on restore."""

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
        raise AssertionError("a source's or sink's state takes no records")


class ChainedOperator:
    """One operator of the chain: its spec and, when it has state, the operator-core
    instance that holds it (``core``)."""

    def __init__(self, spec: OperatorSpec, config: OperatorConfig, job: str = "") -> None:
        self.spec = spec
        #: the job's name (``where`` of its dead letters)
        self.job = job
        self.kind = spec.kind
        self.state: _Stateful | None = None
        self.core: KeyedOperator | NonKeyedOperator | None = None
        #: sinks: (checkpoint id, committable) prepared and not yet committed
        self.committables: list[list[Any]] = []
        self.writer: Any = None
        self.reader: Any = None
        if spec.kind in (OpKind.SOURCE, OpKind.SINK):
            self.state = _Stateful(union=spec.kind is OpKind.SINK or bool(
                getattr(spec.fn, "union_positions", False)))
            self.core = NonKeyedOperator(self.state, config)
        elif spec.kind is OpKind.PROCESS:
            self.core = NonKeyedOperator(spec.fn, config)
        elif spec.kind is OpKind.KEYED:
            assert spec.key_selector is not None
            self.core = KeyedOperator(spec.fn, spec.key_selector, config,
                                      broadcast_state_descriptors=spec.broadcast_descriptors)
        #: a batch function's records gathered between the task's flushes (.batching)
        self.batch: BatchBuffer | None = None
        if spec.batch:
            from weir.runtime.continuous.batching import BatchBuffer

            assert isinstance(self.core, KeyedOperator)
            self.batch = BatchBuffer(self.core, spec.batch_schema, config.describe(),
                                     spec.output_batches)
        #: where the records the function rejects go (a sink of its own)
        self.dead_letters: ChainedOperator | None = None
        if spec.dead_letters is not None:
            self.dead_letters = ChainedOperator(
                spec.dead_letters, dataclasses.replace(config, uid=spec.dead_letters.name,
                                                       state_backend="hashmap"))

    def rejecting(self) -> Callable[[Any, str], None] | None:
        """What writes a record a batch function rejected, with its reason, to the
        dead letters (None: the operator has none)."""
        if self.dead_letters is None or self.core is None:
            return None
        write = self.dead_letters.writer.write
        uid, subtask, job = self.spec.name, self.core.config.subtask_index, self.job

        def reject(record: Any, reason: str) -> None:
            write(dead_letter(uid, subtask, reason, record, job))
        return reject

    def guard(self, process: Callable[[Any, int | None], list[Any]]
              ) -> Callable[[Any, int | None], list[Any]]:
        """``process``, sending a record for which it raises one of the spec's
        ``bad_record_exceptions`` to the dead letters (the state changes it made
        before raising are kept)."""
        bad = self.spec.bad_record_exceptions
        if not bad:
            return process
        assert self.dead_letters is not None and self.core is not None
        write = self.dead_letters.writer.write
        uid, subtask, job = self.spec.name, self.core.config.subtask_index, self.job

        def guarded(value: Any, ts: int | None) -> list[Any]:
            try:
                return process(value, ts)
            except bad as exc:
                write(dead_letter(uid, subtask, exc, value, job))
                return []
        return guarded

    @property
    def keyed(self) -> KeyedOperator | None:
        """The keyed operator core (None if this is not a keyed operator)."""
        return self.core if isinstance(self.core, KeyedOperator) else None


def dead_letter(uid: str, subtask: int, exc: BaseException | str, record: Any, job: str = ""
                ) -> dict[str, Any]:
    """A dead letter of a rejected record (``exc``: the exception it raised, or the
    reason), in the shape both runtimes share
    (:mod:`weir.connectors.dead_letters`): the operator and subtask, the reason, the
    record (its ``repr`` if JSON cannot hold it) and where — the job, and the
    checkpoint that commits it (None here: the dead-letter sink's
    :class:`~weir.connectors.dead_letters.DeadLetterSink` fills it in at the barrier)."""
    try:
        json.dumps(record)
    except (TypeError, ValueError):
        record = repr(record)
    reason = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return {"uid": uid, "subtask": subtask, "reason": reason,
            "record": record, "where": {"job": job, "checkpoint": None}}


class OperatorChain:
    """The operators of subtask ``subtask`` of ``vertex`` (see the module doc)."""

    def __init__(self, graph: JobGraph, vertex: Vertex, subtask: int) -> None:
        self.graph, self.vertex, self.subtask = graph, vertex, subtask
        self.ops = [ChainedOperator(spec, self._config(spec), graph.job)
                    for spec in vertex.chain]
        #: every operator, the dead-letter sinks (off the chain's path) last
        self.all = self.ops + [op.dead_letters for op in self.ops if op.dead_letters]
        #: the batch functions' buffers (a keyed operator heads its chain: the task
        #: flushes them between the records of its input gate)
        self.batches = [op.batch for op in self.ops if op.batch is not None]
        if any(op.batch is not None for op in self.ops[1:]):
            raise ConfigurationError(f"vertex {vertex.id}: a batch function must head "
                                     f"its chain (after a key_by)")
        #: push[k] feeds operator k; after[k] what operator k emits (filled by wire)
        self.push: list[Push] = []
        self.after: list[Push] = []

    def _config(self, spec: OperatorSpec) -> OperatorConfig:
        backend = self.graph.state_backend if spec.kind is OpKind.KEYED else "hashmap"
        return OperatorConfig(uid=spec.name, state_backend=backend,
                              max_parallelism=self.graph.max_parallelism,
                              parallelism=self.vertex.parallelism, subtask_index=self.subtask,
                              rocksdb_memory=self.graph.rocksdb_memory)

    @property
    def stateful(self) -> list[ChainedOperator]:
        """The operators with state in checkpoints, in chain order."""
        return [op for op in self.all if op.core is not None]

    @property
    def sinks(self) -> list[ChainedOperator]:
        """The chain's sinks (dead-letter sinks too)."""
        return [op for op in self.all if op.kind is OpKind.SINK]

    @property
    def watermarks(self) -> WatermarkStrategy | None:
        """The watermark strategy of the chain's source (None: no event time here)."""
        return self.ops[0].spec.watermarks if self.ops[0].kind is OpKind.SOURCE else None

    def wire(self, route: Push) -> None:
        """Build the push functions, the last operator's outputs going to ``route``
        (after the sinks' writers are open)."""
        nxt = route
        push: list[Push] = []
        after: list[Push] = []
        for op in reversed(self.ops):
            after.append(nxt)
            nxt = _push_of(op, nxt)
            push.append(nxt)
        self.push, self.after = push[::-1], after[::-1]

    def flush(self) -> None:
        """Run the batch functions over the records they have taken (in chain order)."""
        for batch in self.batches:
            batch.flush()

    def fire_watermark(self, watermark: int) -> None:
        """Move event time of every keyed operator to ``watermark`` (in chain order;
        what its timers emit goes down the chain first)."""
        for k, op in enumerate(self.ops):
            core = op.keyed
            if core is not None:
                core.advance_watermark(watermark, self.after[k])
                if op.batch is not None:
                    op.batch.timers()

    def fire_processing_time(self) -> None:
        """Fire the due processing-time timers of every keyed operator."""
        for k, op in enumerate(self.ops):
            core = op.keyed
            if core is not None:
                core.advance_processing_time(None, self.after[k])
                if op.batch is not None:
                    op.batch.timers()


def _push_of(op: ChainedOperator, nxt: Push) -> Push:
    kind, fn = op.kind, op.spec.fn
    if kind is OpKind.MAP:
        def push_map(value: Any, ts: int | None) -> None:
            nxt(fn(value), ts)
        return push_map
    if kind is OpKind.FILTER:
        def push_filter(value: Any, ts: int | None) -> None:
            if fn(value):
                nxt(value, ts)
        return push_filter
    if kind is OpKind.FLAT_MAP:
        def push_flat(value: Any, ts: int | None) -> None:
            for out in fn(value):
                nxt(out, ts)
        return push_flat
    if kind is OpKind.SINK:
        write = op.writer.write  # (wired once the writer is open)

        def push_sink(value: Any, ts: int | None) -> None:
            write(value)
        return push_sink
    if kind is OpKind.SOURCE:
        return nxt  # a source's records enter after it
    if op.batch is not None:  # gathered for the next flush
        op.batch.emit = nxt
        op.batch.reject = op.rejecting()
        return op.batch.push
    assert op.core is not None
    process = op.guard(op.core.process_element)

    def push_process(value: Any, ts: int | None) -> None:
        for out in process(value, ts):
            nxt(out, ts)
    return push_process
