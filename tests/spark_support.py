"""Helpers of the Spark runtime tests: input files, a query runner with an idempotent
per-batch sink, and the functions the tests run (pickled by value for the workers)."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import weir
import weir.spark

COUNT = weir.ValueStateDescriptor[int]("count")
SEEN = weir.ListStateDescriptor[int]("seen")


class Count(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Running count per key; emits (key, seq, count, subtask)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield (value["key"], value["seq"], n, ctx.subtask_index)


class Placement(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Emits where each record was processed: subtask, Spark partition, worker pid."""

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        from pyspark import TaskContext

        tc = TaskContext.get()
        assert tc is not None
        yield (value["key"], ctx.subtask_index, ctx.parallelism, tc.partitionId(), os.getpid())


def write_file(directory: Path, records: Iterable[dict[str, Any]], schema: pa.Schema) -> Path:
    """One parquet file of ``records`` (published by rename: the file source never
    sees a partial file)."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = list(records)
    table = pa.Table.from_pylist(rows, schema=schema)
    name = f"{len(list(directory.glob('*.parquet'))):04d}-{uuid.uuid4().hex[:6]}.parquet"
    tmp = directory.parent / f".{name}.tmp"
    pq.write_table(table, tmp)
    # Spark's file source takes new files in modification-time order: make it strict
    global _last_mtime_ns
    _last_mtime_ns = max(time.time_ns(), _last_mtime_ns + 10_000_000)
    os.utime(tmp, ns=(_last_mtime_ns, _last_mtime_ns))
    os.rename(tmp, directory / name)
    return directory / name


_last_mtime_ns = 0


KEYED = pa.schema([("key", pa.string()), ("seq", pa.int64())])


def keyed_records(start: int, n: int, keys: int) -> list[dict[str, Any]]:
    """``n`` records with sequence numbers from ``start`` over ``keys`` keys."""
    return [{"key": f"k{(s * 7919) % keys}", "seq": s} for s in range(start, start + n)]


class BatchSink:
    """An idempotent sink for ``foreachBatch``: a replayed batch replaces itself."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[Any, ...]]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches[batch_id] = [tuple(r) for r in df.collect()]

    def rows(self) -> list[tuple[Any, ...]]:
        return [r for b in sorted(self.batches) for r in self.batches[b]]


def run(
    spark: Any,
    source: Path,
    schema: str,
    build: Callable[[Any], Any],
    spark_checkpoint: Path,
    sink: BatchSink | None = None,
    files_per_trigger: int = 1,
) -> BatchSink:
    """Run ``build(events)`` over the files in ``source`` until all are processed."""
    sink = sink if sink is not None else BatchSink()
    events = (spark.readStream.schema(schema).option("maxFilesPerTrigger", files_per_trigger)
              .parquet(str(source)))
    query = (build(events).writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(spark_checkpoint))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    finally:
        query.stop()
    weir.spark.finish(query)
    return sink


def stage_metrics(location: Any, uid: str, query: Any) -> list[dict[str, Any]]:
    """The metrics of stage ``uid`` in each retained completed batch of ``query``, as
    its checkpoints record them (``weir.runtime.spark.observed.checkpoint_metrics``)."""
    from weir.checkpoint.epochs import EpochStore
    from weir.checkpoint.storage import CheckpointStorage
    from weir.runtime.spark.observed import checkpoint_metrics

    storage, query_id = CheckpointStorage(str(location)), str(query.id)
    out = []
    for directory in EpochStore.stage_dirs(storage):
        for batch, done in EpochStore.at(storage, directory).completed_checkpoints(query_id):
            values = checkpoint_metrics(done.metadata, uid)
            if values is not None:
                out.append({"batch": batch, **values})
    return out


def observed(query: Any, uid: str) -> list[dict[str, Any]]:
    """The ``weir:<uid>`` observed metrics of each batch in ``query.recentProgress``
    that has them."""
    out = []
    for progress in query.recentProgress:
        row = (progress.observedMetrics or {}).get(f"weir:{uid}")
        if row is not None:
            out.append({"batch": progress.batchId, **row.asDict()})
    return out


def last_counts(rows: Iterable[tuple[Any, ...]]) -> dict[Any, int]:
    """The final count per key from (key, seq, count, ...) rows."""
    out: dict[Any, int] = {}
    for row in rows:
        out[row[0]] = max(out.get(row[0], 0), row[2])
    return out


def by_value() -> None:
    """Workers unpickle the test functions by value (tests/ is not on their path)."""
    from pyspark import cloudpickle

    for name in ("spark_support", "test_spark_runtime", "test_spark_protocol"):
        module = sys.modules.get(name)
        if module is not None:
            cloudpickle.register_pickle_by_value(module)
