"""What :func:`weir.spark.process` is told besides its operator: event time, the
broadcast input, the session's process-wide resources (``spark.weir.*``), and the
keyword arguments of earlier releases mapped onto the configuration objects.

Process-wide resources are read from the Spark session's configuration, so every
stage of a session sees the same ones (a stage never resizes another's):

=====================================  =========  ===========================================
``spark.weir.worker.cacheSubtasks``    32         live subtasks a Python worker keeps between
                                                  batches (``weir.runtime.spark.cache``)
``spark.weir.worker.cacheMemory``      (unset)    resident memory up to which it keeps them
                                                  (default: 80% of
                                                  ``spark.executor.pyspark.memory``, else 4g)
``spark.weir.task.bufferMemory``       64m        Arrow bytes a task holds in memory before
                                                  spilling to a local file
                                                  (``weir.runtime.spark.spill``)
``spark.weir.metrics``                 false      each batch's metrics also in Spark's
                                                  progress, ``observedMetrics["weir:<uid>"]``
                                                  (5-8% of throughput for a stage that emits
                                                  a row per record; ``JobClient.metrics()``
                                                  reads them from the checkpoints for free)
=====================================  =========  ===========================================
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from weir.api.checkpointing import SnapshotStrategy
from weir.api.config import JobConfig, LateRecords, RocksDBStateBackend, state_backend_of
from weir.api.durations import Duration, byte_size, duration_ms
from weir.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Broadcast", "EventTime", "Resources", "legacy_arguments", "resources"]


@dataclass(frozen=True, init=False)
class EventTime:
    """Event time of a stage: the ``column`` holding each record's event time (a
    timestamp or epoch milliseconds), the ``watermark_delay`` behind the largest event
    time seen (batch N's watermark: the largest event time of the batches before N,
    minus the delay), and what happens to ``late_records``."""

    column: str
    watermark_delay_ms: int
    late_records: LateRecords

    def __init__(self, column: str, watermark_delay: Duration = 0,
                 late_records: LateRecords | str = LateRecords.PROCESS) -> None:
        if not isinstance(column, str) or not column:
            raise ConfigurationError(f"EventTime column must be a column name, got {column!r}")
        try:
            late = LateRecords(late_records)
        except ValueError:
            raise ConfigurationError(
                f"late_records must be LateRecords.PROCESS (Flink's default), DROP or "
                f"DEAD_LETTER, got {late_records!r}") from None
        object.__setattr__(self, "column", column)
        object.__setattr__(self, "watermark_delay_ms",
                           duration_ms(watermark_delay, "watermark_delay"))
        object.__setattr__(self, "late_records", late)


@dataclass(frozen=True)
class Broadcast:
    """A broadcast input: every row of ``df`` (streaming iff the keyed input is)
    reaches ``process_broadcast_element`` of a
    :class:`~weir.KeyedBroadcastProcessFunction` on every subtask, before the keyed
    records of the same batch; ``state_descriptors`` are the broadcast states it
    writes."""

    df: DataFrame
    state_descriptors: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_descriptors", tuple(self.state_descriptors))


@dataclass(frozen=True)
class Resources:
    """The session's process-wide resources for weir's tasks (``spark.weir.*``)."""

    cache_subtasks: int = 32
    cache_memory: int | None = None
    task_buffer: int = 64 << 20
    metrics: bool = False


def _conf(spark: SparkSession, name: str) -> str | None:
    value = spark.conf.get(name, None)
    return None if value is None or value == "" else str(value)


def resources(spark: SparkSession) -> Resources:
    """The ``spark.weir.*`` settings of ``spark``, checked."""
    found = Resources()
    subtasks = _conf(spark, "spark.weir.worker.cacheSubtasks")
    if subtasks is not None:
        if not subtasks.isdigit() or int(subtasks) < 1:
            raise ConfigurationError(f"spark.weir.worker.cacheSubtasks must be an int >= 1, "
                                     f"got {subtasks!r}")
        found = replace(found, cache_subtasks=int(subtasks))
    memory = _conf(spark, "spark.weir.worker.cacheMemory")
    if memory is not None:
        found = replace(found, cache_memory=byte_size(memory, "spark.weir.worker.cacheMemory"))
    buffer = _conf(spark, "spark.weir.task.bufferMemory")
    if buffer is not None:
        found = replace(found, task_buffer=byte_size(buffer, "spark.weir.task.bufferMemory"))
    metrics = _conf(spark, "spark.weir.metrics")
    if metrics is not None:
        if metrics.lower() not in ("true", "false"):
            raise ConfigurationError(f"spark.weir.metrics must be true or false, got "
                                     f"{metrics!r}")
        found = replace(found, metrics=metrics.lower() == "true")
    return found


#: keyword arguments of earlier releases: where each one went
_MOVED = {
    "checkpoint_location": "config=weir.JobConfig(storage=...)",
    "max_parallelism": "weir.JobConfig(max_parallelism=...)",
    "state_backend": "weir.JobConfig(state_backend=weir.RocksDBStateBackend(...))",
    "restore_from": "weir.JobConfig(restore_from=...)",
    "allow_non_restored_state": "weir.JobConfig(allow_non_restored_state=...)",
    "storage_options": "weir.JobConfig(storage_options=...)",
    "dead_letter_retention": "weir.JobConfig(dead_letter_retention=...)",
    "retained": "weir.CheckpointConfig(retained=...)",
    "snapshot_mode": "weir.CheckpointConfig(snapshot=weir.SnapshotStrategy...)",
    "lease_timeout": "weir.CheckpointConfig(lease_timeout=...)",
    "materialization_interval": "weir.CheckpointConfig(materialization_interval=...)",
    "rocksdb_memory": "weir.RocksDBStateBackend(memory=...)",
    "rocksdb_cache_entries": "weir.RocksDBStateBackend(cache_entries=...)",
    "watermark_delay": "event_time=weir.spark.EventTime(column, watermark_delay=...)",
    "late_records": "event_time=weir.spark.EventTime(column, late_records=...)",
    "broadcast_state_descriptors": "broadcast=weir.spark.Broadcast(df, state_descriptors)",
    "bad_record_exceptions": "a bad_record_exceptions attribute of the function's class",
    "worker_cache_subtasks": "the session setting spark.weir.worker.cacheSubtasks",
    "worker_cache_memory": "the session setting spark.weir.worker.cacheMemory",
    "task_buffer_memory": "the session setting spark.weir.task.bufferMemory",
    "metrics": "the session setting spark.weir.metrics",
}


@dataclass(frozen=True)
class Legacy:
    """:func:`legacy_arguments`'s answer: the configuration objects with the old
    keywords folded in, and the per-stage overrides of session resources."""

    config: JobConfig
    event_time: EventTime | None
    broadcast: Broadcast | None
    bad_record_exceptions: tuple[type[BaseException], ...] | None
    resources: Mapping[str, Any]


def legacy_arguments(config: JobConfig | str | None, event_time: str | EventTime | None,
                     broadcast: DataFrame | Broadcast | None,
                     old: Mapping[str, Any]) -> Legacy:
    """Fold the keyword arguments of earlier releases (``old``) into the configuration
    objects, with one :class:`DeprecationWarning` naming each replacement."""
    unknown = sorted(set(old) - set(_MOVED))
    if unknown:
        raise TypeError(f"weir.spark.process() got unexpected keyword argument(s) {unknown}")
    if old or isinstance(config, str):
        named = sorted(old) + (["checkpoint_location (a string config)"]
                               if isinstance(config, str) else [])
        warnings.warn(
            "weir.spark.process(" + ", ".join(named) + ") is deprecated: " + "; ".join(
                f"{name} -> {_MOVED[name.split(' ')[0]]}" for name in named),
            DeprecationWarning, stacklevel=3)
    storage = config if isinstance(config, str) else old.get("checkpoint_location")
    if config is None or isinstance(config, str):
        if storage is None:
            raise ConfigurationError(
                "weir.spark.process needs config=weir.JobConfig(storage=<checkpoint "
                "location>) (the location of the stage's checkpoints)")
        config = JobConfig(storage)
    elif not isinstance(config, JobConfig):
        raise ConfigurationError(f"config must be a weir.JobConfig, got "
                                 f"{type(config).__name__}")
    elif "checkpoint_location" in old:
        raise ConfigurationError("give the checkpoint location once: JobConfig(storage=)")
    job: dict[str, Any] = {}
    for name in ("max_parallelism", "restore_from", "allow_non_restored_state",
                 "storage_options", "dead_letter_retention"):
        if name in old:
            job[name] = old[name]
    backend = config.state_backend
    if "state_backend" in old:
        backend = state_backend_of(old["state_backend"])
    if isinstance(backend, RocksDBStateBackend) and (
            "rocksdb_memory" in old or "rocksdb_cache_entries" in old):
        backend = RocksDBStateBackend(
            old.get("rocksdb_memory", backend.memory),
            write_buffer_ratio=backend.write_buffer_ratio,
            cache_entries=old.get("rocksdb_cache_entries", backend.cache_entries))
    checkpointing = config.checkpointing
    moved = {k: old[k] for k in ("retained", "lease_timeout", "materialization_interval")
             if k in old}
    if "snapshot_mode" in old:
        mode = old["snapshot_mode"]
        if mode not in ("full", "incremental"):
            raise ConfigurationError(f"snapshot_mode must be 'full' or 'incremental', got "
                                     f"{mode!r}")
        moved["snapshot"] = (SnapshotStrategy.FULL if mode == "full"
                             else SnapshotStrategy.INCREMENTAL if backend.name == "rocksdb"
                             else SnapshotStrategy.CHANGELOG)
    if moved:
        checkpointing = replace(checkpointing, **moved)
    if job or backend is not config.state_backend or checkpointing is not config.checkpointing:
        config = replace(config, state_backend=backend, checkpointing=checkpointing, **job)
    if isinstance(event_time, str):
        event_time = EventTime(event_time, old.get("watermark_delay", 0),
                               old.get("late_records", LateRecords.PROCESS))
    elif event_time is None and old.get("late_records", "process") not in (
            "process", LateRecords.PROCESS):
        raise ConfigurationError("late_records needs event time: event_time=weir.spark."
                                 "EventTime(column, late_records=...)")
    elif event_time is not None and not isinstance(event_time, EventTime):
        raise ConfigurationError(f"event_time must be a column name or a weir.spark.EventTime, "
                                 f"got {event_time!r}")
    if broadcast is not None and not isinstance(broadcast, Broadcast):
        broadcast = Broadcast(broadcast, tuple(old.get("broadcast_state_descriptors", ())))
    exceptions = old.get("bad_record_exceptions")
    return Legacy(config, event_time, broadcast,
                  None if exceptions is None else tuple(exceptions),
                  {k: old[k] for k in ("worker_cache_subtasks", "worker_cache_memory",
                                       "task_buffer_memory", "metrics") if k in old})


def stage_resources(spark: SparkSession, overrides: Mapping[str, Any]) -> Resources:
    """The session's resources, with a deprecated per-stage keyword's value where given."""
    found = resources(spark)
    if "worker_cache_subtasks" in overrides:
        n = overrides["worker_cache_subtasks"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigurationError(f"worker_cache_subtasks must be an int >= 1, got {n!r}")
        found = replace(found, cache_subtasks=n)
    if overrides.get("worker_cache_memory") is not None:
        found = replace(found, cache_memory=byte_size(overrides["worker_cache_memory"],
                                                      "worker_cache_memory"))
    if "task_buffer_memory" in overrides:
        found = replace(found, task_buffer=byte_size(overrides["task_buffer_memory"],
                                                     "task_buffer_memory"))
    if "metrics" in overrides:
        found = replace(found, metrics=bool(overrides["metrics"]))
    return found


def bad_record_exceptions(function: Any, given: Iterable[Any] | None,
                          uid: str) -> tuple[type[BaseException], ...]:
    """The exceptions that mark a record bad for ``function``: its class's
    ``bad_record_exceptions`` attribute (or a deprecated ``given``), checked."""
    found = tuple(given if given is not None else getattr(function, "bad_record_exceptions", ()))
    for exc in found:
        if not (isinstance(exc, type) and issubclass(exc, BaseException)):
            raise ConfigurationError(f"operator {uid!r}: bad_record_exceptions must be "
                                     f"exception types, got {exc!r}")
    return found
