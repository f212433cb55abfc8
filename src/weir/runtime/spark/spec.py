"""What a task of a weir stage needs to know: the stage's settings, pickled into
Spark's plan by ``weir.spark.process`` and read by the process pass (``task``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from weir.checkpoint.storage import CheckpointStorage

__all__ = ["StageSpec"]


@dataclass(frozen=True)
class StageSpec:
    """Everything a task needs to run one weir stage (pickled into the Spark plan)."""

    uid: str
    location: str
    parallelism: int
    max_parallelism: int
    state_backend: str
    snapshot_mode: str
    function: Any
    keyed: bool
    columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    broadcast_columns: tuple[str, ...]
    broadcast_state_descriptors: tuple[Any, ...]
    output_schema: pa.Schema
    event_time: str | None = None
    watermark_delay_ms: int = 0
    record_format: str = "dict"
    bad_record_exceptions: tuple[type[BaseException], ...] = ()
    restore_from: str | None = None
    allow_non_restored_state: bool = False
    retained: int = 3
    storage_options: dict[str, Any] | None = None
    lease_timeout_ms: int = 60_000
    #: the hash map's changelog materializes at least this often (snapshot_mode
    #: "incremental")
    materialize_interval_ms: int = 600_000
    #: records behind the watermark: "process" (Flink's default), "drop", "dead_letter"
    late_records: str = "process"
    #: unique per ``process()`` call: a worker-local subtask of another call (older
    #: code, other settings) is never reused
    instance: str = ""
    #: bounds of each Python worker's cache of live subtasks (``cache.CacheLimits``)
    cache_max_subtasks: int = 32
    cache_max_bytes: int | None = None
    dead_letter_retention_ms: int = 7 * 24 * 3_600_000
    #: block cache + write buffers of the worker's RocksDB instances together
    rocksdb_memory_bytes: int = 256 << 20
    rocksdb_write_buffer_ratio: float = 0.5
    #: entries each value and list state of a RocksDB subtask caches in Python memory
    rocksdb_cache_entries: int = 1 << 17
    #: Arrow bytes of input (and of output) a task holds in memory before it moves
    #: them to a local file (``spill.SpillBuffer``)
    task_buffer_bytes: int = 64 << 20
    #: one metrics row per task for ``weir.runtime.spark.observed`` (Spark's progress)
    metrics: bool = True

    def storage(self) -> CheckpointStorage:
        """The checkpoint location."""
        return CheckpointStorage(self.location, storage_options=self.storage_options)
