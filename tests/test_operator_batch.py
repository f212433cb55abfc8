"""KeyedOperator.process_keyed — the Spark runtime's loop over a slice of records —
behaves exactly as process_element record by record: outputs in order, state, record
timestamps, per-record TTL cleanup, states registered on first use."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import weir
from weir.runtime.operator import KeyedOperator, OperatorConfig
from weir.state.keygroups import canonical_key_bytes

TTL = weir.StateTtlConfig(ttl_ms=5).cleanup_incrementally(1, run_cleanup_for_every_record=True)
SEEN = weir.ListStateDescriptor[int]("seen", ttl=TTL)
COUNT = weir.ValueStateDescriptor[int]("count")


class Lazy(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Registers its states on first use; emits 0, 1 or 2 outputs per record."""

    def process_element(self, value: dict[str, Any], ctx: Any) -> Iterator[tuple[Any, ...]]:
        count = ctx.get_state(COUNT)
        n = (count.value() or 0) + 1
        count.update(n)
        # every key's TTL state is written in the first slice and then by few records:
        # the others clean it only through per-record cleanup
        if value["seq"] < 40 or value["seq"] % 50 == 0:
            ctx.get_state(SEEN).add(value["seq"])
        for i in range(value["seq"] % 3):
            yield (ctx.current_key, value["seq"], n, ctx.timestamp, i)


def _operator(backend: str, now: list[int]) -> KeyedOperator:
    op = KeyedOperator(Lazy(), lambda v: v["key"], OperatorConfig(uid="lazy",
                       state_backend=backend), clock=lambda: now[0])
    op.open()
    return op


def _state(op: KeyedOperator) -> dict[bytes, Any]:
    out = {}
    for name in ("count", "seen"):
        for prefixed in op.keyed_state.keys(name):
            op.key_context.set_current_prefixed_key(prefixed)
            state = op.get_state(COUNT if name == "count" else SEEN)
            out[name.encode() + prefixed] = state.value() if name == "count" else state.get()
    return out


def test_process_keyed_matches_process_element_on_both_backends(backend: str) -> None:
    records = [{"key": f"k{i % 40}", "seq": i} for i in range(200)]
    times = [None if i % 5 == 0 else 1_000 + i for i in range(200)]
    now_a, now_b = [0], [0]
    one, many = _operator(backend, now_a), _operator(backend, now_b)
    expected: list[Any] = []
    got: list[Any] = []
    for start in range(0, 200, 50):  # the clock moves between slices: TTL expires entries
        now_a[0] = now_b[0] = start // 10
        for record, ts in zip(records[start:start + 50], times[start:start + 50], strict=True):
            expected += one.process_element(record, ts)
        many.process_keyed(records[start:start + 50], [r["key"] for r in records[start:start + 50]],
                           times[start:start + 50], got)
    assert got == expected and len(got) == sum(r["seq"] % 3 for r in records)
    assert _state(many) == _state(one)
    assert many.keyed_state.record_cleaners  # registered on first use, and ran:
    assert len(many.keyed_state.keys("seen")) == 1  # only the last slice's entry is left
    assert canonical_key_bytes("k0") in b"".join(_state(many))
    one.close()
    many.close()


class _FailsAt3(weir.KeyedProcessFunction[int, int]):
    def process_element(self, value: int, ctx: Any) -> list[int]:
        if value == 3:
            raise RuntimeError("three")
        return [value, value]


def test_process_keyed_stops_at_the_record_that_raised_and_refuses_lengths_that_differ(
) -> None:
    """The values iterator is consumed in step, so what is left of it says which record
    raised (the Spark task names that record); values, keys and timestamps must be as
    many (as ``zip(strict=True)``)."""
    import operator as op_module

    import pytest

    op = KeyedOperator(_FailsAt3(), lambda v: v, OperatorConfig(uid="f"))
    op.open()
    values = [1, 2, 3, 4, 5]
    pending = iter(values)
    out: list[int] = []
    with pytest.raises(RuntimeError, match="three"):
        op.process_keyed(pending, values, [None] * 5, out)  # type: ignore[arg-type]
    assert len(values) - op_module.length_hint(pending) - 1 == 2 and out == [1, 1, 2, 2]
    for bad_values in ([1, 2], [1, 2, 4, 5]):
        with pytest.raises(ValueError, match="values"):
            op.process_keyed(bad_values, [1, 2, 4], [None] * 3, [])
    with pytest.raises(ValueError, match="timestamps"):
        op.process_keyed([1], [1], [None, None], [])
    op.close()
