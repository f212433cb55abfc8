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
    ├── RestartsExhaustedError      a supervised query failed and its restart strategy gives up
    ├── ChannelError                a continuous-runtime channel failed: peer gone, bad secret,
    │                               malformed frame
    └── JobFailedError              a continuous job failed: a task failed or disappeared

Messages say what happened, where (state name, operator uid, subtask, key group) and
what to do about it. Lower-level errors are chained with ``raise ... from exc``.
"""

from __future__ import annotations

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
    "RestartsExhaustedError",
    "ChannelError",
    "JobFailedError",
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
    """A supervised streaming query (:func:`weir.spark.supervise`) failed once more than
    its restart strategy allows; chained from the query's last error."""


class ChannelError(WeirError):
    """A channel of the continuous runtime failed: the peer closed it or is not weir, or
    it did not prove the job's shared secret."""


class JobFailedError(WeirError):
    """A continuous job failed: one of its tasks failed or disappeared, or its
    checkpoints failed more often than tolerated."""


class QueryError(WeirError):
    """A live state query of a continuous job could not be answered: no such operator or
    queryable state, the job is restarting or has ended, the value does not encode, or
    the client did not prove the job's query secret."""
