"""Rescale matrix (RELIABILITY.md test 7): save at parallelism p, restore at p'.

One operator holds every kind of state weir redistributes: keyed value, list and
map state plus event- and processing-time timers, even-split operator list state,
union list state and broadcast state. A source run at parallelism p writes a full
checkpoint, (RocksDB) an incremental checkpoint and a savepoint, each taken after
two phases of work so that later checkpoints build on earlier ones; every new
subtask of p' is restored from one of them and compared with a pure-Python oracle:

* keyed state and timers equal the oracle, and each key lives only on the subtask
  owning its key group;
* even-split elements: at the same parallelism each subtask keeps its own list;
  otherwise all are present exactly once, in contiguous balanced chunks;
* union elements are all present on every subtask;
* broadcast state is equal on every subtask.

p, p' range over {1, 2, 3, 4, 8} with max parallelism 30 and 29 (29 is a multiple
of none of them). Savepoints are backend independent, so every artifact is also
restored into the other backend. Restoring above max parallelism is refused.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import weir
from weir import (
    BroadcastContext,
    CheckpointCoordinator,
    CheckpointedFunction,
    CheckpointKind,
    CompletedCheckpoint,
    ConfigurationError,
    Context,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedBroadcastProcessFunction,
    KeyedContext,
    ListStateDescriptor,
    MapStateDescriptor,
    ProcessFunction,
    RestoreError,
    ValueStateDescriptor,
)
from weir.checkpoint.format import KeyedFullHandle, KeyedIncrementalHandle, decode_keyed
from weir.state.keygroups import (
    assign_key_to_parallel_operator,
    assign_to_key_group,
    key_group_range_for_operator,
)
from weir.testing import CheckpointedFunctionHarness, KeyedBroadcastOperatorHarness

PARALLELISMS = (1, 2, 3, 4, 8)
COUNT = ValueStateDescriptor("count")
HISTORY = ListStateDescriptor("history")
TAGS = MapStateDescriptor("tags")
RULES = MapStateDescriptor("rules")
BUFFER = ListStateDescriptor("buffer")
SEEN = ListStateDescriptor("seen")
KEYED = (COUNT, HISTORY, TAGS)

TIMER_DELAY = 50
PROCESSING_BASE = 1_000_000
#: 60 keys of two types; ints and strs hash to key groups differently
KEYS: list[Any] = [f"user-{i}" for i in range(45)] + list(range(1000, 1015))


def key_of(element: tuple[Any, int]) -> Any:
    return element[0]


class Everything(
    KeyedBroadcastProcessFunction[tuple[Any, int], tuple[Any, ...], Any], CheckpointedFunction
):
    """Keyed elements ``(key, i)`` (event time ``i``) count, append ``i``, put
    ``tags["t{i%3}"] = i``, register an event-time timer at ``i + 50`` and a
    processing-time timer at ``1_000_000 + i``, and log ``"key:i"`` into the even-split
    list state; ``(key, -1)`` clears the key's state (not its timers). An event-time
    timer increments ``tags["fired"]``. The union list state holds one
    ``"subtask/parallelism:processed"`` per subtask. Broadcast elements are
    ``("put", rule, value)`` and ``("remove", rule)``."""

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        store = ctx.operator_state_store
        self.buffer_state = store.get_list_state(BUFFER)
        self.seen_state = store.get_union_list_state(SEEN)
        self.buffer: list[str] = self.buffer_state.get()
        self.processed = 0

    def open(self, ctx: KeyedContext) -> None:
        self.subtask = ctx.subtask_index
        self.parallelism = ctx.parallelism

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        self.buffer_state.update(self.buffer)
        self.seen_state.update([f"{self.subtask}/{self.parallelism}:{self.processed}"])

    def process_element(self, value: tuple[Any, int], ctx: KeyedContext) -> None:
        key, i = value
        if i < 0:
            ctx.get_state(COUNT).clear()
            ctx.get_list_state(HISTORY).clear()
            ctx.get_map_state(TAGS).clear()
            return
        count = ctx.get_state(COUNT)
        count.update((count.value() or 0) + 1)
        ctx.get_list_state(HISTORY).add(i)
        ctx.get_map_state(TAGS).put(f"t{i % 3}", i)
        ctx.timer_service.register_event_time_timer(i + TIMER_DELAY)
        ctx.timer_service.register_processing_time_timer(PROCESSING_BASE + i)
        self.buffer.append(f"{key}:{i}")
        self.processed += 1

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> None:
        tags = ctx.get_map_state(TAGS)
        tags.put("fired", tags.get("fired", 0) + 1)

    def process_broadcast_element(self, value: tuple[Any, ...], ctx: BroadcastContext) -> None:
        rules = ctx.get_broadcast_state(RULES)
        if value[0] == "put":
            rules.put(value[1], value[2])
        else:
            rules.remove(value[1])


# ---------------------------------------------------------------- workload and oracle

Event = tuple[Any, ...]


def phase_one() -> list[Event]:
    events: list[Event] = [("bc", "put", f"rule-{r}", r * 10) for r in range(6)]
    events += [("el", KEYS[(i * 7) % len(KEYS)], i) for i in range(120)]
    events.append(("wm", 100))
    return events


def phase_two() -> list[Event]:
    events: list[Event] = [("el", KEYS[(i * 11) % len(KEYS)], i) for i in range(120, 170)]
    events += [("clear", k) for k in (KEYS[3], KEYS[17], KEYS[50], KEYS[58])]
    events += [("bc", "remove", "rule-2"), ("bc", "put", "rule-0", -1)]
    events += [("bc", "put", "rule-extra", 99)]
    events += [("el", KEYS[17], 170), ("wm", 150)]
    return events


@dataclass
class Oracle:
    """What the state of ``Everything`` must be, computed without weir."""

    max_parallelism: int
    parallelism: int
    count: dict[Any, int] = field(default_factory=dict)
    history: dict[Any, list[int]] = field(default_factory=dict)
    tags: dict[Any, dict[str, int]] = field(default_factory=dict)
    event_timers: set[tuple[int, Any]] = field(default_factory=set)
    processing_timers: set[tuple[int, Any]] = field(default_factory=set)
    rules: dict[str, int] = field(default_factory=dict)
    buffers: list[list[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.buffers = [[] for _ in range(self.parallelism)]

    def apply(self, event: Event) -> None:
        kind = event[0]
        if kind == "el":
            _, key, i = event
            self.count[key] = self.count.get(key, 0) + 1
            self.history.setdefault(key, []).append(i)
            self.tags.setdefault(key, {})[f"t{i % 3}"] = i
            self.event_timers.add((i + TIMER_DELAY, key))
            self.processing_timers.add((PROCESSING_BASE + i, key))
            self.buffers[self.owner(key)].append(f"{key}:{i}")
        elif kind == "clear":
            for table in (self.count, self.history, self.tags):
                table.pop(event[1], None)
        elif kind == "bc":
            if event[1] == "put":
                self.rules[event[2]] = event[3]
            else:
                self.rules.pop(event[2], None)
        else:
            due = {t for t in self.event_timers if t[0] <= event[1]}
            self.event_timers -= due
            for _, key in due:
                tags = self.tags.setdefault(key, {})
                tags["fired"] = tags.get("fired", 0) + 1

    def owner(self, key: Any) -> int:
        return assign_key_to_parallel_operator(key, self.max_parallelism, self.parallelism)

    @property
    def union(self) -> list[str]:
        return sorted(
            f"{s}/{self.parallelism}:{len(b)}" for s, b in enumerate(self.buffers)
        )

    @property
    def even_split(self) -> list[str]:
        """Every old subtask's buffer, in subtask order."""
        return [e for b in self.buffers for e in b]


def oracle_for(max_parallelism: int, parallelism: int) -> Oracle:
    oracle = Oracle(max_parallelism, parallelism)
    for event in phase_one() + phase_two():
        oracle.apply(event)
    return oracle


def test_the_workload_exercises_every_kind_of_state() -> None:
    oracle = oracle_for(30, 3)
    assert len(oracle.count) == len(KEYS) - 3  # three of the four cleared keys stay gone
    assert KEYS[17] in oracle.count and KEYS[3] not in oracle.count
    assert KEYS[3] in oracle.tags  # a timer fired after its clear
    assert any("fired" in t for t in oracle.tags.values())
    assert 0 < len(oracle.event_timers) < len(oracle.processing_timers)
    assert all(oracle.buffers) and len(oracle.even_split) == 171
    assert oracle.rules == {"rule-0": -1, "rule-1": 10, "rule-3": 30, "rule-4": 40,
                            "rule-5": 50, "rule-extra": 99}
    for m in (29, 30):
        for p in PARALLELISMS:
            groups = {assign_to_key_group(k, m) for k in KEYS}
            owners = {assign_key_to_parallel_operator(k, m, p) for k in KEYS}
            assert owners == set(range(p)), (m, p)  # every subtask owns some key
            assert len(groups) > 20


# ---------------------------------------------------------------- source runs


@dataclass
class Saved:
    """What one source run at parallelism p wrote."""

    full: CompletedCheckpoint
    incremental: CompletedCheckpoint | None
    savepoint: CompletedCheckpoint

    def artifact(self, mode: str) -> CompletedCheckpoint:
        found = {"full": self.full, "incremental": self.incremental,
                 "savepoint": self.savepoint}[mode]
        assert found is not None
        return found


def make_harness(backend: str, max_parallelism: int, parallelism: int, index: int) -> Any:
    return KeyedBroadcastOperatorHarness(
        Everything(), key_of, state_backend=backend, max_parallelism=max_parallelism,
        parallelism=parallelism, subtask_index=index, broadcast_state_descriptors=[RULES],
    )


def drive(harnesses: list[Any], events: list[Event], max_parallelism: int) -> None:
    p = len(harnesses)
    for event in events:
        if event[0] == "el":
            target = harnesses[assign_key_to_parallel_operator(event[1], max_parallelism, p)]
            target.process_element((event[1], event[2]), event[2])
        elif event[0] == "clear":
            target = harnesses[assign_key_to_parallel_operator(event[1], max_parallelism, p)]
            target.process_element((event[1], -1))
        elif event[0] == "bc":
            for h in harnesses:
                h.process_broadcast_element(event[1:])
        else:
            for h in harnesses:
                h.advance_watermark(event[1])


def save(root: Path, backend: str, max_parallelism: int, parallelism: int) -> Saved:
    """Run the workload at ``parallelism``: phase one, checkpoints, phase two,
    checkpoints again and a savepoint (the artifacts restore the final state)."""
    full = CheckpointCoordinator(root / "full", retained=2)
    incremental = CheckpointCoordinator(root / "incremental", retained=2)
    harnesses = [
        make_harness(backend, max_parallelism, parallelism, i) for i in range(parallelism)
    ]
    try:
        for h in harnesses:
            h.open()
        latest: dict[str, CompletedCheckpoint] = {}
        for phase in (phase_one(), phase_two()):
            drive(harnesses, phase, max_parallelism)
            latest["full"] = weir.take_checkpoint(
                full, [h.checkpointer(full.storage, "full") for h in harnesses]
            )
            if backend == "rocksdb":
                latest["incremental"] = weir.take_checkpoint(
                    incremental,
                    [h.checkpointer(incremental.storage, "incremental") for h in harnesses],
                )
        savepoint = weir.take_savepoint(
            full, [h.checkpointer(full.storage, "full") for h in harnesses], root / "savepoint"
        )
    finally:
        for h in harnesses:
            h.close()
    assert savepoint.kind is CheckpointKind.SAVEPOINT
    # restore from what a fresh process would load, not from the in-memory objects
    loaded_full = CheckpointCoordinator(root / "full").latest()
    assert loaded_full is not None
    assert loaded_full.checkpoint_id == latest["full"].checkpoint_id
    loaded_incremental = None
    if backend == "rocksdb":
        loaded_incremental = CheckpointCoordinator(root / "incremental").latest()
        assert loaded_incremental is not None
        handle = loaded_incremental.metadata.operators["operator"].subtasks[0].keyed
        assert isinstance(handle, KeyedIncrementalHandle)
    return Saved(loaded_full, loaded_incremental, weir.load_checkpoint(root / "savepoint"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``saved(backend, M, p)``: the artifacts of one source run, made once per module."""
    cache: dict[tuple[str, int, int], Saved] = {}

    def get(backend: str, max_parallelism: int, parallelism: int) -> Saved:
        key = (backend, max_parallelism, parallelism)
        if key not in cache:
            root = tmp_path_factory.mktemp(f"{backend}-m{max_parallelism}-p{parallelism}")
            cache[key] = save(root, backend, max_parallelism, parallelism)
        return cache[key]

    yield get


# ---------------------------------------------------------------- restore and compare


def restore_all(artifact: CompletedCheckpoint, backend: str, parallelism: int) -> list[Any]:
    """Every subtask of ``parallelism`` restored from ``artifact`` and opened."""
    harnesses: list[Any] = []
    try:
        for index in range(parallelism):
            harnesses.append(KeyedBroadcastOperatorHarness.restore(
                Everything(), key_of, artifact, parallelism=parallelism, subtask_index=index,
                state_backend=backend, broadcast_state_descriptors=[RULES],
            ))
    except BaseException:
        close_all(harnesses)
        raise
    return harnesses


def close_all(harnesses: list[Any]) -> None:
    for h in harnesses:
        h.close()


def owned_keys(max_parallelism: int, parallelism: int, index: int) -> set[Any]:
    return {k for k in KEYS
            if assign_key_to_parallel_operator(k, max_parallelism, parallelism) == index}


def check_state(
    harnesses: list[Any], oracle: Oracle, union: list[str], old_chunks: list[list[str]]
) -> list[list[str]]:
    """The restored subtasks together hold exactly the oracle's state, each key on
    the subtask owning its key group only; ``old_chunks`` is the even-split list of
    each old subtask. Returns the restored even-split lists."""
    p_new = len(harnesses)
    m = oracle.max_parallelism
    count: dict[Any, int] = {}
    history: dict[Any, list[int]] = {}
    tags: dict[Any, dict[str, int]] = {}
    event_timers: list[tuple[int, Any]] = []
    processing_timers: list[tuple[int, Any]] = []
    chunks: list[list[str]] = []
    for index, h in enumerate(harnesses):
        assert h.operator.config.max_parallelism == m
        assert h.operator.config.key_group_range == key_group_range_for_operator(m, p_new, index)
        owned = owned_keys(m, p_new, index)
        for descriptor, into in ((COUNT, count), (HISTORY, history), (TAGS, tags)):
            keys = h.keys(descriptor)
            assert set(keys) <= owned, f"{descriptor.name}: foreign keys on subtask {index}"
            assert len(keys) == len(set(keys))
            for key in keys:
                assert key not in into, f"{key!r} of {descriptor.name} on two subtasks"
                into[key] = h.state_of(key, descriptor)
        for timers, into_timers in ((h.event_time_timers(), event_timers),
                                    (h.processing_time_timers(), processing_timers)):
            assert {k for _, k in timers} <= owned, f"foreign timers on subtask {index}"
            assert [t for t, _ in timers] == sorted(t for t, _ in timers)
            into_timers.extend(timers)
        assert sorted(h.operator_state_of(SEEN.name)) == union
        assert h.broadcast_state_of(RULES) == oracle.rules
        chunk = h.operator_state_of(BUFFER.name)
        assert h.operator.function.buffer == chunk
        chunks.append(chunk)
    assert count == oracle.count
    assert history == oracle.history
    assert tags == oracle.tags
    assert len(event_timers) == len(oracle.event_timers)
    assert set(event_timers) == oracle.event_timers
    assert len(processing_timers) == len(oracle.processing_timers)
    assert set(processing_timers) == oracle.processing_timers
    # even split: every element exactly once, contiguous balanced chunks in old order
    # (one even-split state: its first chunk goes to subtask 0), or at the same
    # parallelism each subtask's own list (Flink's RoundRobinOperatorStateRepartitioner)
    assert [e for c in old_chunks for e in c] == oracle.even_split
    assert Counter(e for c in chunks for e in c) == Counter(oracle.even_split)
    if len(old_chunks) == p_new:
        assert chunks == old_chunks
    else:
        assert [e for c in chunks for e in c] == oracle.even_split
        base, extra = divmod(len(oracle.even_split), p_new)
        assert [len(c) for c in chunks] == [base + (i < extra) for i in range(p_new)]
    return chunks


def check_keeps_working(harnesses: list[Any], oracle: Oracle) -> None:
    """Each restored subtask processes a new element and fires its restored timers."""
    for index, h in enumerate(harnesses):
        owned = owned_keys(oracle.max_parallelism, len(harnesses), index)
        if not owned:
            continue
        key = min(owned, key=repr)
        h.process_element((key, 10_000), 10_000)
        assert h.state_of(key, COUNT) == oracle.count.get(key, 0) + 1
        assert h.advance_watermark(10_000 + TIMER_DELAY) == []
        assert h.event_time_timers() == []
        assert h.state_of(key, TAGS)["fired"] == (
            oracle.tags.get(key, {}).get("fired", 0)
            + sum(1 for _, k in oracle.event_timers if k == key) + 1
        )


def restore_and_check(
    artifact: CompletedCheckpoint, backend: str, max_parallelism: int, p_old: int, p_new: int
) -> None:
    oracle = oracle_for(max_parallelism, p_old)
    harnesses = restore_all(artifact, backend, p_new)
    try:
        check_state(harnesses, oracle, oracle.union, oracle.buffers)
        check_keeps_working(harnesses, oracle)
    finally:
        close_all(harnesses)


def pairs(values: tuple[int, ...]) -> list[Any]:
    return [pytest.param(a, b, id=f"p{a}->p{b}") for a, b in itertools.product(values, values)]


#: (source backend, artifact, restore backend): every artifact into both backends
SCENARIOS = [
    ("hashmap", "full", "hashmap"),
    ("hashmap", "full", "rocksdb"),
    ("hashmap", "savepoint", "hashmap"),
    ("hashmap", "savepoint", "rocksdb"),
    ("rocksdb", "full", "rocksdb"),
    ("rocksdb", "full", "hashmap"),
    ("rocksdb", "incremental", "rocksdb"),
    ("rocksdb", "incremental", "hashmap"),
    ("rocksdb", "savepoint", "rocksdb"),
    ("rocksdb", "savepoint", "hashmap"),
]
FULL_MATRIX = [(*s, m) for m in (30, 29) for s in SCENARIOS]


def scenario_id(scenario: tuple[Any, ...]) -> str:
    src, mode, dst, m = scenario
    what = "savepoint" if mode == "savepoint" else f"chk-{mode}"
    return f"{src}-{what}->{dst}-M{m}"


def cases(scenarios: list[tuple[Any, ...]], matrix: list[Any]) -> list[Any]:
    return [
        pytest.param(*s, *pair.values, id=f"{scenario_id(s)}-{pair.id}")
        for s in scenarios
        for pair in matrix
    ]


@pytest.mark.parametrize(
    ("source", "mode", "target", "max_parallelism", "p_old", "p_new"),
    cases(FULL_MATRIX, pairs(PARALLELISMS)),
)
def test_rescale_restores_every_kind_of_state(
    saved: Any, source: str, mode: str, target: str, max_parallelism: int, p_old: int,
    p_new: int,
) -> None:
    artifact = saved(source, max_parallelism, p_old).artifact(mode)
    restore_and_check(artifact, target, max_parallelism, p_old, p_new)


def test_restore_at_max_parallelism_gives_each_subtask_one_key_group(saved: Any) -> None:
    artifact = saved("hashmap", 29, 3).savepoint
    restore_and_check(artifact, "hashmap", 29, 3, 29)


#: (source backend, artifact, p) then (restore backend, what it saves next, p') steps
CHAINS = [
    pytest.param(
        ("hashmap", "savepoint", 3),
        [("rocksdb", "incremental", 8), ("rocksdb", "savepoint", 2), ("hashmap", "full", 1),
         ("rocksdb", None, 4)],
        id="hashmap-savepoint-p3->rocksdb-p8-inc->rocksdb-p2-sp->hashmap-p1-full->rocksdb-p4",
    ),
    pytest.param(
        ("rocksdb", "incremental", 4),
        [("hashmap", "savepoint", 3), ("rocksdb", "full", 8), ("hashmap", "savepoint", 2),
         ("rocksdb", "incremental", 1), ("hashmap", None, 3)],
        id="rocksdb-inc-p4->hashmap-p3-sp->rocksdb-p8-full->hashmap-p2-sp->rocksdb-p1-inc"
           "->hashmap-p3",
    ),
]


@pytest.mark.parametrize(("start", "steps"), CHAINS)
def test_state_survives_a_chain_of_rescales_across_backends(
    saved: Any, tmp_path: Path, start: tuple[str, str, int],
    steps: list[tuple[str, str | None, int]],
) -> None:
    """Savepoints and checkpoints written by a restored job restore again, into
    either backend at any parallelism (hash-map -> RocksDB -> hash-map ...)."""
    backend, mode, p = start
    artifact = saved(backend, 30, p).artifact(mode)
    oracle = oracle_for(30, p)
    union = oracle.union
    chunks = oracle.buffers
    for n, (backend, next_mode, p_new) in enumerate(steps):
        harnesses = restore_all(artifact, backend, p_new)
        try:
            chunks = check_state(harnesses, oracle, union, chunks)
            if next_mode is None:
                check_keeps_working(harnesses, oracle)
                break
            coordinator = CheckpointCoordinator(tmp_path / f"chk-{n}")
            if next_mode == "savepoint":
                weir.take_savepoint(
                    coordinator, [h.checkpointer(coordinator.storage) for h in harnesses],
                    tmp_path / f"savepoint-{n}",
                )
                artifact = weir.load_checkpoint(tmp_path / f"savepoint-{n}")
            else:
                weir.take_checkpoint(
                    coordinator,
                    [h.checkpointer(coordinator.storage, next_mode) for h in harnesses],
                )
                latest = CheckpointCoordinator(tmp_path / f"chk-{n}").latest()
                assert latest is not None
                artifact = latest
            # the restored functions start counting again: one fresh entry per subtask
            union = sorted(f"{j}/{p_new}:0" for j in range(p_new))
        finally:
            close_all(harnesses)
    else:
        pytest.fail("a chain ends with a step that saves nothing")


def test_savepoint_entries_do_not_depend_on_the_backend(saved: Any) -> None:
    """A savepoint is canonical: the same state gives the same key groups, entries
    and metadata whichever backend wrote it (the entry order within a key group may
    differ: the hash-map backend keeps insertion order, RocksDB sorts)."""

    def entries(artifact: CompletedCheckpoint) -> list[Any]:
        out = []
        for handle in artifact.metadata.operators["operator"].subtasks:
            assert isinstance(handle.keyed, KeyedFullHandle)
            data = artifact.storage.read(handle.keyed.file)
            groups = decode_keyed(data, handle.keyed.key_groups, None, handle.keyed.file.path)
            out.append((
                handle.key_group_range, handle.metas, handle.timer_states,
                handle.operator_states, handle.broadcast_states,
                {g: {n: sorted(e) for n, e in per.items()} for g, per in groups.items()},
            ))
        return out

    for p in (1, 3, 8):
        hashmap, rocksdb = saved("hashmap", 30, p), saved("rocksdb", 30, p)
        assert entries(hashmap.savepoint) == entries(rocksdb.savepoint)


# ---------------------------------------------------------------- non-keyed operators


class Sink(ProcessFunction[str, Any], CheckpointedFunction):
    """A non-keyed function: even-split ``buffer`` and union ``seen`` list state only."""

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        store = ctx.operator_state_store
        self.buffer_state = store.get_list_state(BUFFER)
        self.seen_state = store.get_union_list_state(SEEN)
        self.buffer: list[str] = self.buffer_state.get()

    def open(self, ctx: Context) -> None:
        self.subtask = ctx.subtask_index

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        self.buffer_state.update(self.buffer)
        self.seen_state.update([f"{self.subtask}:{len(self.buffer)}"])

    def process_element(self, value: str, ctx: Context) -> None:
        self.buffer.append(value)


@pytest.mark.parametrize("mode", ["full", "incremental", "savepoint"])
@pytest.mark.parametrize("p_old", PARALLELISMS, ids=lambda p: f"p{p}")
def test_non_keyed_operator_state_rescales_through_durable_checkpoints(
    tmp_path: Path, mode: str, p_old: int
) -> None:
    m = 29
    coordinator = CheckpointCoordinator(tmp_path / "chk")
    # subtask i gets 3*i + 1 elements (uneven, never empty)
    per_subtask = [[f"s{i}-e{j}" for j in range(3 * i + 1)] for i in range(p_old)]
    harnesses = [
        CheckpointedFunctionHarness(Sink(), max_parallelism=m, parallelism=p_old, subtask_index=i)
        for i in range(p_old)
    ]
    try:
        for h, elements in zip(harnesses, per_subtask, strict=True):
            h.open()
            for e in elements:
                h.process_element(e)
        if mode == "savepoint":
            weir.take_savepoint(
                coordinator, [h.checkpointer(coordinator.storage) for h in harnesses],
                tmp_path / "savepoint",
            )
            artifact = weir.load_checkpoint(tmp_path / "savepoint")
        else:
            weir.take_checkpoint(
                coordinator, [h.checkpointer(coordinator.storage, mode) for h in harnesses]
            )
            latest = CheckpointCoordinator(tmp_path / "chk").latest()
            assert latest is not None
            artifact = latest
    finally:
        close_all(harnesses)
    everything = [e for elements in per_subtask for e in elements]
    union = sorted(f"{i}:{len(elements)}" for i, elements in enumerate(per_subtask))
    for p_new in PARALLELISMS:
        chunks = []
        for index in range(p_new):
            sink = Sink()
            with CheckpointedFunctionHarness.restore(
                sink, artifact, parallelism=p_new, subtask_index=index
            ) as h:
                assert h.operator.config.max_parallelism == m
                assert sorted(h.operator_state_of(SEEN.name)) == union
                assert sink.buffer == h.operator_state_of(BUFFER.name)
                chunks.append(sink.buffer)
        if p_new == p_old:  # each subtask keeps its own list (Flink)
            assert chunks == per_subtask
            continue
        assert [e for c in chunks for e in c] == everything
        base, extra = divmod(len(everything), p_new)
        assert [len(c) for c in chunks] == [base + (i < extra) for i in range(p_new)]
    with pytest.raises(RestoreError, match="max_parallelism"):
        CheckpointedFunctionHarness.restore(Sink(), artifact, parallelism=m + 1, subtask_index=0)


# ---------------------------------------------------------------- above max parallelism


@pytest.mark.parametrize("mode", ["full", "incremental", "savepoint"])
@pytest.mark.parametrize("subtask_index", [0, 30])
def test_restore_above_max_parallelism_raises_restore_error(
    saved: Any, mode: str, subtask_index: int
) -> None:
    artifact = saved("rocksdb", 30, 2).artifact(mode)
    with pytest.raises(RestoreError, match="max_parallelism") as info:
        KeyedBroadcastOperatorHarness.restore(
            Everything(), key_of, artifact, parallelism=31, subtask_index=subtask_index,
            state_backend="rocksdb", broadcast_state_descriptors=[RULES],
        )
    message = str(info.value)
    assert "31" in message and "30" in message
    assert "restore at a parallelism <= 30" in message


def test_restore_at_exactly_max_parallelism_is_allowed(saved: Any) -> None:
    artifact = saved("hashmap", 30, 4).savepoint
    with KeyedBroadcastOperatorHarness.restore(
        Everything(), key_of, artifact, parallelism=30, subtask_index=29,
        broadcast_state_descriptors=[RULES],
    ) as h:
        assert h.operator.config.key_group_range == key_group_range_for_operator(30, 30, 29)
        assert len(h.operator.config.key_group_range) == 1


def test_restore_in_memory_snapshots_above_max_parallelism_raises() -> None:
    """Without a durable checkpoint the harness builds the subtask first, so the
    operator configuration refuses it (ConfigurationError, naming both numbers)."""
    with make_harness("hashmap", 30, 1, 0) as h:
        drive([h], phase_one(), 30)
        snapshot = h.snapshot()
    with pytest.raises(ConfigurationError, match=r"parallelism=31 is above max_parallelism=30"):
        KeyedBroadcastOperatorHarness.restore(
            Everything(), key_of, [snapshot], parallelism=31, subtask_index=0,
            broadcast_state_descriptors=[RULES],
        )


def test_restore_with_another_max_parallelism_raises_restore_error(saved: Any) -> None:
    artifact = saved("hashmap", 30, 2).savepoint
    with pytest.raises(RestoreError, match="max_parallelism"):
        KeyedBroadcastOperatorHarness.restore(
            Everything(), key_of, artifact, parallelism=2, subtask_index=0,
            max_parallelism=29, broadcast_state_descriptors=[RULES],
        )
