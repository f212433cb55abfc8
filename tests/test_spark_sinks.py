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
import shutil
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


def commit_file_batch(
    out: Path, batch: int, rows: range, query: str | None = "query-a", partitions: int = 2
) -> list[FileCommitMessage]:
    """Stage ``rows`` over ``partitions`` tasks of ``batch`` (empty ones for an empty
    range) and return the messages; commit them with :func:`file_writer`."""
    messages = []
    for partition in range(partitions):
        with task(partition=partition, batch=batch, query=query):
            part = range(rows.start + partition, rows.stop, partitions)
            messages.append(file_writer(out).write(simple_rows(part)))
    return messages


def snapshot(root: Path) -> dict[str, tuple[bool, int, int]]:
    """Every entry under ``root`` and ``root`` itself: (is a directory, size, mtime in
    ns). Anything written, created, renamed or deleted changes it."""
    found = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.stat()
        found[str(path.relative_to(root))] = (path.is_dir(), st.st_size, st.st_mtime_ns)
    return found


@contextmanager
def recorded_listings(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """Record every directory listed in this process (``os.scandir``/``os.listdir``:
    also ``Path.iterdir``/``glob``/``rglob``, ``os.walk`` and ``shutil.rmtree``)."""
    listed: list[Path] = []
    real_scandir, real_listdir = os.scandir, os.listdir

    def where(path: Any) -> Path:
        if isinstance(path, int):  # shutil.rmtree lists through directory fds
            return Path(os.readlink(f"/proc/self/fd/{path}"))
        return Path(os.fsdecode(path)).resolve()

    def scandir(path: Any = ".") -> Any:
        listed.append(where(path))
        return real_scandir(path)

    def listdir(path: Any = ".") -> list[Any]:
        listed.append(where(path))
        return real_listdir(path)

    with monkeypatch.context() as patch:
        patch.setattr(os, "scandir", scandir)
        patch.setattr(os, "listdir", listdir)
        yield listed


class Crash(BaseException):
    """A simulated crash: the process stops at a filesystem step (nothing catches it)."""


#: the filesystem steps a commit can crash between (``shutil.rmtree`` and
#: ``Path.mkdir``/``unlink`` go through ``os`` and crash inside too)
_STEPS = (
    (os, "mkdir"), (os, "rename"), (os, "replace"), (os, "fsync"),
    (os, "unlink"), (os, "rmdir"), (os, "open"), (shutil, "rmtree"),
)  # fmt: skip


@contextmanager
def crash_at_step(monkeypatch: pytest.MonkeyPatch, step: int) -> Iterator[list[str]]:
    """Raise :class:`Crash` instead of the ``step``-th filesystem step (0-based); the
    yielded list names the steps taken before it."""
    taken: list[str] = []
    with monkeypatch.context() as patch:
        for module, name in _STEPS:
            real = getattr(module, name)

            def step_or_crash(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                if len(taken) == step:
                    raise Crash(f"crash before step {step} ({_name}) after {taken}")
                taken.append(_name)
                return _real(*args, **kw)

            patch.setattr(module, name, step_or_crash)
        yield taken


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
    """Killed after moving the staged files into the temp directory
    ``_publishing/batch=7/<uuid>/``, before the rename that publishes it: nothing
    visible; the replay publishes once and removes the temp directory."""
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
            if path.parent == sinks._local_root({str(tmp_path)!r}) / "_publishing" / "batch=7":
                os.kill(os.getpid(), signal.SIGKILL)
        sinks._fsync_dir = crash_before_publish
        w.commit([m], 7)
        """
    )
    assert result.returncode == -9, result.stderr
    (tmp_dir,) = (tmp_path / "_publishing" / "batch=7").iterdir()
    assert (tmp_dir / "_manifest.json").is_file()  # complete, but not published
    assert read_file_sink(str(tmp_path)) == [] and committed_file_batches(str(tmp_path)) == []
    with task(batch=7):
        replay = file_writer(tmp_path).write(simple_rows(range(5)))
    file_writer(tmp_path).commit([replay], 7)
    assert ids(read_file_sink(str(tmp_path))) == list(range(5))
    assert not tmp_dir.parent.exists()


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


def test_file_empty_batch_writes_nothing(tmp_path: Path) -> None:
    """A heartbeat source gives a (mostly empty) batch per second: an empty batch, its
    replays and its abort leave no batch directory and no staging leftovers, and
    change nothing at all once the path exists."""
    out = tmp_path / "out"
    # The first commit on a fresh path creates it with its lineage record only.
    file_writer(out).commit(commit_file_batch(out, 0, range(0)), 0)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["_lineage.json"]
    assert committed_file_batches(str(out)) == [] and read_file_sink(str(out)) == []

    file_writer(out).commit(commit_file_batch(out, 1, range(4)), 1)
    before = snapshot(out)
    for _ in range(2):  # the batch, then its replay (a new attempt)
        file_writer(out).commit(commit_file_batch(out, 2, range(0)), 2)
    file_writer(out).abort([None, None], 3)
    file_writer(out).commit(commit_file_batch(out, 3, range(0)), 3)
    file_writer(out).commit([], 4)  # a batch without tasks
    assert snapshot(out) == before
    assert committed_file_batches(str(out)) == [1]  # empty batches are not listed
    assert sorted(ids(read_file_sink(str(out)))) == [0, 1, 2, 3]


def test_file_commit_never_lists_the_sink_or_reads_manifests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commit work must not grow with the number of past batches. With 10,000 past
    batch directories (without manifests: reading one fails), committing a batch, its
    replay, an empty batch and refusing another query's batch never list the sink's
    directory; they list only the committed batch's own staging and publishing
    directories."""
    out = tmp_path / "out"
    file_writer(out).commit(commit_file_batch(out, 0, range(2)), 0)
    for batch in range(1, 10_001):
        (out / f"batch={batch}").mkdir()
    new = commit_file_batch(out, 10_001, range(10, 14))
    replay = commit_file_batch(out, 10_001, range(10, 14))
    empty = commit_file_batch(out, 10_002, range(0))
    other_query = commit_file_batch(out, 0, range(100, 102), query="query-b")

    with recorded_listings(monkeypatch) as listed:
        file_writer(out).commit(new, 10_001)
        file_writer(out).commit(replay, 10_001)
        file_writer(out).commit(empty, 10_002)
        with pytest.raises(SinkError, match=r"query-a.*query-b"):
            file_writer(out).commit(other_query, 0)

    root = out.resolve()
    own = (root / "_staging" / "batch=10001", root / "_publishing" / "batch=10001")
    assert own[0] in listed  # the recorder sees rmtree's listings (through an fd)
    assert root not in listed
    assert [p for p in listed if not any(p == d or d in p.parents for d in own)] == []
    assert not (out / "batch=10002").exists()
    manifest = json.loads((out / "batch=10001" / "_manifest.json").read_text())
    assert manifest["rows"] == 4 and manifest["query_id"] == "query-a"
    published = []
    for entry in manifest["files"]:
        lines = (out / "batch=10001" / entry["name"]).read_text().splitlines()
        published += [json.loads(line) for line in lines]
    assert ids(published) == [10, 12, 11, 13]  # partition order


def test_file_sink_without_lineage_record_is_scanned_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path written before lineage records existed (or whose record was deleted):
    the first commit finds the newest batch's query id in one scan and records it."""
    out = tmp_path / "out"
    for batch in range(3):
        file_writer(out).commit(commit_file_batch(out, batch, range(batch, batch + 1)), batch)
    (out / "_lineage.json").unlink()
    other_query = commit_file_batch(out, 0, range(100, 102), query="query-b")
    with pytest.raises(SinkError, match=r"query-a.*query-b.*new path"):
        file_writer(out).commit(other_query, 0)
    assert not (out / "_lineage.json").exists()  # a refused commit writes nothing

    with recorded_listings(monkeypatch) as listed:
        file_writer(out).commit(commit_file_batch(out, 3, range(3, 4)), 3)
    assert listed.count(out.resolve()) == 1
    assert json.loads((out / "_lineage.json").read_text())["query_id"] == "query-a"
    with recorded_listings(monkeypatch) as listed:
        file_writer(out).commit(commit_file_batch(out, 4, range(4, 5)), 4)
    assert out.resolve() not in listed
    assert ids(read_file_sink(str(out))) == [0, 1, 2, 3, 4]


def test_file_unreadable_lineage_record_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    file_writer(out).commit(commit_file_batch(out, 0, range(2)), 0)
    (out / "_lineage.json").write_text("{not json")
    with pytest.raises(SinkError, match=r"_lineage\.json.*delete .*_lineage\.json") as info:
        file_writer(out).commit(commit_file_batch(out, 1, range(2, 4)), 1)
    assert str(out) in str(info.value)
    assert committed_file_batches(str(out)) == [0]
    (out / "_lineage.json").unlink()  # as the message says: rebuilt by one scan
    file_writer(out).commit(commit_file_batch(out, 1, range(2, 4)), 1)
    assert ids(read_file_sink(str(out))) == [0, 1, 2, 3]


@pytest.mark.parametrize("scenario", ["first batch of a new path", "later batch", "empty batch"])
def test_file_crash_at_every_step_of_commit_is_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str
) -> None:
    """Crash the commit before each of its filesystem steps in turn (mkdir, rename,
    replace, fsync, unlink, rmdir, open, rmtree), then replay the batch as Spark does
    (a new attempt, same rows): readers never see part of the batch, the replay makes
    it visible exactly once, no leftovers stay and the path still refuses another
    query."""
    batch = 0 if scenario.startswith("first") else 2
    rows = range(0) if scenario == "empty batch" else range(10, 15)
    before = [] if batch == 0 else [0, 1]
    steps = 0
    while True:
        out = tmp_path / f"step{steps}"
        for earlier in range(batch):
            file_writer(out).commit(
                commit_file_batch(out, earlier, range(earlier, earlier + 1)), earlier
            )
        staged = commit_file_batch(out, batch, rows)
        writer = file_writer(out)
        with crash_at_step(monkeypatch, steps) as taken:
            try:
                writer.commit(staged, batch)
            except Crash:
                crashed = True
            else:
                crashed = False
        if not crashed:
            break
        visible = ids(read_file_sink(str(out))) if out.is_dir() else []
        assert sorted(visible) in (before, before + list(rows)), taken
        file_writer(out).commit(commit_file_batch(out, batch, rows), batch)  # the replay
        assert sorted(ids(read_file_sink(str(out)))) == before + list(rows), taken
        assert not (out / "_staging" / f"batch={batch}").exists(), taken
        assert not (out / "_publishing" / f"batch={batch}").exists(), taken
        assert (out / f"batch={batch}").is_dir() == bool(rows), taken
        with pytest.raises(SinkError, match="new path"):
            file_writer(out).commit(commit_file_batch(out, 0, range(1), query="query-b"), 0)
        steps += 1
    assert steps >= (2 if scenario == "empty batch" else 8)  # the loop did crash the commit


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
    # An empty result empties the table; the batch is not recorded, and its replay
    # (an empty result again) is idempotent.
    for _ in range(2):
        with task(batch=2):
            message = sqlite_writer(db, overwrite=True).write(iter([]))
        sqlite_writer(db, overwrite=True).commit([message], 2)
        assert read_sqlite_sink(str(db), "events") == []
    assert committed_sqlite_batches(str(db), "events") == [0, 1]


def sqlite_batch(
    db: Path, batch: int, rows: range, query: str | None = "query-a", overwrite: bool = False
) -> list[SQLiteCommitMessage]:
    """Stage ``rows`` over two tasks of ``batch`` and return their messages."""
    messages = []
    for partition in range(2):
        with task(partition=partition, batch=batch, query=query):
            part = range(rows.start + partition, rows.stop, 2)
            messages.append(sqlite_writer(db, overwrite=overwrite).write(simple_rows(part)))
    return messages


def db_files(db: Path) -> dict[str, bytes]:
    """The database and its WAL and shared-memory files, byte for byte (with no
    connection open, SQLite has checkpointed and removed the last two)."""
    return {p.name: p.read_bytes() for p in sorted(db.parent.glob(db.name + "*"))}


def test_sqlite_empty_batch_writes_nothing(tmp_path: Path) -> None:
    """An empty batch, its replay and its abort change no byte of the database: no
    ``_weir_commits`` row per heartbeat batch."""
    db = tmp_path / "sink.db"
    sqlite_writer(db).commit(sqlite_batch(db, 0, range(0)), 0)  # the first creates the table
    assert read_sqlite_sink(str(db), "events") == []
    assert committed_sqlite_batches(str(db), "events") == []
    sqlite_writer(db).commit(sqlite_batch(db, 1, range(3)), 1)
    before = db_files(db)
    for _ in range(2):  # the batch, then its replay
        sqlite_writer(db).commit(sqlite_batch(db, 2, range(0)), 2)
    sqlite_writer(db).abort([None, None], 3)
    sqlite_writer(db).commit(sqlite_batch(db, 3, range(0)), 3)
    sqlite_writer(db).commit([], 4)  # a batch without tasks
    assert db_files(db) == before
    assert committed_sqlite_batches(str(db), "events") == [1]  # empty batches not listed
    sqlite_writer(db).commit(sqlite_batch(db, 5, range(3, 5)), 5)
    assert ids(read_sqlite_sink(str(db), "events")) == [0, 2, 1, 3, 4]
    assert committed_sqlite_batches(str(db), "events") == [1, 5]


def _commit_vm_steps(
    monkeypatch: pytest.MonkeyPatch, db: Path, batch: int, messages: list[SQLiteCommitMessage]
) -> int:
    """SQLite virtual-machine instructions one ``commit`` executes (deterministic)."""
    import weir.connectors.sqlite as sqlite_sink

    steps = 0
    real_connect = sqlite_sink._connect

    def counting_connect(path: str, timeout: float) -> sqlite3.Connection:
        conn = real_connect(path, timeout)

        def tick() -> int:
            nonlocal steps
            steps += 1
            return 0

        conn.set_progress_handler(tick, 1)
        return conn

    writer = sqlite_writer(db)
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_sink, "_connect", counting_connect)
        writer.commit(list(messages), batch)
    return steps


def test_sqlite_commit_work_does_not_grow_with_past_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same commits (a batch, its replay, an empty batch) on a table with 10 and
    with 10,000 past batches execute (nearly) the same number of SQLite instructions,
    counted with a progress handler: deterministic, unlike a timing. The past
    batches carry no query id (committed outside Spark), which a lineage check that
    looks for the newest batch with a query id would walk back over."""
    counts = []
    for past in (10, 10_000):
        db = tmp_path / f"past{past}.db"
        sqlite_writer(db).commit(sqlite_batch(db, 0, range(2)), 0)
        with sqlite3.connect(db) as conn:
            conn.executemany(
                "INSERT INTO _weir_commits (table_name, batch_id, committed_at, row_count, "
                "query_id) VALUES ('events', ?, '2024-01-01T00:00:00', 1, NULL)",
                [(b,) for b in range(1, past + 1)],
            )
        new, empty = past + 1, past + 2
        counts.append(
            (
                _commit_vm_steps(monkeypatch, db, new, sqlite_batch(db, new, range(5, 9))),
                _commit_vm_steps(monkeypatch, db, new, sqlite_batch(db, new, range(5, 9))),
                _commit_vm_steps(monkeypatch, db, empty, sqlite_batch(db, empty, range(0))),
            )
        )
        assert ids(read_sqlite_sink(str(db), "events")) == [0, 1, 5, 7, 6, 8]
    # A deeper B-tree may cost a step or two (log n); a walk over the batches would
    # cost tens of thousands.
    assert all(large <= small + 10 for small, large in zip(*counts, strict=True)), counts


def test_sqlite_table_without_lineage_record_falls_back_once(tmp_path: Path) -> None:
    """A database written before ``_weir_lineage`` existed: the newest batch with a
    query id decides, and the next commit records it."""
    db = tmp_path / "sink.db"
    sqlite_writer(db).commit(sqlite_batch(db, 0, range(2)), 0)
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE _weir_lineage")
    with pytest.raises(SinkError, match=r"query-a.*query-b.*new table"):
        sqlite_writer(db).commit(sqlite_batch(db, 0, range(9, 10), query="query-b"), 0)
    sqlite_writer(db).commit(sqlite_batch(db, 1, range(2, 4)), 1)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT table_name, query_id FROM _weir_lineage").fetchall() == [
            ("events", "query-a")
        ]
    assert committed_sqlite_batches(str(db), "events") == [0, 1]


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


def _run_available_now(
    spark: Any, source: Path, checkpoint: Path, sink: str, where: str | None = None, **opts: str
) -> None:
    """Run the query over the new files (one per batch) until it is done; ``where``
    filters rows before the sink (a batch whose rows all fail it is empty)."""
    df = (
        spark.readStream.format("json")
        .schema("id LONG, name STRING")
        .option("maxFilesPerTrigger", 1)
        .load(str(source))
        .repartition(2)
    )
    if where is not None:
        df = df.where(where)
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


def _spark_committed(checkpoint: Path) -> list[int]:
    """The batch ids in Spark's commit log."""
    return sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


#: rows with ids >= 100 pass the filter; the files of ids below it make empty batches
KEEP = "id >= 100"


@pytest.mark.spark
def test_spark_file_sink_empty_batches_leave_nothing(spark: Any, tmp_path: Path) -> None:
    """Batches whose rows are all filtered out (a heartbeat source's usual batch) leave
    no batch directory and no staging; an empty batch replayed after a crash neither;
    and with a newer batch directory without a manifest in the path, the committing
    process (Spark's Python planner, not this one) still commits: it never reads
    another batch's manifest (a scan of the batches would, and fail)."""
    register_sinks(spark)
    source, checkpoint, out = tmp_path / "in", tmp_path / "chk", tmp_path / "out"
    source.mkdir()
    _input_file(source, "a.json", range(0, 5))  # batch 0: empty
    _input_file(source, "b.json", range(100, 104))  # batch 1: 4 rows
    _input_file(source, "c.json", range(5, 10))  # batch 2: empty
    _run_available_now(spark, source, checkpoint, "weir-files", where=KEEP, path=str(out))
    assert _spark_committed(checkpoint) == [0, 1, 2]  # the sink committed all three
    assert committed_file_batches(str(out)) == [1]
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files[:2] == ["_lineage.json", "batch=1/_manifest.json"], files
    assert all(f.startswith("batch=1/part-") for f in files[2:]) and len(files) == 4, files

    assert _forget_last_spark_commit(checkpoint) == 2  # empty batch 2 is replayed
    (out / "batch=1000000").mkdir()
    _input_file(source, "d.json", range(10, 15))  # batch 3: empty
    _input_file(source, "e.json", range(200, 203))  # batch 4: 3 rows
    _run_available_now(spark, source, checkpoint, "weir-files", where=KEEP, path=str(out))
    assert _spark_committed(checkpoint) == [0, 1, 2, 3, 4]
    (out / "batch=1000000").rmdir()
    assert committed_file_batches(str(out)) == [1, 4]
    assert sorted(ids(read_file_sink(str(out)))) == [100, 101, 102, 103, 200, 201, 202]
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert [f for f in files if not f.startswith(("batch=1/", "batch=4/"))] == ["_lineage.json"]


@pytest.mark.spark
def test_spark_sqlite_sink_empty_batches_record_nothing(spark: Any, tmp_path: Path) -> None:
    """Empty batches (and the replay of one) add no ``_weir_commits`` row."""
    register_sinks(spark)
    source, checkpoint, db = tmp_path / "in", tmp_path / "chk", tmp_path / "sink.db"
    source.mkdir()
    _input_file(source, "a.json", range(0, 5))  # batch 0: empty
    _input_file(source, "b.json", range(100, 104))  # batch 1: 4 rows
    _input_file(source, "c.json", range(5, 10))  # batch 2: empty
    opts = {"path": str(db), "table": "events"}
    _run_available_now(spark, source, checkpoint, "weir-sqlite", where=KEEP, **opts)
    assert _spark_committed(checkpoint) == [0, 1, 2]
    assert committed_sqlite_batches(str(db), "events") == [1]

    assert _forget_last_spark_commit(checkpoint) == 2
    _input_file(source, "d.json", range(200, 203))  # batch 3: 3 rows
    _run_available_now(spark, source, checkpoint, "weir-sqlite", where=KEEP, **opts)
    assert _spark_committed(checkpoint) == [0, 1, 2, 3]
    assert committed_sqlite_batches(str(db), "events") == [1, 3]
    got = ids(read_sqlite_sink(str(db), "events"))
    assert sorted(got) == [100, 101, 102, 103, 200, 201, 202]
    assert staged_sqlite_rows(db) == 0


@pytest.fixture(autouse=True)
def _no_task_context_leaks() -> Iterator[None]:
    """A test must never leave a fake TaskContext behind (SparkContext refuses to start)."""
    yield
    assert TaskContext.get() is None
