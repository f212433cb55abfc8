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
    env = StreamEnvironment(parallelism=2, state_backend="hashmap", max_parallelism=16,
                            checkpoint_storage=tmp_path / "chk",
                            checkpointing=CheckpointConfig(interval_ms=50))
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
