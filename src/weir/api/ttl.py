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

Background cleanup is on by default, as in Flink (``StateTtlConfig.java``:
``cleanupInBackground`` is true unless ``disableCleanupInBackground()``): a strategy
not chosen explicitly takes its default, :data:`DEFAULT_INCREMENTAL_CLEANUP` (5
entries per state access, not for every record) and
:data:`DEFAULT_ROCKSDB_COMPACT_FILTER_CLEANUP` (clock re-read every 1000 entries).
Which of them runs depends on the backend, again as in Flink: the hash map runs the
default incremental cleanup, RocksDB the default compaction filter (Flink's RocksDB
states have no incremental cleanup; weir's do, but only when chosen explicitly).
:meth:`StateTtlConfig.disable_cleanup_in_background` switches the defaults off; an
explicitly chosen strategy always runs.

The cleanup settings are not stored in checkpoints (only whether a state has TTL),
so changing them never affects restoring.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from datetime import timedelta

from weir.api.durations import duration_ms
from weir.errors import ConfigurationError

__all__ = [
    "DEFAULT_INCREMENTAL_CLEANUP",
    "DEFAULT_ROCKSDB_COMPACT_FILTER_CLEANUP",
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


#: Flink's ``DEFAULT_INCREMENTAL_CLEANUP_STRATEGY``: 5 entries, not for every record.
DEFAULT_INCREMENTAL_CLEANUP = IncrementalCleanup(5, False)
#: Flink's ``DEFAULT_ROCKSDB_COMPACT_FILTER_CLEANUP_STRATEGY``: 1000 entries.
DEFAULT_ROCKSDB_COMPACT_FILTER_CLEANUP = RocksDBCompactFilterCleanup(1000)


@dataclass(frozen=True, slots=True)
class StateTtlConfig:
    """Time-to-live of a state's values.

    ``ttl_ms`` is in milliseconds; a ``datetime.timedelta`` or a duration string
    (``"10 min"``) given for it is converted (:meth:`of` takes either, typed).
    ``incremental_cleanup`` and ``rocksdb_compact_filter_cleanup`` are the strategies
    chosen explicitly; :attr:`incremental_cleanup_strategy` and
    :attr:`rocksdb_compact_filter_cleanup_strategy` are the ones in force (the
    explicit one, else Flink's default while ``cleanup_in_background`` is true).

    >>> StateTtlConfig(ttl_ms=60_000).cleanup_incrementally(10)
    StateTtlConfig(ttl_ms=60000, ...)
    >>> StateTtlConfig(ttl_ms=60_000).disable_cleanup_in_background()
    StateTtlConfig(ttl_ms=60000, ..., cleanup_in_background=False)
    """

    ttl_ms: int
    update_type: UpdateType = UpdateType.ON_CREATE_AND_WRITE
    state_visibility: StateVisibility = StateVisibility.NEVER_RETURN_EXPIRED
    cleanup_full_snapshot: bool = False
    incremental_cleanup: IncrementalCleanup | None = None
    rocksdb_compact_filter_cleanup: RocksDBCompactFilterCleanup | None = None
    #: Flink's ``cleanupInBackground``: default strategies for those not chosen.
    cleanup_in_background: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.ttl_ms, timedelta | str):  # a duration: whole milliseconds
            object.__setattr__(self, "ttl_ms", duration_ms(self.ttl_ms, "StateTtlConfig.ttl_ms"))
        if not isinstance(self.ttl_ms, int) or self.ttl_ms <= 0:
            raise ConfigurationError(
                f"StateTtlConfig.ttl_ms={self.ttl_ms!r} must be a positive int (milliseconds)"
            )
        if not isinstance(self.cleanup_in_background, bool):
            raise ConfigurationError(
                f"StateTtlConfig.cleanup_in_background={self.cleanup_in_background!r} must be "
                f"True or False; call disable_cleanup_in_background() to switch it off"
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
    def of(cls, ttl: timedelta | str | int) -> StateTtlConfig:
        """A config with a TTL given as a ``datetime.timedelta``, a duration string
        (``"10 min"``) or int milliseconds."""
        return cls(ttl_ms=duration_ms(ttl, "StateTtlConfig.of(ttl)"))

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

    def disable_cleanup_in_background(self) -> StateTtlConfig:
        """A copy without the default background cleanup (Flink's
        ``disableCleanupInBackground``): expired values stay until they are read, or
        until a strategy chosen explicitly removes them (those keep running)."""
        return dataclasses.replace(self, cleanup_in_background=False)

    @property
    def incremental_cleanup_strategy(self) -> IncrementalCleanup | None:
        """The incremental cleanup in force: the one chosen, else
        :data:`DEFAULT_INCREMENTAL_CLEANUP` while ``cleanup_in_background`` (Flink's
        ``getIncrementalCleanupStrategy``). The default applies to the hash map only."""
        if self.incremental_cleanup is not None:
            return self.incremental_cleanup
        return DEFAULT_INCREMENTAL_CLEANUP if self.cleanup_in_background else None

    @property
    def rocksdb_compact_filter_cleanup_strategy(self) -> RocksDBCompactFilterCleanup | None:
        """The compaction-filter cleanup in force: the one chosen, else
        :data:`DEFAULT_ROCKSDB_COMPACT_FILTER_CLEANUP` while ``cleanup_in_background``
        (Flink's ``getRocksdbCompactFilterCleanupStrategy``)."""
        if self.rocksdb_compact_filter_cleanup is not None:
            return self.rocksdb_compact_filter_cleanup
        return DEFAULT_ROCKSDB_COMPACT_FILTER_CLEANUP if self.cleanup_in_background else None

    @property
    def update_on_read(self) -> bool:
        """Whether reads refresh the timestamp."""
        return self.update_type is UpdateType.ON_READ_AND_WRITE

    @property
    def return_expired(self) -> bool:
        """Whether expired values not yet cleaned up are returned."""
        return self.state_visibility is StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP
