"""The Spark job of ``make demo``: card fraud detection as a weir stage.

::

    parquet files ──readStream (maxFilesPerTrigger)──┐
                                                     ├─ weir.spark.process(CardFraudDetector,
    JSON rule files ──readStream (broadcast)─────────┘    key_by card_id, RocksDB, event time)
                                                          └─ writeStream "weir-sqlite" (2PC)

Run as its own process (``python -m weir.examples.fraud_job --work DIR``) so that the
demo can kill it with SIGKILL and start it again: a restart with the same Spark
checkpoint (``DIR/spark-checkpoint``) and the same weir checkpoint location
(``DIR/weir-state``) resumes from the last batch Spark committed. The query runs with
``trigger(availableNow=True)``: it processes every file present when it starts, then
stops. Progress goes to stdout as JSON lines (one per finished micro-batch) for the
demo to show; Spark's own logging goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from weir.examples.fraud import (
    ALERT_SCHEMA,
    CATEGORY_LIMITS,
    CardFraudDetector,
)

EVENT_SCHEMA = (
    "card_id string, txn_id string, ts timestamp, amount double, merchant string, "
    "category string"
)
RULE_SCHEMA = "category string, `limit` double, effective_from long"
UID = "fraud-detector"
TABLE = "alerts"
PARALLELISM = 2
WATERMARK_DELAY_MS = 30_000  # more than the stream's out-of-orderness (20 s): nothing is late
WATERMARK_DELAY = f"{WATERMARK_DELAY_MS // 1000} seconds"


class Paths:
    """Where everything of one demo lives, under its work directory."""

    def __init__(self, work: str | Path) -> None:
        self.work = Path(work).resolve()
        self.events = self.work / "events"
        self.rules = self.work / "rules"
        self.weir_state = self.work / "weir-state"
        self.spark_checkpoint = self.work / "spark-checkpoint"
        self.sink = self.work / "alerts.db"
        self.spark_local = self.work / "spark-local"


def emit(doc: dict[str, Any]) -> None:
    """One progress line for the demo."""
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def batch_report(progress: Any, events_dir: str) -> dict[str, Any]:
    """What the demo shows of one finished micro-batch (from ``lastProgress``)."""
    p = json.loads(progress.json) if hasattr(progress, "json") else dict(progress)
    events = sum(  # rows of the transactions' file source (not the rules', not heartbeats)
        int(s.get("numInputRows") or 0) for s in p.get("sources", [])
        if str(s.get("description", "")).rstrip("]").endswith("/" + events_dir)
    )
    durations = p.get("durationMs") or {}
    return {
        "event": "batch", "batch": int(p["batchId"]), "events": events,
        "rows": int(p.get("numInputRows") or 0),
        "trigger_ms": int(durations.get("triggerExecution") or 0),
        "add_batch_ms": int(durations.get("addBatch") or 0),
    }


def build_query(spark: Any, paths: Paths, files_per_trigger: int) -> Any:
    """Start the streaming query (sources, weir stage, sink)."""
    import weir.spark
    from weir.connectors import register_sinks

    register_sinks(spark)
    events = (
        spark.readStream.schema(EVENT_SCHEMA)
        .option("maxFilesPerTrigger", files_per_trigger)
        .parquet(str(paths.events))
    )
    rules = spark.readStream.schema(RULE_SCHEMA).json(str(paths.rules))
    alerts = weir.spark.process(
        events,
        key_by="card_id",
        function=CardFraudDetector(),
        output_schema=ALERT_SCHEMA,
        uid=UID,
        config=weir.JobConfig(paths.weir_state.as_uri(), max_parallelism=128,
                              state_backend=weir.RocksDBStateBackend()),
        parallelism=PARALLELISM,
        broadcast=weir.spark.Broadcast(rules, (CATEGORY_LIMITS,)),
        event_time=weir.spark.EventTime("ts", watermark_delay=WATERMARK_DELAY),
    )
    return (
        alerts.writeStream.format("weir-sqlite")
        .option("path", str(paths.sink))
        .option("table", TABLE)
        .option("checkpointLocation", str(paths.spark_checkpoint))
        .queryName("card-fraud")
        .trigger(availableNow=True)
        .start()
    )


def run(paths: Paths, files_per_trigger: int) -> int:
    """Run the query until every present file is processed; 0 on success."""
    import weir.spark

    started = time.perf_counter()
    spark = weir.spark.session(
        "local[*]", "weir-fraud-demo",
        **{
            "spark.sql.shuffle.partitions": str(PARALLELISM),
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "1g",
            # small data on 2 shared cores: the JVM starts faster and leaves more CPU
            # to the Python workers with the C1 JIT only and the serial collector
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
            "spark.sql.session.timeZone": "UTC",
            # availableNow with the stage's heartbeat (a rate source, which cannot
            # stop by itself): without the wrapper Spark would run one single batch
            "spark.sql.streaming.triggerAvailableNowWrapper.enabled": "true",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    query = build_query(spark, paths, files_per_trigger)
    emit({"event": "started", "query": str(query.id), "run": str(query.runId),
          "startup_s": round(time.perf_counter() - started, 2)})
    reported = -1
    events_dir = paths.events.name

    def report() -> None:
        nonlocal reported
        last = query.lastProgress
        if last is None or int(last["batchId"] if isinstance(last, dict) else last.batchId
                               ) <= reported:
            return
        for progress in query.recentProgress:
            line = batch_report(progress, events_dir)
            if line["batch"] > reported:
                reported = line["batch"]
                emit(line)

    while not query.awaitTermination(0.2):
        report()
    report()
    batch = weir.spark.finish(query)
    emit({"event": "finished", "last_batch": batch,
          "seconds": round(time.perf_counter() - started, 2)})
    spark.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m weir.examples.fraud_job --work DIR [--files-per-trigger N]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="the demo's work directory")
    parser.add_argument("--files-per-trigger", type=int, default=4)
    args = parser.parse_args(argv)
    try:
        return run(Paths(args.work), args.files_per_trigger)
    except Exception as exc:  # the demo shows this line; the traceback goes to stderr
        import traceback

        traceback.print_exc()
        emit({"event": "failed", "error": f"{type(exc).__name__}: {str(exc)[:2000]}"})
        return 1


if __name__ == "__main__":
    sys.exit(main())
