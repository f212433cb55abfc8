"""weir: Apache Flink's state management and fault tolerance, in Python, on Spark.

Everything a user needs is importable from here (and, for the Spark runtime, from
``weir.spark``; harnesses for tests from ``weir.testing``). Other modules are
internal and may change.
"""

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
from weir.api.restart import RestartStrategy
from weir.api.serializers import (
    BytesSerializer,
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
from weir.runtime.checkpointer import SnapshotMode, SubtaskCheckpointer
from weir.runtime.continuous.queries import QueryableStateClient
from weir.runtime.drivers import take_checkpoint, take_savepoint
from weir.runtime.operator import OperatorConfig, StateBackendKind
from weir.state.keygroups import KeyGroupRange
from weir.state.rocksdb import RocksDBMemory
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
    "SubtaskCheckpointer",
    "SnapshotMode",
    "CompletedCheckpoint",
    "CheckpointStorage",
    "CheckpointKind",
    "CheckpointCoordinator",
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "BroadcastContext",
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
    "KeyedBroadcastProcessFunction",
    "KeyedContext",
    "KeyedProcessFunction",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "MsgpackSerializer",
    "NoKeyContextError",
    "OperatorConfig",
    "RocksDBMemory",
    "OperatorStateStore",
    "OperatorSubtaskSnapshot",
    "PickleSerializer",
    "ProcessFunction",
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
    "StateBackendKind",
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
