"""One savepoint lineage through every runtime, each at another parallelism and state
backend (issue 13), with a typed record in state that evolves on the way (issue 41):
the Spark micro-batch runtime (p = 3, RocksDB, ``StatsV1``) → the continuous runtime on
Spark (p = 1, hash map, ``StatsV2``: a field widened int → float, one added with a
default; stopped with a savepoint) → the continuous runtime's local runner (p = 3,
RocksDB, ``StatsV3``: fields reordered, a nullable one added; stopped with a
savepoint) → the test harness (p = 1, hash map, ``StatsV3``) → the micro-batch runtime
again (p = 2, hash map, ``StatsV4``: one more field added) — every runtime restores a
savepoint with an evolved record once. Each stage continues every key's record where the
savepoint left it: across all stages each key's counts are 1..n, each record once,
the totals are the sums of the key's records, a key's first record after the
migration to V2 sees the added field at its default, and the state holds the number
of records seen."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import weir
import weir.spark
from spark_support import (  # type: ignore[import-not-found]
    KEYED,
    by_value,
    keyed_records,
    run,
    write_file,
)
from weir import RecordSerializer
from weir.connectors import FileSink, SequenceSource, read_stream_sink
from weir.stream import CheckpointConfig, StreamEnvironment
from weir.testing import KeyedOperatorHarness

pytestmark = pytest.mark.spark

KEYS, MAX_PARALLELISM = 50, 32
OUT = "key string, seq long, n long, total double, last_seq long, version string"


@pytest.fixture(autouse=True)
def _by_value() -> None:
    from pyspark import cloudpickle

    by_value()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclasses.dataclass
class StatsV1:
    count: int
    total: int


@dataclasses.dataclass
class StatsV2:
    count: int
    total: float          # int -> float
    last_seq: int = -1    # added with a default


@dataclasses.dataclass
class StatsV3:
    total: float                   # moved
    count: int
    last_seq: int = -1
    first_seq: int | None = None   # added, nullable


@dataclasses.dataclass
class StatsV4:
    total: float
    count: int
    last_seq: int = -1
    first_seq: int | None = None
    label: str = "v4"              # added with a default


def stats(cls: type) -> weir.ValueStateDescriptor[Any]:
    return weir.ValueStateDescriptor("stats", RecordSerializer(cls))


class Summarize(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Per key, a record of the count and total of its ``seq``s (and, from V2 on, the
    last one); emits (key, seq, count, total, last_seq before this record, version)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def open(self, ctx: Any) -> None:
        self.stats = ctx.get_state(stats(self.cls))

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        record = self.stats.value() or self.cls(count=0, total=0)
        before = getattr(record, "last_seq", -1)
        record.count += 1
        record.total += value["seq"]
        if hasattr(record, "last_seq"):
            record.last_seq = value["seq"]
        self.stats.update(record)
        yield (value["key"], value["seq"], record.count, float(record.total), before,
               self.cls.__name__)


def record(n: int) -> dict[str, Any]:
    """The continuous jobs' records: as ``keyed_records`` makes them, from 10,000 on."""
    seq = 10_000 + n
    return {"key": f"k{(seq * 7919) % KEYS}", "seq": seq}


def micro_batch(spark: Any, tmp_path: Path, name: str, records: list[dict[str, Any]],
                parallelism: int, backend: str, restore_from: Path | None, cls: type
                ) -> list[tuple[Any, ...]]:
    write_file(tmp_path / f"{name}-in", records, KEYED)
    sink = run(
        spark,
        tmp_path / f"{name}-in",
        "key string, seq long",
        lambda events: weir.spark.process(
            events,
            key_by="key",
            function=Summarize(cls),
            output_schema=OUT,
            uid="count",
            heartbeat=False,
            parallelism=parallelism,
            config=weir.JobConfig(
                str(tmp_path / f"{name}-weir"),
                max_parallelism=MAX_PARALLELISM,
                state_backend=backend,
                restore_from=None if restore_from is None else str(restore_from),
            ),
        ),
        tmp_path / f"{name}-spark",
    )
    return sink.rows()


def continuous(tmp_path: Path, parallelism: int, backend: str, cls: type
               ) -> StreamEnvironment:
    """numbers → record → key_by(key) → Summarize(cls) → FileSink(tmp_path/../out):
    unbounded at 2,000 records/s, to be stopped with a savepoint."""
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=parallelism,
                                           max_parallelism=MAX_PARALLELISM, state_backend=backend,
                                           checkpointing=CheckpointConfig(interval=100)))
    (env.from_source(SequenceSource(10**6, 2_000), uid="numbers", parallelism=1)
        .map(record)
        .key_by(lambda r: r["key"])
        .process(Summarize(cls), uid="count")
        .sink_to(FileSink(tmp_path.parent / "out"), uid="sink"))
    return env


def stop_after_checkpoints(env: StreamEnvironment, name: str, restore_from: str,
                           target: Path, **runner: Any) -> str:
    client = env.execute_async(name, restore_from=restore_from, timeout=120, **runner)
    deadline = time.monotonic() + 90
    while len(client.checkpoints()) < 3:
        assert time.monotonic() < deadline, "no checkpoints"
        time.sleep(0.05)
    savepoint = client.stop_with_savepoint(target)
    client.wait(60)
    return savepoint


def test_a_savepoint_moves_through_every_runtime_at_any_parallelism_evolving_its_records(
        spark: Any, tmp_path: Path) -> None:
    rows = micro_batch(spark, tmp_path, "first", keyed_records(0, 2_000, KEYS), 3,
                       "rocksdb", None, StatsV1)
    first = weir.spark.savepoint(str(tmp_path / "first-weir"), str(tmp_path / "sp-1"))

    second = stop_after_checkpoints(
        continuous(tmp_path / "on-spark", 1, "hashmap", StatsV2), "on-spark", first,
        tmp_path / "sp-2", runner="spark", spark=spark)
    third = stop_after_checkpoints(
        continuous(tmp_path / "local", 3, "rocksdb", StatsV3), "local", second,
        tmp_path / "sp-3")
    rows += [tuple(r) for r in read_stream_sink(tmp_path / "out")]

    harnessed = keyed_records(2_000, 500, KEYS)
    with KeyedOperatorHarness.restore(
            Summarize(StatsV3), lambda v: v["key"], weir.load_checkpoint(third),
            parallelism=1, subtask_index=0, uid="count", max_parallelism=MAX_PARALLELISM,
            allow_non_restored_state=True) as harness:  # (the source's and sink's state)
        seen = Counter(r[0] for r in rows)
        assert {k: harness.state_of(k, stats(StatsV3)).count for k in seen} == seen
        for r in harnessed:
            rows += [tuple(out) for out in harness.process_element(r)]
        harness.savepoint(weir.CheckpointCoordinator(tmp_path / "harness-chk"),
                          tmp_path / "sp-4")

    rows += micro_batch(spark, tmp_path, "last", keyed_records(2_500, 1_000, KEYS), 2,
                        "hashmap", tmp_path / "sp-4", StatsV4)
    sources = Counter(r[1] >= 10_000 for r in rows)
    assert sources[False] == 3_500 and sources[True] > 0  # every runtime ran records
    assert {r[5] for r in rows} == {"StatsV1", "StatsV2", "StatsV3", "StatsV4"}
    assert max(Counter(r[1] for r in rows).values()) == 1  # each record once
    per_key: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        per_key.setdefault(row[0], []).append(row)
    assert len(per_key) == KEYS
    for key_rows in per_key.values():
        key_rows.sort(key=lambda r: r[2])
        assert [r[2] for r in key_rows] == list(range(1, len(key_rows) + 1))
        seqs = [r[1] for r in key_rows]
        assert [r[3] for r in key_rows] == [float(sum(seqs[:i + 1])) for i in range(len(seqs))]
        # the last seq, from V2 on: the migrated V1 records start at its default
        later = [r for r in key_rows if r[5] != "StatsV1"]
        assert [r[4] for r in later] == [-1, *[r[1] for r in later][:-1]]
