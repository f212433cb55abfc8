"""weir: Apache Flink's state management and fault tolerance, in Python, on Spark.

Everything a user needs is importable from here (and, for the Spark runtime, from
``weir.spark``; harnesses for tests from ``weir.testing``). Other modules are
internal and may change.
"""

from weir.api.avro_serializer import AvroSerializer
from weir.api.batch import (
    BatchAppendingState,
    BatchListState,
    BatchMapState,
    BatchValueState,
    KeyedBatchContext,
    KeyedBatchFunction,
    KeyedBroadcastBatchFunction,
)
from weir.api.checkpointing import CheckpointConfig, CheckpointingMode, SnapshotStrategy
from weir.api.config import (
    HashMapStateBackend,
    JobConfig,
    LateRecords,
    RocksDBStateBackend,
)
from weir.api.context import (
    BroadcastContext,
    Context,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedContext,
    OperatorStateStore,
    TimeDomain,
    TimerService,
)
from weir.api.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
    ValueStateDescriptor,
)
from weir.api.functions import (
    CheckpointedFunction,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    ProcessFunction,
)
from weir.api.record_serializer import RecordSerializer
from weir.api.restart import RestartStrategy
from weir.api.serializers import (
    BytesSerializer,
    Compatibility,
    FloatSerializer,
    IntSerializer,
    MsgpackSerializer,
    PickleSerializer,
    Serializer,
    StrSerializer,
)
from weir.api.state import (
    AggregatingState,
    BroadcastState,
    ListState,
    MapState,
    ReadOnlyBroadcastState,
    ReducingState,
    State,
    ValueState,
)
from weir.api.ttl import (
    IncrementalCleanup,
    RocksDBCompactFilterCleanup,
    StateTtlConfig,
    StateVisibility,
    UpdateType,
)
from weir.checkpoint import (
    CheckpointCoordinator,
    CheckpointKind,
    CheckpointStorage,
    CompletedCheckpoint,
    load_checkpoint,
)
from weir.checkpoint.stats import CheckpointStats, CheckpointStatus, SubtaskCheckpointStats
from weir.connectors.dead_letters import read_dead_letters
from weir.errors import (
    CheckpointError,
    CheckpointFormatError,
    ConfigurationError,
    CorruptCheckpointError,
    KeyGroupError,
    NoCheckpointError,
    NoKeyContextError,
    OutputSchemaError,
    QueryError,
    ReadOnlyStateError,
    RestartsExhaustedError,
    RestoreError,
    SinkError,
    SinkLineageError,
    SourceError,
    StateBackendError,
    StateError,
    StateMigrationError,
    StateRegistrationError,
    StateSerializationError,
    TaskPlacementError,
    UserFunctionError,
    WeirError,
)
from weir.processor.lookup import query_state
from weir.processor.reader import StateInfo, StateReader, StateScope, read_state
from weir.processor.writer import write_savepoint
from weir.runtime.continuous.queries import QueryableStateClient
from weir.runtime.drivers import take_checkpoint, take_savepoint
from weir.runtime.task_metrics import TaskMetrics
from weir.state.keygroups import KeyGroupRange
from weir.state.snapshot import OperatorSubtaskSnapshot, RedistributionMode

__version__ = "0.1.0"

__all__ = [
    "CheckpointConfig",
    "CheckpointingMode",
    "HashMapStateBackend",
    "JobConfig",
    "LateRecords",
    "RocksDBStateBackend",
    "SnapshotStrategy",
    "CheckpointStats",
    "CheckpointStatus",
    "SubtaskCheckpointStats",
    "TaskMetrics",
    "read_state",
    "read_dead_letters",
    "write_savepoint",
    "query_state",
    "QueryableStateClient",
    "QueryError",
    "StateInfo",
    "StateReader",
    "StateScope",
    "NoCheckpointError",
    "Compatibility",
    "CorruptCheckpointError",
    "CheckpointFormatError",
    "CheckpointError",
    "OutputSchemaError",
    "SinkError",
    "SinkLineageError",
    "SourceError",
    "TaskPlacementError",
    "UserFunctionError",
    "take_savepoint",
    "take_checkpoint",
    "load_checkpoint",
    "CompletedCheckpoint",
    "CheckpointStorage",
    "CheckpointKind",
    "CheckpointCoordinator",
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "AvroSerializer",
    "BroadcastContext",
    "BatchAppendingState",
    "BatchListState",
    "BatchMapState",
    "BatchValueState",
    "BroadcastState",
    "BytesSerializer",
    "CheckpointedFunction",
    "ConfigurationError",
    "Context",
    "FloatSerializer",
    "FunctionInitializationContext",
    "FunctionSnapshotContext",
    "IncrementalCleanup",
    "IntSerializer",
    "KeyGroupError",
    "KeyGroupRange",
    "KeyedBatchContext",
    "KeyedBatchFunction",
    "KeyedBroadcastBatchFunction",
    "KeyedBroadcastProcessFunction",
    "KeyedContext",
    "KeyedProcessFunction",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "MsgpackSerializer",
    "NoKeyContextError",
    "OperatorStateStore",
    "OperatorSubtaskSnapshot",
    "PickleSerializer",
    "ProcessFunction",
    "RecordSerializer",
    "ReadOnlyBroadcastState",
    "ReadOnlyStateError",
    "RedistributionMode",
    "ReducingState",
    "ReducingStateDescriptor",
    "RestartStrategy",
    "RestartsExhaustedError",
    "RestoreError",
    "RocksDBCompactFilterCleanup",
    "Serializer",
    "State",
    "StateBackendError",
    "StateDescriptor",
    "StateError",
    "StateKind",
    "StateMigrationError",
    "StateRegistrationError",
    "StateSerializationError",
    "StateTtlConfig",
    "StateVisibility",
    "StrSerializer",
    "TimeDomain",
    "TimerService",
    "UpdateType",
    "ValueState",
    "ValueStateDescriptor",
    "WeirError",
    "__version__",
]

#: names exported before issue 39 that are internal now (or replaced): still importable
#: for one release, with a DeprecationWarning naming the replacement
_MOVED = {
    "SnapshotMode": ("weir.runtime.checkpointer", "weir.SnapshotStrategy"),
    "SubtaskCheckpointer": ("weir.runtime.checkpointer",
                            "weir.testing's harnesses (an internal of the runtimes)"),
    "OperatorConfig": ("weir.runtime.operator",
                       "weir.testing's harnesses (an internal of the runtimes)"),
    "StateBackendKind": ("weir.runtime.operator",
                         "weir.HashMapStateBackend() / weir.RocksDBStateBackend()"),
    "RocksDBMemory": ("weir.state.rocksdb_options", "weir.RocksDBStateBackend(memory=...)"),
}


def __getattr__(name: str) -> object:
    moved = _MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module 'weir' has no attribute {name!r}")
    import importlib
    import warnings

    warnings.warn(f"weir.{name} is deprecated (not public): use {moved[1]}",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(moved[0]), name)
