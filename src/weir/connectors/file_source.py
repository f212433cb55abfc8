"""A replayable file source for the continuous runtime (:mod:`weir.stream`): bounded,
or watching a directory for new files.

:class:`FileSource` reads a directory (every regular file directly in it whose name does
not start with ``.`` or ``_``, sorted by name) or a single file, as JSON lines
(``format="jsonl"``: each non-empty line through :func:`json.loads`) or as text
(``format="text"``: each line as a ``str`` without its line ending).

A split is one file; its position is ``[name, offset]``: the file's name relative to the
directory and the byte offset of its next unread line. On a fresh start subtask ``i`` of
``p`` takes the sorted files ``i, i+p, i+2p, …``; on restore a reader takes exactly the
positions it is given (files of other former subtasks too, at any parallelism). Offsets
advance line by line, so the positions reported between two polls are exact: a restore
from them yields exactly the records not returned yet. A file read to its end keeps its
position at its end offset, so a restore does not read it again. A last line without
``\\n`` counts as a line. A reader holds at most one file open at a time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import mmh3

from weir.api.connectors import Source, SourceReader
from weir.errors import ConfigurationError, SourceError

__all__ = ["FileSource"]

FORMATS = ("jsonl", "text")

_SKIP = object()  # what a line that is no record (a blank JSON line) parses to


def _parse_jsonl(line: bytes) -> Any:
    text = line.decode("utf-8")
    if not text.strip():
        return _SKIP
    return json.loads(text)


def _parse_text(line: bytes) -> Any:
    if line.endswith(b"\n"):
        line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
    return line.decode("utf-8")


_PARSERS: dict[str, Callable[[bytes], Any]] = {"jsonl": _parse_jsonl, "text": _parse_text}


class _FileReader(SourceReader[Any]):
    def __init__(self, directory: Path, format: str, positions: list[Any]) -> None:
        self._directory = directory
        self._format = format
        self._parse = _PARSERS[format]
        self._positions: list[list[Any]] = [[str(p[0]), int(p[1]), *p[2:]]
                                            for p in positions]
        self._current = 0  # the positions before it are read to their end
        self._file: IO[bytes] | None = None

    def _open(self, name: str, offset: int) -> IO[bytes]:
        path = self._directory / name
        try:
            f = open(path, "rb")  # noqa: SIM115 (kept open across polls; closed in close)
        except OSError as exc:
            raise SourceError(
                f"FileSource cannot open {str(path)!r} to read from byte offset {offset}: "
                f"{exc.strerror or exc} (was it moved or deleted since the checkpoint?)"
            ) from exc
        f.seek(offset)
        return f

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _line_number(self, f: IO[bytes], offset: int) -> int:
        f.seek(0)
        number, remaining = 1, offset
        while remaining > 0:
            chunk = f.read(min(remaining, 1 << 20))
            if not chunk:
                break
            number += chunk.count(b"\n")
            remaining -= len(chunk)
        return number

    def poll(self, max_records: int) -> list[Any] | None:
        out: list[Any] = []
        while len(out) < max_records and self._current < len(self._positions):
            position = self._positions[self._current]
            name, offset = position[0], position[1]
            if len(position) > 2:  # (watching: read to its end before)
                self._current += 1
                continue
            if self._file is None:
                self._file = self._open(name, offset)
            line = self._file.readline()
            if not line:  # its end: the position stays at the end offset
                self._close_file()
                self._finished(position)
                self._current += 1
                continue
            try:
                record = self._parse(line)
            except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ones
                number = self._line_number(self._file, offset)
                self._close_file()
                raise SourceError(
                    f"FileSource cannot parse line {number} (byte offset {offset}) of "
                    f"{str(self._directory / name)!r} as {self._format}: {exc}") from exc
            position[1] = offset + len(line)
            if record is not _SKIP:
                out.append(record)
        if not out and self._current >= len(self._positions):
            return None
        return out

    def _finished(self, position: list[Any]) -> None:
        """``position``'s file was read to its end."""

    def positions(self) -> list[Any]:
        return [list(p) for p in self._positions]

    def close(self) -> None:
        self._close_file()


def owner(name: str, parallelism: int) -> int:
    """The subtask of ``parallelism`` that reads file ``name`` in watching mode."""
    return mmh3.hash(name.encode("utf-8"), signed=False) % parallelism


class _WatchingReader(_FileReader):
    def __init__(self, source: FileSource, subtask: int, parallelism: int,
                 positions: list[Any] | None, interval_s: float) -> None:
        mine = [p for p in positions or () if owner(str(p[0]), parallelism) == subtask]
        super().__init__(source.directory, source.format, mine)
        self._source, self._subtask, self._parallelism = source, subtask, parallelism
        self._interval_s = interval_s
        self._next_scan = 0.0  # at once

    def _finished(self, position: list[Any]) -> None:
        position.append(True)

    def _scan(self) -> None:
        taken = {p[0] for p in self._positions}
        self._positions.extend(
            [name, 0] for name in self._source.files()
            if name not in taken and owner(name, self._parallelism) == self._subtask)

    def poll(self, max_records: int) -> list[Any] | None:
        now = time.monotonic()
        if now >= self._next_scan:
            self._scan()
            self._next_scan = now + self._interval_s
        out = super().poll(max_records)
        if out is None:  # everything found so far is read: wait a little (never ends)
            time.sleep(min(0.01, max(self._next_scan - now, 0.0)))
            return []
        return out


class FileSource(Source[Any]):
    """A replayable source of the lines of a directory's files or of one file, bounded
    or watching the directory for new files (see the module doc).

    :param path: a directory (its regular files whose names do not start with ``.`` or
        ``_``, in name order) or a single file.
    :param format: ``"jsonl"`` (each non-empty line parsed as JSON) or ``"text"`` (each
        line as a ``str``, without its ``\\n`` or ``\\r\\n``).
    :raises ConfigurationError: an unknown format, or a path that does not exist.

    A line that cannot be parsed (not JSON, not UTF-8) fails the reading subtask with a
    :class:`~weir.errors.SourceError` naming the file, the line and its byte offset.
    """

    def __init__(self, path: str | Path, format: str = "jsonl",
                 monitor_interval: float | timedelta | None = None) -> None:
        if format not in FORMATS:
            raise ConfigurationError(
                f"FileSource format must be one of {', '.join(map(repr, FORMATS))}, "
                f"got {format!r}")
        #: the directory or file read
        self.path = Path(path)
        #: ``"jsonl"`` or ``"text"``
        self.format = format
        self._check_exists()
        self._is_dir = self.path.is_dir()
        if isinstance(monitor_interval, timedelta):
            monitor_interval = monitor_interval.total_seconds()
        #: seconds between directory listings when watching; None: bounded
        self.monitor_interval = monitor_interval
        if monitor_interval is not None and (monitor_interval <= 0 or not self._is_dir):
            raise ConfigurationError(
                f"FileSource monitor_interval must be positive and its path a directory, "
                f"got {monitor_interval!r} for {str(self.path)!r}")
        #: watching: positions are restored by union (each reader keeps the files it owns)
        self.union_positions = monitor_interval is not None

    def _check_exists(self) -> None:
        if not (self.path.is_dir() or self.path.is_file()):
            raise ConfigurationError(
                f"FileSource path {str(self.path)!r} is neither a directory nor a file "
                f"(does it exist?)")

    @property
    def directory(self) -> Path:
        """The directory the positions' file names are relative to."""
        return self.path if self._is_dir else self.path.parent

    def files(self) -> list[str]:
        """The names of the files read, in order (relative to :attr:`directory`)."""
        self._check_exists()
        if not self._is_dir:
            return [self.path.name]
        return sorted(e.name for e in self.path.iterdir()
                      if e.is_file() and not e.name.startswith((".", "_")))

    def reader(self, subtask: int, parallelism: int, positions: list[Any] | None
               ) -> SourceReader[Any]:
        if self.monitor_interval is not None:
            return _WatchingReader(self, subtask, parallelism, positions,
                                   self.monitor_interval)
        if positions is None:
            positions = [[name, 0] for name in self.files()[subtask::parallelism]]
        return _FileReader(self.directory, self.format, positions)
