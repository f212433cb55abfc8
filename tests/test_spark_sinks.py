"""weir's two-phase-commit sinks: ``weir-files`` and ``weir-sqlite``.

The first part drives the stream writers directly, without Spark, the way PySpark
does (``write`` per partition, then ``commit``/``abort`` on a fresh writer) and
injects crashes; the second part (marked ``spark``) runs real streaming queries,
restarts them from their checkpoint and simulates a crash between the sink's commit
and Spark's commit log.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from weir.connectors import (
    FileCommitMessage,
    FileSinkWriter,
    SQLiteCommitMessage,
    SQLiteSink,
    SQLiteSinkWriter,
    TransactionalFileSink,
    committed_file_batches,
    committed_sqlite_batches,
    read_file_sink,
    read_sqlite_sink,
    register_sinks,
)
from weir.errors import SinkError, WeirError

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("name", StringType()),
        StructField("amount", DecimalType(10, 2)),
        StructField("ts", TimestampType()),
        StructField("day", DateType()),
        StructField("blob", BinaryType()),
        StructField("tags", ArrayType(StringType())),
        StructField("attrs", MapType(StringType(), IntegerType())),
        StructField("inner", StructType([StructField("a", IntegerType())])),
        StructField("flag", BooleanType()),
        StructField("score", DoubleType()),
    ]
)
SIMPLE = StructType([StructField("id", LongType()), StructField("name", StringType())])
QUERY_TIMEOUT_S = 300


def rich_row(i: int) -> Row:
    return Row(
        id=i,
        name=f"n{i}",
        amount=Decimal("12.50"),
        ts=datetime.datetime(2024, 1, 2, 3, 4, 5),
        day=datetime.date(2024, 1, 2),
        blob=b"\x00\xff",
        tags=["a", "b"],
        attrs={"k": i},
        inner=Row(a=i),
        flag=i % 2 == 0,
        score=0.25,
    )


def simple_rows(ids: range) -> Iterator[Row]:
    return iter([Row(id=i, name=f"n{i}") for i in ids])


def ids(rows: list[dict[str, Any]]) -> list[int]:
    return [int(r["id"]) for r in rows]


@contextmanager
def task(partition: int = 0, batch: int | None = None, query: str | None = None) -> Iterator[None]:
    """Pretend to run inside a Spark task (as ``TaskContext.get()`` sees it)."""
    ctx = object.__new__(TaskContext)
    ctx._partitionId = partition
    ctx._attemptNumber = 0
    ctx._stageId = 0
    ctx._taskAttemptId = 0
    props = {}
    if batch is not None:
        props["streaming.sql.batchId"] = str(batch)
    if query is not None:
        props["sql.streaming.queryId"] = query
    ctx._localProperties = props
    TaskContext._setTaskContext(ctx)
    try:
        yield
    finally:
        TaskContext._setTaskContext(None)


def file_writer(path: Path, schema: StructType = SIMPLE) -> FileSinkWriter:
    """A writer as Spark makes one: through the data source (a new one for every call)."""
    return TransactionalFileSink({"path": str(path)}).streamWriter(schema, False)


def sqlite_writer(
    db: Path, table: str = "events", schema: StructType = SIMPLE, overwrite: bool = False
) -> SQLiteSinkWriter:
    return SQLiteSink({"path": str(db), "table": table}).streamWriter(schema, overwrite)


def staged_sqlite_rows(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM _weir_staging").fetchone()[0])


def visible_entries(root: Path) -> list[str]:
    """What a reader that skips ``_``/``.`` names (like Spark's) would list."""
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(("_", ".")))


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# ============================================================== weir-files, no Spark


def test_sink_error_is_a_weir_error() -> None:
    assert issubclass(SinkError, WeirError)


def test_file_commit_publishes_exactly_the_staged_rows(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with task(partition=0, batch=0):
        m0 = file_writer(out).write(simple_rows(range(0, 5)))
    with task(partition=1, batch=0):
        m1 = file_writer(out).write(simple_rows(range(5, 8)))
    with task(partition=2, batch=0):
        m2 = file_writer(out).write(iter([]))
    assert isinstance(m0, FileCommitMessage) and (m0.rows, m1.rows, m2.rows) == (5, 3, 0)
    assert m2.staged_file is None  # an empty partition stages no file
    staged = out / m0.staged_file  # type: ignore[operator]
    assert staged.is_file() and staged.parent == out / "_staging" / "batch=0"
    # Staged, not committed: nothing visible.
    assert read_file_sink(str(out)) == []
    assert committed_file_batches(str(out)) == []
    assert visible_entries(out) == []

    file_writer(out).commit([m0, m1, m2], 0)

    assert ids(read_file_sink(str(out))) == list(range(8))
    assert committed_file_batches(str(out)) == [0]
    assert TransactionalFileSink.committed_batches(str(out)) == [0]
    assert visible_entries(out) == ["batch=0"]
    assert not (out / "_staging" / "batch=0").exists()
    manifest = json.loads((out / "batch=0" / "_manifest.json").read_text())
    assert manifest["batch_id"] == 0 and manifest["rows"] == 8
    assert [f["partition"] for f in manifest["files"]] == [0, 1]
    assert sorted(p.name for p in (out / "batch=0").iterdir() if p.suffix == ".jsonl") == sorted(
        f["name"] for f in manifest["files"]
    )


def test_file_values_are_json_safe(tmp_path: Path) -> None:
    writer = file_writer(tmp_path, SCHEMA)
    message = writer.write(iter([rich_row(1)]))
    writer.commit([message], 3)
    (row,) = read_file_sink(str(tmp_path))
    assert row == {
        "id": 1,
        "name": "n1",
        "amount": "12.50",
        "ts": "2024-01-02T03:04:05",
        "day": "2024-01-02",
        "blob": "AP8=",
        "tags": ["a", "b"],
        "attrs": {"k": 1},
        "inner": {"a": 1},
        "flag": False,
        "score": 0.25,
    }
    assert committed_file_batches(str(tmp_path)) == [3]


def test_file_commit_twice_and_replay_add_nothing(tmp_path: Path) -> None:
    with task(partition=0, batch=4):
        first = file_writer(tmp_path).write(simple_rows(range(3)))
    file_writer(tmp_path).commit([first], 4)
    # The same commit again (the commit runner retried): no duplicates, no error.
    file_writer(tmp_path).commit([first], 4)
    # Crash after the sink's commit, before Spark's commit log: Spark re-runs batch 4
    # from its logged offsets, with a new attempt, and commits batch 4 again.
    with task(partition=0, batch=4):
        replay = file_writer(tmp_path).write(simple_rows(range(3)))
    assert (tmp_path / replay.staged_file).is_file()  # type: ignore[operator]
    file_writer(tmp_path).commit([replay], 4)
    assert ids(read_file_sink(str(tmp_path))) == [0, 1, 2]
    assert not (tmp_path / replay.staged_file).exists()  # type: ignore[operator]
    assert committed_file_batches(str(tmp_path)) == [4]


def test_file_batches_are_read_in_batch_order(tmp_path: Path) -> None:
    for batch in (10, 2, 9):  # 10 > 9 > 2 numerically, not as strings
        with task(batch=batch):
            message = file_writer(tmp_path).write(simple_rows(range(batch, batch + 1)))
        file_writer(tmp_path).commit([message], batch)
    assert committed_file_batches(str(tmp_path)) == [2, 9, 10]
    assert ids(read_file_sink(str(tmp_path))) == [2, 9, 10]


def test_file_abort_deletes_staged_files(tmp_path: Path) -> None:
    with task(partition=0, batch=1):
        named = file_writer(tmp_path).write(simple_rows(range(3)))
    with task(partition=1, batch=1):
        unnamed = file_writer(tmp_path).write(simple_rows(range(3, 6)))
    # Spark passes None for the tasks of a failed batch: the batch's staging goes.
    file_writer(tmp_path).abort([named, None], 1)
    assert not (tmp_path / named.staged_file).exists()  # type: ignore[operator]
    assert not (tmp_path / unnamed.staged_file).exists()  # type: ignore[operator]
    assert read_file_sink(str(tmp_path)) == [] and committed_file_batches(str(tmp_path)) == []
    # An abort after the batch was published never touches it.
    with task(batch=2):
        message = file_writer(tmp_path).write(simple_rows(range(2)))
    file_writer(tmp_path).commit([message], 2)
    file_writer(tmp_path).abort([message], 2)
    assert ids(read_file_sink(str(tmp_path))) == [0, 1]


def test_file_staged_outside_spark_can_be_committed_and_aborted(tmp_path: Path) -> None:
    """No TaskContext: partition 0, a uuid attempt, no batch id."""
    writer = file_writer(tmp_path)
    a, b = writer.write(simple_rows(range(2))), writer.write(simple_rows(range(2, 4)))
    assert (a.partition_id, a.batch_id, a.query_id) == (0, None, None)
    assert a.attempt_id != b.attempt_id and a.staged_file != b.staged_file
    writer.abort([b], 0)
    assert not (tmp_path / b.staged_file).exists()  # type: ignore[operator]
    writer.commit([a], 0)
    assert ids(read_file_sink(str(tmp_path))) == [0, 1]


def test_file_crash_after_write_before_commit_kill_9(tmp_path: Path) -> None:
    """A writer killed with SIGKILL after staging: nothing visible; the replayed
    attempt commits exactly once and sweeps the dead attempt's file."""
    result = run_python(
        f"""
        import os, signal
        from pyspark import TaskContext
        from pyspark.sql import Row
        from weir.connectors import TransactionalFileSink
        from pyspark.sql.types import StructType, StructField, LongType, StringType
        ctx = object.__new__(TaskContext)
        ctx._partitionId = 0
        ctx._localProperties = {{"streaming.sql.batchId": "0"}}
        TaskContext._setTaskContext(ctx)
        schema = StructType([StructField("id", LongType()), StructField("name", StringType())])
        w = TransactionalFileSink({{"path": {str(tmp_path)!r}}}).streamWriter(schema, False)
        w.write(iter([Row(id=i, name="x") for i in range(5)]))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert result.returncode == -9, result.stderr
    orphans = list((tmp_path / "_staging" / "batch=0").iterdir())
    assert len(orphans) == 1  # the dead attempt's file is there...
    assert read_file_sink(str(tmp_path)) == []  # ...and invisible
    assert visible_entries(tmp_path) == []
    with task(partition=0, batch=0):
        replay = file_writer(tmp_path).write(simple_rows(range(5)))
    file_writer(tmp_path).commit([replay], 0)
    assert ids(read_file_sink(str(tmp_path))) == list(range(5))
    assert not orphans[0].exists()


def test_file_crash_inside_commit_before_rename_kill_9(tmp_path: Path) -> None:
    """Killed after moving the staged files into the temp directory, before the
    rename that publishes it: nothing visible; the replay publishes once."""
    result = run_python(
        f"""
        import os, signal
        from pyspark.sql import Row
        from pyspark.sql.types import StructType, StructField, LongType, StringType
        import weir.connectors.files as sinks
        schema = StructType([StructField("id", LongType()), StructField("name", StringType())])
        w = sinks.TransactionalFileSink({{"path": {str(tmp_path)!r}}}).streamWriter(schema, False)
        m = w.write(iter([Row(id=i, name="x") for i in range(5)]))
        real_fsync_dir = sinks._fsync_dir
        def crash_before_publish(path):
            real_fsync_dir(path)
            if path.name.startswith(".batch=7.tmp-"):
                os.kill(os.getpid(), signal.SIGKILL)
        sinks._fsync_dir = crash_before_publish
        w.commit([m], 7)
        """
    )
    assert result.returncode == -9, result.stderr
    (tmp_dir,) = [p for p in tmp_path.iterdir() if p.name.startswith(".batch=7.tmp-")]
    assert (tmp_dir / "_manifest.json").is_file()  # complete, but not published
    assert read_file_sink(str(tmp_path)) == [] and committed_file_batches(str(tmp_path)) == []
    with task(batch=7):
        replay = file_writer(tmp_path).write(simple_rows(range(5)))
    file_writer(tmp_path).commit([replay], 7)
    assert ids(read_file_sink(str(tmp_path))) == list(range(5))
    assert not tmp_dir.exists()


def test_file_refuses_a_new_query_lineage(tmp_path: Path) -> None:
    with task(batch=0, query="query-a"):
        a0 = file_writer(tmp_path).write(simple_rows(range(2)))
    file_writer(tmp_path).commit([a0], 0)
    file_writer(tmp_path).commit([], 1)  # a batch without tasks carries no query id
    # A new query (fresh checkpoint, batch ids from 0 again) on the same path.
    with task(batch=0, query="query-b"):
        b0 = file_writer(tmp_path).write(simple_rows(range(100, 102)))
    with pytest.raises(SinkError, match=r"query-a.*query-b.*new path") as info:
        file_writer(tmp_path).commit([b0], 0)
    assert str(tmp_path) in str(info.value) and "batch 0" in str(info.value)
    with task(batch=2, query="query-b"):
        b2 = file_writer(tmp_path).write(simple_rows(range(100, 102)))
    with pytest.raises(SinkError):
        file_writer(tmp_path).commit([b2], 2)
    # The original query carries on.
    with task(batch=2, query="query-a"):
        a2 = file_writer(tmp_path).write(simple_rows(range(2, 4)))
    file_writer(tmp_path).commit([a2], 2)
    assert ids(read_file_sink(str(tmp_path))) == [0, 1, 2, 3]


def test_file_commit_refuses_incomplete_batches(tmp_path: Path) -> None:
    with task(partition=0, batch=0):
        m0 = file_writer(tmp_path).write(simple_rows(range(2)))
    with task(partition=1, batch=0):
        m1 = file_writer(tmp_path).write(simple_rows(range(2, 4)))
    with pytest.raises(SinkError, match="no commit message for task 1"):
        file_writer(tmp_path).commit([m0, None], 0)
    with pytest.raises(SinkError, match="staged for batch 0"):
        file_writer(tmp_path).commit([m0, m1], 5)
    (tmp_path / m1.staged_file).unlink()  # type: ignore[operator]
    with pytest.raises(SinkError, match=r"staged file .* is missing"):
        file_writer(tmp_path).commit([m0, m1], 0)
    assert committed_file_batches(str(tmp_path)) == [] and read_file_sink(str(tmp_path)) == []
    assert (tmp_path / m0.staged_file).is_file()  # type: ignore[operator]


def test_file_sink_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="option 'path' is missing"):
        TransactionalFileSink({}).streamWriter(SIMPLE, False)
    with pytest.raises(SinkError, match="local filesystem"):
        TransactionalFileSink({"path": "s3://bucket/out"}).streamWriter(SIMPLE, False)
    with pytest.raises(SinkError, match="complete output mode"):
        TransactionalFileSink({"path": str(tmp_path)}).streamWriter(SIMPLE, True)
    url_writer = TransactionalFileSink({"path": (tmp_path / "u").as_uri()}).streamWriter(
        SIMPLE, False
    )
    url_writer.commit([url_writer.write(simple_rows(range(1)))], 0)
    assert ids(read_file_sink(str(tmp_path / "u"))) == [0]
    with pytest.raises(SinkError, match="no directory"):
        read_file_sink(str(tmp_path / "missing"))


def test_file_empty_batch_is_recorded(tmp_path: Path) -> None:
    writer = file_writer(tmp_path)
    writer.commit([writer.write(iter([])), writer.write(iter([]))], 0)
    assert committed_file_batches(str(tmp_path)) == [0]
    assert read_file_sink(str(tmp_path)) == []


# ============================================================= weir-sqlite, no Spark


def test_sqlite_commit_inserts_exactly_the_named_attempts(tmp_path: Path) -> None:
    db = tmp_path / "sink.db"
    with task(partition=0, batch=0):
        m0 = sqlite_writer(db).write(simple_rows(range(0, 4)))
    with task(partition=1, batch=0):
        m1 = sqlite_writer(db).write(simple_rows(range(4, 6)))
    with task(partition=1, batch=0):  # a failed attempt of partition 1, never named
        sqlite_writer(db).write(simple_rows(range(50, 60)))
    assert isinstance(m0, SQLiteCommitMessage) and (m0.rows, m1.rows) == (4, 2)
    assert staged_sqlite_rows(db) == 16
    assert read_sqlite_sink(str(db), "events") == []
    assert committed_sqlite_batches(str(db), "events") == []

    sqlite_writer(db).commit([m0, m1], 0)

    assert read_sqlite_sink(str(db), "events") == [{"id": i, "name": f"n{i}"} for i in range(6)]
    assert committed_sqlite_batches(str(db), "events") == [0]
    assert SQLiteSink.committed_batches(str(db), "events") == [0]
    assert staged_sqlite_rows(db) == 0  # the dead attempt's rows went too
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT row_count, committed_at FROM _weir_commits").fetchone()
    assert row[0] == 6 and row[1].startswith(str(datetime.date.today().year))


def test_sqlite_column_types(tmp_path: Path) -> None:
    db = tmp_path / "sink.db"
    writer = sqlite_writer(db, "rich", SCHEMA)
    writer.commit([writer.write(iter([rich_row(2)]))], 0)
    with sqlite3.connect(db) as conn:
        declared = {r[1]: r[2] for r in conn.execute("PRAGMA table_info(rich)")}
    assert declared == {
        "id": "INTEGER",
        "name": "TEXT",
        "amount": "TEXT",
        "ts": "TEXT",
        "day": "TEXT",
        "blob": "BLOB",
        "tags": "TEXT",
        "attrs": "TEXT",
        "inner": "TEXT",
        "flag": "INTEGER",
        "score": "REAL",
    }
    (row,) = read_sqlite_sink(str(db), "rich")
    assert row == {
        "id": 2,
        "name": "n2",
        "amount": "12.50",
        "ts": "2024-01-02T03:04:05",
        "day": "2024-01-02",
        "blob": b"\x00\xff",
        "tags": '["a","b"]',
        "attrs": '{"k":2}',
        "inner": '{"a":2}',
        "flag": 1,
        "score": 0.25,
    }


def test_sqlite_commit_twice_and_replay_add_nothing(tmp_path: Path) -> None:
    db = tmp_path / "sink.db"
    with task(batch=3):
        first = sqlite_writer(db).write(simple_rows(range(3)))
    sqlite_writer(db).commit([first], 3)
    sqlite_writer(db).commit([first], 3)
    with task(batch=3):
        replay = sqlite_writer(db).write(simple_rows(range(3)))
    assert staged_sqlite_rows(db) == 3
    sqlite_writer(db).commit([replay], 3)
    assert ids(read_sqlite_sink(str(db), "events")) == [0, 1, 2]
    assert staged_sqlite_rows(db) == 0
    assert committed_sqlite_batches(str(db), "events") == [3]


def test_sqlite_abort_deletes_staged_rows(tmp_path: Path) -> None:
    db = tmp_path / "sink.db"
    with task(partition=0, batch=1):
        named = sqlite_writer(db).write(simple_rows(range(3)))
    with task(partition=1, batch=1):
        sqlite_writer(db).write(simple_rows(range(3, 5)))
    with task(partition=0, batch=2):
        other_batch = sqlite_writer(db).write(simple_rows(range(7, 8)))
    sqlite_writer(db).abort([named, None], 1)
    assert staged_sqlite_rows(db) == 1  # only batch 2's row is left
    sqlite_writer(db).commit([other_batch], 2)
    assert ids(read_sqlite_sink(str(db), "events")) == [7]
    sqlite_writer(db).abort([other_batch], 2)  # after the commit: nothing changes
    assert ids(read_sqlite_sink(str(db), "events")) == [7]
    assert committed_sqlite_batches(str(db), "events") == [2]


def test_sqlite_crash_after_write_before_commit_kill_9(tmp_path: Path) -> None:
    db = tmp_path / "sink.db"
    result = run_python(
        f"""
        import os, signal
        from pyspark import TaskContext
        from pyspark.sql import Row
        from pyspark.sql.types import StructType, StructField, LongType, StringType
        from weir.connectors import SQLiteSink
        ctx = object.__new__(TaskContext)
        ctx._partitionId = 0
        ctx._localProperties = {{"streaming.sql.batchId": "0"}}
        TaskContext._setTaskContext(ctx)
        schema = StructType([StructField("id", LongType()), StructField("name", StringType())])
        w = SQLiteSink({{"path": {str(db)!r}, "table": "events"}}).streamWriter(schema, False)
        w.write(iter([Row(id=i, name="x") for i in range(5)]))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert result.returncode == -9, result.stderr
    assert staged_sqlite_rows(db) == 5
    assert read_sqlite_sink(str(db), "events") == []
    with task(batch=0):
        replay = sqlite_writer(db).write(simple_rows(range(5)))
    sqlite_writer(db).commit([replay], 0)
    assert ids(read_sqlite_sink(str(db), "events")) == list(range(5))
    assert staged_sqlite_rows(db) == 0


def test_sqlite_commit_is_all_or_nothing(tmp_path: Path) -> None:
    db = tmp_path / "sink.db"
    with task(partition=0, batch=0):
        m0 = sqlite_writer(db).write(simple_rows(range(3)))
    with task(partition=1, batch=0):
        m1 = sqlite_writer(db).write(simple_rows(range(3, 6)))
    with sqlite3.connect(db) as conn:  # lose one staged row of partition 1
        conn.execute("DELETE FROM _weir_staging WHERE attempt_id = ? AND seq = 2", (m1.attempt_id,))
    with pytest.raises(SinkError, match=r"partition 1 of batch 0 staged 3 rows but 2"):
        sqlite_writer(db).commit([m0, m1], 0)
    # Rolled back: partition 0's rows were not inserted, the batch is not recorded.
    assert read_sqlite_sink(str(db), "events") == []
    assert committed_sqlite_batches(str(db), "events") == []
    assert staged_sqlite_rows(db) == 5
    with pytest.raises(SinkError, match="no commit message"):
        sqlite_writer(db).commit([None, m1], 0)


def test_sqlite_refuses_a_new_query_lineage(tmp_path: Path) -> None:
    db = tmp_path / "sink.db"
    with task(batch=0, query="query-a"):
        a0 = sqlite_writer(db).write(simple_rows(range(2)))
    sqlite_writer(db).commit([a0], 0)
    with task(batch=0, query="query-b"):
        b0 = sqlite_writer(db).write(simple_rows(range(100, 102)))
    with pytest.raises(SinkError, match=r"query-a.*query-b.*new table"):
        sqlite_writer(db).commit([b0], 0)
    # Another table in the same database is another sink: its own batch ids.
    with task(batch=0, query="query-b"):
        b0_other = sqlite_writer(db, "other").write(simple_rows(range(100, 102)))
    sqlite_writer(db, "other").commit([b0_other], 0)
    assert ids(read_sqlite_sink(str(db), "events")) == [0, 1]
    assert ids(read_sqlite_sink(str(db), "other")) == [100, 101]
    assert committed_sqlite_batches(str(db), "other") == [0]


def test_sqlite_complete_mode_replaces_the_table_in_the_commit(tmp_path: Path) -> None:
    db = tmp_path / "sink.db"
    for batch, result in ((0, range(2)), (1, range(10, 13))):
        with task(batch=batch):
            message = sqlite_writer(db, overwrite=True).write(simple_rows(result))
        sqlite_writer(db, overwrite=True).commit([message], batch)
    assert ids(read_sqlite_sink(str(db), "events")) == [10, 11, 12]
    # A replay of the last batch changes nothing.
    with task(batch=1):
        message = sqlite_writer(db, overwrite=True).write(simple_rows(range(10, 13)))
    sqlite_writer(db, overwrite=True).commit([message], 1)
    assert ids(read_sqlite_sink(str(db), "events")) == [10, 11, 12]


def _stage_in_process(args: tuple[str, int]) -> SQLiteCommitMessage:
    db, partition = args
    with task(partition=partition, batch=0):
        writer = SQLiteSinkWriter(db, "events", SIMPLE, busy_timeout=30)
        return writer.write(simple_rows(range(partition * 3000, (partition + 1) * 3000)))


def test_sqlite_concurrent_writers(tmp_path: Path) -> None:
    """Several processes stage at once (as Python workers do); the busy timeout holds."""
    db = tmp_path / "sink.db"
    sqlite_writer(db)  # prepares the database (WAL) as the driver does
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        messages = pool.map(_stage_in_process, [(str(db), p) for p in range(4)])
    assert [m.rows for m in messages] == [3000] * 4
    sqlite_writer(db).commit(list(messages), 0)
    assert ids(read_sqlite_sink(str(db), "events")) == list(range(12000))
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sqlite_sink_options_are_checked(tmp_path: Path) -> None:
    db = str(tmp_path / "sink.db")
    with pytest.raises(SinkError, match="option 'table' is missing"):
        SQLiteSink({"path": db}).streamWriter(SIMPLE, False)
    with pytest.raises(SinkError, match="reserved"):
        SQLiteSink({"path": db, "table": "_weir_commits"}).streamWriter(SIMPLE, False)
    with pytest.raises(SinkError, match="busyTimeout"):
        SQLiteSink({"path": db, "table": "t", "busytimeout": "soon"}).streamWriter(SIMPLE, False)
    with pytest.raises(SinkError, match="does not exist"):
        SQLiteSink({"path": str(tmp_path / "no" / "x.db"), "table": "t"}).streamWriter(
            SIMPLE, False
        )
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE narrow (id INTEGER)")
    with pytest.raises(SinkError, match=r"no column\(s\) \['name'\]"):
        SQLiteSink({"path": db, "table": "narrow"}).streamWriter(SIMPLE, False)
    with pytest.raises(SinkError, match="no database file"):
        read_sqlite_sink(str(tmp_path / "missing.db"), "events")


# ========================================================= streaming queries (Spark)


def _input_file(directory: Path, name: str, id_range: range) -> None:
    """Write a JSON-lines input file atomically (the file source may list at any time)."""
    tmp = directory / f".{name}.tmp"
    tmp.write_text("".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in id_range))
    os.rename(tmp, directory / name)


def _run_available_now(spark: Any, source: Path, checkpoint: Path, sink: str, **opts: str) -> None:
    df = (
        spark.readStream.format("json")
        .schema("id LONG, name STRING")
        .option("maxFilesPerTrigger", 1)
        .load(str(source))
        .repartition(2)
    )
    writer = df.writeStream.format(sink).option("checkpointLocation", str(checkpoint))
    for key, value in opts.items():
        writer = writer.option(key, value)
    query = writer.trigger(availableNow=True).start()
    try:
        # Seconds normally; the bound is generous because a loaded 2-core machine can
        # take minutes for the session's first Python data source batch.
        finished = query.awaitTermination(QUERY_TIMEOUT_S)
        assert query.exception() is None, query.exception()
        assert finished, f"the query did not finish within {QUERY_TIMEOUT_S} s"
    finally:
        query.stop()


def _forget_last_spark_commit(checkpoint: Path) -> int:
    """Simulate a crash after the sink's commit but before Spark's commit log entry:
    delete the newest entry of ``<checkpoint>/commits``; Spark re-runs that batch."""
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)
    return last


@pytest.mark.spark
def test_spark_file_sink_exactly_once_across_restart_and_replay(spark: Any, tmp_path: Path) -> None:
    register_sinks(spark)
    source, checkpoint, out = tmp_path / "in", tmp_path / "chk", tmp_path / "out"
    source.mkdir()
    _input_file(source, "a.json", range(0, 20))
    _input_file(source, "b.json", range(20, 40))
    _run_available_now(spark, source, checkpoint, "weir-files", path=str(out))
    assert committed_file_batches(str(out)) == [0, 1]
    assert sorted(ids(read_file_sink(str(out)))) == list(range(40))
    manifest = json.loads((out / "batch=1" / "_manifest.json").read_text())
    assert manifest["query_id"] and len(manifest["files"]) == 2  # two partitions, two files

    replayed = _forget_last_spark_commit(checkpoint)
    # Also a dead attempt's staged file for the replayed batch (crash after write).
    orphan = out / "_staging" / f"batch={replayed}" / "part-00000-dead.jsonl"
    orphan.parent.mkdir(parents=True)
    orphan.write_text(json.dumps({"id": -1, "name": "ghost"}) + "\n")
    _input_file(source, "c.json", range(40, 55))
    _run_available_now(spark, source, checkpoint, "weir-files", path=str(out))

    assert committed_file_batches(str(out)) == [0, 1, 2]
    got = ids(read_file_sink(str(out)))
    assert sorted(got) == list(range(55)) and len(got) == len(set(got))
    assert not orphan.exists()
    # Spark's own JSON reader skips _staging and sees the batches as a partition column.
    back = spark.read.json(str(out)).select("id", "batch").collect()
    assert sorted(r["id"] for r in back) == list(range(55))
    assert {r["batch"] for r in back} == {0, 1, 2}


@pytest.mark.spark
def test_spark_file_sink_refuses_a_query_with_a_new_checkpoint(spark: Any, tmp_path: Path) -> None:
    register_sinks(spark)
    source, out = tmp_path / "in", tmp_path / "out"
    source.mkdir()
    _input_file(source, "a.json", range(5))
    _run_available_now(spark, source, tmp_path / "chk1", "weir-files", path=str(out))
    df = spark.readStream.format("json").schema("id LONG, name STRING").load(str(source))
    query = (
        df.writeStream.format("weir-files")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "chk2"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        with pytest.raises(Exception, match="new path"):
            query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        query.stop()
    assert committed_file_batches(str(out)) == [0]
    assert sorted(ids(read_file_sink(str(out)))) == list(range(5))


@pytest.mark.spark
def test_spark_sqlite_sink_exactly_once_across_restart_and_replay(
    spark: Any, tmp_path: Path
) -> None:
    register_sinks(spark)
    source, checkpoint, db = tmp_path / "in", tmp_path / "chk", tmp_path / "sink.db"
    source.mkdir()
    _input_file(source, "a.json", range(0, 30))
    _input_file(source, "b.json", range(30, 60))
    opts = {"path": str(db), "table": "events"}
    _run_available_now(spark, source, checkpoint, "weir-sqlite", **opts)
    assert committed_sqlite_batches(str(db), "events") == [0, 1]
    assert sorted(ids(read_sqlite_sink(str(db), "events"))) == list(range(60))

    _forget_last_spark_commit(checkpoint)
    _input_file(source, "c.json", range(60, 70))
    _run_available_now(spark, source, checkpoint, "weir-sqlite", **opts)

    got = ids(read_sqlite_sink(str(db), "events"))
    assert sorted(got) == list(range(70)) and len(got) == len(set(got))
    assert committed_sqlite_batches(str(db), "events") == [0, 1, 2]
    assert staged_sqlite_rows(db) == 0
    with sqlite3.connect(db) as conn:
        queries = {r[0] for r in conn.execute("SELECT query_id FROM _weir_commits")}
    assert len(queries) == 1 and None not in queries  # one lineage, id carried to commit


@pytest.fixture(autouse=True)
def _no_task_context_leaks() -> Iterator[None]:
    """A test must never leave a fake TaskContext behind (SparkContext refuses to start)."""
    yield
    assert TaskContext.get() is None
