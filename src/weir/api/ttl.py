"""State time-to-live configuration (Flink's ``StateTtlConfig``).

Time is processing time in epoch milliseconds, read from the operator's clock (a
callable returning ``int`` milliseconds; tests inject a manual one). A value is
expired when ``last_timestamp + ttl_ms <= now``. Expiry is per value for value,
reducing and aggregating state and per element / per entry for list and map state.

Cleanup: expired values are always removed when they are read. In addition:

* ``cleanup_full_snapshot`` — snapshots leave expired values out;
* ``cleanup_incrementally(n, run_for_every_record)`` — each access to the state (and,
  if asked, each record the operator processes) checks ``n`` more entries of the
  state, in a cursor that wraps around, and removes the expired ones;
* ``cleanup_in_rocksdb_compact_filter(n)`` — the RocksDB backend drops expired
  values when it compacts (refreshing the current time every ``n`` entries); no
  effect on the hash-map backend.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from weir.errors import ConfigurationError

__all__ = [
    "IncrementalCleanup",
    "RocksDBCompactFilterCleanup",
    "StateTtlConfig",
    "StateVisibility",
    "UpdateType",
]


class UpdateType(enum.Enum):
    """When a value's TTL timestamp is refreshed."""

    ON_CREATE_AND_WRITE = "on_create_and_write"
    ON_READ_AND_WRITE = "on_read_and_write"


class StateVisibility(enum.Enum):
    """Whether an expired value that has not been cleaned up yet may be returned."""

    NEVER_RETURN_EXPIRED = "never_return_expired"
    RETURN_EXPIRED_IF_NOT_CLEANED_UP = "return_expired_if_not_cleaned_up"


@dataclass(frozen=True, slots=True)
class IncrementalCleanup:
    """Check ``cleanup_size`` entries per state access (and per record if asked)."""

    cleanup_size: int = 5
    run_cleanup_for_every_record: bool = False


@dataclass(frozen=True, slots=True)
class RocksDBCompactFilterCleanup:
    """Drop expired values during RocksDB compaction, re-reading the clock every
    ``query_time_after_num_entries`` entries."""

    query_time_after_num_entries: int = 1000


@dataclass(frozen=True, slots=True)
class StateTtlConfig:
    """Time-to-live of a state's values.

    >>> StateTtlConfig(ttl_ms=60_000).cleanup_incrementally(10)
    StateTtlConfig(ttl_ms=60000, ...)
    """

    ttl_ms: int
    update_type: UpdateType = UpdateType.ON_CREATE_AND_WRITE
    state_visibility: StateVisibility = StateVisibility.NEVER_RETURN_EXPIRED
    cleanup_full_snapshot: bool = False
    incremental_cleanup: IncrementalCleanup | None = None
    rocksdb_compact_filter_cleanup: RocksDBCompactFilterCleanup | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.ttl_ms, int) or self.ttl_ms <= 0:
            raise ConfigurationError(
                f"StateTtlConfig.ttl_ms={self.ttl_ms!r} must be a positive int (milliseconds)"
            )
        inc = self.incremental_cleanup
        if inc is not None and inc.cleanup_size <= 0:
            raise ConfigurationError(
                f"incremental cleanup size {inc.cleanup_size} must be positive"
            )
        rf = self.rocksdb_compact_filter_cleanup
        if rf is not None and rf.query_time_after_num_entries <= 0:
            raise ConfigurationError(
                "query_time_after_num_entries must be positive, "
                f"got {rf.query_time_after_num_entries}"
            )

    @classmethod
    def of_seconds(cls, seconds: float) -> StateTtlConfig:
        """A config with a TTL given in seconds."""
        return cls(ttl_ms=round(seconds * 1000))

    def with_update_type(self, update_type: UpdateType) -> StateTtlConfig:
        """A copy with another update type."""
        return dataclasses.replace(self, update_type=update_type)

    def with_state_visibility(self, visibility: StateVisibility) -> StateTtlConfig:
        """A copy with another visibility."""
        return dataclasses.replace(self, state_visibility=visibility)

    def cleanup_in_full_snapshot(self) -> StateTtlConfig:
        """A copy that leaves expired values out of snapshots."""
        return dataclasses.replace(self, cleanup_full_snapshot=True)

    def cleanup_incrementally(
        self, cleanup_size: int = 5, run_cleanup_for_every_record: bool = False
    ) -> StateTtlConfig:
        """A copy with incremental cleanup of ``cleanup_size`` entries per access."""
        return dataclasses.replace(
            self,
            incremental_cleanup=IncrementalCleanup(cleanup_size, run_cleanup_for_every_record),
        )

    def cleanup_in_rocksdb_compact_filter(
        self, query_time_after_num_entries: int = 1000
    ) -> StateTtlConfig:
        """A copy that drops expired values during RocksDB compaction."""
        return dataclasses.replace(
            self,
            rocksdb_compact_filter_cleanup=RocksDBCompactFilterCleanup(
                query_time_after_num_entries
            ),
        )

    @property
    def update_on_read(self) -> bool:
        """Whether reads refresh the timestamp."""
        return self.update_type is UpdateType.ON_READ_AND_WRITE

    @property
    def return_expired(self) -> bool:
        """Whether expired values not yet cleaned up are returned."""
        return self.state_visibility is StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP
