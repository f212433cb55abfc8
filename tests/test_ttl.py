"""State TTL with a ManualClock on both backends: expiry boundary, update types,
visibility, per-element/per-entry expiry, every cleanup strategy and Flink's default
background cleanup (incremental on the hash map, compaction filter on RocksDB)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import weir
from support import Action, Actions, Average, key_of, write_state
from weir import (
    AggregatingStateDescriptor,
    CheckpointCoordinator,
    ConfigurationError,
    IncrementalCleanup,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    RocksDBCompactFilterCleanup,
    StateTtlConfig,
    StateVisibility,
    UpdateType,
    ValueStateDescriptor,
)
from weir.runtime.operator import OperatorConfig
from weir.testing import KeyedOperatorHarness, ManualClock

T = 100  # ttl in ms
KINDS = ["value", "list", "map", "reducing", "aggregating"]
OTHER = {"hashmap": "rocksdb", "rocksdb": "hashmap"}
NEVER = StateVisibility.NEVER_RETURN_EXPIRED
RETURN = StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP


def ttl(
    update: UpdateType = UpdateType.ON_CREATE_AND_WRITE, visibility: StateVisibility = NEVER
) -> StateTtlConfig:
    """A config without Flink's default background cleanup, so that a test sees
    exactly what reads and its chosen strategy do; the defaults are tested below."""
    return StateTtlConfig(
        ttl_ms=T, update_type=update, state_visibility=visibility
    ).disable_cleanup_in_background()


def descriptor(kind: str, cfg: StateTtlConfig | None) -> Any:
    return {
        "value": lambda: ValueStateDescriptor("s", ttl=cfg),
        "list": lambda: ListStateDescriptor("s", ttl=cfg),
        "map": lambda: MapStateDescriptor("s", ttl=cfg),
        "reducing": lambda: ReducingStateDescriptor(
            "s", reduce_function=lambda a, b: a + b, ttl=cfg
        ),
        "aggregating": lambda: AggregatingStateDescriptor(
            "s", aggregate_function=Average(), ttl=cfg
        ),
    }[kind]()


def writer(kind: str, desc: Any, value: Any) -> Action:
    return lambda c: write_state(c.get_state(desc), kind, value)


def seen(kind: str, value: Any) -> Any:
    """What ``state_of`` shows after one write of ``value``."""
    return {"list": [value], "map": {"k": value}}.get(kind, value)


EMPTY = {"value": None, "list": [], "map": {}, "reducing": None, "aggregating": None}


def do(h: KeyedOperatorHarness, key: Any, action: Action) -> Any:
    return h.process_element((key, action))[0]


def write(h: KeyedOperatorHarness, kind: str, desc: Any, key: Any, value: Any = 5) -> None:
    do(h, key, writer(kind, desc, value))


def make(backend: str, now: int = 0, on_open: Action | None = None) -> KeyedOperatorHarness:
    return KeyedOperatorHarness(
        Actions(on_open), key_of, state_backend=backend, clock=ManualClock(now)
    )


def restore(
    snapshot: weir.OperatorSubtaskSnapshot, backend: str, now: int, on_open: Action | None = None
) -> KeyedOperatorHarness:
    return KeyedOperatorHarness.restore(
        Actions(on_open), key_of, [snapshot], parallelism=1, subtask_index=0,
        state_backend=backend, clock=ManualClock(now),
    )


@pytest.fixture
def h(backend: str) -> Iterator[KeyedOperatorHarness]:
    with make(backend) as harness:
        yield harness


# Expiry and visibility ----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_value_is_visible_until_one_ms_before_ttl_and_expired_at_ttl(h, kind):
    desc = descriptor(kind, ttl())
    h.clock.advance(1000)
    write(h, kind, desc, "a")
    h.clock.advance(T - 1)
    assert h.state_of("a", desc) == seen(kind, 5)
    h.clock.advance(1)
    assert h.state_of("a", desc) == EMPTY[kind]


@pytest.mark.parametrize("visibility", [NEVER, RETURN], ids=["never", "return"])
@pytest.mark.parametrize(
    "update", [UpdateType.ON_CREATE_AND_WRITE, UpdateType.ON_READ_AND_WRITE],
    ids=["create-write", "read-write"],
)
@pytest.mark.parametrize("kind", KINDS)
def test_update_type_and_visibility(h, kind, update, visibility):
    desc = descriptor(kind, ttl(update, visibility))
    value, empty = seen(kind, 5), EMPTY[kind]
    expired_read = value if visibility is RETURN else empty
    write(h, kind, desc, "a")
    h.clock.advance(T - 1)
    assert h.state_of("a", desc) == value  # refreshes only ON_READ_AND_WRITE
    h.clock.advance(1)
    if update is UpdateType.ON_READ_AND_WRITE:
        assert h.state_of("a", desc) == value  # refreshed at T-1 (and now again at T)
        h.clock.advance(T)
    assert h.state_of("a", desc) == expired_read  # this read cleans it up
    assert h.state_of("a", desc) == empty
    assert h.keys(desc) == []


@pytest.mark.parametrize("kind", KINDS)
def test_writes_refresh_ttl_under_either_update_type(h, kind):
    desc = descriptor(kind, ttl(UpdateType.ON_CREATE_AND_WRITE))
    write(h, kind, desc, "a")
    h.clock.advance(T - 1)
    if kind == "list":
        do(h, "a", lambda c: c.get_state(desc).update([5]))  # re-stamps every element
    else:
        write(h, kind, desc, "a")
    h.clock.advance(T - 1)
    assert h.state_of("a", desc) == (10 if kind == "reducing" else seen(kind, 5))
    h.clock.advance(1)
    assert h.state_of("a", desc) == EMPTY[kind]


@pytest.mark.parametrize("visibility", [NEVER, RETURN], ids=["never", "return"])
def test_list_elements_expire_one_by_one(h, visibility):
    desc = descriptor("list", ttl(visibility=visibility))
    write(h, "list", desc, "a", 1)
    h.clock.advance(T // 2)
    write(h, "list", desc, "a", 2)
    h.clock.advance(T // 2)
    assert h.state_of("a", desc) == ([1, 2] if visibility is RETURN else [2])
    assert h.state_of("a", desc) == [2]
    h.clock.advance(T // 2)
    assert h.state_of("a", desc) == ([2] if visibility is RETURN else [])
    assert h.keys(desc) == []


def test_list_read_refreshes_only_live_elements_on_read_and_write(h):
    desc = descriptor("list", ttl(UpdateType.ON_READ_AND_WRITE))
    write(h, "list", desc, "a", 1)
    h.clock.advance(T // 2)
    write(h, "list", desc, "a", 2)
    h.clock.advance(T // 2)
    assert h.state_of("a", desc) == [2]  # 1 expired; 2 refreshed now
    h.clock.advance(T - 1)
    assert h.state_of("a", desc) == [2]


@pytest.mark.parametrize("visibility", [NEVER, RETURN], ids=["never", "return"])
def test_map_entries_expire_one_by_one(h, visibility):
    desc = descriptor("map", ttl(visibility=visibility))
    do(h, "a", lambda c: c.get_map_state(desc).put("old", 1))
    h.clock.advance(T // 2)
    do(h, "a", lambda c: c.get_map_state(desc).put("new", 2))
    h.clock.advance(T // 2)

    def probe(c: Any) -> tuple[Any, ...]:
        m = c.get_map_state(desc)
        return m.get("old"), "old" in m, m.get("new"), sorted(m)

    if visibility is RETURN:
        assert do(h, "a", probe) == (1, False, 2, ["new"])  # returned once, then gone
    else:
        assert do(h, "a", probe) == (None, False, 2, ["new"])
    h.clock.advance(T // 2)
    assert do(h, "a", lambda c: c.get_map_state(desc).is_empty()) is (visibility is NEVER)
    assert h.state_of("a", desc) == {}


@pytest.mark.parametrize("visibility", [NEVER, RETURN], ids=["never", "return"])
@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_add_after_expiry_starts_a_fresh_aggregate(h, kind, visibility):
    desc = descriptor(kind, ttl(visibility=visibility))
    for v in (1, 3):
        write(h, kind, desc, "a", v)
    assert h.state_of("a", desc) == (4 if kind == "reducing" else 2)
    h.clock.advance(T)
    write(h, kind, desc, "a", 10)
    assert h.state_of("a", desc) == 10
    h.clock.advance(T - 1)
    assert h.state_of("a", desc) == 10


# Cleanup strategies -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_reading_an_expired_value_removes_it_from_storage(h, kind):
    desc = descriptor(kind, ttl())
    write(h, kind, desc, "a")
    write(h, kind, desc, "b")
    h.clock.advance(T)
    assert sorted(h.keys(desc)) == ["a", "b"]  # nothing cleans up without access
    assert h.state_of("a", desc) == EMPTY[kind]
    assert h.keys(desc) == ["b"]


def _old_and_new(h: KeyedOperatorHarness, kind: str, desc: Any) -> None:
    """Keys o1, o2 written at 0 and n at T/2; the clock ends at T (o1, o2 expired)."""
    write(h, kind, desc, "o1")
    write(h, kind, desc, "o2")
    h.clock.advance(T // 2)
    write(h, kind, desc, "n")
    h.clock.advance(T // 2)


@pytest.mark.parametrize("full", [True, False], ids=["full-snapshot", "no-cleanup"])
@pytest.mark.parametrize("kind", KINDS)
def test_full_snapshot_cleanup_leaves_expired_values_out_of_snapshots(backend, kind, full):
    cfg = ttl().cleanup_in_full_snapshot() if full else ttl()
    desc = descriptor(kind, cfg)
    with make(backend) as h:
        _old_and_new(h, kind, desc)
        snapshot = h.snapshot()
        assert sorted(h.keys(desc)) == ["n", "o1", "o2"]  # live state untouched
        assert h.state_of("o1", desc) == EMPTY[kind]
        assert sorted(h.keys(desc)) == ["n", "o2"]
    for target in (backend, OTHER[backend]):
        with restore(snapshot, target, now=0) as r:  # a clock at 0: nothing expired
            assert sorted(r.keys(desc)) == (["n"] if full else ["n", "o1", "o2"])
            assert r.state_of("n", desc) == seen(kind, 5)


@pytest.mark.parametrize("kind", ["list", "map"])
def test_full_snapshot_cleanup_drops_single_list_elements_and_map_entries(backend, kind):
    desc = descriptor(kind, ttl(visibility=RETURN).cleanup_in_full_snapshot())
    with make(backend) as h:
        do(h, "a", lambda c: c.get_state(desc).put("old", 1) if kind == "map" else
           c.get_state(desc).add(1))
        h.clock.advance(T // 2)
        do(h, "a", lambda c: c.get_state(desc).put("new", 2) if kind == "map" else
           c.get_state(desc).add(2))
        h.clock.advance(T // 2)
        snapshot = h.snapshot()
    with restore(snapshot, backend, now=T) as r:  # RETURN would show what is stored
        assert r.state_of("a", desc) == ({"new": 2} if kind == "map" else [2])


@pytest.mark.parametrize("kind", KINDS)
def test_ttl_timestamps_survive_restore_into_the_other_backend(backend, kind):
    desc = descriptor(kind, ttl())
    with make(backend) as h:
        write(h, kind, desc, "a")
        snapshot = h.snapshot()
    with restore(snapshot, OTHER[backend], now=T // 2) as r:
        r.clock.advance(T // 2 - 1)
        assert r.state_of("a", desc) == seen(kind, 5)
        r.clock.advance(1)
        assert r.state_of("a", desc) == EMPTY[kind]


def reader(kind: str, desc: Any) -> Action:
    """An action reading the current key's state of ``desc``."""
    if kind == "value":
        return lambda c: c.get_state(desc).value()
    if kind == "map":
        return lambda c: c.get_state(desc).get("k")
    return lambda c: c.get_state(desc).get()


def _ten_expired_keys(backend: str, kind: str, desc: Any) -> Any:
    """A snapshot with keys 0..9 of ``desc``, all written at time 0."""
    with make(backend) as h:
        for k in range(10):
            write(h, kind, desc, k)
        snapshot = h.snapshot()
    return snapshot


@pytest.mark.parametrize("kind", KINDS)
def test_incremental_cleanup_checks_cleanup_size_entries_per_state_access(backend, kind):
    desc = descriptor(kind, ttl().cleanup_incrementally(3))
    with restore(_ten_expired_keys(backend, kind, desc), backend, now=T) as r:
        assert len(r.keys(desc)) == 10
        remaining = []
        for _ in range(4):
            do(r, "probe", reader(kind, desc))  # a key without state: reads nothing
            remaining.append(len(r.keys(desc)))
        assert remaining == [7, 4, 1, 0]


def test_incremental_cleanup_keeps_unexpired_entries(backend):
    desc = descriptor("value", ttl().cleanup_incrementally(3))
    with restore(_ten_expired_keys(backend, "value", desc), backend, now=T - 1) as r:
        for _ in range(5):
            do(r, "probe", reader("value", desc))
        assert sorted(r.keys(desc)) == list(range(10))


@pytest.mark.parametrize("every_record", [True, False], ids=["every-record", "access-only"])
@pytest.mark.parametrize("kind", KINDS)
def test_incremental_cleanup_for_every_record_cleans_other_keys(backend, kind, every_record):
    desc = descriptor(kind, ttl().cleanup_incrementally(4, every_record))
    snapshot = _ten_expired_keys(backend, kind, desc)
    register = lambda c: c.get_state(desc)  # noqa: E731
    with restore(snapshot, backend, now=T, on_open=register) as r:
        remaining = []
        for _ in range(3):
            do(r, "unrelated", lambda c: None)  # records that never touch the state
            remaining.append(len(r.keys(desc)))
        assert remaining == ([6, 2, 0] if every_record else [10, 10, 10])


@pytest.mark.parametrize("kind", KINDS)
def test_compaction_filter_drops_expired_entries_on_rocksdb_only(backend, kind):
    desc = descriptor(kind, ttl().cleanup_in_rocksdb_compact_filter(1))
    with make(backend) as h:
        _old_and_new(h, kind, desc)
        dropped = h.compact_state()
        if backend == "rocksdb":
            assert dropped == 2
            assert h.keys(desc) == ["n"]
        else:
            assert dropped == 0
            assert sorted(h.keys(desc)) == ["n", "o1", "o2"]
        assert h.state_of("n", desc) == seen(kind, 5)


def test_compaction_filter_keeps_live_list_elements(backend):
    desc = descriptor("list", ttl(visibility=RETURN).cleanup_in_rocksdb_compact_filter())
    with make(backend) as h:
        write(h, "list", desc, "a", 1)
        h.clock.advance(T // 2)
        write(h, "list", desc, "a", 2)
        h.clock.advance(T // 2)
        h.compact_state()
        # RETURN_EXPIRED shows what is still stored: compaction removed element 1
        assert h.state_of("a", desc) == ([2] if backend == "rocksdb" else [1, 2])


def test_compaction_leaves_states_without_the_filter_alone(backend):
    desc = descriptor("value", ttl())
    with make(backend) as h:
        write(h, "value", desc, "a")
        h.clock.advance(T)
        assert h.compact_state() == 0
        assert h.keys(desc) == ["a"]


# Default background cleanup (Flink's cleanupInBackground) -----------------------------


def test_background_cleanup_defaults_are_flinks():
    cfg = StateTtlConfig(ttl_ms=T)
    assert cfg.cleanup_in_background is True
    assert cfg.incremental_cleanup is None and cfg.rocksdb_compact_filter_cleanup is None
    assert cfg.incremental_cleanup_strategy == IncrementalCleanup(5, False)
    assert cfg.rocksdb_compact_filter_cleanup_strategy == RocksDBCompactFilterCleanup(1000)
    off = cfg.disable_cleanup_in_background()
    assert cfg.cleanup_in_background is True  # a copy: the original is unchanged
    assert off.cleanup_in_background is False
    assert off.incremental_cleanup_strategy is None
    assert off.rocksdb_compact_filter_cleanup_strategy is None
    # an explicitly chosen strategy is used whether background cleanup is on or off
    chosen = off.cleanup_incrementally(3, True).cleanup_in_rocksdb_compact_filter(7)
    assert chosen.incremental_cleanup_strategy == IncrementalCleanup(3, True)
    assert chosen.rocksdb_compact_filter_cleanup_strategy == RocksDBCompactFilterCleanup(7)
    assert StateTtlConfig(ttl_ms=T, cleanup_in_background=False) == off
    with pytest.raises(ConfigurationError, match="cleanup_in_background"):
        StateTtlConfig(ttl_ms=T, cleanup_in_background="no")  # type: ignore[arg-type]


def _probe(r: KeyedOperatorHarness, kind: str, desc: Any, times: int) -> list[int]:
    """Read ``desc`` of a key without state ``times`` times; keys left after each."""
    remaining = []
    for _ in range(times):
        do(r, "probe", reader(kind, desc))
        remaining.append(len(r.keys(desc)))
    return remaining


@pytest.mark.parametrize("kind", KINDS)
def test_default_config_cleans_up_in_the_background_as_flink_does(backend, kind):
    """No strategy chosen: the hash map checks 5 keys per state access (not per
    record); RocksDB runs the compaction filter (every 1000 entries re-reading the
    clock) when the runtime calls run_background_cleanup, and not on access."""
    desc = descriptor(kind, StateTtlConfig(ttl_ms=T))
    register = lambda c: c.get_state(desc)  # noqa: E731
    with restore(_ten_expired_keys(backend, kind, desc), backend, now=T, on_open=register) as r:
        do(r, "unrelated", lambda c: None)  # a record that never touches the state
        assert len(r.keys(desc)) == 10
        if backend == "hashmap":
            assert _probe(r, kind, desc, 2) == [5, 0]
            assert r.operator.run_background_cleanup() == 0
        else:
            assert _probe(r, kind, desc, 2) == [10, 10]
            assert r.operator.run_background_cleanup() == 10
        assert r.keys(desc) == []


@pytest.mark.parametrize("kind", KINDS)
def test_disabled_background_cleanup_keeps_expired_values_until_read(backend, kind, tmp_path):
    desc = descriptor(kind, StateTtlConfig(ttl_ms=T).disable_cleanup_in_background())
    with restore(_ten_expired_keys(backend, kind, desc), backend, now=T) as r:
        assert _probe(r, kind, desc, 3) == [10, 10, 10]
        assert r.operator.run_background_cleanup() == 0
        assert r.compact_state() == 0
        r.checkpoint(CheckpointCoordinator(tmp_path))
        assert len(r.keys(desc)) == 10
        assert r.state_of(3, desc) == EMPTY[kind]
        assert len(r.keys(desc)) == 9


def test_an_explicit_strategy_takes_precedence_over_the_default(backend):
    """Explicit incremental cleanup of 3 replaces the default 5 (and runs on RocksDB
    too, a weir extension); an explicit compaction filter leaves the hash map's
    default incremental cleanup on, and the default compaction filter still runs on
    RocksDB next to an explicit incremental cleanup."""
    three = descriptor("value", StateTtlConfig(ttl_ms=T).cleanup_incrementally(3))
    with restore(_ten_expired_keys(backend, "value", three), backend, now=T) as r:
        assert _probe(r, "value", three, 2) == [7, 4]
        assert r.operator.run_background_cleanup() == (4 if backend == "rocksdb" else 0)
        assert len(r.keys(three)) == (0 if backend == "rocksdb" else 4)
    compact = descriptor(
        "value", StateTtlConfig(ttl_ms=T).cleanup_in_rocksdb_compact_filter(1)
    )
    with restore(_ten_expired_keys(backend, "value", compact), backend, now=T) as r:
        assert _probe(r, "value", compact, 1) == ([5] if backend == "hashmap" else [10])


def _expired_and_live(
    backend: str, names: tuple[str, ...], expired: int, live: int
) -> KeyedOperatorHarness:
    """A harness at time T with ``expired`` keys written at 0 and ``live`` keys
    written at T/2 in each value state of ``names`` (default TTL config)."""
    descs = [ValueStateDescriptor(n, ttl=StateTtlConfig(ttl_ms=T)) for n in names]
    h = make(backend)
    h.open()
    for d in descs:
        for k in range(expired):
            write(h, "value", d, f"old-{k}")
    h.clock.advance(T // 2)
    for d in descs:
        for k in range(live):
            write(h, "value", d, f"new-{k}")
    h.clock.advance(T // 2)
    return h


def test_background_cleanup_is_bounded_per_call_and_resumes_where_it_stopped(backend):
    """Each call looks at no more than max_entries entries, continuing over the TTL
    states one after another; a call ends early when it has gone round once."""
    h = _expired_and_live(backend, ("s", "t"), expired=12, live=0)
    try:
        calls = [h.operator.run_background_cleanup(10) for _ in range(4)]
        if backend == "rocksdb":
            assert calls == [10, 10, 4, 0]
            states = [ValueStateDescriptor(n, ttl=StateTtlConfig(ttl_ms=T)) for n in "st"]
            assert [h.keys(d) for d in states] == [[], []]
        else:
            assert calls == [0, 0, 0, 0]  # the hash map cleans up on access instead
    finally:
        h.close()


def test_background_cleanup_keeps_live_entries_and_wraps_around_to_new_ones():
    h = _expired_and_live("rocksdb", ("s",), expired=15, live=5)
    desc = ValueStateDescriptor("s", ttl=StateTtlConfig(ttl_ms=T))
    try:
        first = [h.operator.run_background_cleanup(7) for _ in range(3)]  # 7 + 7 + 6 entries
        assert sum(first) == 15 and all(n <= 7 for n in first)
        assert sorted(h.keys(desc)) == [f"new-{k}" for k in range(5)]
        h.clock.advance(T // 2)  # the live keys expire now
        write(h, "value", desc, "newest")
        dropped = [h.operator.run_background_cleanup(2) for _ in range(3)]  # 6 entries
        assert sum(dropped) == 5 and all(n <= 2 for n in dropped)
        assert h.keys(desc) == ["newest"]
    finally:
        h.close()


def test_background_cleanup_needs_a_positive_entry_count():
    with make("rocksdb") as h, pytest.raises(ConfigurationError, match="max_entries"):
        h.operator.run_background_cleanup(0)
    with pytest.raises(ConfigurationError, match="background_cleanup_entries"):
        OperatorConfig(background_cleanup_entries=0)


@pytest.mark.parametrize("how", ["snapshot", "checkpoint", "savepoint"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_harness_runs_background_cleanup_after_each_snapshot_it_takes(
    backend, kind, how, tmp_path
):
    """As a runtime does once per checkpoint: the snapshot itself still holds the
    expired values (no full-snapshot cleanup chosen), the live RocksDB state no
    longer does; the hash map is cleaned on access instead."""
    desc = descriptor(kind, StateTtlConfig(ttl_ms=T))
    with make(backend) as h:
        _old_and_new(h, kind, desc)
        coordinator = CheckpointCoordinator(tmp_path / "chk")
        if how == "snapshot":
            taken = h.snapshot()
            snapshots: Any = [taken]
            stored = taken.keyed.entry_count() if taken.keyed else 0
            assert stored == 3
        elif how == "checkpoint":
            snapshots = weir.load_checkpoint(h.checkpoint(coordinator).url)
        else:
            snapshots = weir.load_checkpoint(h.savepoint(coordinator, tmp_path / "sp").url)
        assert sorted(h.keys(desc)) == (["n"] if backend == "rocksdb" else ["n", "o1", "o2"])
    with KeyedOperatorHarness.restore(
        Actions(), key_of, snapshots, parallelism=1, subtask_index=0, state_backend=backend,
        clock=ManualClock(0),
    ) as r:
        assert sorted(r.keys(desc)) == ["n", "o1", "o2"]


def test_compact_state_uses_the_default_compaction_filter_on_rocksdb(backend):
    desc = descriptor("value", StateTtlConfig(ttl_ms=T))
    with make(backend) as h:
        _old_and_new(h, "value", desc)
        assert h.compact_state() == (2 if backend == "rocksdb" else 0)


# Errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("nested", [False, True], ids=["object", "list-holding-object"])
@pytest.mark.parametrize("kind", ["value", "list", "map"])
def test_unencodable_value_error_names_the_state_and_the_users_type(h, kind, nested):
    desc = descriptor(kind, ttl())
    write(h, kind, desc, "a", [1])  # lists are fine: the hash map will not check them again
    bad, shown = ([object()], "list") if nested else (object(), "object")
    with pytest.raises(weir.StateSerializationError) as info:
        write(h, kind, desc, "a", bad)
        h.snapshot()  # the hash map backend may only notice here
    message = str(info.value)
    assert "'s'" in message
    assert f"type {shown} " in message
    assert "TtlSerializer" not in message  # an internal wrapper the user never chose


# Migration ----------------------------------------------------------------------------


@pytest.mark.parametrize("before, after", [(None, ttl()), (ttl(), None)],
                         ids=["ttl-added", "ttl-removed"])
def test_changing_ttl_of_a_restored_state_is_a_migration_error(backend, before, after):
    with make(backend) as h:
        write(h, "value", descriptor("value", before), "a")
        snapshot = h.snapshot()
    new = descriptor("value", after)
    r = KeyedOperatorHarness.restore(
        Actions(lambda c: c.get_state(new)), key_of, [snapshot], parallelism=1,
        subtask_index=0, state_backend=backend, open=False,
    )
    try:
        with pytest.raises(weir.StateMigrationError, match="'s'"):
            r.open()
    finally:
        r.close()


def test_a_ttl_is_given_as_a_timedelta_a_duration_string_or_int_milliseconds() -> None:
    import datetime as dt

    from weir.errors import ConfigurationError

    assert weir.StateTtlConfig(dt.timedelta(seconds=10)).ttl_ms == 10_000  # type: ignore[arg-type]
    assert weir.StateTtlConfig.of(dt.timedelta(minutes=2)).ttl_ms == 120_000
    assert weir.StateTtlConfig.of("500 ms").ttl_ms == 500
    assert weir.StateTtlConfig.of(7).ttl_ms == 7
    with pytest.raises(ConfigurationError, match="must be a positive int"):
        weir.StateTtlConfig.of(dt.timedelta(0))
    with pytest.raises(ConfigurationError, match="must be a duration"):
        weir.StateTtlConfig.of(dt.timedelta(seconds=-1))
