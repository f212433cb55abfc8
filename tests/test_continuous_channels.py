"""Credit-based channels of the continuous runtime over real TCP on loopback: order of
records and events, backpressure that blocks the sender with bounded memory, floating
credits, blocked channels (alignment), the shared secret, a producer in another OS
process, the buffer timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from weir.errors import ChannelError
from weir.runtime.continuous.channels import DEFAULT_CONFIG, ChannelConfig, OutputChannel
from weir.runtime.continuous.gates import ChannelServer, InputGate
from weir.runtime.continuous.wire import Kind

SECRET = b"s3cret-of-the-job"


@pytest.fixture
def server() -> Iterator[ChannelServer]:
    srv = ChannelServer(secret=SECRET, job="job")
    yield srv
    srv.close()


def connect(srv: ChannelServer, producer: int = 0, config: ChannelConfig = DEFAULT_CONFIG,
            **kw: Any) -> OutputChannel:
    args: dict[str, Any] = {"secret": SECRET, "job": "job", "edge": "e", "producer": producer,
                            "consumer": 0, "config": config, **kw}
    return OutputChannel(srv.address, **args)


def drain(gate: InputGate, timeout_s: float = 30.0) -> list[tuple[int, Any]]:
    """Every record and event until every channel ended: (channel, record or event)."""
    out: list[tuple[int, Any]] = []
    deadline = time.monotonic() + timeout_s
    while not gate.finished:
        assert time.monotonic() < deadline, f"gate did not finish; got {len(out)}"
        got = gate.poll(0.5)
        if got is None:
            continue
        channel, kind, item = got
        if kind is Kind.DATA:
            out.extend((channel, r) for r in item)
        else:
            out.append((channel, item))
    return out


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def settled(value: Callable[[], int], quiet_s: float = 0.3) -> int:
    """``value()`` once it stopped changing for ``quiet_s``."""
    last, since = value(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.02)
        now = value()
        if now != last:
            last, since = now, time.monotonic()
    return last


def test_records_and_events_arrive_in_order(server: ChannelServer) -> None:
    gate = server.gate("e", 0, 1)
    out = connect(server)

    def produce() -> None:
        for i in range(10_000):
            out.emit(i)
            if i == 4_999:
                out.emit_event({"kind": "barrier", "id": 7})
        out.close()

    producer = threading.Thread(target=produce)
    producer.start()
    got = drain(gate)
    producer.join()
    assert got[:5_000] == [(0, i) for i in range(5_000)]
    assert got[5_000] == (0, {"kind": "barrier", "id": 7})
    assert got[5_001:-1] == [(0, i) for i in range(5_000, 10_000)]
    assert got[-1] == (0, {"kind": "end"})
    assert gate.records_in == 10_000 and out.records_out == 10_000


def test_backpressure_blocks_the_sender_and_bounds_its_memory(server: ChannelServer) -> None:
    config = ChannelConfig(buffer_records=10, buffer_timeout_ms=1_000, exclusive_buffers=2,
                           floating_buffers=0, max_backlog=2)
    gate = server.gate("e", 0, 1, config)
    out = connect(server, config=config)
    sent = threading.Thread(target=lambda: [out.emit(i) for i in range(10_000)] and None)
    sent.start()
    # nothing is taken: the sender stops after the receiver's 2 credits, 2 queued
    # buffers and one being filled
    emitted = settled(lambda: out.records_out)
    assert emitted <= (2 + 2 + 1) * 10 and sent.is_alive()
    assert gate.queued(0) == 2 and out.backlog == 2
    got: list[tuple[int, Any]] = []
    finisher = threading.Thread(target=lambda: (sent.join(), out.close()))
    finisher.start()
    got = drain(gate)
    finisher.join()
    assert [r for _, r in got[:-1]] == list(range(10_000))
    assert out.backpressured_ns > 0


def test_floating_credits_go_to_the_channel_with_a_backlog(server: ChannelServer) -> None:
    config = ChannelConfig(buffer_records=5, buffer_timeout_ms=1_000, exclusive_buffers=1,
                           floating_buffers=4, max_backlog=6)
    gate = server.gate("e", 0, 2, config)
    busy, idle = connect(server, 0, config), connect(server, 1, config)
    threading.Thread(target=lambda: [busy.emit(i) for i in range(1_000)], daemon=True).start()
    # channel 0 holds its exclusive buffer and all four floating ones, no more
    wait_until(lambda: gate.queued(0) == 5)
    assert settled(lambda: gate.queued(0)) == 5 and gate.queued(1) == 0
    idle.close()
    busy.abort()


def test_a_blocked_channel_stops_while_the_others_flow(server: ChannelServer) -> None:
    config = ChannelConfig(buffer_records=20, exclusive_buffers=2, floating_buffers=2)
    gate = server.gate("e", 0, 2, config)
    gate.block(0)
    outs = [connect(server, i, config) for i in range(2)]

    def produce(i: int) -> None:
        for n in range(2_000):
            outs[i].emit((i, n))
        outs[i].close()

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    seen: list[Any] = []
    while not (seen and seen[-1] == {"kind": "end"}):
        got = gate.poll(10.0)
        assert got is not None
        channel, kind, item = got
        assert channel == 1  # never the blocked channel
        seen.extend(item if kind is Kind.DATA else [item])
    assert seen[:-1] == [(1, n) for n in range(2_000)]
    assert settled(lambda: gate.queued(0)) <= 2 + 2  # its exclusive and floating credits
    gate.unblock(0)
    rest = drain(gate)
    assert [r for _, r in rest[:-1]] == [(0, n) for n in range(2_000)]
    for t in threads:
        t.join()


def test_only_a_producer_with_the_secret_gets_in(server: ChannelServer) -> None:
    gate = server.gate("e", 0, 1)
    with pytest.raises(ChannelError, match="secret"):
        connect(server, secret=b"guess")
    with pytest.raises(ChannelError, match="not 'other'"):
        connect(server, job="other")
    with pytest.raises(ChannelError, match="no input 'f'"):
        connect(server, edge="f")
    assert server.refused == 3 and gate.connected == 0
    out = connect(server)
    out.emit("in")
    out.close()
    assert drain(gate) == [(0, "in"), (0, {"kind": "end"})]


def test_a_partial_buffer_goes_after_the_buffer_timeout(server: ChannelServer) -> None:
    gate = server.gate("e", 0, 1, ChannelConfig(buffer_records=1_000))
    out = connect(server, config=ChannelConfig(buffer_records=1_000, buffer_timeout_ms=5))
    out.emit("alone")  # no flush: the flusher sends it
    got = gate.poll(10.0)
    assert got == (0, Kind.DATA, ["alone"])
    out.close()


PRODUCER = """
import os, sys
from weir.runtime.continuous.channels import DEFAULT_CONFIG, ChannelConfig, OutputChannel
host, port, n, producer = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
out = OutputChannel((host, port), secret=os.environb[b"WEIR_TEST_SECRET"], job="job",
                    edge="e", producer=producer, consumer=0,
                    config=ChannelConfig(buffer_records=256))
for i in range(n):
    out.emit((producer, i))
out.close()
"""


def test_producers_in_other_processes(server: ChannelServer) -> None:
    gate = server.gate("e", 0, 2, ChannelConfig(buffer_records=256))
    procs = [subprocess.Popen([sys.executable, "-c", PRODUCER, *map(str, server.address),
                               "50000", str(i)],
                              env={**os.environ, "WEIR_TEST_SECRET": SECRET.decode()})
             for i in range(2)]
    got = drain(gate, timeout_s=120)
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    for i in range(2):
        assert [r for c, r in got if c == i and isinstance(r, tuple)] == [
            (i, n) for n in range(50_000)]


def test_an_event_never_overtakes_records_even_with_a_full_backlog(
    server: ChannelServer
) -> None:
    """The flusher filled the backlog; records emitted after it must still precede the
    barrier (else they fall into the next checkpoint's epoch: lost on restore)."""
    config = ChannelConfig(buffer_records=100, buffer_timeout_ms=5, exclusive_buffers=1,
                           floating_buffers=0, max_backlog=1)
    gate = server.gate("e", 0, 1, config)
    out = connect(server, config=config)
    for i in range(100):
        out.emit(i)  # a full buffer, sent on the one credit
    for i in range(100, 103):
        out.emit(i)
    wait_until(lambda: out.backlog == 1)  # the flusher queued them: the backlog is full
    for i in range(103, 106):
        out.emit(i)
    out.emit_event({"kind": "barrier", "id": 1})
    closer = threading.Thread(target=out.close)
    closer.start()
    got = drain(gate)
    closer.join()
    assert got == [(0, i) for i in range(106)] + [
        (0, {"kind": "barrier", "id": 1}), (0, {"kind": "end"})]
