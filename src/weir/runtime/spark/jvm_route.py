"""The keyed route in the JVM: Spark's own ``hash`` computes each record's key group,
so the records' columns do not pass through Python before the shuffle.

A key's group is ``weir.state.keyhash.key_hash(key) % max_parallelism``, and the key
hash is Spark's ``hash()`` of the key as a Spark value. So for a keyed input whose
key columns Spark hashes as weir does (:func:`jvm_key_hash`), :func:`jvm_keyed_route`
computes with Spark expressions (a :class:`JvmRoute`):

* ``_weir_order`` — the row's kind (``RECORD``, or ``BAD_KEY``, dead-lettered by the
  process pass as the route pass does, for a null key of one column and for a date or
  timestamp Python cannot hold) in bits 61-62 (``routing.KIND_SHIFT``), below them
  input partition << 33 | row, so a rerun handles the records in
  the same order: ``monotonically_increasing_id()`` for a static input; Spark refuses
  that in a streaming query (and no other built-in expression numbers a partition's
  rows: ``rand`` is reseeded per micro-batch), so there a Java UDF over
  ``spark_partition_id()`` numbers each task's rows in the JVM
  (``weir.runtime.spark.jvm_udfs.row_order``);
* after the first row of each input partition one ``HEARTBEAT`` clock row per
  subtask (an ``explode`` of that row) with the subtask and the batch time in its
  order (``routing.clock_order``), as the route pass ends each partition with them:
  in a batch with any row, every subtask runs, learns its subtask and sees the batch
  time;
* the route — ``route_table(p)[group * p div M]`` for a record, the group being
  ``pmod(hash(key columns), 2**32) % M``; a clock row's subtask's; a bad key's by its
  row — as an *expression* over the key columns and the order, not a column: Spark's
  shuffle partitions by it (``repartition(p, route)``) and no route column crosses the
  shuffle or reaches Python (a column costs the JVM about 0.1 to 0.2 CPU-s per million
  rows). Where these rows are unioned with a route pass's (broadcast rows, say) the
  expression is added as ``_weir_route`` instead.

:func:`jvm_clock_rows` makes the heartbeat's clock rows the same way. The caller
passes the batch time as ``weir.runtime.spark.jvm_udfs.opaque_millis`` gives it, so
this stage's generated code is the same in every micro-batch.

=============================  ==================================================
key column type                hashed as
=============================  ==================================================
string (UTF8_BINARY)           itself (Spark: its UTF-8)
byte, short, int, long         cast to long
boolean, binary, double,       themselves
date, timestamp, timestamp_ntz
float                          cast to double (a float key is its double value)
array of the above (but date   cast element-wise as above; Spark folds the elements
and timestamps)                as weir folds a tuple
=============================  ==================================================

Any other key type (decimal, struct, char/varchar, a collated string, arrays of dates
or timestamps) takes the Python route pass. The process pass computes each key's group
again from the key (in C for str and int keys) and a key outside its subtask's groups
fails the batch (``KeyGroupError``), so the JVM and Python can never disagree silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegralType,
    LongType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from weir.runtime.spark.jvm_udfs import row_order
from weir.runtime.spark.routing import (
    CLOCK_SHIFT,
    KIND_SHIFT,
    ORDER,
    ORDER_LIMIT,
    RowKind,
    clock_order,
    packed_order,
    route_table,
)

__all__ = ["JvmRoute", "clock_route", "jvm_clock_rows", "jvm_key_hash", "jvm_keyed_route"]

_ROW_MASK = (1 << 33) - 1  # monotonically_increasing_id: partition << 33 | row
_FAN = "_weir_fan"
_SUBTASK_MASK = (1 << (KIND_SHIFT - CLOCK_SHIFT)) - 1  # a clock row's subtask bits
#: Python's datetime range (years 1 to 9999): keys outside it are bad keys
_DATE_RANGE = ("date'0001-01-01'", "date'9999-12-31'")
_NTZ_RANGE = ("timestamp_ntz'0001-01-01 00:00:00'", "timestamp_ntz'9999-12-31 23:59:59.999999'")
_TS_RANGE = ("timestamp'0001-01-01 00:00:00Z'", "timestamp'9999-12-31 23:59:59.999999Z'")


def _hash_type(dtype: DataType, in_array: bool) -> DataType | None:
    """The type a key column (or array element) of ``dtype`` is hashed as, or None if
    Spark's hash of it is not weir's key hash."""
    if type(dtype) is StringType:
        return dtype if dtype.collation == "UTF8_BINARY" else None
    if isinstance(dtype, IntegralType):
        return LongType()
    if isinstance(dtype, FloatType | DoubleType):
        return DoubleType()
    if isinstance(dtype, BooleanType | BinaryType):
        return dtype
    if isinstance(dtype, DateType | TimestampType | TimestampNTZType):
        return None if in_array else dtype  # (their range check is per column)
    if isinstance(dtype, ArrayType):
        element = _hash_type(dtype.elementType, True)
        return None if element is None else ArrayType(element, dtype.containsNull)
    return None


def _out_of_range(column: Column, dtype: DataType) -> Column | None:
    """True where a date or timestamp key value is outside Python's datetime range."""
    bounds = (_DATE_RANGE if isinstance(dtype, DateType) else _NTZ_RANGE if isinstance(
        dtype, TimestampNTZType) else _TS_RANGE if isinstance(dtype, TimestampType) else None)
    if bounds is None:
        return None
    return (column < F.expr(bounds[0])) | (column > F.expr(bounds[1]))


def jvm_key_hash(schema: StructType, key_columns: Sequence[str]) -> Column | None:
    """Spark's ``hash`` of the key columns cast as weir's key hash takes them (a signed
    int), or None if some key column needs the Python route pass."""
    casts = []
    for name in key_columns:
        dtype = schema[name].dataType
        as_type = _hash_type(dtype, False)
        if as_type is None:
            return None
        column = F.col(f"`{name}`")
        casts.append(column if as_type == dtype else column.cast(as_type))
    return F.hash(*casts)


def _bad_key(schema: StructType, key_columns: Sequence[str]) -> Column:
    """True where the key cannot be computed (as ``keys_of`` and the route pass decide)."""
    bad = F.lit(False)
    if len(key_columns) == 1:
        bad = F.col(f"`{key_columns[0]}`").isNull()
    for name in key_columns:
        outside = _out_of_range(F.col(f"`{name}`"), schema[name].dataType)
        if outside is not None:
            bad = bad | F.coalesce(outside, F.lit(False))
    return bad


@dataclass(frozen=True)
class JvmRoute:
    """A keyed input routed in the JVM: ``rows``, its columns with ``_weir_order`` and
    the clock rows, and ``route``, each row's route value as an expression over the
    key columns and the order. Partition by it (``repartition(p, route)``), or add it
    as ``_weir_route`` where the rows are unioned with route passes' rows."""

    rows: DataFrame
    route: Column


def _route_table(parallelism: int) -> Column:
    return F.array(*[F.lit(v) for v in route_table(parallelism)])


def clock_route(parallelism: int) -> Column:
    """The route value of a clock row: its subtask's, read from its order."""
    subtask = F.shiftright(F.col(ORDER), CLOCK_SHIFT).bitwiseAND(F.lit(_SUBTASK_MASK))
    return F.element_at(_route_table(parallelism), (subtask + 1).cast("int"))


def _clock_order(subtask: Column, now: Column) -> Column:
    """``routing.clock_order`` as an expression."""
    return F.lit(clock_order(0, 0)) + F.shiftleft(subtask.cast("bigint"), CLOCK_SHIFT) + now


def jvm_clock_rows(beat: DataFrame, parallelism: int, now: Column) -> DataFrame:
    """One clock row (``_weir_order`` only) per subtask for each row of ``beat``."""
    fan = F.explode(F.sequence(F.lit(0), F.lit(parallelism - 1))).alias(_FAN)
    return beat.select(fan).select(
        _clock_order(F.col(_FAN), now).cast("bigint").alias(ORDER))


def jvm_keyed_route(
    events: DataFrame, key_columns: Sequence[str], max_parallelism: int, parallelism: int,
    now: Column,
) -> JvmRoute | None:
    """``events`` with the order column and clock rows (the batch time ``now``) and
    the route expression, computed in the JVM (the order of a stream's rows by a Java
    UDF); None if a key column needs the Python route pass (:func:`jvm_key_hash`)."""
    hashed = jvm_key_hash(events.schema, key_columns)
    if hashed is None:
        return None
    m, p = max_parallelism, parallelism
    table = _route_table(p)
    group = F.pmod(hashed.cast("bigint"), F.lit(1 << 32)) % F.lit(m)
    subtask = F.floor(group * F.lit(p) / F.lit(m)).cast("int")  # exact: group * p < 2**30
    bad = _bad_key(events.schema, key_columns)
    order = F.col(ORDER)
    staged = events.select("*", (row_order(events.sparkSession, F.spark_partition_id())
                                 if events.isStreaming
                                 else F.monotonically_increasing_id()).alias(ORDER))
    first = order.bitwiseAND(F.lit(_ROW_MASK)) == 0  # an input partition's first row
    fanned = staged.select("*", F.explode(
        F.when(first, F.sequence(F.lit(-1), F.lit(p - 1))).otherwise(F.array(F.lit(-1)))
    ).alias(_FAN))
    fan = F.col(_FAN)
    kind = F.when(bad, F.lit(packed_order(RowKind.BAD_KEY, 0)))
    record_order = (F.when(order >= F.lit(ORDER_LIMIT), F.raise_error(F.concat(
        F.lit("weir: an input partition's row order "), order.cast("string"),
        F.lit(" is too large for weir's route: coalesce the input first"))))
        .otherwise(kind.otherwise(F.lit(packed_order(RowKind.RECORD, 0))) + order))
    rows = fanned.select(
        *[F.col(f"`{c}`") for c in events.columns],
        F.when(fan < 0, record_order).otherwise(_clock_order(fan, now))
        .cast("bigint").alias(ORDER),
    )
    # the route from the order's kind: a clock row's subtask; a bad key to some subtask
    # (to be dead-lettered there, by its row); a record to the owner of its key group
    row_kind = F.shiftright(order, KIND_SHIFT)
    route = (F.when(row_kind == F.lit(int(RowKind.HEARTBEAT)), clock_route(p))
             .when(row_kind == F.lit(int(RowKind.BAD_KEY)), F.element_at(
                 table, (F.pmod(order.bitwiseAND(F.lit(ORDER_LIMIT - 1)), F.lit(p)) + 1)
                 .cast("int")))
             .otherwise(F.element_at(table, subtask + 1)))
    return JvmRoute(rows, route.cast("int"))
