"""A non-keyed operator subtask: a ``ProcessFunction`` with operator state (through
``CheckpointedFunction``) and no keys, timers or keyed state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from weir.api.functions import (
    ProcessFunction,
    outputs,
)
from weir.errors import (
    ConfigurationError,
    RestoreError,
)
from weir.runtime.operator_base import (
    Clock,
    OperatorBase,
    OperatorConfig,
)
from weir.state.snapshot import (
    OperatorSubtaskSnapshot,
)

__all__ = ["NonKeyedOperator"]


class NonKeyedOperator(OperatorBase):
    """One parallel instance of a non-keyed :class:`~weir.ProcessFunction`."""

    def __init__(
        self,
        function: ProcessFunction[Any, Any],
        config: OperatorConfig,
        *,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(function, ProcessFunction):
            raise ConfigurationError(
                f"{config.describe()}: expected a ProcessFunction, got {type(function).__name__}"
            )
        super().__init__(function, config, clock, ())

    def restore(
        self,
        snapshots: Sequence[OperatorSubtaskSnapshot],
        *,
        allow_non_restored_state: bool = False,
    ) -> None:
        """Load snapshots taken at any parallelism (before :meth:`open`)."""
        mine = self._filter_snapshots(snapshots, allow_non_restored_state)
        if any(s.keyed is not None and s.keyed.entry_count() for s in mine):
            raise RestoreError(
                f"{self.config.describe()}: the snapshot has keyed state, which a non-keyed "
                f"operator would drop"
            )

    def open(self) -> None:
        """Initialize operator state, then call the function's ``open``."""
        self._open_common()
        self.function.open(self)

    def close(self) -> None:
        """Call the function's ``close``."""
        if self._opened:
            self._opened = False
            self.function.close()

    def process_element(self, value: Any, timestamp: int | None = None) -> list[Any]:
        """Process one element; returns the function's outputs."""
        self.record_timestamp = timestamp
        return outputs(self.function.process_element(value, self))

    def snapshot(self, checkpoint_id: int, timestamp: int | None = None) -> OperatorSubtaskSnapshot:
        """Operator state of this subtask, as bytes."""
        return self.prepare_snapshot(checkpoint_id, timestamp)()

    def prepare_snapshot(
        self, checkpoint_id: int, timestamp: int | None = None
    ) -> Callable[[], OperatorSubtaskSnapshot]:
        """As :meth:`KeyedOperator.prepare_snapshot` (operator state is captured now)."""
        self._require_open()
        ts = self.clock() if timestamp is None else timestamp
        common = self._snapshot_common(checkpoint_id, ts)
        cfg = self.config
        done = OperatorSubtaskSnapshot(
            cfg.uid, checkpoint_id, ts, cfg.parallelism, cfg.subtask_index,
            cfg.max_parallelism, None, **common,
        )
        return lambda: done
