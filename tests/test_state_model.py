"""Model-based test: a cluster of keyed subtasks (value, list, map, reducing and
aggregating state) against a plain-dict model, with records routed to their key's owner
and rescales that restore every snapshot at a new parallelism on the other backend.
After every step each key reads as modelled on its owner and has entries nowhere else.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from weir import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    KeyGroupError,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from weir.state.keygroups import assign_key_to_parallel_operator, assign_to_key_group
from weir.state.rocksdb import RocksDBMemory
from weir.testing import KeyedOperatorHarness


class Average(AggregateFunction[int, tuple[int, int], tuple[int, float]]):
    """Accumulator ``(count, sum)``; result ``(count, mean)`` (a doubled one is caught)."""

    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, accumulator: tuple[int, int]) -> tuple[int, int]:
        return (accumulator[0] + 1, accumulator[1] + value)

    def get_result(self, accumulator: tuple[int, int]) -> tuple[int, float]:
        return (accumulator[0], accumulator[1] / accumulator[0])

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


DESCRIPTORS: dict[str, Any] = {
    "value": ValueStateDescriptor("value"),
    "list": ListStateDescriptor("list"),
    "map": MapStateDescriptor("map"),
    "sum": ReducingStateDescriptor("sum", reduce_function=operator.add),
    "avg": AggregatingStateDescriptor("avg", aggregate_function=Average()),
}
#: Mixed key types; with M=7 several share key groups. -1 encodes as 0xff, the edge
#: of RocksDB's prefix-range deletes; M=1000 needs both bytes of the group prefix.
KEYS = ("a", "ü", "k" * 40, 0, -1, 2**64 - 1, ("a", 1), ("a", (1, "b")), (-1, -1), ())

#: Each run uses 2-4 of KEYS; a rule names one by slot, so keys are hit repeatedly.
slots = st.integers(0, 3)
#: 1, True and 1.0 are equal in Python but distinct keys to msgpack (and to Flink).
user_keys = st.sampled_from(("x", -1, ("x", 3), 1, True, 1.0))
values = st.one_of(
    st.integers(-(2**63), 2**64 - 1), st.text(max_size=4),
    st.tuples(st.integers(-3, 3), st.text(max_size=2)),
)
small_ints = st.integers(-1000, 1000)


def key_of(element: tuple[Any, Any, Any]) -> Any:
    return element[0]


class ApplyCommand(KeyedProcessFunction[Any, Any]):
    """Element ``(key, command, args)``: ``command`` is ``"clear_all"`` or
    ``(state name, method)``, called with ``args`` on the current key's state."""

    def process_element(self, value: Any, ctx: Any) -> list[Any]:
        # States are registered on first use, so restored state may stay unregistered
        # until the next snapshot (and must survive it).
        _, command, args = value
        if command == "clear_all":
            for desc in DESCRIPTORS.values():
                ctx.get_state(desc).clear()
            return [ctx.current_key, None]
        name, method = command
        result = getattr(ctx.get_state(DESCRIPTORS[name]), method)(*args)
        return [ctx.current_key, list(result) if method == "items" else result]


def typed(items: Any) -> list[tuple[str, str, str]]:
    """Map entries compared with key types (1, True and 1.0 are different keys)."""
    return sorted((type(k).__name__, repr(k), repr(v)) for k, v in items)


def empty_model() -> dict[str, Any]:
    return {"value": None, "list": [], "map": {}, "sum": None, "avg": None}


def expected_read(model: dict[str, Any], name: str) -> Any:
    if name == "avg" and model["avg"] is not None:
        return Average().get_result(model["avg"])
    return model[name]


class ClusterMachine(RuleBasedStateMachine):
    start_backend = "hashmap"

    def __init__(self) -> None:
        super().__init__()
        self.cluster: list[KeyedOperatorHarness] = []
        self.model = {k: empty_model() for k in KEYS}
        self.backend = self.start_backend
        self.max_parallelism = 1
        self.rescales = 0
        self.active: list[Any] = []
        self.memory = RocksDBMemory()

    @initialize(data=st.data(), max_parallelism=st.sampled_from([7, 30, 128, 1000]))
    def start(self, data: st.DataObject, max_parallelism: int) -> None:
        self.max_parallelism = max_parallelism
        p = data.draw(st.integers(1, min(4, max_parallelism)), label="parallelism")
        active = st.lists(st.sampled_from(KEYS), min_size=2, max_size=4, unique=True)
        self.active = data.draw(active, label="keys")
        # RocksDB's entry cache: off, evicting all the time, or holding every key
        cache = data.draw(st.sampled_from([0, 1, 2, 1 << 17]), label="cache entries")
        self.memory = RocksDBMemory(cache_entries=cache)
        self.cluster = [
            KeyedOperatorHarness(
                ApplyCommand(), key_of, state_backend=self.backend,
                max_parallelism=max_parallelism, parallelism=p, subtask_index=i,
                rocksdb_memory=self.memory,
            )
            for i in range(p)
        ]
        for harness in self.cluster:
            harness.open()

    def owner(self, key: Any) -> int:
        return assign_key_to_parallel_operator(key, self.max_parallelism, len(self.cluster))

    def send(self, slot: int, command: Any, *args: Any) -> dict[str, Any]:
        """Route a command for the key in ``slot`` to its owner; returns its model."""
        key = self.active[slot % len(self.active)]
        out = self.cluster[self.owner(key)].process_element((key, command, args))
        assert out == [key, None]
        return self.model[key]

    # value --------------------------------------------------------------------------
    @rule(k=slots, value=st.none() | values)
    def value_update(self, k: int, value: Any) -> None:
        self.send(k, ("value", "update"), value)["value"] = value  # None clears (Flink)

    @rule(k=slots)
    def value_clear(self, k: int) -> None:
        self.send(k, ("value", "clear"))["value"] = None

    # list ---------------------------------------------------------------------------
    @rule(k=slots, value=values)
    def list_add(self, k: int, value: Any) -> None:
        self.send(k, ("list", "add"), value)["list"].append(value)

    @rule(k=slots, items=st.lists(values, max_size=3))
    def list_add_all(self, k: int, items: list[Any]) -> None:
        self.send(k, ("list", "add_all"), items)["list"].extend(items)

    @rule(k=slots, items=st.lists(values, max_size=3))
    def list_update(self, k: int, items: list[Any]) -> None:
        self.send(k, ("list", "update"), items)["list"] = list(items)

    @rule(k=slots)
    def list_clear(self, k: int) -> None:
        self.send(k, ("list", "clear"))["list"] = []

    # map ----------------------------------------------------------------------------
    @rule(k=slots, user_key=user_keys, value=st.none() | values)
    def map_put(self, k: int, user_key: Any, value: Any) -> None:
        self.send(k, ("map", "put"), user_key, value)["map"][type(user_key), user_key] = value

    @rule(k=slots, user_key=user_keys)
    def map_remove(self, k: int, user_key: Any) -> None:
        self.send(k, ("map", "remove"), user_key)["map"].pop((type(user_key), user_key), None)

    @rule(k=slots)
    def map_clear(self, k: int) -> None:
        self.send(k, ("map", "clear"))["map"] = {}

    # reducing / aggregating -----------------------------------------------------------
    @rule(k=slots, value=small_ints)
    def reducing_add(self, k: int, value: int) -> None:
        model = self.send(k, ("sum", "add"), value)
        model["sum"] = value if model["sum"] is None else model["sum"] + value

    @rule(k=slots, value=small_ints)
    def aggregating_add(self, k: int, value: int) -> None:
        model = self.send(k, ("avg", "add"), value)
        count, total = model["avg"] or (0, 0)
        model["avg"] = (count + 1, total + value)

    @rule(k=slots)
    def clear_all(self, k: int) -> None:
        self.send(k, "clear_all").update(empty_model())

    # routing and rescaling ------------------------------------------------------------
    @precondition(lambda self: len(self.cluster) > 1)
    @rule(k=slots, data=st.data())
    def misrouted_record_is_rejected(self, k: int, data: st.DataObject) -> None:
        key = self.active[k % len(self.active)]
        others = [i for i in range(len(self.cluster)) if i != self.owner(key)]
        wrong = data.draw(st.sampled_from(others), label="wrong subtask")
        with pytest.raises(KeyGroupError):
            self.cluster[wrong].process_element((key, ("list", "add"), ("stray",)))

    @rule(data=st.data(), rounds=st.integers(1, 2))
    def rescale(self, data: st.DataObject, rounds: int) -> None:
        for _ in range(rounds):  # twice: snapshot a cluster that registered no state
            self.rescale_once(data)

    def rescale_once(self, data: st.DataObject) -> None:
        new_p = data.draw(st.integers(1, min(8, self.max_parallelism)), label="new p")
        snapshots = [h.snapshot() for h in self.cluster]
        for s in snapshots:
            assert s.keyed is not None
            assert all(g in s.keyed.key_group_range for g in s.keyed.groups), (
                f"subtask {s.subtask_index} snapshot holds key groups outside its range"
            )
        self.close_all()
        self.backend = "rocksdb" if self.backend == "hashmap" else "hashmap"
        order = data.draw(st.permutations(snapshots), label="snapshot order")
        self.cluster = [
            KeyedOperatorHarness.restore(ApplyCommand(), key_of, order, parallelism=new_p,
                                         subtask_index=i, state_backend=self.backend,
                                         rocksdb_memory=self.memory)
            for i in range(new_p)
        ]
        self.rescales += 1

    # invariants ---------------------------------------------------------------------
    @invariant()
    def every_key_reads_as_modelled_on_its_owner(self) -> None:
        for key in KEYS:
            harness = self.cluster[self.owner(key)]
            for name, desc in DESCRIPTORS.items():
                got, want = harness.state_of(key, desc), expected_read(self.model[key], name)
                if name == "map":  # state_of's dict merges keys 1/True/1.0: read items
                    items = harness.process_element((key, ("map", "items"), ()))[1]
                    assert got == dict(items)
                    got, want = typed(items), typed((k, v) for (_, k), v in want.items())
                assert got == want, (
                    f"{name} state of {key!r} (key group "
                    f"{assign_to_key_group(key, self.max_parallelism)}, subtask "
                    f"{self.owner(key)}/{len(self.cluster)}, {self.backend}, after "
                    f"{self.rescales} rescales): {got!r} != model {want!r}"
                )

    @invariant()
    def keys_live_only_on_their_owner(self) -> None:
        for name, desc in DESCRIPTORS.items():
            for index, harness in enumerate(self.cluster):
                listed = harness.keys(desc)
                expected = [k for k in KEYS if self.owner(k) == index
                            and self.model[k][name] not in (None, [], {})]
                assert len(listed) == len(set(listed)), f"{name}: duplicate keys {listed!r}"
                assert set(listed) == set(expected), (
                    f"{name} state on subtask {index}/{len(self.cluster)} ({self.backend}, "
                    f"after {self.rescales} rescales) has keys {listed!r}, expected "
                    f"{expected!r}"
                )

    def teardown(self) -> None:
        self.close_all()

    def close_all(self) -> None:
        cluster, self.cluster = self.cluster, []
        for harness in cluster:
            harness.close()


SETTINGS = settings(max_examples=30, stateful_step_count=30, deadline=None)


def test_cluster_state_matches_model_across_rescales(backend: str, rocksdb_tmp: Path) -> None:
    """Runs once per starting backend (the ``backend`` fixture of conftest)."""
    machine = type(f"ClusterMachineFrom_{backend}", (ClusterMachine,),
                   {"start_backend": backend})
    run_state_machine_as_test(machine, settings=SETTINGS)
    leaked = sorted(p.name for p in rocksdb_tmp.iterdir())
    assert not leaked, f"RocksDB directories left after every harness was closed: {leaked}"
