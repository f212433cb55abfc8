"""A stage's metrics per batch: recorded in each batch's checkpoint (free), and on
request also in Spark's own query progress (``DataFrame.observe``).

Every task writes what it did into its part of the batch's checkpoint
(``weir.checkpoint.epochs``: ``spark_io``, the subtasks' stats and the late and dead
counts of ``source_positions["spark"]``), so a completed batch's ``_metadata`` holds,
over its subtasks (:func:`checkpoint_metrics`; ``JobClient.metrics()`` reads them):

==================  =============================================================
``records``         input records handed to the stage (heartbeat and clock rows
                    are not records)
``outputs``         rows the stage emitted
``late_records``    records at or behind the watermark (processed, dropped or
                    dead-lettered by ``late_records``)
``dead_letters``    records written to the dead-letter output
``timers_fired``    event- and processing-time timers that fired
``state_entries``   keyed-state entries after the batch, as ``weir.read_state``
                    returns them: one per key of each value, reducing, aggregating
                    and list state, one per (key, user key) of each map state;
                    timers not counted (the checkpoint's ``stats.entries``,
                    ``weir.runtime.checkpointer``). Every subtask runs in a batch
                    with input (each gets a clock row), so the sum is the stage's
                    total
``state_size``      bytes of the checkpoint's state files after the batch
``checkpointed_size`` bytes this batch's checkpoint wrote
``checkpoint_duration_ms`` the slowest subtask's checkpoint (synchronous part and upload)
``restored``        subtasks that restored from storage (not the worker's live copy)
``subtasks``        subtasks that ran with rows
==================  =============================================================

The checkpoint's names are those of the one statistics model
(:mod:`weir.checkpoint.stats`, Flink's): ``state_size`` and ``checkpointed_size`` are
the batch's checkpoint's, summed over its subtasks, as ``JobClient.checkpoints()``,
``weir checkpoint list`` and ``weir ui`` show them.

With ``spark.weir.metrics=true`` the same numbers also go into Spark's progress,
``query.lastProgress["observedMetrics"]["weir:<uid>"]``: each task of the process pass
yields, after its outputs, one extra row whose only non-null column is
``__weir_metrics`` (a map of the numbers above: a null map costs an output row 4 bytes
of Arrow offsets, a null struct of eleven longs 88); the stage observes their sums
(checkpoint time: the slowest subtask) and filters those rows out. That costs every
output row the extra column, Spark's observation and a filter and projection (about
0.4-0.9 µs of CPU per record on ``local[2]``, 5-8 points of the raw limit: bench
README, issue 42), and makes the stage's output columns nullable; off by default.
A subtask with no row in a batch does not run, so an idle batch shows zeros.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from weir.checkpoint.format import CheckpointMetadata, SubtaskStats

__all__ = ["METRICS", "METRIC_NAMES", "checkpoint_metrics", "metrics_batch", "observe",
           "task_metrics", "with_metrics_column", "with_metrics_field"]

METRICS = "__weir_metrics"
#: the summed metrics (counts)
METRIC_NAMES = ("records", "outputs", "late_records", "dead_letters", "timers_fired",
                "state_entries", "state_size", "checkpointed_size", "restored")
_ARROW = pa.map_(pa.string(), pa.float64())


def with_metrics_field(struct: StructType) -> StructType:
    """The process pass's output type: the user's columns, nullable, and the metrics."""
    from pyspark.sql.types import DoubleType, MapType, StringType, StructField, StructType

    return StructType([*(StructField(f.name, f.dataType, True, f.metadata) for f in struct),
                       StructField(METRICS, MapType(StringType(), DoubleType()), True)])


def with_metrics_column(batch: pa.RecordBatch) -> pa.RecordBatch:
    """An output batch with a null metrics column."""
    return pa.RecordBatch.from_arrays(
        [*batch.columns, pa.nulls(batch.num_rows, _ARROW)],
        names=[*batch.schema.names, METRICS])


def task_metrics(counts: dict[str, int], stats: SubtaskStats | None, dead_letters: int,
                 snapshot_ms: float, restored: bool) -> dict[str, float]:
    """What one task did, by the names of the table above (its metrics row): its
    ``counts`` (records, outputs, late, timers fired) and its snapshot's ``stats``
    (none: the batch wrote no checkpoint)."""
    return {
        "records": counts["records"], "outputs": counts["outputs"],
        "late_records": counts["late"], "dead_letters": dead_letters,
        "timers_fired": counts["timers_fired"],
        "state_entries": stats.entries if stats else 0,
        "state_size": stats.bytes if stats else 0,
        "checkpointed_size": stats.new_bytes if stats else 0,
        "checkpoint_duration_ms": snapshot_ms, "restored": int(restored),
    }


def metrics_batch(schema: pa.Schema, values: dict[str, float]) -> pa.RecordBatch:
    """The one metrics row of a task (:func:`task_metrics`): nulls in the user's
    columns of ``schema``."""
    row = [(n, float(values[n])) for n in (*METRIC_NAMES, "checkpoint_duration_ms")]
    return pa.RecordBatch.from_arrays(
        [*(pa.nulls(1, f.type) for f in schema), pa.array([row], _ARROW)],
        names=[*schema.names, METRICS])


def observe(df: DataFrame, uid: str) -> DataFrame:
    """``df`` (the process pass's output) observed as ``weir:<uid>``, without the
    metrics rows and column."""
    from pyspark.sql import functions as F

    metric = F.col(METRICS)
    sums = [F.coalesce(F.sum(metric[n]), F.lit(0)).cast("long").alias(n)
            for n in METRIC_NAMES]
    slowest = F.coalesce(F.max(metric["checkpoint_duration_ms"]), F.lit(0.0)).alias(
        "checkpoint_duration_ms")
    observed = df.observe(f"weir:{uid}", *sums, slowest, F.count(metric).alias("subtasks"))
    return observed.filter(metric.isNull()).drop(METRICS)


#: what a task records in its part for the metrics (``spark_io``), besides its stats
_RECORDED = ("records", "outputs", "timers_fired", "restored", "snapshot_ms")


def checkpoint_metrics(meta: CheckpointMetadata, uid: str) -> dict[str, float] | None:
    """The metrics of the batch whose completed checkpoint ``meta`` is (stage ``uid``),
    by the names of the table above; None for a checkpoint that does not record them
    (written by a weir before they were recorded there, or of another stage)."""
    op = meta.operators.get(uid)
    positions = meta.source_positions
    spark = positions.get("spark")
    io = positions.get("spark_io") or {}
    total, largest = io.get("total") or {}, io.get("max") or {}
    if op is None or spark is None or any(n not in total for n in _RECORDED):
        return None
    subtasks = op.subtasks
    return {
        "records": float(total["records"]),
        "outputs": float(total["outputs"]),
        "late_records": float(spark["late_records"]),
        "dead_letters": float(spark["dead_letters"]),
        "timers_fired": float(total["timers_fired"]),
        "state_entries": float(sum(s.stats.entries for s in subtasks)),
        "state_size": float(sum(s.stats.bytes for s in subtasks)),
        "checkpointed_size": float(sum(s.stats.new_bytes for s in subtasks)),
        "checkpoint_duration_ms": float(largest["snapshot_ms"]),
        "restored": float(total["restored"]),
        "subtasks": float(len(subtasks)),
    }
