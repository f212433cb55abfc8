"""What a continuous job runs: its job graph, shipped to every task process.

The stream API (:mod:`weir.stream`) declares a logical graph of operators — sources,
stateless ``map`` / ``filter`` / ``flat_map`` steps, non-keyed and keyed process
functions, keyed broadcast process functions, sinks — joined by partitioned inputs
(forward, hash by key group, rebalance, broadcast; a union is several inputs).
:func:`compile_graph` turns it into a :class:`JobGraph` of **vertices**: chains of
operators that run in one task per subtask, as Flink chains them — an operator joins
its input's chain when it is that input's only consumer over a forward edge at the same
parallelism and has no other input. Every other input is an :class:`Edge` carried by
channels between task processes. A forward edge across different parallelisms becomes
a rebalance (as in Flink's DataStream API).

A task is ``(vertex id, subtask)``; a vertex is named by the uid of its first operator
that has one, else by its first operator's name. An edge is named by what it connects
(:func:`edge_name`): its producer's and consumer's vertex ids, which of the edges
between them it is, its side and the form of its records — never by the position of
its input at the consumer, so that the records in flight an unaligned checkpoint stores
under that name (:mod:`weir.checkpoint.channel_state`) find their edge again in a job
that lists its inputs in another order.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from weir.api.watermarks import WatermarkStrategy
from weir.errors import ConfigurationError
from weir.runtime.continuous.channels import DEFAULT_CONFIG, ChannelConfig
from weir.state.keygroups import assign_key_to_parallel_operator, check_parallelism
from weir.state.rocksdb_options import RocksDBMemory

__all__ = ["STATE_BACKENDS", "TIMESTAMPED", "Edge", "JobGraph", "KeyColumn", "LogicalInput",
           "LogicalNode", "OpKind", "OperatorSpec", "Partitioner", "Vertex",
           "check_channel_config", "check_state_backend", "compile_graph", "edge_name"]

STATE_BACKENDS = ("hashmap", "rocksdb")
"""The state backends a job's keyed state can live in (``StateBackendKind`` values)."""


def check_state_backend(state_backend: object) -> str:
    """``state_backend`` as its name (``"hashmap"`` or ``"rocksdb"``; a
    ``StateBackendKind`` is taken by its value); raises
    :class:`~weir.errors.ConfigurationError` naming the allowed ones otherwise."""
    name = getattr(state_backend, "value", state_backend)  # (a StateBackendKind)
    if not isinstance(name, str) or name not in STATE_BACKENDS:
        raise ConfigurationError(f"unknown state_backend {state_backend!r}; choose one of "
                                 f"{list(STATE_BACKENDS)}")
    return name


def _check_ints(owner: object, names: tuple[tuple[str, int], ...], where: str) -> None:
    """Each ``(name, minimum)``: ``owner.name`` is an int (not a bool) >= minimum."""
    for name, minimum in names:
        value = getattr(owner, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigurationError(f"{where}{name} must be an int >= {minimum}, got "
                                     f"{value!r}")


def _finite(value: object, minimum: float, *, strict: bool = False) -> bool:
    """Whether ``value`` is a finite number (not a bool) >= ``minimum`` (> if strict)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and (value > minimum if strict else value >= minimum))


def check_channel_config(config: object) -> ChannelConfig:
    """``config`` if it is a valid :class:`ChannelConfig` (types and ranges of every
    setting); raises :class:`~weir.errors.ConfigurationError` saying which setting is
    wrong and what it allows otherwise."""
    if not isinstance(config, ChannelConfig):
        raise ConfigurationError(f"channels must be a weir.stream.ChannelConfig, got "
                                 f"{type(config).__name__}")
    _check_ints(config, (("buffer_records", 1), ("exclusive_buffers", 1),
                         ("max_backlog", 1), ("floating_buffers", 0)), "ChannelConfig.")
    timeout = config.buffer_timeout_ms
    if not _finite(timeout, 0):
        raise ConfigurationError(f"ChannelConfig.buffer_timeout_ms must be a finite number "
                                 f"of milliseconds >= 0 (0: send after every record), got "
                                 f"{timeout!r}")
    if not isinstance(config.flush_when_idle, bool):
        raise ConfigurationError(f"ChannelConfig.flush_when_idle must be a bool, got "
                                 f"{config.flush_when_idle!r}")
    return config


@dataclasses.dataclass(frozen=True)
class KeyColumn:
    """A key selector by name (``key_by("card")``): a ``dict`` record's item, and for a
    record that is a ``pyarrow.RecordBatch`` (a batch of records travelling as one) the
    column: such a batch is split by key group on its way to the keyed operator, and a
    batch function takes it whole."""

    name: str

    def __call__(self, record: Any) -> Any:
        return record[self.name]

    def split(self, batch: Any, max_parallelism: int, parallelism: int
              ) -> list[tuple[int, Any]]:
        """``batch`` (a ``pyarrow.RecordBatch``) as ``(subtask, part)``: the rows whose
        keys each subtask of ``parallelism`` owns, in order, non-empty parts only (the
        key groups of str and int keys computed in C, others one by one)."""
        import numpy as np
        import pyarrow as pa

        from weir.state._hashcore import route_keys

        keys = batch.column(self.name).to_pylist()
        if not keys:
            return []
        data, slow = route_keys(keys, max_parallelism, parallelism, tuple(range(parallelism)))
        targets = np.frombuffer(data, dtype=np.int32)
        if slow:  # (keys of other types)
            targets = targets.copy()
            for j in slow:
                targets[j] = assign_key_to_parallel_operator(keys[j], max_parallelism,
                                                             parallelism)
        parts = []
        for target in range(parallelism):
            rows = np.flatnonzero(targets == target)
            if len(rows) == len(keys):
                return [(target, batch)]
            if len(rows):
                parts.append((target, batch.take(pa.array(rows))))
        return parts


class Partitioner(enum.Enum):
    """How an edge routes a producer subtask's records to consumer subtasks."""

    #: producer subtask i to consumer subtask i (same parallelism)
    FORWARD = "forward"
    #: by the key's key group (Flink's key-group assignment, as on every runtime)
    HASH = "hash"
    #: round robin over every consumer subtask
    REBALANCE = "rebalance"
    #: every record to every consumer subtask
    BROADCAST = "broadcast"


class OpKind(enum.Enum):
    """What an operator of a chain is."""

    SOURCE = "source"
    MAP = "map"
    FILTER = "filter"
    FLAT_MAP = "flat_map"
    #: a non-keyed ProcessFunction (operator state through CheckpointedFunction)
    PROCESS = "process"
    #: a KeyedProcessFunction or KeyedBroadcastProcessFunction after a hash edge
    KEYED = "keyed"
    SINK = "sink"


#: operators with state in checkpoints (they need a uid)
STATEFUL = frozenset({OpKind.SOURCE, OpKind.PROCESS, OpKind.KEYED, OpKind.SINK})


@dataclasses.dataclass(frozen=True)
class OperatorSpec:
    """One operator: its kind, name (its uid when stateful) and function (a Source,
    a callable, a process function or a Sink)."""

    kind: OpKind
    name: str
    fn: Any
    #: keyed operators: the key selector of their (hash) input
    key_selector: Callable[[Any], Any] | None = None
    #: keyed broadcast operators: the broadcast state descriptors
    broadcast_descriptors: tuple[Any, ...] = ()
    #: sources: event time (records get timestamps, watermarks follow)
    watermarks: WatermarkStrategy | None = None
    #: process functions: a record for which the function raises one of these goes to
    #: ``dead_letters`` (a sink operator of its own uid, ``<uid>-dead-letters``: the
    #: job's checkpoint storage unless the job names a sink) and the job goes on
    bad_record_exceptions: tuple[type[BaseException], ...] = ()
    dead_letters: OperatorSpec | None = None
    #: a keyed operator running a batch function (``fn``: its adapter), the Arrow
    #: schema of its batches (None: inferred per batch), and whether each of its output
    #: batches goes on as one record (else row by row)
    batch: bool = False
    batch_schema: Any = None
    output_batches: bool = False

    @property
    def uid(self) -> str | None:
        """The operator's uid in checkpoints (None: it has no state)."""
        return self.name if self.kind in STATEFUL else None


@dataclasses.dataclass(frozen=True)
class LogicalInput:
    """An input of a logical node: the node it reads and how it is partitioned."""

    node: int
    partitioner: Partitioner = Partitioner.FORWARD
    key_selector: Callable[[Any], Any] | None = None
    #: the broadcast input of a keyed broadcast process function
    broadcast_side: bool = False


@dataclasses.dataclass(frozen=True)
class LogicalNode:
    """An operator of the logical graph with its parallelism and inputs."""

    op: OperatorSpec
    parallelism: int
    inputs: tuple[LogicalInput, ...] = ()


TIMESTAMPED = "timestamped"
"""The tag of an edge name whose records travel as ``(timestamp, record)``."""


def edge_name(producer: str, consumer: str, occurrence: int = 0, *,
              broadcast_side: bool = False, timestamped: bool = False) -> str:
    """The name of an edge, which is its identity in channel state:
    ``<producer>-><consumer>[<occurrence>(,broadcast)(,timestamped)]``.

    ``producer`` and ``consumer`` are vertex ids (their operators' uids); ``occurrence``
    counts the edges from ``producer`` into ``consumer`` on the same side before this
    one (0 but for a stream unioned with itself); ``broadcast`` marks the broadcast
    input of a keyed broadcast function; ``timestamped`` that the records travel as
    ``(timestamp, record)`` (the job has event time) — so a checkpoint's records in
    flight say which form they were stored in. The name is unique among a consumer's
    inputs and does not depend on their order."""
    tags = [str(occurrence)]
    if broadcast_side:
        tags.append("broadcast")
    if timestamped:
        tags.append(TIMESTAMPED)
    return f"{producer}->{consumer}[{','.join(tags)}]"


@dataclasses.dataclass(frozen=True)
class Edge:
    """A network edge between two vertices."""

    #: its identity: :func:`edge_name`
    name: str
    producer: str
    consumer: str
    partitioner: Partitioner
    key_selector: Callable[[Any], Any] | None = None
    broadcast_side: bool = False

    def producers_of(self, consumer: int, producer_parallelism: int) -> list[int]:
        """The producer subtasks that send to consumer subtask ``consumer``."""
        if self.partitioner is Partitioner.FORWARD:
            return [consumer]
        return list(range(producer_parallelism))


@dataclasses.dataclass(frozen=True)
class Vertex:
    """A chain of operators run by one task per subtask."""

    id: str
    parallelism: int
    chain: tuple[OperatorSpec, ...]

    @property
    def is_source(self) -> bool:
        """Whether the chain starts with a source (the task reads, it has no input)."""
        return self.chain[0].kind is OpKind.SOURCE


@dataclasses.dataclass(frozen=True)
class JobGraph:
    """The job's vertices and edges and how its tasks run (see the module doc)."""

    job: str
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...]
    checkpoint_storage: str
    max_parallelism: int = 128
    state_backend: str = "hashmap"
    #: RocksDB's memory budget and entry cache in each task process (None: defaults)
    rocksdb_memory: RocksDBMemory | None = None
    channel: ChannelConfig = DEFAULT_CONFIG
    #: records a source reads per poll between control checks
    source_batch: int = 256
    #: barrier tracking instead of alignment (set from the job's CheckpointConfig)
    at_least_once: bool = False
    #: unaligned checkpoints, and the alignment time after which an aligned one turns
    #: unaligned (0: unaligned from the start; set from the job's CheckpointConfig)
    unaligned: bool = False
    aligned_timeout_ms: int = 0
    #: how keyed state is checkpointed: a ``SnapshotStrategy`` value the state backend
    #: supports (set from the job's CheckpointConfig)
    snapshot: str = "full"
    #: a task whose main loop is silent this long is taken as hung (Flink's
    #: heartbeat.timeout: 50 s)
    heartbeat_timeout_s: float = 50.0
    #: this run of the job (sinks name their transactions by it): start time and a
    #: random part, so runs sort by when they started
    run_id: str = dataclasses.field(default_factory=lambda: (
        f"{int(time.time() * 1000):013d}{uuid.uuid4().hex[:6]}"))
    #: the fsspec options of the checkpoint storage, of ``restore_from`` and of savepoint
    #: targets (``JobConfig.storage_options``; None: none). They may hold credentials:
    #: they travel to the tasks in the graph file (in the driver's private work
    #: directory) and never into a repr, a log line or checkpoint metadata
    storage_options: dict[str, Any] | None = dataclasses.field(
        default=None, repr=False, compare=False)
    #: changelog snapshots: a keyed task materializes its whole state at least this
    #: often (``CheckpointConfig.materialization_interval``; set from the job's
    #: CheckpointConfig)
    materialization_interval_ms: int = 600_000

    def __post_init__(self) -> None:
        # every setting is checked here, in the driver, before any task process starts:
        # a bad one would otherwise fail every task of every restart the same way
        where = f"job {self.job!r}"
        if not isinstance(self.checkpoint_storage, str) or not self.checkpoint_storage:
            raise ConfigurationError(f"{where}: checkpoint_storage must be a non-empty path "
                                     f"or URL, got {self.checkpoint_storage!r}")
        try:
            object.__setattr__(self, "state_backend", check_state_backend(self.state_backend))
            check_channel_config(self.channel)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
        if self.rocksdb_memory is not None and not isinstance(self.rocksdb_memory,
                                                              RocksDBMemory):
            raise ConfigurationError(f"{where}: rocksdb_memory must be a weir.RocksDBMemory "
                                     f"or None, got {type(self.rocksdb_memory).__name__}")
        _check_ints(self, (("source_batch", 1), ("aligned_timeout_ms", 0),
                           ("materialization_interval_ms", 0)), f"{where}: ")
        if self.storage_options is not None:
            if not isinstance(self.storage_options, Mapping):
                raise ConfigurationError(f"{where}: storage_options must be a mapping (fsspec "
                                         f"options) or None, got "
                                         f"{type(self.storage_options).__name__}")
            object.__setattr__(self, "storage_options", dict(self.storage_options))
        heartbeat = self.heartbeat_timeout_s
        if not _finite(heartbeat, 0, strict=True):
            raise ConfigurationError(f"{where}: heartbeat_timeout_s must be a finite number "
                                     f"of seconds > 0, got {heartbeat!r}")
        uids = self.uids()
        duplicates = sorted({u for u in uids if uids.count(u) > 1})
        if duplicates:
            raise ConfigurationError(f"job {self.job!r}: operator uids must be unique; "
                                     f"{duplicates} are used twice")
        ids = [v.id for v in self.vertices]
        if len(set(ids)) != len(ids):
            raise ConfigurationError(f"job {self.job!r}: two tasks would share a name in "
                                     f"{ids}; give the operators other uids")
        for vertex in self.vertices:
            try:
                check_parallelism(vertex.parallelism, self.max_parallelism)
            except ConfigurationError as exc:
                raise ConfigurationError(f"{where}, vertex {vertex.id!r}: {exc}") from None

    @property
    def event_time(self) -> bool:
        """Whether records travel with timestamps (some source has watermarks)."""
        return any(op.watermarks is not None for v in self.vertices for op in v.chain)

    def uids(self) -> list[str]:
        """The uid of every stateful operator (dead-letter sinks too)."""
        ops = [op for v in self.vertices for op in v.chain]
        ops += [op.dead_letters for op in ops if op.dead_letters is not None]
        return [op.uid for op in ops if op.uid is not None]

    def vertex(self, vertex_id: str) -> Vertex:
        """The vertex named ``vertex_id``."""
        for v in self.vertices:
            if v.id == vertex_id:
                return v
        raise KeyError(vertex_id)

    def inputs(self, vertex_id: str) -> list[Edge]:
        """The edges into ``vertex_id`` (in a fixed order: its gate's channels)."""
        return [e for e in self.edges if e.consumer == vertex_id]

    def outputs(self, vertex_id: str) -> list[Edge]:
        """The edges out of ``vertex_id``."""
        return [e for e in self.edges if e.producer == vertex_id]

    def may_emit_batches(self, vertex_id: str) -> bool:
        """Whether records that are batches of records may leave ``vertex_id``: one of
        its operators or an upstream vertex's makes them (a source with a
        ``batch_size``, a batch function with ``output_batches``). Its channels then
        count a batch's rows toward a full buffer on every edge."""
        def makes(op: OperatorSpec) -> bool:
            return (op.output_batches if op.batch else
                    op.kind is OpKind.SOURCE and bool(getattr(op.fn, "batch_size", None)))
        if any(makes(op) for op in self.vertex(vertex_id).chain):
            return True
        return any(self.may_emit_batches(e.producer) for e in self.inputs(vertex_id))

    def tasks(self) -> list[tuple[str, int]]:
        """Every task of the job."""
        return [(v.id, i) for v in self.vertices for i in range(v.parallelism)]

    def sources(self) -> list[tuple[str, int]]:
        """The tasks that read sources."""
        return [(v.id, i) for v in self.vertices if v.is_source
                for i in range(v.parallelism)]


def compile_graph(job: str, nodes: Sequence[LogicalNode], **settings: Any) -> JobGraph:
    """The :class:`JobGraph` of a logical graph (``nodes`` refer to each other by index;
    ``settings`` are the other :class:`JobGraph` fields)."""
    consumers: dict[int, list[tuple[int, LogicalInput]]] = {i: [] for i in range(len(nodes))}
    for i, node in enumerate(nodes):
        _check_node(i, node, nodes)
        for inp in node.inputs:
            consumers[inp.node].append((i, inp))

    def chained(i: int) -> bool:  # node i joins its input's chain
        node = nodes[i]
        if len(node.inputs) != 1:
            return False
        inp = node.inputs[0]
        upstream = nodes[inp.node]
        return (inp.partitioner is Partitioner.FORWARD and len(consumers[inp.node]) == 1
                and upstream.parallelism == node.parallelism)

    chains: list[list[int]] = []
    chain_of: dict[int, int] = {}
    for i in range(len(nodes)):
        if chained(i):
            c = chain_of[nodes[i].inputs[0].node]
            chains[c].append(i)
        else:
            c = len(chains)
            chains.append([i])
        chain_of[i] = c
    vertices = []
    for members in chains:
        ops = tuple(nodes[i].op for i in members)
        named = next((op.uid for op in ops if op.uid is not None), ops[0].name)
        vertices.append(Vertex(named, nodes[members[0]].parallelism, ops))
    timestamped = any(node.op.watermarks is not None for node in nodes)  # (event time)
    edges: list[Edge] = []
    for members, vertex in zip(chains, vertices, strict=True):
        head = nodes[members[0]]
        seen: dict[tuple[str, bool], int] = {}  # (producer, side) -> its edges so far
        for inp in head.inputs:  # (a chain's other members are chained)
            producer = vertices[chain_of[inp.node]]
            partitioner = inp.partitioner
            if partitioner is Partitioner.FORWARD and (
                    producer.parallelism != vertex.parallelism):
                partitioner = Partitioner.REBALANCE
            occurrence = seen.get((producer.id, inp.broadcast_side), 0)
            seen[(producer.id, inp.broadcast_side)] = occurrence + 1
            name = edge_name(producer.id, vertex.id, occurrence,
                             broadcast_side=inp.broadcast_side, timestamped=timestamped)
            edges.append(Edge(name, producer.id, vertex.id, partitioner, inp.key_selector,
                              inp.broadcast_side))
    return JobGraph(job, tuple(vertices), tuple(edges), **settings)


def _check_node(index: int, node: LogicalNode, nodes: Sequence[LogicalNode]) -> None:
    op = node.op
    if any(not 0 <= inp.node < index for inp in node.inputs):
        raise ConfigurationError(f"operator {op.name!r}: inputs must come before it")
    if op.kind is OpKind.SOURCE:
        if node.inputs:
            raise ConfigurationError(f"source {op.name!r} cannot have inputs")
        return
    if not node.inputs:
        raise ConfigurationError(f"operator {op.name!r} has no input")
    for inp in node.inputs:
        if nodes[inp.node].op.kind is OpKind.SINK:
            raise ConfigurationError(f"operator {op.name!r} reads the sink "
                                     f"{nodes[inp.node].op.name!r}, which has no output")
    if op.kind is OpKind.KEYED:
        if any(i.partitioner is not Partitioner.HASH for i in node.inputs
               if not i.broadcast_side):
            raise ConfigurationError(f"keyed operator {op.name!r} needs key_by on its input")
    elif any(i.broadcast_side for i in node.inputs):
        raise ConfigurationError(f"a broadcast stream feeds {op.name!r}, which is not a "
                                 f"keyed broadcast process function")
