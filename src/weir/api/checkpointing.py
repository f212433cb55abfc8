"""Checkpointing settings of a continuous job: Flink's ``CheckpointConfig`` (the
``execution.checkpointing.*`` options) with Flink's defaults.

:class:`CheckpointConfig` is an immutable setting; the scheduler of the continuous
runtime (:mod:`weir.runtime.continuous.scheduling`) applies it. Durations are int
milliseconds or :class:`datetime.timedelta` (truncated to whole milliseconds, as
Flink's ``Duration.toMillis``); they are stored as int milliseconds. The interval,
minimum pause and timeout are measured on a monotonic clock, as Flink's
``CheckpointCoordinator`` measures them: a step of the wall clock (NTP, a resumed VM)
neither delays nor expires checkpoints; only a checkpoint's trigger timestamp, kept in
its metadata, is wall-clock time.

* ``interval_ms`` — ``execution.checkpointing.interval`` (default: none, periodic
  checkpoints off): a periodic checkpoint is triggered every interval; Flink's minimum
  is 10 ms.
* ``mode`` — ``execution.checkpointing.mode``: :attr:`CheckpointingMode.EXACTLY_ONCE`
  (barriers aligned) or :attr:`CheckpointingMode.AT_LEAST_ONCE`.
* ``timeout_ms`` — ``execution.checkpointing.timeout`` (10 min, >= 10 ms): a checkpoint
  not complete that long after its trigger expires.
* ``min_pause_ms`` — ``execution.checkpointing.min-pause`` (0): the least time from the
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
* ``aligned_timeout_ms`` — ``execution.checkpointing.aligned-checkpoint-timeout`` (0):
  with unaligned checkpoints, a checkpoint starts aligned and switches to unaligned
  once its alignment takes longer than this; 0 means unaligned from the start.
* ``changelog`` — ``state.changelog.enabled`` (Flink: false): keyed state is
  checkpointed as a changelog (``weir.checkpoint.changelog``): each checkpoint writes
  the keys changed since the previous one, and a background thread writes the whole
  state now and then (*materialization*, see ``ChangelogPolicy``); a restore reads the
  last materialization and the deltas after it. None (weir's default) chooses by
  backend: on for RocksDB, whose native checkpoint flushes the memtables every
  interval and leaves reads going to fresh level-0 files (16% of throughput at 1 s
  and 200,000 keys, ``bench/continuous_checkpoint_overhead``), off for the hash map,
  whose full snapshot is packed in C. The trade-off: checkpoint bytes follow the
  change, restores read the last materialization and the deltas after it (up to
  about 9 times the state in the continuous runtime: ``ChangelogPolicy.size_ratio``
  8, ``weir.runtime.continuous.task.CHANGELOG_POLICY``), and a delta is
  only extended once its checkpoint is known complete (else the next checkpoint
  writes the whole state).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from weir.errors import ConfigurationError

__all__ = ["MINIMAL_CHECKPOINT_TIME_MS", "CheckpointConfig", "CheckpointingMode"]

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


def _millis(value: object, name: str, minimum: int, *, optional: bool = False) -> int | None:
    ms = value // timedelta(milliseconds=1) if isinstance(value, timedelta) else value
    if ms is None and optional:
        return None
    if isinstance(ms, bool) or not isinstance(ms, int) or ms < minimum:
        none = " or None (off)" if optional else ""
        raise ConfigurationError(f"{name} must be int milliseconds or a timedelta, >= "
                                 f"{minimum} ms{none}; got {value!r}")
    return ms


def _count(value: object, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class CheckpointConfig:
    """How a continuous job checkpoints (Flink's ``CheckpointConfig``, same defaults;
    every setting is explained in the module documentation). Invalid settings raise
    :class:`~weir.errors.ConfigurationError` saying what is allowed."""

    interval_ms: int | None = None
    """Periodic checkpoint interval (>= 10 ms); None: no periodic checkpoints."""
    mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE
    """Exactly-once (aligned barriers) or at-least-once."""
    timeout_ms: int = 600_000
    """A checkpoint not complete this long after its trigger expires (>= 10 ms)."""
    min_pause_ms: int = 0
    """Least time between a completion and the next periodic trigger (>= 0)."""
    max_concurrent: int = 1
    """Most checkpoints in progress at once (>= 1); forced ones may exceed it."""
    tolerable_failures: int = 0
    """Consecutive counted checkpoint failures tolerated; one more fails the job."""
    retain_on_cancel: bool = False
    """Keep the retained checkpoints when the job is cancelled."""
    unaligned: bool = False
    """Unaligned checkpoints (exactly-once with max_concurrent == 1 only)."""
    aligned_timeout_ms: int = 0
    """With unaligned: alignment time before switching to unaligned (>= 0)."""
    changelog: bool | None = None
    """Changelog keyed-state checkpoints; None: on for RocksDB, off for the hash map."""

    if TYPE_CHECKING:  # the signature callers see: durations may be timedeltas
        def __init__(self, interval_ms: int | timedelta | None = None,
                     mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE,
                     timeout_ms: int | timedelta = 600_000, min_pause_ms: int | timedelta = 0,
                     max_concurrent: int = 1, tolerable_failures: int = 0,
                     retain_on_cancel: bool = False, unaligned: bool = False,
                     aligned_timeout_ms: int | timedelta = 0,
                     changelog: bool | None = None) -> None: ...

    def __post_init__(self) -> None:
        floor = MINIMAL_CHECKPOINT_TIME_MS
        for name, minimum, optional in (("interval_ms", floor, True), ("timeout_ms", floor, False),
                                        ("min_pause_ms", 0, False),
                                        ("aligned_timeout_ms", 0, False)):
            object.__setattr__(self, name, _millis(getattr(self, name), name, minimum,
                                                   optional=optional))
        if not isinstance(self.mode, CheckpointingMode):
            raise ConfigurationError(f"mode must be a CheckpointingMode (EXACTLY_ONCE or "
                                     f"AT_LEAST_ONCE), got {self.mode!r}")
        _count(self.max_concurrent, "max_concurrent", 1)
        _count(self.tolerable_failures, "tolerable_failures", 0)
        for name in ("retain_on_cancel", "unaligned"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.changelog is not None and not isinstance(self.changelog, bool):
            raise ConfigurationError(f"changelog must be a bool or None (by backend), got "
                                     f"{self.changelog!r}")
        if self.unaligned and self.mode is not CheckpointingMode.EXACTLY_ONCE:
            raise ConfigurationError("unaligned checkpoints need mode EXACTLY_ONCE; use "
                                     "aligned checkpoints (unaligned=False) with AT_LEAST_ONCE")
        if self.unaligned and self.max_concurrent != 1:
            raise ConfigurationError(f"unaligned checkpoints need max_concurrent == 1, got "
                                     f"{self.max_concurrent}; lower it or use aligned checkpoints")

    def changelog_for(self, state_backend: str) -> bool:
        """Whether keyed state on ``state_backend`` is checkpointed as a changelog."""
        return state_backend == "rocksdb" if self.changelog is None else self.changelog

    @property
    def periodic(self) -> bool:
        """Whether periodic checkpoints are on (``interval_ms`` is set)."""
        return self.interval_ms is not None
