"""weir.connectors.FileSource: a bounded, replayable source of JSON-lines or text files.
Subtasks split the files; the positions reported between polls restore exactly the
records not read yet, at any parallelism; bad input and bad settings fail clearly."""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle

import weir
from weir.api.connectors import SourceReader
from weir.connectors import FileSink, FileSource, read_stream_sink
from weir.errors import ConfigurationError, SourceError
from weir.stream import CheckpointConfig, StreamEnvironment


def drain(reader: SourceReader[Any], batch: int = 3) -> list[Any]:
    out: list[Any] = []
    while (records := reader.poll(batch)) is not None:
        assert records, "a bounded file source returns records or None, never []"
        out.extend(records)
    return out


def even_split(positions: list[Any], parallelism: int) -> list[list[Any]]:
    """``positions`` cut into ``parallelism`` contiguous chunks, the first ones one
    longer (how the runtime redistributes a source's positions on restore)."""
    base, extra = divmod(len(positions), parallelism)
    chunks, start = [], 0
    for k in range(parallelism):
        size = base + (1 if k < extra else 0)
        chunks.append(positions[start:start + size])
        start += size
    return chunks


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


def test_jsonl_reads_the_directory_s_visible_files_in_name_order(tmp_path: Path) -> None:
    write(tmp_path / "b.jsonl", '{"n": 3}\n\n{"n": 4}\n')
    write(tmp_path / "a.jsonl", '{"n": 1}\n  \n[2, "two"]\n')
    write(tmp_path / ".hidden", '{"n": -1}\n')
    write(tmp_path / "_SUCCESS", "")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "c.jsonl", '{"n": -2}\n')
    source = FileSource(tmp_path)
    assert source.files() == ["a.jsonl", "b.jsonl"]
    reader = source.reader(0, 1, None)
    assert drain(reader, 10) == [{"n": 1}, [2, "two"], {"n": 3}, {"n": 4}]
    assert reader.poll(10) is None
    assert reader.positions() == [["a.jsonl", 23], ["b.jsonl", 19]]  # their sizes


def test_text_gives_each_line_without_its_ending(tmp_path: Path) -> None:
    file = write(tmp_path / "log.txt", "first\n\nthird \r\nlast, no newline")
    reader = FileSource(str(file), format="text").reader(0, 1, None)
    assert reader.poll(2) == ["first", ""]
    assert reader.positions() == [["log.txt", 7]]
    assert reader.poll(10) == ["third ", "last, no newline"]
    assert reader.poll(10) is None
    assert reader.positions() == [["log.txt", file.stat().st_size]]


def test_a_last_line_without_newline_counts_and_its_end_offset_is_kept(tmp_path: Path) -> None:
    file = write(tmp_path / "one.jsonl", '{"a": 1}\n{"a": 2}')
    reader = FileSource(file).reader(0, 1, None)
    assert reader.poll(1) == [{"a": 1}]
    assert reader.positions() == [["one.jsonl", 9]]
    assert reader.poll(5) == [{"a": 2}]
    end = reader.positions()
    assert end == [["one.jsonl", file.stat().st_size]]
    assert reader.poll(5) is None
    # a restore from the end reads nothing again
    assert FileSource(file).reader(0, 1, end).poll(5) is None


def test_subtasks_split_the_sorted_files(tmp_path: Path) -> None:
    for i in range(5):
        write(tmp_path / f"f{i}.jsonl", f"{i}\n{i + 10}\n")
    source = FileSource(tmp_path)
    readers = [source.reader(i, 2, None) for i in range(2)]
    assert readers[0].positions() == [["f0.jsonl", 0], ["f2.jsonl", 0], ["f4.jsonl", 0]]
    assert readers[1].positions() == [["f1.jsonl", 0], ["f3.jsonl", 0]]
    assert drain(readers[0]) == [0, 10, 2, 12, 4, 14]
    assert drain(readers[1]) == [1, 11, 3, 13]
    assert source.reader(5, 6, None).poll(10) is None  # more subtasks than files


def test_empty_files_and_an_empty_directory(tmp_path: Path) -> None:
    write(tmp_path / "a", "")
    write(tmp_path / "b", "")
    reader = FileSource(tmp_path).reader(0, 1, None)
    assert reader.poll(10) is None
    assert reader.positions() == [["a", 0], ["b", 0]]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert FileSource(empty, format="text").reader(0, 1, None).poll(10) is None
    assert FileSource(tmp_path).reader(0, 1, []).poll(10) is None  # restored with nothing


def test_bad_json_names_the_file_the_line_and_the_offset(tmp_path: Path) -> None:
    write(tmp_path / "a.jsonl", '{"ok": 1}\n')
    bad = write(tmp_path / "b.jsonl", '{"ok": 2}\n\n{"ok": 3\n{"ok": 4}\n')
    reader = FileSource(tmp_path).reader(0, 1, None)
    assert reader.poll(2) == [{"ok": 1}, {"ok": 2}]
    with pytest.raises(SourceError, match=r"line 3 \(byte offset 11\)") as info:
        reader.poll(10)
    assert str(bad) in str(info.value)
    assert isinstance(info.value, weir.WeirError)
    assert isinstance(info.value.__cause__, json.JSONDecodeError)
    # the position stays at the bad line: a restore meets it again
    assert reader.positions() == [["a.jsonl", 10], ["b.jsonl", 11]]
    reader.close()


def test_bad_utf8_is_a_source_error(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_bytes(b"fine\n\xff\xfe\n")
    reader = FileSource(tmp_path, format="text").reader(0, 1, None)
    with pytest.raises(SourceError, match=r"line 2 \(byte offset 5\).*t\.txt"):
        reader.poll(10)


def test_bad_settings_are_configuration_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"'jsonl', 'text'.*'csv'"):
        FileSource(tmp_path, format="csv")
    with pytest.raises(ConfigurationError, match=r"nope.*neither a directory nor a file"):
        FileSource(tmp_path / "nope")


def test_a_file_gone_since_the_checkpoint_is_a_source_error(tmp_path: Path) -> None:
    reader = FileSource(tmp_path).reader(0, 1, [["gone.jsonl", 42]])
    with pytest.raises(SourceError, match=r"gone\.jsonl.*offset 42.*moved or deleted"):
        reader.poll(1)


def test_close_releases_the_open_file(tmp_path: Path) -> None:
    write(tmp_path / "a.jsonl", "1\n2\n3\n")
    reader = FileSource(tmp_path).reader(0, 1, None)
    assert reader.poll(1) == [1]
    assert reader._file is not None  # type: ignore[attr-defined]
    reader.close()
    assert reader._file is None  # type: ignore[attr-defined]
    reader.close()  # twice is fine


FILES = st.lists(
    st.tuples(st.lists(st.booleans(), max_size=12),  # lines: True = a record, False = blank
              st.booleans()),                         # ends with "\n"
    max_size=7)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=FILES, text=st.booleans(), before=st.integers(1, 4), after=st.integers(1, 5),
       data=st.data())
def test_positions_after_any_poll_restore_exactly_the_rest(
    files: list[tuple[list[bool], bool]], text: bool, before: int, after: int,
    data: st.DataObject,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        expected: list[Any] = []
        for f, (lines, newline) in enumerate(files):
            rendered = []
            for n, is_record in enumerate(lines):
                record: Any = f"f{f}-l{n} é" if text else {"f": f, "l": n, "s": "é"}
                if is_record or text:
                    expected.append(record)
                    rendered.append(record if text else json.dumps(record, ensure_ascii=False))
                else:
                    rendered.append(" ")
            body = "\n".join(rendered) + ("\n" if newline and rendered else "")
            write(directory / f"part-{f:03d}", body)
        source = FileSource(directory, format="text" if text else "jsonl")

        read: list[Any] = []
        checkpointed: list[Any] = []
        for subtask in range(before):
            reader = source.reader(subtask, before, None)
            for _ in range(data.draw(st.integers(0, 6), label="polls")):
                records = reader.poll(data.draw(st.integers(1, 4), label="max_records"))
                if records is None:
                    break
                read.extend(records)
            checkpointed.extend(reader.positions())
            reader.close()

        # through msgpack, as a checkpoint stores them; then even split at another parallelism
        restored = msgpack.unpackb(msgpack.packb(checkpointed))
        for subtask, share in enumerate(even_split(restored, after)):
            reader = source.reader(subtask, after, share)
            read.extend(drain(reader, data.draw(st.integers(1, 5), label="batch")))
            reader.close()

        key = (lambda r: r) if text else json.dumps
        assert Counter(map(key, read)) == Counter(map(key, expected))
        assert len(read) == len(expected)


class CountPerKey(weir.KeyedProcessFunction[dict[str, Any], list[Any]]):
    """A running count per key, emitted with each record."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(weir.ValueStateDescriptor[int]("count", weir.IntSerializer()))

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield [ctx.current_key, value["i"], n]


@pytest.fixture
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.usefixtures("_by_value")
def test_a_job_reads_a_directory_end_to_end(tmp_path: Path) -> None:
    data = tmp_path / "in"
    data.mkdir()
    i = 0
    for f in range(5):
        with open(data / f"events-{f}.jsonl", "w", encoding="utf-8") as out:
            for _ in range(200 + 37 * f):
                out.write(json.dumps({"key": f"k{i % 7}", "i": i}) + "\n")
                i += 1
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=16,
                                           state_backend="hashmap",
                                           checkpointing=CheckpointConfig(interval=50)))
    (env.from_source(FileSource(data), uid="files")
        .key_by(lambda r: r["key"])
        .process(CountPerKey(), uid="count")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    result = env.execute("file-counts", timeout=60)
    assert result.completed and result.restarts == 0
    out = read_stream_sink(tmp_path / "out")
    assert sorted(r[1] for r in out) == list(range(i))
    expected = Counter(f"k{n % 7}" for n in range(i))
    for key, total in expected.items():
        assert sorted(n for k, _, n in out if k == key) == list(range(1, total + 1))


# ---------------------------------------------------------------------- watching


def poll_all(readers: list[SourceReader[Any]], batch: int, rounds: int = 3) -> list[Any]:
    """Poll every (watching) reader until ``rounds`` polls in a row gave nothing."""
    out: list[Any] = []
    quiet = 0
    while quiet < rounds:
        got = [r.poll(batch) for r in readers]
        assert all(g is not None for g in got), "a watching source never ends"
        new = [x for g in got for x in g or ()]
        out.extend(new)
        quiet = 0 if new else quiet + 1
    return out


def test_watching_takes_new_files_its_subtask_owns(tmp_path: Path) -> None:
    from weir.connectors.file_source import owner

    source = FileSource(tmp_path, monitor_interval=1e-6)
    readers = [source.reader(i, 2, None) for i in range(2)]
    assert poll_all(readers, 10) == []
    for f in range(6):
        write(tmp_path / f".f{f}", json.dumps({"f": f}) + "\n")
        (tmp_path / f".f{f}").rename(tmp_path / f"f{f}")  # complete when it appears
    assert sorted(r["f"] for r in poll_all(readers, 10)) == list(range(6))
    for i, reader in enumerate(readers):
        assert all(owner(p[0], 2) == i and p[2:] == [True] for p in reader.positions())
    write(tmp_path / "f0", json.dumps({"f": 0}) + "\n" + json.dumps({"f": 99}) + "\n")
    assert poll_all(readers, 10) == []  # read once: what is added later is not seen


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(st.integers(0, 5), max_size=6), later=st.lists(st.integers(0, 5),
       max_size=6), before=st.integers(1, 4), after=st.integers(1, 5), data=st.data())
def test_watching_positions_restore_by_union_at_any_parallelism(
    first: list[int], later: list[int], before: int, after: int, data: st.DataObject
) -> None:
    """Files appear before and after a checkpoint taken mid-read; files read to their
    end are then deleted; restored at another parallelism (every reader gets every
    position), every line of every file is read exactly once."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        expected: list[Any] = []

        def add(files: list[int], tag: str) -> None:
            for f, lines in enumerate(files):
                records = [{"file": f"{tag}{f}", "line": n} for n in range(lines)]
                expected.extend(records)
                write(directory / f"{tag}{f}", "".join(json.dumps(r) + "\n" for r in records))

        add(first, "a")
        source = FileSource(directory, monitor_interval=1e-6)
        read: list[Any] = []
        checkpointed: list[Any] = []
        for subtask in range(before):
            reader = source.reader(subtask, before, None)
            for _ in range(data.draw(st.integers(0, 6), label="polls")):
                read.extend(reader.poll(data.draw(st.integers(1, 4), label="max")) or ())
            checkpointed.extend(reader.positions())
            reader.close()
        for name, _, *done in checkpointed:
            if done:
                (directory / name).unlink()  # read: may go
        add(later, "b")
        restored = msgpack.unpackb(msgpack.packb(checkpointed))
        readers = [source.reader(i, after, restored) for i in range(after)]
        read.extend(poll_all(readers, data.draw(st.integers(1, 5), label="batch")))
        assert sorted(map(json.dumps, read)) == sorted(map(json.dumps, expected))


def test_watching_needs_a_directory_and_a_positive_interval(tmp_path: Path) -> None:
    file = write(tmp_path / "one.jsonl", "{}\n")
    with pytest.raises(ConfigurationError, match="monitor_interval"):
        FileSource(file, monitor_interval=1.0)
    with pytest.raises(ConfigurationError, match="monitor_interval"):
        FileSource(tmp_path, monitor_interval=0)
    from datetime import timedelta

    assert FileSource(tmp_path, monitor_interval=timedelta(milliseconds=250)
                      ).monitor_interval == 0.25


@pytest.mark.usefixtures("_by_value")
def test_a_job_watches_a_directory_and_resumes_at_another_parallelism(tmp_path: Path) -> None:
    """Files dropped into a watched directory while the job runs are counted; a
    stop-with-savepoint, more files, and a resume at p = 3 count each record once."""
    import time

    from weir.connectors import CollectSink

    data = tmp_path / "in"
    data.mkdir()
    total = [0]

    def drop(files: int) -> None:
        for _ in range(files):
            name = f"events-{total[0]:06d}.jsonl"
            with open(data / f".{name}", "w", encoding="utf-8") as out:
                for _ in range(50):
                    out.write(json.dumps({"key": f"k{total[0] % 7}", "i": total[0]}) + "\n")
                    total[0] += 1
            (data / f".{name}").rename(data / name)

    def run(parallelism: int, name: str, restore_from: Any = None) -> Any:
        env = StreamEnvironment(weir.JobConfig(tmp_path / f"chk-{name}", parallelism=parallelism,
                                               max_parallelism=16,
                                               checkpointing=CheckpointConfig(interval=50)))
        (env.from_source(FileSource(data, monitor_interval=0.02), uid="files")
            .key_by(lambda r: r["key"])
            .process(CountPerKey(), uid="count")
            .sink_to(CollectSink(tmp_path / "out.db", key=lambda r: r[1]), uid="sink"))
        return env.execute_async(name, restore_from=restore_from)

    def until_all(sink: Any) -> None:
        deadline = time.monotonic() + 60
        while len(sink.collected()) < total[0]:
            assert time.monotonic() < deadline, (len(sink.collected()), total[0])
            time.sleep(0.02)

    sink = CollectSink(tmp_path / "out.db", key=lambda r: r[1])
    client = run(2, "first")
    drop(3)
    until_all(sink)
    drop(4)
    until_all(sink)
    savepoint = client.stop_with_savepoint(tmp_path / "sp")
    drop(5)
    resumed = run(3, "resumed", savepoint)
    until_all(sink)
    drop(2)
    until_all(sink)
    resumed.cancel()
    out = sink.collected()
    assert sorted(out) == list(range(total[0]))  # every record, once per i
    expected = Counter(f"k{n % 7}" for n in range(total[0]))
    for key, count in expected.items():  # counts went on from the savepoint: 1..count
        assert sorted(n for k, _, n in out.values() if k == key) == list(range(1, count + 1))
