"""What every operator subtask shares: its configuration (``OperatorConfig``), the
clock, the watermark bounds, the function's initialization and snapshot contexts,
and the common part of ``KeyedOperator`` and ``NonKeyedOperator`` (operator and
broadcast state, open/close, snapshots of operator state, restore checks)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weir.api.context import (
    Context,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    Instant,
    OperatorStateStore,
)
from weir.api.descriptors import (
    MapStateDescriptor,
)
from weir.api.functions import (
    CheckpointedFunction,
)
from weir.api.watermarks import MAX_WATERMARK, MIN_WATERMARK
from weir.errors import (
    ConfigurationError,
    RestoreError,
    StateError,
)
from weir.state.keygroups import (
    KeyGroupRange,
    check_parallelism,
    key_group_range_for_operator,
)
from weir.state.operator_state import BroadcastStateStore, OperatorStateStoreImpl
from weir.state.rocksdb import RocksDBMemory
from weir.state.snapshot import (
    OperatorSubtaskSnapshot,
    assign_broadcast_state,
    assign_operator_state,
)

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "Clock",
    "OperatorBase",
    "OperatorConfig",
    "StateBackendKind",
    "system_clock",
]

Clock = Callable[[], int]


def system_clock() -> int:
    """Wall-clock processing time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


class StateBackendKind(enum.Enum):
    """Where keyed state lives."""

    HASHMAP = "hashmap"
    ROCKSDB = "rocksdb"


@dataclass(frozen=True)
class OperatorConfig:
    """Identity and placement of one operator subtask."""

    uid: str = "operator"
    state_backend: StateBackendKind | str = StateBackendKind.HASHMAP
    max_parallelism: int = 128
    parallelism: int = 1
    subtask_index: int = 0
    #: Directory of the RocksDB instance (a temporary one if None).
    rocksdb_path: str | Path | None = None
    #: Block cache and write buffers of all RocksDB instances of the process (None:
    #: ``RocksDBMemory()``, 256 MiB).
    rocksdb_memory: RocksDBMemory | None = None
    #: Most stored entries one :meth:`KeyedOperator.run_background_cleanup` call
    #: filters (RocksDB TTL compaction-filter cleanup), so its cost per call is bounded.
    background_cleanup_entries: int = 10_000

    def __post_init__(self) -> None:
        if not isinstance(self.uid, str) or not self.uid:
            raise ConfigurationError(f"operator uid must be a non-empty str, got {self.uid!r}")
        entries = self.background_cleanup_entries
        if type(entries) is not int or entries < 1:
            raise ConfigurationError(
                f"background_cleanup_entries={entries!r} must be a positive int (the most "
                f"stored entries one background TTL cleanup call filters)"
            )
        try:
            kind = StateBackendKind(self.state_backend)
        except ValueError:
            names = [k.value for k in StateBackendKind]
            raise ConfigurationError(
                f"unknown state_backend {self.state_backend!r}; choose one of {names}"
            ) from None
        object.__setattr__(self, "state_backend", kind)
        check_parallelism(self.parallelism, self.max_parallelism)
        index = self.subtask_index
        if not isinstance(index, int) or not 0 <= index < self.parallelism:
            raise ConfigurationError(
                f"subtask_index={self.subtask_index!r} must be in [0, {self.parallelism})"
            )

    @property
    def key_group_range(self) -> KeyGroupRange:
        """The key groups this subtask owns."""
        return key_group_range_for_operator(
            self.max_parallelism, self.parallelism, self.subtask_index
        )

    def describe(self) -> str:
        """``operator 'uid' subtask i/p`` for messages."""
        return f"operator {self.uid!r} subtask {self.subtask_index}/{self.parallelism}"


class _InitContext(FunctionInitializationContext):
    def __init__(self, restored: bool, store: OperatorStateStoreImpl) -> None:
        self._restored = restored
        self._store = store

    @property
    def is_restored(self) -> bool:
        return self._restored

    @property
    def operator_state_store(self) -> OperatorStateStore:
        return self._store  # type: ignore[return-value]


@dataclass(frozen=True)
class _SnapshotContext(FunctionSnapshotContext):
    _checkpoint_id: int
    _timestamp: int

    @property
    def checkpoint_id(self) -> int:
        return self._checkpoint_id

    @property
    def checkpoint_timestamp(self) -> int:
        return self._timestamp


class OperatorBase(Context):
    """Parts shared by keyed and non-keyed operators: time, operator and broadcast state."""

    def __init__(
        self,
        function: Any,
        config: OperatorConfig,
        clock: Clock | None,
        broadcast_state_descriptors: Iterable[MapStateDescriptor[Any, Any]],
    ) -> None:
        self.function = function
        self.config = config
        self.clock: Clock = clock or system_clock
        self.watermark = MIN_WATERMARK
        #: timers fired since this instance was created (metrics)
        self.timers_fired = 0
        self.record_timestamp: int | None = None
        self._broadcast_descriptors = list(broadcast_state_descriptors)
        self._opened = False
        self._restored = False
        self._restored_operator: dict[str, Any] = {}
        self._restored_broadcast: dict[str, Any] = {}
        self.operator_state: OperatorStateStoreImpl | None = None
        self.broadcast: BroadcastStateStore | None = None

    # Context ------------------------------------------------------------------------
    @property
    def subtask_index(self) -> int:
        return self.config.subtask_index

    @property
    def parallelism(self) -> int:
        return self.config.parallelism

    @property
    def timestamp(self) -> int | None:
        return self.record_timestamp

    @property
    def current_processing_time(self) -> Instant:
        return Instant(self.clock())

    @property
    def current_watermark(self) -> Instant:
        return Instant(self.watermark)

    # life cycle ---------------------------------------------------------------------
    def _filter_snapshots(
        self, snapshots: Sequence[OperatorSubtaskSnapshot], allow_non_restored_state: bool
    ) -> list[OperatorSubtaskSnapshot]:
        if self._opened:
            raise RestoreError(f"{self.config.describe()}: restore must come before open()")
        mine = [s for s in snapshots if s.operator_uid == self.config.uid]
        others = sorted({s.operator_uid for s in snapshots} - {self.config.uid})
        if others and not allow_non_restored_state:
            raise RestoreError(
                f"snapshot holds state of operator(s) {others} that {self.config.describe()} "
                f"does not match (its uid is {self.config.uid!r}); restoring would drop that "
                f"state. Give the operator the old uid, or pass allow_non_restored_state=True "
                f"to start without it"
            )
        if mine and mine[0].max_parallelism != self.config.max_parallelism:
            raise RestoreError(
                f"{self.config.describe()}: snapshot was taken with max_parallelism="
                f"{mine[0].max_parallelism} but the operator has max_parallelism="
                f"{self.config.max_parallelism}; the number of key groups cannot change"
            )
        if mine:
            self._restored = True
            cfg = self.config
            self._restored_operator = assign_operator_state(
                mine, cfg.parallelism, cfg.subtask_index
            )
            self._restored_broadcast = assign_broadcast_state(
                mine, cfg.subtask_index, cfg.parallelism
            )
        return mine

    def _open_common(self) -> None:
        owner = self.config.describe()
        self.broadcast = BroadcastStateStore(
            owner, self._broadcast_descriptors, self._restored_broadcast
        )
        if isinstance(self.function, CheckpointedFunction):
            self.operator_state = OperatorStateStoreImpl(
                owner, self._restored_operator, self.config.subtask_index
            )
            self.function.initialize_state(_InitContext(self._restored, self.operator_state))
        elif self._restored_operator:
            raise RestoreError(
                f"{owner}: the snapshot has operator state {sorted(self._restored_operator)} "
                f"but the function is not a CheckpointedFunction; it would be dropped"
            )
        self._opened = True

    def _snapshot_common(self, checkpoint_id: int, timestamp: int) -> dict[str, Any]:
        if isinstance(self.function, CheckpointedFunction):
            self.function.snapshot_state(_SnapshotContext(checkpoint_id, timestamp))
        return {
            "operator_states": self.operator_state.snapshot() if self.operator_state else {},
            "broadcast_states": self.broadcast.snapshot() if self.broadcast else {},
        }

    def _require_open(self) -> None:
        if not self._opened:
            raise StateError(f"{self.config.describe()} is not open: call open() first")

    def run_background_cleanup(self, max_entries: int | None = None) -> int:
        """TTL background cleanup that no state access triggers; a runtime calls it
        once per checkpoint or micro-batch. Without keyed state there is none: 0."""
        return 0
