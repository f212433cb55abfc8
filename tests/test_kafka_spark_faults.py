"""``weir-kafka`` in and out on Spark (the micro-batch runtime) with kill -9 in the
window that matters: a batch is running, one of its two write tasks has committed its
Kafka transaction and the other has not (a pause in the weir stage holds it; the test
waits until the committed output is no longer a whole number of batches).

* the **driver** (its Python process, JVM and workers) is killed and the query started
  again from its checkpoint: Spark replays the batch with the same id and offsets, the
  committed task's marker makes its partition skip, the other one writes;
* a **Python worker** (the paused task's) is killed: Spark retries the task
  (``local[2,4]``: four attempts) and the query ends by itself;
* the **broker** is restarted (SIGTERM, see kafka_support) and the paused task let go:
  it reads, writes and commits through the new broker process.

``make soak`` runs all three (each starts its own Spark driver, the driver kill two:
a minute or more on 2 shared cores). ``make test`` runs their short versions: the
replay of a half-committed batch in-process (test_kafka_spark), a task killed with
SIGKILL on the Spark runner (test_kafka_failover) and the micro-batch runtime's driver
and executor kills with files (test_spark_cluster_faults).

The oracle is test_kafka_continuous's on the ``read_committed`` output: every number's
count exactly once (L, D) and each key's counts 1..k (M)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kafka_support import Broker, create_topic, produce
from test_kafka_continuous import ldm  # type: ignore[import-not-found]
from weir.connectors.kafka import read_kafka

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = Path(__file__).parent / "spark_jobs" / "kafka_job.py"
N, BATCH, PAUSE_AT = 3_000, 1_000, 1_500


def start(bootstrap: str, source: str, sink: str, work: Path, *extra: str
          ) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(JOB), bootstrap, source, sink, str(work),
                             "--master", "local[2,4]", *extra], start_new_session=True)


def wait(what: str, done: object, driver: subprocess.Popen[bytes], timeout: float = 180
         ) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert driver.poll() is None, f"the driver ended before {what}: {driver.returncode}"
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(
        f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]


@pytest.mark.skipif(not os.environ.get("WEIR_SOAK"), reason="make soak")
@pytest.mark.parametrize("victim", ["driver", "python_worker", "broker"])
def test_kill_9_while_half_a_batch_is_committed_keeps_kafka_output_exactly_once(
    tmp_path: Path, request: pytest.FixtureRequest, victim: str
) -> None:
    kafka: Broker = request.getfixturevalue("own_kafka" if victim == "broker" else "kafka")
    source, sink = create_topic(kafka.bootstrap, 4), create_topic(kafka.bootstrap, 3)
    produce(kafka.bootstrap, source, N)
    first = start(kafka.bootstrap, source, sink, tmp_path, "--pause", str(PAUSE_AT))
    kills = 0
    try:
        paused = tmp_path / "paused"
        wait("a paused task", lambda: paused.exists() and paused.read_text(), first)
        wait("half a batch committed",
             lambda: len(read_kafka(kafka.bootstrap, sink)) % BATCH != 0, first)
        committed = len(read_kafka(kafka.bootstrap, sink))
        worker = int(paused.read_text())
        if victim == "driver":
            assert first.poll() is None
            os.killpg(first.pid, signal.SIGKILL)
            assert first.wait(30) == -signal.SIGKILL
            kills += 1
            second = start(kafka.bootstrap, source, sink, tmp_path)
            assert second.wait(300) == 0
        elif victim == "broker":
            kafka.restart(signal.SIGTERM)
            kills += 1
            (tmp_path / "go").touch()
            assert first.wait(300) == 0
        else:
            assert alive(worker)
            os.kill(worker, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while alive(worker):
                assert time.monotonic() < deadline, f"worker {worker} still alive"
                time.sleep(0.05)
            kills += 1
            (tmp_path / "go").touch()
            assert first.wait(300) == 0
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    counts = ldm(kafka.bootstrap, sink, N)
    print(f"L={counts[0]} D={counts[1]} M={counts[2]} | {victim} faults injected={kills} "
          f"with {committed} of {N} outputs committed ({committed % BATCH} of a batch)")
    assert kills == 1 and committed % BATCH > 0
    assert counts == (0, 0, 0)
