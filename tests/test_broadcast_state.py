"""Broadcast state of KeyedBroadcastProcessFunctions, through KeyedBroadcastOperatorHarness."""

from __future__ import annotations

from typing import Any

import pytest

from weir import (
    BroadcastContext,
    KeyedBroadcastProcessFunction,
    KeyedContext,
    ListStateDescriptor,
    MapStateDescriptor,
    NoKeyContextError,
    ReadOnlyStateError,
    StateRegistrationError,
    StrSerializer,
    ValueStateDescriptor,
)
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.testing import KeyedBroadcastOperatorHarness

RULES = MapStateDescriptor("rules")
TOTAL = ValueStateDescriptor("total")
MAX_P = 128


def key_of(element: tuple[Any, ...]) -> Any:
    return element[0]


class Rules(KeyedBroadcastProcessFunction[tuple[str, int], tuple[Any, ...], Any]):
    """Keyed elements ``(key, amount)`` add to a per-key total and emit
    ``(key, rule)`` for every rule whose threshold the total reached.

    Broadcast elements: ``("put", rule, threshold)``, ``("remove", rule)``,
    ``("dump",)`` (emits the whole rules map) and ``("visit",)`` (emits
    ``(key, total)`` of every key with a total, through apply_to_keyed_state)."""

    def process_element(self, value: tuple[str, int], ctx: KeyedContext) -> list[Any]:
        total = ctx.get_state(TOTAL)
        total.update((total.value() or 0) + value[1])
        rules = ctx.get_broadcast_state(RULES)
        return sorted((ctx.current_key, r) for r, t in rules.items() if total.value() >= t)

    def process_broadcast_element(self, value: tuple[Any, ...], ctx: BroadcastContext) -> Any:
        rules = ctx.get_broadcast_state(RULES)
        command = value[0]
        if command == "put":
            rules.put(value[1], value[2])
        elif command == "remove":
            rules.remove(value[1])
        elif command == "dump":
            return [dict(rules.items())]
        elif command == "visit":
            visited: list[Any] = []
            ctx.apply_to_keyed_state(TOTAL, lambda k, s: visited.append((k, s.value())))
            return sorted(visited, key=repr)
        return None


def harness(backend: str, function: Any = None, **kwargs: Any) -> KeyedBroadcastOperatorHarness:
    kwargs.setdefault("broadcast_state_descriptors", [RULES])
    return KeyedBroadcastOperatorHarness(
        function or Rules(), key_of, state_backend=backend, **kwargs
    )


def test_rules_written_on_the_broadcast_side_are_read_by_keyed_elements(backend: str) -> None:
    with harness(backend) as h:
        assert h.process_element(("a", 5)) == []
        h.process_broadcast_element(("put", "small", 3))
        h.process_broadcast_element(("put", "big", 10))
        assert h.process_element(("a", 1)) == [("a", "small")]
        assert h.process_element(("b", 12)) == [("b", "big"), ("b", "small")]
        h.process_broadcast_element(("remove", "small"))
        assert h.process_element(("a", 4)) == [("a", "big")]
        assert h.process_broadcast_element(("dump",)) == [{"big": 10}]


def test_read_only_view_supports_every_read(backend: str) -> None:
    class Reader(Rules):
        def process_element(self, value: Any, ctx: KeyedContext) -> list[Any]:
            rules = ctx.get_broadcast_state(RULES)
            return [(rules.get("r"), rules.get("zz", -1), rules["r"], "r" in rules,
                     rules.contains("zz"), sorted(rules.keys()), sorted(rules.values()),
                     sorted(rules), rules.is_empty())]

    with harness(backend, Reader()) as h:
        h.process_broadcast_element(("put", "r", 1))
        h.process_broadcast_element(("put", "s", 2))
        assert h.process_element(("a", 0)) == [
            (1, -1, 1, True, False, ["r", "s"], [1, 2], ["r", "s"], False)
        ]


WRITES = {
    "put": lambda rules: rules.put("r", 99),
    "put_all": lambda rules: rules.put_all({"r": 99}),
    "remove": lambda rules: rules.remove("r"),
    "clear": lambda rules: rules.clear(),
    "setitem": lambda rules: rules.__setitem__("r", 99),
    "delitem": lambda rules: rules.__delitem__("r"),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_broadcast_state_is_read_only_in_process_element(backend: str, write: str) -> None:
    class Writer(Rules):
        def process_element(self, value: Any, ctx: KeyedContext) -> None:
            WRITES[write](ctx.get_broadcast_state(RULES))

    with harness(backend, Writer()) as h:
        h.process_broadcast_element(("put", "r", 1))
        with pytest.raises(ReadOnlyStateError, match="process_element"):
            h.process_element(("a", 1))
        assert h.process_broadcast_element(("dump",)) == [{"r": 1}]


@pytest.mark.parametrize(
    "getter",
    ["get_state", "get_list_state", "get_map_state", "get_reducing_state",
     "get_aggregating_state"],
)
def test_keyed_state_is_not_available_in_process_broadcast_element(
    backend: str, getter: str
) -> None:
    class KeyedOnBroadcastSide(Rules):
        def process_broadcast_element(self, value: Any, ctx: BroadcastContext) -> None:
            getattr(ctx, getter)(TOTAL)

    with harness(backend, KeyedOnBroadcastSide()) as h:
        h.process_element(("a", 1))
        with pytest.raises(NoKeyContextError, match="apply_to_keyed_state"):
            h.process_broadcast_element(("x",))
        assert h.state_of("a", TOTAL) == 1


def test_apply_to_keyed_state_visits_every_key_with_state(backend: str) -> None:
    keys = ["a", "b", "c", 7, ("t", 1)]
    with harness(backend) as h:
        assert h.process_broadcast_element(("visit",)) == []
        for i, key in enumerate(keys):
            h.process_element((key, i + 1))
        h.process_element(("a", 10))
        visited = h.process_broadcast_element(("visit",))
    expected = [(k, i + 1 + (10 if k == "a" else 0)) for i, k in enumerate(keys)]
    assert visited == sorted(expected, key=repr)


def test_apply_to_keyed_state_can_update_and_clear_state_of_each_key(backend: str) -> None:
    class Resetter(Rules):
        def process_broadcast_element(self, value: Any, ctx: BroadcastContext) -> Any:
            if value[0] == "reset":
                def reset(key: Any, state: Any) -> None:
                    if key == "a":
                        state.clear()
                    else:
                        state.update(state.value() * 100)

                ctx.apply_to_keyed_state(TOTAL, reset)
                return None
            return super().process_broadcast_element(value, ctx)

    with harness(backend, Resetter()) as h:
        h.process_elements([("a", 1), ("b", 2), ("c", 3)])
        h.process_broadcast_element(("reset",))
        assert (h.state_of("a", TOTAL), h.state_of("b", TOTAL)) == (None, 200)
        assert sorted(h.keys(TOTAL)) == ["b", "c"]
        assert h.process_broadcast_element(("visit",)) == [("b", 200), ("c", 300)]
        # the broadcast side leaves no current key behind
        assert h.process_element(("a", 5)) == []
        assert h.state_of("a", TOTAL) == 5


def test_apply_to_keyed_state_visits_list_and_map_state_once_per_key(backend: str) -> None:
    events = ListStateDescriptor("events")
    by_kind = MapStateDescriptor("by_kind")

    class Collections(Rules):
        def process_element(self, value: Any, ctx: KeyedContext) -> None:
            ctx.get_list_state(events).add(value[1])
            ctx.get_map_state(by_kind).put(f"n{value[1]}", value[1])

        def process_broadcast_element(self, value: Any, ctx: BroadcastContext) -> list[Any]:
            seen: list[Any] = []
            ctx.apply_to_keyed_state(events, lambda k, s: seen.append((k, s.get())))
            ctx.apply_to_keyed_state(by_kind, lambda k, s: seen.append((k, dict(s.items()))))
            return seen

    with harness(backend, Collections()) as h:
        h.process_elements([("a", 1), ("b", 2), ("a", 3), ("a", 4)])
        assert sorted(h.process_broadcast_element(("visit",)), key=repr) == [
            ("a", [1, 3, 4]),
            ("a", {"n1": 1, "n3": 3, "n4": 4}),
            ("b", [2]),
            ("b", {"n2": 2}),
        ]


@pytest.mark.parametrize("side", ["keyed", "broadcast"])
def test_undeclared_broadcast_state_raises_registration_error(backend: str, side: str) -> None:
    other = MapStateDescriptor("other")

    class Undeclared(Rules):
        def process_element(self, value: Any, ctx: KeyedContext) -> None:
            ctx.get_broadcast_state(other)

        def process_broadcast_element(self, value: Any, ctx: BroadcastContext) -> None:
            ctx.get_broadcast_state(other)

    with harness(backend, Undeclared()) as h, pytest.raises(StateRegistrationError, match="oth"):
        if side == "keyed":
            h.process_element(("a", 1))
        else:
            h.process_broadcast_element(("x",))


def test_broadcast_state_with_other_serializers_than_declared_raises(backend: str) -> None:
    typed = MapStateDescriptor("rules", key_serializer=StrSerializer())

    class Mismatch(Rules):
        def process_broadcast_element(self, value: Any, ctx: BroadcastContext) -> None:
            ctx.get_broadcast_state(typed)

    with harness(backend, Mismatch()) as h, pytest.raises(StateRegistrationError):
        h.process_broadcast_element(("x",))


def test_broadcast_and_keyed_state_survive_snapshot_and_restore(backend: str) -> None:
    with harness(backend) as h:
        h.process_broadcast_element(("put", "small", 3))
        h.process_broadcast_element(("put", "big", 10))
        h.process_element(("a", 2))
        snap = h.snapshot()
    with KeyedBroadcastOperatorHarness.restore(
        Rules(), key_of, [snap], parallelism=1, subtask_index=0, state_backend=backend,
        broadcast_state_descriptors=[RULES],
    ) as r:
        assert r.process_broadcast_element(("dump",)) == [{"small": 3, "big": 10}]
        assert r.process_element(("a", 1)) == [("a", "small")]


def _run_at(backend: str, parallelism: int, snaps: list[Any] | None, keyed: list[Any],
            broadcast: list[Any]) -> list[Any]:
    """Run every subtask of ``parallelism`` (restored from ``snaps`` if given): each gets
    every broadcast element and the keyed elements it owns; their snapshots."""
    out = []
    for index in range(parallelism):
        kwargs: dict[str, Any] = {"state_backend": backend,
                                  "broadcast_state_descriptors": [RULES]}
        if snaps is None:
            h = harness(backend, parallelism=parallelism, subtask_index=index)
            h.open()
        else:
            h = KeyedBroadcastOperatorHarness.restore(
                Rules(), key_of, snaps, parallelism=parallelism, subtask_index=index, **kwargs
            )
        with h:
            for element in broadcast:
                h.process_broadcast_element(element)
            for element in keyed:
                if assign_key_to_parallel_operator(element[0], MAX_P, parallelism) == index:
                    h.process_element(element)
            out.append(h.snapshot())
    return out


@pytest.mark.parametrize("scales", [(2, 3), (3, 1), (2, 3, 1)], ids=lambda s: str(s))
def test_every_subtask_has_the_full_broadcast_map_after_rescale(
    backend: str, scales: tuple[int, ...]
) -> None:
    keys = [f"k{i}" for i in range(12)]
    rules = [("put", "r1", 1), ("put", "r2", 2), ("put", "r3", 100)]
    snaps = _run_at(backend, scales[0], None, [(k, 1) for k in keys], rules)
    for parallelism in scales[1:]:
        snaps = _run_at(backend, parallelism, snaps, [], [])
    final = scales[-1]
    seen: dict[str, list[Any]] = {}
    for index in range(final):
        with KeyedBroadcastOperatorHarness.restore(
            Rules(), key_of, snaps, parallelism=final, subtask_index=index,
            state_backend=backend, broadcast_state_descriptors=[RULES],
        ) as r:
            assert r.process_broadcast_element(("dump",)) == [{"r1": 1, "r2": 2, "r3": 100}]
            for key in keys:
                if assign_key_to_parallel_operator(key, MAX_P, final) == index:
                    seen[key] = r.process_element((key, 1))
    assert seen == {k: [(k, "r1"), (k, "r2")] for k in keys}
