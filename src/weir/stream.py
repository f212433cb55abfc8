"""The continuous runtime: records flow through tasks in separate OS processes,
checkpoint barriers flow with them (Flink's asynchronous barrier snapshots), and a
failure restarts every task from the latest completed checkpoint.

.. code-block:: python

    from weir.stream import StreamEnvironment, CheckpointConfig, RestartStrategy
    from weir.connectors import SequenceSource, FileSink

    env = StreamEnvironment(parallelism=2, state_backend="rocksdb",
                            checkpoint_storage="/data/ckpt",
                            checkpointing=CheckpointConfig(interval_ms=1000),
                            restart_strategy=RestartStrategy.exponential_delay())
    (env.from_source(SequenceSource(1_000_000), uid="numbers")
        .key_by(lambda n: n % 100)
        .process(RunningCount(), uid="count")
        .sink_to(FileSink("/data/out"), uid="sink"))
    result = env.execute("count")        # bounded sources: returns at their end

This release runs one shape of job — a source, stateless ``map`` / ``filter`` /
``flat_map`` steps (chained into the source's tasks), ``key_by(...).process(...)`` with a
:class:`~weir.KeyedProcessFunction` (every state type, TTL, processing-time timers; the
same operator core and checkpoint format as the harness and the Spark runtime; event
time and its timers with a :class:`WatermarkStrategy` on the source),
stateless steps again, and a two-phase-commit sink — exactly-once with aligned
checkpoints, on this machine. Other shapes raise a clear error.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from weir.api.checkpointing import CheckpointConfig, CheckpointingMode
from weir.api.connectors import Sink, Source
from weir.api.functions import KeyedProcessFunction
from weir.api.restart import RestartStrategy
from weir.api.watermarks import WatermarkStrategy
from weir.errors import ConfigurationError
from weir.runtime.continuous.channels import ChannelConfig
from weir.runtime.continuous.graph import PipelineSpec
from weir.runtime.continuous.master import JobResult, LocalJob

__all__ = [
    "ChannelConfig", "CheckpointConfig", "CheckpointingMode", "DataStream", "JobResult",
    "KeyedStream", "RestartStrategy", "StreamEnvironment", "WatermarkStrategy",
]

_SHAPE = ("the continuous runtime runs source -> [map/filter/flat_map] -> key_by -> "
          "process -> [map/filter/flat_map] -> sink_to for now")


class StreamEnvironment:
    """Where a continuous job is declared and run (Flink's
    ``StreamExecutionEnvironment``). ``checkpointing`` defaults to Flink's (off: then
    only the final checkpoint of a bounded job commits the sinks); the restart
    strategy to Flink's default (exponential delay when checkpointing is on, no
    restart otherwise)."""

    def __init__(self, *, checkpoint_storage: str | Path, parallelism: int = 1,
                 max_parallelism: int = 128, state_backend: str = "hashmap",
                 checkpointing: CheckpointConfig | None = None,
                 restart_strategy: RestartStrategy | None = None,
                 channels: ChannelConfig | None = None) -> None:
        self.checkpoint_storage = str(checkpoint_storage)
        self.parallelism, self.max_parallelism = parallelism, max_parallelism
        self.state_backend = state_backend
        self.checkpointing = checkpointing or CheckpointConfig()
        if restart_strategy is None:
            restart_strategy = (RestartStrategy.exponential_delay()
                                if self.checkpointing.interval_ms is not None
                                else RestartStrategy.no_restart())
        self.restart_strategy = restart_strategy
        self.channels = channels or ChannelConfig()
        self._source: tuple[Source[Any], str, int] | None = None
        self._before: list[tuple[str, Callable[[Any], Any]]] = []
        self._key_by: Callable[[Any], Any] | None = None
        self._process: tuple[KeyedProcessFunction[Any, Any], str, int] | None = None
        self._after: list[tuple[str, Callable[[Any], Any]]] = []
        self._sink: tuple[Sink[Any], str] | None = None
        self._watermarks: WatermarkStrategy | None = None

    def from_source(self, source: Source[Any], *, uid: str, parallelism: int | None = None,
                    watermarks: WatermarkStrategy | None = None) -> DataStream:
        """A stream of ``source``'s records; ``uid`` names its state (positions).
        ``watermarks`` gives records their event time (``ctx.timestamp``) and drives
        event-time timers."""
        if self._source is not None:
            raise ConfigurationError(f"a second source {uid!r}: {_SHAPE}")
        if not isinstance(source, Source):
            raise ConfigurationError(f"from_source needs a weir.api.connectors.Source, got "
                                     f"{type(source).__name__}")
        if watermarks is not None and not isinstance(watermarks, WatermarkStrategy):
            raise ConfigurationError(f"watermarks must be a WatermarkStrategy, got "
                                     f"{type(watermarks).__name__}")
        self._source = (source, uid, parallelism or self.parallelism)
        self._watermarks = watermarks
        return DataStream(self, keyed=False)

    def execute(self, job_name: str = "job", *,
                timeout: float | datetime.timedelta = 3600.0,
                restore_from: str | Path | None = None,
                allow_non_restored_state: bool = False) -> JobResult:
        """Run the job until its bounded sources end (restarting after failures as the
        restart strategy allows); what it did. Raises
        :class:`~weir.errors.JobFailedError` when it gives up.

        The job continues from the latest completed checkpoint in its checkpoint
        storage; with none there, from ``restore_from`` — a savepoint or checkpoint
        written by any runtime (the harness, Spark, this one, ``weir.write_savepoint``)
        at any parallelism, matched to the operators by uid; state of an operator the
        job does not have is an error unless ``allow_non_restored_state``."""
        if self._source is None or self._process is None or self._sink is None:
            raise ConfigurationError(f"the job is incomplete: {_SHAPE}")
        assert self._key_by is not None
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        source, source_uid, source_parallelism = self._source
        function, function_uid, parallelism = self._process
        sink, sink_uid = self._sink
        spec = PipelineSpec(
            job=f"{job_name}-{uuid.uuid4().hex[:8]}", source=source, source_uid=source_uid,
            source_parallelism=source_parallelism, key_selector=self._key_by,
            function=function, function_uid=function_uid, parallelism=parallelism,
            sink=sink, sink_uid=sink_uid, checkpoint_storage=self.checkpoint_storage,
            max_parallelism=self.max_parallelism, state_backend=self.state_backend,
            channel=self.channels, before_key_by=tuple(self._before),
            after_process=tuple(self._after), watermarks=self._watermarks)
        return LocalJob(spec, self.checkpointing, restart=self.restart_strategy,
                        restore_from=restore_from,
                        allow_non_restored_state=allow_non_restored_state).run(
            timeout_s=seconds)


class DataStream:
    """A stream of records (Flink's ``DataStream``)."""

    def __init__(self, env: StreamEnvironment, *, keyed: bool) -> None:
        self._env, self._after_process = env, keyed

    def _step(self, kind: str, fn: Callable[[Any], Any]) -> DataStream:
        if not callable(fn):
            raise ConfigurationError(f"{kind} needs a function, got {fn!r}")
        if self._env._sink is not None:
            raise ConfigurationError(f"{kind} after sink_to: {_SHAPE}")
        (self._env._after if self._after_process else self._env._before).append((kind, fn))
        return self

    def map(self, fn: Callable[[Any], Any]) -> DataStream:
        """Each record replaced by ``fn(record)``."""
        return self._step("map", fn)

    def filter(self, fn: Callable[[Any], bool]) -> DataStream:
        """The records for which ``fn`` is true."""
        return self._step("filter", fn)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> DataStream:
        """Every record ``fn`` yields for each record."""
        return self._step("flat_map", fn)

    def key_by(self, key_selector: Callable[[Any], Any]) -> KeyedStream:
        """The stream partitioned by key (by key group, as on every runtime)."""
        if self._after_process or self._env._key_by is not None:
            raise ConfigurationError(f"a second key_by: {_SHAPE}")
        if not callable(key_selector):
            raise ConfigurationError(f"key_by needs a function, got {key_selector!r}")
        self._env._key_by = key_selector
        return KeyedStream(self._env)

    def sink_to(self, sink: Sink[Any], *, uid: str) -> None:
        """Write the stream to a two-phase-commit ``sink``; ``uid`` names its state."""
        if not self._after_process:
            raise ConfigurationError(f"sink_to before key_by(...).process(...): {_SHAPE}")
        if not isinstance(sink, Sink):
            raise ConfigurationError(f"sink_to needs a weir.api.connectors.Sink, got "
                                     f"{type(sink).__name__}")
        if self._env._sink is not None:
            raise ConfigurationError(f"a second sink {uid!r}: {_SHAPE}")
        self._env._sink = (sink, uid)


class KeyedStream:
    """A stream partitioned by key (Flink's ``KeyedStream``)."""

    def __init__(self, env: StreamEnvironment) -> None:
        self._env = env

    def process(self, function: KeyedProcessFunction[Any, Any], *, uid: str,
                parallelism: int | None = None) -> DataStream:
        """Run ``function`` per key, with keyed state and timers; ``uid`` names its
        state in checkpoints and savepoints."""
        if not isinstance(function, KeyedProcessFunction):
            raise ConfigurationError(f"process needs a KeyedProcessFunction, got "
                                     f"{type(function).__name__}")
        self._env._process = (function, uid, parallelism or self._env.parallelism)
        return DataStream(self._env, keyed=True)
