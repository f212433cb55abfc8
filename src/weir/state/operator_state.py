"""Operator (non-keyed) list state and broadcast state of one subtask.

Both are kept in memory as Python objects on every backend (as in Flink) and are
encoded with their descriptors' serializers when snapshotted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from weir.api.descriptors import ListStateDescriptor, MapStateDescriptor
from weir.api.state import BroadcastState, ListState, ReadOnlyBroadcastState
from weir.errors import ReadOnlyStateError, StateError, StateMigrationError, StateRegistrationError
from weir.state.backend import WriteCheck, decode_checked, encode_checked
from weir.state.migration import AS_IS, Rewrite, checked, same_keys, value_migration
from weir.state.snapshot import (
    BroadcastStateSnapshot,
    OperatorListStateSnapshot,
    RedistributionMode,
    schema_json,
)

__all__ = ["BroadcastStateStore", "OperatorListState", "OperatorStateStoreImpl"]


class OperatorListState(ListState[Any]):
    """A list of elements owned by one subtask (not keyed)."""

    def __init__(self, descriptor: ListStateDescriptor[Any], mode: RedistributionMode) -> None:
        self.descriptor = descriptor
        self.mode = mode
        self._elements: list[Any] = []
        self._check = WriteCheck(descriptor.name, descriptor.value_serializer)

    def get(self) -> list[Any]:
        return list(self._elements)

    def _checked(self, values: Iterable[Any]) -> list[Any]:
        out = list(values)
        for value in out:
            if value is None:
                raise StateError(f"operator state {self.descriptor.name!r}: cannot add None")
            self._check(value)
        return out

    def add(self, value: Any) -> None:
        self._elements.extend(self._checked((value,)))

    def add_all(self, values: Iterable[Any]) -> None:
        self._elements.extend(self._checked(values))

    def update(self, values: Iterable[Any]) -> None:
        self._elements = self._checked(values)

    def clear(self) -> None:
        self._elements = []

    def snapshot(self) -> OperatorListStateSnapshot:
        d = self.descriptor
        ser = d.value_serializer
        return OperatorListStateSnapshot(
            d.name,
            self.mode,
            ser.type_id,
            tuple(encode_checked(d.name, ser, e) for e in self._elements),
            schema_json(ser),
        )


class OperatorStateStoreImpl:
    """``ctx.operator_state_store`` of a :class:`~weir.CheckpointedFunction`."""

    def __init__(
        self,
        owner: str,
        restored: Mapping[str, OperatorListStateSnapshot],
        subtask_index: int = 0,
    ) -> None:
        self._owner = owner
        self._subtask_index = subtask_index
        self._restored = dict(restored)
        self._states: dict[str, OperatorListState] = {}

    def get_list_state(self, descriptor: ListStateDescriptor[Any]) -> ListState[Any]:
        """List state redistributed by even split when the parallelism changes."""
        return self._get(descriptor, RedistributionMode.SPLIT_DISTRIBUTE)

    def get_union_list_state(self, descriptor: ListStateDescriptor[Any]) -> ListState[Any]:
        """List state of which every subtask gets all elements on restore."""
        return self._get(descriptor, RedistributionMode.UNION)

    def _get(self, d: ListStateDescriptor[Any], mode: RedistributionMode) -> ListState[Any]:
        if not isinstance(d, ListStateDescriptor):
            raise StateRegistrationError(
                f"{self._owner}: operator state needs a ListStateDescriptor, got "
                f"{type(d).__name__} for {getattr(d, 'name', d)!r}"
            )
        known = self._states.get(d.name)
        if known is not None:
            if known.mode is not mode or known.descriptor.serializer_ids() != d.serializer_ids():
                raise StateRegistrationError(
                    f"{self._owner}: operator state {d.name!r} is already registered as "
                    f"{known.mode.value} with serializer {known.descriptor.serializer_ids()}"
                )
            return known
        state = OperatorListState(d, mode)
        restored = self._restored.pop(d.name, None)
        if restored is not None:
            ser = d.value_serializer
            what = f"{self._owner}: operator state {d.name!r}"
            rewrite = value_migration(what, restored.serializer, restored.schema, ser)
            if restored.mode is not mode or rewrite is None:
                raise StateMigrationError(
                    f"{self._owner}: operator state {d.name!r} was snapshotted as "
                    f"{restored.mode.value} with serializer {restored.serializer!r} but is now "
                    f"requested as {mode.value} with {ser.type_id!r}"
                )
            state._elements = [decode_checked(d.name, ser, e)
                               for e in _migrated(what, rewrite, restored.elements)]
        self._states[d.name] = state
        return state

    def snapshot(self) -> dict[str, OperatorListStateSnapshot]:
        """Every state, including restored ones the function has not asked for again.
        A union state that was not asked for again is kept by subtask 0 only: every
        subtask received all of it, so keeping every copy would multiply it."""
        out = {
            name: st
            for name, st in self._restored.items()
            if st.mode is not RedistributionMode.UNION or self._subtask_index == 0
        }
        out.update({name: s.snapshot() for name, s in self._states.items()})
        return out


class _BroadcastMap(BroadcastState[Any, Any]):
    def __init__(self, descriptor: MapStateDescriptor[Any, Any]) -> None:
        self.descriptor = descriptor
        self._data: dict[Any, Any] = {}
        self._key_check = WriteCheck(descriptor.name, descriptor.user_key_serializer)
        self._check = WriteCheck(descriptor.name, descriptor.value_serializer)

    def get(self, key: Any, default: Any = None) -> Any:
        return self._data.get(key, default)

    def contains(self, key: Any) -> bool:
        return key in self._data

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(list(self._data.items()))

    def put(self, key: Any, value: Any) -> None:
        self._key_check(key)
        self._check(value)
        self._data[key] = value

    def remove(self, key: Any) -> None:
        self._data.pop(key, None)

    def clear(self) -> None:
        self._data.clear()


class _ReadOnlyView(ReadOnlyBroadcastState[Any, Any]):
    """What the keyed side sees: reads pass through, writes raise."""

    def __init__(self, inner: _BroadcastMap) -> None:
        self._inner = inner

    def get(self, key: Any, default: Any = None) -> Any:
        return self._inner.get(key, default)

    def contains(self, key: Any) -> bool:
        return self._inner.contains(key)

    def items(self) -> Iterator[tuple[Any, Any]]:
        return self._inner.items()

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise ReadOnlyStateError(
            f"broadcast state {self._inner.descriptor.name!r} is read-only in process_element: "
            f"only process_broadcast_element may change it, so that every parallel instance "
            f"holds the same broadcast state"
        )

    put = put_all = remove = clear = __setitem__ = __delitem__ = _refuse


class BroadcastStateStore:
    """The broadcast states of one subtask."""

    def __init__(
        self,
        owner: str,
        descriptors: Iterable[MapStateDescriptor[Any, Any]],
        restored: Mapping[str, BroadcastStateSnapshot],
    ) -> None:
        self._owner = owner
        self._states: dict[str, _BroadcastMap] = {}
        self._views: dict[str, _ReadOnlyView] = {}
        self._restored = dict(restored)
        for d in descriptors:
            if not isinstance(d, MapStateDescriptor):
                raise StateRegistrationError(
                    f"{owner}: broadcast state needs a MapStateDescriptor, got {type(d).__name__}"
                )
            state = _BroadcastMap(d)
            old = self._restored.pop(d.name, None)
            if old is not None:
                ks, vs = d.user_key_serializer, d.value_serializer
                what = f"{owner}: broadcast state {d.name!r}"
                same_keys(what, old.serializers[0], old.schemas[0], ks)
                rewrite = value_migration(what, old.serializers[1], old.schemas[1], vs)
                if rewrite is None:
                    raise StateMigrationError(
                        f"{owner}: broadcast state {d.name!r} was snapshotted with serializers "
                        f"{list(old.serializers)} but is now declared with "
                        f"{list(d.serializer_ids())}"
                    )
                values = _migrated(what, rewrite, [v for _, v in old.entries])
                for (k, _), v in zip(old.entries, values, strict=True):
                    state._data[decode_checked(d.name, ks, k)] = decode_checked(d.name, vs, v)
            self._states[d.name] = state
            self._views[d.name] = _ReadOnlyView(state)

    def _lookup(self, descriptor: MapStateDescriptor[Any, Any]) -> _BroadcastMap:
        state = self._states.get(getattr(descriptor, "name", None))  # type: ignore[arg-type]
        if state is None:
            declared = sorted(self._states)
            raise StateRegistrationError(
                f"{self._owner}: broadcast state {getattr(descriptor, 'name', descriptor)!r} "
                f"was not declared; declared broadcast states: {declared}. Pass its "
                f"MapStateDescriptor in broadcast_state_descriptors"
            )
        if state.descriptor.serializer_ids() != descriptor.serializer_ids():
            raise StateRegistrationError(
                f"{self._owner}: broadcast state {descriptor.name!r} was declared with "
                f"serializers {list(state.descriptor.serializer_ids())}, not "
                f"{list(descriptor.serializer_ids())}"
            )
        return state

    def writable(self, descriptor: MapStateDescriptor[Any, Any]) -> BroadcastState[Any, Any]:
        """The state as the broadcast side sees it."""
        return self._lookup(descriptor)

    def read_only(
        self, descriptor: MapStateDescriptor[Any, Any]
    ) -> ReadOnlyBroadcastState[Any, Any]:
        """The state as the keyed side sees it."""
        return self._views[self._lookup(descriptor).descriptor.name]

    def snapshot(self) -> dict[str, BroadcastStateSnapshot]:
        """Encoded entries of every broadcast state."""
        out = dict(self._restored)
        for name, s in self._states.items():
            d = s.descriptor
            ks, vs = d.user_key_serializer, d.value_serializer
            entries = tuple(
                (encode_checked(name, ks, k), encode_checked(name, vs, v))
                for k, v in s._data.items()
            )
            out[name] = BroadcastStateSnapshot(
                name, (ks.type_id, vs.type_id), entries, (schema_json(ks), schema_json(vs))
            )
        return out


def _migrated(what: str, rewrite: Rewrite, values: Sequence[bytes]) -> Sequence[bytes]:
    """``values`` rewritten by a restore's migration (:mod:`weir.state.migration`)."""
    if rewrite is AS_IS:
        return values
    one = checked(what, rewrite)
    return [one(data) for data in values]
