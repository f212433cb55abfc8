"""weir's Python daemon for Spark (``weir.spark.DAEMON``): workers are forked with what a
weir task imports loaded, from a daemon that runs one thread when it forks; where the
preload would leave threads running, PySpark's daemon runs unchanged."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from weir.runtime.spark import daemon


def _worker_facts(_: Any) -> Any:
    import os
    import sys

    module = sys.modules.get("weir.runtime.spark.daemon")
    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    yield (module is not None and module.preloaded, "pandas" in sys.modules,
           b"weir.runtime.spark.daemon" in parent)


@pytest.mark.spark
def test_a_sessions_python_workers_are_forked_with_weir_and_arrow_loaded(spark: Any) -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    facts = set(spark.sparkContext.parallelize(range(4), 2).mapPartitions(_worker_facts)
                .collect())
    assert facts == {(True, True, True)}


def _start(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "weir.runtime.spark.daemon"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env})


def _port_then_stop(proc: subprocess.Popen[bytes]) -> tuple[int, list[bytes], int, bytes]:
    """The port the daemon listens on, its command line and thread count once it
    listens, and what it wrote to stderr after it was told to exit (stdin closed)."""
    assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
    (port,) = struct.unpack("!i", proc.stdout.read(4))
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
    tasks = len(os.listdir(f"/proc/{proc.pid}/task"))
    proc.stdin.close()
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.returncode is not None and proc.returncode >= 0  # exited on its own
    return port, cmdline, tasks, proc.stderr.read()


def test_the_daemon_forks_from_one_thread_with_the_modules_loaded() -> None:
    port, cmdline, tasks, err = _port_then_stop(_start({"OMP_NUM_THREADS": "1"}))
    assert port > 0 and b"weir.runtime.spark.daemon" in cmdline
    assert tasks == 1, "the preloading daemon must fork from a single thread"
    assert b"without preloading" not in err


def test_a_preload_that_leaves_threads_running_falls_back_to_pysparks_daemon() -> None:
    """With two OpenBLAS threads per process (``spark.task.cpus`` = 2), numpy's import
    starts a thread: the daemon says so and becomes PySpark's daemon, which works."""
    port, cmdline, _, err = _port_then_stop(_start({"OMP_NUM_THREADS": "2"}))
    assert port > 0 and b"pyspark.daemon" in cmdline
    assert b"weir.runtime.spark.daemon" not in cmdline
    assert b"running PySpark's daemon without preloading" in err


def test_threads_counts_this_process() -> None:
    import threading

    before = daemon.threads()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert daemon.threads() == before + 1
    finally:
        stop.set()
        thread.join()


def test_threads_is_unknown_without_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where threads cannot be counted the daemon does not take that for one thread
    (it falls back to PySpark's daemon, as with threads running)."""
    def no_proc(path: str) -> list[str]:
        raise FileNotFoundError(path)

    monkeypatch.setattr(daemon.os, "listdir", no_proc)
    assert daemon.threads() is None
