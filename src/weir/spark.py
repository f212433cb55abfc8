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
  for the batch, the same on a replay). A heartbeat stream (Spark's ``rate`` source,
  one row per second) makes a batch run at least every second, so processing-time
  timers and TTL fire without input. Event time comes from the ``event_time`` column;
  the watermark of batch N is the largest event time seen in batches before N minus
  ``watermark_delay`` (one global watermark, like Spark's default), and event-time
  timers fire when it passes them. (``process`` turns on Spark's
  ``spark.sql.streaming.triggerAvailableNowWrapper.enabled`` so that
  ``trigger(availableNow=True)`` still splits the input into batches with the
  heartbeat source in the query.)
* **Restarts.** The same Spark checkpoint resumes from the last committed batch. A new
  query (a new Spark checkpoint: batch ids from 0) on the same weir
  ``checkpoint_location`` starts from weir's latest *completed* checkpoint (or from
  ``restore_from``), never mixing versions of two queries. A different
  ``parallelism`` rescales from the previous batch; a different ``max_parallelism``
  is refused.
* **Bad records** — a key that cannot be computed (null, unhashable) or a record for
  which the function raises one of ``bad_record_exceptions`` — are written with the
  reason to ``<checkpoint_location>/dead-letter/`` (see :func:`read_dead_letters`);
  the query goes on. Validate before writing state: state changes the function made
  before raising are kept.
* **Determinism.** A replayed batch recomputes from the previous batch's state with
  the same records in the same order and the same batch timestamp; functions must
  be deterministic given those (as for Spark's own stateful operators).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import re
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from weir.api.functions import (
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    ProcessFunction,
)
from weir.checkpoint.coordinator import CompletedCheckpoint, load_checkpoint
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import ConfigurationError, RestoreError
from weir.runtime.operator import StateBackendKind
from weir.runtime.spark.epochs import EpochStore
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
from weir.runtime.spark.task import StageSpec, process_pass
from weir.state.keygroups import check_parallelism

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["finish", "process", "read_dead_letters", "savepoint", "session"]

log = logging.getLogger(__name__)
_UNITS_MS = {
    "ms": 1, "millisecond": 1, "milliseconds": 1, "s": 1000, "second": 1000,
    "seconds": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "minute": 60_000,
    "minutes": 60_000, "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
}


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
    return builder.getOrCreate()


def _duration_ms(value: int | str, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+)\s*([a-z]+)\s*", value.lower())
        if match and match.group(2) in _UNITS_MS:
            return int(match.group(1)) * _UNITS_MS[match.group(2)]
    raise ConfigurationError(
        f"{what} must be milliseconds (int >= 0) or a string like '10 seconds', got {value!r}"
    )


def _output_schema(spark: SparkSession, schema: str | StructType) -> tuple[Any, Any]:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    struct = schema if isinstance(schema, StructType) else _parse_datatype_string(schema)
    if not isinstance(struct, StructType):
        raise ConfigurationError(f"output_schema must describe a struct, got {schema!r}")
    return struct, to_arrow_schema(struct, timezone="UTC")


def _with_internal(struct: StructType) -> StructType:
    from pyspark.sql.types import ByteType, IntegerType, LongType, StructField, StructType

    return StructType([
        *struct.fields, StructField(ROUTE, IntegerType()),
        StructField(KIND, ByteType()), StructField(ORDER, LongType()),
    ])


# ---------------------------------------------------------------- completion


class _Completion:
    """Marks a batch's checkpoint complete once Spark reports the batch done (a
    streaming query listener, one per SparkSession)."""

    def __init__(self) -> None:
        self.stores: dict[tuple[str, str], EpochStore] = {}
        self.lock = threading.Lock()

    def on_progress(self, query: str, batch: int) -> None:
        with self.lock:
            stores = list(self.stores.values())
        for store in stores:
            try:
                store.complete(query, batch)
            except Exception:
                log.exception("weir: completing batch %s of query %s failed", batch, query)


_COMPLETIONS: dict[int, _Completion] = {}


def _completion(spark: SparkSession) -> _Completion:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    key = id(spark.sparkContext)
    found = _COMPLETIONS.get(key)
    if found is not None:
        return found
    completion = _Completion()

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            completion.on_progress(str(event.progress.id), int(event.progress.batchId))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    listener = Listener()
    spark.streams.addListener(listener)
    _COMPLETIONS[key] = completion

    def remove() -> None:  # no callbacks into an exiting interpreter
        with contextlib.suppress(Exception):  # the session may be gone already
            spark.streams.removeListener(listener)

    atexit.register(remove)
    return completion


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


def _check_restore(
    store: EpochStore, spec_maxp: int, restore_from: str | None,
    storage_options: dict[str, Any] | None, uid: str,
) -> None:
    """Refuse a max_parallelism change before any task runs."""
    source: CompletedCheckpoint | None
    if restore_from is not None:
        source = load_checkpoint(restore_from, storage_options=storage_options)
    else:
        source = store.latest_completed(verify=False)
    if source is None:
        return
    op = source.metadata.operators.get(uid)
    if op is not None and op.max_parallelism != spec_maxp:
        raise RestoreError(
            f"operator {uid!r}: {source.url} was written with max_parallelism="
            f"{op.max_parallelism}, but the stage has max_parallelism={spec_maxp}; the number "
            f"of key groups cannot change. Keep max_parallelism={op.max_parallelism} (any "
            f"parallelism up to it works)"
        )


def process(
    df: DataFrame,
    key_by: str | Sequence[str] | Column | None,
    function: Any,
    output_schema: str | StructType,
    uid: str,
    checkpoint_location: str,
    parallelism: int | None = None,
    max_parallelism: int = 128,
    state_backend: str = "hashmap",
    *,
    broadcast: DataFrame | None = None,
    broadcast_state_descriptors: Iterable[Any] = (),
    event_time: str | None = None,
    watermark_delay: int | str = 0,
    heartbeat: bool = True,
    snapshot_mode: str = "incremental",
    restore_from: str | None = None,
    allow_non_restored_state: bool = False,
    bad_record_exceptions: Sequence[type[BaseException]] = (),
    record_format: str = "dict",
    retained: int = 3,
    storage_options: dict[str, Any] | None = None,
) -> DataFrame:
    """Run ``function`` over ``df`` as a weir stage; returns the output DataFrame
    (streaming if ``df`` is). See the module documentation for the semantics.

    ``key_by`` is a column name, several names (the key is then a tuple) or a Column
    expression, or None for a non-keyed :class:`~weir.ProcessFunction` (operator state
    through :class:`~weir.CheckpointedFunction`). ``broadcast`` is a second DataFrame
    (streaming iff ``df`` is) whose rows reach ``process_broadcast_element`` of a
    :class:`~weir.KeyedBroadcastProcessFunction` on every subtask, before the keyed
    records of the same batch. ``snapshot_mode`` applies to RocksDB ("incremental":
    only new SST files are uploaded per batch; the hash map always writes full
    snapshots)."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    spark = df.sparkSession
    streaming = df.isStreaming
    keyed = key_by is not None
    _check_function(function, keyed, broadcast, uid)
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

    out_struct, out_arrow = _output_schema(spark, output_schema)
    storage = CheckpointStorage(checkpoint_location, storage_options=storage_options)
    store = EpochStore(storage, uid, retained=retained)
    _check_restore(store, max_parallelism, restore_from, storage_options, uid)
    spec = StageSpec(
        uid=uid, location=checkpoint_location, parallelism=p, max_parallelism=max_parallelism,
        state_backend=backend, snapshot_mode=snapshot_mode, function=function, keyed=keyed,
        columns=columns, key_columns=key_columns,
        broadcast_columns=tuple(broadcast.columns) if broadcast is not None else (),
        broadcast_state_descriptors=tuple(broadcast_state_descriptors),
        output_schema=out_arrow, event_time=event_time,
        watermark_delay_ms=_duration_ms(watermark_delay, "watermark_delay"),
        record_format=record_format, bad_record_exceptions=tuple(bad_record_exceptions),
        restore_from=restore_from, allow_non_restored_state=allow_non_restored_state,
        retained=retained, storage_options=storage_options,
    )

    now = F.unix_millis(F.current_timestamp()).alias(NOW)
    events = df.select(*[F.col(f"`{c}`") for c in columns], *extra, now)
    route = keyed_route_pass(key_columns, max_parallelism, p) if keyed else round_robin_pass(p)
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
        completion = _completion(spark)
        with completion.lock:
            completion.stores[(checkpoint_location, uid)] = store
    return routed.repartition(p, ROUTE).mapInArrow(process_pass(spec), out_struct)


# ---------------------------------------------------------------- after the fact


def finish(query: Any) -> int | None:
    """Complete the checkpoint of the last batch ``query`` committed, now. The query
    listener does this asynchronously after every batch; call ``finish`` after
    ``stop()`` or ``awaitTermination()`` so that the final batch is complete before
    the process exits, a savepoint is taken or a new query starts. Returns the batch
    id (None if the query ran no batch)."""
    progress = query.lastProgress
    if not progress:
        return None
    batch = int(progress["batchId"])
    for completion in list(_COMPLETIONS.values()):
        completion.on_progress(str(query.id), batch)
    return batch


def read_dead_letters(
    checkpoint_location: str, *, storage_options: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every dead-lettered record of a stage's ``checkpoint_location``: dicts with
    ``uid``, ``query``, ``batch``, ``subtask``, ``reason`` and ``record``. Batches
    that Spark replayed were rewritten in place, so each bad record appears once per
    query run that committed it."""
    storage = CheckpointStorage(checkpoint_location, storage_options=storage_options)
    out: list[dict[str, Any]] = []
    if not storage.exists("dead-letter"):
        return out
    for path in sorted(storage.walk_files("dead-letter")):
        if not path.endswith(".jsonl"):
            continue
        for line in storage.read_bytes(path, path).splitlines():
            if line.strip():
                out.append(json.loads(line))
    out.sort(key=lambda d: (d["query"], d["batch"], d["subtask"]))
    return out


def savepoint(
    checkpoint_location: str,
    target: str,
    *,
    storage_options: dict[str, Any] | None = None,
) -> str:
    """Write a self-contained, backend-independent savepoint into ``target`` from
    the latest completed checkpoint of ``checkpoint_location`` (of a running query:
    its state as of the latest completed batch; of a stopped one: its final state).
    Start a query from it with ``process(..., restore_from=target)``. Returns the
    savepoint's URL."""
    from weir.runtime.spark.savepoints import write_savepoint

    storage = CheckpointStorage(checkpoint_location, storage_options=storage_options)
    latest = EpochStore(storage, "").latest_completed(verify=True)
    if latest is None:
        raise RestoreError(
            f"{checkpoint_location} has no completed checkpoint to take a savepoint from; "
            f"run the query until a batch completes"
        )
    return write_savepoint(latest, target, storage_options=storage_options)
