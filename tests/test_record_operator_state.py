"""Typed records in operator list, union list and broadcast state that evolve (issue
41): written with one version of a record class, restored with the next — through
in-memory snapshots at another parallelism and through a savepoint on disk — every
value comes back migrated, new fields at their defaults, and the next snapshot holds
the new schema; an incompatible change or a changed broadcast key type is refused
naming the operator, the state and the field; ``weir.read_state`` reads the records
without their class and ``weir.write_savepoint`` writes them back."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pandas as pd
import pytest

import weir
from weir import (
    CheckpointedFunction,
    KeyedBroadcastProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ProcessFunction,
)
from weir.api.record_serializer import RecordSerializer
from weir.api.serializers import IntSerializer, StrSerializer
from weir.errors import StateMigrationError
from weir.testing import CheckpointedFunctionHarness, KeyedBroadcastOperatorHarness


@dataclasses.dataclass
class RuleV1:
    threshold: int
    name: str
    note: str


@dataclasses.dataclass
class RuleV2:
    name: str
    threshold: float              # int -> float, moved
    active: bool = True           # added with a default
    owner: str | None = None      # added, nullable
    # note: removed


@dataclasses.dataclass
class Narrowed:
    threshold: int
    name: str
    note: int  # (str -> int)


def rule(cls: type, n: int) -> Any:
    fields = {"threshold": n, "name": f"r{n}", "note": f"n{n}"}
    return cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})


def migrated(n: int) -> RuleV2:
    return RuleV2(f"r{n}", float(n))


# ------------------------------------------------------------------ operator list state

class Buffer(ProcessFunction[Any, Any], CheckpointedFunction):
    """Keeps every element as a record in even-split list state ``buffer`` and the
    last one in union list state ``last``."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.buffer: list[Any] = []

    def initialize_state(self, ctx: Any) -> None:
        store = ctx.operator_state_store
        serializer = RecordSerializer(self.cls)
        self.buffer_state = store.get_list_state(ListStateDescriptor("buffer", serializer))
        self.last_state = store.get_union_list_state(ListStateDescriptor("last", serializer))
        self.buffer = self.buffer_state.get()
        self.restored_last = self.last_state.get()

    def process_element(self, value: Any, ctx: Any) -> None:
        self.buffer.append(rule(self.cls, value))

    def snapshot_state(self, ctx: Any) -> None:
        self.buffer_state.update(self.buffer)
        self.last_state.update(self.buffer[-1:])


def buffers(chunks: list[list[int]]) -> list[Any]:
    """One subtask per chunk, writing RuleV1 records; their snapshots."""
    snapshots = []
    for index, chunk in enumerate(chunks):
        with CheckpointedFunctionHarness(Buffer(RuleV1), parallelism=len(chunks),
                                         subtask_index=index) as h:
            for n in chunk:
                h.process_element(n)
            snapshots.append(h.snapshot())
    return snapshots


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_operator_list_and_union_state_migrate_at_any_parallelism(parallelism: int) -> None:
    snapshots = buffers([[1, 2, 3], [4, 5]])
    buffered, lasts = [], []
    for index in range(parallelism):
        fn = Buffer(RuleV2)
        with CheckpointedFunctionHarness.restore(fn, snapshots, parallelism=parallelism,
                                                 subtask_index=index) as h:
            buffered += fn.buffer
            lasts.append(fn.restored_last)
            again = h.snapshot()
        assert json.loads(again.operator_states["buffer"].schema or "null")["name"] == "RuleV2"
    assert sorted(buffered, key=lambda r: r.threshold) == [migrated(n) for n in range(1, 6)]
    assert all(last == [migrated(3), migrated(5)] for last in lasts)


def test_an_incompatible_operator_state_change_is_refused_naming_the_field() -> None:
    (snapshot,) = buffers([[1, 2]])
    with pytest.raises(StateMigrationError) as raised:
        CheckpointedFunctionHarness.restore(Buffer(Narrowed), [snapshot], parallelism=1,
                                            subtask_index=0)
    message = str(raised.value)
    assert "operator state 'buffer'" in message and "field note: its type changed" in message


# ---------------------------------------------------------------------- broadcast state

def rules_descriptor(cls: type, key: Any = None) -> MapStateDescriptor[Any, Any]:
    return MapStateDescriptor("rules", key_serializer=key or StrSerializer(),
                              serializer=RecordSerializer(cls))


class Rules(KeyedBroadcastProcessFunction[Any, Any, Any]):
    """Broadcast ``n`` puts rule ``r<n>``; a keyed element emits every rule."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.rules = rules_descriptor(cls)

    def process_element(self, value: Any, ctx: Any) -> list[Any]:
        return sorted(dict(ctx.get_broadcast_state(self.rules).items()).items())

    def process_broadcast_element(self, value: Any, ctx: Any) -> None:
        ctx.get_broadcast_state(self.rules).put(f"r{value}", rule(self.cls, value))


def broadcast_written(backend: str, **kwargs: Any) -> KeyedBroadcastOperatorHarness:
    h = KeyedBroadcastOperatorHarness(
        Rules(RuleV1), lambda v: v, state_backend=backend,
        broadcast_state_descriptors=[rules_descriptor(RuleV1)], **kwargs)
    h.open()
    for n in (1, 2, 3):
        h.process_broadcast_element(n)
    return h


def restored_rules(backend: str, source: Any, parallelism: int, index: int,
                   **kwargs: Any) -> KeyedBroadcastOperatorHarness:
    return KeyedBroadcastOperatorHarness.restore(
        Rules(RuleV2), lambda v: v, source, parallelism=parallelism, subtask_index=index,
        state_backend=backend, broadcast_state_descriptors=[rules_descriptor(RuleV2)],
        **kwargs)


def test_broadcast_state_migrates_on_every_subtask_after_a_rescale(backend: str) -> None:
    with broadcast_written(backend) as h:
        snapshot = h.snapshot()
    for index in range(2):
        with restored_rules(backend, [snapshot], 2, index) as r:
            assert r.broadcast_state_of(rules_descriptor(RuleV2)) == {
                f"r{n}": migrated(n) for n in (1, 2, 3)}
            again = r.snapshot()
        schemas = again.broadcast_states["rules"].schemas
        assert schemas[0] is None and "RuleV2" in (schemas[1] or "")


def test_broadcast_state_refuses_a_changed_key_type_or_an_incompatible_value(
        backend: str) -> None:
    with broadcast_written(backend) as h:
        snapshot = h.snapshot()
    with pytest.raises(StateMigrationError, match="keys never evolve"):
        KeyedBroadcastOperatorHarness.restore(
            Rules(RuleV1), lambda v: v, [snapshot], parallelism=1, subtask_index=0,
            state_backend=backend,
            broadcast_state_descriptors=[rules_descriptor(RuleV1, IntSerializer())])
    with pytest.raises(StateMigrationError) as raised:
        KeyedBroadcastOperatorHarness.restore(
            Rules(Narrowed), lambda v: v, [snapshot], parallelism=1, subtask_index=0,
            state_backend=backend, broadcast_state_descriptors=[rules_descriptor(Narrowed)])
    message = str(raised.value)
    assert "broadcast state 'rules'" in message and "field note: its type changed" in message


def test_a_savepoint_of_record_operator_and_broadcast_state_reads_migrates_and_rewrites(
        tmp_path: Any, backend: str) -> None:
    """Through the checkpoint format: the schemas are stored with the states, so
    read_state reads the records as dicts, a restore with the next version migrates
    them, and write_savepoint writes changed records back by the stored schema."""
    coordinator = weir.CheckpointCoordinator(tmp_path / "chk")
    with broadcast_written(backend, uid="rules") as h:
        url = h.savepoint(coordinator, tmp_path / "sp").url
    reader = weir.read_state(url)
    table = reader.broadcast_state("rules", "rules")
    assert sorted(table["key"]) == ["r1", "r2", "r3"]
    assert table["value"].iloc[0].keys() == {"threshold", "name", "note"}
    with restored_rules(backend, weir.load_checkpoint(url), 1, 0, uid="rules") as r:
        assert r.process_element("k") == [(f"r{n}", migrated(n)) for n in (1, 2, 3)]

    table["value"] = table["value"].map(lambda v: {**v, "threshold": v["threshold"] * 10})
    table = pd.concat([table, pd.DataFrame({"key": ["r4"], "value": [
        {"threshold": 4, "name": "r4", "note": "new"}]})], ignore_index=True)
    rewritten = weir.write_savepoint(tmp_path / "rewritten", uid="rules", base=url,
                                     broadcast_states={"rules": table})
    with restored_rules(backend, weir.load_checkpoint(rewritten), 1, 0, uid="rules") as r:
        assert r.process_element("k") == [
            *((f"r{n}", RuleV2(f"r{n}", float(n * 10))) for n in (1, 2, 3)),
            ("r4", RuleV2("r4", 4.0))]


def test_a_savepoint_of_record_operator_list_state_reads_and_migrates(tmp_path: Any) -> None:
    coordinator = weir.CheckpointCoordinator(tmp_path / "chk")
    with CheckpointedFunctionHarness(Buffer(RuleV1), uid="buffers") as h:
        for n in (1, 2):
            h.process_element(n)
        url = h.savepoint(coordinator, tmp_path / "sp").url
    rows = weir.read_state(url).operator_state("buffers", "buffer")
    assert list(rows["value"]) == [{"threshold": n, "name": f"r{n}", "note": f"n{n}"}
                                   for n in (1, 2)]
    fn = Buffer(RuleV2)
    with CheckpointedFunctionHarness.restore(fn, weir.load_checkpoint(url), parallelism=1,
                                             subtask_index=0, uid="buffers"):
        assert fn.buffer == [migrated(1), migrated(2)] and fn.restored_last == [migrated(2)]
