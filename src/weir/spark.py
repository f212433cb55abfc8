"""weir on Spark Structured Streaming: Flink-style stateful operators as query stages.

:func:`process` turns a streaming (or static) DataFrame into a DataFrame computed by a
weir function with weir's state backends and checkpoints, exactly-once:

.. code-block:: python

    config = weir.JobConfig("file:///data/weir-state",
                            state_backend=weir.RocksDBStateBackend(memory="512m"))
    out = weir.spark.process(
        events, key_by="card_id", function=FraudDetector(),
        output_schema="card_id string, alert string", uid="fraud-detector",
        config=config, parallelism=4,
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
  comes from a column (:class:`EventTime`); the watermark of batch N is the largest
  event time seen in batches before N minus the watermark delay (one global
  watermark, like Spark's default), and event-time
  timers fire when it passes them. (``process`` turns on Spark's
  ``spark.sql.streaming.triggerAvailableNowWrapper.enabled`` so that
  ``trigger(availableNow=True)`` still splits the input into batches with the
  heartbeat source in the query.)
* **Restarts.** The same Spark checkpoint resumes from the last committed batch. A new
  query (a new Spark checkpoint: batch ids from 0) on the same weir checkpoint
  storage (``JobConfig.storage``) takes the stage over from weir's latest *completed*
  checkpoint (or from ``JobConfig.restore_from``), never mixing versions of two queries. A
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
  invalid event time, or a record for which the function raises one of its class's
  ``bad_record_exceptions`` — are written with the reason to
  ``<storage>/dead-letter/`` (see :func:`read_dead_letters`); the query goes
  on. **Late records** (event time not after the watermark) are processed, as in
  Flink (:attr:`~weir.LateRecords.PROCESS`), or dropped (``DROP``) or dead-lettered
  (``DEAD_LETTER``; ``EventTime(late_records=)``); each batch's checkpoint counts them
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
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from weir.api.batch import KeyedBatchFunction, KeyedBroadcastBatchFunction
from weir.api.config import JobConfig, RocksDBStateBackend
from weir.api.functions import (
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    ProcessFunction,
)
from weir.api.restart import RestartStrategy
from weir.checkpoint.coordinator import CompletedCheckpoint, load_checkpoint
from weir.checkpoint.epochs import EpochStore, lineage_state
from weir.checkpoint.ownership import Lineage
from weir.checkpoint.storage import CheckpointStorage
from weir.connectors.dead_letters import read_dead_letters
from weir.errors import (
    ConfigurationError,
    RestoreError,
)
from weir.runtime.batch_function import adapter_for
from weir.runtime.spark.client import JobClient
from weir.runtime.spark.keys import check_key_types
from weir.runtime.spark.lifecycle import (
    finish,
    recover,
    savepoint,
    stop_with_savepoint,
)
from weir.runtime.spark.listener import Stage, completion
from weir.runtime.spark.options import (
    Broadcast,
    EventTime,
    bad_record_exceptions,
    legacy_arguments,
    stage_resources,
)
from weir.runtime.spark.routing import (
    BROADCAST_PREFIX,
    KEY,
    NOW,
    ORDER,
    ROUTE,
    broadcast_pass,
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
    "DAEMON", "Broadcast", "EventTime", "JobClient", "RestartStrategy", "finish", "process",
    "read_dead_letters", "recover", "register_state_source", "savepoint", "session",
    "stop_with_savepoint", "supervise",
]

log = logging.getLogger(__name__)

#: the Python daemon :func:`session` sets (``spark.python.daemon.module``): PySpark's,
#: forking workers with what a weir task imports loaded once, about a second of CPU
#: less per new worker (:mod:`weir.runtime.spark.daemon`)
DAEMON = "weir.runtime.spark.daemon"


def session(master: str = "local[*]", app_name: str = "weir", **conf: str) -> SparkSession:
    """A SparkSession set up for weir: Python workers run this interpreter (so they
    see the same packages), the UI is off unless asked for, and shuffles of static
    queries use the cores there are. Its log reports a failed task once: a weir
    function's exception (a :class:`~weir.errors.UserFunctionError`, the user's
    exception first) in the query's failure, not again in each task attempt's and the
    executor's reports (``weir.runtime.spark.supervise.report_failures_once``). Its
    Python workers are forked with weir, pyarrow and pandas loaded (:data:`DAEMON`)."""
    import os
    import sys

    from pyspark.sql import SparkSession

    from weir.runtime.spark.supervise import report_failures_once

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {"spark.ui.enabled": "false", "spark.python.daemon.module": DAEMON, **conf}
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    register_state_source(spark)
    report_failures_once(spark)
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
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    return StructType([
        *[f for f in struct.fields if f.name != NOW], StructField(ROUTE, IntegerType()),
        StructField(ORDER, LongType()),
    ])

# ---------------------------------------------------------------- process


def _check_function(function: Any, keyed: bool, broadcast: Any, uid: str) -> None:
    if isinstance(function, KeyedBatchFunction):
        if not keyed:
            raise ConfigurationError(f"operator {uid!r}: a KeyedBatchFunction needs key_by")
        if broadcast is not None and not isinstance(function, KeyedBroadcastBatchFunction):
            raise ConfigurationError(
                f"operator {uid!r}: a broadcast DataFrame needs a "
                f"KeyedBroadcastBatchFunction, got {type(function).__name__}")
        if getattr(function, "bad_record_exceptions", ()):
            raise ConfigurationError(
                f"operator {uid!r}: a KeyedBatchFunction takes no bad_record_exceptions "
                f"(an exception of process_batch fails the batch): remove them, declare "
                f"rejects_records = True and send bad rows to the dead letters with "
                f"ctx.reject(rows, reason)"
            )
        return
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
    config: JobConfig | None = None,
    parallelism: int | None = None,
    *,
    event_time: str | EventTime | None = None,
    broadcast: DataFrame | Broadcast | None = None,
    heartbeat: bool = True,
    record_format: str = "dict",
    **deprecated: Any,
) -> DataFrame:
    """Run ``function`` over ``df`` as a weir stage with the job settings ``config``
    (:class:`~weir.JobConfig`: checkpoint storage, state backend, checkpointing,
    restore); returns the output DataFrame (streaming if ``df`` is). See the module
    documentation for the semantics.

    ``key_by`` is a column name, several names (the key is then a tuple) or a Column
    expression, or None for a non-keyed :class:`~weir.ProcessFunction` (operator state
    through :class:`~weir.CheckpointedFunction`). ``uid`` names the stage's state.
    ``parallelism`` is the stage's number of subtasks (default: ``config``'s, else
    Spark's default parallelism). ``event_time`` is a column name or an
    :class:`EventTime` (watermark delay, late records). ``broadcast`` is a second
    DataFrame (or a :class:`Broadcast` with its state descriptors) whose rows reach
    ``process_broadcast_element`` of a :class:`~weir.KeyedBroadcastProcessFunction`
    on every subtask, before the keyed records of the same batch. ``heartbeat`` (on by
    default) adds Spark's ``rate`` source (one row a second), so that a batch runs at
    least every second and processing-time timers and TTL fire without input.
    Records reach the function as dicts, or tuples with ``record_format="tuple"``;
    outputs are tuples or dicts matching ``output_schema``. Records for which the
    function raises one of its class's ``bad_record_exceptions`` go to the dead letters.

    The checkpoint strategy is ``config.checkpointing.snapshot``
    (:class:`~weir.SnapshotStrategy`; by default the hash map writes a changelog — what
    a batch changed, nothing for an idle batch, the whole state materialized in the
    background now and then — and RocksDB uploads only its new SST files).
    Process-wide resources (the worker's cache of live subtasks, task buffers, metrics)
    come from the session's ``spark.weir.*`` settings (``weir.runtime.spark.options``);
    RocksDB's memory from the backend object: stages
    with different settings keep their own. The keyword arguments of earlier releases
    still work, with a :class:`DeprecationWarning` naming the replacement."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    from weir.runtime.spark.jvm_route import clock_route, jvm_clock_rows, jvm_keyed_route
    from weir.runtime.spark.jvm_udfs import opaque_millis
    from weir.runtime.spark.observed import observe, with_metrics_field

    spark = df.sparkSession
    streaming = df.isStreaming
    keyed = key_by is not None
    legacy = legacy_arguments(config, event_time, broadcast, deprecated)
    config, event, side = legacy.config, legacy.event_time, legacy.broadcast
    _check_function(function, keyed, side, uid)
    if record_format not in ("dict", "tuple"):
        raise ConfigurationError(f"record_format must be 'dict' or 'tuple', got {record_format!r}")
    exceptions = bad_record_exceptions(function, legacy.bad_record_exceptions, uid)
    if isinstance(function, KeyedBatchFunction):  # the operator runs it through this
        function = adapter_for(function)
    backend = config.state_backend
    checkpointing = config.checkpointing
    p = parallelism or config.parallelism or spark.sparkContext.defaultParallelism
    if config.max_parallelism is not None:
        check_parallelism(p, config.max_parallelism)
    columns = tuple(df.columns)
    if event is not None and event.column not in columns:
        raise ConfigurationError(f"event_time column {event.column!r} is not in "
                                 f"{list(columns)}")
    if side is not None and side.df.isStreaming != streaming:
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
    location = config.storage
    storage_options = (None if config.storage_options is None
                       else dict(config.storage_options))
    storage = CheckpointStorage(location, storage_options=storage_options)
    dead_letter_ms = int(config.dead_letter_retention / timedelta(milliseconds=1))
    store = EpochStore(storage, uid, retained=checkpointing.retained,
                       dead_letter_retention_ms=dead_letter_ms)
    lease_ms = checkpointing.lease_timeout_ms
    res = stage_resources(spark, legacy.resources)
    lineage = Lineage(store.stage, lease_ms)
    max_parallelism = _resolve_max_parallelism(
        store, lineage, config.max_parallelism, p, config.restore_from,
        config.allow_non_restored_state, storage_options, uid,
    )
    check_parallelism(p, max_parallelism)
    memory = (RocksDBMemory.of(backend) if isinstance(backend, RocksDBStateBackend)
              else RocksDBMemory())
    snapshot = checkpointing.snapshot_for(backend.name)
    spec = StageSpec(
        uid=uid, location=location, parallelism=p, max_parallelism=max_parallelism,
        state_backend=backend.name, snapshot_mode=snapshot.value, function=function,
        keyed=keyed, columns=columns, key_columns=key_columns,
        broadcast_columns=tuple(side.df.columns) if side is not None else (),
        broadcast_state_descriptors=side.state_descriptors if side is not None else (),
        output_schema=out_arrow, event_time=event.column if event is not None else None,
        watermark_delay_ms=event.watermark_delay_ms if event is not None else 0,
        record_format=record_format, bad_record_exceptions=exceptions,
        late_records=event.late_records.value if event is not None else "process",
        restore_from=config.restore_from,
        allow_non_restored_state=config.allow_non_restored_state,
        retained=checkpointing.retained, storage_options=storage_options,
        lease_timeout_ms=lease_ms,
        materialize_interval_ms=checkpointing.materialization_interval_ms,
        instance=uuid.uuid4().hex,
        cache_max_subtasks=res.cache_subtasks, cache_max_bytes=res.cache_memory,
        dead_letter_retention_ms=dead_letter_ms, rocksdb_memory_bytes=memory.total_bytes,
        rocksdb_write_buffer_ratio=memory.write_buffer_ratio,
        rocksdb_cache_entries=memory.cache_entries,
        task_buffer_bytes=res.task_buffer, metrics=res.metrics,
    )
    metrics = res.metrics
    broadcast_df = side.df if side is not None else None

    # the batch time, kept out of the generated code (compiled once, not every batch)
    batch_ms = opaque_millis(F.unix_millis(F.current_timestamp()))
    now = batch_ms.alias(NOW)
    inputs = df.select(*[F.col(f"`{c}`") for c in columns], *extra)
    # an input whose keys Spark hashes as weir does is routed in the JVM (the records do
    # not pass through Python before the shuffle); other keys and non-keyed input by a
    # route pass
    jvm = jvm_keyed_route(inputs, key_columns, max_parallelism, p, batch_ms) if keyed else None
    beat: DataFrame | None = None
    if streaming and heartbeat:
        beat = (spark.readStream.format("rate").option("rowsPerSecond", 1)
                .option("numPartitions", 1).load())
    elif not streaming:
        beat = spark.range(1, numPartitions=1)
    clocks = jvm_clock_rows(beat, p, batch_ms) if beat is not None else None
    if jvm is not None and broadcast_df is None:
        # partitioned by the route expression: no route column crosses the shuffle
        routed = (jvm.rows if clocks is None
                  else jvm.rows.unionByName(clocks, allowMissingColumns=True))
        shuffled = routed.repartition(p, jvm.route)
    else:  # rows of a route pass among them: every row carries its route
        if jvm is not None:
            routed = jvm.rows.select("*", jvm.route.alias(ROUTE))
        else:
            events = inputs.select("*", now)
            route = (keyed_route_pass(key_columns, max_parallelism, p) if keyed
                     else round_robin_pass(p))
            routed = events.mapInArrow(route, _with_internal(events.schema))
        if broadcast_df is not None:
            b = broadcast_df.select(
                *[F.col(f"`{c}`").alias(BROADCAST_PREFIX + c) for c in broadcast_df.columns],
                now,
            )
            routed = routed.unionByName(
                b.mapInArrow(broadcast_pass(p), _with_internal(b.schema)),
                allowMissingColumns=True,
            )
        if clocks is not None:
            routed = routed.unionByName(clocks.select("*", clock_route(p).alias(ROUTE)),
                                        allowMissingColumns=True)
        shuffled = routed.repartition(p, ROUTE)
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
    if not metrics:
        return shuffled.mapInArrow(process_pass(spec), out_struct)
    return observe(shuffled.mapInArrow(process_pass(spec), with_metrics_field(out_struct)), uid)


