"""Restoring checkpoints and savepoints: operator uids and non-restored state, state
migration checks (kind, serializer, TTL) before any record, asynchronous snapshots
that see exactly the state of their synchronous part, memory:// checkpoints, the
latest of several, and nothing to restore."""

from __future__ import annotations

import copy
import operator
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from weir import (
    AggregateFunction,
    AggregatingStateDescriptor,
    CheckpointCoordinator,
    CheckpointStorage,
    CompletedCheckpoint,
    CorruptCheckpointError,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    NoCheckpointError,
    ReducingStateDescriptor,
    RestoreError,
    StateMigrationError,
    StateTtlConfig,
    ValueStateDescriptor,
    load_checkpoint,
    take_checkpoint,
    take_savepoint,
)
from weir.api.serializers import IntSerializer, MsgpackSerializer, PickleSerializer
from weir.runtime.checkpointer import SubtaskCheckpointer
from weir.testing import KeyedOperatorHarness, ManualClock

MAXP = 32
BACKENDS = ("hashmap", "rocksdb")


def key_of(element: Any) -> Any:
    return element[0]


# ------------------------------------------------------------------ savepoints by operator uid

COUNT = ValueStateDescriptor("count")


class Count(KeyedProcessFunction[Any, Any]):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: Any, ctx: Any) -> None:
        self.count.update((self.count.value() or 0) + value[1])


def counts(h: KeyedOperatorHarness, keys: range) -> dict[Any, Any]:
    return {k: h.state_of(k, COUNT) for k in keys}


@pytest.mark.parametrize("kind", ["savepoint", "checkpoint"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_restore_by_operator_uid(tmp_path: Path, backend: str, kind: str) -> None:
    coord = CheckpointCoordinator(tmp_path / "chk")
    alpha = KeyedOperatorHarness(Count(), key_of, uid="alpha", state_backend=backend,
                                 max_parallelism=MAXP)
    beta = KeyedOperatorHarness(Count(), key_of, uid="beta", state_backend=backend,
                                max_parallelism=MAXP)
    with alpha, beta:
        alpha.process_elements((k, 1) for k in range(10))
        beta.process_elements((k, 100) for k in range(5, 15))
        cps = [alpha.checkpointer(coord.storage), beta.checkpointer(coord.storage)]
        if kind == "savepoint":
            completed = take_savepoint(coord, cps, tmp_path / "sp")
        else:
            completed = take_checkpoint(coord, cps)
    completed = load_checkpoint(completed.url)
    assert sorted(completed.metadata.operators) == ["alpha", "beta"]

    def restore(uid: str, allow: bool) -> KeyedOperatorHarness:
        return KeyedOperatorHarness.restore(
            Count(), key_of, completed, parallelism=1, subtask_index=0, uid=uid,
            state_backend=backend, allow_non_restored_state=allow,
        )

    with pytest.raises(RestoreError, match=r"operator\(s\) \['beta'\]") as err:
        restore("alpha", False)
    assert "allow_non_restored_state=True" in str(err.value)
    assert "give those operators their old uids" in str(err.value).lower()
    with pytest.raises(RestoreError, match=r"\['alpha'\]"):
        restore("beta", False)
    with pytest.raises(RestoreError, match=r"\['alpha', 'beta'\]"):
        restore("gamma", False)

    with restore("alpha", True) as h:
        assert counts(h, range(15)) == {k: (1 if k < 10 else None) for k in range(15)}
    with restore("beta", True) as h:
        assert counts(h, range(15)) == {k: (100 if k >= 5 else None) for k in range(15)}
    with restore("gamma", True) as h:  # a new operator starts empty
        assert h.keys(COUNT) == []


def test_in_memory_snapshots_of_another_uid_need_allow_non_restored_state() -> None:
    with KeyedOperatorHarness(Count(), key_of, uid="alpha", max_parallelism=MAXP) as h:
        h.process_element(("a", 1))
        snap = h.snapshot()
    with pytest.raises(RestoreError, match=r"\['alpha'\].*allow_non_restored_state=True"):
        KeyedOperatorHarness.restore(Count(), key_of, [snap], parallelism=1, subtask_index=0,
                                     uid="beta")
    with KeyedOperatorHarness.restore(Count(), key_of, [snap], parallelism=1, subtask_index=0,
                                      uid="beta", allow_non_restored_state=True) as h:
        assert h.keys(COUNT) == []


# ------------------------------------------------------------------ state migration


class Registers(KeyedProcessFunction[Any, Any]):
    """Registers ``descriptor`` in open(); counts what it processes."""

    def __init__(self, descriptor: Any) -> None:
        self.descriptor = descriptor
        self.opened = 0
        self.open_finished = 0
        self.processed = 0

    def open(self, ctx: Any) -> None:
        self.opened += 1
        self.state = ctx.get_state(self.descriptor)
        self.open_finished += 1

    def process_element(self, value: Any, ctx: Any) -> None:
        self.processed += 1
        self.state.update(value[1])


S = ValueStateDescriptor("s")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Checkpoints and savepoints of a msgpack ValueState 's' (no TTL), by source."""
    tmp = tmp_path_factory.mktemp("sources")
    out = {}
    for backend in BACKENDS:
        modes = ["full", "incremental"] if backend == "rocksdb" else ["full"]
        for mode in modes:
            coord = CheckpointCoordinator(tmp / f"{backend}-{mode}")
            with KeyedOperatorHarness(Registers(S), key_of, state_backend=backend,
                                      max_parallelism=MAXP) as h:
                h.process_elements((k, k * 10) for k in range(10))
                out[f"{backend}-{mode}-checkpoint"] = h.checkpoint(coord, mode=mode).url
                if mode == "full":
                    out[f"{backend}-savepoint"] = h.savepoint(coord, tmp / f"sp-{backend}").url
    return out


SOURCES = ["hashmap-full-checkpoint", "hashmap-savepoint", "rocksdb-full-checkpoint",
           "rocksdb-incremental-checkpoint", "rocksdb-savepoint"]
INCOMPATIBLE = {
    "int serializer": (ValueStateDescriptor("s", serializer=IntSerializer()),
                       "value state, serializers ['int64'], without TTL"),
    "pickle serializer": (ValueStateDescriptor("s", serializer=PickleSerializer()),
                          "value state, serializers ['pickle/5'], without TTL"),
    "value to list": (ListStateDescriptor("s"),
                      "list state, serializers ['msgpack/1'], without TTL"),
    "value to map": (MapStateDescriptor("s"),
                     "map state, serializers ['msgpack/1', 'msgpack/1'], without TTL"),
    "value to reducing": (ReducingStateDescriptor("s", reduce_function=operator.add),
                          "reducing state, serializers ['msgpack/1'], without TTL"),
}
OLD = "value state, serializers ['msgpack/1'], without TTL"
ADVICE = "Keep the old kind/serializer/TTL setting, or use a new state name"


@pytest.mark.parametrize("target", BACKENDS)
@pytest.mark.parametrize("change", sorted(INCOMPATIBLE))
@pytest.mark.parametrize("source", SOURCES)
def test_incompatible_state_fails_in_open_before_any_record(
    sources: dict[str, str], source: str, change: str, target: str
) -> None:
    descriptor, new = INCOMPATIBLE[change]
    completed = load_checkpoint(sources[source])
    fn = Registers(descriptor)
    with pytest.raises(StateMigrationError) as err:
        KeyedOperatorHarness.restore(fn, key_of, completed, parallelism=1, subtask_index=0,
                                     state_backend=target)
    message = str(err.value)
    assert f"state 's' was restored as {OLD} but is now registered as {new}" in message
    assert "operator 'operator' subtask 0/1" in message and ADVICE in message
    assert (fn.opened, fn.open_finished, fn.processed) == (1, 0, 0)

    # restoring alone does not fail; open() does, and nothing gets processed
    fn = Registers(descriptor)
    h = KeyedOperatorHarness.restore(fn, key_of, completed, parallelism=2, subtask_index=1,
                                     state_backend=target, open=False)
    try:
        with pytest.raises(StateMigrationError, match="was restored as"):
            h.open()
        assert (fn.opened, fn.open_finished, fn.processed) == (1, 0, 0)
    finally:
        h.close()


@pytest.mark.parametrize("target", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_compatible_descriptor_restores(sources: dict[str, str], source: str,
                                        target: str) -> None:
    """Control: the same kind with an equal serializer (even a new instance) restores."""
    fn = Registers(ValueStateDescriptor("s", serializer=MsgpackSerializer()))
    with KeyedOperatorHarness.restore(fn, key_of, load_checkpoint(sources[source]),
                                      parallelism=1, subtask_index=0,
                                      state_backend=target) as h:
        assert {k: h.state_of(k, S) for k in range(10)} == {k: k * 10 for k in range(10)}
        h.process_element((3, -1))
        assert h.state_of(3, S) == -1 and fn.processed == 1


class Lazy(KeyedProcessFunction[Any, Any]):
    """Registers its state on first use, inside process_element."""

    def __init__(self, descriptor: Any) -> None:
        self.descriptor = descriptor
        self.processed = 0

    def process_element(self, value: Any, ctx: Any) -> None:
        self.processed += 1
        ctx.get_state(self.descriptor).update(value[1])


@pytest.mark.parametrize("target", BACKENDS)
def test_lazily_registered_state_fails_at_first_access(
    sources: dict[str, str], target: str
) -> None:
    """weir can only compare a descriptor it has seen: a state registered lazily fails
    at its first access (inside the first record), and nothing is overwritten."""
    completed = load_checkpoint(sources["hashmap-savepoint"])
    fn = Lazy(ValueStateDescriptor("s", serializer=IntSerializer()))
    with KeyedOperatorHarness.restore(fn, key_of, completed, parallelism=1, subtask_index=0,
                                      state_backend=target) as h:
        with pytest.raises(StateMigrationError, match=ADVICE):
            h.process_element((3, 7))
        assert fn.processed == 1
        assert h.state_of(3, S) == 30  # the old descriptor still reads the old value


# ------------------------------------------------------------------ TTL switched on or off

TTL = StateTtlConfig(ttl_ms=100)
TTL_KINDS: dict[str, Callable[[StateTtlConfig | None], Any]] = {
    "value": lambda ttl: ValueStateDescriptor("s", ttl=ttl),
    "list": lambda ttl: ListStateDescriptor("s", ttl=ttl),
    "map": lambda ttl: MapStateDescriptor("s", ttl=ttl),
}
SERIALIZERS = {"value": "['msgpack/1']", "list": "['msgpack/1']",
               "map": "['msgpack/1', 'msgpack/1']"}


class Writes(KeyedProcessFunction[Any, Any]):
    def __init__(self, descriptor: Any) -> None:
        self.descriptor = descriptor
        self.processed = 0

    def open(self, ctx: Any) -> None:
        self.state = ctx.get_state(self.descriptor)

    def process_element(self, value: Any, ctx: Any) -> None:
        self.processed += 1
        kind = self.descriptor.kind.value
        if kind == "value":
            self.state.update(value[1])
        elif kind == "list":
            self.state.add(value[1])
        else:
            self.state.put("k", value[1])


def ttl_source(tmp_path: Path, kind: str, ttl: StateTtlConfig | None, backend: str,
               savepoint: bool) -> CompletedCheckpoint:
    coord = CheckpointCoordinator(tmp_path / "chk")
    with KeyedOperatorHarness(Writes(TTL_KINDS[kind](ttl)), key_of, state_backend=backend,
                              max_parallelism=MAXP, clock=ManualClock(0)) as h:
        h.process_elements((k, k) for k in range(5))
        completed = h.savepoint(coord, tmp_path / "sp") if savepoint else h.checkpoint(coord)
    return load_checkpoint(completed.url)


@pytest.mark.parametrize("savepoint", [True, False], ids=["savepoint", "checkpoint"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", sorted(TTL_KINDS))
@pytest.mark.parametrize("switch", ["ttl turned on", "ttl turned off"])
def test_switching_ttl_is_a_state_migration_error(
    tmp_path: Path, switch: str, kind: str, backend: str, savepoint: bool
) -> None:
    before, after = (None, TTL) if switch == "ttl turned on" else (TTL, None)
    completed = ttl_source(tmp_path, kind, before, backend, savepoint)
    assert completed.metadata.operators["operator"].subtasks[0].metas["s"].ttl is (
        before is not None
    )
    target = "rocksdb" if backend == "hashmap" else "hashmap"
    fn = Writes(TTL_KINDS[kind](after))
    with pytest.raises(StateMigrationError) as err:
        KeyedOperatorHarness.restore(fn, key_of, completed, parallelism=1, subtask_index=0,
                                     state_backend=target, clock=ManualClock(0))
    old_ttl, new_ttl = ("without TTL", "with TTL 100 ms") if before is None else (
        "with TTL", "without TTL")
    sers = SERIALIZERS[kind]
    assert str(err.value) == (
        f"operator 'operator' subtask 0/1: state 's' was restored as {kind} state, "
        f"serializers {sers}, {old_ttl} but is now registered as {kind} state, "
        f"serializers {sers}, {new_ttl}; weir cannot read the old bytes with the new "
        f"descriptor. {ADVICE}"
    )
    assert fn.processed == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_changing_only_the_ttl_duration_restores_with_the_new_duration(
    tmp_path: Path, backend: str
) -> None:
    """TTL stays on with another ttl_ms: compatible; restored timestamps are kept and
    the new duration decides expiry."""
    completed = ttl_source(tmp_path, "value", TTL, backend, savepoint=True)
    for ttl_ms, now, visible in [(1000, 150, True), (100, 150, False), (1000, 1000, False)]:
        desc = ValueStateDescriptor("s", ttl=StateTtlConfig(ttl_ms=ttl_ms))
        with KeyedOperatorHarness.restore(Writes(desc), key_of, completed, parallelism=1,
                                          subtask_index=0, state_backend=backend,
                                          clock=ManualClock(now)) as h:
            got = {k: h.state_of(k, desc) for k in range(5)}
            assert got == {k: (k if visible else None) for k in range(5)}, (ttl_ms, now)


# ------------------------------------------------------------------ asynchronous snapshots


class Collect(AggregateFunction[Any, list[Any], list[Any]]):
    """An accumulator list mutated in place by add()."""

    def create_accumulator(self) -> list[Any]:
        return []

    def add(self, value: Any, accumulator: list[Any]) -> list[Any]:
        accumulator.append(value)
        return accumulator

    def get_result(self, accumulator: list[Any]) -> list[Any]:
        return list(accumulator)

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return a + b


class CountingSerializer(MsgpackSerializer):
    """msgpack/1, counting encodes."""

    encodes = 0

    def encode(self, value: Any) -> bytes:
        CountingSerializer.encodes += 1
        return super().encode(value)


DICT = ValueStateDescriptor("dict")
LISTV = ValueStateDescriptor("listv")
NUM = ValueStateDescriptor("num", serializer=CountingSerializer())
ELEMS = ListStateDescriptor("elems")
MAPD = MapStateDescriptor("mapd")
ACC = AggregatingStateDescriptor("acc", aggregate_function=Collect())
RED = ReducingStateDescriptor("red", reduce_function=operator.add)
RICH = (DICT, LISTV, ELEMS, MAPD, ACC, RED)


class Mutator(KeyedProcessFunction[Any, Any]):
    """``(key, tag)`` mutates mutable values in place and writes them back; ``(key,
    None)`` only bumps an int; ``(key, "clear")`` clears every state of the key."""

    def open(self, ctx: Any) -> None:
        self.s = {d.name: ctx.get_state(d) for d in (*RICH, NUM)}

    def process_element(self, value: Any, ctx: Any) -> None:
        key, tag = value
        s = self.s
        s["num"].update((s["num"].value() or 0) + 1)
        if tag is None:
            return
        if tag == "clear":
            for state in s.values():
                state.clear()
            return
        d = s["dict"].value() or {}
        d[tag] = len(d)  # in place, then written back
        s["dict"].update(d)
        lv = s["listv"].value() or []
        lv.append(tag)
        s["listv"].update(lv)
        s["elems"].add(tag)
        md = s["mapd"].get("m") or {}
        md[tag] = key
        s["mapd"].put("m", md)
        s["mapd"].put(tag, {"t": [tag]})
        s["acc"].add(tag)
        s["red"].add(1)
        ctx.timer_service.register_event_time_timer(1000 + int(tag[1:]))


RICH_KEYS = range(12)
BULK_KEYS = range(100, 20_100)


def view(h: KeyedOperatorHarness) -> dict[str, Any]:
    """Everything the function could read, deep-copied (hash-map values are live)."""
    rich = {k: tuple(h.state_of(k, d) for d in RICH) for k in RICH_KEYS}
    return copy.deepcopy({
        "rich": rich,
        "num": {k: h.state_of(k, NUM) for k in (*RICH_KEYS, *BULK_KEYS[:50], BULK_KEYS[-1])},
        "num keys": len(h.keys(NUM)),
        "timers": h.event_time_timers(),
    })


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[str]]]:
    """Hold every asynchronous snapshot part until the returned event is set."""
    gate = threading.Event()
    threads: list[str] = []
    original = SubtaskCheckpointer._write

    def write(self: SubtaskCheckpointer, *args: Any) -> Any:
        threads.append(threading.current_thread().name)
        assert gate.wait(30), "gate never opened"
        return original(self, *args)

    monkeypatch.setattr(SubtaskCheckpointer, "_write", write)
    yield gate, threads
    gate.set()


@pytest.mark.parametrize("backend,mode", [("hashmap", "full"), ("rocksdb", "full"),
                                          ("rocksdb", "incremental")])
def test_asynchronous_snapshot_sees_the_state_of_its_synchronous_part(
    tmp_path: Path, backend: str, mode: str, gated: tuple[threading.Event, list[str]],
) -> None:
    gate, threads = gated
    coord = CheckpointCoordinator(tmp_path)
    with KeyedOperatorHarness(Mutator(), key_of, state_backend=backend,
                              max_parallelism=MAXP) as h:
        for i in range(3):
            h.process_elements((k, f"t{i * 100 + k}") for k in RICH_KEYS)
        h.process_elements((k, None) for k in BULK_KEYS)
        before = view(h)
        cp = h.checkpointer(coord.storage, mode)
        pending_cp = coord.trigger()
        CountingSerializer.encodes = 0
        pending = cp.snapshot(pending_cp.checkpoint_id, pending_cp.timestamp_ms)
        sync_encodes = CountingSerializer.encodes
        assert not pending.future.done(), "the asynchronous part is still held"
        assert threads and threads[0] != threading.current_thread().name

        # processing goes on while the snapshot is written
        h.process_elements((k, f"t{900 + k}") for k in RICH_KEYS[:8])  # in-place mutations
        h.process_elements((k, "clear") for k in RICH_KEYS[8:10])
        h.process_elements((k, f"t{950 + k}") for k in range(50, 53))  # new keys
        h.process_elements((k, None) for k in BULK_KEYS[:50])
        after = view(h)
        assert after != before
        assert after["rich"][0][0]["t900"] == 3 and "t900" not in before["rich"][0][0]

        gate.set()
        handle = pending.result(timeout=30)
        pending_cp.acknowledge(cp.uid, 1, MAXP, handle)
        completed = coord.complete(pending_cp)
        cp.notify_checkpoint_complete(completed.checkpoint_id)
        assert view(h) == after  # the live state keeps every later write
        assert {k: h.state_of(k, NUM) for k in range(50, 53)} == {k: 1 for k in range(50, 53)}

    assert handle.stats.sync_ms == pending.sync_ms
    if mode == "full":
        # the synchronous part only freezes; encoding is left to the worker
        assert pending.sync_ms < handle.stats.async_ms, handle.stats
        if backend == "hashmap":
            # int values are shared with the live dict and encoded later; mutable values
            # (dicts, lists) are encoded during the synchronous part instead
            assert sync_encodes == 0
            assert CountingSerializer.encodes >= len(BULK_KEYS)
    for target in BACKENDS:
        with KeyedOperatorHarness.restore(Mutator(), key_of, load_checkpoint(completed.url),
                                          parallelism=1, subtask_index=0,
                                          state_backend=target) as r:
            assert view(r) == before, target
            assert [r.state_of(k, NUM) for k in range(50, 53)] == [None] * 3


def test_synchronous_snapshot_mode_writes_before_returning(tmp_path: Path) -> None:
    """With asynchronous=False the handle is ready when snapshot() returns."""
    storage = CheckpointStorage(tmp_path)
    with KeyedOperatorHarness(Mutator(), key_of, max_parallelism=MAXP) as h:
        h.process_elements((k, f"t{k}") for k in RICH_KEYS)
        before = view(h)
        cp = SubtaskCheckpointer(h.operator, storage, asynchronous=False)
        coord = CheckpointCoordinator(storage)
        pending_cp = coord.trigger()
        pending = cp.snapshot(pending_cp.checkpoint_id, pending_cp.timestamp_ms)
        assert pending.future.done()
        h.process_elements((k, "clear") for k in RICH_KEYS)
        pending_cp.acknowledge(cp.uid, 1, MAXP, pending.result())
        completed = coord.complete(pending_cp)
    with KeyedOperatorHarness.restore(Mutator(), key_of, completed, parallelism=1,
                                      subtask_index=0) as r:
        assert view(r)["rich"] == before["rich"]


# ------------------------------------------------------------------ what to restore


@pytest.fixture
def memory_url() -> Iterator[str]:
    import uuid

    url = f"memory://weir-restore-{uuid.uuid4().hex}"
    yield url
    fs, root = fsspec.core.url_to_fs(url)
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.mark.parametrize("backend,mode", [("hashmap", "full"), ("rocksdb", "full"),
                                          ("rocksdb", "incremental")])
def test_restore_from_memory_checkpoint_into_both_backends(
    memory_url: str, backend: str, mode: str
) -> None:
    coord = CheckpointCoordinator(memory_url)
    with KeyedOperatorHarness(Count(), key_of, state_backend=backend,
                              max_parallelism=MAXP) as h:
        h.process_elements((k % 37, k) for k in range(500))
        chk = h.checkpoint(coord, mode=mode)
        sp = h.savepoint(coord, f"{memory_url}/savepoints/one")
    expected = {k: sum(v for v in range(500) if v % 37 == k) for k in range(37)}
    assert chk.url == f"{memory_url}/chk-1"
    for completed in (load_checkpoint(chk.url), load_checkpoint(sp.url),
                      CheckpointCoordinator(memory_url).latest()):
        assert completed is not None
        for target in BACKENDS:
            got: dict[Any, Any] = {}
            for i in range(2):
                with KeyedOperatorHarness.restore(Count(), key_of, completed, parallelism=2,
                                                  subtask_index=i, state_backend=target) as r:
                    got.update({k: r.state_of(k, COUNT) for k in r.keys(COUNT)})
            assert got == expected, (target, completed.url)


@pytest.mark.parametrize("location", ["local", "memory"])
@pytest.mark.parametrize("backend,mode", [("hashmap", "full"), ("rocksdb", "incremental")])
def test_the_latest_of_several_checkpoints_is_restored(
    tmp_path: Path, memory_url: str, location: str, backend: str, mode: str
) -> None:
    url = str(tmp_path / "chk") if location == "local" else memory_url
    coord = CheckpointCoordinator(url, retained=3)
    with KeyedOperatorHarness(Count(), key_of, state_backend=backend,
                              max_parallelism=MAXP) as h:
        for n in range(1, 6):
            h.process_elements((k, 1) for k in range(n * 4))
            h.checkpoint(coord, mode=mode)
    expected = {n: {k: sum(1 for m in range(1, n + 1) if k < m * 4) for k in range(n * 4)}
                for n in range(1, 6)}

    def restored(completed: CompletedCheckpoint | None) -> dict[Any, Any]:
        assert completed is not None
        with KeyedOperatorHarness.restore(Count(), key_of, completed, parallelism=1,
                                          subtask_index=0, state_backend=backend) as r:
            return {k: r.state_of(k, COUNT) for k in r.keys(COUNT)}

    assert [c.checkpoint_id for c in coord.completed_checkpoints] == [3, 4, 5]
    assert restored(coord.latest()) == expected[5]
    recovered = CheckpointCoordinator(url, retained=3)
    latest = recovered.latest()
    assert latest is not None and latest.checkpoint_id == 5
    assert restored(latest) == expected[5]

    # a corrupt latest checkpoint is skipped (with a warning) in favour of the one before
    storage = recovered.storage
    victim = latest.metadata.files()[-1]
    storage.fs.pipe_file(storage.full_path(victim.path), b"garbage")
    with pytest.warns(UserWarning, match="checkpoint 5 is corrupt and is skipped"):
        fallback = CheckpointCoordinator(url, retained=3).latest()
    assert fallback is not None and fallback.checkpoint_id == 4
    assert restored(fallback) == expected[4]
    with pytest.raises(CorruptCheckpointError, match=victim.path):
        load_checkpoint(latest.url)  # an explicit restore fails fast instead


def test_nothing_to_restore(tmp_path: Path, memory_url: str) -> None:
    (tmp_path / "empty").mkdir()
    for where in (tmp_path / "empty", tmp_path / "does-not-exist", memory_url):
        with pytest.raises(NoCheckpointError, match="no _metadata"):
            load_checkpoint(where)
        assert CheckpointCoordinator(where).latest() is None
    # a checkpoint that never published its metadata is not a checkpoint
    coord = CheckpointCoordinator(tmp_path / "chk")
    with KeyedOperatorHarness(Count(), key_of, max_parallelism=MAXP) as h:
        h.process_element(("a", 1))
        chk = h.checkpoint(coord)
    (tmp_path / "chk" / "chk-1" / "_metadata").unlink()
    with pytest.raises(NoCheckpointError, match="interrupted"):
        load_checkpoint(chk.url)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recovered = CheckpointCoordinator(tmp_path / "chk")
    assert recovered.latest() is None
    assert not (tmp_path / "chk" / "chk-1").exists()  # its files were orphans
