"""Two-phase-commit sinks of the continuous runtime under the concurrency a restore
creates: every keyed subtask commits every recovered committable (union state), at the
same time; each transaction must land exactly once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from weir.api.connectors import Sink
from weir.connectors.stream import FileSink, SqliteSink, read_sqlite_stream_sink, read_stream_sink


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
    writer = sink.writer(0, 1, 0)
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
    writer = sink.writer(0, 1, 0)
    names = []
    for n in range(30):
        writer.write(n)
        names.append(writer.prepare_commit(n + 1))
    commit_from_four_threads(sink, names)
    assert read_stream_sink(tmp_path / "out") == list(range(30))
