"""Unaligned barriers, piece by piece (Flink's ``UnalignedCheckpointsTest`` and
``AlternatingCheckpointsTest`` shapes): the handler triggers on the first barrier or
when alignment times out, never for savepoints or the final checkpoint; a sender's
barrier overtakes its queued buffers (at once, or at its deadline) and hands them over
as output state; a receiver's gate delivers an overtaking barrier before its queued
buffers and records, per channel, exactly the buffers before that channel's barrier that
the task had not taken — over real TCP channels on loopback."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import test_continuous_barriers as barrier_tests
from weir.errors import ChannelError
from weir.runtime.continuous.barriers import AbortReason, AlignedBarrierHandler, Barrier
from weir.runtime.continuous.channels import ChannelConfig, OutputChannel
from weir.runtime.continuous.gates import ChannelServer, InputGate
from weir.runtime.continuous.wire import Kind

SECRET = b"s3cret-of-the-job"
#: one record per buffer; no flusher: a buffer waits for credit until the test grants it
ONE = ChannelConfig(buffer_records=1, buffer_timeout_ms=0, exclusive_buffers=1,
                    floating_buffers=0, max_backlog=64)


class Recorder(barrier_tests.Recorder):
    """The barrier tests' gate-and-task, noting also which channels came in order."""

    def trigger_checkpoint(self, barrier: Barrier,  # type: ignore[override]
                           in_order: frozenset[int] | None = None) -> None:
        self.calls.append(("trigger", barrier.checkpoint_id, in_order))


def handler(timeout_ms: int, now: list[float], channels: int = 3
            ) -> tuple[AlignedBarrierHandler, Recorder]:
    rec = Recorder(channels)
    return AlignedBarrierHandler(channels, rec, rec, unaligned=True,
                                 aligned_timeout_ms=timeout_ms,
                                 wall_ms=lambda: now[0]), rec


def test_unaligned_triggers_on_the_first_barrier_and_blocks_nothing() -> None:
    h, rec = handler(0, [1000.0])
    h.on_barrier(1, Barrier(1, 1000))
    assert rec.outcomes() == [("trigger", 1, frozenset({1}))] and not rec.blocked
    h.on_barrier(0, Barrier(1, 1000, unaligned=True))
    assert h.received == {0, 1} and h.triggered
    h.on_barrier(2, Barrier(1, 1000))
    assert rec.outcomes() == [("trigger", 1, frozenset({1}))]  # once
    assert not h.received and not h.triggered  # done: every channel delivered it


def test_aligned_with_timeout_switches_to_unaligned_when_alignment_takes_too_long() -> None:
    now = [1000.0]
    h, rec = handler(50, now)
    h.on_barrier(0, Barrier(1, 1000))
    h.on_barrier(2, Barrier(1, 1000))
    assert rec.blocked == {0, 2} and rec.outcomes() == []
    now[0] = 1049.0
    h.check_timeout()
    assert rec.outcomes() == []
    now[0] = 1050.0
    h.check_timeout()  # the channels that delivered it in order record nothing
    assert rec.outcomes() == [("trigger", 1, frozenset({0, 2}))] and not rec.blocked
    h.on_barrier(1, Barrier(1, 1000, unaligned=True))
    assert not h.received and len(rec.outcomes()) == 1


def test_an_overtaking_barrier_switches_an_alignment_at_once() -> None:
    h, rec = handler(10_000, [1000.0])
    h.on_barrier(0, Barrier(1, 1000))
    h.on_barrier(1, Barrier(1, 1000, unaligned=True))
    assert rec.outcomes() == [("trigger", 1, frozenset({0}))] and not rec.blocked


@pytest.mark.parametrize("barrier", [Barrier(1, 1000, savepoint="file:///sp"),
                                     Barrier(1, 1000, aligned=True)],
                         ids=["savepoint", "final checkpoint"])
def test_savepoints_and_the_final_checkpoint_stay_aligned(barrier: Barrier) -> None:
    now = [1000.0]
    h, rec = handler(0, now)
    h.on_barrier(0, barrier)
    now[0] = 99_999.0
    h.check_timeout()
    assert rec.outcomes() == [] and rec.blocked == {0}
    h.on_barrier(1, barrier)
    h.on_barrier(2, barrier)
    assert rec.outcomes() == [("trigger", 1, None)] and not rec.blocked


def test_a_cancellation_marker_after_an_unaligned_trigger_aborts_it() -> None:
    h, rec = handler(0, [1000.0])
    h.on_barrier(0, Barrier(1, 1000))
    h.on_cancellation(1, 1)
    assert rec.outcomes()[-1] == (
        "abort", 1, AbortReason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER)
    assert not h.received and not h.triggered
    h.on_barrier(2, Barrier(1, 1000))  # a late barrier of the aborted checkpoint
    assert len(rec.outcomes()) == 2


# --------------------------------------------------------------- over real channels


@pytest.fixture
def server() -> Iterator[ChannelServer]:
    srv = ChannelServer(secret=SECRET, job="job")
    yield srv
    srv.close()


def connect(srv: ChannelServer, producer: int, config: ChannelConfig = ONE) -> OutputChannel:
    return OutputChannel(srv.address, secret=SECRET, job="job", edge="e", producer=producer,
                         consumer=0, config=config)


def records(buffers: list[bytes]) -> list[Any]:
    return [r for b in buffers for r in pickle.loads(b)]


def poll(gate: InputGate) -> tuple[int, Kind, Any]:
    got = gate.poll(5.0)
    assert got is not None
    return got


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def arrived(gate: InputGate, overtaking: int = 1) -> None:
    """Wait until the gate's reader threads have taken ``overtaking`` barriers in."""
    wait_for(lambda: len(gate.priority) >= overtaking, "no overtaking barrier arrived")


def queued(gate: InputGate, items: int) -> None:
    """Wait until channel 0 of the gate holds ``items`` buffers and events."""
    wait_for(lambda: gate.queued(0) >= items, f"fewer than {items} queued")


def sent(out: OutputChannel, gate: InputGate, *, arrived: int, waiting: int) -> None:
    """Wait until ``arrived`` buffers of ``out`` reached channel 0 of the gate and
    ``waiting`` more wait in ``out``'s queue for credit."""
    wait_for(lambda: gate.queued(0) >= arrived and out.backlog == waiting,
             f"not {arrived} buffers at the receiver and {waiting} waiting for credit")


def barrier(n: int) -> dict[str, Any]:
    return {"kind": "barrier", "id": n, "ts": 0, "savepoint": None}


def test_a_barrier_overtakes_the_senders_queue_and_the_receivers_queue(
        server: ChannelServer) -> None:
    gate = server.gate("e", 0, 1, ONE)
    out = connect(server, 0)
    for i in range(5):
        out.emit(i)  # one credit: record 0 is sent, 1..4 wait in the sender's queue
    sent(out, gate, arrived=1, waiting=4)
    overtaken = out.emit_barrier(barrier(1), unaligned=True)
    assert records(overtaken.result(5)) == [1, 2, 3, 4]  # its output state
    arrived(gate)
    _, kind, event = poll(gate)  # ahead of record 0, queued at the receiver
    assert kind is Kind.EVENT and event["id"] == 1 and event["unaligned"] is True
    inputs = gate.record(1, frozenset())
    assert inputs.done() and [records(b) for b in inputs.result()] == [[0]]
    got = [r for _ in range(5) for r in poll(gate)[2]]  # then everything, still in order
    assert got == [0, 1, 2, 3, 4]
    out.close()


def test_input_state_is_what_came_before_each_channels_barrier_and_was_not_taken(
        server: ChannelServer) -> None:
    gate = server.gate("e", 0, 2, ChannelConfig(buffer_records=1, buffer_timeout_ms=0))
    a, b = connect(server, 0), connect(server, 1)
    a.emit("a0")
    b.emit("b0")
    b.emit("b1")
    wait_for(lambda: gate.queued(0) >= 1 and gate.queued(1) >= 2,
             "a0, b0 and b1 did not all reach the gate")
    assert poll(gate)[2] in (["a0"], ["b0"])
    a.emit_barrier(barrier(1), unaligned=True)
    arrived(gate)
    first = poll(gate)
    assert first[1] is Kind.EVENT and first[0] == 0  # the barrier, before what is queued
    inputs = gate.record(1, frozenset())
    assert not inputs.done()  # channel 1's barrier has not come
    b.emit("b2")  # before channel 1's barrier: recorded
    b.emit_event(barrier(1))  # in order this time
    b.emit("b3")  # after it: not recorded
    state = inputs.result(5)
    taken = set().union(*(set(records(x)) for x in state))
    assert records(state[1])[-1] == "b2" and "b3" not in taken
    assert taken == {"a0", "b0", "b1", "b2"} - {"a0" if state[0] == [] else "b0"}
    a.close()
    b.close()


def test_an_aligned_barrier_overtakes_at_its_deadline(server: ChannelServer) -> None:
    gate = server.gate("e", 0, 1, ONE)
    out = connect(server, 0, ChannelConfig(buffer_records=1, buffer_timeout_ms=5,
                                           exclusive_buffers=1, floating_buffers=0,
                                           max_backlog=64))
    for i in range(4):
        out.emit(i)
    sent(out, gate, arrived=1, waiting=3)
    deadline = time.monotonic() + 0.3
    overtaken = out.emit_barrier(barrier(1), deadline=deadline)
    # in order, behind records 1..3, until its deadline: looked at until then while the
    # flusher checks it every 5 ms
    looked = 0
    while True:
        done = overtaken.done()  # (before reading the clock: the flusher read it first)
        if time.monotonic() >= deadline:
            break
        assert not done, "the barrier overtook the queued records before its deadline"
        looked += 1
        time.sleep(0.01)
    assert looked, "the test did not get to look at the barrier before its deadline"
    assert records(overtaken.result(5)) == [1, 2, 3]
    arrived(gate)
    assert poll(gate)[2]["unaligned"] is True
    in_time = out.emit_barrier(barrier(2), deadline=time.monotonic() + 60)
    assert [poll(gate)[2] for _ in range(4)] == [[0], [1], [2], [3]]  # credit returns
    assert in_time.result(5) == []  # went in order: it overtook nothing
    out.close()


def test_a_recording_stops_when_its_checkpoint_is_aborted(server: ChannelServer) -> None:
    gate = server.gate("e", 0, 1, ONE)
    out = connect(server, 0)
    inputs = gate.record(3, frozenset())
    gate.stop_recording(3, "an upstream task declined it")
    with pytest.raises(ChannelError, match="aborted"):
        inputs.result(5)
    out.close()


def test_a_barrier_queued_in_order_overtakes_once_the_checkpoint_turns_unaligned(
        server: ChannelServer) -> None:
    config = ChannelConfig(buffer_records=1, buffer_timeout_ms=0)
    gate = server.gate("e", 0, 1, config)
    out = connect(server, 0, config)
    out.emit("a")
    out.emit("b")
    out.emit_event(barrier(1))  # in order: an aligned checkpoint's barrier
    out.emit("c")
    queued(gate, 4)
    inputs = gate.record(1, frozenset())  # its alignment timed out: now unaligned
    assert [records(b) for b in inputs.result(5)] == [["a", "b"]]
    _, kind, event = poll(gate)  # the barrier comes first now, marked overtaking
    assert kind is Kind.EVENT and event["id"] == 1 and event["unaligned"] is True
    assert [poll(gate)[2] for _ in range(3)] == [["a"], ["b"], ["c"]]
    out.close()


def test_a_queued_barrier_past_its_alignment_timeout_overtakes_before_any_is_taken(
        server: ChannelServer) -> None:
    config = ChannelConfig(buffer_records=1, buffer_timeout_ms=0)
    gate = server.gate("e", 0, 1, config)
    out = connect(server, 0, config)
    out.emit("a")
    out.emit_event({**barrier(1), "ts": 1000})
    queued(gate, 2)
    gate.overtake_due(1100, 200)  # 100 ms after its trigger: not yet
    assert not gate.priority
    gate.overtake_due(1200, 200)
    _, kind, event = poll(gate)
    assert kind is Kind.EVENT and event["unaligned"] is True
    inputs = gate.record(1, frozenset())  # the task triggers on it: "a" came before
    assert [records(b) for b in inputs.result(5)] == [["a"]]
    out.close()
