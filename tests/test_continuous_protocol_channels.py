"""Records in flight across a changed job (the continuous runtime's protocol, issue
situations 5 and 12a).

A backpressured union of two sources (tiny buffers, a slow keyed function) is
cancelled after unaligned checkpoints that stored records in flight on both of its
inputs (retained on cancel), and a changed job restores the newest such checkpoint.

* Situation 5: channel state belongs to a producer and a consumer — not to the
  position of an input — so a job whose union lists its inputs the other way round
  (``b.union(a)`` for ``a.union(b)``) restores every record in flight: every number
  comes out exactly once, with or without event time, and from a checkpoint written in
  the layout of earlier versions (edges named by input index). Records in flight on an
  edge the job no longer has (its producer no longer feeds its consumer) are refused
  when the job starts, naming the edge, its operators and the checkpoint; with
  ``allow_non_restored_state`` exactly those records are dropped, and logged.
* Situation 12a: a job checkpointed without event time (records in flight stored bare)
  and restored with a watermark strategy (records expected as ``(timestamp, record)``),
  or the other way round, is refused when it starts — before any task runs.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import weir
from continuous_helpers import TINY, Running, by_value
from weir.api.checkpointing import CheckpointConfig
from weir.api.watermarks import WatermarkStrategy
from weir.checkpoint.channel_state import ChannelState, decode_channel_state
from weir.checkpoint.coordinator import CheckpointCoordinator, CompletedCheckpoint
from weir.connectors.stream import FileSink, SequenceSource, read_stream_sink
from weir.runtime.continuous.graph import JobGraph
from weir.runtime.continuous.inflight import belongs_to, stored_timestamps
from weir.runtime.continuous.master import LocalJob
from weir.stream import StreamEnvironment

HALF = 15_000  # numbers per source: "first" emits 0..HALF-1, "second" HALF..N-1
N = 2 * HALF
SOURCES = ("first", "second")


class SlowKeyed(weir.KeyedProcessFunction[int, int]):
    """Passes every number on, slowly: its inputs back up."""

    def process_element(self, value: int, ctx: Any) -> Any:
        if value % 8 == 0:
            time.sleep(0.002)
        yield value


class SlowPass(weir.ProcessFunction[int, int]):
    """Passes every number on (graph tests only)."""

    def process_element(self, value: int, ctx: Any) -> Any:
        yield value


RULES = weir.MapStateDescriptor[int, int]("rules")


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


def union_job(tmp_path: Path, chk: str, *, order: str = "first,second",
              event_time: bool = False, second_to: str = "slow") -> JobGraph:
    """``first`` and ``second`` (a source and a map), unioned in ``order`` into the slow
    keyed function ``slow`` and the sink ``sink`` (``tmp_path/out``); with
    ``second_to="side"``, ``second`` goes to a sink of its own (``tmp_path/side``)
    instead. Tiny channel buffers; checkpoints in ``tmp_path/chk``."""
    env = StreamEnvironment(weir.JobConfig(tmp_path / chk, parallelism=2, max_parallelism=32))
    watermarks = (WatermarkStrategy.for_monotonous_timestamps(lambda v: v)
                  if event_time else None)
    streams = {
        "first": env.from_source(SequenceSource(HALF), uid="first", watermarks=watermarks),
        "second": env.from_source(SequenceSource(HALF), uid="second", watermarks=watermarks
                                  ).map(lambda v: v + HALF)}
    names = order.split(",")
    if second_to == "side":
        streams.pop("second").sink_to(FileSink(tmp_path / "side"), uid="side-sink")
        names.remove("second")
    inputs = [streams[name] for name in names]
    union = inputs[0].union(*inputs[1:]) if len(inputs) > 1 else inputs[0]
    (union.key_by(lambda v: v % 7).process(SlowKeyed(), uid="slow")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    return dataclasses.replace(env.job_graph("union-order"), channel=TINY)


def with_old_edge_names(graph: JobGraph) -> JobGraph:
    """``graph`` with its edges named as earlier versions named them —
    ``<producer>-><consumer>#<index of the input at the consumer>`` — so that its
    checkpoints store channel state in the layout those versions wrote."""
    edges = []
    for edge in graph.edges:
        index = [e.name for e in graph.inputs(edge.consumer)].index(edge.name)
        edges.append(dataclasses.replace(edge, name=f"{edge.producer}->{edge.consumer}"
                                                    f"#{index}"))
    return dataclasses.replace(graph, edges=tuple(edges))


def channel_states(completed: CompletedCheckpoint, vertex: str) -> list[ChannelState]:
    """The channel-state files of ``vertex``'s tasks in ``completed``."""
    handle = completed.metadata.channel_state.get(vertex)
    return [] if handle is None else [
        decode_channel_state(completed.storage.read_bytes(ref.path, ref.path), ref.path)
        for ref in handle.subtasks.values()]


def stored_edge_names(completed: CompletedCheckpoint) -> set[str]:
    """The edge names ``completed`` stores records in flight under."""
    return {edge for vertex in completed.metadata.channel_state
            for state in channel_states(completed, vertex)
            for (edge, _) in [*state.inputs, *state.outputs]}


def in_flight(completed: CompletedCheckpoint) -> dict[str, list[Any]]:
    """The records ``completed`` holds in flight into ``slow``, per producer (as the
    channels carry them: ``(timestamp, number)`` with event time)."""
    records: dict[str, list[Any]] = {name: [] for name in SOURCES}
    for state in channel_states(completed, "slow"):
        for (edge, _), buffers in state.inputs.items():
            records[edge.split("->")[0]] += [r for b in buffers for r in pickle.loads(b)]
    for producer in SOURCES:
        for state in channel_states(completed, producer):
            for (edge, _), buffers in state.outputs.items():
                assert edge.startswith(f"{producer}->slow"), edge
                records[producer] += [r for b in buffers for r in pickle.loads(b)]
    return records


def checkpoint_in_flight(tmp_path: Path, graph: JobGraph) -> CompletedCheckpoint:
    """Run ``graph`` until it completed unaligned checkpoints with records in flight,
    cancel it (its checkpoints retained) and return the newest one that holds records
    in flight on the edges from both sources."""
    job = LocalJob(graph, CheckpointConfig(interval=200, unaligned=True,
                                           retain_on_cancel=True),
                   restart=weir.RestartStrategy.no_restart())
    running = Running(job)
    running.until(lambda: len(job.result.completed) >= 3
                  and bool(job.checkpoint_stats()[-1].channel_state_bytes))
    job.cancel()
    running.join()
    retained = CheckpointCoordinator(tmp_path / "chk", clean_up=False).completed_checkpoints
    both = [c for c in retained if all(in_flight(c).values())]
    assert both, "no checkpoint holds records in flight from both sources"
    return both[-1]


def restore(graph: JobGraph, completed: CompletedCheckpoint,
            allow_non_restored_state: bool = False) -> LocalJob:
    """A job of ``graph`` that starts from ``completed``."""
    return LocalJob(graph, CheckpointConfig(interval=200, unaligned=True),
                    restart=weir.RestartStrategy.no_restart(), restore_from=completed.url,
                    allow_non_restored_state=allow_non_restored_state)


def lost_and_duplicated(numbers: Counter[int], expected: range) -> tuple[list[int], list[int]]:
    """The numbers of ``expected`` missing from ``numbers``, and those more than once."""
    lost = sorted(set(expected) - set(numbers))
    return lost, sorted(v for v in expected if numbers[v] > 1)


@pytest.mark.parametrize("layout", ["current", "event-time", "earlier-versions"])
def test_a_union_restored_with_its_inputs_swapped_restores_every_record_in_flight(
        tmp_path: Path, layout: str) -> None:
    event_time = layout == "event-time"
    before = union_job(tmp_path, "chk", event_time=event_time)
    if layout == "earlier-versions":
        before = with_old_edge_names(before)
    completed = checkpoint_in_flight(tmp_path, before)
    stored = {name: len(records) for name, records in in_flight(completed).items()}
    tags = "[0,timestamped]" if event_time else "[0]"
    assert stored_edge_names(completed) == (
        {"first->slow#0", "second->slow#1"} if layout == "earlier-versions"
        else {f"{uid}->slow{tags}" for uid in SOURCES})
    after = union_job(tmp_path, "chk2", order="second,first", event_time=event_time)
    restore(after, completed).run(timeout_s=120)
    numbers = Counter(read_stream_sink(tmp_path / "out"))
    lost, duplicated = lost_and_duplicated(numbers, range(N))
    print(f"[{layout}] checkpoint {completed.checkpoint_id}, records in flight {stored}: "
          f"L={len(lost)} D={len(duplicated)}")
    assert (lost[:5], duplicated[:5], len(lost), len(duplicated)) == ([], [], 0, 0)
    assert sum(numbers.values()) == N


def test_records_in_flight_on_an_edge_the_job_no_longer_has_are_refused_or_dropped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    completed = checkpoint_in_flight(tmp_path, union_job(tmp_path, "chk"))
    dropped = in_flight(completed)["second"]
    after = union_job(tmp_path, "chk2", second_to="side")  # "second" no longer feeds "slow"
    with pytest.raises(weir.RestoreError) as refused:
        restore(after, completed).claim()
    message = str(refused.value)
    print(message)
    for part in (f"checkpoint {completed.checkpoint_id}", completed.url, "'second'",
                 "'slow'", "allow_non_restored_state=True"):
        assert part in message, (part, message)
    assert "'first'" not in message  # (its edge is still there)

    with caplog.at_level(logging.WARNING, logger="weir"):
        restore(after, completed, allow_non_restored_state=True).run(timeout_s=120)
    drops = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(drops) == 1 and "'second'" in drops[0] and "'slow'" in drops[0], drops
    out = Counter(read_stream_sink(tmp_path / "out"))
    assert lost_and_duplicated(out, range(HALF)) == ([], [])  # "first": every number once
    # "second": every number once, in "out" before the checkpoint or in "side" after it,
    # but for exactly the records in flight into "slow", which were dropped
    seconds = Counter({v: c for v, c in out.items() if v >= HALF})
    seconds.update(read_stream_sink(tmp_path / "side"))
    lost, duplicated = lost_and_duplicated(seconds, range(HALF, N))
    assert duplicated == [] and lost == sorted(dropped) and dropped


@pytest.mark.parametrize("checkpointed_with_event_time", [False, True],
                         ids=["switched-on", "switched-off"])
def test_event_time_switched_across_records_in_flight_is_refused_when_the_job_starts(
        tmp_path: Path, checkpointed_with_event_time: bool) -> None:
    completed = checkpoint_in_flight(
        tmp_path, union_job(tmp_path, "chk", event_time=checkpointed_with_event_time))
    after = union_job(tmp_path, "chk2", event_time=not checkpointed_with_event_time)
    job = restore(after, completed, allow_non_restored_state=True)
    with pytest.raises(weir.RestoreError) as refused:
        job.claim()
    message = str(refused.value)
    print(message)
    for part in (f"checkpoint {completed.checkpoint_id}", completed.url, "event time",
                 "savepoint"):
        assert part in message, (part, message)
    assert not job.task_pids  # refused before any task started


class Rules(weir.KeyedBroadcastProcessFunction[int, int, int]):
    """Keyed side passes through; broadcast side is ignored (graph tests only)."""

    def process_broadcast_element(self, value: int, ctx: Any) -> Any:
        return None

    def process_element(self, value: int, ctx: Any) -> Any:
        yield value


def edges_into(consumer: str, build: Any, *, event_time: bool = False) -> tuple[JobGraph,
                                                                           list[str]]:
    """The graph ``build(env, watermarks)`` declares, and its edges into ``consumer``."""
    env = StreamEnvironment(weir.JobConfig("unused", parallelism=2))
    watermarks = (WatermarkStrategy.for_monotonous_timestamps(lambda v: v)
                  if event_time else None)
    build(env, watermarks)
    graph = env.job_graph("names")
    return graph, [e.name for e in graph.inputs(consumer)]


def test_edges_are_named_by_producer_consumer_and_side_not_by_input_order() -> None:
    def union(order: list[str]) -> Any:
        def build(env: StreamEnvironment, watermarks: Any) -> None:
            first, *others = (env.from_source(SequenceSource(4), uid=uid,
                                              watermarks=watermarks) for uid in order)
            first.union(*others).process(SlowPass(), uid="v->w#2").sink_to(
                FileSink("unused"), uid="sink")
        return build

    graph, names = edges_into("v->w#2", union(["x->y", "z#1", "w[0]"]))
    swapped, swapped_names = edges_into("v->w#2", union(["w[0]", "x->y", "z#1"]))
    assert names == ["x->y->v->w#2[0]", "z#1->v->w#2[0]", "w[0]->v->w#2[0]"]
    assert sorted(swapped_names) == sorted(names)
    for edge in graph.inputs("v->w#2"):  # what it stored belongs to the same edge there
        assert [belongs_to(edge.name, e, swapped) for e in swapped.inputs("v->w#2")] == [
            e.producer == edge.producer for e in swapped.inputs("v->w#2")]
    # as the earlier layout named them (by input index) they belong by producer too
    for k, edge in enumerate(graph.inputs("v->w#2")):
        old = f"{edge.producer}->{edge.consumer}#{k}"
        assert stored_timestamps(old) is None
        assert [belongs_to(old, e, swapped) for e in swapped.inputs("v->w#2")] == [
            e.producer == edge.producer for e in swapped.inputs("v->w#2")]

    _, timed = edges_into("v->w#2", union(["x->y", "z#1"]), event_time=True)
    assert timed == ["x->y->v->w#2[0,timestamped]", "z#1->v->w#2[0,timestamped]"]
    assert [stored_timestamps(n) for n in timed + names[:1]] == [True, True, False]


def test_edges_between_the_same_two_tasks_are_told_apart() -> None:
    def self_union(env: StreamEnvironment, watermarks: Any) -> None:
        numbers = env.from_source(SequenceSource(4), uid="numbers")
        numbers.union(numbers).process(SlowPass(), uid="v").sink_to(FileSink("unused"),
                                                                   uid="sink")

    graph, names = edges_into("v", self_union)
    assert names == ["numbers->v[0]", "numbers->v[1]"]
    inputs = graph.inputs("v")
    assert [[belongs_to(n, e, graph) for e in inputs] for n in names] == [
        [True, False], [False, True]]
    # the earlier layout: several edges from one producer — by the input's index
    assert [[belongs_to(f"numbers->v#{k}", e, graph) for e in inputs] for k in (0, 1)] == [
        [True, False], [False, True]]

    def keyed_and_broadcast(env: StreamEnvironment, watermarks: Any) -> None:
        numbers = env.from_source(SequenceSource(4), uid="numbers")
        (numbers.key_by(lambda v: v % 2).connect(numbers.broadcast(RULES))
            .process(Rules(), uid="v").sink_to(FileSink("unused"), uid="sink"))

    graph, names = edges_into("v", keyed_and_broadcast)
    assert names == ["numbers->v[0]", "numbers->v[0,broadcast]"]
    assert [[belongs_to(n, e, graph) for e in graph.inputs("v")] for n in names] == [
        [True, False], [False, True]]
