"""Live state queries of a running continuous job (Flink's queryable state, done over
the job's own connections).

A keyed state is queryable when its descriptor says so (``descriptor.queryable(name)``).
A query names the operator uid, the queryable name and a key:

1. ``JobClient.query_state`` — or a :class:`QueryableStateClient` connected to the job's
   query endpoint (:class:`QueryServer`, in the driver: loopback by default; every
   connection proves the job's query secret with an HMAC of a fresh challenge, as task
   connections do) — hands it to the driver's :class:`QueryRouter`;
2. the router finds the task that owns the key's key group (the key hashed as the job
   routes records) and sends it the query on its control connection;
3. the task answers in its own thread, between two buffers of input (:func:`read_live`):
   the value is that of the key after every record the task processed before, and never
   a half-processed one; a query waits at most for the buffer in hand.

Keys and values travel as weir's msgpack (``MsgpackSerializer``: tuples, sets and
frozensets kept), never pickle: a client does not run code it receives. A value that does
not encode is a :class:`~weir.errors.QueryError`, as are an unknown operator or state, a
job between attempts (restarting) or ended, and a wrong secret.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
import json
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import msgpack

from weir.api.serializers import MsgpackSerializer
from weir.api.state import ListState, MapState, ValueState
from weir.errors import ChannelError, KeyGroupError, QueryError
from weir.runtime.continuous.graph import JobGraph, OpKind
from weir.runtime.continuous.wire import (
    VERSION,
    Kind,
    Listener,
    Refused,
    dial,
    greet,
    read_frame,
    refuse,
    write_frame,
)
from weir.runtime.endpoints import require_secret
from weir.runtime.operator import KeyedOperator
from weir.state.keygroups import assign_key_to_parallel_operator

__all__ = ["QueryRouter", "QueryServer", "QueryServerConfig", "QueryableStateClient",
           "read_live"]

_CODEC = MsgpackSerializer()
#: the job name a query connection's handshake carries (the endpoint serves one job)
_QUERY = "weir-query"


def _encode(value: Any, what: str) -> bytes:
    try:
        return _CODEC.encode(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise QueryError(f"{what} does not encode as msgpack ({exc}); query states whose "
                         f"values are None, bool, int, float, str, bytes, list, dict, "
                         f"tuple or set") from exc


@dataclass(frozen=True)
class QueryServerConfig:
    """Where a job answers live state queries: ``host`` (loopback by default) and
    ``port`` (0: any free one), and the shared ``secret`` clients prove (a random one if
    None; required when ``host`` is not loopback)."""

    host: str = "127.0.0.1"
    port: int = 0
    secret: str | None = None

    def __post_init__(self) -> None:
        require_secret(self.host, self.secret, "a query server",
                       f"QueryServerConfig(host={self.host!r}, secret=...)")


def _plain(report: Any) -> Any:
    """A dataclass of the job's reports as msgpack-able dicts (enums by value)."""
    return json.loads(json.dumps(dataclasses.asdict(report),
                                 default=lambda o: o.value if isinstance(o, enum.Enum) else str(o)))


# ------------------------------------------------------------------------ task side


def read_live(op: KeyedOperator, state: str, key: Any) -> Any:
    """The value of queryable ``state`` for ``key`` in ``op`` now (the task's thread,
    between records)."""
    states = op.keyed_state.queryable()
    found = states.get(state)
    if found is None:
        raise QueryError(f"{op.config.describe()} has no queryable state {state!r}; its "
                         f"queryable states: {sorted(states)} (descriptor.queryable(name) "
                         f"declares one, once the function registered it)")
    cell = found[1]
    ctx = op.key_context
    try:
        ctx.set_current_key(key)
    except KeyGroupError as exc:
        raise QueryError(f"{op.config.describe()}: key {key!r} is not in its key groups: "
                         f"{exc}") from exc
    try:
        if isinstance(cell, MapState):
            return dict(cell.items())
        if isinstance(cell, ListState):
            return list(cell.get())
        if isinstance(cell, ValueState):
            return cell.value()
        return cell.get()  # type: ignore[attr-defined]  # reducing, aggregating
    finally:
        ctx.clear()


def answer(ops: dict[str, KeyedOperator], message: dict[str, Any]) -> dict[str, Any]:
    """A task's reply to a ``query`` message (``ops``: its keyed operators by uid)."""
    reply: dict[str, Any] = {"kind": "query_result", "qid": message["qid"]}
    try:
        op = ops.get(str(message["uid"]))
        if op is None:
            raise QueryError(f"this task has no keyed operator {message['uid']!r}")
        value = read_live(op, str(message["state"]), _CODEC.decode(message["key"]))
        reply["value"] = _encode(value, f"the value of state {message['state']!r}")
    except Exception as exc:  # the query fails, never the task
        reply["error"] = str(exc) if isinstance(exc, QueryError) else (
            f"{type(exc).__name__}: {exc}")
    return reply


# ---------------------------------------------------------------------- driver side


class QueryRouter:
    """The driver's part: queries in, to the owning task, answers back (thread-safe;
    the driver's loop calls :meth:`dispatch` and :meth:`answered`)."""

    def __init__(self, graph: JobGraph, wake: Callable[[], None]) -> None:
        self.graph, self._wake = graph, wake
        #: keyed operator uid -> the vertex whose tasks hold its state
        self._keyed = {op.name: v for v in graph.vertices for op in v.chain
                       if op.kind is OpKind.KEYED}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._queued: list[tuple[tuple[str, int], dict[str, Any], Future[Any]]] = []
        self._waiting: dict[int, Future[Any]] = {}
        self._running = False
        self._why_not = f"job {graph.job!r} has not started"

    def ask(self, uid: str, state: str, key: Any) -> Future[Any]:
        """Query ``state`` of operator ``uid`` for ``key``; the future's value or
        :class:`~weir.errors.QueryError`."""
        return self.ask_encoded(uid, state, _encode(key, f"key {key!r}"), key)

    def ask_encoded(self, uid: str, state: str, key_bytes: bytes,
                    key: Any = None) -> Future[Any]:
        """:meth:`ask` with the key already encoded."""
        vertex = self._keyed.get(uid)
        if vertex is None:
            raise QueryError(f"job {self.graph.job!r} has no keyed operator {uid!r}; its "
                             f"keyed operators: {sorted(self._keyed)}")
        if key is None:
            key = _CODEC.decode(key_bytes)
        subtask = assign_key_to_parallel_operator(key, self.graph.max_parallelism,
                                                  vertex.parallelism)
        future: Future[Any] = Future()
        with self._lock:
            if not self._running:
                raise QueryError(f"{self._why_not}; ask again once it runs")
            qid = next(self._ids)
            self._queued.append(((vertex.id, subtask), {
                "kind": "query", "qid": qid, "uid": uid, "state": state, "key": key_bytes},
                future))
            self._waiting[qid] = future
        self._wake()
        return future

    def set_running(self, running: bool, why_not: str = "") -> None:
        """Whether the job's tasks are up; when they go down, every open query fails
        with ``why_not``."""
        with self._lock:
            self._running = running
            if running:
                return
            self._why_not = why_not
            waiting, self._waiting, self._queued = self._waiting, {}, []
        for future in waiting.values():
            if not future.done():
                future.set_exception(QueryError(f"{why_not}; ask again once it runs"))

    def dispatch(self, send: Callable[[tuple[str, int], dict[str, Any]], object]) -> None:
        """Send the queued queries to their tasks."""
        if not self._queued:
            return
        with self._lock:
            queued, self._queued = self._queued, []
        for task, message, _ in queued:
            send(task, message)

    def answered(self, message: dict[str, Any]) -> None:
        """A task's ``query_result``."""
        with self._lock:
            future = self._waiting.pop(int(message["qid"]), None)
        if future is None or future.done():
            return
        if "error" in message:
            future.set_exception(QueryError(str(message["error"])))
        else:
            future.set_result(_CODEC.decode(message["value"]))


class QueryServer:
    """The job's endpoint (see the module doc): one request, one answer, over a
    connection that proved the secret. Frames: ``CONTROL`` msgpack in, ``{"value": value
    bytes}`` or ``{"error": text}`` out. Requests: ``{"uid", "state", "key": key bytes}``
    (a live state query), ``{"op": "metrics"}`` and ``{"op": "checkpoints"}`` (the
    job's task metrics and checkpoint history, as plain dicts)."""

    def __init__(self, router: QueryRouter, config: QueryServerConfig,
                 timeout_s: float = 30.0, *,
                 metrics: Callable[[], list[Any]] = list,
                 checkpoints: Callable[[], list[Any]] = list) -> None:
        self.router, self.timeout_s = router, timeout_s
        self._reports = {"metrics": metrics, "checkpoints": checkpoints}
        self.secret = (config.secret or os.urandom(16).hex())
        self._listener = Listener(config.host, config.port, self._serve,
                                  f"query server of {router.graph.job}")
        self.address = self._listener.address

    def close(self) -> None:
        """Stop accepting."""
        self._listener.close()

    def _serve(self, sock: socket.socket) -> None:
        where = f"a query client of job {self.router.graph.job!r}"
        try:
            greet(sock, secret=self.secret.encode(), job=_QUERY, where=where)
            write_frame(sock, Kind.WELCOME)
            sock.settimeout(None)
            while True:
                kind, body = read_frame(sock, where)
                request = msgpack.unpackb(body) if kind is Kind.CONTROL else None
                if not isinstance(request, dict):
                    return
                reply: dict[str, Any]
                try:
                    report = self._reports.get(str(request.get("op", "state")))
                    if report is not None:
                        value = [_plain(x) for x in report()]
                    else:
                        value = self.router.ask_encoded(
                            str(request["uid"]), str(request["state"]),
                            bytes(request["key"])).result(self.timeout_s)
                    reply = {"value": _encode(value, "the value")}
                except Exception as exc:
                    reply = {"error": str(exc) if isinstance(exc, QueryError) else
                             f"{type(exc).__name__}: {exc}"}
                write_frame(sock, Kind.CONTROL, msgpack.packb(reply))
        except Refused as exc:
            refuse(sock, str(exc))
        except (ChannelError, OSError, ValueError, TypeError, KeyError):
            pass
        finally:
            with contextlib.suppress(OSError):
                sock.close()


class QueryableStateClient:
    """Asks a running continuous job for the live value of a key's queryable state.

    ``address``: the job's query endpoint (``JobClient.query_address``, ``"host:port"``
    or a pair); ``secret``: its query secret (``JobClient.query_secret``). One
    connection, reused; not thread-safe (one client per thread)."""

    def __init__(self, address: str | tuple[str, int], secret: str,
                 timeout_s: float = 30.0) -> None:
        if isinstance(address, str):
            host, _, port = address.rpartition(":")
            address = (host, int(port))
        self.address, self.timeout_s = address, timeout_s
        self._where = f"query endpoint {address[0]}:{address[1]}"
        try:
            self._sock = dial(address, secret=secret.encode(),
                              fields={"v": VERSION, "job": _QUERY}, timeout_s=timeout_s,
                              where=self._where)
        except ChannelError as exc:
            raise QueryError(str(exc)) from exc

    def get(self, uid: str, state: str, key: Any) -> Any:
        """The value of queryable ``state`` of operator ``uid`` for ``key`` (None when
        the key has none)."""
        return self._ask({"uid": uid, "state": state, "key": _encode(key, f"key {key!r}")})

    def metrics(self) -> list[dict[str, Any]]:
        """The job's task metrics (``JobClient.metrics()``, as dicts)."""
        return list(self._ask({"op": "metrics"}))

    def checkpoints(self) -> list[dict[str, Any]]:
        """The job's checkpoint history (``JobClient.checkpoints()``, as dicts)."""
        return list(self._ask({"op": "checkpoints"}))

    def _ask(self, request: dict[str, Any]) -> Any:
        try:
            write_frame(self._sock, Kind.CONTROL, msgpack.packb(request))
            self._sock.settimeout(self.timeout_s)
            kind, body = read_frame(self._sock, self._where)
        except (ChannelError, OSError) as exc:
            raise QueryError(f"{self._where}: {exc}") from exc
        reply = msgpack.unpackb(body) if kind is Kind.CONTROL else None
        if not isinstance(reply, dict):
            raise QueryError(f"{self._where}: an answer that is not weir's")
        if "error" in reply:
            raise QueryError(str(reply["error"]))
        return _CODEC.decode(reply["value"])

    def close(self) -> None:
        """Close the connection."""
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> QueryableStateClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
