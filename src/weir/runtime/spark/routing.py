"""Routing records so that Spark partition ``i`` holds exactly subtask ``i``'s key groups.

``repartition(p, col)`` places a row in partition ``pmod(murmur3_32(col, seed=42), p)``
(Spark's ``HashPartitioning``), which is not ``col`` itself. So each record carries a
*route value*: for subtask ``i`` the smallest non-negative int ``v`` with
``pmod(murmur3_32(v), p) == i`` (:func:`route_table`, computed with Spark's
``hashInt``, seed 42, as ``weir.state.keyhash`` has it). Hash partitioning of
that column (or the same value as an expression: the JVM route) is then the identity
on subtasks, on every executor layout, for every batch; the process pass checks it:
every record's key group (``KeyGroupError``), one subtask in its clock rows
(``TaskPlacementError``).

Keyed inputs whose key columns Spark hashes as weir does are routed in the JVM
(``weir.runtime.spark.jvm_route``, the same columns and clock rows); other inputs,
broadcast rows and the heartbeat take a route pass here.

The route pass (a ``mapInArrow`` on each input) takes the input's columns and
``_weir_now`` (the batch timestamp, ms), drops ``_weir_now`` and adds the internal
columns:

* ``_weir_route`` (int) — the route value of the owning subtask;
* ``_weir_order`` (bigint) — what the row is (:class:`RowKind`) in bits 61-62, below
  them input partition id << 40 | row index: the process pass handles rows in this
  order (a stable sort), so a replayed batch sees its records in the same order
  (Spark's shuffle interleaves map outputs in arrival order). In ``HEARTBEAT`` (clock)
  rows: the subtask they are for << 45 | the batch timestamp (:func:`clock_order`).
  The kind travels in the order, not in a column of its own: each column Spark
  shuffles and hands to Python costs the JVM about 0.1 CPU-s per million rows.
  :func:`unpack_kinds` gives the process pass both as columns again.

The JVM route shuffles no route column at all: Spark partitions its rows by the route
*expression* over the key columns and the order (``jvm_route.JvmRoute``). So the
process pass never reads a route: it learns its subtask, and the batch time, from its
clock rows (:func:`clock_of`), and its key-group check (``KeyGroupError``) catches
any record routed elsewhere.

Keyed records go to the owner of their key group (weir's key groups: the key hash of
``weir.state.keyhash``, the same function on every runtime); keys are read from the key
columns by :func:`weir.runtime.spark.keys.keys_of`, as in the process pass. A record
whose key cannot be computed (null, or a value Python cannot hold) goes to some
subtask as ``BAD_KEY`` to be dead-lettered there. Broadcast rows are copied to every
subtask. Each input partition with rows (and the heartbeat stream's) ends with a
*clock row* (``HEARTBEAT``, the batch timestamp in ``_weir_order``) to every subtask:
in a batch with any row, every subtask runs and learns which subtask it is and the
batch time. The batch time is a constant of the batch: it travels in p rows per input
partition, not in a column of every row (a column costs every row of the shuffle).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from weir.errors import ConfigurationError
from weir.runtime.spark.keys import keys_of
from weir.state._hashcore import int64_range, route_keys, spark_hash_int
from weir.state.keygroups import assign_to_key_group
from weir.state.keyhash import KEY_HASH_SEED

__all__ = [
    "RowKind",
    "clock_of",
    "clock_order",
    "broadcast_pass",
    "keyed_route_pass",
    "round_robin_pass",
    "route_table",
    "subtask_of_route",
    "unpack_kinds",
]

ROUTE, KIND, ORDER, NOW, KEY = "_weir_route", "_weir_kind", "_weir_order", "_weir_now", "_weir_key"
BROADCAST_PREFIX = "_weir_b_"


class RowKind(enum.IntEnum):
    """What a routed row is (the process pass handles kinds in this order)."""

    BROADCAST = 0
    RECORD = 1
    BAD_KEY = 2
    HEARTBEAT = 3


#: a routed row's kind is ``_weir_order >> KIND_SHIFT``
KIND_SHIFT = 61
#: the orders below the kind: a row's order (and a batch time) is less than this
ORDER_LIMIT = 1 << KIND_SHIFT
#: input partitions the route pass numbers rows of (``partition << 40 | row``)
MAX_PARTITIONS = ORDER_LIMIT >> 40
#: a clock row's order: the subtask it is for << CLOCK_SHIFT | the batch time (ms; below
#: 2**45 until the year 3084)
CLOCK_SHIFT = 45
_CLOCK_TIME = (1 << CLOCK_SHIFT) - 1


def packed_order(kind: RowKind, order: int) -> int:
    """``_weir_order`` of a row of ``kind`` with ``order``."""
    return int(kind) << KIND_SHIFT | order


def clock_order(subtask: int, now: int) -> int:
    """``_weir_order`` of the clock row for ``subtask`` in a batch of time ``now``."""
    return packed_order(RowKind.HEARTBEAT, subtask << CLOCK_SHIFT | now)


def unpack_kinds(table: pa.Table) -> pa.Table:
    """Routed rows with ``_weir_kind`` (int8) and ``_weir_order`` unpacked from the
    packed ``_weir_order``."""
    packed = table[ORDER]
    table = table.set_column(table.schema.get_field_index(ORDER), ORDER,
                             pc.bit_wise_and(packed, ORDER_LIMIT - 1))
    return table.append_column(KIND, pc.shift_right(packed, KIND_SHIFT).cast(pa.int8()))


def _spark_hash_int(value: int) -> int:
    """Spark's ``Murmur3Hash`` of an ``IntegerType`` value (seed 42)."""
    unsigned = spark_hash_int(value, KEY_HASH_SEED)
    return unsigned - (1 << 32) if unsigned >= 1 << 31 else unsigned


@functools.lru_cache(maxsize=64)
def route_table(parallelism: int) -> tuple[int, ...]:
    """``table[i]``: an int that Spark's hash partitioning into ``parallelism``
    partitions sends to partition ``i``."""
    found: dict[int, int] = {}
    value = 0
    while len(found) < parallelism:
        found.setdefault(_spark_hash_int(value) % parallelism, value)
        value += 1
    return tuple(found[i] for i in range(parallelism))


@functools.lru_cache(maxsize=64)
def subtask_of_route(parallelism: int) -> dict[int, int]:
    """The inverse of :func:`route_table`."""
    return {v: i for i, v in enumerate(route_table(parallelism))}


def _partition_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    pid = ctx.partitionId() if ctx is not None else 0
    if pid >= MAX_PARTITIONS:
        raise ConfigurationError(
            f"weir's route pass numbers the rows of at most {MAX_PARTITIONS:,} input "
            f"partitions, and this input has partition {pid}: coalesce the input first"
        )
    return pid


def _without_now(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, int]:
    """``batch`` without its ``_weir_now`` column, and that column's (constant) value
    (0 for a batch without rows)."""
    i = batch.schema.get_field_index(NOW)
    now = int(batch.column(i)[0].as_py()) if batch.num_rows else 0
    return batch.remove_column(i), now


def _with_internal(
    batch: pa.RecordBatch, routes: Sequence[int], kind: RowKind, first: int
) -> pa.RecordBatch:
    """``batch`` with the internal columns of rows of one ``kind``, ordered from
    ``first`` on."""
    n = batch.num_rows
    return _with_arrays(batch, pa.array(routes, pa.int32()),
                        _column(pa.int64(), n, int64_range(packed_order(kind, first), n)))


def _with_arrays(batch: pa.RecordBatch, routes: pa.Array, orders: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([*batch.columns, routes, orders],
                                      names=[*batch.schema.names, ROUTE, ORDER])


def _column(kind: pa.DataType, n: int, data: bytearray) -> pa.Array:
    """An Arrow array of ``n`` values of fixed-width ``kind`` over native-order bytes."""
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(data)])


def keyed_route_pass(
    key_columns: Sequence[str], max_parallelism: int, parallelism: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The route pass of a keyed input."""
    table = route_table(parallelism)
    key_columns = tuple(key_columns)

    def route(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        base = _partition_id() << 40
        row = 0
        clock = _Clock(table)
        for batch in batches:
            batch, now = _without_now(batch)
            clock.saw(batch, now)
            n = batch.num_rows
            keys = keys_of(batch, key_columns)
            # str and int keys in C (the same bytes and hash); the rest here
            data, slow = route_keys(keys, max_parallelism, parallelism, table)
            routes = memoryview(data).cast("i")
            orders = int64_range(packed_order(RowKind.RECORD, base + row), n)
            packed = memoryview(orders).cast("q")
            for j in slow:
                try:
                    key = keys[j]
                    if key is None:
                        raise ValueError("null key")
                    group = assign_to_key_group(key, max_parallelism)
                    routes[j] = table[group * parallelism // max_parallelism]
                except Exception:
                    routes[j] = table[(row + j) % parallelism]
                    packed[j] = packed_order(RowKind.BAD_KEY, base + row + j)
            yield _with_arrays(batch, _column(pa.int32(), n, data), _column(pa.int64(), n, orders))
            row += n
        yield from clock.rows()

    return route


def round_robin_pass(
    parallelism: int,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The route pass of a non-keyed input: rows spread evenly (deterministically)."""
    table = route_table(parallelism)

    def route(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pid = _partition_id()
        base = pid << 40
        row = 0
        clock = _Clock(table)
        for batch in batches:
            batch, now = _without_now(batch)
            clock.saw(batch, now)
            n = batch.num_rows
            routes = [table[(pid + row + j) % parallelism] for j in range(n)]
            yield _with_internal(batch, routes, RowKind.RECORD, base + row)
            row += n
        yield from clock.rows()

    return route


class _Clock:
    """The clock rows of one input partition: after its rows, one ``HEARTBEAT`` row
    per subtask (a copy of its first row, the batch timestamp as its order). So in a
    batch with any row, every subtask gets at least one row: it runs, knows its
    subtask and sees the batch time."""

    def __init__(self, table: Sequence[int]) -> None:
        self.table = table
        self.template: pa.RecordBatch | None = None
        self.now = 0

    def saw(self, batch: pa.RecordBatch, now: int) -> None:
        if batch.num_rows and self.template is None:
            self.template, self.now = batch.slice(0, 1), now

    def rows(self) -> Iterator[pa.RecordBatch]:
        if self.template is None:
            return
        k = len(self.table)
        yield _with_arrays(self.template.take([0] * k), pa.array(self.table, pa.int32()),
                           pa.array([clock_order(i, self.now) for i in range(k)], pa.int64()))


def clock_of(table: pa.Table) -> tuple[int, list[int]] | None:
    """``(batch time in ms, the subtasks named)`` by the clock rows among a task's
    routed rows (kinds unpacked), or None if it got none. A task of a correctly
    partitioned stage sees one subtask."""
    clocks = pc.filter(table[ORDER], pc.equal(table[KIND], int(RowKind.HEARTBEAT)))
    if not len(clocks):
        return None
    now = pc.max(pc.bit_wise_and(clocks, _CLOCK_TIME)).as_py()
    subtasks = pc.unique(pc.shift_right(clocks, CLOCK_SHIFT)).to_pylist()
    return int(now), sorted(subtasks)


def broadcast_pass(
    parallelism: int,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The route pass of broadcast rows: every row to every subtask, then clock rows."""
    table = route_table(parallelism)

    def route(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        base = _partition_id() << 40
        row = 0
        clock = _Clock(table)
        for batch in batches:
            batch, now = _without_now(batch)
            clock.saw(batch, now)
            n = batch.num_rows
            if not n:
                continue
            for value in table:
                yield _with_internal(batch, [value] * n, RowKind.BROADCAST, base + row)
            row += n
        yield from clock.rows()

    return route
