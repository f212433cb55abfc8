"""The process pass: one Spark task runs one weir subtask for one micro-batch.

For batch ``N`` of query ``Q`` the task of partition ``i``:

1. gathers its rows as Arrow (all of subtask ``i``'s key groups — checked; beyond
   ``task_buffer_bytes`` in a local file, ``spill``) and handles them by kind, then
   input order, so a replay handles them identically, a slice at a time;
2. gets subtask ``i``'s state as of batch ``N-1``: the live operator this Python
   worker kept from ``N-1`` if that is exactly the attempt whose part was published
   (RocksDB on executor-local disk, or the hash map in memory), or a hash-map copy
   it kept from an earlier batch brought forward by the changelog deltas written
   since by other workers (``catch_up``: O(changes)), else a restore from
   the parts of ``N-1`` in checkpoint storage (a different worker, a retry, a
   restart, a new parallelism), or, in ``Q``'s first batch, from the savepoint given
   or the latest completed checkpoint of any query;
3. fires event-time timers up to the watermark (from the event times of batches
   before ``N``) and processing-time timers up to the batch's timestamp (Spark's
   ``current_timestamp()`` of the batch, the same on replay), then the batch's
   broadcast rows, then its records; bad records go to the dead-letter file;
4. writes its state of ``N`` (attempt-unique files) and publishes its part, and only
   then emits the outputs, held as Arrow until then (so nothing leaves a task whose
   state is not durable).

An exception of the user's function (``open``, ``process_element``,
``process_broadcast_element``, ``on_timer``) that is not weir's own fails the task as a
:class:`~weir.errors.UserFunctionError` raised from it: the user's exception first,
then the operator uid, the key, the record and the frames of the user's code, with
no weir frame above it (Spark reports the task's error as text; the driver rebuilds it
with ``UserFunctionError.from_error``).

Without a batch id (a static DataFrame) the task reads the latest state and writes
nothing: every action recomputes the same result. The calls of the user's function on
the rows, its failures and the dead letters are :mod:`.calls`' (the task's base class).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from weir.checkpoint.coordinator import CompletedCheckpoint
from weir.checkpoint.epoch_prior import stage_positions
from weir.checkpoint.epochs import EpochStore, lineage_state
from weir.checkpoint.format import SubtaskStateHandle, uid_dir
from weir.checkpoint.ownership import Lineage, wall_ms
from weir.checkpoint.storage import storage_counts
from weir.errors import (
    CorruptCheckpointError,
    FencedError,
    TaskPlacementError,
    UserFunctionError,
)
from weir.runtime.batch_function import BatchFunctionAdapter
from weir.runtime.collection import fewer_collections
from weir.runtime.operator import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    KeyedOperator,
)
from weir.runtime.spark.cache import (
    CacheLimits,
    LiveSubtask,
    evict,
    keep,
    others,
    take,
)
from weir.runtime.spark.calls import FunctionCalls
from weir.runtime.spark.observed import metrics_batch, task_metrics, with_metrics_column
from weir.runtime.spark.plan import plan_batch, recover_hint
from weir.runtime.spark.records import (
    columns_to_records,
    conform_batch,
    dumps_line,
    to_record_batch,
)
from weir.runtime.spark.reuse import behind, caught_up, is_exactly, new_live, useless
from weir.runtime.spark.routing import (
    KIND,
    ORDER,
    RowKind,
    clock_of,
    unpack_kinds,
)
from weir.runtime.spark.screen import CORRUPT_RECORD, MALFORMED
from weir.runtime.spark.spec import StageSpec
from weir.runtime.spark.spill import SpillBuffer, merged_slices, sorted_slices

__all__ = ["process_pass"]

log = logging.getLogger(__name__)
_OUTPUT_CHUNK = 65_536
#: rows handled per slice: the Python records (and outputs) of one slice exist at once
_SLICE_ROWS = 8_192
#: records per call of a batch function (Arrow only: no Python object per record)
_BATCH_SLICE_ROWS = 131_072
_ROW_ORDER = [(KIND, "ascending"), (ORDER, "ascending")]
#: the column Spark's PERMISSIVE readers fill with the raw text of a malformed line


class _Task(FunctionCalls):
    def __init__(self, spec: StageSpec) -> None:
        from pyspark import TaskContext

        self.spec = spec
        self.io_start = storage_counts()  # this task's storage operations: in its part
        ctx = TaskContext.get()
        self.subtask = 0  # set from the clock rows (_clock)
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        query = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
        self.batch = int(batch) if batch is not None else None
        self.query = str(query) if query is not None else ""
        self.attempt = uuid.uuid4().hex
        self.store = EpochStore(spec.storage(), spec.uid, retained=spec.retained,
                                dead_letter_retention_ms=spec.dead_letter_retention_ms)
        self.lineage = Lineage(self.store.stage, spec.lease_timeout_ms)
        self.token = 0
        self.dead: list[dict[str, Any]] = []
        self.counts = {"late": 0, "null_event_time": 0, "malformed": 0, "records": 0,
                       "outputs": 0, "timers_fired": 0}
        self.handle: SubtaskStateHandle | None = None
        self.buffers: dict[str, float] = {}
        self.restored = False
        self.caught_up = False

    # input -----------------------------------------------------------------------------
    def _gather(self, batches: Iterator[pa.RecordBatch], into: SpillBuffer) -> None:
        """The task's rows, as they arrive, into ``into``. No row: no subtask got one
        (every subtask gets clock rows whenever the batch has any row)."""
        for batch in batches:
            if batch.num_rows:
                into.append(batch)

    def _clock(self, table: pa.Table) -> int:
        """The batch time, from the task's clock rows, which also say which subtask it
        runs (Spark's partition id is not the subtask's when the output is unioned with
        another DataFrame); sets ``self.subtask``."""
        spec = self.spec
        clock = clock_of(table)
        if clock is None:  # then a subtask without rows took the batch as empty
            raise TaskPlacementError(
                f"operator {spec.uid!r}, batch {self.batch}: rows came without a clock row "
                f"(every input partition with rows sends one to each subtask); the routing "
                f"of this Spark version is not what weir expects: report it with the Spark "
                f"version"
            )
        now, subtasks = clock
        if len(subtasks) != 1 or not 0 <= subtasks[0] < spec.parallelism:
            raise TaskPlacementError(
                f"operator {spec.uid!r}, batch {self.batch}: one task received the rows of "
                f"subtasks {subtasks} of {spec.parallelism}; the stage's partitioning was "
                f"changed between the route and process passes"
            )
        self.subtask = subtasks[0]
        return now

    # state -----------------------------------------------------------------------------
    def _acquire(self) -> tuple[LiveSubtask, dict[str, Any]]:
        """The live subtask as of the previous batch, and that batch's positions."""
        spec = self.spec
        live = take((spec.location, spec.uid, self.subtask))
        completed: CompletedCheckpoint | None
        if self.batch is None:  # a static DataFrame: the stage's current state
            completed = lineage_state(self.store, self.lineage)[0]
        else:
            start = plan_batch(
                self.store, self.lineage, self.query, self.batch, parallelism=spec.parallelism,
                restore_from=spec.restore_from, storage_options=spec.storage_options,
            )
            self.token = start.claim.token
            completed = start.checkpoint
            prior = start.prior
            if prior is not None:
                for other in others(spec.location, spec.uid, self.subtask):
                    if useless(other, prior, self.query, self.token, spec):
                        evict(other.spec_key, f"its state changed since batch {other.batch}")
                if live is not None:
                    if is_exactly(live, prior, self.query, self.subtask, self.token, spec):
                        return live, prior.positions
                    handle = behind(live, prior, self.query, self.token, spec)
                    if handle is not None and caught_up(live, handle):
                        self.caught_up = True
                        return live, prior.positions
                completed = prior.for_subtask(self.subtask, spec.parallelism)
        if live is not None:
            live.close()
        self.restored = True
        started = time.perf_counter()
        live = new_live(spec, self.subtask, self.store.query_storage(self.query or "static"))
        try:
            positions: dict[str, Any] = {}
            if completed is not None:
                snaps = self._load(completed, live)
                live.operator.restore(snaps, allow_non_restored_state=spec.allow_non_restored_state)
                positions = stage_positions(dict(completed.metadata.source_positions),
                                            spec.uid)
                live.clock.now = max(live.clock.now, int(positions.get("batch_time") or 0))
            self._call(live.operator.open, "open")
            if completed is not None:
                self._adopt(live, completed)
                log.info("weir: operator %r subtask %d (query %s, batch %s) restored from %s "
                         "in %.0f ms", spec.uid, self.subtask, self.query, self.batch,
                         completed.url, (time.perf_counter() - started) * 1000)
        except BaseException:
            live.close()
            raise
        return live, positions

    def _adopt(self, live: LiveSubtask, completed: CompletedCheckpoint) -> None:
        """A hash-map changelog restored at the same parallelism from this query's
        own checkpoint goes on (the next batch writes only its changes)."""
        op = completed.metadata.operators.get(self.spec.uid)
        if op is not None and op.parallelism == self.spec.parallelism:
            for handle in op.subtasks:
                if handle.subtask_index == self.subtask:
                    live.checkpointer.adopt(handle, completed.storage)

    def _load(self, completed: CompletedCheckpoint, live: LiveSubtask) -> list[Any]:
        """Subtask ``i``'s snapshots from ``completed`` (native RocksDB files next to
        its working directory); a corrupt file says how to go on."""
        local = os.path.dirname(live.rocksdb_dir) if live.rocksdb_dir else None
        try:
            return completed.load(self.spec.uid, self.spec.parallelism, self.subtask, local)
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(
                f"operator {self.spec.uid!r}, query {self.query}, batch {self.batch}: cannot "
                f"restore {completed.url}: {exc}. To go on from the newest intact checkpoint "
                f"of this stage, run {recover_hint(self.store, 'latest')} and restart the "
                f"query (it says which batches that drops)"
            ) from exc

    # processing ------------------------------------------------------------------------
    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        spec = self.spec
        inputs = SpillBuffer(spec.task_buffer_bytes)
        outputs = SpillBuffer(spec.task_buffer_bytes)
        try:
            self._gather(batches, inputs)
            table = inputs.table()
            if table is None:  # the stage had no row at all in this batch: nothing changes
                if self.batch is not None:
                    self.store.mark_empty(self.query, self.batch)
                return
            table = unpack_kinds(table)
            now = self._clock(table)
            started = time.perf_counter()
            live, positions = self._acquire()
            try:
                with fewer_collections():  # records, outputs, changelog: many containers
                    acquired = time.perf_counter()
                    fired = live.operator.timers_fired
                    self._process(live, table, now, not inputs.spilled, positions, outputs)
                    self.counts["timers_fired"] = live.operator.timers_fired - fired
                    del table
                    self.buffers = {  # recorded with the storage operations in the part
                        "rows_in": inputs.rows, "arrow_in_bytes": inputs.nbytes,
                        # input records (the listener's share of late ones)
                        "records": self.counts["records"],
                        "arrow_out_bytes": outputs.nbytes,
                        "spilled_bytes": (inputs.nbytes if inputs.spilled else 0)
                        + (outputs.nbytes if outputs.spilled else 0),
                        "restored": int(self.restored),  # 0: the worker's live copy
                        "caught_up": int(self.caught_up),  # a copy left behind, + deltas
                        "worker_pid": os.getpid(),  # which Python worker ran the task
                        "restore_ms": _ms(acquired - started),
                        "process_ms": _ms(time.perf_counter() - acquired),
                        # (the batch's metrics: weir.runtime.spark.observed)
                        "outputs": self.counts["outputs"],
                        "timers_fired": self.counts["timers_fired"],
                    }
                    inputs.close()
                    if self.batch is not None:
                        self._commit(live)
            except BaseException:
                live.close()
                raise
            if self.batch is None:
                live.close()
            else:
                keep(live, CacheLimits(spec.cache_max_subtasks, spec.cache_max_bytes))
            if not spec.metrics:
                yield from outputs.batches()
                return
            for batch in outputs.batches():
                yield with_metrics_column(batch)
            yield metrics_batch(spec.output_schema, task_metrics(
                self.counts, self.handle.stats if self.handle is not None else None,
                len(self.dead), self.buffers.get("snapshot_ms", 0.0), self.restored))
        finally:
            inputs.close()
            outputs.close()

    def _emit(self, out: list[Any], outputs: SpillBuffer) -> None:
        """Outputs as Arrow, held until the batch's part is published."""
        schema, uid = self.spec.output_schema, self.spec.uid
        self.counts["outputs"] += len(out)
        for start in range(0, len(out), _OUTPUT_CHUNK):
            outputs.append(to_record_batch(out[start : start + _OUTPUT_CHUNK], schema, uid))

    def _process(
        self, live: LiveSubtask, table: pa.Table, now: int, in_memory: bool,
        positions: dict[str, Any], outputs: SpillBuffer,
    ) -> None:
        """Timers, then the rows by kind and input order, a slice of rows at a time
        (the Python objects of one slice at once); outputs go to ``outputs``."""
        spec = self.spec
        op = live.operator
        watermark = int(positions.get("watermark", MIN_WATERMARK))
        max_event = positions.get("max_event_time")
        if max_event is not None:
            watermark = max(watermark, int(max_event) - spec.watermark_delay_ms)
        if self.batch is not None and isinstance(op, KeyedOperator):
            drain = self.store.drain_from(self.query)
            if drain is not None and self.batch >= drain:
                watermark = MAX_WATERMARK  # drained: every event-time timer fires now
        self.watermark, self.max_event = watermark, max_event
        live.clock.now = self.batch_time = now
        batches = isinstance(spec.function, BatchFunctionAdapter)
        if isinstance(op, KeyedOperator):
            self._emit(self._timers(op, op.advance_watermark, watermark, "event-time"),
                       outputs)
            if batches:
                self._emit_arrow(self._batch_timers(op, "event-time"), outputs)
            self._emit(self._timers(op, op.advance_processing_time, now, "processing-time"),
                       outputs)
            if batches:
                self._emit_arrow(self._batch_timers(op, "processing-time"), outputs)
        kinds = (int(RowKind.BROADCAST), int(RowKind.RECORD), int(RowKind.BAD_KEY))
        slices = sorted_slices(table, _ROW_ORDER, KIND, kinds,
                               _BATCH_SLICE_ROWS if batches else _SLICE_ROWS, in_memory)
        if batches:  # one call per batch function for runs of records that fit one
            slices = merged_slices(slices, int(RowKind.RECORD), _BATCH_SLICE_ROWS)
        for kind, part in slices:
            if kind == RowKind.BROADCAST:  # (a batch function's outputs: Arrow)
                (self._emit_arrow if batches else self._emit)(self._broadcast(op, part),
                                                              outputs)
            elif kind == RowKind.RECORD:
                self.counts["records"] += part.num_rows
                if batches:
                    self._emit_arrow(self._batch(live, part), outputs)
                else:
                    self._emit(self._records(live, part), outputs)
            else:
                corrupt = (part[CORRUPT_RECORD].to_pylist() if CORRUPT_RECORD in
                           part.column_names else [None] * part.num_rows)
                records = columns_to_records(part, spec.columns, spec.record_format)
                for record, raw in zip(records, corrupt, strict=True):
                    if raw is not None:
                        self.counts["malformed"] += 1
                    self._dead_letter(record, MALFORMED if raw is not None else (
                        f"the key could not be computed (key columns {list(spec.key_columns)})"))

    def _emit_arrow(self, out: list[pa.RecordBatch | pa.Table], outputs: SpillBuffer) -> None:
        """A batch function's outputs, in the output schema, held until the batch's part
        is published."""
        for result in out:
            for batch in conform_batch(result, self.spec.output_schema, self.spec.uid):
                self.counts["outputs"] += batch.num_rows
                outputs.append(batch)

    # output ------------------------------------------------------------------------------
    def _commit(self, live: LiveSubtask) -> None:
        """Write this attempt's state of the batch and publish its part — only while
        the claim it ran under is still the stage's newest (fencing)."""
        assert self.batch is not None
        spec = self.spec
        started = time.perf_counter()
        live.operator.run_background_cleanup()  # TTL compaction filter: bounded per batch
        handle = self.handle = live.checkpointer.snapshot(self.batch, self.batch_time).result()
        self.buffers["snapshot_ms"] = _ms(time.perf_counter() - started)
        if not self.lineage.is_head(self.token):
            head = self.lineage.head()
            log.warning("weir: operator %r subtask %d: query %s was fenced off in batch %s; "
                        "nothing of it is published", spec.uid, self.subtask, self.query,
                        self.batch)
            raise FencedError(
                f"operator {spec.uid!r} in {spec.location}: query {self.query} was fenced off "
                f"during batch {self.batch}: "
                + (f"query {head.query} took the stage over ({head.reason})" if head and
                   head.query else "an explicit recovery reset the stage's state")
                + ". Nothing of this batch was published; stop this query"
            )
        if self.dead:
            name = f"dead-letter/{self.query}/batch={self.batch}/{uid_dir(spec.uid)}-" \
                   f"{self.subtask}.jsonl"
            self.store.location.write(name, b"".join(dumps_line(d) for d in self.dead))
        self.store.write_part(
            self.query, self.batch, spec.parallelism, spec.max_parallelism, handle,
            {
                "attempt": self.attempt, "watermark": self.watermark, "token": self.token,
                "max_event_time": self.max_event, "batch_time": self.batch_time,
                "dead_letters": len(self.dead), "late_records": self.counts["late"],
                "null_event_time": self.counts["null_event_time"],
                "malformed": self.counts["malformed"],
                "io": {**(storage_counts() - self.io_start).to_json(), **self.buffers},
            },
        )
        live.checkpointer.notify_checkpoint_complete(self.batch)
        live.query, live.batch, live.attempt = self.query, self.batch, self.attempt
        if live.token != self.token:
            live.token, live.renewed_ms = self.token, 0
        now = wall_ms()
        if now - live.renewed_ms >= spec.lease_timeout_ms // 4:
            self.lineage.renew(self.token)
            live.renewed_ms = now


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def process_pass(spec: StageSpec) -> Any:
    """The ``mapInArrow`` function of a weir stage."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            yield from _Task(spec).run(batches)
        except UserFunctionError as exc:
            # raised again without weir's frames: Spark reports the traceback as text,
            # and the message names the user's frames itself
            raise exc.with_traceback(None) from exc.__cause__

    return run
