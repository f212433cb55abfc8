"""The wire format of the continuous runtime's channels (version 1).

A channel is one TCP connection from a producer subtask to a consumer subtask of one
edge. Every message is a *frame*::

    uint32_be length n | uint8 kind | n - 1 bytes of body

Kinds and bodies:

* ``CHALLENGE`` (consumer → producer, first): 32 random bytes (a nonce).
* ``HELLO`` (producer → consumer, answer): msgpack ``{"v": 1, "job", "edge",
  "producer", "consumer", "mac"}``, ``mac`` = HMAC-SHA256(secret, nonce + msgpack of the
  other fields). The consumer compares it in constant time and closes the connection
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
* ``EVENT`` (producer → consumer): msgpack of an event (barrier, cancellation marker,
  watermark, end of partition); in order with the data, sent without credit.

A frame longer than :data:`MAX_FRAME` is refused (a peer that is not weir).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import socket
import struct
from typing import Any

import msgpack

from weir.errors import ChannelError

__all__ = ["MAX_FRAME", "VERSION", "Kind", "hello_mac", "read_frame", "write_frame"]

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


def frame(kind: Kind, body: bytes | memoryview = b"") -> bytes:
    """One frame's bytes."""
    return _HEADER.pack(len(body) + 1, kind) + bytes(body)


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
