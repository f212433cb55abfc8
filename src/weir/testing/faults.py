"""A fault-injecting filesystem: crash a checkpoint at any write step.

Wrap the fsspec filesystem of a :class:`~weir.checkpoint.storage.CheckpointStorage`
to number every write step — each file write (including its flush and fsync),
rename (publish) and delete — and to die at one of them::

    fs = FaultInjectingFileSystem(fsspec.filesystem("file"), crash_at=7, when="after")
    storage = CheckpointStorage(str(tmp_path), fs=fs)

``when`` is ``"before"`` (the step does not happen), ``"after"`` (it happens, then
the process "dies") or ``"during"`` (a write stops half way: a torn file). The crash
is :class:`InjectedCrash`, a ``BaseException``, so no ``except Exception`` cleanup
runs — as after ``kill -9``. A dry run with ``crash_at=None`` records the steps of
an operation in :attr:`steps`, which a test then enumerates.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

__all__ = ["FaultInjectingFileSystem", "InjectedCrash"]

WHEN = ("before", "after", "during")


class InjectedCrash(BaseException):
    """The simulated death of the process at a write step."""


class FaultInjectingFileSystem:
    """Delegates to ``wrapped``; counts write steps and crashes at ``crash_at``."""

    def __init__(self, wrapped: Any, crash_at: int | None = None, when: str = "before") -> None:
        if when not in WHEN:
            raise ValueError(f"when must be one of {WHEN}, got {when!r}")
        self.wrapped = wrapped
        self.crash_at = crash_at
        self.when = when
        #: ``(operation, path)`` of every write step so far, in order
        self.steps: list[tuple[str, str]] = []
        self.crashed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def arm(self, crash_at: int | None, when: str = "before") -> None:
        """Crash at step number ``crash_at`` counted from now (None: never)."""
        if when not in WHEN:
            raise ValueError(f"when must be one of {WHEN}, got {when!r}")
        self.steps = []
        self.crash_at = crash_at
        self.when = when
        self.crashed = False

    def _step(self, op: str, path: str, action: Callable[[], Any], torn: Callable[[], Any]) -> Any:
        index = len(self.steps)
        self.steps.append((op, path))
        hit = index == self.crash_at and not self.crashed
        if hit and self.when == "before":
            self._crash(op, path, index)
        if hit and self.when == "during":
            torn()
            self._crash(op, path, index)
        result = action()
        if hit and self.when == "after":
            self._crash(op, path, index)
        return result

    def _crash(self, op: str, path: str, index: int) -> None:
        self.crashed = True
        raise InjectedCrash(f"injected crash {self.when} step {index}: {op} {path}")

    # write steps ------------------------------------------------------------------------

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        """Write modes return a buffer written through (as one step) on close."""
        if "w" in mode or "a" in mode or "x" in mode:
            return _BufferedWrite(self, path, mode, kwargs)
        return self.wrapped.open(path, mode, **kwargs)

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> Any:
        """Write a whole file (one step)."""
        return self._step(
            "write", path, lambda: self.wrapped.pipe_file(path, value, **kwargs),
            lambda: self.wrapped.pipe_file(path, value[: len(value) // 2], **kwargs),
        )

    def mv(self, path1: str, path2: str, **kwargs: Any) -> Any:
        """Rename (publish) a file (one step)."""
        return self._step(
            "rename", path2, lambda: self.wrapped.mv(path1, path2, **kwargs), lambda: None
        )

    def rm(self, path: str, recursive: bool = False, **kwargs: Any) -> Any:
        """Delete (one step)."""
        return self._step(
            "delete", path, lambda: self.wrapped.rm(path, recursive=recursive, **kwargs),
            lambda: None,
        )

    def _write_through(self, path: str, mode: str, kwargs: dict[str, Any], data: bytes) -> None:
        def write(payload: bytes) -> None:
            with self.wrapped.open(path, mode, **kwargs) as f:
                f.write(payload)
                f.flush()
                if hasattr(f, "fileno"):
                    with contextlib.suppress(OSError, ValueError):
                        os.fsync(f.fileno())

        self._step("write", path, lambda: write(data), lambda: write(data[: len(data) // 2]))


class _BufferedWrite:
    def __init__(self, fs: FaultInjectingFileSystem, path: str, mode: str, kwargs: Any):
        self._fs = fs
        self._path = path
        self._mode = mode
        self._kwargs = kwargs
        self._chunks: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        return None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._fs._write_through(self._path, self._mode, self._kwargs, b"".join(self._chunks))

    def __enter__(self) -> _BufferedWrite:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
