"""Job graphs for the continuous runtime's tests: the keyed shape most of them run."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weir.api.connectors import Sink, Source
from weir.api.watermarks import WatermarkStrategy
from weir.connectors.stream import FileSink
from weir.runtime.continuous.graph import JobGraph
from weir.runtime.continuous.master import LocalJob
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


class Running:
    """A LocalJob run in a background thread, for tests that act on it while it runs
    (kill a task, wait for checkpoints); the error it ended with, if any, in ``errors``."""

    def __init__(self, job: LocalJob, timeout_s: float = 120) -> None:
        self.job = job
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(timeout_s,))
        self.thread.start()

    def _run(self, timeout_s: float) -> None:
        try:
            self.job.run(timeout_s=timeout_s)
        except BaseException as exc:
            self.errors.append(exc)

    def until(self, ready: Callable[[], Any], timeout_s: float = 60, poll_s: float = 0.01
              ) -> None:
        """Wait until ``ready()``, failing if the job ended first or it takes too long."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert time.monotonic() < deadline and self.thread.is_alive(), self.errors
            time.sleep(poll_s)

    def kill(self, task: tuple[str, int]) -> None:
        """SIGKILL the process of ``task``."""
        os.kill(self.job._procs[task].pid, signal.SIGKILL)

    def join(self, timeout_s: float = 120) -> list[BaseException]:
        """Wait for the job's end; the errors it ended with."""
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the job did not end"
        return self.errors
