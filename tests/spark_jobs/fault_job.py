"""The child driver of ``tests/test_spark_cluster_faults.py``: a weir stage on a
``local-cluster`` (separate executor JVMs) that the test kills pieces of.

::

    JSON-lines files (key, seq, payload, checksum) ──readStream (maxFilesPerTrigger=1)──
      weir.spark.process(Tracker, key_by="key", parallelism 2, hashmap | rocksdb)
      (or BatchTracker, a KeyedBatchFunction, on the hash map: the stage ``batch``)
      └─ writeStream "weir-files" (two-phase commit, idempotent per batch id)

Run as its own process (``python tests/spark_jobs/fault_job.py --work DIR --backend
B``), so that the test can SIGKILL it (driver crash) or one of its executor JVMs and
start it again: a restart with the same Spark checkpoint (``DIR/<backend>/spark-chk``)
and weir checkpoint location (``DIR/<backend>/weir-chk``) resumes from the last batch
Spark committed.
The query runs with ``trigger(availableNow=True)``: it processes every input file
present when it starts, then stops, and calls ``weir.spark.finish``.

``--backend`` may name several stages (``hashmap,rocksdb,batch``: ``batch`` is
:class:`BatchTracker` on the hash map): the driver then runs one query per stage at the
same time over the same input, each with its own sink, Spark checkpoint and weir
checkpoint location (``DIR/<stage>/...``), so that one cluster start-up serves them all
and a killed executor or driver hits them all.

Fault injection hook: ``--pause BACKEND:KEY:SEQ:SECONDS`` (repeatable; BACKEND ``*``: every
query). When the function of that backend's query meets record ``(KEY, SEQ)`` for the
first time (no marker file yet) it creates
``DIR/markers/<backend>-KEY-SEQ`` holding its Python worker's pid, then waits until
the test creates ``<marker>.go`` (at most SECONDS): the batch is certainly running,
its state not yet written, while the test kills something. A replay finds the
marker and does not pause again. The pause is a side effect outside state and
output, so the function stays deterministic.

Run as ``__main__``, this module's classes are pickled by value into the Spark plan,
so the executors' Python workers need no access to ``tests/``. The test imports the
same module for the oracle and to read the final state back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from weir import (
    KeyedBatchFunction,
    KeyedProcessFunction,
    MapStateDescriptor,
    ValueStateDescriptor,
)

UID = "tracker"
PARALLELISM = 2
MAX_PARALLELISM = 128
INPUT_SCHEMA = "key string, seq long, payload long, checksum long"
OUTPUT_SCHEMA = "key string, seq long, count long, total long, dup boolean, ok boolean"

COUNT: ValueStateDescriptor[int] = ValueStateDescriptor("count")
TOTAL: ValueStateDescriptor[int] = ValueStateDescriptor("total")
SEEN: MapStateDescriptor[int, int] = MapStateDescriptor("seen")  # seq -> checksum


#: the stages a driver can run: a state backend, or ``batch`` (BatchTracker, hash map)
STAGES = ("hashmap", "rocksdb", "batch")


def backend_of(stage: str) -> str:
    """The state backend of a stage."""
    return "hashmap" if stage == "batch" else stage


def checksum(key: str, seq: int, payload: int) -> int:
    """The checksum a source record carries (and the function verifies)."""
    return zlib.crc32(f"{key}|{seq}|{payload}".encode())


class Paths:
    """Everything of one job lives under its work directory: the shared input, markers
    and driver status, and per backend (one query each) ``<backend>/out`` (the sink),
    ``<backend>/spark-chk`` and ``<backend>/weir-chk``."""

    def __init__(self, work: str | Path) -> None:
        self.work = Path(work).resolve()
        self.input = self.work / "in"
        self.markers = self.work / "markers"
        self.status = self.work / "status.json"
        self.spark_local = self.work / "spark-local"

    def out(self, backend: str) -> Path:
        return self.work / backend / "out"

    def spark_chk(self, backend: str) -> Path:
        return self.work / backend / "spark-chk"

    def weir_chk(self, backend: str) -> Path:
        return self.work / backend / "weir-chk"

    def marker(self, backend: str, key: str, seq: int) -> Path:
        return self.markers / f"{backend}-{key}-{seq}"


class Pausing:
    """The fault hook (the module doc): wait at record ``(key, seq)`` the first time a
    function of this stage (``tag``) meets it."""

    def __init__(
        self, markers: str = "", tag: str = "", pauses: dict[tuple[str, int], float] | None = None
    ) -> None:
        self.markers = markers
        self.tag = tag
        self.pauses = dict(pauses or {})

    def _maybe_pause(self, key: str, seq: int) -> None:
        seconds = self.pauses.get((key, seq))
        if seconds is None:
            return
        marker = os.path.join(self.markers, f"{self.tag}-{key}-{seq}")
        if os.path.exists(marker):
            return
        tmp = f"{marker}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        try:
            os.link(tmp, marker)  # atomic, and fails if an earlier attempt got here
        except FileExistsError:
            return
        finally:
            os.unlink(tmp)
        deadline = time.monotonic() + seconds
        while not os.path.exists(marker + ".go") and time.monotonic() < deadline:
            time.sleep(0.05)


class Tracker(Pausing, KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Per key: a count, a running payload sum and the map of seen seqs; emits
    ``(key, seq, count, total, dup, ok)`` per record (``dup``: the seq was already in
    state, i.e. the record reached state twice; ``ok``: the checksum matches)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)
        self.total = ctx.get_state(TOTAL)
        self.seen = ctx.get_map_state(SEEN)

    def process_element(self, value: dict[str, Any], ctx: Any) -> list[tuple[Any, ...]]:
        key, seq, payload = value["key"], int(value["seq"]), int(value["payload"])
        self._maybe_pause(key, seq)
        ok = checksum(key, seq, payload) == int(value["checksum"])
        dup = self.seen.contains(seq)
        self.seen.put(seq, int(value["checksum"]))
        count = (self.count.value() or 0) + 1
        total = (self.total.value() or 0) + payload
        self.count.update(count)
        self.total.update(total)
        return [(key, seq, count, total, dup, ok)]


class BatchTracker(Pausing, KeyedBatchFunction):
    """:class:`Tracker`'s count and total a batch at a time (no map of seen seqs): a
    record's count and total are its key's before the batch plus its run within the
    batch; ``dup`` is a count other than ``seq + 1`` (each key's seqs count from 0 in
    input order, so a record that reached state twice shifts every later count)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)
        self.total = ctx.get_state(TOTAL)

    def process_batch(self, batch: Any, ctx: Any) -> Any:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        keys, seqs = batch.column("key").to_pylist(), batch.column("seq").to_pylist()
        for key, seq in zip(keys, seqs, strict=True):
            self._maybe_pause(key, seq)
        encoded = pc.dictionary_encode(batch.column("key"))
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        distinct = encoded.dictionary
        count0 = pc.fill_null(self.count.get(distinct, type=pa.int64()), 0).to_numpy()
        total0 = pc.fill_null(self.total.get(distinct, type=pa.int64()), 0).to_numpy()
        payload = batch.column("payload").to_numpy(zero_copy_only=False).astype(np.int64)
        order = np.argsort(codes, kind="stable")  # each key's records, in input order
        runs = np.bincount(codes, minlength=len(distinct))
        starts = np.repeat(np.concatenate(([0], np.cumsum(runs)[:-1])), runs)
        sums = np.cumsum(payload[order])
        within = np.empty(len(codes), dtype=np.int64)  # a record's running sum in its key
        within[order] = sums - np.concatenate(([0], sums))[starts]
        occurrence = np.empty(len(codes), dtype=np.int64)
        occurrence[order] = np.arange(len(codes)) - starts
        counts = count0[codes] + occurrence + 1
        totals = total0[codes] + within
        self.count.put(distinct, count0 + runs)
        self.total.put(distinct, total0 + np.bincount(codes, payload, len(distinct)).astype(
            np.int64))
        expected = np.array([checksum(k, s, int(p)) for k, s, p in zip(
            keys, seqs, payload.tolist(), strict=True)], dtype=np.int64)
        return pa.record_batch({
            "key": batch.column("key"), "seq": batch.column("seq"),
            "count": pa.array(counts, pa.int64()), "total": pa.array(totals, pa.int64()),
            "dup": pa.array(counts != np.asarray(seqs, dtype=np.int64) + 1),
            "ok": pa.array(expected == batch.column("checksum").to_numpy(
                zero_copy_only=False)),
        })


def key_of(record: Any) -> Any:
    """Key selector for reading the state back in a harness."""
    return record["key"] if isinstance(record, dict) else record[0]


def generate(
    seed: int, files: int, per_file: int, keys: int
) -> list[list[tuple[str, int, int, int]]]:
    """The deterministic source: ``files`` lists of ``(key, seq, payload, checksum)``;
    ``seq`` counts each key's records from 0 in source order."""
    import random

    rng = random.Random(seed)
    names = [f"k{i:03d}" for i in range(keys)]
    next_seq = dict.fromkeys(names, 0)
    out = []
    for _ in range(files):
        chunk = []
        for _ in range(per_file):
            key = rng.choice(names)
            seq = next_seq[key]
            next_seq[key] += 1
            payload = rng.randrange(-1000, 1000)
            chunk.append((key, seq, payload, checksum(key, seq, payload)))
        out.append(chunk)
    return out


def write_input(paths: Paths, files: list[list[tuple[str, int, int, int]]]) -> None:
    """Write the source files (JSON lines), each atomically, with increasing
    modification times (the order the file source takes them in)."""
    paths.input.mkdir(parents=True, exist_ok=True)
    base = time.time() - 10 * len(files)
    for i, chunk in enumerate(files):
        name = paths.input / f"part-{i:04d}.json"
        tmp = paths.input / f".part-{i:04d}.json.tmp"
        tmp.write_text("".join(
            json.dumps({"key": k, "seq": s, "payload": p, "checksum": c}) + "\n"
            for k, s, p, c in chunk
        ))
        os.utime(tmp, (base + 10 * i, base + 10 * i))
        os.replace(tmp, name)


# ------------------------------------------------------------------ the driver


def write_status(paths: Paths, **fields: Any) -> None:
    """Merge ``fields`` into ``status.json`` (atomically: the test polls it)."""
    doc: dict[str, Any] = {}
    if paths.status.exists():
        doc = json.loads(paths.status.read_text())
    doc.update(fields)
    tmp = paths.status.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, paths.status)


def report(backend: str, query: Any, reported: int) -> int:
    """Print one JSON line per finished micro-batch (stdout; Spark logs to stderr)."""
    for progress in query.recentProgress:
        p = json.loads(progress.json)
        if int(p["batchId"]) > reported:
            reported = int(p["batchId"])
            print(json.dumps({"backend": backend, "batch": reported, "rows": p.get("numInputRows"),
                              "ms": p.get("durationMs")}), flush=True)
    return reported


def start_query(
    spark: Any, paths: Paths, backend: str, pauses: dict[Any, float], function: Any = None,
) -> Any:
    """One query: the input files through the weir stage (``function``, by default a
    :class:`Tracker` with ``pauses``) into its ``weir-files`` sink."""
    import weir.spark

    events = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(paths.input))
    )
    if function is None:
        kind = BatchTracker if backend == "batch" else Tracker
        function = kind(str(paths.markers), backend, pauses)
    out = weir.spark.process(
        events,
        key_by="key",
        function=function,
        output_schema=OUTPUT_SCHEMA,
        uid=UID,
        config=weir.JobConfig(
            paths.weir_chk(backend).as_uri(), max_parallelism=MAX_PARALLELISM,
            state_backend=backend_of(backend),
        ),
        parallelism=PARALLELISM,
        heartbeat=False,
    )
    return (
        out.writeStream.format("weir-files")
        .option("path", str(paths.out(backend)))
        .option("checkpointLocation", str(paths.spark_chk(backend)))
        .queryName(f"fault-{backend}")
        .trigger(availableNow=True)
        .start()
    )


def run(
    paths: Paths, backends: list[str], master: str,
    pauses: dict[str, dict[tuple[str, int], float]],
) -> int:
    import pyspark

    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Scratch space of the driver, the standalone worker and its executors (which
    # take it from this variable, not from spark.local.dir): a killed executor's
    # leftovers stay in the work directory.
    os.environ["SPARK_LOCAL_DIRS"] = str(paths.spark_local)
    import weir.spark
    from weir.connectors import register_sinks

    started = time.monotonic()
    paths.markers.mkdir(parents=True, exist_ok=True)
    paths.spark_local.mkdir(parents=True, exist_ok=True)
    jvm_opts = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    spark = weir.spark.session(
        master, "weir-fault-" + "-".join(backends),
        **{
            "spark.sql.shuffle.partitions": str(PARALLELISM),
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "1g",
            "spark.executor.memory": "1g",
            "spark.driver.extraJavaOptions": jvm_opts,
            "spark.executor.extraJavaOptions": jvm_opts,
            # a killed executor is replaced; a task may fail more than once meanwhile
            "spark.task.maxFailures": "8",
            "spark.stage.maxConsecutiveAttempts": "8",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    write_status(paths, driver_pid=os.getpid(), jvm_pid=jvm_pid,
                 app_id=spark.sparkContext.applicationId,
                 startup_s=round(time.monotonic() - started, 1))
    register_sinks(spark)
    queries = {b: start_query(spark, paths, b, pauses.get(b, {})) for b in backends}
    reported = dict.fromkeys(backends, -1)
    while True:
        for b, query in queries.items():
            reported[b] = report(b, query, reported[b])
        if all(not q.isActive for q in queries.values()):
            break
        time.sleep(0.5)
    for b, query in queries.items():
        query.awaitTermination()  # raises if the query failed
        reported[b] = report(b, query, reported[b])
        last = weir.spark.finish(query)
        write_status(paths, **{f"last_batch_{b}": last})
    write_status(paths, finished=True, seconds=round(time.monotonic() - started, 1))
    spark.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--backend", required=True,
                        help="stages: hashmap, rocksdb, batch, or several: a,b")
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--pause", action="append", default=[],
                        help="BACKEND:KEY:SEQ:SECONDS (BACKEND * for all)")
    args = parser.parse_args(argv)
    backends = args.backend.split(",")
    if not set(backends) <= set(STAGES):
        parser.error(f"unknown backend in {args.backend!r}")
    pauses: dict[str, dict[tuple[str, int], float]] = {b: {} for b in backends}
    for spec in args.pause:
        backend, rest = spec.split(":", 1)
        key, seq, seconds = rest.rsplit(":", 2)
        for b in backends if backend == "*" else [backend]:
            pauses[b][(key, int(seq))] = float(seconds)
    return run(Paths(args.work), backends, args.master, pauses)


if __name__ == "__main__":
    sys.exit(main())
