"""Operator (non-keyed) list and union list state of CheckpointedFunctions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir import (
    CheckpointedFunction,
    Context,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedContext,
    KeyedProcessFunction,
    ListStateDescriptor,
    ProcessFunction,
    RestoreError,
    StateRegistrationError,
    ValueStateDescriptor,
)
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.state.snapshot import (
    OperatorListStateSnapshot,
    OperatorSubtaskSnapshot,
    RedistributionMode,
    assign_operator_state,
)
from weir.testing import CheckpointedFunctionHarness, KeyedOperatorHarness

BUFFER = ListStateDescriptor("buffer")
SEEN = ListStateDescriptor("seen")


class BufferingSink(ProcessFunction[Any, Any], CheckpointedFunction):
    """Buffers elements in a Python list (even-split list state ``buffer``) and keeps
    ``(subtask, count)`` of elements seen per subtask in union list state ``seen``."""

    def __init__(self) -> None:
        self.buffer: list[Any] = []
        self.count = 0
        self.is_restored: bool | None = None
        self.snapshot_ids: list[int] = []

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        self.is_restored = ctx.is_restored
        store = ctx.operator_state_store
        self.buffer_state = store.get_list_state(BUFFER)
        self.seen_state = store.get_union_list_state(SEEN)
        self.buffer = self.buffer_state.get()
        self.restored_seen = self.seen_state.get()

    def open(self, ctx: Context) -> None:
        self.subtask = ctx.subtask_index

    def process_element(self, value: Any, ctx: Context) -> None:
        self.buffer.append(value)
        self.count += 1

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        self.snapshot_ids.append(ctx.checkpoint_id)
        self.buffer_state.update(self.buffer)
        self.seen_state.update([(self.subtask, self.count)])


def run_sinks(chunks: list[list[Any]]) -> list[Any]:
    """One fresh subtask per chunk (parallelism = len(chunks)); their snapshots."""
    snaps = []
    for index, chunk in enumerate(chunks):
        with CheckpointedFunctionHarness(
            BufferingSink(), parallelism=len(chunks), subtask_index=index
        ) as h:
            for element in chunk:
                h.process_element(element)
            snaps.append(h.snapshot())
    return snaps


def restore_all(snaps: list[Any], parallelism: int, **kwargs: Any) -> list[BufferingSink]:
    """Restore every subtask of ``parallelism`` from ``snaps``; their functions."""
    sinks = []
    for index in range(parallelism):
        sink = BufferingSink()
        CheckpointedFunctionHarness.restore(
            sink, snaps, parallelism=parallelism, subtask_index=index, **kwargs
        ).close()
        sinks.append(sink)
    return sinks


def test_is_restored_is_false_on_a_fresh_start_and_true_on_restore() -> None:
    fresh = BufferingSink()
    with CheckpointedFunctionHarness(fresh) as h:
        h.process_element("x")
        snap = h.snapshot()
    assert fresh.is_restored is False
    assert fresh.snapshot_ids == [1]
    (restored,) = restore_all([snap], 1)
    assert restored.is_restored is True
    assert restored.buffer == ["x"]


def test_restored_subtask_counts_checkpoint_ids_on_from_the_snapshot() -> None:
    with CheckpointedFunctionHarness(BufferingSink()) as h:
        h.snapshot()
        snap = h.snapshot(checkpoint_id=7)
    sink = BufferingSink()
    with CheckpointedFunctionHarness.restore(sink, [snap], parallelism=1, subtask_index=0) as r:
        r.snapshot()
    assert sink.snapshot_ids == [8]


def test_elements_not_snapshotted_into_state_are_not_restored() -> None:
    with CheckpointedFunctionHarness(BufferingSink()) as h:
        h.process_element("before")
        snap = h.snapshot()
        h.process_element("after")
    (restored,) = restore_all([snap], 1)
    assert restored.buffer == ["before"]


@pytest.mark.parametrize(
    ("chunks", "new_p", "expected"),
    [
        ([list(range(5))], 2, [[0, 1, 2], [3, 4]]),
        ([[0, 1], [2, 3, 4], [5, 6]], 2, [[0, 1, 2, 3], [4, 5, 6]]),
        ([["a", "b", "c"], ["d", "e", "f", "g"]], 5,
         [["a", "b"], ["c", "d"], ["e"], ["f"], ["g"]]),
        ([[1, 2], [], [3]], 2, [[1, 2], [3]]),
        ([[1], [2]], 5, [[1], [2], [], [], []]),
    ],
    ids=["1to2", "3to2", "2to5", "3to2-with-empty-subtask", "2to5-fewer-elements-than-subtasks"],
)
def test_list_state_is_split_into_contiguous_chunks_in_subtask_order(
    chunks: list[list[Any]], new_p: int, expected: list[list[Any]]
) -> None:
    sinks = restore_all(run_sinks(chunks), new_p)
    assert [s.buffer for s in sinks] == expected
    everything = [e for chunk in chunks for e in chunk]
    assert [e for s in sinks for e in s.buffer] == everything
    base, extra = divmod(len(everything), new_p)
    assert [len(s.buffer) for s in sinks] == [base + (i < extra) for i in range(new_p)]


@pytest.mark.parametrize(
    ("chunks", "new_p"),
    [([["a"] * 4], 2), ([["a"], ["b", "b"], []], 2), ([["a"] * 3, ["b"] * 2], 5)],
    ids=["1to2", "3to2", "2to5"],
)
def test_union_list_state_gives_every_new_subtask_all_elements(
    chunks: list[list[Any]], new_p: int
) -> None:
    sinks = restore_all(run_sinks(chunks), new_p)
    expected = [(index, len(chunk)) for index, chunk in enumerate(chunks)]
    assert [s.restored_seen for s in sinks] == [expected] * new_p


def test_rescaled_state_survives_a_second_rescale_unchanged() -> None:
    snaps = run_sinks([list(range(4)), list(range(4, 7))])
    for parallelism in (3, 5, 1):
        new_snaps = []
        for index in range(parallelism):
            with CheckpointedFunctionHarness.restore(
                BufferingSink(), snaps, parallelism=parallelism, subtask_index=index
            ) as h:
                new_snaps.append(h.snapshot())
        snaps = new_snaps
    (sink,) = restore_all(snaps, 1)
    assert sink.buffer == list(range(7))


@pytest.mark.parametrize(
    "chunks",
    [[[1, 2, 3], [4], []], [[], [1]], [list(range(7)), [7, 8]], [[1], [2], [3], [4]]],
    ids=["3-uneven", "2-first-empty", "2-long-first", "4-even"],
)
def test_list_state_restored_at_the_same_parallelism_keeps_each_subtasks_list(
    chunks: list[list[Any]],
) -> None:
    """Flink's RoundRobinOperatorStateRepartitioner returns the old lists untouched
    when the parallelism does not change (union state is still unioned)."""
    sinks = restore_all(run_sinks(chunks), len(chunks))
    assert [s.buffer for s in sinks] == chunks
    expected_seen = [(index, len(chunk)) for index, chunk in enumerate(chunks)]
    assert [s.restored_seen for s in sinks] == [expected_seen] * len(chunks)


class ManyLists(ProcessFunction[Any, Any], CheckpointedFunction):
    """Even-split list states ``a``, ``b``, ``c``, ``d``: element ``(name, x)`` goes to ``name``."""

    NAMES = ("a", "b", "c", "d")

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        store = ctx.operator_state_store
        self.states = {n: store.get_list_state(ListStateDescriptor(n)) for n in self.NAMES}
        self.restored = {n: s.get() for n, s in self.states.items()}

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        pass

    def process_element(self, value: Any, ctx: Context) -> None:
        self.states[value[0]].add(value[1])


def test_several_list_states_rotate_the_subtask_that_starts_each_split() -> None:
    """One element in each of four states, restored from 1 to 4 subtasks: Flink
    starts each state where the previous one's extra elements ended, so every
    subtask gets one element (not all four on subtask 0)."""
    with CheckpointedFunctionHarness(ManyLists()) as h:
        for name in ManyLists.NAMES:
            h.process_element((name, name.upper()))
        snap = h.snapshot()
    restored = []
    for index in range(4):
        fn = ManyLists()
        CheckpointedFunctionHarness.restore(fn, [snap], parallelism=4, subtask_index=index).close()
        restored.append({n: v for n, v in fn.restored.items() if v})
    assert restored == [{"a": ["A"]}, {"b": ["B"]}, {"c": ["C"]}, {"d": ["D"]}]


def test_rotation_matches_flinks_start_rule_for_uneven_states() -> None:
    """Five elements each in ``a`` and ``b``, from 1 to 2 subtasks: ``a`` starts at
    subtask 0 (3 + 2 elements), so ``b`` starts at subtask 1 (Flink's rule)."""
    with CheckpointedFunctionHarness(ManyLists()) as h:
        for name in ("a", "b"):
            for x in range(5):
                h.process_element((name, f"{name}{x}"))
        snap = h.snapshot()
    restored = []
    for index in range(2):
        fn = ManyLists()
        CheckpointedFunctionHarness.restore(fn, [snap], parallelism=2, subtask_index=index).close()
        restored.append({n: v for n, v in fn.restored.items() if v})
    assert restored == [
        {"a": ["a0", "a1", "a2"], "b": ["b3", "b4"]},
        {"a": ["a3", "a4"], "b": ["b0", "b1", "b2"]},
    ]


# redistribution properties (weir.state.snapshot.assign_operator_state) -------------

SPLIT = RedistributionMode.SPLIT_DISTRIBUTE
#: per old subtask, per state name, its elements (a state may be absent on a subtask)
OldLists = list[dict[str, list[bytes]]]


def old_lists(max_parallelism: int = 6) -> st.SearchStrategy[OldLists]:
    names = st.sampled_from(["a", "b", "c", "d", "e"])
    per_subtask = st.dictionaries(names, st.integers(0, 9), max_size=5)
    return st.lists(per_subtask, min_size=1, max_size=max_parallelism).map(
        lambda subtasks: [
            {n: [f"{n}/{i}/{j}".encode() for j in range(k)] for n, k in states.items()}
            for i, states in enumerate(subtasks)
        ]
    )


def snapshots_of(lists: OldLists) -> list[OperatorSubtaskSnapshot]:
    return [
        OperatorSubtaskSnapshot(
            "op", 1, 0, len(lists), i, 128,
            operator_states={
                n: OperatorListStateSnapshot(n, SPLIT, "msgpack/1", tuple(e))
                for n, e in states.items()
            },
        )
        for i, states in enumerate(lists)
    ]


def redistribute(lists: OldLists, parallelism: int) -> list[dict[str, list[bytes]]]:
    snaps = snapshots_of(lists)
    assigned = [assign_operator_state(snaps, parallelism, i) for i in range(parallelism)]
    return [{n: list(state.elements) for n, state in a.items()} for a in assigned]


def flink_round_robin(lists: OldLists, parallelism: int) -> list[dict[str, list[bytes]]]:
    """``RoundRobinOperatorStateRepartitioner.repartitionState`` for SPLIT_DISTRIBUTE
    state, transcribed loop for loop (states in name order: Flink iterates a hash map,
    weir sorts the names)."""
    names = sorted({n for states in lists for n in states})
    if parallelism == len(lists):
        return [{n: list(states.get(n, [])) for n in names} for states in lists]
    result: list[dict[str, list[bytes]]] = [{n: [] for n in names} for _ in range(parallelism)]
    start_parallel_op = 0
    for name in names:
        current = [e for states in lists for e in states.get(name, [])]
        total = len(current)
        base_fraction, remainder = divmod(total, parallelism)
        new_start_parallel_op = start_parallel_op
        taken = 0
        for i in range(parallelism):
            parallel_op_idx = (i + start_parallel_op) % parallelism
            number_to_assign = base_fraction
            if remainder > 0:
                number_to_assign += 1
                remainder -= 1
            elif remainder == 0:
                new_start_parallel_op = parallel_op_idx
                remainder -= 1
            result[parallel_op_idx][name] = current[taken : taken + number_to_assign]
            taken += number_to_assign
        start_parallel_op = new_start_parallel_op
    return result


@settings(max_examples=200, deadline=None)
@given(old_lists())
def test_same_parallelism_leaves_every_subtasks_lists_identical(lists: OldLists) -> None:
    got = redistribute(lists, len(lists))
    names = {n for states in lists for n in states}
    assert got == [{n: states.get(n, []) for n in names} for states in lists]


@settings(max_examples=300, deadline=None)
@given(old_lists(), st.integers(1, 7))
def test_redistribution_is_flinks_round_robin(lists: OldLists, parallelism: int) -> None:
    assert redistribute(lists, parallelism) == flink_round_robin(lists, parallelism)


@settings(max_examples=300, deadline=None)
@given(old_lists(), st.integers(1, 7))
def test_several_states_together_are_balanced_within_one_element(
    lists: OldLists, parallelism: int
) -> None:
    """On a parallelism change every state is split into contiguous chunks (in old
    subtask order) that differ by at most one element, and the total per new subtask
    over all states differs by at most one element too."""
    if parallelism == len(lists):
        parallelism += 1
    got = redistribute(lists, parallelism)
    for name in {n for states in lists for n in states}:
        old = [e for states in lists for e in states.get(name, [])]
        sizes = [len(states[name]) for states in got]
        assert max(sizes) - min(sizes) <= 1
        assert sorted(e for states in got for e in states[name]) == sorted(old)
        rotations = [
            [e for k in range(parallelism) for e in got[(start + k) % parallelism][name]]
            for start in range(parallelism)
        ]
        assert old in rotations  # contiguous chunks, read from some starting subtask on
    loads = [sum(len(v) for v in states.values()) for states in got]
    assert max(loads) - min(loads) <= 1


class DoubleRegistration(ProcessFunction[Any, Any], CheckpointedFunction):
    def __init__(self, second: str) -> None:
        self.second = second

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        store = ctx.operator_state_store
        self.states = [store.get_list_state(BUFFER), getattr(store, self.second)(BUFFER)]

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        pass

    def process_element(self, value: Any, ctx: Context) -> None:
        pass


def test_same_name_as_list_and_union_list_state_raises_registration_error() -> None:
    h = CheckpointedFunctionHarness(DoubleRegistration("get_union_list_state"))
    with pytest.raises(StateRegistrationError, match="buffer"):
        h.open()


def test_registering_the_same_list_state_twice_returns_the_same_state() -> None:
    fn = DoubleRegistration("get_list_state")
    with CheckpointedFunctionHarness(fn):
        first, second = fn.states
        first.add("x")
        assert second is first
        assert second.get() == ["x"]


def test_restoring_another_operators_snapshots_raises_restore_error() -> None:
    snaps = run_sinks([[1, 2]])
    with pytest.raises(RestoreError, match="allow_non_restored_state"):
        CheckpointedFunctionHarness.restore(
            BufferingSink(), snaps, parallelism=1, subtask_index=0, uid="other"
        )


def test_allow_non_restored_state_starts_empty_and_not_restored() -> None:
    snaps = run_sinks([[1, 2], [3]])
    sinks = restore_all(snaps, 2, uid="other", allow_non_restored_state=True)
    assert [(s.is_restored, s.buffer, s.restored_seen) for s in sinks] == [(False, [], [])] * 2


@pytest.mark.parametrize("missing", [0, 1, 2])
def test_restoring_from_an_incomplete_set_of_snapshots_raises_restore_error(
    missing: int,
) -> None:
    snaps = run_sinks([[1], [2], [3]])
    del snaps[missing]
    with pytest.raises(RestoreError, match="incomplete"):
        CheckpointedFunctionHarness.restore(BufferingSink(), snaps, parallelism=2, subtask_index=0)


def test_restoring_duplicate_snapshots_of_one_subtask_raises_restore_error() -> None:
    a, _ = run_sinks([[1], [2]])
    with pytest.raises(RestoreError):
        CheckpointedFunctionHarness.restore(BufferingSink(), [a, a], parallelism=1, subtask_index=0)


# keyed state and operator state together ------------------------------------------

TOTAL = ValueStateDescriptor("total")
MAX_P = 128


class KeyedSumWithOperatorLog(KeyedProcessFunction[tuple[str, int], Any], CheckpointedFunction):
    """Sums per key in keyed state; logs every key it saw in even-split operator state."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.is_restored: bool | None = None

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        self.is_restored = ctx.is_restored
        self.log_state = ctx.operator_state_store.get_list_state(ListStateDescriptor("log"))
        self.log = self.log_state.get()

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        self.log_state.update(self.log)

    def process_element(self, value: tuple[str, int], ctx: KeyedContext) -> list[Any]:
        total = ctx.get_state(TOTAL)
        total.update((total.value() or 0) + value[1])
        self.log.append(value[0])
        return [(ctx.current_key, total.value())]


def test_keyed_function_with_operator_state_restores_both(backend: str) -> None:
    fn = KeyedSumWithOperatorLog()
    with KeyedOperatorHarness(fn, lambda e: e[0], state_backend=backend) as h:
        assert h.process_elements([("a", 1), ("b", 2), ("a", 3)]) == [
            ("a", 1), ("b", 2), ("a", 4),
        ]
        snap = h.snapshot()
    assert fn.is_restored is False
    restored = KeyedSumWithOperatorLog()
    with KeyedOperatorHarness.restore(
        restored, lambda e: e[0], [snap], parallelism=1, subtask_index=0, state_backend=backend
    ) as r:
        assert restored.is_restored is True
        assert restored.log == ["a", "b", "a"]
        assert r.state_of("a", TOTAL) == 4
        assert r.process_element(("b", 10)) == [("b", 12)]


def test_keyed_function_with_operator_state_rescales_both(backend: str) -> None:
    keys = [f"k{i}" for i in range(10)]
    fn = KeyedSumWithOperatorLog()
    with KeyedOperatorHarness(fn, lambda e: e[0], state_backend=backend) as h:
        h.process_elements([(k, i) for i, k in enumerate(keys)])
        snap = h.snapshot()
    logs, totals = [], {}
    for index in range(2):
        restored = KeyedSumWithOperatorLog()
        with KeyedOperatorHarness.restore(
            restored, lambda e: e[0], [snap], parallelism=2, subtask_index=index,
            state_backend=backend,
        ) as r:
            logs.append(restored.log)
            owned = [k for k in keys if assign_key_to_parallel_operator(k, MAX_P, 2) == index]
            assert sorted(r.keys(TOTAL)) == sorted(owned)
            totals.update({k: r.state_of(k, TOTAL) for k in owned})
    assert logs == [keys[:5], keys[5:]]
    assert totals == {k: i for i, k in enumerate(keys)}


def test_a_subtask_restores_from_its_own_snapshot_alone_unless_it_needs_others() -> None:
    """At the old parallelism a subtask's own snapshot holds all it restores (its own
    even-split lists; the Spark runtime's tasks read only their own part); a single
    snapshot of another subtask, of another parallelism, or with union state (which
    needs every old subtask's list) is an incomplete set and refused."""
    snaps = []
    for index in range(3):
        with CheckpointedFunctionHarness(ManyLists(), parallelism=3, subtask_index=index) as h:
            for name in ManyLists.NAMES:
                h.process_element((name, f"{name}{index}"))
            snaps.append(h.snapshot())
    for index in range(3):
        alone, together = ManyLists(), ManyLists()
        CheckpointedFunctionHarness.restore(alone, [snaps[index]], parallelism=3,
                                            subtask_index=index).close()
        CheckpointedFunctionHarness.restore(together, snaps, parallelism=3,
                                            subtask_index=index).close()
        assert alone.restored == together.restored == {
            n: [f"{n}{index}"] for n in ManyLists.NAMES}
    for wrong in ({"parallelism": 3, "subtask_index": 1}, {"parallelism": 2, "subtask_index": 0}):
        with pytest.raises(RestoreError, match="expected one snapshot per subtask"):
            CheckpointedFunctionHarness.restore(ManyLists(), [snaps[0]], **wrong)
    with CheckpointedFunctionHarness(BufferingSink(), parallelism=2, subtask_index=0) as h:
        h.process_element(1)
        union = h.snapshot()
    with pytest.raises(RestoreError, match="expected one snapshot per subtask"):
        CheckpointedFunctionHarness.restore(BufferingSink(), [union], parallelism=2,
                                            subtask_index=0)
