"""The card-fraud job written once, run on any runtime: the same function
(:class:`~weir.examples.fraud.CardFraudDetector`), the same :class:`weir.JobConfig`, the
same SQLite table of alerts and the same dead letters (:func:`weir.read_dead_letters`),
on the micro-batch runtime (a Spark query), the continuous runtime (local processes) or
the continuous runtime hosted on Spark; verified against the plain-Python oracle.

Only what each runtime needs to be fed differs: a Spark query reads the input as
streaming DataFrames keyed by a column, a continuous job as file sources keyed by a
function; both read the same JSON-lines files (:func:`.fraud_continuous.write_files`).

``python -m weir.examples.fraud_anywhere --runtime micro-batch|continuous|continuous-spark
[--master local[5]] [--events N] [--cards C] [--seed S] --work DIR`` prints one JSON
line: what each check found (lost, duplicated, wrong) per runtime; exit 1 unless all
are zero.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import weir
from weir.examples.fraud import ALERT_SCHEMA, CATEGORY_LIMITS, CardFraudDetector
from weir.examples.fraud_continuous import card_of, event_time, write_files
from weir.examples.fraud_job import RULE_SCHEMA, WATERMARK_DELAY_MS
from weir.examples.fraud_stream import Expected, generate, oracle
from weir.examples.fraud_verify import Check, check_alerts, check_dead_letters

__all__ = ["CONFIG", "RUNTIMES", "detector", "run", "verify"]

UID = "fraud-detector"
EVENT_SCHEMA = ("card_id string, txn_id string, ts long, amount double, merchant string, "
                "category string")
RUNTIMES = ("micro-batch", "continuous", "continuous-spark")

#: the job's settings, the same on every runtime (each run gets its own storage)
CONFIG = weir.JobConfig(
    "checkpoints", parallelism=2, max_parallelism=128,
    state_backend=weir.RocksDBStateBackend(memory="64m"),
    checkpointing=weir.CheckpointConfig(interval="300 ms"),
    restart_strategy=weir.RestartStrategy.no_restart(),
)


def detector() -> CardFraudDetector:
    """The function, written once: limits are checked when the watermark passes a
    transaction, so rules and transactions may arrive in any order."""
    return CardFraudDetector(limits_at_watermark=True)


def _on_micro_batches(spark: Any, config: weir.JobConfig, events: Path, rules: Path,
                      db: Path, work: Path, total: int) -> None:
    import weir.connectors
    import weir.spark

    weir.connectors.register_sinks(spark)
    transactions = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 2).json(
        str(events))
    limits = spark.readStream.schema(RULE_SCHEMA).json(str(rules))
    alerts = weir.spark.process(
        transactions, "card_id", detector(), ALERT_SCHEMA, UID, config,
        event_time=weir.spark.EventTime("ts", watermark_delay=WATERMARK_DELAY_MS),
        broadcast=weir.spark.Broadcast(limits, (CATEGORY_LIMITS,)))
    query = (alerts.writeStream.format("weir-sqlite").option("path", str(db))
             .option("table", "alerts").option("checkpointLocation", str(work / "spark"))
             .trigger(processingTime="500 milliseconds").start())
    job = weir.spark.JobClient(query, config)
    try:
        deadline = time.monotonic() + 600
        while _rows_read(query, str(events)) < total:
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise TimeoutError("the query did not read its input in 600 s")
            time.sleep(0.2)
        # the end of input: one more batch at the final watermark fires every timer
        job.stop_with_savepoint(str(work / "savepoints"), drain=True)
    finally:
        query.stop()


def _rows_read(query: Any, path: str) -> int:
    return sum(source["numInputRows"] for progress in query.recentProgress
               for source in progress.sources if path in source["description"])


def _on_the_continuous_runtime(config: weir.JobConfig, events: Path, rules: Path, db: Path,
                               spark: Any = None) -> None:
    from weir.connectors import FileSource, SqliteSink
    from weir.stream import StreamEnvironment, WatermarkStrategy

    env = StreamEnvironment(config)
    limits = env.from_source(FileSource(rules), uid="rules", parallelism=1)
    (env.from_source(FileSource(events), uid="transactions",
                     watermarks=WatermarkStrategy.bounded_out_of_orderness(
                         WATERMARK_DELAY_MS, event_time))
        .key_by(card_of)
        .connect(limits.broadcast(CATEGORY_LIMITS))
        .process(detector(), uid=UID)
        .sink_to(SqliteSink(db, table="alerts"), uid="alerts"))
    if spark is None:
        env.execute("fraud", timeout="10 min")
    else:
        env.execute("fraud", timeout="10 min", runner="spark", spark=spark)


def run(runtime: str, work: Path, events: Path, rules: Path, total: int,
        spark: Any = None) -> weir.JobConfig:
    """Run the job on ``runtime`` (``spark``: the session of the micro-batch runtime and
    of the continuous runtime hosted on Spark) into ``work/alerts.db``; its config."""
    config = dataclasses.replace(CONFIG, storage=str(work / "checkpoints"))
    db = work / "alerts.db"
    if runtime == "micro-batch":
        _on_micro_batches(spark, config, events, rules, db, work, total)
    elif runtime == "continuous":
        _on_the_continuous_runtime(config, events, rules, db)
    elif runtime == "continuous-spark":
        _on_the_continuous_runtime(config, events, rules, db, spark)
    else:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    return config


def verify(config: weir.JobConfig, work: Path, expected: Expected) -> list[Check]:
    """The alerts in ``work/alerts.db`` and the dead letters in the job's storage
    against the oracle."""
    from weir.connectors import read_sqlite_sink

    alerts = check_alerts(read_sqlite_sink(str(work / "alerts.db"), "alerts"), expected)
    letters = weir.read_dead_letters(config.storage)
    missing = [d for d in letters
               if not set(d) >= {"uid", "subtask", "reason", "record", "where"}]
    dead = check_dead_letters(letters, expected)
    if missing:
        dead = dataclasses.replace(dead, wrong=dead.wrong + len(missing))
    return [alerts, dead]


def main(argv: Sequence[str] = ()) -> int:
    """Run one runtime's leg; one JSON line of its checks; 0 only if all are zero."""
    parser = argparse.ArgumentParser(prog="python -m weir.examples.fraud_anywhere")
    parser.add_argument("--runtime", choices=RUNTIMES, required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--master", default="local[5]",
                        help="Spark master (continuous-spark needs a slot per task: 5)")
    parser.add_argument("--events", type=int, default=6_000)
    parser.add_argument("--cards", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(list(argv))
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    stream = generate(args.events, args.cards, args.seed)
    events, rules = write_files(stream, work / "input", files=8)
    spark = None
    if args.runtime != "continuous":
        import weir.spark

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = weir.spark.session(args.master, "weir-fraud-anywhere",
                                   **{"spark.ui.showConsoleProgress": "false"})
    try:
        config = run(args.runtime, work, events, rules, len(stream.events), spark)
        checks = verify(config, work, oracle(stream))
    finally:
        if spark is not None:
            spark.stop()
    print(json.dumps({"runtime": args.runtime, "checks": [dataclasses.asdict(c)
                                                           for c in checks]}))
    return 0 if all(c.ok and c.got == c.expected for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
