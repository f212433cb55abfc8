"""Two-phase-commit sinks of the continuous runtime under the concurrency a restore
creates: every keyed subtask commits every recovered committable (union state), at the
same time; each transaction must land exactly once. And runs: a job resumed from a
savepoint into the same sink never overwrites what an earlier run committed. And
neighbours: two sinks writing to one place never share a transaction or drop each
other's; a restore takes a transaction a consumer took away as committed; a place
written for one lineage of jobs is refused to another (a fresh start onto used
output)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from weir.api.connectors import Sink, SinkContext, SinkLineageError
from weir.connectors.stream import FileSink, SqliteSink, read_sqlite_stream_sink, read_stream_sink
from weir.errors import SinkError

CONTEXT = SinkContext("1000run", 0, 1, 0, uid="sink", lineage="l1")


def commit_from_four_threads(sink: Sink[Any], committables: list[Any]) -> None:
    """Four threads commit every committable, one by one, at the same time."""
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def commit() -> None:
        try:
            start.wait()
            for committable in committables:
                sink.commit([committable])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=commit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_concurrent_commits_of_the_same_sqlite_transactions_land_once(tmp_path: Path) -> None:
    sink = SqliteSink(tmp_path / "out.db", table="t")
    writer = sink.writer(CONTEXT)
    txns = []
    for n in range(30):
        writer.write({"n": n})
        txns.append(writer.prepare_commit(n + 1))
    writer.close()
    commit_from_four_threads(sink, txns)
    assert [r["n"] for r in read_sqlite_stream_sink(tmp_path / "out.db", table="t")] == list(
        range(30))


def test_concurrent_commits_of_the_same_files_land_once(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "out")
    writer = sink.writer(CONTEXT)
    names = []
    for n in range(30):
        writer.write(n)
        names.append(writer.prepare_commit(n + 1))
    commit_from_four_threads(sink, names)
    assert read_stream_sink(tmp_path / "out") == list(range(30))


def sinks(tmp_path: Path) -> list[tuple[Sink[Any], Any]]:
    return [(FileSink(tmp_path / "out"), lambda: read_stream_sink(tmp_path / "out")),
            (SqliteSink(tmp_path / "out.db", columns=["v"]),  # (a value per row: one column)
             lambda: [r["v"] for r in read_sqlite_stream_sink(tmp_path / "out.db")])]


@pytest.mark.parametrize("kind", [0, 1], ids=["file", "sqlite"])
def test_a_second_run_adds_to_what_the_first_committed_and_drops_its_leftovers(
    tmp_path: Path, kind: int
) -> None:
    sink, read = sinks(tmp_path)[kind]
    first = SinkContext("1000aaaaaa", 0, 1, 0, uid="sink", lineage="l1")
    writer = sink.writer(first)
    writer.write("a")
    sink.commit([writer.prepare_commit(1)])
    writer.write("left open by the first run")  # (it stopped without committing this)
    writer.prepare_commit(2)
    writer.close()
    second = SinkContext("2000bbbbbb", 0, 1, 0, uid="sink", lineage="l1")  # (restored:
    other = sink.writer(dataclasses.replace(second, subtask=1, parallelism=2))  # attempt 0)
    other.write("c")
    sink.abort_attempts(second, keep=[])
    writer = sink.writer(second)
    writer.write("b")
    sink.commit([writer.prepare_commit(1), other.prepare_commit(1)])
    assert sorted(read()) == ["a", "b", "c"]


# -- two sinks writing to one place


def test_two_file_sinks_in_one_directory_never_share_a_transaction(tmp_path: Path) -> None:
    """Same run, attempt and subtask; uids that are no file names: each sink's records
    land whole, in files of names a directory can hold."""
    a, b = FileSink(tmp_path / "out"), FileSink(tmp_path / "out")
    first = dataclasses.replace(CONTEXT, uid="../a b")
    second = dataclasses.replace(CONTEXT, uid="../a/b")  # (the same once sanitized)
    wa, wb = a.writer(first), b.writer(second)
    for n in range(100):  # (both transactions open at once)
        wa.write(["a", n])
        wb.write(["b", n])
    ca, cb = wa.prepare_commit(1), wb.prepare_commit(1)
    a.commit([ca])
    b.commit([cb])
    expected = [["a", n] for n in range(100)] + [["b", n] for n in range(100)]
    assert sorted(read_stream_sink(tmp_path / "out")) == sorted(expected)
    names = [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("part-")]
    assert len(names) == 2 and all("/" not in n and " " not in n for n in names)


def test_two_sqlite_sinks_on_one_table_never_share_a_transaction(tmp_path: Path) -> None:
    db = tmp_path / "out.db"
    a, b = SqliteSink(db, table="t", columns=["v"]), SqliteSink(db, table="t", columns=["v"])
    wa = a.writer(dataclasses.replace(CONTEXT, uid="a"))
    wb = b.writer(dataclasses.replace(CONTEXT, uid="b"))
    wa.write("a")
    a.commit([wa.prepare_commit(1)])
    wb.write("b")  # (its transaction is the same id unless the uid is in it)
    b.commit([wb.prepare_commit(1)])
    assert sorted(r["v"] for r in read_sqlite_stream_sink(db, table="t")) == ["a", "b"]


@pytest.mark.parametrize("kind", [0, 1], ids=["file", "sqlite"])
def test_a_restarting_sink_drops_only_its_own_leftovers(tmp_path: Path, kind: int) -> None:
    """Sink ``b`` restarts (attempt 1) before sink ``a`` of the same job has committed
    what its checkpoint holds: ``b`` drops its own transaction left open, never ``a``'s."""
    a, read = sinks(tmp_path)[kind]
    b, _ = sinks(tmp_path)[kind]
    old_a = dataclasses.replace(CONTEXT, uid="a")
    old_b = dataclasses.replace(CONTEXT, uid="b")
    wa, wb = a.writer(old_a), b.writer(old_b)
    wa.write("a: in a's checkpoint")
    held = wa.prepare_commit(1)
    wb.write("b: left open")
    wb.close()
    b.abort_attempts(dataclasses.replace(old_b, attempt=1), keep=[])
    a.commit_after_recovery([held])
    a.abort_attempts(dataclasses.replace(old_a, attempt=1), keep=[held])
    assert read() == ["a: in a's checkpoint"]
    assert left_open(tmp_path, kind) == 0  # (b's is gone)


def left_open(tmp_path: Path, kind: int) -> int:
    """How many transactions of ``sinks(tmp_path)[kind]`` are prepared or open."""
    if kind == 0:
        return len(list((tmp_path / "out" / ".pending").iterdir()))
    conn = sqlite3.connect(tmp_path / "out.db")
    try:
        return int(conn.execute("SELECT count(DISTINCT txn) FROM records_staging").fetchone()[0])
    finally:
        conn.close()


# -- a consumer takes committed files away


def test_a_restore_takes_a_transaction_taken_away_as_committed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    sink = FileSink(out)
    writer = sink.writer(CONTEXT)
    committables = []
    for n in range(3):
        writer.write(n)
        committables.append(writer.prepare_commit(n + 1))
    sink.commit(committables[:2])
    taken = out / f"part-{committables[0][1]}"
    taken.rename(tmp_path / "consumed.jsonl")  # (a file-drop consumer took it)
    with caplog.at_level(logging.WARNING, logger="weir"):
        sink.commit_after_recovery(committables)  # the checkpoint held all three
        sink.commit_after_recovery(committables)  # (and again: idempotent)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2 and all(str(taken) in w for w in warned), warned
    assert read_stream_sink(out) == [1, 2]  # the one taken away is not written again
    assert not list((out / ".pending").iterdir())


def test_a_commit_whose_pending_file_vanished_raises(tmp_path: Path) -> None:
    """A commit after a checkpoint completes, of this attempt's own transaction, is no
    restore: its pending file gone means its records are lost, and it says so."""
    sink = FileSink(tmp_path / "out")
    writer = sink.writer(CONTEXT)
    writer.write(1)
    directory, name = writer.prepare_commit(1)
    (tmp_path / "out" / ".pending" / name).unlink()
    with pytest.raises(SinkError, match="neither pending") as raised:
        sink.commit([[directory, name]])
    assert str(tmp_path / "out" / ".pending" / name) in str(raised.value)


# -- lineage: a place written for one lineage of jobs is refused to another


@pytest.mark.parametrize("kind", [0, 1], ids=["file", "sqlite"])
def test_a_sink_is_refused_to_another_lineage(tmp_path: Path, kind: int) -> None:
    sink, read = sinks(tmp_path)[kind]
    owner = dataclasses.replace(CONTEXT, lineage="lineage-one")
    sink.claim(owner)
    writer = sink.writer(owner)
    writer.write("first")
    sink.commit([writer.prepare_commit(1)])
    # the same lineage, in a later run (a restore) and another subtask: accepted
    sink.claim(dataclasses.replace(owner, run_id="2000run", subtask=1, parallelism=2))
    fresh = dataclasses.replace(owner, run_id="3000run", lineage="lineage-two")
    with pytest.raises(SinkLineageError) as refused:
        sink.claim(fresh)
    message = str(refused.value)
    where = str(tmp_path / "out") if kind == 0 else str(tmp_path / "out.db")
    assert where in message and "'lineage-one'" in message and "'lineage-two'" in message
    assert "delete" in message and "new" in message
    assert isinstance(refused.value, SinkError)
    assert read() == ["first"]


@pytest.mark.parametrize("kind", [0, 1], ids=["file", "sqlite"])
def test_subtasks_of_two_lineages_claiming_at_once_agree_on_one(
    tmp_path: Path, kind: int
) -> None:
    """Eight subtasks open at the same moment on a place nobody owns yet, four of each
    lineage: the first to record wins, all four of its subtasks are accepted and the
    other four refused; the record is whole."""
    outcomes: dict[str, list[str]] = {"one": [], "two": []}
    start = threading.Barrier(8)

    def claim(lineage: str, subtask: int) -> None:
        sink, _ = sinks(tmp_path)[kind]
        start.wait()
        try:
            sink.claim(dataclasses.replace(CONTEXT, subtask=subtask, parallelism=8,
                                           lineage=lineage))
            outcomes[lineage].append("accepted")
        except SinkLineageError:
            outcomes[lineage].append("refused")

    threads = [threading.Thread(target=claim, args=("one" if i % 2 else "two", i))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sorted(v) for v in outcomes.values()) == [
        ["accepted"] * 4, ["refused"] * 4], outcomes
    winner = next(k for k, v in outcomes.items() if v == ["accepted"] * 4)
    if kind == 0:
        marker = json.loads((tmp_path / "out" / "_lineage.json").read_text())
        assert marker["lineage"] == winner
        assert os.listdir(tmp_path / "out") == ["_lineage.json"]  # (no temporary left)


def test_an_unreadable_lineage_record_is_an_error_that_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "_lineage.json").write_text("{not json")
    with pytest.raises(SinkError, match="cannot be read") as raised:
        FileSink(tmp_path / "out").claim(CONTEXT)
    assert f"delete {tmp_path / 'out' / '_lineage.json'}" in str(raised.value)
