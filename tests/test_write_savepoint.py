"""Writing state from DataFrames (``weir.write_savepoint``): a rewrite of every table
read is exact to the byte of every stored entry, over both backends and full,
incremental, changelog checkpoints and savepoints; a bootstrapped savepoint restores
into both backends at any parallelism with exactly the rows written (hypothesis);
a rewrite keeps what it does not replace; clear errors."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import weir
from test_read_state import (  # type: ignore[import-not-found]
    BUFFER,
    COUNT,
    LAST,
    MAXP,
    MEAN,
    MODES,
    NOTE,
    RECENT,
    RULES,
    SEEN,
    TAGS,
    TOTAL,
    Everything,
    Upper,
    run,
)
from weir import (
    CheckpointCoordinator,
    CheckpointError,
    ConfigurationError,
    IntSerializer,
    ListStateDescriptor,
    MapStateDescriptor,
    StrSerializer,
    ValueStateDescriptor,
    load_checkpoint,
)
from weir.checkpoint.savepoints import canonical_keyed
from weir.testing import KeyedBroadcastOperatorHarness, KeyedOperatorHarness

KEYED_STATES = [COUNT, SEEN, LAST, TOTAL, MEAN, NOTE, RECENT, TAGS]


def _stored(url: str, uid: str) -> list[Any]:
    """Everything stored for ``uid``, per subtask, in a comparable form: keyed entries
    (canonical, sorted) by group and state, metas, timer states, operator states and
    broadcast states."""
    completed = load_checkpoint(url)
    op = completed.metadata.operators[uid]
    out = []
    for handle in op.subtasks:
        i = handle.subtask_index
        (snap,) = [s for s in completed.load(uid, op.parallelism, i) if s.subtask_index == i]
        keyed = canonical_keyed(snap.keyed, "test") if snap.keyed is not None else None
        out.append((
            None if keyed is None else (
                dict(keyed.metas), tuple(sorted(keyed.timer_states)),
                {g: {n: sorted(e) for n, e in per.items() if e}
                 for g, per in keyed.groups.items()}),
            {n: (s.mode, s.serializer, s.elements) for n, s in snap.operator_states.items()},
            {n: (s.serializers, sorted(s.entries)) for n, s in snap.broadcast_states.items()},
        ))
    return out


def _rows(frame: pd.DataFrame) -> list[str]:
    """A table's rows in a comparable order (keys of mixed types do not sort)."""
    return sorted(repr(r) for r in frame.values.tolist())


def _everything(reader: weir.StateReader) -> dict[str, Any]:
    uid = "everything"
    return {
        "states": {d.name: reader.keyed_state(uid, d.name) for d in KEYED_STATES},
        "timers": reader.timers(uid),
        "operator_states": {"buffer": reader.operator_state(uid, "buffer")},
        "broadcast_states": {"rules": reader.broadcast_state(uid, "rules")},
    }


@pytest.mark.parametrize(("backend", "mode"), MODES)
def test_a_rewrite_of_every_table_read_is_exact(tmp_path: Path, backend: str, mode: str
                                                ) -> None:
    _, url = run(tmp_path, backend, mode)
    reader = weir.read_state(url, serializers=[Upper()])
    tables = _everything(reader)

    rewritten = weir.write_savepoint(tmp_path / "rewritten", uid="everything", base=url,
                                     serializers=[Upper()], **tables)
    stored = _stored(rewritten, "everything")
    assert {n for sub in stored for per in sub[0][2].values() for n in per} == {
        *(d.name for d in KEYED_STATES), "__weir_timers/event", "__weir_timers/processing"}
    assert all(sub[1]["buffer"][2] and sub[2]["rules"][1] for sub in stored)
    assert _stored(rewritten, "everything") == _stored(
        weir.write_savepoint(tmp_path / "copy", uid="everything", base=url), "everything")
    # bootstrapped from nothing but the tables and the job's descriptors: the same bytes
    booted = weir.write_savepoint(
        tmp_path / "booted", uid="everything", max_parallelism=MAXP, parallelism=2,
        descriptors=[*KEYED_STATES, BUFFER, RULES], **tables)
    assert _stored(booted, "everything") == _stored(rewritten, "everything")
    if mode == "savepoint":  # a savepoint's own files are canonical already
        assert _stored(booted, "everything") == _stored(url, "everything")
    again = _everything(weir.read_state(booted, serializers=[Upper()]))
    for name, frame in tables["states"].items():
        pd.testing.assert_frame_equal(again["states"][name], frame)
    pd.testing.assert_frame_equal(again["timers"], tables["timers"])


def test_a_rewrite_keeps_what_it_does_not_replace_and_changes_what_it_does(
    tmp_path: Path, backend: str
) -> None:
    _, url = run(tmp_path, backend, "savepoint")
    reader = weir.read_state(url, serializers=[Upper()])
    counts = reader.keyed_state("everything", "count")
    counts["value"] = counts["value"] * 100
    counts = counts[counts["key"] != "a"]  # a key dropped from one state
    out = weir.write_savepoint(tmp_path / "sp2", uid="everything", base=url,
                               states={"count": counts}, parallelism=3)
    after = weir.read_state(out, serializers=[Upper()])
    assert _rows(after.keyed_state("everything", "count")) == _rows(counts)
    for name in ("seen", "by_tag", "note"):  # untouched states: as they were
        assert _rows(after.keyed_state("everything", name)) == _rows(
            reader.keyed_state("everything", name))
    assert load_checkpoint(out).metadata.operators["everything"].parallelism == 3
    restored = [KeyedBroadcastOperatorHarness.restore(
        Everything(), operator.itemgetter(0), load_checkpoint(out), uid="everything",
        parallelism=3, subtask_index=i, state_backend=backend,
        broadcast_state_descriptors=[RULES]) for i in range(3)]
    assert sorted(e for h in restored for e in h.operator_state_of("buffer")) == sorted(
        reader.operator_state("everything", "buffer")["value"])
    assert all(h.broadcast_state_of(RULES) == {"limit": 5, "floor": -1} for h in restored)
    values = {k: v for h in restored for k in h.keys(COUNT)
              if (v := h.state_of(k, COUNT)) is not None}
    assert values == dict(zip(counts["key"], counts["value"], strict=True))


# ------------------------------------------------------------------ bootstrap


VALUE = ValueStateDescriptor[int]("value", IntSerializer())
ITEMS = ListStateDescriptor[str]("items", StrSerializer())
ATTRS = MapStateDescriptor[str, int]("attrs", StrSerializer(), IntSerializer())
OFFSETS = ListStateDescriptor[int]("offsets", IntSerializer())
CONFIG = MapStateDescriptor[str, str]("config")


class Holder(weir.KeyedBroadcastProcessFunction[Any, Any, Any], weir.CheckpointedFunction):
    """Registers the bootstrapped states; processes nothing."""

    def initialize_state(self, ctx: weir.FunctionInitializationContext) -> None:
        self.offsets = ctx.operator_state_store.get_union_list_state(OFFSETS)

    def snapshot_state(self, ctx: weir.FunctionSnapshotContext) -> None:
        pass

    def process_element(self, value: Any, ctx: weir.KeyedContext) -> None:
        pass

    def process_broadcast_element(self, value: Any, ctx: weir.BroadcastContext) -> None:
        pass


keys = st.one_of(st.integers(-10**12, 10**12), st.text(max_size=6),
                 st.tuples(st.text(max_size=3), st.integers(0, 9)))


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.dictionaries(keys, st.integers(-2**40, 2**40), max_size=25),
    items=st.dictionaries(keys, st.lists(st.text(max_size=4), min_size=1, max_size=4),
                          max_size=10),
    attrs=st.dictionaries(keys, st.dictionaries(st.text(max_size=3), st.integers(-9, 9**9),
                                                min_size=1, max_size=3), max_size=10),
    timers=st.sets(st.tuples(keys, st.sampled_from(["event", "processing"]),
                             st.integers(0, 10**9)), max_size=10),
    offsets=st.lists(st.integers(-2**63, 2**63 - 1), max_size=6),
    written_at=st.integers(1, 4),
    restored_at=st.integers(1, 5),
)
def test_a_bootstrapped_savepoint_restores_exactly_at_any_parallelism(
    tmp_path_factory: pytest.TempPathFactory, backend: str, values: dict[Any, int],
    items: dict[Any, list[str]], attrs: dict[Any, dict[str, int]],
    timers: set[tuple[Any, str, int]], offsets: list[int], written_at: int, restored_at: int,
) -> None:
    target = tmp_path_factory.mktemp("boot") / "sp"
    url = weir.write_savepoint(
        target, uid="holder", max_parallelism=MAXP, parallelism=written_at,
        descriptors=[VALUE, ITEMS, ATTRS, OFFSETS, CONFIG], union_states=["offsets"],
        states={
            "value": pd.DataFrame({"key": list(values), "value": list(values.values())},
                                  columns=["key", "value"]),
            "items": pd.DataFrame([(k, i, v) for k, vs in items.items()
                                   for i, v in enumerate(vs)], columns=["key", "index", "value"]),
            "attrs": pd.DataFrame([(k, mk, v) for k, m in attrs.items() for mk, v in m.items()],
                                  columns=["key", "map_key", "value"]),
        },
        timers=pd.DataFrame(sorted(timers, key=repr), columns=["key", "domain", "timestamp_ms"]),
        operator_states={"offsets": pd.DataFrame(
            [(0, i, v) for i, v in enumerate(offsets)], columns=["subtask", "index", "value"])},
        broadcast_states={"config": pd.DataFrame({"key": ["mode"], "value": ["strict"]})},
    )
    harnesses = [KeyedBroadcastOperatorHarness.restore(
        Holder(), lambda v: v, load_checkpoint(url), uid="holder", parallelism=restored_at,
        subtask_index=i, state_backend=backend, broadcast_state_descriptors=[CONFIG])
        for i in range(restored_at)]
    try:
        def state(descriptor: Any) -> dict[Any, Any]:
            out = {}
            for h in harnesses:
                for k in h.keys(descriptor):
                    found = h.state_of(k, descriptor)
                    if found not in (None, [], {}):
                        out[k] = found
            return out

        def norm(d: dict[Any, Any]) -> dict[Any, Any]:  # tuple keys come back as lists
            return {repr(k): v for k, v in d.items()}

        assert norm(state(VALUE)) == norm(values)
        assert norm(state(ITEMS)) == norm(items)
        assert norm(state(ATTRS)) == norm(attrs)
        fired = sorted((repr(k), "event", t) for h in harnesses for t, k in
                       h.event_time_timers()) + sorted(
            (repr(k), "processing", t) for h in harnesses for t, k in h.processing_time_timers())
        assert sorted(fired) == sorted((repr(k), d, t) for k, d, t in timers)
        assert all(h.operator_state_of("offsets") == offsets for h in harnesses)  # union
        assert all(h.broadcast_state_of(CONFIG) == {"mode": "strict"} for h in harnesses)
    finally:
        for h in harnesses:
            h.close()


# ------------------------------------------------------------------ errors


def test_what_cannot_be_written_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    counts = pd.DataFrame({"key": ["a", "b"], "value": [1, 2]})
    with pytest.raises(ConfigurationError, match="pass max_parallelism="):
        weir.write_savepoint(tmp_path / "a", uid="u", states={"count": counts},
                             descriptors=[VALUE])
    with pytest.raises(ConfigurationError, match=r"'count' of operator 'u' is new: declare it"):
        weir.write_savepoint(tmp_path / "a", uid="u", max_parallelism=8,
                             states={"count": counts})
    with pytest.raises(ConfigurationError, match="two rows for the same key"):
        weir.write_savepoint(tmp_path / "a", uid="u", max_parallelism=8,
                             states={"value": pd.concat([counts, counts])}, descriptors=[VALUE])
    with pytest.raises(ConfigurationError, match=r"missing \['map_key'\]"):
        weir.write_savepoint(tmp_path / "a", uid="u", max_parallelism=8,
                             states={"attrs": counts}, descriptors=[ATTRS])
    with pytest.raises(ConfigurationError, match="indexes"):
        weir.write_savepoint(tmp_path / "a", uid="u", max_parallelism=8, descriptors=[ITEMS],
                             states={"items": pd.DataFrame(
                                 {"key": ["a"], "index": [1], "value": ["x"]})})
    with pytest.raises(weir.StateSerializationError, match="'value' of operator 'u'"):
        weir.write_savepoint(tmp_path / "a", uid="u", max_parallelism=8, descriptors=[VALUE],
                             states={"value": pd.DataFrame({"key": ["a"], "value": ["x"]})})
    assert not (tmp_path / "a").exists()  # nothing is left behind by a refusal
    url = weir.write_savepoint(tmp_path / "ok", uid="u", max_parallelism=8,
                               states={"value": counts}, descriptors=[VALUE])
    with pytest.raises(CheckpointError, match="already holds a savepoint"):
        weir.write_savepoint(tmp_path / "ok", uid="u", max_parallelism=8,
                             states={"value": counts}, descriptors=[VALUE])
    with pytest.raises(ConfigurationError, match="max_parallelism=8; it cannot change"):
        weir.write_savepoint(tmp_path / "b", uid="u", base=url, max_parallelism=16)
    assert [p.name for p in tmp_path.iterdir()] == ["ok"]


def test_a_bootstrapped_savepoint_restores_in_a_coordinator_run(tmp_path: Path) -> None:
    """The harness restored from a bootstrapped savepoint goes on counting and its
    next checkpoint holds the sum."""
    from spark_support import Count  # type: ignore[import-not-found]

    url = weir.write_savepoint(
        tmp_path / "sp", uid="count", max_parallelism=MAXP,
        states={"count": pd.DataFrame({"key": ["a", "b"], "value": [41, 9]})},
        descriptors=[ValueStateDescriptor[int]("count")])
    h = KeyedOperatorHarness.restore(Count(), operator.itemgetter("key"), load_checkpoint(url),
                                     uid="count", parallelism=1, subtask_index=0)
    assert [o[2] for o in h.process_elements([{"key": "a", "seq": 1}, {"key": "b", "seq": 2}])
            ] == [42, 10]
    done = h.checkpoint(CheckpointCoordinator(tmp_path / "chk"))
    assert dict(weir.read_state(done.url).keyed_state("count", "count").values.tolist()) == {
        "a": 42, "b": 10}
