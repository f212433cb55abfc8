"""Reading state offline as DataFrames (``weir.read_state``): every keyed state kind
with and without TTL, timers, operator and broadcast state, from full, incremental
and changelog checkpoints and savepoints of both backends, at parallelism 2; what a
path means; serializers of one's own; clear errors."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import weir
from support import Average  # type: ignore[import-not-found]
from weir import (
    AggregatingStateDescriptor,
    BroadcastContext,
    CheckpointCoordinator,
    CheckpointedFunction,
    ConfigurationError,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    IntSerializer,
    KeyedBroadcastProcessFunction,
    KeyedContext,
    ListStateDescriptor,
    MapStateDescriptor,
    NoCheckpointError,
    ReducingStateDescriptor,
    Serializer,
    StateKind,
    StateScope,
    StateTtlConfig,
    StrSerializer,
    ValueStateDescriptor,
    take_checkpoint,
    take_savepoint,
)
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.testing import KeyedBroadcastOperatorHarness, ManualClock

MAXP = 16
P = 2
TTL = StateTtlConfig(ttl_ms=1_000_000)


class Upper(Serializer[str]):
    """A serializer of the user's own: text stored upper-case."""

    type_id = "test-upper/1"

    def encode(self, value: str) -> bytes:
        return value.upper().encode()

    def decode(self, data: bytes) -> str:
        return data.decode().lower()


COUNT = ValueStateDescriptor[int]("count", IntSerializer())
SEEN = ListStateDescriptor[int]("seen")
LAST = MapStateDescriptor[str, int]("by_tag", StrSerializer())
TOTAL = ReducingStateDescriptor[int]("total", operator.add)
MEAN = AggregatingStateDescriptor("mean", Average())
NOTE = ValueStateDescriptor[str]("note", Upper(), ttl=TTL)
RECENT = ListStateDescriptor[int]("recent", ttl=TTL)
TAGS = MapStateDescriptor[str, str]("tags", ttl=TTL)
RULES = MapStateDescriptor[str, int]("rules")
BUFFER = ListStateDescriptor[Any]("buffer")


class Everything(KeyedBroadcastProcessFunction[tuple[Any, str, int], Any, Any],
                 CheckpointedFunction):
    """Every kind of state: keyed (with and without TTL), timers, broadcast, operator."""

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        self.buffer = ctx.operator_state_store.get_list_state(BUFFER)

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        pass

    def open(self, ctx: KeyedContext) -> None:
        self.subtask = ctx.subtask_index

    def process_element(self, value: tuple[Any, str, int], ctx: KeyedContext) -> None:
        _, tag, n = value
        count = ctx.get_state(COUNT)
        count.update((count.value() or 0) + 1)
        ctx.get_state(SEEN).add(n)
        ctx.get_state(LAST).put(tag, n)
        ctx.get_state(TOTAL).add(n)
        ctx.get_state(MEAN).add(n)
        ctx.get_state(NOTE).update(f"note-{tag}")
        ctx.get_state(RECENT).add(n * 10)
        ctx.get_state(TAGS).put(tag, f"v{n}")
        ctx.timer_service.register_event_time_timer(1000 + n)
        ctx.timer_service.register_processing_time_timer(5000 + n)
        self.buffer.add((self.subtask, n))

    def process_broadcast_element(self, value: Any, ctx: BroadcastContext) -> None:
        ctx.get_broadcast_state(RULES).put(value[0], value[1])


KEYS: list[Any] = ["a", "b", 7, ("x", 1), "é"]
ELEMENTS = [(k, tag, i + 10 * j) for j, k in enumerate(KEYS) for i, tag in
            enumerate(["p", "q", "p"])]


def run(tmp_path: Path, backend: str, mode: str) -> tuple[Any, str]:
    """Both subtasks of ``Everything`` over ``ELEMENTS``; returns (coordinator, url of a
    checkpoint in ``mode`` or of a savepoint)."""
    clock = ManualClock(123)
    coord = CheckpointCoordinator(tmp_path / "chk")
    harnesses = [
        KeyedBroadcastOperatorHarness(
            Everything(), operator.itemgetter(0), uid="everything", state_backend=backend,
            max_parallelism=MAXP, parallelism=P, subtask_index=i, clock=clock,
            broadcast_state_descriptors=[RULES],
        )
        for i in range(P)
    ]
    for h in harnesses:
        h.open()
        h.process_broadcast_element(("limit", 5))
        h.process_broadcast_element(("floor", -1))
    for element in ELEMENTS:
        harnesses[assign_key_to_parallel_operator(element[0], MAXP, P)].process_element(element)
    checkpoint_mode = "full" if mode == "savepoint" else mode
    cps = [h.checkpointer(coord.storage, checkpoint_mode) for h in harnesses]
    take_checkpoint(coord, cps)
    for element in ELEMENTS[:3]:  # a second checkpoint: deltas, shared files
        harnesses[assign_key_to_parallel_operator(element[0], MAXP, P)].process_element(element)
    if mode == "savepoint":
        done = take_savepoint(coord, cps, tmp_path / "sp")
    else:
        done = take_checkpoint(coord, cps)
    for h in harnesses:
        h.close()
    return coord, done.url


def expected_elements() -> list[tuple[Any, str, int]]:
    return ELEMENTS + ELEMENTS[:3]


def by_key(frame: pd.DataFrame) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for row in frame.itertuples(index=False):
        out.setdefault(row[0], []).append(tuple(row[1:]))
    return out


HANDLES = {"full": "KeyedFullHandle", "savepoint": "KeyedFullHandle",
           "changelog": "KeyedChangelogHandle", "incremental": "KeyedIncrementalHandle"}
MODES = [("hashmap", "full"), ("hashmap", "changelog"), ("hashmap", "savepoint"),
         ("rocksdb", "full"), ("rocksdb", "incremental"), ("rocksdb", "savepoint")]


@pytest.mark.parametrize(("backend", "mode"), MODES)
def test_every_state_reads_as_a_dataframe(tmp_path: Path, backend: str, mode: str) -> None:
    _, url = run(tmp_path, backend, mode)
    reader = weir.read_state(url, serializers=[Upper()])
    assert reader.uids == ["everything"]
    handles = reader.checkpoint("everything").metadata.operators["everything"].subtasks
    assert {type(h.keyed).__name__ for h in handles} == {HANDLES[mode]}
    if mode == "changelog":
        assert any(h.keyed.deltas for h in handles)
    elements = expected_elements()

    def values(key: Any) -> list[int]:
        return [n for k, _, n in elements if k == key]

    count = reader.keyed_state("everything", "count")
    assert list(count.columns) == ["key", "value"]
    assert by_key(count) == {k: [(len(values(k)),)] for k in KEYS}

    seen = reader.keyed_state("everything", "seen")
    assert list(seen.columns) == ["key", "index", "value"]
    assert by_key(seen) == {k: list(enumerate(values(k))) for k in KEYS}

    tags = reader.keyed_state("everything", "by_tag")
    assert list(tags.columns) == ["key", "map_key", "value"]
    last: dict[Any, dict[str, int]] = {}
    for k, tag, n in elements:
        last.setdefault(k, {})[tag] = n
    assert {k: dict(v) for k, v in by_key(tags).items()} == last

    assert by_key(reader.keyed_state("everything", "total")) == {
        k: [(sum(values(k)),)] for k in KEYS}
    assert by_key(reader.keyed_state("everything", "mean")) == {
        k: [([sum(values(k)), len(values(k))],)] for k in KEYS}

    note = reader.keyed_state("everything", "note")
    assert list(note.columns) == ["key", "value", "ttl_timestamp_ms"]
    assert by_key(note) == {k: [("note-p", 123)] for k in KEYS}
    recent = reader.keyed_state("everything", "recent")
    assert list(recent.columns) == ["key", "index", "value", "ttl_timestamp_ms"]
    assert by_key(recent) == {k: [(i, n * 10, 123) for i, n in enumerate(values(k))]
                              for k in KEYS}
    ttl_tags = reader.keyed_state("everything", "tags")
    assert list(ttl_tags.columns) == ["key", "map_key", "value", "ttl_timestamp_ms"]
    assert {k: sorted(v) for k, v in by_key(ttl_tags).items()} == {
        k: sorted((t, f"v{n}", 123) for t, n in m.items()) for k, m in last.items()}

    timers = reader.timers("everything")
    assert list(timers.columns) == ["key", "domain", "timestamp_ms"]
    expected = sorted({(k, d, base + n) for k, _, n in elements
                       for d, base in (("event", 1000), ("processing", 5000))},
                      key=lambda t: (t[1], t[2]))
    assert sorted(timers.itertuples(index=False, name=None), key=lambda t: (t[1], t[2])) == [
        *expected]

    buffer = reader.operator_state("everything", "buffer")
    assert list(buffer.columns) == ["subtask", "index", "value"]
    owner = {k: assign_key_to_parallel_operator(k, MAXP, P) for k in KEYS}
    for subtask in range(P):
        mine = buffer[buffer.subtask == subtask]
        assert list(mine["index"]) == list(range(len(mine)))
        assert sorted(tuple(v) for v in mine["value"]) == sorted(
            (owner[k], n) for k, _, n in elements if owner[k] == subtask)

    rules = reader.broadcast_state("everything", "rules")
    assert dict(zip(rules["key"], rules["value"], strict=True)) == {"limit": 5, "floor": -1}


def test_the_states_of_an_operator_are_listed_with_kind_serializers_and_ttl(
    tmp_path: Path
) -> None:
    _, url = run(tmp_path, "hashmap", "full")
    states = {(s.scope, s.name): s for s in weir.read_state(url).states("everything")}
    assert set(states) == {
        *((StateScope.KEYED, n) for n in
          ("count", "seen", "by_tag", "total", "mean", "note", "recent", "tags")),
        (StateScope.OPERATOR, "buffer"), (StateScope.BROADCAST, "rules")}
    assert states[(StateScope.KEYED, "count")].kind is StateKind.VALUE
    assert states[(StateScope.KEYED, "count")].serializers == ("int64",)
    assert states[(StateScope.KEYED, "by_tag")].serializers == ("utf8", "msgpack/1")
    assert states[(StateScope.KEYED, "note")].ttl
    assert not states[(StateScope.KEYED, "count")].ttl
    assert states[(StateScope.OPERATOR, "buffer")].kind is weir.RedistributionMode.SPLIT_DISTRIBUTE


def test_a_coordinator_root_reads_its_latest_or_a_chosen_checkpoint(tmp_path: Path) -> None:
    coord, _ = run(tmp_path, "rocksdb", "incremental")
    ids = [c.checkpoint_id for c in coord.completed_checkpoints]
    latest = weir.read_state(tmp_path / "chk")
    assert latest.checkpoint("everything").checkpoint_id == ids[-1]
    first = weir.read_state(tmp_path / "chk", checkpoint_id=ids[0])
    counts = dict(zip(*(first.keyed_state("everything", "count")[c] for c in ("key", "value")),
                      strict=True))
    assert counts == {k: 3 for k in KEYS}  # before the second checkpoint's elements
    with pytest.raises(NoCheckpointError, match="no completed checkpoint 99"):
        weir.read_state(tmp_path / "chk", checkpoint_id=99)


def test_a_state_written_with_an_unknown_serializer_says_how_to_read_it(
    tmp_path: Path
) -> None:
    _, url = run(tmp_path, "hashmap", "full")
    reader = weir.read_state(url)
    assert len(reader.keyed_state("everything", "count")) == len(KEYS)  # others still read
    with pytest.raises(ConfigurationError, match=r"'test-upper/1'.*serializers=\["):
        reader.keyed_state("everything", "note")


def test_unknown_operators_and_states_and_empty_paths_are_clear_errors(tmp_path: Path) -> None:
    _, url = run(tmp_path, "hashmap", "full")
    reader = weir.read_state(url)
    with pytest.raises(NoCheckpointError, match="no state of operator 'nope'"):
        reader.keyed_state("nope", "count")
    with pytest.raises(ConfigurationError, match=r"no keyed state 'missing'.*count"):
        reader.keyed_state("everything", "missing")
    with pytest.raises(ConfigurationError, match="no operator state 'count'"):
        reader.operator_state("everything", "count")
    with pytest.raises(NoCheckpointError, match="no state of operator 'nope'"):
        weir.read_state(url, uid="nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoCheckpointError, match="holds no completed checkpoint"):
        weir.read_state(tmp_path / "empty")
