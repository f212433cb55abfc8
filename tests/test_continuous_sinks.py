"""Two-phase-commit sinks of the continuous runtime under the concurrency a restore
creates: every keyed subtask commits every recovered committable (union state), at the
same time; each transaction must land exactly once. And runs: a job resumed from a
savepoint into the same sink never overwrites what an earlier run committed."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from weir.api.connectors import Sink, SinkContext
from weir.connectors.stream import FileSink, SqliteSink, read_sqlite_stream_sink, read_stream_sink

CONTEXT = SinkContext("1000run", 0, 1, 0)


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
            (SqliteSink(tmp_path / "out.db"),
             lambda: read_sqlite_stream_sink(tmp_path / "out.db"))]


@pytest.mark.parametrize("kind", [0, 1], ids=["file", "sqlite"])
def test_a_second_run_adds_to_what_the_first_committed_and_drops_its_leftovers(
    tmp_path: Path, kind: int
) -> None:
    sink, read = sinks(tmp_path)[kind]
    first = SinkContext("1000aaaaaa", 0, 1, 0)
    writer = sink.writer(first)
    writer.write("a")
    sink.commit([writer.prepare_commit(1)])
    writer.write("left open by the first run")  # (it stopped without committing this)
    writer.prepare_commit(2)
    writer.close()
    second = SinkContext("2000bbbbbb", 0, 1, 0)  # restored: attempt 0 again
    other = sink.writer(SinkContext("2000bbbbbb", 1, 2, 0))  # a subtask already writing
    other.write("c")
    sink.abort_attempts(second, keep=[])
    writer = sink.writer(second)
    writer.write("b")
    sink.commit([writer.prepare_commit(1), other.prepare_commit(1)])
    assert sorted(read()) == ["a", "b", "c"]
