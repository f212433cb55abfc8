"""Kafka in and out across the failures the unit-level Kafka tests do not reach: the
continuous job's driver killed with SIGKILL and the job started again on the same
checkpoint storage (it takes the storage over and continues its state, as Flink's
JobManager failover does), and the same job on the continuous runtime's Spark runner
with a task killed with SIGKILL on its executor.
The oracle is test_kafka_continuous's: every number's count exactly once in the
``read_committed`` output (L, D) and each key's counts 1..k (M)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import test_kafka_continuous as kafka_jobs  # type: ignore[import-not-found]
from continuous_helpers import by_value
from kafka_support import Broker, create_topic, produce
from test_kafka_continuous import KILL_N, job, ldm  # type: ignore[import-not-found]
from weir import CheckpointCoordinator
from weir.connectors.kafka import read_kafka


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])
    by_value(kafka_jobs)  # (the job's functions are there)


def completed_checkpoints(chk: Path) -> int:
    try:
        return len(CheckpointCoordinator(chk, clean_up=False).completed_checkpoints)
    except OSError:
        return 0


def test_a_driver_killed_with_sigkill_is_started_again_and_the_output_stays_exactly_once(
    tmp_path: Path, kafka: Broker
) -> None:
    """The job's driver (in a process of its own) is killed with SIGKILL once two
    checkpoints completed and output is still to come; its tasks end by themselves, and
    the job started again on the same storage finishes the input exactly once."""
    n = KILL_N
    source, sink = create_topic(kafka.bootstrap, 4), create_topic(kafka.bootstrap, 3)
    produce(kafka.bootstrap, source, n)
    driver = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import test_kafka_continuous
        from continuous_helpers import TINY, by_value
        from test_kafka_continuous import SlowerCount, job
        by_value(test_kafka_continuous)
        job(Path({str(tmp_path)!r}), {kafka.bootstrap!r}, {source!r}, {sink!r},
            function=SlowerCount(), channels=TINY).execute("kafka", timeout="180 s")
    """)
    first = subprocess.Popen([sys.executable, "-c", driver], start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while completed_checkpoints(tmp_path / "chk") < 2:
            assert first.poll() is None, f"the driver ended first: {first.returncode}"
            assert time.monotonic() < deadline, "no two checkpoints in 90 s"
            time.sleep(0.05)
        committed = len(read_kafka(kafka.bootstrap, sink))
        os.kill(first.pid, signal.SIGKILL)  # (the driver alone: its tasks see it go)
        assert first.wait(30) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert committed < n  # (killed with output still to come)
    result = job(tmp_path, kafka.bootstrap, source, sink).execute("kafka", timeout="180 s")
    counts = ldm(kafka.bootstrap, sink, n)
    print(f"L={counts[0]} D={counts[1]} M={counts[2]} | driver kills injected=1 after "
          f"{committed} of {n} outputs, restarts of the second run={result.restarts}")
    assert result.completed and counts == (0, 0, 0)


@pytest.mark.spark
def test_on_the_spark_runner_a_task_killed_with_sigkill_keeps_kafka_output_exactly_once(
    spark: Any, tmp_path: Path, kafka: Broker
) -> None:
    """The same job's tasks as one barrier stage of the test run's SparkSession; its
    count task is killed with SIGKILL on its executor once two checkpoints completed
    with output still to come: the stage is resubmitted from the latest checkpoint."""
    from continuous_helpers import TINY
    from test_kafka_continuous import SlowerCount  # type: ignore[import-not-found]

    n = KILL_N
    source, sink = create_topic(kafka.bootstrap, 4), create_topic(kafka.bootstrap, 3)
    produce(kafka.bootstrap, source, n)
    client = job(tmp_path, kafka.bootstrap, source, sink, parallelism=1,
                 function=SlowerCount(), channels=TINY).execute_async(
        "kafka-on-spark", runner="spark", spark=spark, timeout="240 s")
    deadline = time.monotonic() + 120
    while len(client.checkpoints()) < 2 or not client.tasks():
        assert not client.done and time.monotonic() < deadline, "no two checkpoints"
        time.sleep(0.05)
    committed = len(read_kafka(kafka.bootstrap, sink))
    victim = next(t for t in client.tasks() if t.vertex == "count")
    os.kill(victim.pid, signal.SIGKILL)
    result = client.wait(240)
    counts = ldm(kafka.bootstrap, sink, n)
    print(f"L={counts[0]} D={counts[1]} M={counts[2]} | task kills injected=1 after "
          f"{committed} of {n} outputs, restarts={result.restarts}")
    assert committed < n and result.completed and result.restarts == 1
    assert counts == (0, 0, 0)
