"""The stream API of the continuous runtime (Flink's ``DataStream`` and its kin):
what :meth:`weir.stream.StreamEnvironment.from_source` returns and each step builds —
the logical graph's nodes, added to the environment. Public through
:mod:`weir.stream`."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from weir.api.batch import KeyedBatchFunction, KeyedBroadcastBatchFunction
from weir.api.connectors import Sink
from weir.api.descriptors import MapStateDescriptor
from weir.api.functions import KeyedBroadcastProcessFunction, KeyedProcessFunction, ProcessFunction
from weir.connectors.dead_letters import StorageDeadLetters
from weir.errors import ConfigurationError
from weir.runtime.continuous.graph import (
    KeyColumn,
    LogicalInput,
    OperatorSpec,
    OpKind,
    Partitioner,
)

if TYPE_CHECKING:
    from weir.stream import StreamEnvironment

__all__ = ["BroadcastStream", "DataStream", "KeyedBroadcastStream", "KeyedStream", "uid_of"]


def _batch_spec(keyed: KeyedStream, function: KeyedBatchFunction, uid: str, schema: Any,
                output_batches: bool, bad_record_exceptions: Sequence[type[BaseException]],
                dead_letters: Sink[Any] | None) -> OperatorSpec:
    """The keyed operator of a batch function on ``keyed``, with dead letters if the
    function declares ``rejects_records``."""
    from weir.runtime.batch_function import adapter_for  # (pyarrow: only for batches)

    name = type(function).__name__
    if bad_record_exceptions or getattr(function, "bad_record_exceptions", ()):
        raise ConfigurationError(
            f"operator {uid!r}: {name} is a KeyedBatchFunction, which takes no "
            f"bad_record_exceptions (an exception of process_batch fails the batch); "
            f"declare rejects_records = True and send bad rows to the dead letters with "
            f"ctx.reject(rows, reason)")
    op = OperatorSpec(OpKind.KEYED, uid_of(uid), adapter_for(function),
                      key_selector=keyed._key_selector, batch=True, batch_schema=schema,
                      output_batches=output_batches)
    if not function.rejects_records:
        if dead_letters is not None:
            raise ConfigurationError(
                f"operator {uid!r}: a dead_letters sink needs a KeyedBatchFunction that "
                f"declares rejects_records = True ({name} does not)")
        return op
    return _with_dead_letters(keyed._env, op, (), dead_letters)


def _rejecting(env: StreamEnvironment, op: OperatorSpec,
               bad_record_exceptions: Sequence[type[BaseException]],
               dead_letters: Sink[Any] | None) -> OperatorSpec:
    """``op`` sending the records its function raises one of ``bad_record_exceptions``
    (or of its class's ``bad_record_exceptions``) for to its dead letters, a sink
    operator of uid ``<uid>-dead-letters``: the ``dead_letters`` sink, or by default the
    job's checkpoint storage (:mod:`weir.connectors.dead_letters`); either wrapped so
    that each dead letter says which checkpoint committed it."""
    bad = tuple(bad_record_exceptions) or tuple(getattr(op.fn, "bad_record_exceptions", ()))
    for exc in bad:
        if not (isinstance(exc, type) and issubclass(exc, BaseException)):
            raise ConfigurationError(f"operator {op.name!r}: bad_record_exceptions must be "
                                     f"exception types, got {exc!r}")
    if not bad:
        if dead_letters is not None:
            raise ConfigurationError(
                f"operator {op.name!r}: a dead_letters sink needs bad_record_exceptions "
                f"(given to process, or declared by {type(op.fn).__name__}) — the "
                f"exceptions whose records go there")
        return op
    return _with_dead_letters(env, op, bad, dead_letters)


def _with_dead_letters(env: StreamEnvironment, op: OperatorSpec,
                       bad: tuple[type[BaseException], ...], dead_letters: Sink[Any] | None
                       ) -> OperatorSpec:
    """``op`` with its dead-letter sink (see :func:`_rejecting`)."""
    from weir.connectors.dead_letters import DeadLetterSink

    if dead_letters is None:
        retention = env.config.dead_letter_retention
        retention_ms = int(retention / datetime.timedelta(milliseconds=1))
        dead_letters = StorageDeadLetters(env.checkpoint_storage, retention_ms,
                                          env.storage_options)
    elif not isinstance(dead_letters, Sink):
        raise ConfigurationError(f"operator {op.name!r}: dead_letters must be a "
                                 f"weir.api.connectors.Sink, got {type(dead_letters).__name__}")
    sink = OperatorSpec(OpKind.SINK, f"{op.name}-dead-letters", DeadLetterSink(dead_letters))
    return dataclasses.replace(op, bad_record_exceptions=bad, dead_letters=sink)


def uid_of(uid: object) -> str:
    """``uid`` if it is a non-empty string, else a ConfigurationError."""
    if not isinstance(uid, str) or not uid:
        raise ConfigurationError(f"a uid must be a non-empty string, got {uid!r}")
    return uid


class DataStream:
    """A stream of records (Flink's ``DataStream``): the outputs of one or more
    operators (a union), partitioned for the next one."""

    def __init__(self, env: StreamEnvironment, inputs: tuple[LogicalInput, ...],
                 parallelism: int) -> None:
        self._env, self._inputs, self._parallelism = env, inputs, parallelism

    def _then(self, op: OperatorSpec, parallelism: int | None,
              inputs: tuple[LogicalInput, ...] | None = None) -> DataStream:
        ins = self._inputs if inputs is None else inputs
        forward = len(ins) == 1 and ins[0].partitioner is Partitioner.FORWARD
        p = self._env._parallelism(parallelism, op.name) or (
            self._parallelism if forward else self._env.parallelism)
        node = self._env._add(op, p, ins)
        return DataStream(self._env, (LogicalInput(node),), p)

    def _step(self, kind: OpKind, fn: Callable[[Any], Any]) -> DataStream:
        if not callable(fn):
            raise ConfigurationError(f"{kind.value} needs a function, got {fn!r}")
        name = f"{kind.value}-{len(self._env._nodes)}"
        return self._then(OperatorSpec(kind, name, fn), None)

    def map(self, fn: Callable[[Any], Any]) -> DataStream:
        """Each record replaced by ``fn(record)``."""
        return self._step(OpKind.MAP, fn)

    def filter(self, fn: Callable[[Any], bool]) -> DataStream:
        """The records for which ``fn`` is true."""
        return self._step(OpKind.FILTER, fn)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> DataStream:
        """Every record ``fn`` yields for each record."""
        return self._step(OpKind.FLAT_MAP, fn)

    def process(self, function: ProcessFunction[Any, Any], *, uid: str,
                parallelism: int | None = None,
                bad_record_exceptions: Sequence[type[BaseException]] = (),
                dead_letters: Sink[Any] | None = None) -> DataStream:
        """Run a non-keyed ``function`` on each record (operator state through
        :class:`~weir.CheckpointedFunction`, kept under ``uid``). A record for which
        it raises one of ``bad_record_exceptions`` (default: those its class declares)
        goes to the dead letters — ``{"uid", "subtask", "reason", "record", "where":
        {"job", "checkpoint"}}``, exactly-once — and the job goes on; state changes it
        made before raising are kept. The dead letters go into the job's checkpoint
        storage (read them with :func:`weir.read_dead_letters`, kept
        ``JobConfig.dead_letter_retention``), or to the sink ``dead_letters``."""
        if isinstance(function, KeyedProcessFunction | KeyedBroadcastProcessFunction):
            raise ConfigurationError(f"{type(function).__name__} is keyed: call "
                                     f".key_by(...).process(...)")
        if not isinstance(function, ProcessFunction):
            raise ConfigurationError(f"process needs a ProcessFunction, got "
                                     f"{type(function).__name__}")
        op = _rejecting(self._env, OperatorSpec(OpKind.PROCESS, uid_of(uid), function),
                        bad_record_exceptions, dead_letters)
        return self._then(op, parallelism)

    def key_by(self, key_selector: Callable[[Any], Any] | str) -> KeyedStream:
        """The stream partitioned by key (by key group, as on every runtime): the key
        of a record is ``key_selector(record)``, or with a column name its item of that
        name — and a record that is a ``pyarrow.RecordBatch`` is then a batch of
        records, split by their key column on the way (for a
        :class:`~weir.KeyedBatchFunction`, which takes each part whole)."""
        if isinstance(key_selector, str):
            key_selector = KeyColumn(key_selector)
        if not callable(key_selector):
            raise ConfigurationError(f"key_by needs a function or a column name, got "
                                     f"{key_selector!r}")
        return KeyedStream(self._env, self._repartition(Partitioner.HASH, key_selector),
                           self._parallelism, key_selector)

    def rebalance(self) -> DataStream:
        """The stream spread round robin over the next operator's subtasks."""
        return DataStream(self._env, self._repartition(Partitioner.REBALANCE),
                          self._parallelism)

    def broadcast(self, *descriptors: MapStateDescriptor[Any, Any]) -> BroadcastStream:
        """The stream sent to every subtask of a keyed broadcast process function,
        which keeps ``descriptors``' broadcast state."""
        for d in descriptors:
            if not isinstance(d, MapStateDescriptor):
                raise ConfigurationError(f"broadcast state is described by "
                                         f"MapStateDescriptors, got {type(d).__name__}")
        inputs = tuple(LogicalInput(i.node, Partitioner.BROADCAST, broadcast_side=True)
                       for i in self._inputs)
        return BroadcastStream(inputs, tuple(descriptors))

    def union(self, *others: DataStream) -> DataStream:
        """The records of this stream and of ``others`` (Flink's ``union``)."""
        inputs = list(self._inputs)
        for other in others:
            if not isinstance(other, DataStream) or isinstance(other, KeyedStream):
                raise ConfigurationError(f"union takes DataStreams, got "
                                         f"{type(other).__name__}")
            if other._env is not self._env:
                raise ConfigurationError("union of streams of different environments")
            inputs += other._inputs
        return DataStream(self._env, tuple(inputs), self._parallelism)

    def sink_to(self, sink: Sink[Any], *, uid: str, parallelism: int | None = None) -> None:
        """Write the stream to a two-phase-commit ``sink``; ``uid`` names its state."""
        if not isinstance(sink, Sink):
            raise ConfigurationError(f"sink_to needs a weir.api.connectors.Sink, got "
                                     f"{type(sink).__name__}")
        self._then(OperatorSpec(OpKind.SINK, uid_of(uid), sink), parallelism)

    def _repartition(self, partitioner: Partitioner,
                     key_selector: Callable[[Any], Any] | None = None
                     ) -> tuple[LogicalInput, ...]:
        return tuple(LogicalInput(i.node, partitioner, key_selector) for i in self._inputs)


class KeyedStream(DataStream):
    """A stream partitioned by key (Flink's ``KeyedStream``)."""

    def __init__(self, env: StreamEnvironment, inputs: tuple[LogicalInput, ...],
                 parallelism: int, key_selector: Callable[[Any], Any]) -> None:
        super().__init__(env, inputs, parallelism)
        self._key_selector = key_selector

    def process(self, function: Any, *, uid: str,  # (a KeyedProcessFunction here)
                parallelism: int | None = None,
                bad_record_exceptions: Sequence[type[BaseException]] = (),
                dead_letters: Sink[Any] | None = None, schema: Any = None,
                output_batches: bool = False) -> DataStream:
        """Run ``function`` per key, with keyed state and timers; ``uid`` names its state
        in checkpoints and savepoints. A :class:`~weir.KeyedProcessFunction` gets one
        record at a time, and bad records go to the dead letters as with
        :meth:`DataStream.process`. A :class:`~weir.KeyedBatchFunction` gets the records
        as ``pyarrow`` batches (a ``dict`` record is a row of its items, any other
        record a row of one column, ``value``; ``schema``, a ``pyarrow.Schema``, fixes
        the batches' types, else they are inferred per batch; a record that is a
        ``pyarrow.RecordBatch``, on a stream keyed by a column, is taken whole); its
        outputs' rows become records (``dict`` s, or the values of a batch whose one
        column is ``value``), or with ``output_batches`` each output batch one record."""
        p = self._env.parallelism if parallelism is None else parallelism
        if isinstance(function, KeyedBroadcastBatchFunction):
            raise ConfigurationError(
                f"operator {uid!r}: {type(function).__name__} is a "
                f"KeyedBroadcastBatchFunction: connect its broadcast input first "
                f"(key_by(...).connect(stream.broadcast(descriptor)).process(...))")
        if isinstance(function, KeyedBatchFunction):
            return self._then(_batch_spec(self, function, uid, schema, output_batches,
                                          bad_record_exceptions, dead_letters), p)
        if schema is not None or output_batches:
            raise ConfigurationError(f"operator {uid!r}: schema and output_batches are for "
                                     f"a KeyedBatchFunction, not {type(function).__name__}")
        if not isinstance(function, KeyedProcessFunction):
            raise ConfigurationError(f"process on a keyed stream needs a "
                                     f"KeyedProcessFunction, got {type(function).__name__}")
        op = _rejecting(self._env, OperatorSpec(OpKind.KEYED, uid_of(uid), function,
                                                key_selector=self._key_selector),
                        bad_record_exceptions, dead_letters)
        return self._then(op, p)

    def connect(self, broadcast: BroadcastStream) -> KeyedBroadcastStream:
        """This keyed stream with a broadcast stream, for a
        :class:`~weir.KeyedBroadcastProcessFunction`."""
        if not isinstance(broadcast, BroadcastStream):
            raise ConfigurationError(f"connect takes a stream.broadcast(...), got "
                                     f"{type(broadcast).__name__}")
        return KeyedBroadcastStream(self, broadcast)


class BroadcastStream:
    """A stream broadcast to every subtask of the operator it is connected to, with
    the descriptors of the broadcast state it feeds."""

    def __init__(self, inputs: tuple[LogicalInput, ...],
                 descriptors: tuple[MapStateDescriptor[Any, Any], ...]) -> None:
        self._inputs, self.descriptors = inputs, descriptors


class KeyedBroadcastStream:
    """A keyed stream connected with a broadcast stream."""

    def __init__(self, keyed: KeyedStream, broadcast: BroadcastStream) -> None:
        self._keyed, self._broadcast = keyed, broadcast

    def process(self, function: KeyedBroadcastProcessFunction[Any, Any, Any]
                | KeyedBroadcastBatchFunction, *, uid: str,
                parallelism: int | None = None,
                bad_record_exceptions: Sequence[type[BaseException]] = (),
                dead_letters: Sink[Any] | None = None, schema: Any = None,
                output_batches: bool = False) -> DataStream:
        """Run ``function``: keyed records with keyed state and read-only broadcast state,
        broadcast records with writable broadcast state (the same on every subtask).
        Bad records of either input go to the dead letters as with
        :meth:`DataStream.process`. A :class:`~weir.KeyedBroadcastBatchFunction` gets
        its keyed records in batches (``schema`` and ``output_batches`` as with
        :meth:`KeyedStream.process`), its broadcast records one by one."""
        keyed = self._keyed
        if isinstance(function, KeyedBroadcastBatchFunction):
            spec = dataclasses.replace(
                _batch_spec(keyed, function, uid, schema, output_batches,
                            bad_record_exceptions, dead_letters),
                broadcast_descriptors=self._broadcast.descriptors)
            return keyed._then(spec, keyed._env.parallelism if parallelism is None
                               else parallelism, keyed._inputs + self._broadcast._inputs)
        if not isinstance(function, KeyedBroadcastProcessFunction):
            raise ConfigurationError(f"process on a connected broadcast stream needs a "
                                     f"KeyedBroadcastProcessFunction or a "
                                     f"KeyedBroadcastBatchFunction, got "
                                     f"{type(function).__name__}")
        if schema is not None or output_batches:
            raise ConfigurationError(f"operator {uid!r}: schema and output_batches are for "
                                     f"a KeyedBatchFunction, not {type(function).__name__}")
        spec = OperatorSpec(OpKind.KEYED, uid_of(uid), function,
                            key_selector=keyed._key_selector,
                            broadcast_descriptors=self._broadcast.descriptors)
        op = _rejecting(keyed._env, spec, bad_record_exceptions, dead_letters)
        return keyed._then(op, keyed._env.parallelism if parallelism is None else parallelism,
                           keyed._inputs + self._broadcast._inputs)
