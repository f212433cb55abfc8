"""weir on Spark Structured Streaming: Flink-style stateful operators as query stages.

:func:`process` turns a streaming (or static) DataFrame into a DataFrame computed by a
weir function with weir's state backends and checkpoints, exactly-once:

.. code-block:: python

    out = weir.spark.process(
        events, key_by="card_id", function=FraudDetector(),
        output_schema="card_id string, alert string", uid="fraud-detector",
        checkpoint_location="file:///data/weir-state", parallelism=4,
        max_parallelism=128, state_backend="rocksdb",
    )
    out.writeStream.format("weir-files").option("path", "/data/alerts") \\
        .option("checkpointLocation", "/data/spark-ckpt").start()

How it runs (details in ``docs/architecture.md`` and :mod:`weir.runtime.spark`):
records are routed so that Spark partition ``i`` holds exactly subtask ``i``'s key
groups; each micro-batch is one weir checkpoint (epoch = Spark batch id); a task
restores its subtask as of the previous batch, processes, and writes its state before
it returns; a batch's checkpoint completes once Spark committed the batch.

* **Records** reach the function as dicts (or tuples: ``record_format="tuple"``);
  outputs are tuples or dicts matching ``output_schema``.
* **Time.** Processing time is the batch's timestamp (Spark's ``current_timestamp()``
  for the batch, the same on a replay), on every subtask, with rows or without. A
  heartbeat stream (Spark's ``rate`` source, one row per second) makes a batch run at
  least every second, so processing-time timers and TTL fire without input. Event time
  comes from the ``event_time`` column;
  the watermark of batch N is the largest event time seen in batches before N minus
  ``watermark_delay`` (one global watermark, like Spark's default), and event-time
  timers fire when it passes them. (``process`` turns on Spark's
  ``spark.sql.streaming.triggerAvailableNowWrapper.enabled`` so that
  ``trigger(availableNow=True)`` still splits the input into batches with the
  heartbeat source in the query.)
* **Restarts.** The same Spark checkpoint resumes from the last committed batch. A new
  query (a new Spark checkpoint: batch ids from 0) on the same weir
  ``checkpoint_location`` takes the stage over from weir's latest *completed*
  checkpoint (or from ``restore_from``), never mixing versions of two queries. A
  different ``parallelism`` rescales from the previous batch; ``max_parallelism``
  defaults to Flink's default for the first run and is read from the state afterwards
  (a different one is refused).
* **Enforced, not assumed** (``docs/architecture.md``, "The Spark runtime"). Each
  ``uid`` has its own namespace in the location, so stages can share it. A stage has
  one owner query at a time (claims created by compare-and-set; a lease renewed by its
  batches, released when the query stops: by :func:`finish`, by the listener, or by
  the next ``process()`` of the session): a second query is
  refused (:class:`~weir.errors.OwnershipError`) while the owner runs, and an owner
  that lost the stage is fenced (:class:`~weir.errors.FencedError`). A missing
  previous batch is a :class:`~weir.errors.MissingStateError`, a corrupt file a
  :class:`~weir.errors.CorruptCheckpointError`, an output only partly computed
  (``show()``/``take()`` in ``foreachBatch``) an
  :class:`~weir.errors.IncompleteBatchError`; none falls back to older or empty state.
  :func:`recover` is the explicit way on. Late or speculative task attempts never
  replace the attempt a batch's checkpoint chose.
* **Savepoints and drain.** :func:`savepoint` copies every stage's newest completed
  checkpoint (pinned while it copies) with Spark's source offsets of that batch;
  :func:`stop_with_savepoint` stops a running query with a final savepoint, with
  ``drain=True`` after one more batch at the final watermark, so every event-time
  timer fires (Flink's ``--drain``).
* **Bad records** — a key that cannot be computed (null, unhashable), a malformed input
  line (Spark's ``_corrupt_record`` column is set; its raw text is kept), a null or
  invalid ``event_time``, or a record for which the function raises one of
  ``bad_record_exceptions`` — are written with the reason to
  ``<checkpoint_location>/dead-letter/`` (see :func:`read_dead_letters`); the query goes
  on. **Late records** (event time not after the watermark) are processed, as in
  Flink (``late_records="process"``), or dropped (``"drop"``) or dead-lettered
  (``"dead_letter"``); each batch's checkpoint counts them
  (``source_positions["spark"]["late_records"]``, with ``null_event_time``,
  ``malformed`` and ``dead_letters``). Validate before writing state: state changes
  the function made before raising are kept.
* **Restarts of a failed query.** Spark retries failed tasks, but one exception ends a
  query. :func:`supervise` restarts it as Flink restarts a job, with Flink's restart
  strategies and defaults (:class:`RestartStrategy`: ``exponential_delay()``, the
  default, ``fixed_delay()``, ``failure_rate()``, ``no_restart()``); each restart resumes
  from the last committed batch, and a strategy that gives up raises
  :class:`~weir.errors.RestartsExhaustedError`:
  ``weir.spark.supervise(lambda: out.writeStream...start(), restart=...)``.
* **Determinism.** A replayed batch recomputes from the previous batch's state with
  the same records in the same order and the same batch timestamp; functions must
  be deterministic given those (as for Spark's own stateful operators).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from weir.api.functions import (
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    ProcessFunction,
)
from weir.api.restart import RestartStrategy
from weir.checkpoint.coordinator import CompletedCheckpoint, load_checkpoint
from weir.checkpoint.ownership import Lineage
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import (
    ConfigurationError,
    RestoreError,
)
from weir.runtime.operator import StateBackendKind
from weir.runtime.spark.durations import byte_size, duration_ms
from weir.runtime.spark.epochs import EpochStore
from weir.runtime.spark.keys import check_key_types
from weir.runtime.spark.lifecycle import (
    finish,
    read_dead_letters,
    recover,
    savepoint,
    stop_with_savepoint,
)
from weir.runtime.spark.listener import Stage, completion
from weir.runtime.spark.plan import lineage_state
from weir.runtime.spark.routing import (
    BROADCAST_PREFIX,
    KEY,
    KIND,
    NOW,
    ORDER,
    ROUTE,
    RowKind,
    fan_out_pass,
    keyed_route_pass,
    round_robin_pass,
)
from weir.runtime.spark.spec import StageSpec
from weir.runtime.spark.supervise import supervise
from weir.runtime.spark.task import process_pass
from weir.state.keygroups import check_parallelism, compute_default_max_parallelism
from weir.state.rocksdb import RocksDBMemory

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "RestartStrategy", "finish", "process", "read_dead_letters", "recover",
    "register_state_source", "savepoint", "session", "stop_with_savepoint", "supervise",
]

log = logging.getLogger(__name__)


def session(master: str = "local[*]", app_name: str = "weir", **conf: str) -> SparkSession:
    """A SparkSession set up for weir: Python workers run this interpreter (so they
    see the same packages), the UI is off unless asked for, and shuffles of static
    queries use the cores there are."""
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {"spark.ui.enabled": "false", **conf}
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    register_state_source(spark)
    return spark


def register_state_source(spark: SparkSession) -> None:
    """Make ``spark.read.format("weir-state")`` read weir's state (see
    ``weir.processor.state_source``): ``spark.read.format("weir-state").option("uid",
    U).option("state", S).load(location)``, one partition per stored subtask.
    :func:`session` registers it."""
    from weir.processor.state_source import StateDataSource

    spark.dataSource.register(StateDataSource)



def _output_schema(spark: SparkSession, schema: str | StructType) -> tuple[Any, Any]:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    struct = schema if isinstance(schema, StructType) else _parse_datatype_string(schema)
    if not isinstance(struct, StructType):
        raise ConfigurationError(f"output_schema must describe a struct, got {schema!r}")
    return struct, to_arrow_schema(struct, timezone="UTC")


def _with_internal(struct: StructType) -> StructType:
    """The route pass's output: ``struct`` without ``_weir_now``, with the internal
    columns."""
    from pyspark.sql.types import ByteType, IntegerType, LongType, StructField, StructType

    return StructType([
        *[f for f in struct.fields if f.name != NOW], StructField(ROUTE, IntegerType()),
        StructField(KIND, ByteType()), StructField(ORDER, LongType()),
    ])

# ---------------------------------------------------------------- process


def _check_function(function: Any, keyed: bool, broadcast: Any, uid: str) -> None:
    if broadcast is not None and not isinstance(function, KeyedBroadcastProcessFunction):
        raise ConfigurationError(
            f"operator {uid!r}: a broadcast DataFrame needs a KeyedBroadcastProcessFunction, "
            f"got {type(function).__name__}"
        )
    if keyed and not isinstance(function, KeyedProcessFunction | KeyedBroadcastProcessFunction):
        raise ConfigurationError(
            f"operator {uid!r}: key_by needs a KeyedProcessFunction or "
            f"KeyedBroadcastProcessFunction, got {type(function).__name__}"
        )
    if not keyed and not isinstance(function, ProcessFunction):
        raise ConfigurationError(
            f"operator {uid!r}: without key_by the function must be a ProcessFunction "
            f"(optionally a CheckpointedFunction), got {type(function).__name__}"
        )


def _log_positions(source: CompletedCheckpoint, uid: str) -> None:
    """Say which source positions a stage started from a savepoint reflects: a new query
    reads its sources from wherever it is told to start, not from there."""
    positions = source.metadata.source_positions
    own = (positions.get("spark_stages") or {}).get(uid) or positions.get("spark") or {}
    offsets = own.get("source_offsets")
    where = (f"Spark batch {offsets['batch']} of the query with checkpoint "
             f"{offsets['spark_checkpoint']}, end offsets {json.dumps(offsets['offsets'])}"
             if offsets else "no recorded Spark source offsets")
    log.warning(
        "weir: operator %r starts from %s %s: its state reflects the input up to %s. A new "
        "query reads its sources from where you start them (a file source: from its "
        "first file), so start them there, or records are counted twice or never "
        "(docs/architecture.md, 'Resuming sources after a savepoint')",
        uid, source.kind.value, source.url, where,
    )


def _resolve_max_parallelism(
    store: EpochStore, lineage: Lineage, requested: int | None, parallelism: int,
    restore_from: str | None, allow_non_restored_state: bool,
    storage_options: dict[str, Any] | None, uid: str,
) -> int:
    """The stage's max parallelism: the one its state was written with (a different
    ``requested`` one is refused: the number of key groups cannot change), else
    ``requested``, else Flink's default for ``parallelism``. Also refuses a
    ``restore_from`` that holds no state of ``uid`` (a renamed uid) unless
    ``allow_non_restored_state``, as Flink does."""
    source: CompletedCheckpoint | None
    if restore_from is not None:
        source = load_checkpoint(restore_from, storage_options=storage_options, verify=False)
        if uid not in source.metadata.operators and not allow_non_restored_state:
            raise RestoreError(
                f"operator {uid!r}: restore_from {source.url} holds state of operator(s) "
                f"{sorted(source.metadata.operators)} but none of {uid!r}; starting would "
                f"drop that state. If the stage was renamed, give it its old uid; to start "
                f"{uid!r} with empty state anyway, pass allow_non_restored_state=True"
            )
        _log_positions(source, uid)
    else:
        source = lineage_state(store, lineage)[0]
        if lineage.head() is None and not allow_non_restored_state:
            others = [d for d in EpochStore.stage_dirs(store.location)
                      if d != store.stage.root.rsplit("/", 1)[-1]]
            if others:
                log.warning(
                    "weir: operator %r has no state in %s, which holds state of other "
                    "stages (%s); it starts empty. If it was renamed, give it its old uid "
                    "(state is never moved between uids); pass allow_non_restored_state=True "
                    "to silence this", uid, store.location.url, ", ".join(others),
                )
    op = source.metadata.operators.get(uid) if source is not None else None
    if op is None:
        return requested if requested is not None else compute_default_max_parallelism(
            parallelism)
    if requested is not None and op.max_parallelism != requested:
        raise RestoreError(
            f"operator {uid!r}: {source.url if source else ''} was written with "
            f"max_parallelism={op.max_parallelism}, but the stage has max_parallelism="
            f"{requested}; the number of key groups cannot change. Keep max_parallelism="
            f"{op.max_parallelism} or leave it unset (any parallelism up to it works)"
        )
    return op.max_parallelism


def process(
    df: DataFrame,
    key_by: str | Sequence[str] | Column | None,
    function: Any,
    output_schema: str | StructType,
    uid: str,
    checkpoint_location: str,
    parallelism: int | None = None,
    max_parallelism: int | None = None,
    state_backend: str = "hashmap",
    *,
    broadcast: DataFrame | None = None,
    broadcast_state_descriptors: Iterable[Any] = (),
    event_time: str | None = None,
    watermark_delay: int | str | timedelta = 0,
    late_records: str = "process",
    heartbeat: bool = True,
    snapshot_mode: str = "incremental",
    restore_from: str | None = None,
    allow_non_restored_state: bool = False,
    bad_record_exceptions: Sequence[type[BaseException]] = (),
    record_format: str = "dict",
    retained: int = 3,
    storage_options: dict[str, Any] | None = None,
    lease_timeout: int | str | timedelta = "60 s",
    materialization_interval: int | str | timedelta = "10 min",
    worker_cache_subtasks: int = 32,
    worker_cache_memory: int | str | None = None,
    dead_letter_retention: int | str | timedelta = "7 days",
    rocksdb_memory: int | str = "256m",
    rocksdb_cache_entries: int = 1 << 17,
    task_buffer_memory: int | str = "64m",
    metrics: bool = True,
) -> DataFrame:
    """Run ``function`` over ``df`` as a weir stage; returns the output DataFrame
    (streaming if ``df`` is). See the module documentation for the semantics.

    ``key_by`` is a column name, several names (the key is then a tuple) or a Column
    expression, or None for a non-keyed :class:`~weir.ProcessFunction` (operator state
    through :class:`~weir.CheckpointedFunction`). ``broadcast`` is a second DataFrame
    (streaming iff ``df`` is) whose rows reach ``process_broadcast_element`` of a
    :class:`~weir.KeyedBroadcastProcessFunction` on every subtask, before the keyed
    records of the same batch.

    ``snapshot_mode="incremental"`` (the default) makes each batch's checkpoint follow
    the change, not the state: RocksDB uploads only new SST files; the hash map writes
    a changelog (the keys and timers the batch changed; nothing for an idle batch) and
    materializes its whole state in the background once the changes since the last
    materialization are as large as it, 50 batches changed it, or
    ``materialization_interval`` passed (restore reads the last materialization and
    the changes since: at most about twice the state). ``"full"`` writes the whole
    state every batch.

    Each Python worker keeps the subtasks it ran live between batches (no restore
    when the next batch's task lands there), at most ``worker_cache_subtasks`` of them
    and while its resident memory stays below ``worker_cache_memory`` (bytes or
    '2g'; default 80% of ``spark.executor.pyspark.memory``, else 4 GiB); the least
    recently used are closed (the function's ``close()``) and restored when needed
    again. Hash-map state lives in the worker's memory: size
    ``spark.executor.pyspark.memory`` for it (see ``weir.runtime.spark.cache``).

    RocksDB's block cache and write buffers are shared by every RocksDB subtask of a
    Python worker and bounded together by ``rocksdb_memory`` (memtables up to half
    of it; :class:`~weir.RocksDBMemory`). In front of RocksDB, each value and list
    state of each subtask caches up to ``rocksdb_cache_entries`` entries read or
    written recently, in the worker's Python memory (about 150 bytes each plus the
    key and value bytes; 0: no cache); a batch's writes reach RocksDB once per key,
    in one write batch before its checkpoint.

    A task holds its rows and its outputs as Arrow (outputs leave only once the
    batch's state is durable) and turns rows into Python records a slice of 8,192 at a
    time; beyond ``task_buffer_memory`` of Arrow data each goes to an anonymous file in
    the executor's local directory, read back memory-mapped, so a task's memory does
    not grow with its partition (``weir.runtime.spark.spill``).

    With ``metrics`` (the default) each batch's progress holds the stage's metrics,
    ``query.lastProgress.observedMetrics["weir:<uid>"]`` (records, outputs, late
    records, dead letters, timers fired, state entries and bytes, checkpoint bytes and
    time; ``weir.runtime.spark.observed``). They cost one filter and projection of the
    output (measured: about 9% of throughput for a stage that emits a row per record);
    ``metrics=False`` leaves them out.

    Dead letters are kept ``dead_letter_retention`` after they were written; the
    directories of queries that owned the stage before the current one are deleted once
    it has ``retained`` checkpoints of its own (``weir.runtime.spark.retention``)."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    from weir.runtime.spark.jvm_route import jvm_keyed_route
    from weir.runtime.spark.jvm_udfs import opaque_millis
    from weir.runtime.spark.observed import observe, with_metrics_field

    spark = df.sparkSession
    streaming = df.isStreaming
    keyed = key_by is not None
    _check_function(function, keyed, broadcast, uid)
    if late_records not in ("process", "drop", "dead_letter"):
        raise ConfigurationError(
            f"late_records must be 'process' (Flink's default), 'drop' or 'dead_letter', got "
            f"{late_records!r}"
        )
    if record_format not in ("dict", "tuple"):
        raise ConfigurationError(f"record_format must be 'dict' or 'tuple', got {record_format!r}")
    backend = StateBackendKind(state_backend).value if state_backend in (
        "hashmap", "rocksdb") else None
    if backend is None:
        raise ConfigurationError(
            f"unknown state_backend {state_backend!r}; choose 'hashmap' or 'rocksdb'"
        )
    if snapshot_mode not in ("full", "incremental"):
        raise ConfigurationError(f"snapshot_mode must be 'full' or 'incremental', got "
                                 f"{snapshot_mode!r}")
    p = parallelism if parallelism is not None else spark.sparkContext.defaultParallelism
    if max_parallelism is not None:
        check_parallelism(p, max_parallelism)
    columns = tuple(df.columns)
    if event_time is not None and event_time not in columns:
        raise ConfigurationError(f"event_time column {event_time!r} is not in {list(columns)}")
    for exc in bad_record_exceptions:
        if not (isinstance(exc, type) and issubclass(exc, BaseException)):
            raise ConfigurationError(f"bad_record_exceptions must be exception types, got {exc!r}")
    if broadcast is not None and broadcast.isStreaming != streaming:
        raise ConfigurationError(
            f"operator {uid!r}: the broadcast DataFrame must be streaming exactly when the "
            f"input is (Spark cannot union a streaming and a static DataFrame)"
        )

    extra: list[Column] = []
    key_columns: tuple[str, ...] = ()
    if isinstance(key_by, Column):
        extra.append(key_by.alias(KEY))
        key_columns = (KEY,)
    elif isinstance(key_by, str):
        key_columns = (key_by,)
    elif key_by is not None:
        key_columns = tuple(key_by)
    missing = [c for c in key_columns if c != KEY and c not in columns]
    if missing or (keyed and not key_columns):
        raise ConfigurationError(f"key_by columns {missing or key_columns} are not in "
                                 f"{list(columns)}")
    if keyed:
        check_key_types(df.select(*extra).schema if extra else df.schema, key_columns, uid)

    out_struct, out_arrow = _output_schema(spark, output_schema)
    storage = CheckpointStorage(checkpoint_location, storage_options=storage_options)
    dead_letter_ms = duration_ms(dead_letter_retention, "dead_letter_retention")
    rocksdb_bytes = RocksDBMemory(byte_size(rocksdb_memory, "rocksdb_memory"),
                                  cache_entries=rocksdb_cache_entries).total_bytes
    store = EpochStore(storage, uid, retained=retained, dead_letter_retention_ms=dead_letter_ms)
    lease_ms = duration_ms(lease_timeout, "lease_timeout")
    materialize_ms = duration_ms(materialization_interval, "materialization_interval")
    if isinstance(worker_cache_subtasks, bool) or not isinstance(worker_cache_subtasks, int) or (
        worker_cache_subtasks < 1
    ):
        raise ConfigurationError(
            f"worker_cache_subtasks must be an int >= 1, got {worker_cache_subtasks!r}")
    cache_bytes = (None if worker_cache_memory is None
                   else byte_size(worker_cache_memory, "worker_cache_memory"))
    lineage = Lineage(store.stage, lease_ms)
    max_parallelism = _resolve_max_parallelism(
        store, lineage, max_parallelism, p, restore_from, allow_non_restored_state,
        storage_options, uid,
    )
    check_parallelism(p, max_parallelism)
    spec = StageSpec(
        uid=uid, location=checkpoint_location, parallelism=p, max_parallelism=max_parallelism,
        state_backend=backend, snapshot_mode=snapshot_mode, function=function, keyed=keyed,
        columns=columns, key_columns=key_columns,
        broadcast_columns=tuple(broadcast.columns) if broadcast is not None else (),
        broadcast_state_descriptors=tuple(broadcast_state_descriptors),
        output_schema=out_arrow, event_time=event_time,
        watermark_delay_ms=duration_ms(watermark_delay, "watermark_delay"),
        record_format=record_format, bad_record_exceptions=tuple(bad_record_exceptions),
        late_records=late_records,
        restore_from=restore_from, allow_non_restored_state=allow_non_restored_state,
        retained=retained, storage_options=storage_options, lease_timeout_ms=lease_ms,
        materialize_interval_ms=materialize_ms,
        instance=uuid.uuid4().hex,
        cache_max_subtasks=worker_cache_subtasks, cache_max_bytes=cache_bytes,
        dead_letter_retention_ms=dead_letter_ms, rocksdb_memory_bytes=rocksdb_bytes,
        rocksdb_cache_entries=rocksdb_cache_entries,
        task_buffer_bytes=byte_size(task_buffer_memory, "task_buffer_memory"),
        metrics=bool(metrics),
    )

    # the batch time, kept out of the generated code (compiled once, not every batch)
    batch_ms = opaque_millis(F.unix_millis(F.current_timestamp()))
    now = batch_ms.alias(NOW)
    inputs = df.select(*[F.col(f"`{c}`") for c in columns], *extra)
    # an input whose keys Spark hashes as weir does is routed in the JVM (the records do
    # not pass through Python before the shuffle); other keys and non-keyed input by a
    # route pass
    routed = (jvm_keyed_route(inputs, key_columns, max_parallelism, p, batch_ms)
              if keyed else None)
    if routed is None:
        events = inputs.select("*", now)
        route = (keyed_route_pass(key_columns, max_parallelism, p) if keyed
                 else round_robin_pass(p))
        routed = events.mapInArrow(route, _with_internal(events.schema))
    if broadcast is not None:
        b = broadcast.select(
            *[F.col(f"`{c}`").alias(BROADCAST_PREFIX + c) for c in broadcast.columns], now
        )
        routed = routed.unionByName(
            b.mapInArrow(fan_out_pass(RowKind.BROADCAST, p), _with_internal(b.schema)),
            allowMissingColumns=True,
        )
    beat: DataFrame | None = None
    if streaming and heartbeat:
        beat = (spark.readStream.format("rate").option("rowsPerSecond", 1)
                .option("numPartitions", 1).load().select(now))
    elif not streaming:
        beat = spark.range(1, numPartitions=1).select(now)
    if beat is not None:
        routed = routed.unionByName(
            beat.mapInArrow(fan_out_pass(RowKind.HEARTBEAT, p), _with_internal(beat.schema)),
            allowMissingColumns=True,
        )
    if streaming:
        # Trigger.AvailableNow over several sources (the heartbeat's rate source cannot
        # bound itself) honours maxFilesPerTrigger & co. only through Spark's wrapper
        spark.conf.set("spark.sql.streaming.triggerAvailableNowWrapper.enabled", "true")
        listener = completion(spark)
        # a query of this session stopped a moment ago gives its stages up now, not
        # when the listener's (asynchronous) event comes
        listener.settle_stopped()
        with listener.lock:
            listener.stages[(storage.location, uid)] = Stage(store, lineage, p)
    shuffled = routed.repartition(p, ROUTE)
    if not metrics:
        return shuffled.mapInArrow(process_pass(spec), out_struct)
    return observe(shuffled.mapInArrow(process_pass(spec), with_metrics_field(out_struct)), uid)


