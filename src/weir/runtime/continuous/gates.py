"""The receiving side of the continuous runtime's channels (the sending side and the
flow-control rules: :mod:`weir.runtime.continuous.channels`): an :class:`InputGate` per
task input, fed by one reader thread per producer's connection, and the process's
:class:`ChannelServer` that authenticates producers and hands each connection to its
gate.

**Unaligned barriers.** A barrier marked ``unaligned`` (it overtook its sender's
queued buffers) overtakes this gate's queue too: :meth:`InputGate.poll` returns it
before any buffer. When its task takes an unaligned checkpoint it asks the gate for the
checkpoint's *input state* (:meth:`InputGate.record`): per channel, the buffers that
came before that channel's barrier and that the task had not taken when it
checkpointed — those queued then, and those arriving until the channel's barrier (or
its end); a barrier already queued in order behind such buffers then overtakes them too.
The task still processes them afterwards; the checkpoint stores them so that a
restore replays them. A channel whose barrier the task already took in order (aligned
until the checkpoint timed out into an unaligned one) records nothing.

Watermarks and idleness of the gate's channels are combined by the task with a
:class:`~.valve.WatermarkValve` (Flink's ``StatusWatermarkValve``)."""

from __future__ import annotations

import contextlib
import itertools
import pickle
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import msgpack

from weir.errors import ChannelError, ConfigurationError
from weir.runtime.continuous.channels import DEFAULT_CONFIG, U32, ChannelConfig
from weir.runtime.continuous.wire import (
    Kind,
    Listener,
    Refused,
    failure,
    greet,
    read_frame,
    refuse,
    write_frame,
)

__all__ = ["ChannelServer", "InputGate"]


class InputGate:
    """The receiving ends of one task input: a channel per producer subtask (see the
    module doc). The task thread calls :meth:`poll`, :meth:`block`, :meth:`unblock`;
    one reader thread per channel fills it."""

    def __init__(self, edge: str, consumer: int, producers: int,
                 config: ChannelConfig = DEFAULT_CONFIG) -> None:
        self.edge, self.consumer, self.producers, self.config = edge, consumer, producers, config
        self._cond = threading.Condition()
        self._socks: list[socket.socket | None] = [None] * producers
        #: per channel: (Kind.DATA, records, their pickled bytes) or (Kind.EVENT, dict, None)
        self._queues: list[deque[tuple[Kind, Any, bytes | None]]] = [
            deque() for _ in range(producers)]
        #: unaligned barriers, ahead of every queue: (channel, event); the task checks it
        #: between records to stop a buffer midway (:meth:`unread`)
        self.priority: deque[tuple[int, dict[str, Any]]] = deque()
        #: ids of record lists put back by :meth:`unread` (their credit went back already)
        self._unread: set[int] = set()
        #: channel -> (checkpoint id, buffers queued before it) of an unaligned barrier
        #: that arrived while no input state was being recorded
        self._cuts: dict[int, tuple[int, int]] = {}
        #: the input state being recorded: checkpoint id, buffers per channel, channels
        #: still open (their barrier has not come), and its future
        self._recording: tuple[int, list[list[bytes]], set[int],
                               Future[list[list[bytes]]]] | None = None
        self._announced = [0] * producers  # credits the sender holds, unused
        self._floating = [0] * producers   # floating buffers lent to the channel
        self._backlog = [0] * producers
        self._blocked = [False] * producers
        self._ended = [False] * producers
        self._pool = config.floating_buffers
        self._error: BaseException | None = None
        self._next = 0
        #: counters: buffers and records taken by the task
        self.buffers_in = 0
        self.records_in = 0

    @property
    def finished(self) -> bool:
        """Every channel delivered its end of partition (and the task took it)."""
        return all(self._ended)

    @property
    def connected(self) -> int:
        """Channels whose producer has connected."""
        return sum(s is not None for s in self._socks)

    def poll(self, timeout_s: float | None = None) -> tuple[int, Kind, Any] | None:
        """The next buffer (``(channel, Kind.DATA, records)``) or event (``(channel,
        Kind.EVENT, dict)``) of an unblocked channel, taking channels in turn; None if
        nothing came within ``timeout_s`` or every channel has ended."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._error is not None:
                    raise failure(f"input {self.edge} of subtask {self.consumer}",
                                  self._error) from self._error
                if self.priority:
                    c, event = self.priority.popleft()
                    return c, Kind.EVENT, event
                n = self.producers
                for k in range(n):
                    c = (self._next + k) % n
                    if self._blocked[c] or not self._queues[c]:
                        continue
                    self._next = c + 1
                    kind, item, _ = self._queues[c].popleft()
                    if kind is Kind.DATA and id(item) in self._unread:
                        self._unread.discard(id(item))  # (counted and credited once)
                    elif kind is Kind.DATA:
                        self.buffers_in += 1
                        self.records_in += _rows(item)
                        self._returned(c)
                    elif item.get("kind") == "end":
                        self._ended[c] = True
                    return c, kind, item
                if all(self._ended):
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)

    def block(self, channel: int) -> None:
        """Take nothing more from ``channel`` (its credit is withheld)."""
        with self._cond:
            self._blocked[channel] = True

    def unblock(self, channel: int | None = None) -> None:
        """Take from ``channel`` again (None: every channel)."""
        with self._cond:
            for c in range(self.producers) if channel is None else (channel,):
                self._blocked[c] = False
            self._cond.notify_all()

    def is_blocked(self, channel: int) -> bool:
        """Whether ``channel`` is blocked."""
        return self._blocked[channel]

    def queued(self, channel: int) -> int:
        """Buffers and events received on ``channel`` that the task has not taken."""
        return len(self._queues[channel])

    def record(self, checkpoint_id: int, in_order: frozenset[int] | set[int]
               ) -> Future[list[list[bytes]]]:
        """Record the input state of unaligned checkpoint ``checkpoint_id``, taken now
        by the task (see the module doc); ``in_order``: channels whose barrier the task
        already took in order. The future: per channel, its buffers (pickled lists of
        records), once every channel's barrier or end has come."""
        future: Future[list[list[bytes]]] = Future()
        with self._cond:
            if self._recording is not None:
                self._recording[3].set_exception(ChannelError(
                    f"input {self.edge} of subtask {self.consumer}: checkpoint "
                    f"{self._recording[0]} superseded by {checkpoint_id}"))
            buffers: list[list[bytes]] = [[] for _ in range(self.producers)]
            still_open: set[int] = set()
            for c in range(self.producers):
                if c in in_order:
                    continue
                cut = self._cuts.get(c)
                queue = self._queues[c]
                if cut is not None and cut[0] == checkpoint_id:
                    buffers[c] = [raw for _, _, raw in queue if raw is not None][:cut[1]]
                    continue
                closed = self._ended[c]
                for at, (_, item, raw) in enumerate(queue):
                    if raw is not None:
                        buffers[c].append(raw)
                    elif item.get("kind") == "end":
                        closed = True
                        break
                    elif item.get("kind") == "barrier" and item.get("id") == checkpoint_id:
                        # queued in order behind buffers now recorded: it overtakes them
                        # (Flink converts it to a priority event), so that the checkpoint
                        # does not wait for the task to work through them
                        del queue[at]
                        self.priority.append((c, {**item, "unaligned": True}))
                        self._cond.notify_all()
                        closed = True
                        break
                if not closed:
                    still_open.add(c)
            self._cuts.clear()
            self._recording = (checkpoint_id, buffers, still_open, future)
            self._recorded_if_closed()
        return future

    def overtake_due(self, now_ms: float, timeout_ms: int) -> None:
        """Let every barrier queued in order whose checkpoint is older than
        ``timeout_ms`` overtake the buffers ahead of it (aligned checkpoints that time
        out into unaligned ones: the task would otherwise see it only after working
        through them; Flink announces such barriers ahead for the same reason)."""
        with self._cond:
            for c, queue in enumerate(self._queues):
                for at, (_, item, raw) in enumerate(queue):
                    if (raw is None and item.get("kind") == "barrier"
                            and not item.get("aligned") and item.get("savepoint") is None
                            and now_ms - int(item["ts"]) >= timeout_ms):
                        ahead = sum(r is not None for _, _, r in itertools.islice(queue, at))
                        del queue[at]
                        self._cuts[c] = (int(item["id"]), ahead)
                        self.priority.append((c, {**item, "unaligned": True}))
                        self._cond.notify_all()
                        break

    def unread(self, channel: int, records: list[Any]) -> None:
        """Put back the rest of a buffer the task stopped midway because an unaligned
        barrier came (:attr:`priority`): first on its channel again, before that barrier
        for the input state, and taken again after the checkpoint."""
        with self._cond:
            self._unread.add(id(records))
            self._queues[channel].appendleft(
                (Kind.DATA, records, pickle.dumps(records, protocol=5)))
            cut = self._cuts.get(channel)
            if cut is not None:
                self._cuts[channel] = (cut[0], cut[1] + 1)

    def stop_recording(self, checkpoint_id: int, why: str) -> None:
        """Give up recording the input state of ``checkpoint_id`` (it was aborted)."""
        with self._cond:
            if self._recording is not None and self._recording[0] == checkpoint_id:
                self._recording[3].set_exception(ChannelError(
                    f"input {self.edge} of subtask {self.consumer}: checkpoint "
                    f"{checkpoint_id} aborted ({why})"))
                self._recording = None

    def _recorded_if_closed(self) -> None:
        """(Locked.) Resolve the recording once no channel is open."""
        if self._recording is not None and not self._recording[2]:
            self._recording[3].set_result(self._recording[1])
            self._recording = None

    def close(self) -> None:
        """Close every channel's connection."""
        with self._cond:
            for sock in self._socks:
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()
            self._ended = [True] * self.producers
            self._cond.notify_all()

    # -- (locked) credit accounting

    def _grant(self, c: int, n: int) -> None:
        sock = self._socks[c]
        if n <= 0 or sock is None:
            return
        self._announced[c] += n
        try:
            write_frame(sock, Kind.CREDIT, U32.pack(n))
        except OSError as exc:
            self._error = exc

    def _lend(self, c: int) -> None:
        want = self._backlog[c] - self._announced[c]
        if want > 0 and self._pool > 0:
            k = min(want, self._pool)
            self._pool -= k
            self._floating[c] += k
            self._grant(c, k)

    def _returned(self, c: int) -> None:
        """The task took a buffer of ``c``: its slot is free again."""
        if self._floating[c] > 0 and self._backlog[c] <= self._announced[c]:
            self._floating[c] -= 1
            self._pool += 1
            for other in range(self.producers):
                self._lend(other)
        else:
            self._grant(c, 1)

    # -- reader threads

    def _attach(self, producer: int, sock: socket.socket) -> None:
        with self._cond:
            if self._socks[producer] is not None:
                raise ChannelError(f"input {self.edge} of subtask {self.consumer}: producer "
                                   f"{producer} connected twice")
            self._socks[producer] = sock
            self._grant(producer, self.config.exclusive_buffers)
        threading.Thread(target=self._read, args=(producer, sock),
                         name=f"gate {self.edge}[{producer}->{self.consumer}]",
                         daemon=True).start()

    def _arrived(self, c: int, event: dict[str, Any]) -> None:
        """(Locked.) Event ``event`` came on channel ``c``."""
        what = event.get("kind")
        recording = self._recording
        if recording is not None and c in recording[2] and (
                what == "end" or (what == "barrier" and event.get("id") == recording[0])):
            recording[2].discard(c)  # that channel's input state is complete
            self._recorded_if_closed()
        if what == "barrier" and event.get("unaligned"):
            if recording is None or recording[0] != event.get("id"):
                self._cuts[c] = (int(event["id"]), sum(
                    raw is not None for _, _, raw in self._queues[c]))
            self.priority.append((c, event))
        else:
            self._queues[c].append((Kind.EVENT, event, None))

    def _read(self, c: int, sock: socket.socket) -> None:
        where = f"input {self.edge} of subtask {self.consumer}, channel {c}"
        try:
            while True:
                kind, body = read_frame(sock, where)
                if kind is Kind.DATA:
                    raw = body[4:]
                    records = pickle.loads(raw)
                    with self._cond:
                        self._queues[c].append((kind, records, raw))
                        recording = self._recording
                        if recording is not None and c in recording[2]:
                            recording[1][c].append(raw)
                        self._announced[c] -= 1
                        self._backlog[c] = U32.unpack_from(body)[0]
                        self._lend(c)
                        self._cond.notify_all()
                elif kind is Kind.BACKLOG:
                    with self._cond:
                        self._backlog[c] = U32.unpack(body)[0]
                        self._lend(c)
                elif kind is Kind.EVENT:
                    event = msgpack.unpackb(body)
                    with self._cond:
                        self._arrived(c, event)
                        self._cond.notify_all()
                    if event.get("kind") == "end":
                        return
                else:
                    raise ChannelError(f"{where}: unexpected {kind.name} from the sender")
        except (ChannelError, OSError) as exc:
            with self._cond:
                if not self._ended[c]:
                    self._error = exc
                self._cond.notify_all()


class ChannelServer:
    """Where a process's input gates accept their producers: listens on ``host``
    (loopback by default), checks each producer's proof of the job's ``secret``, and
    hands the connection to the gate registered for its edge and consumer."""

    def __init__(self, *, secret: bytes, job: str, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        if not secret:
            raise ConfigurationError("a ChannelServer needs the job's shared secret")
        self.secret, self.job = secret, job
        self._gates: dict[tuple[str, int], tuple[InputGate, dict[int, int]]] = {}
        self._lock = threading.Lock()
        self.refused = 0
        self._listener = Listener(host, port, self._handshake, f"channel server {host}:{port}")
        self.address = self._listener.address

    def gate(self, edge: str, consumer: int, producers: int,
             config: ChannelConfig = DEFAULT_CONFIG) -> InputGate:
        """Register (before handing out the address) and return the input gate of
        ``edge`` at subtask ``consumer``, fed by ``producers`` channels."""
        return self.input_gate(consumer, [(edge, range(producers))], config)

    def input_gate(self, consumer: int, inputs: Sequence[tuple[str, Sequence[int]]],
                   config: ChannelConfig = DEFAULT_CONFIG) -> InputGate:
        """Register and return the one input gate of subtask ``consumer`` of a task with
        several input edges: ``inputs`` lists each edge with the producer subtasks that
        send on it; the gate's channels are numbered in that order (the first edge's
        producers first)."""
        routes: list[tuple[str, dict[int, int]]] = []
        channel = 0
        for edge, producers in inputs:
            routes.append((edge, {p: channel + k for k, p in enumerate(producers)}))
            channel += len(producers)
        gate = InputGate("+".join(e for e, _ in inputs), consumer, channel, config)
        with self._lock:
            for edge, channels in routes:
                self._gates[(edge, consumer)] = (gate, channels)
        return gate

    def close(self) -> None:
        """Stop accepting; the gates close their own channels."""
        self._listener.close()

    def _handshake(self, sock: socket.socket) -> None:
        where = f"a producer connecting to {self.address[0]}:{self.address[1]}"
        try:
            hello = greet(sock, secret=self.secret, job=self.job, where=where)
            with self._lock:
                route = self._gates.get((str(hello.get("edge")),
                                         int(hello.get("consumer", -1))))
            producer = hello.get("producer")
            channel = None if route is None or not isinstance(producer, int) else (
                route[1].get(producer))
            if route is None or channel is None:
                raise Refused(f"no input {hello.get('edge')!r} at subtask "
                              f"{hello.get('consumer')} for producer {producer}")
            write_frame(sock, Kind.WELCOME)
            sock.settimeout(None)
            route[0]._attach(channel, sock)
        except Refused as exc:
            self.refused += 1
            refuse(sock, str(exc))
        except (ChannelError, OSError, ValueError, TypeError):
            self.refused += 1
            with contextlib.suppress(OSError):
                sock.close()


def _rows(records: list[Any]) -> int:
    """The records of a buffer, a batch of records counting its rows (looked at once a
    buffer: a buffer of batches starts with one)."""
    if not records:
        return 0
    first = records[0]
    if type(first) is tuple and len(first) == 2:  # (timestamp, record) with event time
        first = first[1]
    if not hasattr(first, "num_rows"):
        return len(records)
    return sum(getattr(r[1] if type(r) is tuple else r, "num_rows", 1) for r in records)
