"""The wire format of the continuous runtime's channels (version 1).

A channel is one TCP connection from a producer subtask to a consumer subtask of one
edge; a control connection one from a task to the job's coordinator. Both open with the
same handshake (:func:`dial`, :func:`greet`). Every message is a *frame*::

    uint32_be length n | uint8 kind | n - 1 bytes of body

Kinds and bodies:

* ``CHALLENGE`` (consumer → producer, first): 32 random bytes (a nonce).
* ``HELLO`` (producer → consumer, answer): msgpack ``{"v": 1, "job", ..., "mac"}``
  (a channel: ``"edge", "producer", "consumer"``; a control connection: ``"task",
  "subtask"``), ``mac`` = HMAC-SHA256(secret, nonce + msgpack of the other fields).
  The consumer compares it in constant time and closes the connection
  on a mismatch (a ``REFUSED`` frame with the reason first).
* ``WELCOME`` (consumer → producer): empty; the channel is open.
* ``REFUSED`` (consumer → producer): the reason, UTF-8.
* ``CREDIT`` (consumer → producer): uint32_be — that many more buffers may be sent.
* ``DATA`` (producer → consumer): uint32_be backlog (buffers queued behind this one at
  the producer), then one buffer of records (pickle protocol 5 of a list: both ends are
  processes of the same job, authenticated by the shared secret).
* ``BACKLOG`` (producer → consumer): uint32_be — buffers waiting for credit, sent when
  the backlog grows while the producer has no credit (Flink's backlog announcement), so
  the consumer can lend it floating credits.
* ``CONTROL`` (either way, on a task's control connection to the coordinator): msgpack
  of a message (``weir.runtime.continuous.control``).
* ``EVENT`` (producer → consumer): msgpack of an event (barrier, cancellation marker,
  watermark, end of partition); in order with the data, sent without credit.

A frame longer than :data:`MAX_FRAME` is refused (a peer that is not weir).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack

from weir.errors import ChannelError

__all__ = ["MAX_FRAME", "VERSION", "Kind", "Listener", "Refused", "dial", "greet",
           "hello_mac", "read_frame", "refuse", "write_frame"]

VERSION = 1
MAX_FRAME = 256 << 20
_HEADER = struct.Struct(">IB")


class Kind(enum.IntEnum):
    """What a frame carries."""

    CHALLENGE = 1
    HELLO = 2
    WELCOME = 3
    REFUSED = 4
    CREDIT = 5
    DATA = 6
    EVENT = 7
    BACKLOG = 8
    CONTROL = 9


def frame(kind: Kind, body: bytes | memoryview = b"") -> bytes:
    """One frame's bytes."""
    return _HEADER.pack(len(body) + 1, kind) + bytes(body)


def failure(where: str, error: BaseException) -> ChannelError:
    """``error`` as a :class:`ChannelError` that says where it happened, once (an error
    whose message starts with ``where`` already keeps its message)."""
    text = str(error)
    return ChannelError(text if text.startswith(where) else f"{where}: {text}")


def write_frame(sock: socket.socket, kind: Kind, body: bytes | memoryview = b"") -> None:
    """Send one frame (the caller serializes writers of one socket)."""
    sock.sendall(frame(kind, body))


def _exactly(sock: socket.socket, n: int, where: str) -> bytes:
    out = bytearray(n)
    view = memoryview(out)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ChannelError(f"{where}: the peer closed the connection")
        got += k
    return bytes(out)


def read_frame(sock: socket.socket, where: str) -> tuple[Kind, bytes]:
    """The next frame from ``sock``; a closed connection or a malformed frame is a
    :class:`~weir.errors.ChannelError` naming ``where``."""
    length, kind = _HEADER.unpack(_exactly(sock, _HEADER.size, where))
    if not 1 <= length <= MAX_FRAME:
        raise ChannelError(f"{where}: a frame of {length} bytes (a peer that is not weir?)")
    try:
        parsed = Kind(kind)
    except ValueError:
        raise ChannelError(f"{where}: unknown frame kind {kind}") from None
    return parsed, _exactly(sock, length - 1, where)


def hello_mac(secret: bytes, nonce: bytes, fields: dict[str, Any]) -> bytes:
    """The MAC a producer proves the shared secret with."""
    return hmac.new(secret, nonce + msgpack.packb(fields), hashlib.sha256).digest()


class Refused(Exception):
    """A connecting peer is turned away (the reason goes to it in a ``REFUSED`` frame)."""


def dial(address: tuple[str, int], *, secret: bytes, fields: dict[str, Any],
         timeout_s: float, where: str) -> socket.socket:
    """Connect to ``address`` (retrying while nobody listens yet, up to ``timeout_s``),
    prove ``secret`` with ``fields`` (``"v"`` and ``"job"`` added by the caller) and
    return the open socket, blocking and without timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection(
                address, timeout=max(deadline - time.monotonic(), 0.1))
            break
        except ConnectionRefusedError as exc:
            if time.monotonic() >= deadline:
                raise ChannelError(f"{where}: nobody listens there ({exc})") from exc
            time.sleep(0.05)
        except OSError as exc:
            raise ChannelError(f"{where}: cannot connect: {exc}") from exc
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        kind, nonce = read_frame(sock, where)
        if kind is not Kind.CHALLENGE:
            raise ChannelError(f"{where}: expected a challenge, got {kind.name}")
        write_frame(sock, Kind.HELLO, msgpack.packb(
            {**fields, "mac": hello_mac(secret, nonce, fields)}))
        kind, body = read_frame(sock, where)
        if kind is Kind.REFUSED:
            raise ChannelError(f"{where}: refused: {body.decode(errors='replace')}")
        if kind is not Kind.WELCOME:
            raise ChannelError(f"{where}: expected welcome, got {kind.name}")
        sock.settimeout(None)
        return sock
    except (ChannelError, OSError) as exc:
        sock.close()
        if isinstance(exc, ChannelError):
            raise
        raise ChannelError(f"{where}: {exc}") from exc


def greet(sock: socket.socket, *, secret: bytes, job: str, where: str) -> dict[str, Any]:
    """The accepting side of the handshake: challenge, check the proof of ``secret``
    and the job; the peer's fields (without the MAC). Raises :class:`Refused`; the
    caller answers ``WELCOME`` or :func:`refuse`."""
    sock.settimeout(30.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    nonce = os.urandom(32)
    write_frame(sock, Kind.CHALLENGE, nonce)
    kind, body = read_frame(sock, where)
    hello = msgpack.unpackb(body) if kind is Kind.HELLO else None
    if not isinstance(hello, dict):
        raise Refused(f"expected hello, got {kind.name}")
    mac = hello.pop("mac", b"")
    if not isinstance(mac, bytes) or not hmac.compare_digest(
            hello_mac(secret, nonce, hello), mac):
        raise Refused("the job's shared secret was not proven")
    if hello.get("job") != job or hello.get("v") != VERSION:
        raise Refused(f"this is job {job!r} (protocol {VERSION}), not {hello.get('job')!r} "
                      f"(protocol {hello.get('v')})")
    return hello


def refuse(sock: socket.socket, reason: str) -> None:
    """Tell the peer why, and close."""
    with contextlib.suppress(OSError):
        write_frame(sock, Kind.REFUSED, reason.encode())
    with contextlib.suppress(OSError):
        sock.close()


class Listener:
    """A listening socket on ``host:port`` (0: any free port) whose accepted
    connections each go to ``serve`` in a thread of their own, until :meth:`close`."""

    def __init__(self, host: str, port: int, serve: Callable[[socket.socket], None],
                 name: str) -> None:
        self._sock = socket.create_server((host, port))
        self.address: tuple[str, int] = (host, self._sock.getsockname()[1])
        self.closed = False
        self._serve = serve
        threading.Thread(target=self._accept, name=name, daemon=True).start()

    def close(self) -> None:
        """Stop accepting."""
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()
