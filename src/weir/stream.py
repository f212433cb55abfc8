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
    restarts, result = weir.stream.supervise(   # run the job again after it failed
        lambda: build(StreamEnvironment(config)).execute("count"),
        restart=weir.RestartStrategy.failure_rate(3, "5 min"))

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

import datetime
import logging
import os
import shutil
import uuid
import warnings
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from weir._datastream import (
    BroadcastStream,
    DataStream,
    KeyedBroadcastStream,
    KeyedStream,
    uid_of,
)
from weir.api.checkpointing import CheckpointConfig, CheckpointingMode
from weir.api.config import JobConfig, RocksDBStateBackend, check_restore, state_backend_of
from weir.api.connectors import Source
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
    check_channel_config,
    check_state_backend,
    compile_graph,
)
from weir.runtime.continuous.master import LocalJob
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
from weir.runtime.supervision import resuming
from weir.runtime.supervision import supervise_job as supervise
from weir.runtime.task_metrics import TaskMetrics
from weir.state.keygroups import check_parallelism, compute_default_max_parallelism
from weir.state.rocksdb_options import RocksDBMemory

__all__ = [
    "BroadcastStream", "ChannelConfig", "CheckpointConfig", "CheckpointStats",
    "CheckpointStatus", "CheckpointingMode", "DataStream", "JobClient", "JobResult",
    "KeyedBroadcastStream", "KeyedStream", "QueryServerConfig", "QueryableStateClient",
    "RestartStrategy", "Runner",
    "StreamEnvironment",
    "SubtaskCheckpointStats", "TaskInfo", "TaskMetrics", "WatermarkStrategy", "supervise",
]


_T = TypeVar("_T")

log = logging.getLogger("weir")


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
        #: the job's settings
        self.config = config
        self.checkpoint_storage = check_storage_url(config.storage)
        #: the fsspec options of the checkpoint storage (and of ``restore_from`` and
        #: savepoint targets): the driver and every task open it with them
        self.storage_options: dict[str, Any] | None = (
            None if config.storage_options is None else dict(config.storage_options))
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
        event-time timers (default: the strategy the source was made with, if any)."""
        if not isinstance(source, Source):
            raise ConfigurationError(f"from_source needs a weir.api.connectors.Source, got "
                                     f"{type(source).__name__}")
        own = source.watermarks
        if watermarks is not None and own is not None and watermarks is not own:
            raise ConfigurationError(
                f"from_source(uid={uid!r}): the source was made with a watermark strategy "
                f"and another is given here; give it once")
        watermarks = watermarks if watermarks is not None else own
        if watermarks is not None and not isinstance(watermarks, WatermarkStrategy):
            raise ConfigurationError(f"watermarks must be a WatermarkStrategy, got "
                                     f"{type(watermarks).__name__}")
        p = self._parallelism(parallelism, uid) or self.parallelism
        node = self._add(OperatorSpec(OpKind.SOURCE, uid_of(uid), source,
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
        if restore_from is not None and resuming():
            log.warning("weir: job %r runs again after a failure (weir.stream.supervise): "
                        "it continues its checkpoint storage's state, not restore_from %s",
                        job_name, restore_from)
            restore_from = None
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
        job = LocalJob(graph, self.checkpointing, retained=self.checkpointing.retained,
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
            rocksdb_memory=self.rocksdb_memory, storage_options=self.storage_options)


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
