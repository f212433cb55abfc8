"""weir's error hierarchy: every error weir raises is a :class:`WeirError`.

::

    WeirError
    ├── ConfigurationError          bad settings: parallelism, max parallelism, backend name
    ├── StateError                  misuse of managed state
    │   ├── StateRegistrationError  a state name registered again with another type/serializer
    │   ├── NoKeyContextError       keyed state or timers used where there is no current key
    │   ├── KeyGroupError           a key outside the subtask's key-group range
    │   ├── StateSerializationError a key or value the serializer cannot encode or decode
    │   ├── ReadOnlyStateError      writing broadcast state from the keyed (read-only) side
    │   └── StateBackendError       the storage under a backend failed (RocksDB, disk)
    ├── RestoreError                a snapshot that cannot be restored as asked
    │   ├── StateMigrationError     a state restored with an incompatible type, serializer or TTL
    │   ├── NoCheckpointError       nothing complete to restore from
    │   ├── MissingStateError       a Spark stage's previous state is not where it must be
    │   ├── IncompleteBatchError    Spark committed a batch that some subtasks never ran
    │   └── CorruptCheckpointError  a checkpoint/savepoint file fails its checksum, is missing
    │       │                       or truncated
    │       └── CheckpointFormatError  a file of another format or format version
    ├── CheckpointError             writing a checkpoint or savepoint failed (storage, disk full)
    ├── OutputSchemaError           a function's output does not fit output_schema (Spark)
    ├── SinkError                   a sink could not stage, commit or abort a batch
    │   └── SinkLineageError        a sink's output belongs to another job lineage
    ├── SourceError                 a source read input it cannot parse (file, offset, line)
    ├── OwnershipError              a checkpoint storage is owned by another running run
    │   └── FencedError             this run lost the storage to a newer owner
    ├── TaskPlacementError          a Spark task got rows of key groups it does not own
    ├── RestartsExhaustedError      a supervised query or job failed; its restart strategy gives up
    ├── ChannelError                a continuous-runtime channel failed: peer gone, bad secret,
    │                               malformed frame
    ├── UserFunctionError           a user's function raised: its exception first, then the
    │                               operator uid, key and record (Spark runtime)
    ├── RemoteError                 an exception of a type this process cannot rebuild,
    │                               raised in another process (a task)
    ├── JobFailedError              a continuous job failed: a task failed or disappeared
    │   └── JobTimeoutError         it ran past ``execute(timeout=...)`` and was stopped
    └── QueryError                  a live state query of a continuous job failed

Messages say what happened, where (state name, operator uid, subtask, key group) and
what to do about it. Lower-level errors are chained with ``raise ... from exc``. An
exception raised in another process (a Spark task, a continuous job's task) reaches the
driver as text; :func:`rebuild_exception` makes it an exception of its own type again
(``isinstance(error.__cause__, KeyError)`` holds), to chain from.
"""

from __future__ import annotations

import ast
import builtins
import linecache
import os
import re
import reprlib
import sys
import traceback
from collections.abc import Iterable
from typing import Any

__all__ = [
    "CheckpointError",
    "CheckpointFormatError",
    "ConfigurationError",
    "CorruptCheckpointError",
    "KeyGroupError",
    "NoCheckpointError",
    "FencedError",
    "IncompleteBatchError",
    "MissingStateError",
    "NoKeyContextError",
    "OwnershipError",
    "OutputSchemaError",
    "QueryError",
    "ReadOnlyStateError",
    "RemoteError",
    "RestartsExhaustedError",
    "ChannelError",
    "JobFailedError",
    "JobTimeoutError",
    "RestoreError",
    "SinkError",
    "SinkLineageError",
    "SourceError",
    "StateBackendError",
    "StateError",
    "StateMigrationError",
    "StateRegistrationError",
    "StateSerializationError",
    "TaskPlacementError",
    "UserFunctionError",
    "WeirError",
]


class WeirError(Exception):
    """Base class of every error raised by weir."""


class ConfigurationError(WeirError, ValueError):
    """A setting is out of range or inconsistent (parallelism, max parallelism, backend)."""


class StateError(WeirError):
    """Managed state was used in a way weir cannot honour."""


class StateRegistrationError(StateError):
    """A state name was registered again with a different kind, serializer or TTL."""


class NoKeyContextError(StateError):
    """Keyed state or a timer was used where no key is current (e.g. in ``open``)."""


class KeyGroupError(StateError):
    """A key belongs to a key group that the current subtask does not own."""


class StateSerializationError(StateError):
    """A key or a state value could not be encoded or decoded by its serializer."""


class ReadOnlyStateError(StateError):
    """Broadcast state was written from the keyed (read-only) side of an operator."""


class StateBackendError(StateError):
    """The storage under a state backend failed (RocksDB, local disk)."""


class RestoreError(WeirError):
    """Snapshots cannot be restored as requested."""


class StateMigrationError(RestoreError):
    """A restored state's kind, serializer or TTL setting is incompatible with its new
    descriptor. Raised when the function registers the state — for states registered
    in ``open`` (the usual place), before any record is processed; nothing restored
    is overwritten either way."""


class NoCheckpointError(RestoreError):
    """There is no complete checkpoint (or savepoint) where one was expected."""


class MissingStateError(RestoreError):
    """A Spark stage's state of the previous batch is not in its checkpoint location
    (deleted, moved, mistyped, restored from an older backup). weir never falls back
    to older or empty state by itself: the message names the ways out."""


class IncompleteBatchError(RestoreError):
    """Spark committed a batch whose weir output was only partly computed (e.g.
    ``show()``, ``take()`` or ``limit()`` inside ``foreachBatch``): some subtasks
    never processed their records of it."""


class CorruptCheckpointError(RestoreError):
    """A checkpoint or savepoint file is missing, truncated, or fails its checksum. A
    runtime never falls back past such a checkpoint by itself (its output may be
    committed); the message names the file and the explicit way to go on."""


class CheckpointFormatError(CorruptCheckpointError):
    """A checkpoint file is not a weir checkpoint file, or has a format version this
    weir cannot read."""


class CheckpointError(WeirError):
    """Writing a checkpoint or savepoint failed; the previous checkpoint is untouched."""


class OutputSchemaError(WeirError, TypeError):
    """A function emitted an output that does not match the declared output schema."""


class SinkError(WeirError):
    """A sink could not stage, commit or abort a batch."""


class SinkLineageError(SinkError):
    """Where a sink writes belongs to another lineage of jobs (another job, or this one
    started afresh without its state): nothing was written; restarting cannot help."""


class SourceError(WeirError):
    """A source read input it cannot turn into records (e.g. a line of a JSON-lines file
    that is not JSON); the message names the file, the byte offset and the line."""


class OwnershipError(WeirError):
    """A checkpoint storage is owned by another run that is still running: a Spark
    query (per operator uid of a location) or a continuous job's driver; one storage
    has one owner at a time."""


class FencedError(OwnershipError):
    """This run was fenced off: a newer query or job run (or an explicit recovery)
    took over its checkpoint storage, so its state is no longer the job's; it stops
    and deletes nothing."""


class TaskPlacementError(WeirError):
    """A Spark task received records of key groups that its subtask does not own."""


class RestartsExhaustedError(WeirError):
    """A supervised streaming query (:func:`weir.spark.supervise`) or continuous job
    (:func:`weir.stream.supervise`) failed once more than its restart strategy allows;
    chained from the last error."""


class ChannelError(WeirError):
    """A channel of the continuous runtime failed: the peer closed it or is not weir, or
    it did not prove the job's shared secret."""


class JobFailedError(WeirError):
    """A continuous job failed: one of its tasks failed or disappeared, or its
    checkpoints failed more often than tolerated."""


class JobTimeoutError(JobFailedError):
    """A continuous job ran longer than its ``timeout`` (``execute(timeout=...)``); its
    tasks were stopped. If it was restarting after a failure, that failure is named
    first and is the ``__cause__``."""


class QueryError(WeirError):
    """A live state query of a continuous job could not be answered: no such operator or
    queryable state, the job is restarting or has ended, the value does not encode, or
    the client did not prove the job's query secret."""


class UserFunctionError(WeirError):
    """A user's function raised while weir ran it (``open``, ``process_element``,
    ``process_broadcast_element``, ``on_timer``) in a task of the Spark runtime. The
    message starts with the user's exception — its type and message — then names the
    method, the operator uid and the key; the next lines the record (a short repr),
    the task (subtask, query, batch) and the frames of the user's code::

        KeyError: 'zzz' (in process_element of operator 'lookup', key 'zzz')
            record: {'key': 'zzz', 'seq': 2}
            task: subtask 1 of 2, query 1db7d3e4-..., batch 0
            File "/app/jobs/lookup.py", line 8, in process_element
                yield (value["key"], table[value["key"]])

    (``on_timer``: the task line names the timer; ``open``: no key, no record; a
    non-keyed function: no key.) Exceptions of weir's own (:class:`WeirError`) are not
    wrapped. In the task it is raised from the user's exception (``__cause__``). On the
    driver, :meth:`from_error` finds it in the text of Spark's error
    (``StreamingQueryException``) and rebuilds it, chained from the user's exception
    rebuilt (:func:`rebuild_exception`); :func:`weir.spark.supervise` names it first in
    its errors and chains its final one from it. Attributes: ``uid``, ``method``,
    ``key`` and ``record`` (reprs; None where unknown), ``exception_type`` (the user's
    exception's type, module-qualified unless built in) and ``exception_message``."""

    def __init__(self, message: str, *, uid: str | None = None, method: str | None = None,
                 key: str | None = None, record: str | None = None,
                 exception_type: str = "", exception_message: str = "") -> None:
        super().__init__(message)
        self.uid, self.method, self.key, self.record = uid, method, key, record
        self.exception_type, self.exception_message = exception_type, exception_message
        #: the error this one was found in (:meth:`from_error`), not chained: its text
        #: repeats this one's, with Spark's frames
        self.reported_in: BaseException | None = None

    def __reduce__(self) -> Any:
        fields = {k: getattr(self, k) for k in ("uid", "method", "key", "record",
                                                "exception_type", "exception_message")}
        return (_user_function_error, (str(self), fields))

    @classmethod
    def of(cls, exc: BaseException, *, uid: str, method: str, key: Any = None,
           keyed: bool = False, record: Any = None, has_record: bool = False,
           task: str = "") -> UserFunctionError:
        """The error for ``exc``, raised by the user's ``method`` of operator ``uid``
        (with the current ``key`` if ``keyed``, on ``record`` if ``has_record``; ``task``
        says which task). Raise it ``from exc``."""
        etype = exception_type_name(type(exc))
        text = str(exc)
        lines = text.splitlines() or [""]
        key_repr = _short_repr(key) if keyed else None
        head = f"{etype}: {lines[0]} (in {method} of operator {uid!r}"
        head += f", key {key_repr})" if key_repr is not None else ")"
        body = [f"{_INDENT}{line}" for line in lines[1:]]
        record_repr = _short_repr(record) if has_record else None
        if record_repr is not None:
            body.append(f"{_INDENT}record: {record_repr}")
        if task:
            body.append(f"{_INDENT}task: {task}")
        body += user_frames(exc.__traceback__)
        return cls("\n".join([head, *body]), uid=uid, method=method, key=key_repr,
                   record=record_repr, exception_type=etype, exception_message=text)

    @classmethod
    def from_error(cls, error: BaseException | str | None) -> UserFunctionError | None:
        """The :class:`UserFunctionError` a task raised, found in the text of ``error``
        (e.g. Spark's ``StreamingQueryException`` of a failed query, or its message) and
        rebuilt here, chained from the user's exception rebuilt (built-in and weir's
        exception types, and those of modules this process imported, are rebuilt as
        themselves; others as :class:`RemoteError`); None if ``error`` holds none.
        Usage: ``except StreamingQueryException as e: raise
        weir.UserFunctionError.from_error(e) or e``."""
        if error is None:
            return None
        if isinstance(error, UserFunctionError):
            return error
        text = error if isinstance(error, str) else str(error)
        start = text.find(_MARK)
        if start < 0:
            return None
        lines = text[start + len(_MARK):].splitlines()
        if not lines:
            return None
        kept = [lines[0]]
        for line in lines[1:]:
            if not line.startswith(_INDENT):
                break
            kept.append(line)
        message = "\n".join(kept)
        found = cls(message)
        head = _HEAD.match(kept[0])
        if head is not None:
            more = []
            for line in kept[1:]:
                body = line[len(_INDENT):]
                if body.startswith("record: "):
                    found.record = body[len("record: "):]
                if body.startswith(("record: ", "task: ", "File ")):
                    break
                more.append(body)
            found.exception_type = head["type"]
            found.exception_message = "\n".join([head["message"], *more])
            found.method, found.key = head["method"], head["key"]
            try:
                found.uid = str(ast.literal_eval(head["uid"]))
            except (ValueError, SyntaxError):
                found.uid = head["uid"]
            found.__cause__ = rebuild_exception(found.exception_type, found.exception_message)
        found.__suppress_context__ = True
        if not isinstance(error, str):
            found.reported_in = error
        return found


def _user_function_error(message: str, fields: dict[str, Any]) -> UserFunctionError:
    return UserFunctionError(message, **fields)


class RemoteError(Exception):
    """An exception raised in another process (a task) whose type this process cannot
    rebuild (:func:`rebuild_exception`: not built in, not weir's, not of an imported
    module): ``type_name`` is its type's name, the message its message."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(type_name, message)
        self.type_name, self.message = type_name, message

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}"


_INDENT = "    "
_MARK = f"{__name__}.UserFunctionError: "
_HEAD = re.compile(
    r"^(?P<type>[A-Za-z_][\w.<>]*): (?P<message>.*) \(in (?P<method>\w+) of operator "
    r"(?P<uid>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")(?:, key (?P<key>.*))?\)$")
_WEIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 80, 80, 40
_REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 8, 8, 8, 8


def _short_repr(value: Any) -> str:
    try:
        return _REPR.repr(value)
    except Exception as exc:  # a user's __repr__ that raises
        return f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"


def exception_type_name(cls: type[BaseException]) -> str:
    """How a traceback names an exception type: ``KeyError``, ``weir.errors.SinkError``,
    ``jobs.lookup.BadRecord``."""
    module = cls.__module__
    if module in ("builtins", "__main__") or not module:
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"


def user_frames(tb: Any, limit: int = 6) -> list[str]:
    """The frames of a traceback from the first one outside weir (the user's function
    and what it called; all of them if every frame is weir's), the innermost ``limit``,
    as indented lines."""
    frames = traceback.extract_tb(tb) if tb is not None else []
    first = next((i for i, f in enumerate(frames) if not _is_weir(f.filename)), 0)
    frames = frames[first:]
    out = []
    if len(frames) > limit:
        out.append(f"{_INDENT}... {len(frames) - limit} more frame(s)")
        frames = frames[-limit:]
    for frame in frames:
        out.append(f'{_INDENT}File "{frame.filename}", line {frame.lineno}, in {frame.name}')
        line = frame.line if frame.line is not None else linecache.getline(
            frame.filename, frame.lineno or 0).strip()
        if line:
            out.append(f"{_INDENT * 2}{line}")
    return out


def _is_weir(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_WEIR)


_REBUILT: dict[type[BaseException], type[BaseException]] = {}


def rebuild_exception(type_name: str, message: str, notes: Iterable[str] = ()) -> BaseException:
    """An exception raised in another process, known by its type's name (``KeyError``,
    ``ConfigurationError``, ``weir.errors.SinkError``, ``jobs.lookup.BadRecord``) and
    its message (its ``str()``), made again in this one to chain from: an instance of
    that type if it is built in, weir's, or of a module this process imported (nothing
    is imported), whose ``str()`` is ``message``; else a :class:`RemoteError`. ``notes``
    (e.g. the task's traceback) are added with ``add_note``: Python prints them below
    it."""
    cls = _exception_class(type_name)
    exc: BaseException | None = None
    if cls is not None:
        try:
            rebuilt = _REBUILT.get(cls)
            if rebuilt is None:
                rebuilt = _REBUILT[cls] = type(cls.__name__, (cls,), {
                    "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                    "__doc__": cls.__doc__, "__str__": _remote_str,
                    "__reduce__": _remote_reduce})
            exc = rebuilt.__new__(rebuilt, message)
            exc.args = (message,)
            exc._weir_remote = (type_name, message)  # type: ignore[attr-defined]
        except Exception:  # a type that cannot be subclassed or made so
            exc = None
    if exc is None:
        exc = RemoteError(type_name, message)
    for note in notes:
        exc.add_note(note)
    return exc


def _remote_str(self: BaseException) -> str:
    return str(self._weir_remote[1])  # type: ignore[attr-defined]


def _remote_reduce(self: BaseException) -> Any:
    return (rebuild_exception, (*self._weir_remote, getattr(self, "__notes__", ())))  # type: ignore[attr-defined]


def _exception_class(name: str) -> type[BaseException] | None:
    """The exception type named ``name``: built in, weir's, or of an imported module."""
    parts = name.split(".")
    candidates: list[Any] = []
    if len(parts) == 1 or parts[0] == "builtins":
        candidates += [getattr(builtins, parts[-1], None), globals().get(parts[-1])]
    else:
        for split in range(len(parts) - 1, 0, -1):  # module.Class, module.Outer.Inner
            owner: Any = sys.modules.get(".".join(parts[:split]))
            if owner is not None:
                for part in parts[split:]:
                    owner = getattr(owner, part, None)
                candidates.append(owner)
                break
    for cls in candidates:
        if isinstance(cls, type) and issubclass(cls, BaseException):
            return cls
    return None
