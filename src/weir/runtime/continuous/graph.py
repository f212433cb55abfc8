"""What a continuous job runs: its pipeline, shipped to every task process.

This step runs one shape — a source, keyed by a key selector (a hash edge by key
group) into a keyed process function chained with a sink — which is the shape of the
issue's example job; the stream API builds it. Each vertex has ``parallelism``
subtasks; a task is ``(vertex uid, subtask)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from weir.api.connectors import Sink, Source
from weir.api.functions import KeyedProcessFunction
from weir.api.watermarks import WatermarkStrategy
from weir.errors import ConfigurationError
from weir.runtime.continuous.channels import DEFAULT_CONFIG, ChannelConfig
from weir.state.keygroups import check_parallelism

__all__ = ["PipelineSpec", "chain"]


def chain(steps: tuple[tuple[str, Callable[[Any], Any]], ...]
          ) -> Callable[[Any], list[Any]]:
    """One function applying stateless ``steps`` to a record: its outputs."""
    if not steps:
        return lambda record: [record]

    def run(record: Any) -> list[Any]:
        records = [record]
        for kind, fn in steps:
            if kind == "map":
                records = [fn(r) for r in records]
            elif kind == "filter":
                records = [r for r in records if fn(r)]
            else:
                records = [o for r in records for o in fn(r)]
        return records

    return run


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """Source → key_by → keyed process function → sink (see the module doc)."""

    job: str
    source: Source[Any]
    source_uid: str
    source_parallelism: int
    key_selector: Callable[[Any], Any]
    function: KeyedProcessFunction[Any, Any]
    function_uid: str
    parallelism: int
    sink: Sink[Any]
    sink_uid: str
    checkpoint_storage: str
    max_parallelism: int = 128
    state_backend: str = "hashmap"
    channel: ChannelConfig = DEFAULT_CONFIG
    #: records a source reads per poll between control checks
    source_batch: int = 256
    #: stateless steps chained after the source, before key_by: ("map"|"filter"|
    #: "flat_map", function)
    before_key_by: tuple[tuple[str, Callable[[Any], Any]], ...] = ()
    #: stateless steps chained after the keyed function, before the sink
    after_process: tuple[tuple[str, Callable[[Any], Any]], ...] = ()
    #: barrier tracking instead of alignment (set from the job's CheckpointConfig)
    at_least_once: bool = False
    #: a task whose main loop is silent this long is taken as hung (Flink's
    #: heartbeat.timeout: 50 s)
    heartbeat_timeout_s: float = 50.0
    #: event time: records travel as (timestamp, record) and sources send watermarks
    watermarks: WatermarkStrategy | None = None

    def __post_init__(self) -> None:
        uids = [self.source_uid, self.function_uid, self.sink_uid]
        if len(set(uids)) != 3:
            raise ConfigurationError(f"operator uids must differ, got {uids}")
        check_parallelism(self.parallelism, self.max_parallelism)
        if self.source_parallelism < 1:
            raise ConfigurationError(f"source parallelism must be >= 1, got "
                                     f"{self.source_parallelism}")

    def tasks(self) -> list[tuple[str, int]]:
        """Every task of the job."""
        return ([(self.source_uid, i) for i in range(self.source_parallelism)]
                + [(self.function_uid, i) for i in range(self.parallelism)])
