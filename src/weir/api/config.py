"""One way to configure a job, on either runtime: where its checkpoints go, which
state backend holds its keyed state, how it checkpoints and restarts, what it starts
from.

.. code-block:: python

    config = weir.JobConfig(
        storage="/data/ckpt",
        state_backend=weir.RocksDBStateBackend(memory="512m"),
        checkpointing=weir.CheckpointConfig(interval="1 s"),
        parallelism=2,
    )
    weir.spark.process(events, "card", Fraud(), schema, "fraud", config)   # micro-batch
    env = weir.stream.StreamEnvironment(config)                             # continuous

The same :class:`JobConfig` means the same on both runtimes; what only one runtime
uses says so (:class:`~weir.CheckpointConfig`'s trigger settings are the continuous
runtime's: a Spark micro-batch is one checkpoint). Process-wide resources are not
here: on Spark they come from the session's ``spark.weir.*`` settings
(:mod:`weir.runtime.spark.options`), so no stage resizes another's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Any, TypeAlias

from weir.api.checkpointing import CheckpointConfig
from weir.api.durations import Duration, byte_size, duration
from weir.api.restart import RestartStrategy
from weir.errors import ConfigurationError

#: Flink's upper bound of the max parallelism
#: (``KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM``)
MAX_PARALLELISM_LIMIT = 1 << 15

__all__ = ["HashMapStateBackend", "JobConfig", "LateRecords", "RocksDBStateBackend",
           "StateBackend", "check_restore", "state_backend_of"]


@dataclass(frozen=True)
class HashMapStateBackend:
    """Keyed state as Python objects in the worker's memory (Flink's
    ``HashMapStateBackend``): the fastest; bounded by memory; snapshots copy on write."""

    @property
    def name(self) -> str:
        """``"hashmap"``."""
        return "hashmap"


@dataclass(frozen=True, init=False)
class RocksDBStateBackend:
    """Keyed state in an embedded RocksDB on local disk (Flink's
    ``EmbeddedRocksDBStateBackend``): state larger than memory.

    ``memory`` (bytes or ``"256m"``) bounds the block cache and write buffers that the
    RocksDB instances of this backend share within one process (memtables up to
    ``write_buffer_ratio`` of it); stages with different settings in one process each
    keep their own. ``cache_entries`` is how many recently used entries each value and
    list state of each subtask keeps in Python memory in front of RocksDB (about 150
    bytes each plus the key and value; 0: none)."""

    memory: int
    """Bytes of block cache (and the write buffers charged to it)."""
    write_buffer_ratio: float
    """Share of ``memory`` the memtables may use (0.05 - 0.9)."""
    cache_entries: int
    """Entries per state and subtask cached in Python memory (>= 0)."""

    def __init__(self, memory: int | str = "256m", *, write_buffer_ratio: float = 0.5,
                 cache_entries: int = 1 << 17) -> None:
        total = byte_size(memory, "RocksDBStateBackend(memory=)")
        if total < (8 << 20):
            raise ConfigurationError(f"RocksDBStateBackend(memory={memory!r}) must be at "
                                     f"least 8 MiB")
        if (isinstance(write_buffer_ratio, bool)
                or not isinstance(write_buffer_ratio, int | float)
                or not 0.05 <= write_buffer_ratio <= 0.9):
            raise ConfigurationError(f"RocksDBStateBackend(write_buffer_ratio="
                                     f"{write_buffer_ratio!r}) must be in [0.05, 0.9]")
        if type(cache_entries) is not int or cache_entries < 0:
            raise ConfigurationError(f"RocksDBStateBackend(cache_entries={cache_entries!r}) "
                                     f"must be an int >= 0 (entries per state and subtask; "
                                     f"0: no entry cache)")
        object.__setattr__(self, "memory", total)
        object.__setattr__(self, "write_buffer_ratio", float(write_buffer_ratio))
        object.__setattr__(self, "cache_entries", cache_entries)

    @property
    def name(self) -> str:
        """``"rocksdb"``."""
        return "rocksdb"


StateBackend: TypeAlias = HashMapStateBackend | RocksDBStateBackend
"""A state backend setting: :class:`HashMapStateBackend` or :class:`RocksDBStateBackend`."""


def state_backend_of(value: object, what: str = "state_backend") -> StateBackend:
    """``value`` as a state backend object; the names ``"hashmap"`` and ``"rocksdb"``
    stand for the default objects."""
    if isinstance(value, HashMapStateBackend | RocksDBStateBackend):
        return value
    name = getattr(value, "value", value)  # (a StateBackendKind)
    if name == "hashmap":
        return HashMapStateBackend()
    if name == "rocksdb":
        return RocksDBStateBackend()
    raise ConfigurationError(f"{what} {value!r} is not a state backend: give "
                             f"weir.HashMapStateBackend() or weir.RocksDBStateBackend(...) "
                             f"(or their names 'hashmap', 'rocksdb')")


class LateRecords(Enum):
    """What happens to a record whose event time is not after the watermark."""

    PROCESS = "process"
    """Processed like any other (Flink's default); counted as late."""
    DROP = "drop"
    """Dropped; counted."""
    DEAD_LETTER = "dead_letter"
    """Written to the dead letters with the reason ``late``."""


def _storage_url(value: object) -> str:
    if isinstance(value, str | os.PathLike) and str(value):
        return str(value)
    raise ConfigurationError(f"JobConfig(storage=) must be a non-empty path or URL of the "
                             f"checkpoint storage (file:///..., s3://...), got {value!r}")


def check_restore(restore_from: object, allow_non_restored_state: object) -> None:
    """Raise :class:`~weir.errors.ConfigurationError` unless ``restore_from`` is None or
    a path or URL, and ``allow_non_restored_state`` a bool."""
    if restore_from is not None and (not isinstance(restore_from, str | os.PathLike)
                                     or not str(restore_from)):
        raise ConfigurationError(f"restore_from must be the path or URL of a savepoint "
                                 f"or checkpoint (or None), got {restore_from!r}")
    if not isinstance(allow_non_restored_state, bool):
        raise ConfigurationError(f"allow_non_restored_state must be a bool, got "
                                 f"{allow_non_restored_state!r}")


@dataclass(frozen=True, init=False)
class JobConfig:
    """Everything a job is configured with besides its operators, the same on the
    micro-batch runtime (:func:`weir.spark.process`) and the continuous one
    (:class:`weir.stream.StreamEnvironment`).

    * ``storage`` — the checkpoint storage: a path or a filesystem URL (``s3://``...),
      with ``storage_options`` for its fsspec filesystem. A job owns it while it runs.
    * ``state_backend`` — :class:`HashMapStateBackend` (default) or
      :class:`RocksDBStateBackend`.
    * ``checkpointing`` — :class:`~weir.CheckpointConfig`.
    * ``restart_strategy`` — :class:`~weir.RestartStrategy`; None: Flink's default
      (exponential delay when periodic checkpoints are on, else none). The continuous
      runtime applies it; on Spark, :func:`weir.spark.supervise` does.
    * ``parallelism`` — None: Spark's default parallelism on the micro-batch runtime,
      the number of CPUs on the continuous one (as Flink's local environment).
    * ``max_parallelism`` — the number of key groups; None: the one the state was
      written with, else Flink's default for the parallelism (at least 128).
    * ``restore_from`` — a savepoint or checkpoint to start from (any runtime, any
      parallelism); ``allow_non_restored_state`` lets it hold state of operators the
      job does not have.
    * ``dead_letter_retention`` — how long dead letters (``<storage>/dead-letter/``, one
      record shape on both runtimes: :func:`weir.read_dead_letters`) are kept.
    """

    storage: str
    storage_options: Mapping[str, Any] | None
    state_backend: StateBackend
    checkpointing: CheckpointConfig
    restart_strategy: RestartStrategy | None
    parallelism: int | None
    max_parallelism: int | None
    restore_from: str | None
    allow_non_restored_state: bool
    dead_letter_retention: timedelta

    def __init__(self, storage: str | os.PathLike[str], *,
                 storage_options: Mapping[str, Any] | None = None,
                 state_backend: StateBackend | None = None,
                 checkpointing: CheckpointConfig | None = None,
                 restart_strategy: RestartStrategy | None = None,
                 parallelism: int | None = None, max_parallelism: int | None = None,
                 restore_from: str | os.PathLike[str] | None = None,
                 allow_non_restored_state: bool = False,
                 dead_letter_retention: Duration = "7 days") -> None:
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise ConfigurationError(f"storage_options must be a mapping (fsspec options) or "
                                     f"None, got {storage_options!r}")
        if checkpointing is None:
            checkpointing = CheckpointConfig()
        elif not isinstance(checkpointing, CheckpointConfig):
            raise ConfigurationError(f"checkpointing must be a weir.CheckpointConfig, got "
                                     f"{type(checkpointing).__name__}")
        if restart_strategy is not None and not isinstance(restart_strategy, RestartStrategy):
            raise ConfigurationError(f"restart_strategy must be a weir.RestartStrategy "
                                     f"(fixed_delay(), exponential_delay(), failure_rate(), "
                                     f"no_restart()) or None, got {restart_strategy!r}")
        if parallelism is not None and (isinstance(parallelism, bool)
                                        or not isinstance(parallelism, int) or parallelism < 1):
            raise ConfigurationError(f"parallelism={parallelism!r} must be a positive int (or "
                                     f"None: the runtime's default)")
        if max_parallelism is not None and (
                isinstance(max_parallelism, bool) or not isinstance(max_parallelism, int)
                or not 1 <= max_parallelism <= MAX_PARALLELISM_LIMIT):
            raise ConfigurationError(f"max_parallelism={max_parallelism!r} must be an int in "
                                     f"[1, {MAX_PARALLELISM_LIMIT}] (or None: the state's, else "
                                     f"Flink's default)")
        if parallelism is not None and max_parallelism is not None and (
                parallelism > max_parallelism):
            raise ConfigurationError(f"parallelism={parallelism} is above max_parallelism="
                                     f"{max_parallelism}: a key group cannot be split")
        check_restore(restore_from, allow_non_restored_state)
        values: dict[str, Any] = {
            "storage": _storage_url(storage),
            "storage_options": None if storage_options is None else dict(storage_options),
            "state_backend": state_backend_of(state_backend or HashMapStateBackend()),
            "checkpointing": checkpointing, "restart_strategy": restart_strategy,
            "parallelism": parallelism, "max_parallelism": max_parallelism,
            "restore_from": None if restore_from is None else str(restore_from),
            "allow_non_restored_state": allow_non_restored_state,
            "dead_letter_retention": duration(dead_letter_retention, "dead_letter_retention"),
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def effective_restart_strategy(self) -> RestartStrategy:
        """:attr:`restart_strategy`, or Flink's default for :attr:`checkpointing`."""
        if self.restart_strategy is not None:
            return self.restart_strategy
        return (RestartStrategy.exponential_delay() if self.checkpointing.periodic
                else RestartStrategy.no_restart())
