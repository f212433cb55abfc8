"""Keys Spark users have: date, timestamp (any session time zone), timestamp_ntz,
decimal, binary, struct, array and mixed multi-column keys run keyed state on Spark
with no dead letters, in the key groups the local harness computes for the same
Python values; types that cannot be keys are refused before the query starts."""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import re
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    CalendarIntervalType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    IntegerType,
    MapType,
    NullType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VariantType,
    YearMonthIntervalType,
)

import weir
import weir.spark
from spark_support import by_value, run, write_file  # type: ignore[import-not-found]
from weir.errors import ConfigurationError
from weir.runtime.spark import keys as spark_keys
from weir.runtime.spark.keys import UNCONVERTIBLE, check_key_types, keys_of
from weir.runtime.spark.routing import (
    KEY,
    KIND,
    NOW,
    ORDER,
    ORDER_LIMIT,
    RowKind,
    clock_of,
    clock_order,
    keyed_route_pass,
    packed_order,
    route_table,
    unpack_kinds,
)
from weir.state.keygroups import assign_key_to_parallel_operator, canonical_key_bytes
from weir.testing import KeyedOperatorHarness

M, P = 128, 2
UTC = dt.UTC


@pytest.fixture(autouse=True)
def _pickle_by_value() -> None:
    import sys

    from pyspark import cloudpickle

    by_value()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------ keys_of (no Spark)


def test_keys_of_gives_the_same_instant_whatever_the_time_zone_of_the_column() -> None:
    micros = [0, 1_700_000_000_123_456, -86_400_000_000]
    want = [dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=m) for m in micros]
    for tz in ("UTC", "America/Los_Angeles", "Asia/Kolkata", "+05:30", "GMT+05:00", "Z"):
        batch = pa.record_batch([pa.array(micros, pa.timestamp("us", tz=tz))], names=["ts"])
        keys = keys_of(batch, ["ts"])
        assert keys == want
        assert all(k.tzinfo is UTC for k in keys)
        assert [canonical_key_bytes(k) for k in keys] == [canonical_key_bytes(w) for w in want]


def test_keys_of_turns_arrays_into_tuples_at_any_depth_and_keeps_structs_as_dicts() -> None:
    kind = pa.struct([("id", pa.int32()), ("tags", pa.list_(pa.string())),
                      ("at", pa.timestamp("us", tz="Asia/Tokyo"))])
    column = pa.chunked_array([
        pa.array([{"id": 1, "tags": ["a", "b"], "at": 0}], kind),
        pa.array([{"id": 2, "tags": [], "at": None}, None], kind),
    ])
    table = pa.table({"s": column, "l": pa.array([[[1], [2, 3]], [], None],
                                                 pa.list_(pa.list_(pa.int64())))})
    assert keys_of(table, ["s"]) == [
        {"id": 1, "tags": ("a", "b"), "at": dt.datetime(1970, 1, 1, tzinfo=UTC)},
        {"id": 2, "tags": (), "at": None},
        None,
    ]
    assert keys_of(table, ["l"]) == [((1,), (2, 3)), (), None]
    assert keys_of(table, ["l", "s"])[1] == ((), {"id": 2, "tags": (), "at": None})


def test_keys_of_reuses_the_records_values_only_where_they_are_the_keys() -> None:
    # the process pass passes the columns it converted for the records: a string
    # column's values are its keys as they are (the same list, not a second
    # conversion); an array's records are lists, its keys tuples; a timestamp's
    # records are in the column's zone, its keys in UTC
    table = pa.table({
        "k": ["a", "b"], "l": pa.array([[1], [2, 3]]),
        "ts": pa.array([0, 1], pa.timestamp("us", tz="Asia/Tokyo")),
    })
    converted = {name: table.column(name).to_pylist() for name in table.column_names}
    assert keys_of(table, ["k"], converted) is converted["k"]
    assert keys_of(table, ["l"], converted) == [(1,), (2, 3)]
    assert keys_of(table, ["ts"], converted)[0].tzinfo is UTC
    assert keys_of(table, ["k", "l"], converted) == [("a", (1,)), ("b", (2, 3))]


def test_keys_of_keeps_dates_decimals_binary_and_naive_timestamps() -> None:
    batch = pa.record_batch(
        [pa.array([dt.date(2024, 2, 29)]), pa.array([Decimal("1.50")], pa.decimal128(10, 2)),
         pa.array([b"\x00\xff"]), pa.array([dt.datetime(2024, 1, 1, 12)], pa.timestamp("us"))],
        names=["d", "dec", "b", "ntz"])
    assert keys_of(batch, ["d", "dec", "b", "ntz"]) == [
        (dt.date(2024, 2, 29), Decimal("1.50"), b"\x00\xff", dt.datetime(2024, 1, 1, 12))]


def test_a_value_python_cannot_hold_is_a_bad_key_of_its_own_row_only() -> None:
    too_late = 2**62  # microseconds: year ~146,000
    batch = pa.record_batch([pa.array([0, too_late, 5], pa.timestamp("us", tz="UTC")),
                             pa.array([1, 2, 3], pa.int64())], names=["ts", "seq"])
    keys = keys_of(batch, ["ts"])
    assert keys[1] is UNCONVERTIBLE and keys[0] == dt.datetime(1970, 1, 1, tzinfo=UTC)
    routed = _unpacked(iter([next(keyed_route_pass(["ts"], M, P)(iter([_at(batch, 5)])))]))
    kinds = routed.column(KIND).to_pylist()
    assert kinds == [RowKind.RECORD, RowKind.BAD_KEY, RowKind.RECORD]


def test_the_route_pass_puts_every_new_key_type_with_its_owner() -> None:
    batch = pa.record_batch(
        [pa.array([dt.date(2024, 1, d) for d in range(1, 21)]),
         pa.array([[d, d + 1] for d in range(20)], pa.list_(pa.int32()))], names=["d", "a"])
    routed = _unpacked(iter([next(keyed_route_pass(["d", "a"], M, P)(iter([_at(batch, 5)])))]))
    want = [route_table(P)[assign_key_to_parallel_operator((dt.date(2024, 1, d), [d - 1, d]),
                                                          M, P)] for d in range(1, 21)]
    assert routed.column("_weir_route").to_pylist() == want
    assert set(routed.column(KIND).to_pylist()) == {RowKind.RECORD}


def test_a_rows_kind_travels_in_its_order_and_unpacks_as_it_was() -> None:
    """One internal column fewer through the shuffle: the kind rides in the order's top
    bits, every order the route gives (up to ``ORDER_LIMIT - 1``) keeps its value."""
    rows = [(kind, order) for kind in RowKind for order in (0, 1, 1234, ORDER_LIMIT - 1)]
    packed = pa.table({ORDER: pa.array([packed_order(k, o) for k, o in rows], pa.int64())})
    got = unpack_kinds(packed)
    assert list(zip(got[KIND].to_pylist(), got[ORDER].to_pylist(), strict=True)) == rows
    assert min(packed[ORDER].to_pylist()) >= 0  # the sign bit stays clear


def _unpacked(batches: Iterator[pa.RecordBatch]) -> pa.Table:
    """The route pass's output with kind and order unpacked, as the process pass reads
    them."""
    return unpack_kinds(pa.Table.from_batches(list(batches)))


def _at(batch: pa.RecordBatch, now: int) -> pa.RecordBatch:
    """``batch`` as the route pass gets it: with the batch timestamp column."""
    return batch.append_column(NOW, pa.array([now] * batch.num_rows, pa.int64()))


def test_every_subtask_gets_the_batch_time_in_a_clock_row_and_no_row_carries_it() -> None:
    # 3 keys, all owned by one subtask of 4: the others get only the clock rows
    key = "k"
    owner = assign_key_to_parallel_operator(key, M, 4)
    batch = pa.record_batch([pa.array([key] * 3), pa.array([1, 2, 3])], names=["k", "v"])
    out = _unpacked(keyed_route_pass(["k"], M, 4)(
        iter([_at(batch.slice(0, 2), 1234), _at(batch.slice(2), 1234)])))
    assert NOW not in out.column_names
    table = route_table(4)
    by_route = {r: out.filter(pc.equal(out["_weir_route"], r)) for r in table}
    for subtask, route in enumerate(table):
        rows = by_route[route]
        kinds = rows.column(KIND).to_pylist()
        assert kinds == ([RowKind.RECORD] * 3 if subtask == owner else []) + [RowKind.HEARTBEAT]
        assert clock_of(rows) == (1234, [subtask])  # the batch time, and which subtask
    # the records keep their input order across batches
    mine = by_route[table[owner]]
    assert mine.column("v").to_pylist()[:3] == [1, 2, 3]
    assert mine.column("_weir_order").to_pylist()[:3] == [0, 1, 2]
    assert clock_of(mine.slice(0, 3)) is None  # no clock row: no batch time
    both = pa.concat_tables([by_route[table[0]], by_route[table[1]]])
    assert clock_of(both) == (1234, [0, 1])  # (the process pass refuses that)
    # an input partition with no row sends nothing, not even a clock row
    empty = keyed_route_pass(["k"], M, 4)(iter([_at(batch.slice(0, 0), 1)]))
    assert sum(b.num_rows for b in empty) == 0


# ------------------------------------------------------------------ check_key_types


def _schema(**fields: Any) -> StructType:
    return StructType([StructField(name, kind) for name, kind in fields.items()])


def test_supported_key_types_pass_the_check() -> None:
    nested = StructType([StructField("a", ArrayType(DecimalType(10, 2))),
                         StructField("b", StructType([StructField("t", TimestampType())])),
                         StructField("n", NullType())])
    schema = _schema(d=DateType(), ts=TimestampType(), ntz=TimestampNTZType(),
                     dec=DecimalType(38, 18), b=BinaryType(), s=nested,
                     a=ArrayType(ArrayType(StringType())), i=IntegerType())
    check_key_types(schema, list(schema.fieldNames()), "op")
    check_key_types(_schema(**{KEY: nested}), [KEY], "op")
    assert spark_keys.KEY_COLUMN == KEY


@pytest.mark.parametrize(("kind", "named", "advice"), [
    (MapType(StringType(), IntegerType()), "map<string,int>", "map_entries"),
    (ArrayType(MapType(StringType(), IntegerType())), "map<string,int>", "map_entries"),
    (DayTimeIntervalType(), "interval day to second", "cast"),
    (YearMonthIntervalType(), "interval year to month", "cast"),
    (CalendarIntervalType(), "interval", "cast"),
    (VariantType(), "variant", "to_json"),
    (NullType(), "void", "null in every row"),
    (StructType([StructField("x", IntegerType()), StructField("x", StringType())]),
     "struct<x:int,x:string>", "duplicate field names ['x']"),
])
def test_key_types_that_cannot_be_keys_are_refused_naming_operator_column_type_and_fix(
    kind: Any, named: str, advice: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        check_key_types(_schema(ok=StringType(), bad=kind), ["ok", "bad"], "my-op")
    message = str(info.value)
    assert "'my-op'" in message and "'bad'" in message
    assert named in message and advice in message


def test_a_refused_key_by_expression_is_named_as_such() -> None:
    with pytest.raises(ConfigurationError, match=r"the key_by expression .*map<string,int>"):
        check_key_types(_schema(**{KEY: MapType(StringType(), IntegerType())}), [KEY], "op")
    with pytest.raises(ConfigurationError, match="'nope' is not in"):
        check_key_types(_schema(a=IntegerType()), ["nope"], "op")


# ------------------------------------------------------------------ on Spark

SCHEMA = ("seq long, d date, ts timestamp, ntz timestamp_ntz, dec decimal(10,2), "
          "bin binary, st struct<id:int,region:string>, arr array<int>")
ARROW = pa.schema([
    ("seq", pa.int64()), ("d", pa.date32()), ("ts", pa.timestamp("us", tz="UTC")),
    ("ntz", pa.timestamp("us")), ("dec", pa.decimal128(10, 2)), ("bin", pa.binary()),
    ("st", pa.struct([("id", pa.int32()), ("region", pa.string())])),
    ("arr", pa.list_(pa.int32())),
])
OUT = "kind string, seq long, n long, subtask int, grp int"
COUNT = weir.ValueStateDescriptor[int]("count")


def _records(start: int, n: int) -> list[dict[str, Any]]:
    out = []
    for seq in range(start, start + n):
        k = (seq * 7) % 11
        out.append({
            "seq": seq,
            "d": dt.date(2024, 3, 9) + dt.timedelta(days=k),
            # around the US DST change (2024-03-10 10:00Z): instants an hour apart
            "ts": dt.datetime(2024, 3, 10, 9, 30, tzinfo=UTC) + dt.timedelta(hours=k),
            "ntz": dt.datetime(2024, 3, 10, 2, 30) + dt.timedelta(minutes=30 * k),
            "dec": Decimal(k * 125 - 250).scaleb(-2).quantize(Decimal("0.01")),
            "bin": bytes([k, 255 - k]) * k,
            "st": {"id": k % 3, "region": ["eu", "us"][k % 2]},
            "arr": list(range(k)),
        })
    return out


#: kind -> (key_by, the Python key of a record as the local harness keys it); a None
#: key_by is the Column expression F.struct("d", "arr", "ts")
STAGES: dict[str, tuple[Any, Any]] = {
    "date": ("d", lambda r: r["d"]),
    "timestamp": ("ts", lambda r: r["ts"]),
    "timestamp_ntz": ("ntz", lambda r: r["ntz"]),
    "decimal": ("dec", lambda r: r["dec"]),
    "binary": ("bin", lambda r: r["bin"]),
    "struct": ("st", lambda r: r["st"]),
    "array": ("arr", lambda r: r["arr"]),
    "multi": (["d", "ts", "dec", "st", "arr", "ntz"],
              lambda r: (r["d"], r["ts"], r["dec"], r["st"], r["arr"], r["ntz"])),
    "expression": (None, lambda r: {"d": r["d"], "arr": r["arr"], "ts": r["ts"]}),
}


class KindCount(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Running count per key; emits (kind, seq, count, subtask, key group of the key)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        from weir.state.keygroups import assign_to_key_group

        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield (self.kind, value["seq"], n, ctx.subtask_index,
               assign_to_key_group(ctx.current_key, M))


def _expected(records: list[dict[str, Any]], kind: str) -> dict[int, tuple[int, int, int]]:
    """seq -> (running count, subtask, key group) from the local harness: each record
    goes through a KeyedOperatorHarness of its subtask, keyed by its Python value."""
    key_of = STAGES[kind][1]
    out: dict[int, tuple[int, int, int]] = {}
    with contextlib.ExitStack() as stack:
        harnesses = [stack.enter_context(KeyedOperatorHarness(
            KindCount(kind), key_of, max_parallelism=M, parallelism=P, subtask_index=i))
            for i in range(P)]
        for record in records:
            subtask = assign_key_to_parallel_operator(key_of(record), M, P)
            for row in harnesses[subtask].process_element(record):
                assert row[3] == subtask
                out[row[1]] = (row[2], subtask, row[4])
    return out


def _process(events: Any, kind: str, location: str) -> Any:
    from pyspark.sql import functions as F

    key_by = STAGES[kind][0]
    return weir.spark.process(
        events,
        key_by=F.struct("d", "arr", "ts") if key_by is None else key_by,
        function=KindCount(kind),
        output_schema=OUT,
        uid=kind,
        config=weir.JobConfig(location, max_parallelism=M),
        parallelism=P,
        heartbeat=False,
    )


@contextlib.contextmanager
def _session_time_zone(spark: Any, zone: str) -> Iterator[None]:
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        yield
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["multi", "expression"])
def test_streaming_keys_of_every_type_count_exactly_with_no_dead_letters(
    spark: Any, tmp_path: Path, kind: str
) -> None:
    """Two batches in a non-UTC session time zone (across a DST change): the counts and
    key groups are the harness's, nothing is dead-lettered, and the state Spark wrote
    reads back through a savepoint under the same keys."""
    records = _records(0, 60)
    for start in range(0, 60, 30):
        write_file(tmp_path / "in", records[start:start + 30], ARROW)
    location = str(tmp_path / "weir")
    with _session_time_zone(spark, "America/Los_Angeles"):
        sink = run(spark, tmp_path / "in", SCHEMA, lambda ev: _process(ev, kind, location),
                   tmp_path / "spark")
    assert len(sink.batches) == 2
    assert weir.spark.read_dead_letters(location) == []
    got = {seq: (n, subtask, grp) for k, seq, n, subtask, grp in sink.rows() if k == kind}
    assert got == _expected(records, kind)
    _check_savepoint(tmp_path, kind, records)


@pytest.mark.spark
def test_each_key_type_alone_counts_in_the_harness_key_groups(
    spark: Any, tmp_path: Path
) -> None:
    """One column of each type as the whole key (a static DataFrame: one Spark job per
    stage), in another non-UTC session time zone: every record is processed (none is a
    bad key) in its harness key group."""
    records = _records(0, 40)
    write_file(tmp_path / "in", records, ARROW)
    with _session_time_zone(spark, "Asia/Kolkata"):
        events = spark.read.schema(SCHEMA).parquet(str(tmp_path / "in"))
        for kind in ("date", "timestamp", "timestamp_ntz", "decimal", "binary", "struct",
                     "array"):
            rows = _process(events, kind, str(tmp_path / kind)).collect()
            got = {r.seq: (r.n, r.subtask, r.grp) for r in rows}
            assert len(rows) == len(records) and got == _expected(records, kind), kind


def _check_savepoint(tmp_path: Path, kind: str, records: list[dict[str, Any]]) -> None:
    """The state Spark wrote, read back through a savepoint and the harness: every key
    decodes to a value of the same key, with the oracle's count."""
    key_of = STAGES[kind][1]
    oracle = Counter(canonical_key_bytes(key_of(r)) for r in records)
    target = tmp_path / "savepoint"
    weir.spark.savepoint(str(tmp_path / "weir"), str(target))
    completed = weir.load_checkpoint(str(target))
    with KeyedOperatorHarness.restore(KindCount(kind), key_of, completed, uid=kind,
                                      parallelism=1, subtask_index=0) as h:
        state = {canonical_key_bytes(k): h.state_of(k, COUNT) for k in h.keys(COUNT)}
    assert state == dict(oracle), kind


class _Nothing(weir.KeyedProcessFunction[Any, Any]):
    def process_element(self, value: Any, ctx: Any) -> Any:
        return ()


@pytest.mark.spark
def test_process_refuses_a_map_key_column_before_the_query_starts(
    spark: Any, tmp_path: Path
) -> None:
    df = spark.createDataFrame([({"a": 1}, 1)], "m map<string,int>, seq long")
    with pytest.raises(ConfigurationError, match=r"operator 'maps'.*column 'm'"):
        weir.spark.process(df, key_by="m", function=_Nothing(), output_schema="seq long",
                           uid="maps", config=weir.JobConfig(str(tmp_path / "weir")))
    assert not (tmp_path / "weir").exists()  # refused before anything was written


# ------------------------------------------------------------------ the JVM route

JVM_SCHEMA = ("id long, s string, b tinyint, sh smallint, i int, l long, bo boolean, "
              "bi binary, f float, d double, dt date, ts timestamp, ntz timestamp_ntz, "
              "ai array<int>, as_ array<string>, af array<float>")
#: key columns routed in the JVM: each type alone, and mixes
JVM_KEYS = [[c] for c in ("s", "b", "sh", "i", "l", "bo", "bi", "f", "d", "dt", "ts", "ntz",
                          "ai", "as_", "af")] + [
    ["s", "l"], ["bo", "bi", "f", "d"], ["dt", "ts", "ntz"], ["ai", "as_", "i", "sh", "b"]]


def _jvm_rows(n: int) -> list[tuple[Any, ...]]:
    """Random rows with the edges of every type: nulls, extremes, NaN, -0.0, the first
    and last day Python can hold, non-ASCII text, empty arrays and null elements."""
    import math
    import random

    rng = random.Random(20261123)

    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.08 else value

    def integer(bits: int) -> int:
        top = 2 ** (bits - 1)
        edges = [e for e in (0, 1, -1, top - 1, -top, 127, 128, -33) if -top <= e < top]
        return rng.choice(edges) if rng.random() < 0.3 else rng.randrange(-2 ** (bits - 1),
                                                                          2 ** (bits - 1))

    def real() -> float:
        return rng.choice([0.0, -0.0, math.nan, math.inf, -math.inf, 1.5, rng.uniform(-1e9, 1e9)])

    def text() -> str:
        return "".join(rng.choice("aé日\U0001f600z ") for _ in range(rng.randrange(0, 40)))

    day = dt.date(1, 1, 1)
    rows = []
    for j in range(n):
        days = rng.choice([0, 3652058, rng.randrange(0, 3652059)])  # 0001-01-01..9999-12-31
        micros = rng.randrange(-62_135_596_800_000_000, 253_402_300_799_999_999)
        rows.append((
            j, maybe(text()), maybe(integer(8)), maybe(integer(16)), maybe(integer(32)),
            maybe(integer(64)), maybe(rng.random() < 0.5),
            maybe(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 9)))),
            maybe(real()), maybe(real()), maybe(day + dt.timedelta(days=days)),
            maybe(dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=micros)),
            maybe(dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=micros)),
            maybe([maybe(integer(32)) for _ in range(rng.randrange(0, 4))]),
            maybe([maybe(text()) for _ in range(rng.randrange(0, 3))]),
            maybe([maybe(real()) for _ in range(rng.randrange(0, 3))]),
        ))
    return rows


@pytest.mark.spark
def test_the_jvm_route_sends_every_record_where_the_python_route_pass_does(spark: Any) -> None:
    """For every key type Spark hashes as weir does, alone and mixed: Spark's ``hash``
    in the JVM gives each record the route (and kind: null keys and dates or timestamps
    Python cannot hold are bad keys) of the Python route pass over the same rows, its
    input position as its order, and each input partition's first row is followed by
    one clock row per subtask with the batch time."""
    from pyspark.sql import functions as F

    from weir.runtime.spark.jvm_route import jvm_keyed_route
    from weir.runtime.spark.routing import KIND, ORDER, ROUTE

    p = 3
    df = spark.createDataFrame(_jvm_rows(1500), JVM_SCHEMA).repartition(2)
    beyond = F.col("id") % 97 == 0  # a year-10000 value Python cannot hold
    df = (df.withColumn("dt", F.when(beyond, F.expr("make_date(10000, 1, 1)"))
                        .otherwise(F.col("dt")))
          .withColumn("ts", F.when(beyond, F.expr("make_timestamp(10000, 1, 1, 0, 0, 0, 'UTC')"))
                      .otherwise(F.col("ts")))
          .withColumn("ntz", F.when(beyond, F.expr("make_timestamp_ntz(10000, 1, 1, 0, 0, 0)"))
                      .otherwise(F.col("ntz")))).cache()
    source = df.toArrow()
    for keys in JVM_KEYS:
        routed = jvm_keyed_route(df, keys, M, p, F.lit(1234).cast("bigint"))
        assert routed is not None, keys
        got = unpack_kinds(routed.rows.select("*", routed.route.alias(ROUTE)).toArrow())
        heartbeat = pc.equal(got[KIND], int(RowKind.HEARTBEAT))
        clocks = got.filter(heartbeat)
        # each input partition's clock rows: one per subtask, with its route
        assert Counter(zip(clocks[ORDER].to_pylist(), clocks[ROUTE].to_pylist(), strict=True)) == {
            (clock_order(i, 1234) & (ORDER_LIMIT - 1), r): 2
            for i, r in enumerate(route_table(p))}, keys
        rows = got.filter(pc.invert(heartbeat))
        assert rows["id"].to_pylist() == source["id"].to_pylist()
        orders = rows[ORDER].to_pylist()  # input order, each row its own
        assert orders == sorted(orders) and len(set(orders)) == len(orders), keys
        python = _unpacked(keyed_route_pass(keys, M, p)(iter(
            source.append_column(NOW, pa.array([1234] * source.num_rows, pa.int64()))
            .to_batches())))
        python = python.filter(pc.not_equal(python[KIND], int(RowKind.HEARTBEAT)))
        want = {i: (k, r) for i, k, r in zip(python["id"].to_pylist(), python[KIND].to_pylist(),
                                            python[ROUTE].to_pylist(), strict=True)}
        have = {i: (k, r) for i, k, r in zip(rows["id"].to_pylist(), rows[KIND].to_pylist(),
                                            rows[ROUTE].to_pylist(), strict=True)}
        assert have.keys() == want.keys()
        # a bad key goes to any subtask (to be dead-lettered there); a record to its owner
        assert {i: k for i, (k, _) in have.items()} == {i: k for i, (k, _) in want.items()}, keys
        records = {i: r for i, (k, r) in want.items() if k == int(RowKind.RECORD)}
        assert {i: have[i][1] for i in records} == records, keys
        assert len(records) > 1000, keys
    df.unpersist()


@pytest.mark.spark
def test_a_streaming_input_is_routed_in_the_jvm_with_its_rows_numbered_by_a_udf(
    spark: Any, tmp_path: Path
) -> None:
    """Spark refuses ``monotonically_increasing_id`` in a stream: there, a Java UDF
    (``jvm_udfs.row_order``) numbers each input partition's rows as it would
    (partition << 33 | row), so routes, kinds and clock rows are the static route's."""
    from pyspark.sql import functions as F

    from weir.runtime.spark.jvm_route import jvm_keyed_route
    from weir.runtime.spark.routing import KIND, ORDER, ROUTE

    p = 3
    rows = _jvm_rows(900)
    spark.createDataFrame(rows, JVM_SCHEMA).repartition(3).write.parquet(str(tmp_path / "in"))
    source = spark.read.parquet(str(tmp_path / "in")).toArrow()
    for n, keys in enumerate((["s"], ["l"], ["ai", "as_", "i", "sh", "b"])):
        stream = spark.readStream.schema(JVM_SCHEMA).parquet(str(tmp_path / "in"))
        jvm = jvm_keyed_route(stream, keys, M, p, F.lit(1234).cast("bigint"))
        assert jvm is not None, keys
        routed = jvm.rows.select("*", jvm.route.alias(ROUTE))
        batches: list[pa.Table] = []
        query = (routed.writeStream.foreachBatch(lambda df, _, out=batches: out.append(
                     df.toArrow()))
                 .option("checkpointLocation", str(tmp_path / f"spark-{n}"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        got = unpack_kinds(pa.concat_tables(batches))
        heartbeat = pc.equal(got[KIND], int(RowKind.HEARTBEAT))
        records = got.filter(pc.invert(heartbeat))
        assert sorted(records["id"].to_pylist()) == sorted(source["id"].to_pylist())
        by_partition: dict[int, list[int]] = {}
        for order in records[ORDER].to_pylist():
            by_partition.setdefault(order >> 33, []).append(order & ((1 << 33) - 1))
        assert len(by_partition) > 1, keys  # several input partitions, each numbered 0..
        assert all(sorted(r) == list(range(len(r))) for r in by_partition.values()), keys
        clocks = got.filter(heartbeat)
        assert Counter(zip(clocks[ORDER].to_pylist(), clocks[ROUTE].to_pylist(), strict=True)) == {
            (clock_order(i, 1234) & (ORDER_LIMIT - 1), r): len(by_partition)
            for i, r in enumerate(route_table(p))}, keys
        python = _unpacked(keyed_route_pass(keys, M, p)(iter(
            source.append_column(NOW, pa.array([1234] * source.num_rows, pa.int64()))
            .to_batches())))
        python = python.filter(pc.equal(python[KIND], int(RowKind.RECORD)))
        want = dict(zip(python["id"].to_pylist(), python[ROUTE].to_pylist(), strict=True))
        have = dict(zip(records["id"].to_pylist(), records[ROUTE].to_pylist(), strict=True))
        assert {i: have[i] for i in want} == want, keys
        assert len(want) > 600, keys


_RETRY_SCRIPT = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark import TaskContext
from pyspark.sql import SparkSession, functions as F
from weir.runtime.spark.jvm_route import jvm_keyed_route
from weir.runtime.spark.routing import KIND_SHIFT, ORDER

spark = (SparkSession.builder.master("local[1,3]").config("spark.ui.enabled", "false")
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50").getOrCreate())
spark.range(400, numPartitions=1).select(F.col("id").cast("string").alias("s")).write.parquet(
    sys.argv[1] + "/in")
stream = spark.readStream.schema("s string").parquet(sys.argv[1] + "/in")
routed = jvm_keyed_route(stream, ["s"], 128, 2, F.lit(7).cast("bigint")).rows

MARKER = sys.argv[1] + "/failed"

def fail_first_attempt(batches):
    for n, batch in enumerate(batches):
        if TaskContext.get().attemptNumber() == 0 and n == 2:
            open(MARKER, "w").close()
            raise RuntimeError("injected: the first attempt fails after 100 rows")
        yield batch

out = routed.mapInArrow(fail_first_attempt, routed.schema)
orders = []
RECORD = F.shiftright(ORDER, KIND_SHIFT) == 1
query = (out.writeStream.foreachBatch(
             lambda df, _: orders.extend(r[0] for r in df.where(RECORD).select(ORDER).collect()))
         .option("checkpointLocation", sys.argv[1] + "/spark")
         .trigger(availableNow=True).start())
query.awaitTermination()
print(os.path.exists(MARKER), sorted(o & ((1 << 33) - 1) for o in orders) == list(range(400)),
      len(orders))
"""


@pytest.mark.spark
@pytest.mark.slow  # (its own JVM: started first)
def test_a_retried_task_numbers_its_rows_from_zero_again(tmp_path: Path) -> None:
    """The Java UDF's row count lives in the deserialized plan of one task attempt: a
    task that fails after numbering 100 rows is retried, and the retry numbers its
    rows 0..n-1 again, as the first attempt did (its own process: the shared session
    retries no task)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _RETRY_SCRIPT, str(tmp_path)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    # the first attempt failed (once), and the retry's rows are numbered 0..399
    assert out.stdout.split()[-3:] == ["True", "True", "400"], out.stdout[-2000:]


@pytest.mark.spark
def test_the_route_stage_of_a_stream_compiles_its_code_once_not_in_every_batch(
    spark: Any, tmp_path: Path
) -> None:
    """A micro-batch's ``current_timestamp()`` is a literal of that batch; written into
    the generated code, it would make Spark compile the route stage again in every
    batch. ``opaque_millis`` keeps it out: after the first batch, none compiles."""
    from pyspark.sql import functions as F

    from weir.runtime.spark.jvm_route import jvm_keyed_route
    from weir.runtime.spark.jvm_udfs import opaque_millis

    metric = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def add_file() -> None:
        spark.createDataFrame(_jvm_rows(50), JVM_SCHEMA).coalesce(1).write.mode(
            "append").parquet(str(tmp_path / "in"))

    add_file()
    stream = spark.readStream.schema(JVM_SCHEMA).parquet(str(tmp_path / "in"))
    now = opaque_millis(F.unix_millis(F.current_timestamp()))
    routed = jvm_keyed_route(stream, ["s"], M, P, now)
    assert routed is not None
    query = (routed.rows.repartition(P, routed.route).writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "spark")).start())
    compiled: list[int] = []
    try:
        for _ in range(5):
            query.processAllAvailable()  # a batch of the file added last
            compiled.append(metric.getCount())
            add_file()
    finally:
        query.stop()
    assert len(query.recentProgress) >= 5
    # (the first two batches may compile: a new query's first stage, AQE's re-plan)
    assert [b - a for a, b in itertools.pairwise(compiled[1:])] == [0, 0, 0]


@pytest.mark.spark
def test_keys_the_jvm_cannot_hash_as_weir_take_the_python_route_pass(spark: Any) -> None:
    """Decimals, structs, collated strings and arrays of dates are routed by the Python
    pass; string and long keys add no Python pass before the shuffle (a stream's rows
    are numbered by a Java UDF)."""
    from pyspark.sql import functions as F

    from weir.runtime.spark.jvm_route import jvm_keyed_route

    df = spark.createDataFrame([], "dec decimal(10,2), st struct<a:int>, ad array<date>, "
                                   "s string, l long")
    now = F.lit(0).cast("bigint")
    for keys in (["dec"], ["st"], ["ad"], ["s", "dec"]):
        assert jvm_keyed_route(df, keys, M, P, now) is None, keys
    lcase = df.select(F.col("s").cast("string collate UTF8_LCASE").alias("s"))
    assert jvm_keyed_route(lcase, ["s"], M, P, now) is None
    plan = weir.spark.process(
        df,
        key_by=["s", "l"],
        function=_Nothing(),
        output_schema="x int",
        uid="plan",
        config=weir.JobConfig("/tmp/weir-unused-plan", max_parallelism=M),
        parallelism=P,
    )
    text = plan._jdf.queryExecution().executedPlan().toString()
    # no route pass at all (the heartbeat's clock rows too come from the JVM), and no
    # route column: Spark partitions by the route expression
    assert re.findall(r"MapInArrow route\(", text) == [], text
    assert "_weir_route" not in text, text
    stream = spark.readStream.format("rate").load().select(
        F.col("value").cast("string").alias("s"), F.col("value").alias("l"))
    plan = weir.spark.process(
        stream,
        key_by=["s", "l"],
        function=_Nothing(),
        output_schema="x int",
        uid="plan",
        config=weir.JobConfig("/tmp/weir-unused-plan", max_parallelism=M),
        parallelism=P,
    )
    text = plan._jdf.queryExecution().analyzed().toString()
    # a stream's records do not reach Python before the shuffle: a Java UDF numbers them
    # (and the heartbeat's clock rows come from the JVM too)
    assert re.findall(r"MapInArrow route\(", text) == [], text
    assert "_weir_route" not in text, text
    assert re.findall(r"UDF\((\w+)\(\)\) AS _weir_order", text) == ["SPARK_PARTITION_ID"], text


@pytest.mark.spark
def test_a_task_given_the_rows_of_two_subtasks_refuses_the_batch_naming_them(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No route column reaches the process pass: a task learns its subtask from its
    clock rows. Were the stage's partitioning changed between the route and the process
    pass (here: every row into one partition), the task refuses the batch
    (``TaskPlacementError``) instead of running two subtasks' rows as one."""
    from pyspark.sql import functions as F

    import weir.spark as ws
    from weir.runtime.spark.jvm_route import jvm_clock_rows, jvm_keyed_route

    specs: list[Any] = []
    real = ws.process_pass
    monkeypatch.setattr(ws, "process_pass", lambda spec: specs.append(spec) or real(spec))
    df = spark.createDataFrame([(f"k{i}",) for i in range(50)], "s string")
    placed = ws.process(df, key_by="s", function=_Nothing(), output_schema="x int",
                        uid="placed", config=weir.JobConfig(tmp_path.as_uri(), max_parallelism=M),
                        parallelism=P)
    assert placed.collect() == []  # as weir partitions it: each task one subtask
    now = F.lit(1234).cast("bigint")
    jvm = jvm_keyed_route(df, ["s"], M, P, now)
    assert jvm is not None
    rows = jvm.rows.unionByName(jvm_clock_rows(spark.range(1), P, now), allowMissingColumns=True)
    merged = rows.repartition(1).mapInArrow(real(specs[0]), "x int")
    with pytest.raises(Exception, match=r"TaskPlacementError[^\n]*subtasks \[0, 1\] of 2"):
        merged.collect()
