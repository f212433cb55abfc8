"""weir: Apache Flink's state management and fault tolerance, in Python, on Spark.

Everything a user needs is importable from here (and, for the Spark runtime, from
``weir.spark``; harnesses for tests from ``weir.testing``). Other modules are
internal and may change.
"""

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
from weir.errors import (
    ConfigurationError,
    KeyGroupError,
    NoKeyContextError,
    ReadOnlyStateError,
    RestoreError,
    StateBackendError,
    StateError,
    StateMigrationError,
    StateRegistrationError,
    StateSerializationError,
    WeirError,
)
from weir.runtime.operator import OperatorConfig, StateBackendKind
from weir.state.keygroups import KeyGroupRange
from weir.state.serializers import (
    BytesSerializer,
    FloatSerializer,
    IntSerializer,
    MsgpackSerializer,
    PickleSerializer,
    Serializer,
    StrSerializer,
)
from weir.state.snapshot import OperatorSubtaskSnapshot, RedistributionMode

__version__ = "0.1.0"

__all__ = [
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
    "OperatorStateStore",
    "OperatorSubtaskSnapshot",
    "PickleSerializer",
    "ProcessFunction",
    "ReadOnlyBroadcastState",
    "ReadOnlyStateError",
    "RedistributionMode",
    "ReducingState",
    "ReducingStateDescriptor",
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
