"""The CPU time a process spends on checkpoints, every thread together: what
checkpoints cost, measured where the work runs rather than inferred from the
throughput of runs with and without them (which shared cores move by more than the
cost). The continuous runtime's tasks count the synchronous part of a checkpoint
(sinks' pre-commit, barriers, snapshots), its acknowledgement (the in-flight records
written, the parts encoded), the background uploads and materializations of the
checkpointers, and the handling of a completion or abort (sinks' commits).

Thread CPU time only (``time.thread_time_ns``): waiting for a disk's fsync is not
CPU, and a native library's own threads (RocksDB's compactions) are not counted. Nor
is the work checkpoints add to each record: tracking the keys a changelog writes."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["checkpoint_cpu_ns", "counted", "counting"]

T = TypeVar("T")
_lock = threading.Lock()
_total_ns = 0
_depth = threading.local()


@contextlib.contextmanager
def counting() -> Iterator[None]:
    """Count the calling thread's CPU time in the block as checkpoint work (a block
    inside another one of the same thread adds nothing: the outer one counts it)."""
    depth = getattr(_depth, "n", 0)
    _depth.n = depth + 1
    started = time.thread_time_ns()
    try:
        yield
    finally:
        _depth.n = depth
        if depth == 0:
            spent = time.thread_time_ns() - started
            global _total_ns
            with _lock:
                _total_ns += spent


def counted(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn``, its CPU time counted as checkpoint work wherever it runs."""

    @functools.wraps(fn)
    def run() -> T:
        with counting():
            return fn()
    return run


def checkpoint_cpu_ns() -> int:
    """CPU nanoseconds this process's threads spent in :func:`counting` blocks so far."""
    return _total_ns
