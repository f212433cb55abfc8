"""Credit-based channels between the tasks of the continuous runtime: Flink's network
flow control, between OS processes over TCP (wire format: :mod:`.wire`).

**Sender** (:class:`OutputChannel`, one per edge and consumer subtask). Records collect
in a buffer of up to ``buffer_records``; a full buffer, or a partial one when the
flusher's ``buffer_timeout_ms`` passes (Flink's ``OutputFlusher``; 0: every record) or
(``flush_when_idle``) when its task finds no more input ready, is queued. A queued buffer
is sent only against a credit and tells the receiver how many buffers wait behind it
(the backlog). Events (barriers, watermarks, end of partition)
travel in order with the buffers and need no credit. When ``max_backlog`` buffers wait
for credit, :meth:`OutputChannel.emit` blocks: backpressure, all the way up to the
sources. A sender holds at most ``max_backlog`` + 1 buffers.

**Receiver** (``gates.InputGate``, one per task input, one channel per producer
subtask). Each channel has ``exclusive_buffers`` credits of its own; the gate lends its
``floating_buffers`` to channels whose backlog exceeds their credit and takes them back
once the backlog is gone (a sender without credit announces a growing backlog). A
buffer the task takes returns its credit. A gate holds at
most channels x exclusive + floating buffers. Blocking a channel (aligning a barrier)
stops the task taking from it: its credit is withheld and its sender stops once it has
used what it was given.

**Barriers** (:meth:`OutputChannel.emit_barrier`) go in order with the buffers
(aligned checkpoints) or overtake them (unaligned: the barrier is written at once, and
the buffers it overtook — the partial one included — are the channel's *output state*
of that checkpoint: they were emitted before it, so they are stored with it and still
sent after the barrier). An aligned barrier with a deadline (aligned checkpoints that
time out into unaligned ones) waits in order until the deadline, then overtakes what
is still ahead of it; the flusher thread checks the deadlines.

The receiving side is :mod:`weir.runtime.continuous.gates`. Who connects: a consumer's
``ChannelServer`` listens (loopback by default) and
registers a gate per input before its address is handed out; a producer connects,
answers the server's challenge with an HMAC of the job's shared secret, and is
refused (:class:`~weir.errors.ChannelError`) without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import pickle
import socket
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ClassVar

import msgpack

from weir.errors import ChannelError, ConfigurationError
from weir.runtime.continuous.wire import (
    VERSION,
    Kind,
    dial,
    failure,
    read_frame,
    write_frame,
)

__all__ = ["DEFAULT_CONFIG", "ChannelConfig", "OutputChannel", "U32"]

U32 = struct.Struct(">I")


@dataclasses.dataclass(frozen=True, slots=True)
class ChannelConfig:
    """Flow-control settings of a job's channels (Flink's names in brackets)."""

    #: records per buffer (a buffer is the unit of credit; a record that is a batch of
    #: records split by key column counts its rows) [memory segment size]
    buffer_records: int = 512
    #: a partial buffer is sent after at most this long; 0: after every record
    #: [execution.buffer-timeout, 100 ms in Flink; small here for latency]
    buffer_timeout_ms: float = 10.0
    #: a partial buffer is also sent as soon as its task has nothing else to do (no
    #: input waiting, or its source returned less than a full batch): at a low rate a
    #: record waits for no timeout, while under load buffers still fill (not in Flink)
    flush_when_idle: bool = True
    #: credits of each input channel of its own [exclusive buffers per channel: 2]
    exclusive_buffers: int = 2
    #: credits a gate lends to channels with a backlog [floating buffers per gate: 8]
    floating_buffers: int = 8
    #: buffers a sender queues before emit blocks
    max_backlog: int = 2

    def __post_init__(self) -> None:
        for name in ("buffer_records", "exclusive_buffers", "max_backlog"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"ChannelConfig.{name} must be >= 1, got "
                                         f"{getattr(self, name)!r}")
        if self.floating_buffers < 0 or self.buffer_timeout_ms < 0:
            raise ConfigurationError("ChannelConfig: floating_buffers and buffer_timeout_ms "
                                     "must be >= 0")


DEFAULT_CONFIG = ChannelConfig()


# ------------------------------------------------------------------------- sender


class OutputChannel:
    """The sending end of one channel (see the module doc). Thread-safe: the task
    thread emits, a reader thread takes credits, the flusher flushes."""

    def __init__(self, address: tuple[str, int], *, secret: bytes, job: str, edge: str,
                 producer: int, consumer: int, config: ChannelConfig = DEFAULT_CONFIG,
                 connect_timeout_s: float = 30.0) -> None:
        self.config = config
        self.where = f"channel {edge}[{producer}->{consumer}] of job {job!r} to " \
                     f"{address[0]}:{address[1]}"
        self._sock = dial(address, secret=secret, timeout_s=connect_timeout_s,
                          where=self.where, fields={"v": VERSION, "job": job, "edge": edge,
                                                    "producer": producer,
                                                    "consumer": consumer})
        self._cond = threading.Condition()
        self._records: list[Any] = []
        self._rows = 0  # rows of the records in the partial buffer (a batch: its rows)
        self._queue: deque[tuple[Kind, bytes]] = deque()
        self._queued_data = 0
        self._credit = 0
        self._announced_backlog = 0
        self._error: BaseException | None = None
        self._closed = False
        #: checkpoint id -> (its barrier's frame, deadline (monotonic s) or None, the
        #: future of the buffers it overtook) for barriers still queued in order
        self._barriers: dict[int, tuple[bytes, float | None, Future[list[bytes]]]] = {}
        #: called about once a second while emit is blocked by backpressure
        self.on_blocked: Callable[[], None] | None = None
        #: whether emit waits while max_backlog buffers wait for credit (False: the
        #: task checks :attr:`available` itself, between batches)
        self.blocking = True
        #: counters: records and buffers sent, ns the task waited for credit
        self.records_out = 0
        self.buffers_out = 0
        self._backpressured_ns = 0
        self._waiting_since: int | None = None  # perf_counter_ns of a wait for credit
        threading.Thread(target=self._read_credits, name=f"credits {self.where}",
                         daemon=True).start()
        if config.buffer_timeout_ms > 0:
            _Flusher.register(self)

    def emit(self, record: Any, rows: int = 1) -> None:
        """Add a record (that is ``rows`` rows: a batch of records counts its rows
        toward a full buffer); blocks while the channel is backpressured."""
        with self._cond:
            self._records.append(record)
            self.records_out += rows
            self._rows += rows
            if self._rows >= self.config.buffer_records or (
                    self.config.buffer_timeout_ms == 0):
                self._finish(wait=self.blocking, force=True)

    def emit_event(self, event: dict[str, Any]) -> None:
        """Send an event (a dict) after every record emitted before it."""
        with self._cond:
            # the records before the event go first, whatever the backlog (else they
            # would follow a barrier into the next checkpoint's epoch)
            self._finish(wait=False, force=True)
            self._queue.append((Kind.EVENT, msgpack.packb(event)))
            self._pump()

    def emit_barrier(self, event: dict[str, Any], *, unaligned: bool = False,
                     deadline: float | None = None) -> Future[list[bytes]]:
        """Send barrier ``event`` after every record emitted before it: in order, or
        (``unaligned``) at once, overtaking the queued buffers; an in-order barrier with
        a ``deadline`` (``time.monotonic()`` seconds) overtakes what is still ahead of
        it then. The future: the buffers it overtook (the channel's output state for
        this checkpoint; empty if it went in order), each a pickled list of records,
        once the barrier is on the wire."""
        cid = int(event["id"])
        future: Future[list[bytes]] = Future()
        with self._cond:
            self._finish(wait=False, force=True)
            if unaligned:
                self._overtake(event, future,
                               [body for kind, body in self._queue if kind is Kind.DATA])
            else:
                self._barriers[cid] = (msgpack.packb(event), deadline, future)
                self._queue.append((Kind.EVENT, self._barriers[cid][0]))
                self._pump()
        if deadline is not None:
            _Flusher.register(self)  # (it checks the deadlines)
        return future

    def overtake_due(self, now: float) -> None:
        """Let every queued barrier whose deadline passed overtake the buffers ahead
        of it (called by the flusher)."""
        if not self._barriers:
            return
        with self._cond:
            for cid, (frame, deadline, future) in list(self._barriers.items()):
                if deadline is None or now < deadline:
                    continue
                del self._barriers[cid]
                at = next(i for i, (_, body) in enumerate(self._queue) if body is frame)
                ahead = [body for kind, body in itertools.islice(self._queue, at)
                         if kind is Kind.DATA]
                del self._queue[at]
                self._overtake(msgpack.unpackb(frame), future, ahead)

    def _overtake(self, event: dict[str, Any], future: Future[list[bytes]],
                  overtaken: list[bytes]) -> None:
        """(Locked.) Write barrier ``event``, marked unaligned, now, ahead of the
        ``overtaken`` buffers (its output state)."""
        try:
            write_frame(self._sock, Kind.EVENT, msgpack.packb({**event, "unaligned": True}))
        except OSError as exc:
            self._error = exc
            self._cond.notify_all()
            future.set_exception(failure(self.where, exc))
            return
        future.set_result(overtaken)

    def flush(self, *, wait: bool = True) -> None:
        """Queue the partial buffer (and send what credit allows)."""
        with self._cond:
            self._finish(wait=wait)

    def flush_idle(self) -> None:
        """Queue the partial buffer, if any, without waiting: the task has nothing else
        to do (``ChannelConfig.flush_when_idle``)."""
        if self._records:
            with self._cond:
                self._finish(wait=False)

    def close(self, timeout_s: float = 60.0) -> None:
        """Send the end of partition after everything queued, wait until all of it is
        sent (it needs the receiver's credit), and close."""
        self.emit_event({"kind": "end"})
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelError(f"{self.where}: {len(self._queue)} buffers still "
                                       f"unsent after {timeout_s} s (the receiver takes none)")
                self._cond.wait(left)
            self._closed = True
        _Flusher.unregister(self)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def abort(self) -> None:
        """Close at once, dropping what is queued."""
        self._closed = True
        with self._cond:
            self._fail_barriers()
        _Flusher.unregister(self)
        with contextlib.suppress(OSError):
            self._sock.close()

    @property
    def backpressured_ns(self) -> int:
        """Nanoseconds the task waited in :meth:`emit` for credit, the current wait
        included."""
        since = self._waiting_since
        return self._backpressured_ns + (0 if since is None
                                         else time.perf_counter_ns() - since)

    @property
    def available(self) -> bool:
        """Whether fewer than ``max_backlog`` buffers wait for credit (emit would not
        block)."""
        return self._queued_data < self.config.max_backlog and self._error is None

    @property
    def backlog(self) -> int:
        """Buffers waiting for credit."""
        return self._queued_data

    def _finish(self, *, wait: bool, force: bool = False) -> None:
        """(Locked.) Queue the partial buffer (without ``wait`` or ``force`` only below
        ``max_backlog``: the flusher never grows the backlog), send, and with ``wait``
        block while ``max_backlog`` buffers wait for credit."""
        if self._error is not None:
            raise failure(self.where, self._error) from self._error
        if self._records and (wait or force or self._queued_data < self.config.max_backlog):
            self._queue.append((Kind.DATA, pickle.dumps(self._records, protocol=5)))
            self._queued_data += 1
            self._records = []
            self._rows = 0
        self._pump()
        if self._credit == 0 and self._queued_data > self._announced_backlog:
            self._announced_backlog = self._queued_data  # so the receiver can lend credit
            try:
                write_frame(self._sock, Kind.BACKLOG, U32.pack(self._queued_data))
            except OSError as exc:
                self._error = exc
        if wait and self._queued_data >= self.config.max_backlog:
            self._waiting_since = started = time.perf_counter_ns()
            while self._queued_data >= self.config.max_backlog and self._error is None:
                if not self._cond.wait(1.0) and self.on_blocked is not None:
                    self.on_blocked()  # still backpressured: alive, not hung
            self._backpressured_ns += time.perf_counter_ns() - started
            self._waiting_since = None
            if self._error is not None:
                raise failure(self.where, self._error) from self._error

    def _pump(self) -> None:
        """(Locked.) Send queued buffers while credit lasts, events always."""
        try:
            while self._queue:
                kind, body = self._queue[0]
                if kind is Kind.DATA:
                    if self._credit == 0:
                        return
                    self._credit -= 1
                    self._queued_data -= 1
                    self._announced_backlog = self._queued_data
                    write_frame(self._sock, kind, U32.pack(self._queued_data) + body)
                    self.buffers_out += 1
                else:
                    write_frame(self._sock, kind, body)
                    if self._barriers:  # a barrier went in order: it overtook nothing
                        self._sent_in_order(body)
                self._queue.popleft()
                self._cond.notify_all()
        except OSError as exc:
            self._error = exc
            self._fail_barriers()
            self._cond.notify_all()

    def _fail_barriers(self) -> None:
        """(Locked.) The channel failed or closed: no queued barrier will be sent."""
        for _, _, future in self._barriers.values():
            future.set_exception(ChannelError(f"{self.where}: closed before the barrier "
                                              f"was sent"))
        self._barriers.clear()

    def _sent_in_order(self, frame: bytes) -> None:
        for cid, (queued, _, future) in list(self._barriers.items()):
            if queued is frame:
                del self._barriers[cid]
                future.set_result([])

    def _read_credits(self) -> None:
        try:
            while True:
                kind, body = read_frame(self._sock, self.where)
                if kind is not Kind.CREDIT:
                    raise ChannelError(f"{self.where}: unexpected {kind.name} from the receiver")
                with self._cond:
                    self._credit += U32.unpack(body)[0]
                    self._pump()
                    self._cond.notify_all()
        except (ChannelError, OSError) as exc:
            with self._cond:
                if not self._closed:
                    self._error = exc
                self._fail_barriers()
                self._cond.notify_all()


class _Flusher:
    """One thread per process flushing every channel's partial buffer each
    ``buffer_timeout_ms`` (the smallest registered)."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _channels: ClassVar[weakref.WeakSet[OutputChannel]] = weakref.WeakSet()
    _thread: ClassVar[threading.Thread | None] = None
    _pid: ClassVar[int] = 0

    @classmethod
    def register(cls, channel: OutputChannel) -> None:
        with cls._lock:
            cls._channels.add(channel)
            if cls._thread is None or cls._pid != os.getpid():
                cls._pid = os.getpid()
                cls._thread = threading.Thread(target=cls._run, name="weir-flusher",
                                               daemon=True)
                cls._thread.start()

    @classmethod
    def unregister(cls, channel: OutputChannel) -> None:
        with cls._lock:
            cls._channels.discard(channel)

    @classmethod
    def _run(cls) -> None:
        while True:
            with cls._lock:
                channels = list(cls._channels)
            timeout = min((c.config.buffer_timeout_ms for c in channels), default=10.0)
            time.sleep(timeout / 1000)
            now = time.monotonic()
            for channel in channels:
                with contextlib.suppress(ChannelError):
                    channel.flush(wait=False)
                    channel.overtake_due(now)
