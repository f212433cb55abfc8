"""Live subtasks a Python worker keeps between micro-batches, bounded.

A task that finds the subtask it runs here, exactly as the previous batch left it,
goes on with it (no restore); otherwise it restores from checkpoint storage. The
cache is a least-recently-used map bounded by count (``max_subtasks``) and by the
worker's memory (``max_bytes`` of resident set size, RocksDB's off-heap memory
included): after each batch the oldest subtasks other than the one just kept are
evicted until both hold. Eviction closes the subtask: the function's ``close()``,
the checkpointer's threads (a running materialization is awaited, one not started
yet is dropped), the RocksDB handles and its local directory. An evicted subtask
costs only a restore the next time a task needs it here. A copy that can never be
used again (its subtask changed since, in another worker, or it belongs to an earlier
query) is evicted as soon as a task of the same stage learns it (``evict``).

Hash-map state lives in this Python worker's memory: size ``spark.executor.pyspark.memory``
(or the executor's memory overhead, where it is not set) for the live state of
the subtasks a worker runs — with ``local[n]`` or ``n`` cores per executor Spark runs
up to ``n`` Python workers, each with its own cache. By default ``max_bytes`` is 80%
of ``spark.executor.pyspark.memory`` when it is set, else 4 GiB.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from typing import Any

from weir.runtime.checkpointer import SubtaskCheckpointer
from weir.runtime.operator import KeyedOperator, NonKeyedOperator
from weir.runtime.spark.spill import local_base

__all__ = ["CacheLimits", "LiveSubtask", "evict", "keep", "others", "take", "worker_rss_bytes"]

log = logging.getLogger(__name__)
_DEFAULT_MAX_BYTES = 4 << 30


@dataclass(frozen=True)
class CacheLimits:
    """Bounds of a worker's cache of live subtasks (``max_bytes`` None: 80% of
    ``spark.executor.pyspark.memory`` if set, else 4 GiB)."""

    max_subtasks: int = 32
    max_bytes: int | None = None

    def memory_bound(self) -> int:
        """The resident-set bound in bytes."""
        if self.max_bytes is not None:
            return self.max_bytes
        pyspark_mb = os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB")
        if pyspark_mb and pyspark_mb.isdigit():
            return int(pyspark_mb) * (1 << 20) * 4 // 5
        return _DEFAULT_MAX_BYTES


class BatchClock:
    """Processing time of the running batch (the batch timestamp: same on replay)."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


class CurrentKey:
    """The key selector: the process pass computes keys column-wise and sets them."""

    def __init__(self) -> None:
        self.key: Any = None

    def __call__(self, value: Any) -> Any:
        return self.key


@dataclass
class LiveSubtask:
    """A subtask kept alive in this Python worker between batches."""

    spec_key: tuple[str, str, int]
    parallelism: int
    operator: KeyedOperator | NonKeyedOperator
    checkpointer: SubtaskCheckpointer
    clock: BatchClock
    key: CurrentKey
    rocksdb_dir: str | None
    query: str = ""
    batch: int = -1
    attempt: str = ""
    token: int = 0
    renewed_ms: int = 0
    instance: str = ""

    def close(self) -> None:
        """Release everything: the function's ``close()``, threads, RocksDB."""
        try:
            self.checkpointer.close()
            self.operator.close()
        except Exception:  # pragma: no cover - best effort on eviction
            log.exception("closing a cached weir subtask failed")
        if self.rocksdb_dir:
            shutil.rmtree(self.rocksdb_dir, ignore_errors=True)


#: live subtasks of this Python worker, by (location, uid, subtask index), oldest first
_LIVE: dict[tuple[str, str, int], LiveSubtask] = {}


def others(location: str, uid: str, subtask: int) -> list[LiveSubtask]:
    """The live subtasks of stage ``(location, uid)`` kept here, but ``subtask``'s."""
    return [live for key, live in _LIVE.items()
            if key[0] == location and key[1] == uid and key[2] != subtask]


def evict(key: tuple[str, str, int], reason: str) -> bool:
    """Close and forget the live subtask kept under ``key``; whether there was one."""
    live = _LIVE.pop(key, None)
    if live is None:
        return False
    log.info("weir: evicting cached subtask %d of operator %r (%s) from this worker: %s",
             key[2], key[1], key[0], reason)
    live.close()
    return True


def take(key: tuple[str, str, int]) -> LiveSubtask | None:
    """The live subtask kept under ``key``, removed from the cache (None if none)."""
    return _LIVE.pop(key, None)


def keep(live: LiveSubtask, limits: CacheLimits) -> int:
    """Keep ``live`` as the newest entry, then evict the oldest others until the
    cache holds at most ``limits.max_subtasks`` and the worker's resident set is
    within ``limits.memory_bound()``. Returns how many were evicted."""
    _LIVE.pop(live.spec_key, None)
    _LIVE[live.spec_key] = live
    evicted = 0
    while len(_LIVE) > max(1, limits.max_subtasks):
        evicted += _evict_oldest("count", limits)
    bound = limits.memory_bound()
    if len(_LIVE) > 1 and worker_rss_bytes() > bound:
        while len(_LIVE) > 1 and worker_rss_bytes() > bound:
            evicted += _evict_oldest("memory", limits)
            gc.collect()  # operators and functions reference each other
    return evicted


def _evict_oldest(reason: str, limits: CacheLimits) -> int:
    key = next(iter(_LIVE))
    live = _LIVE.pop(key)
    log.info("weir: evicting cached subtask %d of operator %r (%s) from this worker: %s "
             "bound (max_subtasks=%d, max_bytes=%d)", key[2], key[1], key[0], reason,
             limits.max_subtasks, limits.memory_bound())
    live.close()
    return 1


def cached() -> list[tuple[str, str, int]]:
    """Keys of the live subtasks of this worker, oldest first (for tests and tools)."""
    return list(_LIVE)


def worker_rss_bytes() -> int:
    """This process's resident set size (Linux ``/proc``; elsewhere its peak)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def local_dir(location: str, uid: str, subtask: int) -> str:
    """A fresh RocksDB working directory for a subtask, under the executor's local
    directories (``SPARK_LOCAL_DIRS``, Spark's ``spark.local.dir``)."""
    base = local_base()
    tag = hashlib.sha256(f"{location}\0{uid}".encode()).hexdigest()[:12]
    return os.path.join(
        base, "weir-spark", tag, f"{subtask}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    )
