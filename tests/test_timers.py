"""Event-time and processing-time timers of keyed functions, through KeyedOperatorHarness."""

from __future__ import annotations

from typing import Any

import pytest

from weir import (
    KeyedContext,
    KeyedProcessFunction,
    NoKeyContextError,
    TimeDomain,
    ValueStateDescriptor,
)
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.testing import KeyedOperatorHarness, ManualClock

MAX_P = 128
COUNT = ValueStateDescriptor("count")


def key_of(element: tuple[Any, ...]) -> Any:
    return element[0]


class TimerFunction(KeyedProcessFunction[tuple[Any, str, int], tuple[Any, ...]]):
    """Elements are ``(key, command, timestamp)``; commands register or delete a timer.

    ``on_timer`` emits ``(key, timestamp, ctx.timestamp, ctx.time_domain, count)``
    where ``count`` is the number of elements the key has seen (keyed state)."""

    def process_element(self, value: tuple[Any, str, int], ctx: KeyedContext) -> None:
        _, command, ts = value
        count = ctx.get_state(COUNT)
        count.update((count.value() or 0) + 1)
        timers = ctx.timer_service
        {
            "event": timers.register_event_time_timer,
            "proc": timers.register_processing_time_timer,
            "del_event": timers.delete_event_time_timer,
            "del_proc": timers.delete_processing_time_timer,
        }[command](ts)

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> list[tuple[Any, ...]]:
        count = ctx.get_state(COUNT).value()
        return [(ctx.current_key, timestamp, ctx.timestamp, ctx.time_domain, count)]


def fired(outputs: list[tuple[Any, ...]]) -> list[tuple[Any, int]]:
    """``(key, timestamp)`` of each fired timer, in firing order."""
    return [(out[0], out[1]) for out in outputs]


def harness(backend: str, function: Any = None, **kwargs: Any) -> KeyedOperatorHarness:
    return KeyedOperatorHarness(
        function or TimerFunction(), key_of, state_backend=backend, **kwargs
    )


def test_event_time_timers_fire_in_timestamp_order_across_keys(backend: str) -> None:
    with harness(backend) as h:
        for element in [("a", "event", 30), ("b", "event", 10), ("c", "event", 20),
                        ("a", "event", 5), ("b", "event", 40)]:
            h.process_element(element)
        assert fired(h.advance_watermark(25)) == [("a", 5), ("b", 10), ("c", 20)]
        assert h.event_time_timers() == [(30, "a"), (40, "b")]
        assert fired(h.advance_watermark(100)) == [("a", 30), ("b", 40)]
        assert h.event_time_timers() == []


def test_processing_time_timers_fire_in_timestamp_order_across_keys(backend: str) -> None:
    with harness(backend) as h:
        for element in [("x", "proc", 300), ("y", "proc", 100), ("z", "proc", 200)]:
            h.process_element(element)
        assert h.advance_processing_time(99) == []
        assert fired(h.advance_processing_time(250)) == [("y", 100), ("z", 200)]
        assert fired(h.advance_processing_time(300)) == [("x", 300)]
        assert h.processing_time_timers() == []


def test_event_and_processing_timers_are_independent(backend: str) -> None:
    with harness(backend) as h:
        h.process_element(("a", "event", 10))
        h.process_element(("a", "proc", 10))
        out = h.advance_processing_time(50)
        assert [(o[0], o[1], o[3]) for o in out] == [("a", 10, TimeDomain.PROCESSING_TIME)]
        assert h.event_time_timers() == [(10, "a")]
        out = h.advance_watermark(50)
        assert [(o[0], o[1], o[3]) for o in out] == [("a", 10, TimeDomain.EVENT_TIME)]


def test_on_timer_sees_key_timestamp_domain_and_keyed_state_of_the_timer(backend: str) -> None:
    with harness(backend) as h:
        h.process_element(("a", "event", 7), timestamp=1)
        h.process_element(("a", "proc", 8), timestamp=2)
        h.process_element(("b", "event", 9), timestamp=3)
        assert h.advance_watermark(9) == [
            ("a", 7, 7, TimeDomain.EVENT_TIME, 2),
            ("b", 9, 9, TimeDomain.EVENT_TIME, 1),
        ]
        assert h.advance_processing_time(8) == [("a", 8, 8, TimeDomain.PROCESSING_TIME, 2)]


def test_time_domain_is_none_outside_on_timer(backend: str) -> None:
    class Probe(KeyedProcessFunction[Any, Any]):
        def process_element(self, value: Any, ctx: KeyedContext) -> list[Any]:
            ctx.timer_service.register_event_time_timer(1)
            return [ctx.time_domain]

    with harness(backend, Probe()) as h:
        assert h.process_element(("a",)) == [None]
        h.advance_watermark(5)
        assert h.process_element(("a",)) == [None]


def test_registering_the_same_timer_twice_fires_once(backend: str) -> None:
    with harness(backend) as h:
        h.process_element(("a", "event", 10))
        h.process_element(("a", "event", 10))
        h.process_element(("a", "proc", 10))
        h.process_element(("a", "proc", 10))
        assert h.event_time_timers() == [(10, "a")]
        assert fired(h.advance_watermark(10)) == [("a", 10)]
        assert fired(h.advance_processing_time(10)) == [("a", 10)]
        assert h.advance_watermark(1000) == []
        assert h.advance_processing_time(1000) == []


def test_deleted_timers_do_not_fire(backend: str) -> None:
    with harness(backend) as h:
        for element in [("a", "event", 10), ("a", "event", 20), ("b", "event", 10),
                        ("a", "proc", 10), ("a", "del_event", 10), ("a", "del_proc", 10)]:
            h.process_element(element)
        assert h.event_time_timers() == [(10, "b"), (20, "a")]
        assert h.processing_time_timers() == []
        assert fired(h.advance_watermark(100)) == [("b", 10), ("a", 20)]
        assert h.advance_processing_time(100) == []


def test_deleting_an_absent_timer_or_another_keys_timer_changes_nothing(backend: str) -> None:
    with harness(backend) as h:
        h.process_element(("a", "event", 10))
        h.process_element(("b", "del_event", 10))
        h.process_element(("a", "del_event", 11))
        assert fired(h.advance_watermark(10)) == [("a", 10)]


def test_timer_deleted_and_registered_again_fires_once(backend: str) -> None:
    with harness(backend) as h:
        for element in [("a", "event", 10), ("a", "del_event", 10), ("a", "event", 10)]:
            h.process_element(element)
        assert fired(h.advance_watermark(10)) == [("a", 10)]
        assert h.advance_watermark(11) == []


def test_timers_of_different_keys_at_the_same_timestamp_all_fire(backend: str) -> None:
    keys = ["a", "b", "c", 1, ("t", 2)]
    with harness(backend) as h:
        for key in keys:
            h.process_element((key, "event", 10))
            h.process_element((key, "proc", 10))
        ev = fired(h.advance_watermark(10))
        pt = fired(h.advance_processing_time(10))
    for out in (ev, pt):
        assert sorted(map(repr, out)) == sorted(repr((k, 10)) for k in keys)


class Chaining(TimerFunction):
    """On the timer at 10, registers timers at 5 and 15 (already reached) and at 30."""

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> list[tuple[Any, ...]]:
        if timestamp == 10:
            register = (
                ctx.timer_service.register_event_time_timer
                if ctx.time_domain is TimeDomain.EVENT_TIME
                else ctx.timer_service.register_processing_time_timer
            )
            for ts in (5, 15, 30):
                register(ts)
        return super().on_timer(timestamp, ctx)


def test_timer_registered_in_on_timer_for_a_reached_time_fires_in_the_same_advance(
    backend: str,
) -> None:
    with harness(backend, Chaining()) as h:
        h.process_element(("a", "event", 10))
        h.process_element(("a", "proc", 10))
        assert fired(h.advance_watermark(20)) == [("a", 10), ("a", 5), ("a", 15)]
        assert h.event_time_timers() == [(30, "a")]
        assert fired(h.advance_processing_time(20)) == [("a", 10), ("a", 5), ("a", 15)]
        assert h.processing_time_timers() == [(30, "a")]


def test_watermark_never_goes_backwards(backend: str) -> None:
    class Watermark(TimerFunction):
        def process_element(self, value: Any, ctx: KeyedContext) -> list[int]:
            super().process_element(value, ctx)
            return [ctx.timer_service.current_watermark]

    with harness(backend, Watermark()) as h:
        h.advance_watermark(50)
        assert h.advance_watermark(20) == []
        assert h.operator.current_watermark == 50
        # a timer behind the watermark does not fire on a late (older) watermark ...
        assert h.process_element(("a", "event", 30)) == [50]
        assert h.advance_watermark(40) == []
        assert h.advance_watermark(50) == []
        # ... but on the next one that moves event time forward
        assert fired(h.advance_watermark(51)) == [("a", 30)]
        assert h.operator.current_watermark == 51


def test_current_watermark_starts_at_long_min_value(backend: str) -> None:
    class Probe(KeyedProcessFunction[Any, Any]):
        def open(self, ctx: KeyedContext) -> None:
            self.at_open = (ctx.current_watermark, ctx.timer_service.current_watermark)

        def process_element(self, value: Any, ctx: KeyedContext) -> list[int]:
            return [ctx.current_watermark, ctx.timer_service.current_watermark]

    probe = Probe()
    with harness(backend, probe) as h:
        assert probe.at_open == (-(2**63), -(2**63))
        assert h.process_element(("a",)) == [-(2**63), -(2**63)]
        h.advance_watermark(-5)
        assert h.process_element(("a",)) == [-5, -5]


@pytest.mark.parametrize(
    "use",
    [
        lambda t: t.register_event_time_timer(1),
        lambda t: t.register_processing_time_timer(1),
        lambda t: t.delete_event_time_timer(1),
        lambda t: t.delete_processing_time_timer(1),
    ],
    ids=["register_event", "register_proc", "delete_event", "delete_proc"],
)
def test_timer_service_in_open_raises_no_key_context_error(backend: str, use: Any) -> None:
    class TimersInOpen(TimerFunction):
        def open(self, ctx: KeyedContext) -> None:
            use(ctx.timer_service)

    h = harness(backend, TimersInOpen())
    try:
        with pytest.raises(NoKeyContextError, match="open"):
            h.open()
    finally:
        h.close()


def test_pending_timers_survive_snapshot_and_restore(backend: str) -> None:
    with harness(backend) as h:
        for element in [("a", "event", 10), ("b", "event", 30), ("a", "proc", 20),
                        ("c", "proc", 40), ("c", "event", 5)]:
            h.process_element(element)
        assert fired(h.advance_watermark(10)) == [("c", 5), ("a", 10)]
        assert fired(h.advance_processing_time(20)) == [("a", 20)]
        snap = h.snapshot()
        assert h.event_time_timers() == [(30, "b")]
        assert h.processing_time_timers() == [(40, "c")]
    with KeyedOperatorHarness.restore(
        TimerFunction(), key_of, [snap], parallelism=1, subtask_index=0, state_backend=backend
    ) as r:
        assert r.event_time_timers() == [(30, "b")]
        assert r.processing_time_timers() == [(40, "c")]
        # the keyed state that on_timer reads came back too
        assert r.advance_watermark(100) == [("b", 30, 30, TimeDomain.EVENT_TIME, 1)]
        assert r.advance_processing_time(100) == [("c", 40, 40, TimeDomain.PROCESSING_TIME, 2)]


def _snapshots_at(backend: str, parallelism: int, elements: list[Any]) -> list[Any]:
    """Run ``elements`` routed by key over ``parallelism`` subtasks; snapshot each."""
    snaps = []
    for index in range(parallelism):
        with harness(backend, parallelism=parallelism, subtask_index=index) as h:
            for element in elements:
                if assign_key_to_parallel_operator(element[0], MAX_P, parallelism) == index:
                    h.process_element(element)
            snaps.append(h.snapshot())
    return snaps


@pytest.mark.parametrize(("old_p", "new_p"), [(1, 2), (1, 3), (2, 3), (3, 2), (3, 1)])
def test_rescaled_timers_fire_exactly_once_on_the_subtask_owning_their_key(
    backend: str, old_p: int, new_p: int
) -> None:
    keys = [f"key-{i}" for i in range(24)]
    elements = [(k, "event", 100 + i) for i, k in enumerate(keys)]
    elements += [(k, "proc", 500 + i) for i, k in enumerate(keys) if i % 2 == 0]
    snaps = _snapshots_at(backend, old_p, elements)

    seen: dict[tuple[str, Any, int], list[int]] = {}
    for index in range(new_p):
        with KeyedOperatorHarness.restore(
            TimerFunction(), key_of, snaps, parallelism=new_p, subtask_index=index,
            state_backend=backend,
        ) as r:
            for key, ts, _, domain, _ in r.advance_watermark(10_000):
                seen.setdefault((domain.value, key, ts), []).append(index)
            for key, ts, _, domain, _ in r.advance_processing_time(10_000):
                seen.setdefault((domain.value, key, ts), []).append(index)

    expected = {("event_time", k, 100 + i) for i, k in enumerate(keys)}
    expected |= {("processing_time", k, 500 + i) for i, k in enumerate(keys) if i % 2 == 0}
    assert set(seen) == expected
    for (_, key, _), subtasks in seen.items():
        assert subtasks == [assign_key_to_parallel_operator(key, MAX_P, new_p)]
    assert {s for subtasks in seen.values() for s in subtasks} == set(range(new_p))


def test_time_is_a_property_and_the_method_form_still_works_with_a_warning() -> None:
    """Plain values are properties on every weir object (issue 39): the watermark and
    processing time too; calling them as methods, as before, warns."""

    class Seen(KeyedProcessFunction[Any, Any]):
        def process_element(self, value: Any, ctx: KeyedContext) -> Any:
            assert ctx.current_watermark == ctx.timer_service.current_watermark
            with pytest.warns(DeprecationWarning, match="properties now"):
                called = ctx.timer_service.current_processing_time()  # type: ignore[operator]
            return [(int(ctx.current_watermark), called == ctx.current_processing_time)]

    with KeyedOperatorHarness(Seen(), lambda v: v, clock=ManualClock(7)) as h:
        h.advance_watermark(41)
        assert h.process_element("a", timestamp=50) == [(41, True)]
