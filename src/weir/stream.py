"""The continuous runtime: records flow through tasks in separate OS processes,
checkpoint barriers flow with them (Flink's asynchronous barrier snapshots), and a
failure restarts every task from the latest completed checkpoint.

.. code-block:: python

    import weir
    from weir.stream import StreamEnvironment
    from weir.connectors import SequenceSource, FileSink

    config = weir.JobConfig("/data/ckpt", parallelism=2,
                            state_backend=weir.RocksDBStateBackend(),
                            checkpointing=weir.CheckpointConfig(interval="1 s"),
                            restart_strategy=weir.RestartStrategy.exponential_delay())
    env = StreamEnvironment(config)
    (env.from_source(SequenceSource(1_000_000), uid="numbers")
        .key_by(lambda n: n % 100)
        .process(RunningCount(), uid="count")
        .sink_to(FileSink("/data/out"), uid="sink"))
    result = env.execute("count")        # bounded sources: returns at their end
    job = env.execute_async("count")     # job.trigger_savepoint(path), job.checkpoints(),
                                         # job.stop_with_savepoint(path, drain=True),
                                         # job.cancel(), job.wait()

Operators: sources (several; a :class:`WatermarkStrategy` gives a source's records
event time), ``map`` / ``filter`` / ``flat_map``, ``process`` with a
:class:`~weir.ProcessFunction` (operator state through
:class:`~weir.CheckpointedFunction`), ``key_by(...).process(...)`` with a
:class:`~weir.KeyedProcessFunction` (every state type, TTL, event- and processing-time
timers), ``key_by(...).connect(stream.broadcast(descriptors)).process(...)`` with a
:class:`~weir.KeyedBroadcastProcessFunction`, ``union``, ``rebalance`` and two-phase-
commit sinks (``sink_to``). A process function's rejected records (it raises one of its
``bad_record_exceptions``) go to its dead letters — the job's checkpoint storage
(:func:`weir.read_dead_letters`), or a sink of its own (``dead_letters=``) —
exactly-once, and the job goes on. An operator runs
in its input's task (a chain) when it is
that input's only consumer at the same parallelism over a forward edge. The state of
every operator with a uid is in the same checkpoint format as the harness and the
Spark runtime use.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from weir.api.checkpointing import CheckpointConfig, CheckpointingMode
from weir.api.config import JobConfig, RocksDBStateBackend, check_restore, state_backend_of
from weir.api.connectors import Sink, Source
from weir.api.descriptors import MapStateDescriptor
from weir.api.functions import KeyedBroadcastProcessFunction, KeyedProcessFunction, ProcessFunction
from weir.api.restart import RestartStrategy
from weir.api.watermarks import WatermarkStrategy
from weir.errors import ConfigurationError
from weir.runtime.continuous.channels import ChannelConfig
from weir.runtime.continuous.client import JobClient, JobResult, TaskInfo, run_job
from weir.runtime.continuous.graph import (
    JobGraph,
    LogicalInput,
    LogicalNode,
    OperatorSpec,
    OpKind,
    Partitioner,
    check_channel_config,
    check_state_backend,
    compile_graph,
)
from weir.runtime.continuous.master import LocalJob
from weir.runtime.continuous.metrics import TaskMetrics
from weir.runtime.continuous.queries import QueryableStateClient, QueryServerConfig
from weir.runtime.continuous.settings import (
    check_job_name,
    check_query_server,
    check_storage_url,
    instance_of,
    timeout_seconds,
)
from weir.runtime.continuous.spark_launcher import SparkLauncher
from weir.runtime.continuous.stats import (
    CheckpointStats,
    CheckpointStatus,
    SubtaskCheckpointStats,
)
from weir.state.keygroups import check_parallelism, compute_default_max_parallelism
from weir.state.rocksdb_options import RocksDBMemory

__all__ = [
    "BroadcastStream", "ChannelConfig", "CheckpointConfig", "CheckpointStats",
    "CheckpointStatus", "CheckpointingMode", "DataStream", "JobClient", "JobResult",
    "KeyedBroadcastStream", "KeyedStream", "QueryServerConfig", "QueryableStateClient",
    "RestartStrategy", "Runner",
    "StreamEnvironment",
    "SubtaskCheckpointStats", "TaskInfo", "TaskMetrics", "WatermarkStrategy",
]


_T = TypeVar("_T")


class Runner(StrEnum):
    """Where a continuous job's tasks run."""

    #: one OS process per task on this machine
    LOCAL = "local"
    #: one task of a Spark barrier-mode stage per weir task
    SPARK = "spark"


class StreamEnvironment:
    """Where a continuous job is declared and run (Flink's
    ``StreamExecutionEnvironment``), configured with a :class:`~weir.JobConfig` — the
    same object the micro-batch runtime takes: checkpoint storage, state backend,
    checkpointing (Flink's defaults: off, then only the final checkpoint of a bounded
    job commits the sinks), restart strategy (Flink's default: exponential delay when
    checkpointing is on, no restart otherwise), parallelism (default: the number of
    CPUs), restore. ``channels`` tunes the network buffers between tasks,
    ``query_server`` the live state query endpoint.

    The keyword arguments of earlier releases (``checkpoint_storage=``,
    ``parallelism=``, ``max_parallelism=``, ``state_backend=``, ``checkpointing=``,
    ``restart_strategy=``, ``rocksdb_memory=``) still work, with a
    :class:`DeprecationWarning`.

    Every setting is checked here, and every operator's as it is added: a bad one
    raises :class:`~weir.errors.ConfigurationError` naming it and what is allowed,
    never a task that fails and restarts."""

    def __init__(self, config: JobConfig | None = None, *,
                 channels: ChannelConfig | None = None,
                 query_server: QueryServerConfig | None = None,
                 **deprecated: Any) -> None:
        config = _legacy_config(config, deprecated)
        if config.storage_options:
            raise ConfigurationError(
                "JobConfig(storage_options=) is not supported by the continuous runtime "
                "yet: its tasks open the storage from the URL alone; configure the "
                "filesystem through fsspec's environment (e.g. AWS_* variables)")
        #: the job's settings
        self.config = config
        self.checkpoint_storage = check_storage_url(config.storage)
        parallelism = config.parallelism or os.cpu_count() or 1
        max_parallelism = (config.max_parallelism if config.max_parallelism is not None
                           else max(128, compute_default_max_parallelism(parallelism)))
        check_parallelism(parallelism, max_parallelism)
        self.parallelism, self.max_parallelism = parallelism, max_parallelism
        #: "hashmap" or "rocksdb"
        self.state_backend = check_state_backend(config.state_backend.name)
        backend = config.state_backend
        #: each task process's RocksDB budget and entry cache (None: the hash map)
        self.rocksdb_memory: RocksDBMemory | None = (
            RocksDBMemory.of(backend) if isinstance(backend, RocksDBStateBackend) else None)
        self.checkpointing = config.checkpointing
        self.restart_strategy = config.effective_restart_strategy()
        self.channels = check_channel_config(channels or ChannelConfig())
        #: where a running job answers live state queries (loopback, a random secret)
        self.query_server = check_query_server(query_server)
        self._nodes: list[LogicalNode] = []

    def _add(self, op: OperatorSpec, parallelism: int,
             inputs: tuple[LogicalInput, ...] = ()) -> int:
        self._nodes.append(LogicalNode(op, parallelism, inputs))
        return len(self._nodes) - 1

    def from_source(self, source: Source[Any], *, uid: str, parallelism: int | None = None,
                    watermarks: WatermarkStrategy | None = None) -> DataStream:
        """A stream of ``source``'s records; ``uid`` names its state (positions).
        ``watermarks`` gives records their event time (``ctx.timestamp``) and drives
        event-time timers."""
        if not isinstance(source, Source):
            raise ConfigurationError(f"from_source needs a weir.api.connectors.Source, got "
                                     f"{type(source).__name__}")
        if watermarks is not None and not isinstance(watermarks, WatermarkStrategy):
            raise ConfigurationError(f"watermarks must be a WatermarkStrategy, got "
                                     f"{type(watermarks).__name__}")
        p = self._parallelism(parallelism, uid) or self.parallelism
        node = self._add(OperatorSpec(OpKind.SOURCE, _uid(uid), source,
                                      watermarks=watermarks), p)
        return DataStream(self, (LogicalInput(node),), p)

    def _parallelism(self, parallelism: object, uid: object) -> int | None:
        """An operator's own ``parallelism``: None (the default) or an int in
        [1, max_parallelism]."""
        if parallelism is None:
            return None
        try:
            check_parallelism(parallelism, self.max_parallelism)  # type: ignore[arg-type]
        except ConfigurationError as exc:
            raise ConfigurationError(f"operator {uid!r}: {exc} (None: the environment's "
                                     f"parallelism, {self.parallelism})") from None
        assert isinstance(parallelism, int)
        return parallelism

    def execute(self, job_name: str = "job", *,
                timeout: str | float | datetime.timedelta | None = None,
                restore_from: str | Path | None = None,
                allow_non_restored_state: bool = False,
                runner: Runner | str = Runner.LOCAL, spark: Any = None) -> JobResult:
        """Run the job until its bounded sources end (restarting after failures as the
        restart strategy allows); what it did. Raises
        :class:`~weir.errors.JobFailedError` when it gives up.

        The job claims its checkpoint storage (one running job per storage: another
        one running refuses this one with :class:`~weir.errors.OwnershipError`) and
        starts from ``restore_from`` when given — a savepoint or checkpoint written by
        any runtime (the harness, Spark, this one, ``weir.write_savepoint``) at any
        parallelism, matched to the operators by uid; state of an operator the job does
        not have is an error unless ``allow_non_restored_state``. Without it, the job
        continues the storage's state (its newest completed checkpoint, or the
        savepoint the previous run started from), or starts empty. A restart after a
        failure restores the run's own newest completed checkpoint. A corrupt newest
        checkpoint is an error naming the file and the explicit ``restore_from`` of an
        older one (never a silent fallback: its output was committed). What each
        attempt restored is logged and listed in ``JobResult.restored``.

        ``runner``: :attr:`Runner.LOCAL` (a process per task on this machine) or
        :attr:`Runner.SPARK` (the tasks as one barrier-mode stage of the SparkSession
        ``spark``; one task slot per task).

        ``timeout``: None (the default, as Flink's ``execute``) waits as long as the job
        runs; a duration (``"10 min"``, a :class:`datetime.timedelta`; a bare number is
        seconds, deprecated) ends it with :class:`~weir.errors.JobFailedError` if it runs
        longer.

        Every argument and the job graph are checked before any task starts: a bad one
        raises :class:`~weir.errors.ConfigurationError`; so is the claim on the
        checkpoint storage and what the job restores
        (:class:`~weir.errors.OwnershipError`, :class:`~weir.errors.RestoreError`)."""
        timeout_s = timeout_seconds(timeout)
        return run_job(self._job(job_name, restore_from, allow_non_restored_state, runner,
                                 spark), timeout_s)

    def execute_async(self, job_name: str = "job", *,
                      timeout: str | float | datetime.timedelta | None = None,
                      restore_from: str | Path | None = None,
                      allow_non_restored_state: bool = False,
                      runner: Runner | str = Runner.LOCAL, spark: Any = None) -> JobClient:
        """Start the job in the background (as :meth:`execute`, checked as it is); a
        :class:`JobClient` to take savepoints, stop it with a savepoint, cancel it,
        watch its checkpoints and wait for it. ``timeout``: None (the default) lets it
        run as long as it does."""
        timeout_s = timeout_seconds(timeout)
        job = self._job(job_name, restore_from, allow_non_restored_state, runner, spark)
        return JobClient(job, timeout_s)

    def _job(self, job_name: str, restore_from: str | Path | None,
             allow_non_restored_state: bool, runner: Runner | str, spark: Any) -> LocalJob:
        if restore_from is None:  # (execute's own restore_from wins over the config's)
            restore_from = self.config.restore_from
            allow_non_restored_state = (allow_non_restored_state
                                        or self.config.allow_non_restored_state)
        try:
            runner = Runner(runner)
        except ValueError:
            raise ConfigurationError(f"runner must be 'local' or 'spark', got {runner!r}"
                                     ) from None
        if (runner is Runner.SPARK) != (spark is not None):
            raise ConfigurationError("runner='spark' needs spark=<a SparkSession>, and "
                                     "spark= is only for runner='spark'")
        check_restore(restore_from, allow_non_restored_state)
        graph = self.job_graph(job_name)
        launcher = SparkLauncher(spark) if runner is Runner.SPARK else None
        job = LocalJob(graph, self.checkpointing,
                       restart=self.restart_strategy, restore_from=restore_from,
                       allow_non_restored_state=allow_non_restored_state,
                       launcher=launcher, query_server=self.query_server)
        # claim the checkpoint storage and decide what the job restores now, before any
        # task starts (for execute_async too): a storage another run owns, a savepoint
        # that cannot be read or holds operators the job lacks raise here
        try:
            job.claim()
        except BaseException:
            shutil.rmtree(job.workdir, ignore_errors=True)  # (made for this job)
            raise
        return job

    def job_graph(self, job_name: str = "job") -> JobGraph:
        """What :meth:`execute` would run: the operators chained into vertices (one task
        per subtask each) and the edges between them (Flink's job graph). Raises
        :class:`~weir.errors.ConfigurationError` for a job that cannot run."""
        check_job_name(job_name)
        nodes = self._nodes
        if not any(n.op.kind is OpKind.SINK for n in nodes):
            raise ConfigurationError("the job has no sink: end every stream with sink_to")
        read = {i.node for n in nodes for i in n.inputs}
        dangling = [n.op.name for k, n in enumerate(nodes)
                    if k not in read and n.op.kind is not OpKind.SINK]
        if dangling:
            raise ConfigurationError(f"the output of {dangling} goes nowhere: end every "
                                     f"stream with sink_to")
        return compile_graph(
            f"{job_name}-{uuid.uuid4().hex[:8]}", nodes,
            checkpoint_storage=self.checkpoint_storage, max_parallelism=self.max_parallelism,
            state_backend=self.state_backend, channel=self.channels,
            rocksdb_memory=self.rocksdb_memory)


_LEGACY = ("checkpoint_storage", "parallelism", "max_parallelism", "state_backend",
           "checkpointing", "restart_strategy", "rocksdb_memory")


def _legacy_config(config: JobConfig | None, old: dict[str, Any]) -> JobConfig:
    """``config``, or one made from the keyword arguments of earlier releases (with a
    :class:`DeprecationWarning`)."""
    unknown = sorted(set(old) - set(_LEGACY))
    if unknown:
        raise TypeError(f"StreamEnvironment() got unexpected keyword argument(s) {unknown}")
    if not old:
        if config is None:
            raise ConfigurationError("StreamEnvironment needs a weir.JobConfig(storage=...) "
                                     "(the job's checkpoint storage)")
        if not isinstance(config, JobConfig):
            raise ConfigurationError(f"config must be a weir.JobConfig, got "
                                     f"{type(config).__name__}")
        return config
    if config is not None:
        raise ConfigurationError(f"give the settings once: in the JobConfig, not also as "
                                 f"{sorted(old)}")
    warnings.warn(f"StreamEnvironment({', '.join(f'{k}=' for k in sorted(old))}) is "
                  f"deprecated: pass weir.JobConfig(storage=..., parallelism=..., "
                  f"state_backend=weir.RocksDBStateBackend(...), checkpointing=..., "
                  f"restart_strategy=...)", DeprecationWarning, stacklevel=3)
    if "checkpoint_storage" not in old:
        raise ConfigurationError("StreamEnvironment needs checkpoint storage: "
                                 "weir.JobConfig(storage=...)")
    backend = state_backend_of(old.get("state_backend", "hashmap"))
    memory = old.get("rocksdb_memory")
    if memory is not None:
        if not isinstance(memory, RocksDBMemory):
            raise ConfigurationError(f"rocksdb_memory must be a weir.RocksDBMemory, got "
                                     f"{type(memory).__name__}")
        if isinstance(backend, RocksDBStateBackend):
            backend = RocksDBStateBackend(memory.total_bytes,
                                          write_buffer_ratio=memory.write_buffer_ratio,
                                          cache_entries=memory.cache_entries)
    checkpointing = instance_of(old.get("checkpointing"), CheckpointConfig, "checkpointing",
                                "weir.CheckpointConfig")
    storage = old["checkpoint_storage"]
    return JobConfig(check_storage_url(storage), state_backend=backend,
                     checkpointing=checkpointing,
                     restart_strategy=old.get("restart_strategy"),
                     parallelism=old.get("parallelism", 1),
                     max_parallelism=old.get("max_parallelism", 128))


def _rejecting(env: StreamEnvironment, op: OperatorSpec,
               bad_record_exceptions: Sequence[type[BaseException]],
               dead_letters: Sink[Any] | None) -> OperatorSpec:
    """``op`` sending the records its function raises one of ``bad_record_exceptions``
    (or of its class's ``bad_record_exceptions``) for to its dead letters, a sink
    operator of uid ``<uid>-dead-letters``: the ``dead_letters`` sink, or by default the
    job's checkpoint storage (:mod:`weir.connectors.dead_letters`); either wrapped so
    that each dead letter says which checkpoint committed it."""
    from weir.connectors.dead_letters import DeadLetterSink, StorageDeadLetters

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
    if dead_letters is None:
        retention = env.config.dead_letter_retention
        dead_letters = StorageDeadLetters(
            env.checkpoint_storage, int(retention / datetime.timedelta(milliseconds=1)))
    elif not isinstance(dead_letters, Sink):
        raise ConfigurationError(f"operator {op.name!r}: dead_letters must be a "
                                 f"weir.api.connectors.Sink, got {type(dead_letters).__name__}")
    sink = OperatorSpec(OpKind.SINK, f"{op.name}-dead-letters", DeadLetterSink(dead_letters))
    return dataclasses.replace(op, bad_record_exceptions=bad, dead_letters=sink)


def _uid(uid: object) -> str:
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
        op = _rejecting(self._env, OperatorSpec(OpKind.PROCESS, _uid(uid), function),
                        bad_record_exceptions, dead_letters)
        return self._then(op, parallelism)

    def key_by(self, key_selector: Callable[[Any], Any]) -> KeyedStream:
        """The stream partitioned by key (by key group, as on every runtime)."""
        if not callable(key_selector):
            raise ConfigurationError(f"key_by needs a function, got {key_selector!r}")
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
        self._then(OperatorSpec(OpKind.SINK, _uid(uid), sink), parallelism)

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
                dead_letters: Sink[Any] | None = None) -> DataStream:
        """Run ``function`` (a :class:`~weir.KeyedProcessFunction`) per key, with keyed
        state and timers; ``uid`` names its state in checkpoints and savepoints. Bad
        records go to the dead letters as with :meth:`DataStream.process`."""
        if not isinstance(function, KeyedProcessFunction):
            raise ConfigurationError(f"process on a keyed stream needs a "
                                     f"KeyedProcessFunction, got {type(function).__name__}")
        op = _rejecting(self._env, OperatorSpec(OpKind.KEYED, _uid(uid), function,
                                                key_selector=self._key_selector),
                        bad_record_exceptions, dead_letters)
        return self._then(op, self._env.parallelism if parallelism is None else parallelism)

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

    def process(self, function: KeyedBroadcastProcessFunction[Any, Any, Any], *, uid: str,
                parallelism: int | None = None,
                bad_record_exceptions: Sequence[type[BaseException]] = (),
                dead_letters: Sink[Any] | None = None) -> DataStream:
        """Run ``function``: keyed records with keyed state and read-only broadcast state,
        broadcast records with writable broadcast state (the same on every subtask).
        Bad records of either input go to the dead letters as with
        :meth:`DataStream.process`."""
        if not isinstance(function, KeyedBroadcastProcessFunction):
            raise ConfigurationError(f"process on a connected broadcast stream needs a "
                                     f"KeyedBroadcastProcessFunction, got "
                                     f"{type(function).__name__}")
        keyed = self._keyed
        spec = OperatorSpec(OpKind.KEYED, _uid(uid), function,
                            key_selector=keyed._key_selector,
                            broadcast_descriptors=self._broadcast.descriptors)
        op = _rejecting(keyed._env, spec, bad_record_exceptions, dead_letters)
        return keyed._then(op, keyed._env.parallelism if parallelism is None else parallelism,
                           keyed._inputs + self._broadcast._inputs)
