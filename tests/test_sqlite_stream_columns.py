"""The continuous runtime's ``SqliteSink`` writes records as table columns, as the
Spark ``weir-sqlite`` sink does (issue 39): a dict's keys are the columns (the table is
created from the first record; a later record's new keys are added with ``ALTER TABLE
ADD COLUMN``), a tuple or list needs ``columns=``, nested values are JSON text; still
exactly-once by two-phase commit through a staging table. ``read_sqlite_stream_sink``
and the Spark sink's ``read_sqlite_sink`` read the same rows. And naming: the Spark
data source is ``weir.connectors.spark.SqliteDataSource``; the old ``SQLiteSink`` name
(one letter case away from the continuous ``SqliteSink``) warns."""

from __future__ import annotations

import dataclasses
import sqlite3
import sys
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from pyspark import cloudpickle

import weir
from weir.api.connectors import SinkContext, SinkLineageError
from weir.connectors.stream import SqliteSink, read_sqlite_stream_sink
from weir.errors import SinkError

CONTEXT = SinkContext("1000run", 0, 1, 0, uid="sink", lineage="l1")


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def columns_of(db: Path, table: str) -> list[tuple[str, str]]:
    conn = sqlite3.connect(db)
    try:
        return [(r[1], r[2]) for r in conn.execute(f'PRAGMA table_info("{table}")')]
    finally:
        conn.close()


def raw(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def write_and_commit(sink: SqliteSink, records: list[Any], checkpoint: int = 1,
                     context: SinkContext = CONTEXT) -> Any:
    # (a writer of its own run per call: transaction ids are unique per run and writer)
    writer = sink.writer(dataclasses.replace(context, run_id=f"{1000 + checkpoint}run"))
    for record in records:
        writer.write(record)
    committable = writer.prepare_commit(checkpoint)
    writer.close()
    sink.commit([committable])
    return committable


def test_a_dict_becomes_a_row_of_columns_named_by_its_keys(tmp_path: Path) -> None:
    db = tmp_path / "out.db"
    sink = SqliteSink(db, table="alerts")
    write_and_commit(sink, [
        {"card": "c1", "amount": 12.5, "n": 3, "ok": True, "tags": ["a", "b"],
         "where": {"job": "j", "checkpoint": 1}, "blob": b"\x00\x01", "note": None},
        {"card": "c2", "amount": 1.0, "n": 4, "ok": False, "tags": [], "where": {},
         "blob": None, "note": "x"},
    ])
    assert columns_of(db, "alerts") == [
        ("card", "TEXT"), ("amount", "REAL"), ("n", "INTEGER"), ("ok", "INTEGER"),
        ("tags", "JSON"), ("where", "JSON"), ("blob", "BLOB"), ("note", "")]
    # plain SQL sees the columns; nested values are JSON text
    assert raw(db, 'SELECT card, amount, n, ok, tags, "where" FROM alerts ORDER BY rowid') == [
        ("c1", 12.5, 3, 1, '["a","b"]', '{"job":"j","checkpoint":1}'),
        ("c2", 1.0, 4, 0, "[]", "{}")]
    rows = read_sqlite_stream_sink(db, table="alerts")
    assert rows == [
        {"card": "c1", "amount": 12.5, "n": 3, "ok": 1, "tags": ["a", "b"],
         "where": {"job": "j", "checkpoint": 1}, "blob": b"\x00\x01", "note": None},
        {"card": "c2", "amount": 1.0, "n": 4, "ok": 0, "tags": [], "where": {},
         "blob": None, "note": "x"}]


def test_a_later_record_with_new_keys_adds_columns(tmp_path: Path) -> None:
    db = tmp_path / "out.db"
    sink = SqliteSink(db, table="t")
    write_and_commit(sink, [{"a": 1}], 1)
    write_and_commit(sink, [{"a": 2, "b": "x"}, {"c": {"d": 1}}], 2)
    assert columns_of(db, "t") == [("a", "INTEGER"), ("b", "TEXT"), ("c", "JSON")]
    assert read_sqlite_stream_sink(db, table="t") == [
        {"a": 1, "b": None, "c": None}, {"a": 2, "b": "x", "c": None},
        {"a": None, "b": None, "c": {"d": 1}}]


class Point(NamedTuple):
    x: int
    y: int


def test_a_tuple_or_list_needs_columns(tmp_path: Path) -> None:
    db = tmp_path / "out.db"
    writer = SqliteSink(db, table="t").writer(CONTEXT)
    with pytest.raises(SinkError, match=r"columns="):
        writer.write((1, 2))
    with pytest.raises(SinkError, match=r"columns="):
        writer.write(7)
    writer.close()
    sink = SqliteSink(db, table="pairs", columns=["key", "n"])
    write_and_commit(sink, [("a", 1), ["b", 2], {"key": "c", "n": 3}])
    assert read_sqlite_stream_sink(db, table="pairs") == [
        {"key": "a", "n": 1}, {"key": "b", "n": 2}, {"key": "c", "n": 3}]
    with pytest.raises(SinkError, match="2 columns"):
        sink.writer(CONTEXT).write(("a", 1, "extra"))
    one = SqliteSink(db, table="numbers", columns=["n"])
    write_and_commit(one, [1, 2])
    assert read_sqlite_stream_sink(db, table="numbers") == [{"n": 1}, {"n": 2}]
    named = SqliteSink(db, table="points")  # (a named tuple names its columns)
    write_and_commit(named, [Point(1, 2)])
    assert read_sqlite_stream_sink(db, table="points") == [{"x": 1, "y": 2}]
    with pytest.raises(weir.ConfigurationError, match="columns"):
        SqliteSink(db, table="t", columns=["a", "A"])


def test_staged_rows_are_invisible_and_a_commit_lands_once(tmp_path: Path) -> None:
    db = tmp_path / "out.db"
    sink = SqliteSink(db, table="t")
    writer = sink.writer(CONTEXT)
    writer.write({"n": 1})
    txn = writer.prepare_commit(1)
    writer.close()
    assert read_sqlite_stream_sink(db, table="t") == []  # staged: no table yet
    sink.commit([txn])
    sink.commit([txn])
    sink.commit_after_recovery([txn])
    assert read_sqlite_stream_sink(db, table="t") == [{"n": 1}]
    assert raw(db, "SELECT count(*) FROM t_staging") == [(0,)]
    assert raw(db, "SELECT txn FROM t_committed") == [(txn,)]


def test_the_spark_sinks_reader_reads_the_same_rows(tmp_path: Path) -> None:
    from weir.connectors.spark import read_sqlite_sink

    db = tmp_path / "out.db"
    write_and_commit(SqliteSink(db, table="t"), [{"k": "a", "v": [1, 2]}, {"k": "b", "v": None}])
    assert read_sqlite_sink(str(db), "t") == read_sqlite_stream_sink(db, table="t") == [
        {"k": "a", "v": [1, 2]}, {"k": "b", "v": None}]


def test_a_table_in_the_old_json_layout_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "out.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE records (txn TEXT NOT NULL, value TEXT NOT NULL)")
    conn.commit()
    conn.close()
    with pytest.raises(SinkLineageError, match="one JSON text per row"):
        SqliteSink(db).claim(CONTEXT)


def test_a_job_writes_columns_exactly_once(tmp_path: Path) -> None:
    from weir.connectors import SequenceSource
    from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

    db = tmp_path / "out.db"
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                                           checkpointing=CheckpointConfig(interval="50 ms"),
                                           restart_strategy=RestartStrategy.no_restart()))
    (env.from_source(SequenceSource(3_000, 3_000), uid="numbers")
        .map(lambda v: {"n": v, "even": v % 2 == 0, "parts": [v % 3, v % 5]})
        .sink_to(SqliteSink(db, table="numbers"), uid="sink"))
    env.execute("columns", timeout="60 s")
    rows = read_sqlite_stream_sink(db, table="numbers")
    assert sorted(r["n"] for r in rows) == list(range(3_000))
    assert all(r == {"n": r["n"], "even": int(r["n"] % 2 == 0),
                     "parts": [r["n"] % 3, r["n"] % 5]} for r in rows)
    assert raw(db, "SELECT count(*) FROM numbers WHERE even = 1") == [(1_500,)]


# -- naming: one public name per class, by runtime


def test_the_spark_data_sources_live_in_weir_connectors_spark() -> None:
    import weir.connectors
    import weir.connectors.spark as spark_connectors

    for name in ("register_sinks", "read_file_sink", "read_sqlite_sink", "FILE_SINK_NAME",
                 "SQLITE_SINK_NAME", "SqliteDataSource", "FilesDataSource"):
        assert name in spark_connectors.__all__ and hasattr(spark_connectors, name)
    assert spark_connectors.SqliteDataSource.name() == "weir-sqlite"
    assert spark_connectors.FilesDataSource.name() == "weir-files"
    with pytest.warns(DeprecationWarning, match="weir.connectors.spark.SqliteDataSource"):
        old = weir.connectors.SQLiteSink
    assert old is spark_connectors.SqliteDataSource
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the names kept for one release, without a warning
        assert weir.connectors.TransactionalFileSink is spark_connectors.FilesDataSource
        assert weir.connectors.read_sqlite_sink is spark_connectors.read_sqlite_sink
        assert weir.connectors.register_sinks is spark_connectors.register_sinks
        assert weir.connectors.stream.SqliteSink is weir.connectors.SqliteSink
    public = [n for n in weir.connectors.__all__] + spark_connectors.__all__
    lowered = [n.lower() for n in set(public)]
    assert len(lowered) == len(set(lowered)), sorted(public)


def test_a_dataclass_record_is_a_row_too(tmp_path: Path) -> None:
    @dataclasses.dataclass
    class Alert:
        card: str
        amount: float

    db = tmp_path / "out.db"
    write_and_commit(SqliteSink(db, table="t"), [Alert("c", 2.5)])
    assert read_sqlite_stream_sink(db, table="t") == [{"card": "c", "amount": 2.5}]
