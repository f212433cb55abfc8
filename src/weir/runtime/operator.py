"""The runtime-independent operator core: one parallel instance of a user function
with its keyed state, timers, operator state and broadcast state.

Every runtime (the test harness, Spark, the continuous runtime) drives the same
:class:`KeyedOperator` / :class:`NonKeyedOperator`: set up, restore, ``open``, feed
elements and time, ``snapshot``, ``close``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from weir.api.context import (
    BroadcastContext,
    Instant,
    KeyedContext,
    TimeDomain,
    TimerService,
)
from weir.api.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
)
from weir.api.functions import (
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    outputs,
)
from weir.errors import (
    ConfigurationError,
    NoKeyContextError,
    StateRegistrationError,
)
from weir.runtime.nonkeyed import NonKeyedOperator
from weir.runtime.operator_base import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    Clock,
    OperatorConfig,
    StateBackendKind,
    system_clock,
)
from weir.runtime.operator_changes import KeyedChanges, StateChange
from weir.state._hashcore import process_keyed
from weir.state.backend import KeyedStateBackend
from weir.state.hashmap import HashMapKeyedStateBackend
from weir.state.keycontext import NO_KEY, KeyContext
from weir.state.keyed import KeyedStateStore
from weir.state.rocksdb import RocksDBKeyedStateBackend
from weir.state.snapshot import (
    KeyedStateSnapshot,
    OperatorSubtaskSnapshot,
    assign_keyed_state,
)
from weir.state.timers import EVENT_TIMERS, PROCESSING_TIMERS, TimerQueue

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "KeyedOperator",
    "NonKeyedOperator",
    "OperatorConfig",
    "StateBackendKind",
    "StateChange",
    "system_clock",
]


class KeyedOperator(KeyedChanges, KeyedContext, TimerService):
    """One parallel instance of a keyed function (optionally with broadcast input)."""

    def __init__(
        self,
        function: KeyedProcessFunction[Any, Any] | KeyedBroadcastProcessFunction[Any, Any, Any],
        key_selector: Callable[[Any], Any],
        config: OperatorConfig,
        *,
        clock: Clock | None = None,
        broadcast_state_descriptors: Iterable[MapStateDescriptor[Any, Any]] = (),
    ) -> None:
        if not isinstance(function, KeyedProcessFunction | KeyedBroadcastProcessFunction):
            raise ConfigurationError(
                f"{config.describe()}: expected a KeyedProcessFunction or "
                f"KeyedBroadcastProcessFunction, got {type(function).__name__}"
            )
        if not callable(key_selector):
            raise ConfigurationError(f"{config.describe()}: key_selector must be callable")
        super().__init__(function, config, clock, broadcast_state_descriptors)
        self.key_selector = key_selector
        self.key_context = KeyContext(
            config.max_parallelism,
            config.key_group_range,
            f"{config.describe()} (key groups {config.key_group_range})",
        )
        self.backend = self._make_backend()
        self.keyed_state = KeyedStateStore(self.backend, self.clock, config.describe())
        self.event_timers = TimerQueue()
        self.processing_timers = TimerQueue()
        #: RocksDB: the timer column families hold the timers as of the last native
        #: checkpoint and the queues record changes since (``_mirror_timers``)
        self._timers_mirrored = False
        #: the changelog checkpointer recording this operator's changes (a weakref)
        self.changelog_owner: Any = None
        self._time_domain: TimeDomain | None = None

    def _make_backend(self) -> KeyedStateBackend:
        if self.config.state_backend is StateBackendKind.ROCKSDB:
            return RocksDBKeyedStateBackend(self.key_context, self.config.rocksdb_path,
                                       self.config.rocksdb_memory)
        return HashMapKeyedStateBackend(self.key_context)

    # life cycle ---------------------------------------------------------------------
    def restore(
        self,
        snapshots: Sequence[OperatorSubtaskSnapshot],
        *,
        allow_non_restored_state: bool = False,
    ) -> None:
        """Load snapshots taken at any parallelism (before :meth:`open`)."""
        mine = self._filter_snapshots(snapshots, allow_non_restored_state)
        if not mine:
            return
        keyed = assign_keyed_state(mine, self.config.key_group_range)
        timers = self.keyed_state.restore(keyed, (EVENT_TIMERS, PROCESSING_TIMERS))
        self.event_timers.restore_entries(timers[EVENT_TIMERS])
        self.processing_timers.restore_entries(timers[PROCESSING_TIMERS])
        self._timers_mirrored = False
        if self.keyed_state.timers_mirrored and isinstance(self.backend, RocksDBKeyedStateBackend):
            self.event_timers.track_changes()  # the restored mirror is exact: go on
            self.processing_timers.track_changes()
            self._timers_mirrored = True

    def open(self) -> None:
        """Initialize operator state, then call the function's ``open``."""
        self.key_context.clear()
        self._open_common()
        self.function.open(self)

    def close(self) -> None:
        """Call the function's ``close`` and release the backend."""
        try:
            if self._opened:
                self.key_context.clear()
                self.function.close()
        finally:
            self._opened = False
            self.backend.close()

    def run_background_cleanup(self, max_entries: int | None = None) -> int:
        """One bounded step of the TTL cleanup that no state access triggers: the
        RocksDB compaction filter (rocksdict has none natively). It filters at most
        ``max_entries`` stored entries (default ``config.background_cleanup_entries``)
        of the TTL states' column families, continuing where the previous call
        stopped and wrapping around, and deletes the expired ones; so its cost per
        call does not grow with the state. A runtime calls it once per checkpoint or
        micro-batch. No effect on the hash map, whose incremental cleanup runs on
        state access. Returns the number of entries deleted."""
        self._require_open()
        limit = self.config.background_cleanup_entries if max_entries is None else max_entries
        if type(limit) is not int or limit < 1:
            raise ConfigurationError(
                f"{self.config.describe()}: run_background_cleanup(max_entries={limit!r}) "
                f"needs a positive int"
            )
        return self.keyed_state.run_compaction_filters(limit)

    # processing ---------------------------------------------------------------------
    def process_element(self, value: Any, timestamp: int | None = None) -> list[Any]:
        """Process one keyed element; returns the function's outputs."""
        self.key_context.set_current_key(self.key_selector(value))
        self.record_timestamp = timestamp
        result = outputs(self.function.process_element(value, self))
        self.keyed_state.on_record()
        return result

    def process_keyed(
        self, values: Sequence[Any], keys: Sequence[Any], timestamps: Sequence[int | None],
        out: list[Any],
    ) -> None:
        """:meth:`process_element` for each value with its key given (not taken from
        the key selector), appending the outputs to ``out`` in order: one loop with the
        lookups done once (the Spark runtime's process pass). If the function raises,
        ``out`` may hold part of that value's outputs: use it only when an exception
        fails the whole batch."""
        # the loop in C (_keycell.c): the key made current as set_current_key does, the
        # function called, its outputs appended, on_record while cleaners is not empty
        # (the live list: states may register late)
        process_keyed(self.key_context, iter(values), _as_list(keys), _as_list(timestamps),
                      self, self.function.process_element, out,
                      self.keyed_state.record_cleaners, self.keyed_state.on_record)

    def process_broadcast_element(self, value: Any, timestamp: int | None = None) -> list[Any]:
        """Process one broadcast element (keyed broadcast functions only)."""
        fn = self.function
        if not isinstance(fn, KeyedBroadcastProcessFunction):
            raise ConfigurationError(
                f"{self.config.describe()}: {type(fn).__name__} has no broadcast input"
            )
        self.key_context.clear()
        self.record_timestamp = timestamp
        return outputs(fn.process_broadcast_element(value, _BroadcastSide(self)))

    def advance_watermark(self, watermark: int,
                          emit: Callable[[Any, int], None] | None = None) -> list[Any]:
        """Move event time to ``watermark`` and fire due event-time timers in order;
        their outputs, or ``[]`` when ``emit(output, timer timestamp)`` takes each."""
        if watermark <= self.watermark:
            return []
        self.watermark = watermark
        return self._fire(self.event_timers, watermark, TimeDomain.EVENT_TIME, emit)

    def advance_processing_time(self, now: int | None = None,
                                emit: Callable[[Any, int], None] | None = None) -> list[Any]:
        """Fire processing-time timers due at ``now`` (default: the clock); outputs as
        :meth:`advance_watermark`."""
        return self._fire(
            self.processing_timers, self.clock() if now is None else now,
            TimeDomain.PROCESSING_TIME, emit,
        )

    def _fire(self, queue: TimerQueue, time: int, domain: TimeDomain,
              emit: Callable[[Any, int], None] | None) -> list[Any]:
        out: list[Any] = []
        on_timer = self.function.on_timer
        self._time_domain = domain
        fired = 0
        try:
            while (timer := queue.pop_due(time)) is not None:
                timestamp, key = timer
                fired += 1
                self.key_context.set_current_prefixed_key(key)
                self.record_timestamp = timestamp
                if emit is None:
                    out.extend(outputs(on_timer(timestamp, self)))
                else:
                    for value in outputs(on_timer(timestamp, self)):
                        emit(value, timestamp)
        finally:
            self._time_domain = None
            self.timers_fired += fired
        return out

    def snapshot(self, checkpoint_id: int, timestamp: int | None = None) -> OperatorSubtaskSnapshot:
        """Everything needed to resume this subtask, as bytes."""
        return self.prepare_snapshot(checkpoint_id, timestamp)()

    def prepare_snapshot(
        self,
        checkpoint_id: int,
        timestamp: int | None = None,
        *,
        native_dir: str | Path | None = None,
    ) -> Callable[[], OperatorSubtaskSnapshot]:
        """The synchronous part of a snapshot (``snapshot_state``, operator, broadcast
        and timer state captured, keyed state frozen); calling the result encodes keyed
        state off the processing path. With ``native_dir`` (RocksDB only) keyed state is
        a native RocksDB checkpoint written there; the snapshot then holds the timers."""
        self._require_open()
        ts = self.clock() if timestamp is None else timestamp
        common = self._snapshot_common(checkpoint_id, ts)
        cfg = self.config
        if native_dir is not None:
            if not isinstance(self.backend, RocksDBKeyedStateBackend):
                raise ConfigurationError(
                    f"{cfg.describe()}: incremental (native) snapshots need the RocksDB backend"
                )
            self._mirror_timers(self.backend)
            self.backend.native_checkpoint(native_dir)
            native = self.keyed_state.native_snapshot(
                {EVENT_TIMERS: [], PROCESSING_TIMERS: []}, cfg.key_group_range, native_dir
            )
            encode: Callable[[], KeyedStateSnapshot] = lambda: native  # noqa: E731
        else:
            timers = {
                EVENT_TIMERS: self.event_timers.snapshot_entries(),
                PROCESSING_TIMERS: self.processing_timers.snapshot_entries(),
            }
            encode = self.keyed_state.prepare_snapshot(timers, cfg.key_group_range)

        def finish() -> OperatorSubtaskSnapshot:
            return OperatorSubtaskSnapshot(
                cfg.uid, checkpoint_id, ts, cfg.parallelism, cfg.subtask_index,
                cfg.max_parallelism, encode(), **common,
            )

        return finish

    def _mirror_timers(self, backend: RocksDBKeyedStateBackend) -> None:
        """Bring the timer column families up to date before a native checkpoint:
        the changes since the last one, or every timer the first time (or after a
        restore the mirror does not hold exactly)."""
        queues = ((EVENT_TIMERS, self.event_timers), (PROCESSING_TIMERS, self.processing_timers))
        if self._timers_mirrored:
            for name, queue in queues:
                backend.write_timers(name, queue.take_changes())
            return
        for name, queue in queues:
            backend.write_timers(
                name, [(k, [(k, v)]) for k, v in queue.snapshot_entries()], reset=True
            )
            queue.track_changes()
        self._timers_mirrored = True

    # KeyedContext -------------------------------------------------------------------
    def _get(self, descriptor: Any, expected: type[Any], method: str) -> Any:
        if not isinstance(descriptor, expected):
            raise StateRegistrationError(
                f"{self.config.describe()}: ctx.{method} needs a {expected.__name__}, got "
                f"{type(descriptor).__name__} {getattr(descriptor, 'name', '')!r}"
            )
        return self.keyed_state.get_state(descriptor)

    def get_state(self, descriptor: Any) -> Any:
        return self._get(descriptor, StateDescriptor, "get_state")

    def get_list_state(self, descriptor: Any) -> Any:
        return self._get(descriptor, ListStateDescriptor, "get_list_state")

    def get_map_state(self, descriptor: Any) -> Any:
        return self._get(descriptor, MapStateDescriptor, "get_map_state")

    def get_reducing_state(self, descriptor: Any) -> Any:
        return self._get(descriptor, ReducingStateDescriptor, "get_reducing_state")

    def get_aggregating_state(self, descriptor: Any) -> Any:
        return self._get(descriptor, AggregatingStateDescriptor, "get_aggregating_state")

    @property
    def current_key(self) -> Any:
        return self.key_context.key

    @property
    def timer_service(self) -> TimerService:
        return self

    @property
    def time_domain(self) -> TimeDomain | None:
        return self._time_domain

    def get_broadcast_state(self, descriptor: Any) -> Any:
        assert self.broadcast is not None, "open() first"
        return self.broadcast.read_only(descriptor)

    # TimerService -------------------------------------------------------------------
    def _timer_key(self) -> bytes:
        key = self.key_context.key_bytes
        if key is NO_KEY:
            raise self.key_context.no_key_error("the timer service")
        return key  # type: ignore[no-any-return]

    def register_event_time_timer(self, timestamp: int) -> None:
        self.event_timers.register(int(timestamp), self._timer_key())

    def register_processing_time_timer(self, timestamp: int) -> None:
        self.processing_timers.register(int(timestamp), self._timer_key())

    def delete_event_time_timer(self, timestamp: int) -> None:
        self.event_timers.delete(int(timestamp), self._timer_key())

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self.processing_timers.delete(int(timestamp), self._timer_key())


class _BroadcastSide(BroadcastContext):
    """The context of ``process_broadcast_element``."""

    def __init__(self, op: KeyedOperator) -> None:
        self._op = op

    @property
    def subtask_index(self) -> int:
        return self._op.subtask_index

    @property
    def parallelism(self) -> int:
        return self._op.parallelism

    @property
    def timestamp(self) -> int | None:
        return self._op.record_timestamp

    @property
    def current_processing_time(self) -> Instant:
        return Instant(self._op.clock())

    @property
    def current_watermark(self) -> Instant:
        return Instant(self._op.watermark)

    def get_broadcast_state(self, descriptor: Any) -> Any:
        assert self._op.broadcast is not None
        return self._op.broadcast.writable(descriptor)

    def apply_to_keyed_state(
        self, descriptor: StateDescriptor, function: Callable[[Any, Any], None]
    ) -> None:
        op = self._op
        state = op.keyed_state.get_state(descriptor)
        try:
            for key in op.keyed_state.keys(descriptor.name):
                op.key_context.set_current_prefixed_key(key)
                function(op.key_context.key, state)
        finally:
            op.key_context.clear()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("get_") and name.endswith("state"):
            raise NoKeyContextError(
                f"{self._op.config.describe()}: keyed state is not available in "
                f"process_broadcast_element (there is no current key); use "
                f"ctx.apply_to_keyed_state(descriptor, function) to visit every key's state"
            )
        raise AttributeError(name)


def _as_list(values: Sequence[Any]) -> list[Any]:
    return values if type(values) is list else list(values)
