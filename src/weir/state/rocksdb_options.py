"""The RocksDB backend's memory budget and open options: one LRU block cache and one
write buffer manager per budget and process, shared by every RocksDB instance opened
with that budget (``RocksDBMemory``),
and the options each database and column family opens with (``open_db``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rocksdict

from weir.api.config import RocksDBStateBackend
from weir.errors import ConfigurationError

__all__ = ["RocksDBMemory", "db_options", "open_db", "shared_memory_usage"]


@dataclass(frozen=True)
class RocksDBMemory:
    """The memory of the RocksDB instances of this process opened with this budget
    (Flink's managed memory for RocksDB): one LRU block cache of ``total_bytes`` shared
    by all of them (instances with another budget have their own),
    with their memtables (write buffers) charged to it, at most ``write_buffer_ratio``
    of it; RocksDB flushes memtables early rather than exceed that.

    ``cache_entries`` bounds the entry cache in front of RocksDB
    (``weir.state.rocksdb_tables``): each value and list state of each subtask keeps at
    most that many recently read or written entries in Python memory — about 150
    bytes each plus the key's and the value's bytes, outside ``total_bytes`` (size the
    Python worker's memory for it); 0 turns the cache off."""

    total_bytes: int = 256 << 20
    write_buffer_ratio: float = 0.5
    cache_entries: int = 1 << 17

    def __post_init__(self) -> None:
        if type(self.total_bytes) is not int or self.total_bytes < (8 << 20):
            raise ConfigurationError(
                f"RocksDB memory total_bytes={self.total_bytes!r} must be an int of at least "
                f"8 MiB"
            )
        if not 0.05 <= self.write_buffer_ratio <= 0.9:
            raise ConfigurationError(
                f"RocksDB memory write_buffer_ratio={self.write_buffer_ratio!r} must be in "
                f"[0.05, 0.9]"
            )
        if type(self.cache_entries) is not int or self.cache_entries < 0:
            raise ConfigurationError(
                f"RocksDB memory cache_entries={self.cache_entries!r} must be an int >= 0 "
                f"(entries per state and subtask; 0: no entry cache)"
            )

    @classmethod
    def of(cls, backend: RocksDBStateBackend) -> RocksDBMemory:
        """The budget a :class:`~weir.RocksDBStateBackend` setting asks for."""
        return cls(backend.memory, backend.write_buffer_ratio, backend.cache_entries)

    @property
    def write_buffer_bytes(self) -> int:
        """The memtable budget (charged to the block cache)."""
        return int(self.total_bytes * self.write_buffer_ratio)


#: the block cache and write buffer manager of each budget in use in this process, by
#: (total_bytes, write_buffer_ratio): stages with the same budget share one, a stage
#: with another budget gets its own (never resizes another stage's)
_SHARED: dict[tuple[int, float], tuple[Any, Any]] = {}


def _shared_memory(memory: RocksDBMemory) -> tuple[Any, Any]:
    """The block cache and write buffer manager shared by the databases of this
    process with the budget ``memory``."""
    key = (memory.total_bytes, memory.write_buffer_ratio)
    shared = _SHARED.get(key)
    if shared is None:
        cache = rocksdict.Cache(memory.total_bytes)
        manager = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
            memory.write_buffer_bytes, False, cache
        )
        shared = _SHARED[key] = (cache, manager)
    return shared


def shared_memory_usage(memory: RocksDBMemory | None = None) -> tuple[int, int]:
    """(block cache bytes in use, memtable bytes in use) of this process's RocksDB
    instances with the budget ``memory`` (None: over every budget)."""
    shared = (list(_SHARED.values()) if memory is None else
              [_SHARED[key]] if (key := (memory.total_bytes, memory.write_buffer_ratio))
              in _SHARED else [])
    return (sum(int(cache.get_usage()) for cache, _ in shared),
            sum(int(manager.get_usage()) for _, manager in shared))


def db_options(memory: RocksDBMemory | None = None) -> rocksdict.Options:
    """Options of a database or column family: on the shared budget of ``memory``
    (None: RocksDB's defaults, for read-only scans of native checkpoints)."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    if memory is not None:
        cache, manager = _shared_memory(memory)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(cache)
        table.set_cache_index_and_filter_blocks(True)
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_manager(manager)
        opts.set_write_buffer_size(max(1 << 20, min(64 << 20, memory.write_buffer_bytes // 4)))
        opts.set_max_write_buffer_number(2)
    return opts


def open_db(path: Path, memory: RocksDBMemory) -> rocksdict.Rdict:
    """Open (or create) the database at ``path``, each of its column families on the
    shared budget: opened without them listed, RocksDB gives every existing column
    family default options (its own 8 MiB block cache, index blocks outside it)."""
    names = rocksdict.Rdict.list_cf(str(path)) if (path / "CURRENT").exists() else []
    families = {name: db_options(memory) for name in names}
    return rocksdict.Rdict(str(path), db_options(memory), column_families=families or None)
