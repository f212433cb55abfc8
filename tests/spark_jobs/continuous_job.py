"""The child driver of ``tests/test_continuous_spark_cluster.py``: a continuous job
whose tasks run as a barrier stage on a ``local-cluster`` (separate executor JVMs),
so that the test can kill an executor JVM, a Python worker or this driver.

::

    SequenceSource(N, RATE) (p = 1) ──key_by(n % 50)── Count (p = 3, BACKEND)
      └─ FileSink (two-phase commit)          checkpoints every 200 ms in DIR/chk

Run as ``python tests/spark_jobs/continuous_job.py --work DIR --master M --backend B
--n N --rate R``. A run started again with the same ``DIR`` continues from the latest
completed checkpoint in ``DIR/chk`` (the application restart after a lost driver).
``DIR/status.json`` holds the driver's pids and application id once the session is up,
and what the job did once it finished (``finished``, ``restarts``, ``failures``).

``Count`` (``tests/continuous_helpers.py``) travels by value in the job graph, so the
executors need no access to ``tests/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
from continuous_helpers import Count, by_value

KEYS = 50  # (Count's)


def write_status(path: Path, **fields: Any) -> None:
    """Merge ``fields`` into ``status.json`` (atomically: the test polls it)."""
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    doc.update(fields)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def run(work: Path, master: str, backend: str, n: int, rate: float) -> int:
    import pyspark

    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_DIRS"] = str(work / "spark-local")  # (executors' scratch)
    import weir.spark
    from weir.connectors import FileSink, SequenceSource
    from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

    started = time.monotonic()
    (work / "spark-local").mkdir(parents=True, exist_ok=True)
    jvm_opts = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    spark = weir.spark.session(master, "weir-continuous-cluster", **{
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
        "spark.driver.extraJavaOptions": jvm_opts,
        "spark.executor.extraJavaOptions": jvm_opts,
    })
    spark.sparkContext.setLogLevel("ERROR")
    status = work / "status.json"
    write_status(status, driver_pid=os.getpid(),
                 jvm_pid=int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()),
                 app_id=spark.sparkContext.applicationId,
                 startup_s=round(time.monotonic() - started, 1))
    env = StreamEnvironment(
        weir.JobConfig(
            work / "chk",
            parallelism=3,
            max_parallelism=32,
            state_backend=backend,
            checkpointing=CheckpointConfig(interval=200),
            restart_strategy=RestartStrategy.fixed_delay(attempts=5, delay="0 s"),
        )
    )
    (env.from_source(SequenceSource(n, rate), uid="numbers", parallelism=1)
        .key_by(lambda v: v % KEYS)
        .process(Count(), uid="count")
        .sink_to(FileSink(work / "out"), uid="sink"))
    by_value(sys.modules[__name__])  # Count travels in the job graph
    result = env.execute("on-cluster", runner="spark", spark=spark, timeout=600)
    write_status(status, finished=True, restarts=result.restarts, failures=result.failures,
                 completed=len(result.completed),
                 seconds=round(time.monotonic() - started, 1))
    spark.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--master", default="local-cluster[2,2,1024]")
    parser.add_argument("--backend", default="hashmap")
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    args = parser.parse_args(argv)
    return run(Path(args.work).resolve(), args.master, args.backend, args.n, args.rate)


if __name__ == "__main__":
    sys.exit(main())
