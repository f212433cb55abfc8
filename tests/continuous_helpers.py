"""Job graphs for the continuous runtime's tests: the keyed shape most of them run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weir.api.connectors import Sink, Source
from weir.api.watermarks import WatermarkStrategy
from weir.connectors.stream import FileSink
from weir.runtime.continuous.graph import JobGraph
from weir.stream import StreamEnvironment


def keyed_graph(tmp_path: Path, *, source: Source[Any], function: Any,
                key_selector: Callable[[Any], Any], backend: str = "hashmap",
                sink: Sink[Any] | None = None, parallelism: int = 2,
                max_parallelism: int = 32, source_uid: str = "numbers",
                function_uid: str = "count", watermarks: WatermarkStrategy | None = None,
                job: str = "job", **fields: Any) -> JobGraph:
    """source -> key_by -> process -> sink (FileSink in tmp_path/out), checkpoints in
    tmp_path/chk; ``fields`` replace JobGraph settings (heartbeat_timeout_s, channel)."""
    env = StreamEnvironment(parallelism=parallelism, max_parallelism=max_parallelism,
                            state_backend=backend, checkpoint_storage=tmp_path / "chk")
    (env.from_source(source, uid=source_uid, watermarks=watermarks)
        .key_by(key_selector)
        .process(function, uid=function_uid)
        .sink_to(sink if sink is not None else FileSink(tmp_path / "out"), uid="sink"))
    graph = env.job_graph(job)
    return dataclasses.replace(graph, **fields) if fields else graph
