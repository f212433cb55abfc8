"""How a job checkpoints, on either runtime: Flink's ``CheckpointConfig`` (the
``execution.checkpointing.*`` options) with Flink's defaults, and the snapshot strategy.

:class:`CheckpointConfig` is an immutable setting read by both runtimes (the
continuous runtime's scheduler, :mod:`weir.runtime.continuous.scheduling`, and the
micro-batch runtime, where each Spark batch is one checkpoint and the trigger settings
do not apply). Durations are given as every weir duration (:mod:`weir.api.durations`:
``"10 s"``, a :class:`datetime.timedelta`, int milliseconds) and kept as timedeltas.
The interval, minimum pause and timeout are measured on a monotonic clock, as Flink's
``CheckpointCoordinator`` measures them: a step of the wall clock (NTP, a resumed VM)
neither delays nor expires checkpoints; only a checkpoint's trigger timestamp, kept in
its metadata, is wall-clock time.

Continuous runtime only (a Spark batch is a checkpoint):

* ``interval`` — ``execution.checkpointing.interval`` (default: none, periodic
  checkpoints off): a periodic checkpoint is triggered every interval; Flink's minimum
  is 10 ms.
* ``mode`` — ``execution.checkpointing.mode``: :attr:`CheckpointingMode.EXACTLY_ONCE`
  (barriers aligned) or :attr:`CheckpointingMode.AT_LEAST_ONCE`.
* ``timeout`` — ``execution.checkpointing.timeout`` (10 min, >= 10 ms): a checkpoint
  not complete that long after its trigger expires.
* ``min_pause`` — ``execution.checkpointing.min-pause`` (0): the least time from the
  completion of a checkpoint to the trigger of the next periodic one.
* ``max_concurrent`` — ``execution.checkpointing.max-concurrent-checkpoints`` (1).
* ``tolerable_failures`` — ``execution.checkpointing.tolerable-failed-checkpoints``
  (0): consecutive checkpoint failures tolerated before the job fails (restarts, as
  its restart strategy allows). Counted as in Flink: an expiry, an upload or I/O
  failure, a task's own decline; not a checkpoint a task gave up at its barriers
  (subsumed by a newer one, cancelled upstream, an input ended) nor one aborted
  because a task failed.
* ``retain_on_cancel`` — ``execution.checkpointing.externalized-checkpoint-retention``
  = ``RETAIN_ON_CANCELLATION`` (default ``DELETE_ON_CANCELLATION``).
* ``unaligned`` — ``execution.checkpointing.unaligned.enabled`` (false): barriers
  overtake in-flight data, which is stored with the checkpoint. Only with exactly-once
  and at most one concurrent checkpoint (Flink's rule; Flink silently turns unaligned
  off otherwise, weir refuses the setting); savepoints and a bounded job's final
  checkpoint then wait for the pending one too.
* ``aligned_timeout`` — ``execution.checkpointing.aligned-checkpoint-timeout`` (0):
  with unaligned checkpoints, a checkpoint starts aligned and switches to unaligned
  once its alignment takes longer than this; 0 means unaligned from the start.

Both runtimes:

* ``snapshot`` — how keyed state is written (:class:`SnapshotStrategy`; savepoints
  are always full). None (the default) chooses by backend, the same on both runtimes:
  :attr:`SnapshotStrategy.CHANGELOG` for the hash map — each checkpoint writes the keys
  changed since the previous one (nothing for an idle one), and a background thread
  writes the whole state now and then (*materialization*: at least every
  ``materialization_interval``, and when the deltas grow large); a restore reads the
  last materialization and the deltas after it — and
  :attr:`SnapshotStrategy.INCREMENTAL` for RocksDB (Flink's
  ``execution.checkpointing.incremental``): unchanged SST files are shared between
  checkpoints. Measured (``bench/README.md``): RocksDB's changelog costs each write a
  change record, its native checkpoint a memtable flush per checkpoint; the native one
  is faster on Spark and at 10,000 keys on the continuous runtime, the changelog at
  200,000 keys with checkpoints every second on the continuous runtime (shorter
  pauses too) — choose it there. :attr:`~SnapshotStrategy.FULL` writes the whole state
  every checkpoint; INCREMENTAL on the hash map (no files to share) writes full
  snapshots, as in Flink.
* ``retained`` — ``execution.checkpointing.num-retained`` (weir: 3): completed
  checkpoints kept; older ones are deleted (with the files only they use).
* ``lease_timeout`` (60 s) — a job (or Spark query) owns its checkpoint storage
  through a lease it renews; a lease not renewed this long is taken over by the next
  job (``weir.checkpoint.ownership``).
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from weir.api.durations import Duration, duration, duration_ms
from weir.errors import ConfigurationError

__all__ = ["MINIMAL_CHECKPOINT_TIME_MS", "CheckpointConfig", "CheckpointingMode",
           "SnapshotStrategy"]

MINIMAL_CHECKPOINT_TIME_MS = 10
"""The least checkpoint interval and timeout Flink accepts (``MINIMAL_CHECKPOINT_TIME``)."""


class CheckpointingMode(enum.Enum):
    """The consistency guarantee of checkpoints (Flink's ``CheckpointingMode``)."""

    EXACTLY_ONCE = "exactly_once"
    """Each record affects the checkpointed state exactly once: a task with several
    inputs holds back the inputs whose barrier arrived until every barrier arrived."""

    AT_LEAST_ONCE = "at_least_once"
    """No alignment: records after a barrier on one input may be in the snapshot and
    replayed after a restore (lower latency, duplicates in state after recovery)."""


class SnapshotStrategy(enum.Enum):
    """How checkpoints write keyed state (savepoints are always full)."""

    FULL = "full"
    """The whole state every checkpoint."""

    INCREMENTAL = "incremental"
    """RocksDB: unchanged SST files are shared with earlier checkpoints (Flink's
    incremental checkpoints); RocksDB's default on both runtimes. The hash map writes
    full snapshots."""

    CHANGELOG = "changelog"
    """Each checkpoint writes the keys changed since the previous one; the whole state
    is materialized in the background now and then (Flink's changelog state backend).
    The hash map's default on both runtimes."""


_DURATIONS = ("interval", "timeout", "min_pause", "aligned_timeout",
              "materialization_interval", "lease_timeout")
_LEGACY_MS = {"interval_ms": "interval", "timeout_ms": "timeout",
              "min_pause_ms": "min_pause", "aligned_timeout_ms": "aligned_timeout"}


def _count(value: object, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")


def _ms(value: timedelta) -> int:
    return value // timedelta(milliseconds=1)


@dataclass(frozen=True, init=False)
class CheckpointConfig:
    """How a job checkpoints, on either runtime (Flink's ``CheckpointConfig``, same
    defaults; every setting is explained in the module documentation). Invalid
    settings raise :class:`~weir.errors.ConfigurationError` saying what is allowed.
    The ``*_ms`` keywords and ``changelog`` of earlier releases still work, with a
    :class:`DeprecationWarning`."""

    interval: timedelta | None
    """Periodic checkpoint interval (>= 10 ms); None: no periodic checkpoints
    (continuous runtime)."""
    mode: CheckpointingMode
    """Exactly-once (aligned barriers) or at-least-once (continuous runtime)."""
    timeout: timedelta
    """A checkpoint not complete this long after its trigger expires (>= 10 ms)."""
    min_pause: timedelta
    """Least time between a completion and the next periodic trigger."""
    max_concurrent: int
    """Most checkpoints in progress at once (>= 1); forced ones may exceed it."""
    tolerable_failures: int
    """Consecutive counted checkpoint failures tolerated; one more fails the job."""
    retain_on_cancel: bool
    """Keep the retained checkpoints when the job is cancelled."""
    unaligned: bool
    """Unaligned checkpoints (exactly-once with max_concurrent == 1 only)."""
    aligned_timeout: timedelta
    """With unaligned: alignment time before switching to unaligned."""
    snapshot: SnapshotStrategy | None
    """How keyed state is written; None: CHANGELOG for the hash map, INCREMENTAL for
    RocksDB."""
    retained: int
    """Completed checkpoints kept (>= 1)."""
    materialization_interval: timedelta
    """Changelog: the whole state is written at least this often."""
    lease_timeout: timedelta
    """A job's lease on its checkpoint storage expires this long after its last
    renewal (>= 1 s)."""

    def __init__(self, interval: Duration | None = None, *,
                 mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE,
                 timeout: Duration = "10 min", min_pause: Duration = 0,
                 max_concurrent: int = 1, tolerable_failures: int = 0,
                 retain_on_cancel: bool = False, unaligned: bool = False,
                 aligned_timeout: Duration = 0, snapshot: SnapshotStrategy | str | None = None,
                 retained: int = 3, materialization_interval: Duration = "10 min",
                 lease_timeout: Duration = "60 s", **deprecated: Any) -> None:
        given: dict[str, Any] = {
            "interval": interval, "timeout": timeout, "min_pause": min_pause,
            "aligned_timeout": aligned_timeout, "snapshot": snapshot}
        for old, value in deprecated.items():
            if old in _LEGACY_MS:
                warnings.warn(f"CheckpointConfig({old}=...) is deprecated: use "
                              f"{_LEGACY_MS[old]}= (a duration: int milliseconds, '10 s' or "
                              f"a timedelta)", DeprecationWarning, stacklevel=2)
                given[_LEGACY_MS[old]] = value
            elif old == "changelog":
                warnings.warn("CheckpointConfig(changelog=...) is deprecated: use snapshot="
                              "SnapshotStrategy.CHANGELOG (True) or SnapshotStrategy."
                              "INCREMENTAL (False: RocksDB's SST files, the hash map's full "
                              "snapshots)", DeprecationWarning, stacklevel=2)
                given["snapshot"] = (None if value is None else SnapshotStrategy.CHANGELOG
                                     if value is True else SnapshotStrategy.INCREMENTAL
                                     if value is False else value)
            else:
                raise TypeError(f"CheckpointConfig() got an unexpected keyword argument "
                                f"{old!r}")
        if given["interval"] is not None:
            ms = duration_ms(given["interval"], "interval")
            if ms < MINIMAL_CHECKPOINT_TIME_MS:
                raise ConfigurationError(f"interval must be at least "
                                         f"{MINIMAL_CHECKPOINT_TIME_MS} ms (or None: no "
                                         f"periodic checkpoints), got {given['interval']!r}")
            given["interval"] = timedelta(milliseconds=ms)
        for name in ("timeout", "min_pause", "aligned_timeout"):
            given[name] = duration(given[name], name)
        if given["timeout"] < timedelta(milliseconds=MINIMAL_CHECKPOINT_TIME_MS):
            raise ConfigurationError(f"timeout must be at least {MINIMAL_CHECKPOINT_TIME_MS} "
                                     f"ms, got {timeout!r}")
        strategy = given["snapshot"]
        if strategy is not None and not isinstance(strategy, SnapshotStrategy):
            try:
                strategy = SnapshotStrategy(strategy)
            except ValueError:
                raise ConfigurationError(
                    f"snapshot must be a SnapshotStrategy (FULL, INCREMENTAL, CHANGELOG) or "
                    f"None (by backend), got {strategy!r}") from None
        lease = duration(lease_timeout, "lease_timeout")
        if lease < timedelta(seconds=1):
            raise ConfigurationError(f"lease_timeout must be at least 1 s, got "
                                     f"{lease_timeout!r}")
        values = dict(given, snapshot=strategy, mode=mode, max_concurrent=max_concurrent,
                      tolerable_failures=tolerable_failures, retain_on_cancel=retain_on_cancel,
                      unaligned=unaligned, retained=retained, lease_timeout=lease,
                      materialization_interval=duration(materialization_interval,
                                                        "materialization_interval"))
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self._check()

    def _check(self) -> None:
        if not isinstance(self.mode, CheckpointingMode):
            raise ConfigurationError(f"mode must be a CheckpointingMode (EXACTLY_ONCE or "
                                     f"AT_LEAST_ONCE), got {self.mode!r}")
        _count(self.max_concurrent, "max_concurrent", 1)
        _count(self.tolerable_failures, "tolerable_failures", 0)
        _count(self.retained, "retained", 1)
        for name in ("retain_on_cancel", "unaligned"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.unaligned and self.mode is not CheckpointingMode.EXACTLY_ONCE:
            raise ConfigurationError("unaligned checkpoints need mode EXACTLY_ONCE; use "
                                     "aligned checkpoints (unaligned=False) with AT_LEAST_ONCE")
        if self.unaligned and self.max_concurrent != 1:
            raise ConfigurationError(f"unaligned checkpoints need max_concurrent == 1, got "
                                     f"{self.max_concurrent}; lower it or use aligned checkpoints")

    def snapshot_for(self, state_backend: str) -> SnapshotStrategy:
        """The strategy keyed state on ``state_backend`` ("hashmap"/"rocksdb") is
        written with: :attr:`snapshot`, or by backend (CHANGELOG for the hash map,
        INCREMENTAL for RocksDB); INCREMENTAL on the hash map is FULL."""
        strategy = self.snapshot or (SnapshotStrategy.INCREMENTAL if state_backend == "rocksdb"
                                     else SnapshotStrategy.CHANGELOG)
        if strategy is SnapshotStrategy.INCREMENTAL and state_backend != "rocksdb":
            return SnapshotStrategy.FULL
        return strategy

    def changelog_for(self, state_backend: str) -> bool:
        """Whether keyed state on ``state_backend`` is checkpointed as a changelog."""
        return self.snapshot_for(state_backend) is SnapshotStrategy.CHANGELOG

    @property
    def periodic(self) -> bool:
        """Whether periodic checkpoints are on (``interval`` is set)."""
        return self.interval is not None

    @property
    def interval_ms(self) -> int | None:
        """:attr:`interval` in milliseconds (None: off)."""
        return None if self.interval is None else _ms(self.interval)

    @property
    def timeout_ms(self) -> int:
        """:attr:`timeout` in milliseconds."""
        return _ms(self.timeout)

    @property
    def min_pause_ms(self) -> int:
        """:attr:`min_pause` in milliseconds."""
        return _ms(self.min_pause)

    @property
    def aligned_timeout_ms(self) -> int:
        """:attr:`aligned_timeout` in milliseconds."""
        return _ms(self.aligned_timeout)

    @property
    def lease_timeout_ms(self) -> int:
        """:attr:`lease_timeout` in milliseconds."""
        return _ms(self.lease_timeout)

    @property
    def materialization_interval_ms(self) -> int:
        """:attr:`materialization_interval` in milliseconds."""
        return _ms(self.materialization_interval)
