"""Kafka → keyed count → Kafka on both runtimes, beside the raw limit of the same
consume-count-produce loop in one Python process, and what checkpoints cost with the
transactional sink.

A noida-db broker (``bench/kafka_broker``) on loopback; ``--records`` records (key
``(n * 7919) % K`` as decimal bytes, value ``n``) produced into a source topic of
``--partitions`` partitions (timed on its own: the broker's produce rate, not part of
any run). Every run reads that topic from the start (``read_committed``), keeps a
running count per key, writes one record ``(key, count)`` per input record into a
fresh output topic, and is then verified: the output, read ``read_committed``, must
hold for every key exactly the counts ``1 .. c`` (``c`` its records in the input), each
once — a run that loses, duplicates or miscounts reports an error, not a number.

* **broker** — a bare consumer reading the source topic to its end (``read_committed``,
  batches of 10,000; nothing done per record), and the input's produce: the ceiling the
  broker and librdkafka put on any Python loop here. The broker's CPU seconds are kept
  for every run (``broker_cpu_s``), so a run it bounds shows.
* **raw limit** (one process, ``confluent-kafka``): a ``Consumer`` (``read_committed``)
  → a dict count per key → a ``Producer`` writing each count; *transactional*: the
  consume-transform-produce loop of Kafka's exactly-once (a transactional producer,
  ``send_offsets_to_transaction`` of the consumer's positions and
  ``commit_transaction`` every ~1 s: the shape of weir's exactly-once sink), and
  *plain*: a non-transactional producer, flushed at the end.
* **weir, continuous** (local runner, p = 2: two source tasks, two count tasks with
  the sink chained): ``KafkaSource(bounded=True)`` → ``key_by`` → a ``ValueState``
  count → ``KafkaSink``; with the first of ``--backends`` (hash map by default): the
  sink ``EXACTLY_ONCE`` with checkpoints every 1 s and with none during the run (the
  final checkpoint only: one transaction per subtask at the end), ``AT_LEAST_ONCE``
  and ``NONE`` at 1 s, and ``NONE`` with the final checkpoint only — the same job
  without checkpoints or transactions, against which "overhead" is measured; with
  any other backend, ``EXACTLY_ONCE`` at 1 s and ``NONE`` final-only.
* **weir, micro-batch on Spark** (``local[2]`` as ``bench/spark_keyed_count``):
  ``readStream.format("weir-kafka")`` (``maxOffsetsPerTrigger`` = records / 4, so
  four batches, ``trigger(availableNow=True)``) → ``weir.spark.process`` (the count of
  ``bench/spark_keyed_count``, p = 2) → ``writeStream.format("weir-kafka")`` (a
  transaction per batch and partition: exactly once), per backend.

Times include start-up, as a user's run has it (weir: ``execute_async()`` to the end
of ``wait()``; Spark: ``start()`` to ``awaitTermination()``, after an unmeasured
warm-up query; the raw loops: from creating their clients to the last commit or
flush). An unmeasured warm-up run of the continuous job comes first. Steady
records/s leave start-up and the end out: for weir, the count's progress notes
(``bench.continuous_keyed_count.read_marks``); for the raw loops and the bare consumer,
from their first batch to their last. With ``--repeat`` every run is repeated (every
other time in reverse order) and the table keeps each one's best.

Run: ``.venv/bin/python -m bench.kafka_keyed_count [--records N] [--keys K] [--quick]
[--runner local|spark|both] [--backends hashmap,rocksdb]``. Results:
``bench/results/kafka_keyed_count.json`` (``_quick``) and ``.png``; a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from pyspark import cloudpickle

import weir
from bench import continuous_keyed_count as kc
from bench.kafka_broker import Broker
from weir.api.config import state_backend_of
from weir.connectors.kafka import DeliveryGuarantee, KafkaRecord, KafkaSink, KafkaSource
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

#: (sink guarantee, checkpoint interval ms or None: the final checkpoint only) of the
#: continuous runs with the first backend; the others run the first and the last
SETTINGS: tuple[tuple[str, int | None], ...] = (
    ("exactly-once", 1000), ("exactly-once", None), ("at-least-once", 1000),
    ("none", 1000), ("none", None))
BASE = ("none", None)  # the continuous job without checkpoints or transactions
SPARK_CHECKPOINTS = "every batch"
#: the raw limits' transaction period (s), weir's checkpoint interval
COMMIT_S = 1.0
#: records a raw loop or a verification asks the consumer for at once
BATCH = 10_000


def _settle(client: Any) -> None:
    """Close a librdkafka client now (its threads and sockets), not at some later GC."""
    close = getattr(client, "close", None)
    if close is not None:
        close()


def _load() -> float:
    return round(os.getloadavg()[0], 2)


# ------------------------------------------------------------------------- the input


def keys_of(records: int, keys: int) -> np.ndarray:
    return (np.arange(records, dtype=np.int64) * 7919) % keys


def produce_input(broker: Broker, topic: str, records: int, keys: int) -> dict[str, Any]:
    """The input into ``topic``; the broker's produce rate (one Python producer)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    cpu, load = broker.cpu_s(), _load()
    started = time.perf_counter()
    produce = producer.produce
    for n, k in enumerate(keys_of(records, keys).tolist()):
        while True:
            try:
                produce(topic, key=b"%d" % k, value=b"%d" % n)
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(120)
    seconds = time.perf_counter() - started
    if left:
        raise RuntimeError(f"{left} input records not acknowledged")
    return _row("broker", "produce (the input, 1 producer)", "-", "-", None, records, keys,
                seconds, broker, cpu, load)


def _row(runtime: str, run: str, guarantee: str, checkpoints: str, interval_ms: int | None,
         records: int, keys: int, seconds: float, broker: Broker, cpu: float | None,
         load: float, **more: Any) -> dict[str, Any]:
    used = broker.cpu_s()
    return {"runtime": runtime, "run": run, "guarantee": guarantee, "checkpoints": checkpoints,
            "interval_ms": interval_ms, "records": records, "keys": keys,
            "seconds": round(seconds, 3), "records_per_s": round(records / seconds),
            "broker_cpu_s": None if used is None or cpu is None else round(used - cpu, 2),
            "load": [load, _load()], **more}


def expected_counts(records: int, keys: int) -> dict[bytes, int]:
    counts = np.bincount(keys_of(records, keys), minlength=keys)
    return {b"%d" % k: int(c) for k, c in enumerate(counts.tolist()) if c}


def consumer(broker: Broker, topic: str, partitions: int, group: str | None = None) -> Any:
    """A ``read_committed`` consumer assigned every partition of ``topic`` from the
    start."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": broker.bootstrap,
                  "group.id": group or f"bench-{uuid.uuid4().hex}",
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "enable.partition.eof": False})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    return c


def verify(broker: Broker, topic: str, partitions: int, expected: dict[bytes, int]
           ) -> str | None:
    """None if ``topic`` holds, for every key, the counts 1 .. c each once (committed
    records only); else what is wrong."""
    from confluent_kafka import TopicPartition

    total = sum(expected.values())
    c = consumer(broker, topic, partitions)
    try:
        ends = {}
        for p in range(partitions):
            _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10,
                                                cached=False)
            ends[p] = high
        seen: dict[bytes, set[int]] = {}
        rows = 0
        deadline = time.monotonic() + 120
        while True:
            messages = c.consume(BATCH, 0.05)
            for m in messages:
                if m.error() is None:
                    rows += 1
                    seen.setdefault(m.key(), set()).add(int(m.value()))
            if not messages:
                at = c.position([TopicPartition(topic, p) for p in ends])
                if all(tp.offset >= ends[tp.partition] for tp in at if ends[tp.partition]):
                    break
                if time.monotonic() > deadline:
                    return f"the output did not reach its end in 120 s ({rows:,} rows read)"
    finally:
        _settle(c)
    wrong = sum(1 for k, n in expected.items()
                if len(s := seen.get(k, ())) != n or min(s) != 1 or max(s) != n)
    extra = len(set(seen) - set(expected))
    if rows != total or wrong or extra:
        return (f"verification failed: {rows:,} output records of {total:,}, {wrong:,} keys "
                f"whose counts are not 1..c once each, {extra} unknown keys")
    return None


# ------------------------------------------------------------------- broker, raw limits


def broker_consume(broker: Broker, topic: str, partitions: int, records: int, keys: int
                   ) -> dict[str, Any]:
    """A bare ``read_committed`` consumer reading the topic to its end."""
    cpu, load = broker.cpu_s(), _load()
    started = time.perf_counter()
    c = consumer(broker, topic, partitions)
    got, first = 0, None
    while got < records:
        batch = sum(1 for m in c.consume(BATCH, 0.05) if m.error() is None)
        if batch and first is None:
            first = (time.perf_counter(), batch)
        got += batch
    ended = time.perf_counter()
    _settle(c)
    assert first is not None
    # (past the first batch: the consumer's start-up and first fetch left out)
    steady = (records - first[1]) / (ended - first[0]) if ended > first[0] else None
    return _row("broker", "consume", "-", "-", None, records, keys, ended - started, broker,
                cpu, load, steady_records_per_s=steady and round(steady))


def raw_limit(broker: Broker, source: str, out: str, partitions: int, records: int,
              keys: int, transactional: bool) -> dict[str, Any]:
    """Consume → dict count → produce each count, in one process (see the module doc);
    transactional: a transaction every :data:`COMMIT_S` with the consumer's offsets."""
    from confluent_kafka import Producer

    cpu, load = broker.cpu_s(), _load()
    started = time.perf_counter()
    c = consumer(broker, source, partitions, group=f"bench-raw-{out}")
    config: dict[str, Any] = {"bootstrap.servers": broker.bootstrap, "linger.ms": 5}
    if transactional:
        config["transactional.id"] = f"bench-raw-{out}"
    producer = Producer(config)
    transactions = 0
    if transactional:
        producer.init_transactions(10)
        producer.begin_transaction()

    def commit() -> None:
        producer.send_offsets_to_transaction(c.position(c.assignment()),
                                             c.consumer_group_metadata(), 10)
        producer.commit_transaction(10)

    counts: dict[bytes, int] = {}
    get, produce, poll = counts.get, producer.produce, producer.poll
    got, first = 0, None
    last = time.monotonic()
    while got < records:
        if got and first is None:
            first = (time.perf_counter(), got)
        for m in c.consume(BATCH, 0.05):
            if m.error() is not None:
                continue
            key = m.key()
            n = get(key, 0) + 1
            counts[key] = n
            while True:
                try:
                    produce(out, key=key, value=b"%d" % n)
                    break
                except BufferError:
                    poll(0.05)
            got += 1
        poll(0)
        if transactional and time.monotonic() - last >= COMMIT_S:
            commit()
            transactions += 1
            producer.begin_transaction()
            last = time.monotonic()
    ended = time.perf_counter()
    if transactional:
        commit()
        transactions += 1
    elif producer.flush(120):
        raise RuntimeError("output records not acknowledged")
    seconds = time.perf_counter() - started
    _settle(c)
    _settle(producer)
    return _row("raw", "transactional" if transactional else "plain",
                "exactly-once" if transactional else "none", _raw_commits(transactional),
                None, records, keys, seconds, broker, cpu, load, transactions=transactions,
                steady_records_per_s=None if first is None or ended <= first[0]
                else round((records - first[1]) / (ended - first[0])))


def _raw_commits(transactional: bool) -> str:
    return f"commit every {COMMIT_S:g} s" if transactional else "-"


# ------------------------------------------------------------------ weir, continuous


class KafkaCount(kc.Count):
    """``bench.continuous_keyed_count``'s count (with its progress notes), emitting
    ``(key, count)`` for the sink (``value``: the record's key, bytes)."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        self.n += 1
        if self.n % self.every == 0:
            self.marks.append((time.monotonic(), self.n, time.process_time(), 0.0))
        yield (value, b"%d" % n)


def _every(interval_ms: int | None) -> str:
    return f"every {interval_ms / 1000:g} s" if interval_ms else "final only"


def record_key(record: KafkaRecord) -> bytes | None:
    return record.key


def identity(key: Any) -> Any:
    return key


def weir_continuous(broker: Broker, source: str, out: str, records: int, keys: int,
                    backend: str, guarantee: str, interval_ms: int | None, root: Path,
                    timeout: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(dir=root))
    marks = work / "marks"
    marks.mkdir()
    env = StreamEnvironment(weir.JobConfig(
        work / "chk", parallelism=2, state_backend=state_backend_of(backend),
        checkpointing=CheckpointConfig(interval=interval_ms),
        restart_strategy=RestartStrategy.no_restart()))
    (env.from_source(KafkaSource(broker.bootstrap, source, bounded=True,
                                 deserializer=record_key), uid="records")
        .key_by(identity)
        .process(KafkaCount(str(marks), max(1, records // 50)), uid="count")
        .sink_to(KafkaSink(broker.bootstrap, out, delivery_guarantee=DeliveryGuarantee(
            guarantee), transactional_id_prefix=f"bench-{out}"), uid="sink"))
    cpu, load = broker.cpu_s(), _load()
    started = time.perf_counter()
    client = env.execute_async("bench-kafka", timeout=timeout)
    result = client.wait()
    seconds = time.perf_counter() - started
    return _row("weir", f"continuous, {backend}", guarantee, _every(interval_ms), interval_ms,
                records, keys, seconds, broker, cpu, load, backend=backend,
                steady_records_per_s=kc.read_marks(marks),
                sync_ms=kc.sync_pauses(client.checkpoints(), "count"),
                completed=len(result.completed))


# -------------------------------------------------------------- weir, micro-batch


def weir_spark(spark: Any, broker: Broker, source: str, out: str, records: int, keys: int,
               backend: str, max_offsets: int, root: Path, timeout: float) -> dict[str, Any]:
    import weir.spark
    from bench import spark_keyed_count as skc

    work = Path(tempfile.mkdtemp(dir=root))
    raw = (spark.readStream.format("weir-kafka")
           .option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", source)
           .option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", max_offsets).load())
    events = raw.selectExpr("CAST(key AS STRING) AS key")
    counts = skc.build(f"weir-{backend}", events, False, str(work / "weir"))
    cpu, load = broker.cpu_s(), _load()
    started = time.perf_counter()
    query = (counts.selectExpr("key", "CAST(count AS STRING) AS value")
             .writeStream.format("weir-kafka")
             .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", out)
             .option("checkpointLocation", str(work / "spark"))
             .trigger(availableNow=True).start())
    if not query.awaitTermination(timeout):
        query.stop()
        raise TimeoutError(f"not finished after {timeout:.0f} s")
    seconds = time.perf_counter() - started
    weir.spark.finish(query)
    batches = [json.loads(p.json) for p in query.recentProgress]
    batches = [b for b in batches if b.get("numInputRows")]
    return _row("weir", f"micro-batch on Spark, {backend}", "exactly-once", SPARK_CHECKPOINTS,
                None, records, keys, seconds, broker, cpu, load, backend=backend,
                batches=len(batches), max_offsets_per_trigger=max_offsets,
                batch_ms=[b["durationMs"].get("triggerExecution") for b in batches],
                durations_ms=[b["durationMs"] for b in batches])


# --------------------------------------------------------------------------- report


def _best(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run's best repeat (errors only where a run never succeeded), in order."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in runs:
        key = (r["keys"], r["runtime"], r["run"], r["guarantee"], r["interval_ms"])
        have = out.get(key)
        if have is None or "error" in have or (
                "error" not in r and r["records_per_s"] > have["records_per_s"]):
            out[key] = r
    return list(out.values())


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The best of each run, with its share of the raw limits of its key count and,
    for a continuous run, of the same backend's job without checkpoints (``BASE``)."""
    best = _best(runs)
    out = []
    for r in best:
        row = dict(r)
        if "error" not in r and r["runtime"] != "broker":
            for name in ("transactional", "plain"):
                raw = next((x for x in best if x["runtime"] == "raw" and x["run"] == name
                            and x["keys"] == r["keys"] and "error" not in x), None)
                row[f"of_raw_{name}"] = (round(r["records_per_s"] / raw["records_per_s"], 3)
                                         if raw else None)
            base = next((x for x in best if x["runtime"] == "weir" and x["run"] == r["run"]
                         and x["keys"] == r["keys"] and (x["guarantee"], x["interval_ms"])
                         == BASE and "error" not in x), None)
            row["of_no_checkpoints"] = (round(r["records_per_s"] / base["records_per_s"], 3)
                                        if base and r["run"].startswith("continuous") else None)
        out.append(row)
    return out


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:.0%}"


def _num(x: int | None) -> str:
    return "" if x is None else f"{x:,}"


def print_table(summary: list[dict[str, Any]]) -> None:
    print("| keys | runtime | run | sink | checkpoints | records/s | seconds | "
          "of raw (transactional) | of raw (plain) | of the job without checkpoints | "
          "steady records/s | checkpoints / transactions / batches | broker CPU s |")
    print("|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in summary:
        head = (f"| {r['keys']:,} | {r['runtime']} | {r['run']} | {r['guarantee']} | "
                f"{r['checkpoints']} |")
        if "error" in r:
            print(f"{head} failed: {r['error'].splitlines()[-1][:100]} | | | | | | | |")
            continue
        done = r.get("completed", r.get("batches", r.get("transactions", "")))
        print(f"{head} {r['records_per_s']:,} | {r['seconds']:.2f} | "
              f"{_pct(r.get('of_raw_transactional'))} | {_pct(r.get('of_raw_plain'))} | "
              f"{_pct(r.get('of_no_checkpoints'))} | {_num(r.get('steady_records_per_s'))} | "
              f"{'' if done is None else done} | "
              f"{'' if r['broker_cpu_s'] is None else r['broker_cpu_s']} |")


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    key_counts = doc["params"]["keys"]
    n = max(1, max(sum(r["keys"] == k for r in doc["summary"]) for k in key_counts))
    fig, axes = plt.subplots(len(key_counts), 1, squeeze=False,
                             figsize=(11, 1.2 + 0.42 * n * len(key_counts)))
    for ax, keys in zip(axes[:, 0], key_counts, strict=True):
        rows = [r for r in doc["summary"] if r["keys"] == keys and "error" not in r]
        labels = [f"{r['runtime']}: {r['run']}" + (
            f"\n{r['guarantee']}, checkpoints {r['checkpoints']}"
            if r["run"].startswith("continuous") else "") for r in rows]
        ys = list(range(len(rows)))[::-1]
        color = {"broker": "tab:gray", "raw": "tab:green"}
        bars = ax.barh(ys, [r["records_per_s"] for r in rows], color=[
            color.get(r["runtime"], "tab:orange" if "Spark" in r["run"] else "tab:blue")
            for r in rows])
        ax.bar_label(bars, [f"{r['records_per_s']:,}" + (
            f" ({r['of_raw_transactional']:.0%})" if r.get("of_raw_transactional")
            and r["runtime"] == "weir" else "") for r in rows], fontsize=7, padding=2)
        steady = [(y, r["steady_records_per_s"]) for y, r in zip(ys, rows, strict=True)
                  if r.get("steady_records_per_s")]
        if steady:
            ax.scatter([s for _, s in steady], [y for y, _ in steady], marker="|", s=250,
                       color="black", zorder=3, label="steady state (start-up and end left out)")
            ax.legend(fontsize=7, loc="lower right")
        ax.set_yticks(ys, labels, fontsize=7)
        ax.set_title(f"{keys:,} keys", fontsize=9)
        ax.margins(x=0.18)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("records/s, start-up included (% of the transactional raw limit)")
    fig.suptitle(f"Kafka → keyed count → Kafka, {doc['params']['records']:,} records, "
                 f"noida-db on loopback, p = 2", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def attempt(runs: list[dict[str, Any]], label: dict[str, Any], verbose: bool,
            run: Callable[[], dict[str, Any]], check: Callable[[], str | None]) -> None:
    """``run()`` then ``check()``: a row, or the error in its place (printed)."""
    try:
        row = {**run(), "repeat": label.get("repeat", 0)}
        problem = check()
        if problem:
            row["error"] = problem
    except Exception as e:  # (one broken run must not lose the others' numbers)
        if verbose:
            traceback.print_exc()
        row = {**label, "error": f"{type(e).__name__}: {e}"}
    runs.append(row)
    what = f"{row['runtime']} {row['run']} ({row['guarantee']}, {row['checkpoints']})"
    if "error" in row:
        print(f"  {what}: FAILED {row['error'][:300]}", file=sys.stderr)
    else:
        print(f"  {what}: {row['records_per_s']:,} records/s in {row['seconds']:.2f} s"
              f"{', verified' if row['runtime'] != 'broker' else ''}", file=sys.stderr)


class Bench:
    """The runs of one broker: topics made as needed, each run verified and its output
    topic deleted after."""

    def __init__(self, broker: Broker, spark: Any, args: argparse.Namespace,
                 backends: list[str], local: bool, root: Path, runs: list[dict[str, Any]]
                 ) -> None:
        self.broker, self.spark, self.args, self.root, self.runs = broker, spark, args, root, runs
        self.local_backends = backends if local else []
        self.spark_backends = backends if spark is not None else []
        self._topics = 0

    def topic(self) -> str:
        self._topics += 1
        return self.broker.create_topic(f"t{self._topics}", self.args.partitions)

    def warm_up(self, backend: str) -> None:
        """Unmeasured runs on a small input: caches, the JVM."""
        n, a = self.args.warmup_records, self.args
        if not n:
            return
        warm = self.topic()
        produce_input(self.broker, warm, n, 1000)
        if self.local_backends:
            weir_continuous(self.broker, warm, self.topic(), n, 1000, backend, "exactly-once",
                            1000, self.root, a.timeout)
        if self.spark is not None:
            weir_spark(self.spark, self.broker, warm, self.topic(), n, 1000, backend,
                       max(1, n // 2), self.root, a.timeout)

    def label(self, keys: int, runtime: str, run: str, guarantee: str, checkpoints: str,
              interval_ms: int | None = None) -> dict[str, Any]:
        """What a row that failed says about itself."""
        return {"keys": keys, "records": self.args.records, "repeat": 0,
                "runtime": runtime, "run": run, "guarantee": guarantee,
                "checkpoints": checkpoints, "interval_ms": interval_ms}

    def measured(self, label: dict[str, Any], run: Callable[[str], dict[str, Any]],
                 expected: dict[bytes, int] | None) -> None:
        """``run(output topic)``, verified against ``expected`` (None: no output)."""
        out = self.topic() if expected is not None else ""
        attempt(self.runs, label, self.args.verbose, lambda: run(out),
                lambda: None if expected is None else verify(
                    self.broker, out, self.args.partitions, expected))
        if out:
            self.broker.delete_topic(out)

    def keys(self, keys: int, max_offsets: int) -> None:
        """Every run over ``keys`` keys, ``--repeat`` times (odd repeats in reverse
        order: a slow spell of the shared cores or a warmer cache is not always on the
        same runs)."""
        a, broker, parts, n = self.args, self.broker, self.args.partitions, self.args.records
        source = self.topic()
        expected = expected_counts(n, keys)
        print(f"{n:,} records, {keys:,} keys, {parts} partitions", file=sys.stderr)
        self.measured(self.label(keys, "broker", "produce (the input, 1 producer)", "-", "-"),
                      lambda _: produce_input(broker, source, n, keys), None)
        if "error" in self.runs[-1]:
            return
        plan: list[tuple[dict[str, Any], Callable[[str], dict[str, Any]],
                         dict[bytes, int] | None]] = [
            (self.label(keys, "broker", "consume", "-", "-"),
             lambda _: broker_consume(broker, source, parts, n, keys), None)]
        for transactional in (True, False):
            plan.append((self.label(keys, "raw", "transactional" if transactional else "plain",
                                    "exactly-once" if transactional else "none",
                                    _raw_commits(transactional)),
                         partial(raw_limit, broker, source, partitions=parts, records=n,
                                 keys=keys, transactional=transactional), expected))
        for i, backend in enumerate(self.local_backends):
            for guarantee, interval in SETTINGS if i == 0 else (SETTINGS[0], SETTINGS[-1]):
                plan.append((self.label(keys, "weir", f"continuous, {backend}", guarantee,
                                        _every(interval), interval),
                             partial(weir_continuous, broker, source, records=n, keys=keys,
                                     backend=backend, guarantee=guarantee,
                                     interval_ms=interval, root=self.root, timeout=a.timeout),
                             expected))
        for backend in self.spark_backends:
            plan.append((self.label(keys, "weir", f"micro-batch on Spark, {backend}",
                                    "exactly-once", SPARK_CHECKPOINTS),
                         partial(weir_spark, self.spark, broker, source, records=n, keys=keys,
                                 backend=backend, max_offsets=max_offsets, root=self.root,
                                 timeout=a.timeout), expected))
        for rep in range(a.repeat):
            for label, run, check in plan if rep % 2 == 0 else plan[::-1]:
                self.measured({**label, "repeat": rep}, run, check)
        broker.delete_topic(source)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=lambda s: int(s.replace("_", "")), default=1_000_000)
    p.add_argument("--keys", type=kc._int_list, default=[10_000],
                   help="comma-separated key counts (default 10000)")
    p.add_argument("--partitions", type=int, default=4, help="of the source and output topics")
    p.add_argument("--runner", choices=("local", "spark", "both"), default="both")
    p.add_argument("--backends", default=None,
                   help="comma-separated (default hashmap,rocksdb; --quick: hashmap)")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None,
                   help="Spark runs (default: records / 4, four batches)")
    p.add_argument("--repeat", type=int, default=None,
                   help="runs of each, every other one in reverse order; the best is kept "
                        "(default 2; --quick: 1)")
    p.add_argument("--warmup-records", type=int, default=20_000,
                   help="an unmeasured run of the continuous job and the Spark query first")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--quick", action="store_true", help="100k records, hash map only")
    p.add_argument("-v", "--verbose", action="store_true", help="print tracebacks")
    args = p.parse_args(argv)
    if args.quick:
        args.records = min(args.records, 100_000)
        args.warmup_records = min(args.warmup_records, 5_000)
    args.repeat = args.repeat or (1 if args.quick else 2)
    backends = [b for b in (args.backends or ("hashmap" if args.quick else "hashmap,rocksdb")
                            ).split(",") if b]
    local, on_spark = args.runner in ("local", "both"), args.runner in ("spark", "both")
    max_offsets = args.max_offsets_per_trigger or max(1, args.records // 4)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    cloudpickle.register_pickle_by_value(kc)  # type: ignore[no-untyped-call]
    spark = None
    if on_spark:
        import weir.connectors.spark
        from bench.spark_keyed_count import spark_session

        spark = spark_session("2g", "local[2]")
        weir.connectors.spark.register_sinks(spark)
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="weir-bench-kafka-") as tmp, \
                Broker(Path(tmp) / "broker") as broker:
            bench = Bench(broker, spark, args, backends, local, Path(tmp), runs)
            bench.warm_up(backends[0])
            for keys in args.keys:
                bench.keys(keys, max_offsets)
    finally:
        if spark is not None:
            spark.stop()
    summary = summarise(runs)
    doc: dict[str, Any] = {"benchmark": "kafka_keyed_count",
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "cpus": os.cpu_count(), "broker": _version("noida-db"),
                       "confluent_kafka": _version("confluent-kafka")},
           "params": {"records": args.records, "keys": args.keys, "partitions": args.partitions,
                      "parallelism": 2, "runner": args.runner, "backends": backends,
                      "spark_master": "local[2]" if on_spark else None,
                      "max_offsets_per_trigger": max_offsets if on_spark else None,
                      "repeat": args.repeat, "warmup_records": args.warmup_records,
                      "commit_s": COMMIT_S, "quick": args.quick,
                      "elapsed_s": round(time.perf_counter() - started, 1)},
           "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "summary": summary, "runs": runs}
    print_table(summary)
    stem = "kafka_keyed_count" + ("_quick" if args.quick else "")
    kc.RESULTS.mkdir(exist_ok=True)
    (kc.RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, kc.RESULTS / f"{stem}.png")
    print(f"wrote bench/results/{stem}.json and .png ({doc['params']['elapsed_s']} s)",
          file=sys.stderr)
    return 0


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
