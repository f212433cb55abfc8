"""The process pass: one Spark task runs one weir subtask for one micro-batch.

For batch ``N`` of query ``Q`` the task of partition ``i``:

1. gathers its rows (all of subtask ``i``'s key groups — checked) and sorts them by
   kind, then input order, so a replay handles them identically;
2. gets subtask ``i``'s state as of batch ``N-1``: the live operator this Python
   worker kept from ``N-1`` if that is exactly the attempt whose part was published
   (RocksDB on executor-local disk, or the hash map in memory), else a restore from
   the parts of ``N-1`` in checkpoint storage (a different worker, a retry, a
   restart, a new parallelism), or, in ``Q``'s first batch, from the savepoint given
   or the latest completed checkpoint of any query;
3. fires event-time timers up to the watermark (from the event times of batches
   before ``N``) and processing-time timers up to the batch's timestamp (Spark's
   ``current_timestamp()`` of the batch, the same on replay), then the batch's
   broadcast rows, then its records; bad records go to the dead-letter file;
4. writes its state of ``N`` (attempt-unique files) and publishes its part, and only
   then emits the outputs (so nothing leaves a task whose state is not durable).

Without a batch id (a static DataFrame) the task reads the latest state and writes
nothing: every action recomputes the same result.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from weir.api.functions import KeyedBroadcastProcessFunction
from weir.checkpoint.coordinator import CompletedCheckpoint, load_checkpoint
from weir.checkpoint.format import uid_dir
from weir.checkpoint.snapshotter import SnapshotMode, SubtaskCheckpointer
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import TaskPlacementError
from weir.runtime.operator import (
    MIN_WATERMARK,
    KeyedOperator,
    NonKeyedOperator,
    OperatorConfig,
)
from weir.runtime.spark.epochs import EpochPart, EpochStore, epoch_positions
from weir.runtime.spark.records import (
    columns_to_records,
    dumps_line,
    event_times_ms,
    to_record_batch,
)
from weir.runtime.spark.routing import (
    BROADCAST_PREFIX,
    KIND,
    NOW,
    ORDER,
    ROUTE,
    RowKind,
    route_table,
)

__all__ = ["StageSpec", "process_pass"]

log = logging.getLogger(__name__)
_OUTPUT_CHUNK = 65_536


@dataclass(frozen=True)
class StageSpec:
    """Everything a task needs to run one weir stage (pickled into the Spark plan)."""

    uid: str
    location: str
    parallelism: int
    max_parallelism: int
    state_backend: str
    snapshot_mode: str
    function: Any
    keyed: bool
    columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    broadcast_columns: tuple[str, ...]
    broadcast_state_descriptors: tuple[Any, ...]
    output_schema: pa.Schema
    event_time: str | None = None
    watermark_delay_ms: int = 0
    record_format: str = "dict"
    bad_record_exceptions: tuple[type[BaseException], ...] = ()
    restore_from: str | None = None
    allow_non_restored_state: bool = False
    retained: int = 3
    storage_options: dict[str, Any] | None = None

    def storage(self) -> CheckpointStorage:
        """The checkpoint location."""
        return CheckpointStorage(self.location, storage_options=self.storage_options)


class _BatchClock:
    """Processing time of the running batch (the batch timestamp: same on replay)."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


class _CurrentKey:
    """The key selector: the process pass computes keys column-wise and sets them."""

    def __init__(self) -> None:
        self.key: Any = None

    def __call__(self, value: Any) -> Any:
        return self.key


@dataclass
class _Live:
    """A subtask kept alive in this Python worker between batches."""

    spec_key: tuple[str, str, int]
    parallelism: int
    operator: KeyedOperator | NonKeyedOperator
    checkpointer: SubtaskCheckpointer
    clock: _BatchClock
    key: _CurrentKey
    rocksdb_dir: str | None
    query: str = ""
    batch: int = -1
    attempt: str = ""

    def close(self) -> None:
        try:
            self.checkpointer.close()
            self.operator.close()
        except Exception:  # pragma: no cover - best effort on eviction
            log.exception("closing a cached weir subtask failed")
        if self.rocksdb_dir:
            shutil.rmtree(self.rocksdb_dir, ignore_errors=True)


#: live subtasks of this Python worker, by (location, uid, subtask index)
_LIVE: dict[tuple[str, str, int], _Live] = {}


def _attempt_of(parts: list[EpochPart], subtask: int) -> Any:
    """The attempt id that published ``subtask``'s part."""
    return next(p.epoch.get("attempt") for p in parts if p.handle.subtask_index == subtask)


def _local_dir(spec: StageSpec, subtask: int) -> str:
    base = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or tempfile.gettempdir()
    tag = hashlib.sha256(f"{spec.location}\0{spec.uid}".encode()).hexdigest()[:12]
    return os.path.join(
        base, "weir-spark", tag, f"{subtask}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    )


def _new_live(spec: StageSpec, subtask: int, storage: CheckpointStorage) -> _Live:
    """A fresh subtask whose checkpoints go to ``storage`` (its query's directory)."""
    clock = _BatchClock()
    key = _CurrentKey()
    rocksdb_dir = _local_dir(spec, subtask) if spec.state_backend == "rocksdb" else None
    config = OperatorConfig(
        uid=spec.uid, state_backend=spec.state_backend, max_parallelism=spec.max_parallelism,
        parallelism=spec.parallelism, subtask_index=subtask, rocksdb_path=rocksdb_dir,
    )
    operator: KeyedOperator | NonKeyedOperator
    if spec.keyed:
        operator = KeyedOperator(
            spec.function, key, config, clock=clock,
            broadcast_state_descriptors=spec.broadcast_state_descriptors,
        )
    else:
        operator = NonKeyedOperator(spec.function, config, clock=clock)
    mode = SnapshotMode(spec.snapshot_mode)
    if spec.state_backend != "rocksdb" or not spec.keyed:
        mode = SnapshotMode.FULL
    checkpointer = SubtaskCheckpointer(operator, storage, mode=mode, asynchronous=False)
    return _Live((spec.location, spec.uid, subtask), spec.parallelism, operator,
                 checkpointer, clock, key, rocksdb_dir)


class _Task:
    def __init__(self, spec: StageSpec) -> None:
        from pyspark import TaskContext

        self.spec = spec
        ctx = TaskContext.get()
        self.subtask = ctx.partitionId() if ctx is not None else 0
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        query = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
        self.batch = int(batch) if batch is not None else None
        self.query = str(query) if query is not None else ""
        self.attempt = uuid.uuid4().hex
        self.store = EpochStore(spec.storage(), spec.uid, retained=spec.retained)
        self.dead: list[dict[str, Any]] = []

    # input -----------------------------------------------------------------------------
    def _gather(self, batches: Iterator[pa.RecordBatch]) -> pa.Table | None:
        chunks = [b for b in batches if b.num_rows]
        if not chunks:
            return None
        table = pa.Table.from_batches(chunks)
        expected = route_table(self.spec.parallelism)[self.subtask]
        routes = pc.unique(table[ROUTE]).to_pylist()
        if routes != [expected]:
            raise TaskPlacementError(
                f"operator {self.spec.uid!r}: Spark partition {self.subtask} received rows "
                f"routed to {sorted(routes)} (subtask {self.subtask} is route {expected}); "
                f"the stage's partitioning was changed between the route and process passes"
            )
        return table.sort_by([(KIND, "ascending"), (ORDER, "ascending")])

    # state -----------------------------------------------------------------------------
    def _acquire(self) -> tuple[_Live, dict[str, Any]]:
        """The live subtask as of the previous batch, and that batch's positions."""
        spec = self.spec
        key = (spec.location, spec.uid, self.subtask)
        live = _LIVE.pop(key, None)
        prev: list[EpochPart] | None = None
        if self.batch is not None and self.batch > 0:
            prev = self.store.read_parts(self.query, self.batch - 1)
        if prev is not None and self.subtask == 0:
            try:
                self.store.complete(self.query, self.batch - 1, prev)  # type: ignore[operator]
            except Exception:
                log.exception("weir: completing batch %s lazily failed", self.batch)
        if (
            live is not None and prev is not None and live.query == self.query
            and live.batch == self.batch - 1  # type: ignore[operator]
            and live.parallelism == spec.parallelism == prev[0].parallelism
            and _attempt_of(prev, self.subtask) == live.attempt
        ):
            return live, epoch_positions(live.batch, prev)["spark"]
        if live is not None:
            live.close()
        live = _new_live(spec, self.subtask, self.store.query_storage(self.query or "static"))
        try:
            completed = self._source(prev)
            positions: dict[str, Any] = {}
            if completed is not None:
                snaps = completed.load(spec.uid, spec.parallelism, self.subtask)
                live.operator.restore(snaps, allow_non_restored_state=spec.allow_non_restored_state)
                positions = dict(completed.metadata.source_positions.get("spark") or {})
            live.operator.open()
        except BaseException:
            live.close()
            raise
        return live, positions

    def _source(self, prev: list[EpochPart] | None) -> CompletedCheckpoint | None:
        spec = self.spec
        if prev is not None:
            storage = self.store.query_storage(self.query)
            return EpochStore.as_checkpoint(storage, self.batch - 1, prev, 0)  # type: ignore[operator]
        if spec.restore_from is not None:
            return load_checkpoint(spec.restore_from, storage_options=spec.storage_options)
        return self.store.latest_completed(verify=True)

    # processing ------------------------------------------------------------------------
    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        spec = self.spec
        table = self._gather(batches)
        live, positions = self._acquire()
        try:
            outputs = self._process(live, table, positions)
            if self.batch is not None:
                self._commit(live)
        except BaseException:
            live.close()
            raise
        if self.batch is None:
            live.close()
        else:
            _LIVE[live.spec_key] = live
        for start in range(0, len(outputs), _OUTPUT_CHUNK):
            yield to_record_batch(outputs[start : start + _OUTPUT_CHUNK], spec.output_schema,
                                  spec.uid)

    def _process(
        self, live: _Live, table: pa.Table | None, positions: dict[str, Any]
    ) -> list[Any]:
        spec = self.spec
        op = live.operator
        out: list[Any] = []
        watermark = int(positions.get("watermark", MIN_WATERMARK))
        max_event = positions.get("max_event_time")
        if max_event is not None:
            watermark = max(watermark, int(max_event) - spec.watermark_delay_ms)
        self.watermark, self.max_event = watermark, max_event
        batch_time = None
        if table is not None:
            now = pc.max(table[NOW]).as_py() if NOW in table.column_names else None
            batch_time = int(now) if now is not None else None
        if batch_time is not None:
            live.clock.now = batch_time
        self.batch_time = live.clock.now
        if isinstance(op, KeyedOperator):
            out += op.advance_watermark(watermark)
            if batch_time is not None:
                out += op.advance_processing_time(batch_time)
        if table is None:
            return out
        kinds = table[KIND]
        for kind in (RowKind.BROADCAST, RowKind.RECORD, RowKind.BAD_KEY):
            part = table.filter(pc.equal(kinds, int(kind)))
            if not part.num_rows:
                continue
            if kind is RowKind.BROADCAST:
                out += self._broadcast(op, part)
            elif kind is RowKind.RECORD:
                out += self._records(live, part)
            else:
                for record in columns_to_records(part, spec.columns, spec.record_format):
                    self._dead_letter(record, "the key could not be computed "
                                      f"(key columns {list(spec.key_columns)})")
        return out

    def _broadcast(self, op: KeyedOperator | NonKeyedOperator, part: pa.Table) -> list[Any]:
        spec = self.spec
        if not isinstance(op, KeyedOperator) or not isinstance(
            spec.function, KeyedBroadcastProcessFunction
        ):
            return []
        names = [BROADCAST_PREFIX + c for c in spec.broadcast_columns]
        records = columns_to_records(part.select(names), names, spec.record_format)
        if spec.record_format == "dict":
            records = [dict(zip(spec.broadcast_columns, r.values(), strict=True))
                       for r in records]
        out: list[Any] = []
        for record in records:
            out += op.process_broadcast_element(record)
        return out

    def _records(self, live: _Live, part: pa.Table) -> list[Any]:
        spec = self.spec
        op = live.operator
        records = columns_to_records(part, spec.columns, spec.record_format)
        times: list[int | None]
        if spec.event_time is not None:
            times = event_times_ms(part[spec.event_time])
            known = [t for t in times if t is not None]
            if known:
                top = max(known)
                self.max_event = top if self.max_event is None else max(self.max_event, top)
        else:
            times = [None] * len(records)
        if len(spec.key_columns) == 1:
            keys: list[Any] = part[spec.key_columns[0]].to_pylist()
        elif spec.keyed:
            keys = list(zip(*(part[c].to_pylist() for c in spec.key_columns), strict=True))
        else:
            keys = [None] * len(records)
        bad = spec.bad_record_exceptions
        current = live.key
        process = op.process_element
        out: list[Any] = []
        for record, key, ts in zip(records, keys, times, strict=True):
            current.key = key
            if bad:
                try:
                    out += process(record, ts)
                except bad as exc:
                    self._dead_letter(record, f"{type(exc).__name__}: {exc}")
            else:
                out += process(record, ts)
        return out

    def _dead_letter(self, record: Any, reason: str) -> None:
        self.dead.append({
            "uid": self.spec.uid, "query": self.query, "batch": self.batch,
            "subtask": self.subtask, "reason": reason, "record": record,
        })

    # output ------------------------------------------------------------------------------
    def _commit(self, live: _Live) -> None:
        """Write this attempt's state of the batch and publish its part."""
        assert self.batch is not None
        spec = self.spec
        handle = live.checkpointer.snapshot(self.batch, self.batch_time).result()
        if self.dead:
            name = f"dead-letter/{self.query}/batch={self.batch}/{uid_dir(spec.uid)}-" \
                   f"{self.subtask}.jsonl"
            self.store.root.write(name, b"".join(dumps_line(d) for d in self.dead))
        self.store.write_part(
            self.query, self.batch, spec.parallelism, spec.max_parallelism, handle,
            {
                "attempt": self.attempt, "watermark": self.watermark,
                "max_event_time": self.max_event, "batch_time": self.batch_time,
                "dead_letters": len(self.dead),
            },
        )
        live.checkpointer.notify_checkpoint_complete(self.batch)
        live.query, live.batch, live.attempt = self.query, self.batch, self.attempt


def process_pass(spec: StageSpec) -> Any:
    """The ``mapInArrow`` function of a weir stage."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from _Task(spec).run(batches)

    return run
