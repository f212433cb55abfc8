"""The child driver of ``tests/test_kafka_spark_faults.py``: Kafka → a weir stage
(a running count per key, parallelism 2) → Kafka exactly-once, on Spark, in a process
of its own so that the test can SIGKILL it (or one of its Python workers) and start it
again with the same Spark checkpoint and weir checkpoint location.

::

    topic SOURCE (value: the number n; key: n % 50) ──readStream "weir-kafka"
      (maxOffsetsPerTrigger=1000)── weir.spark.process(Count, key_by=n % 50)
      └─ writeStream "weir-kafka" into topic SINK: "[key, n, count]" per number

``python tests/spark_jobs/kafka_job.py BOOTSTRAP SOURCE SINK WORK [--pause N]``: with
``--pause N`` the first task that meets a number >= N (and creates ``WORK/paused``
first, holding its Python worker's pid) waits until ``WORK/go`` exists (at most 120 s)
— its batch is then running, and the batch's other task free to commit its part,
while the test kills something. A replay finds the marker and does not pause again.
The query runs with ``trigger(availableNow=True)`` and ends when the input is read.
Run as ``__main__``, the classes are pickled by value into the plan."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import weir

COUNT = weir.ValueStateDescriptor[int]("count")
KEYS = 50


class Count(weir.KeyedProcessFunction[Any, tuple[Any, ...]]):
    """Count per key; emits (key, n, count); pauses once at ``pause`` (see above)."""

    def __init__(self, work: str, pause: int | None) -> None:
        self.work, self.pause = work, pause

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: Any, ctx: Any) -> Any:
        if self.pause is not None and value["n"] >= self.pause:
            self._pause_once()
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield (value["key"], value["n"], n)

    def _pause_once(self) -> None:
        marker = os.path.join(self.work, "paused")
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(self.work, "go")):
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)


def main(argv: list[str]) -> int:
    bootstrap, source, sink, work = argv[:4]
    pause = int(argv[argv.index("--pause") + 1]) if "--pause" in argv else None
    master = argv[argv.index("--master") + 1] if "--master" in argv else "local[2]"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    import weir.connectors.spark
    import weir.spark

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = (SparkSession.builder.master(master).appName("weir-kafka-faults")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    weir.connectors.spark.register_sinks(spark)
    raw = (spark.readStream.format("weir-kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", source).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", 1000).load())
    numbers = raw.selectExpr("CAST(CAST(value AS STRING) AS BIGINT) AS n").selectExpr(
        f"n % {KEYS} AS key", "n")
    counts = weir.spark.process(numbers, "key", Count(work, pause), "key long, n long, c long",
                                "count", weir.JobConfig(Path(work) / "weir", parallelism=2))
    query = (counts.selectExpr("format_string('[%d,%d,%d]', key, n, c) AS value")
             .writeStream.format("weir-kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("topic", sink).option("checkpointLocation", str(Path(work) / "spark"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    weir.spark.finish(query)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
