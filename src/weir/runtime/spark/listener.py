"""The driver's side of the Spark runtime: a streaming query listener that completes
each batch's checkpoint once Spark committed it, records where the query's Spark
checkpoint is, and gives a stage up when its query stops (one per SparkSession).
Completion and release of one stage are serialized in the driver; across processes
:meth:`EpochStore.complete` has exactly one winner.

Late data is said, not only counted: when a completed batch of a stage had more than
:data:`LATE_SHARE` of its records late (event time not after the watermark) and at
least :data:`LATE_MIN` of them, one WARNING on the ``weir.spark`` logger says how many,
the watermark and the likely causes (:func:`late_warning`) — once per batch and stage,
from the driver, however many tasks had late records."""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from weir.checkpoint.coordinator import CompletedCheckpoint
from weir.checkpoint.epochs import EpochStore
from weir.checkpoint.ownership import QUERY, Claim, Lineage
from weir.errors import IncompleteBatchError
from weir.runtime.operator_base import MIN_WATERMARK

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["COMPLETIONS", "LATE_MIN", "LATE_SHARE", "Completion", "Stage", "completion",
           "late_warning", "spark_checkpoint"]

log = logging.getLogger("weir.spark")

#: a batch's late records are said (a WARNING) past this share of its records...
LATE_SHARE = 0.01
#: ...and from this many on
LATE_MIN = 10
_LATE_SEEN = 4096


@dataclass
class Stage:
    """A stage registered with the driver's listener."""

    store: EpochStore
    lineage: Lineage
    parallelism: int
    #: completion and release of this stage are serialized in the driver
    lock: threading.Lock = field(default_factory=threading.Lock)


def _owns(head: Claim | None, query: str) -> bool:
    """Whether ``head`` (a stage's head claim) is ``query``'s."""
    return head is not None and head.kind == QUERY and head.query == query


class Completion:
    """Completes a batch's checkpoint once Spark reports the batch done, and gives a
    stage up when its query stops (a streaming query listener, one per SparkSession)."""

    def __init__(self) -> None:
        #: stages built by process() whose query may still run
        self.stages: dict[tuple[str, str], Stage] = {}
        #: stages of stopped queries, by query (finish() still completes their last batch)
        self.retired: dict[str, list[Stage]] = {}
        self.lock = threading.Lock()
        #: queries whose termination was handled (their stages retired once)
        self.terminated: set[str] = set()
        #: (query, stage) pairs whose Spark checkpoint location is recorded
        self.recorded: set[tuple[str, tuple[str, str]]] = set()
        #: this session's queries since they started (Spark calls onQueryStarted
        #: before the first batch), until their end was handled: query id -> handle
        self.started: dict[str, Any] = {}
        #: runs of stopped queries settled by finish() (or by a new process()), by
        #: run id (a query restarted from its Spark checkpoint keeps its id): the
        #: listener's late events for them write nothing more into their locations
        self.finished: set[str] = set()
        #: serializes the listener's events for a run with its settlement
        self._events: dict[str, threading.Lock] = {}
        #: the (query, location, uid, batch) whose late records were looked at, newest
        #: last (a batch is completed by the listener and again by finish())
        self._late_seen: OrderedDict[tuple[str, str, str, int], None] = OrderedDict()

    def _events_of(self, run: str) -> threading.Lock:
        with self.lock:
            return self._events.setdefault(run, threading.Lock())

    def listener_progress(
        self, query: str, run: str, batch: int, spark_checkpoint: Callable[[], str | None]
    ) -> None:
        """The listener's onQueryProgress for run ``run`` of ``query``:
        :meth:`on_progress`, unless that run was settled already (Spark's listener bus
        may deliver it after finish())."""
        with self._events_of(run):
            if run not in self.finished:
                self.on_progress(query, batch, spark_checkpoint=spark_checkpoint)

    def listener_terminated(self, query: str, run: str) -> None:
        """The listener's onQueryTerminated for run ``run`` of ``query``:
        :meth:`on_terminated`, unless that run was settled already."""
        with self._events_of(run):
            if run not in self.finished:
                self.on_terminated(query)

    def _owned(self, query: str) -> list[tuple[Stage, Claim]]:
        with self.lock:
            stages = [*self.stages.values(), *self.retired.get(query, ())]
        out = []
        for stage in stages:
            head = stage.lineage.head()
            if _owns(head, query):
                out.append((stage, head))
        return out

    def on_progress(
        self, query: str, batch: int, *, raise_errors: bool = False,
        spark_checkpoint: Any = None,
    ) -> None:
        """Complete ``batch`` of ``query`` for every stage the query owns (and record,
        once, where the query's Spark checkpoint is: ``spark_checkpoint`` is a callable
        that finds it)."""
        for stage, head in self._owned(query):
            if batch < (head.batch or 0):
                continue
            marker = (query, (stage.store.location.location, stage.store.uid))
            if spark_checkpoint is not None and marker not in self.recorded:
                root = spark_checkpoint()
                if root:
                    stage.store.record_spark_checkpoint(query, root)
                    self.recorded.add(marker)
            if stage.store.is_empty(query, batch):
                continue  # no row for the stage in this batch: nothing to complete
            with stage.lock:
                try:
                    done = stage.store.complete(query, batch, stage.parallelism)
                    stage.lineage.renew(head.token)
                except IncompleteBatchError as exc:
                    log.error("weir: %s", exc)
                    if stage.store.read_parts(query, batch):  # some subtasks ran it
                        stage.store.mark_incomplete(query, batch, str(exc))
                    if raise_errors:
                        raise
                except Exception:
                    log.exception("weir: completing batch %s of query %s failed", batch, query)
                    if raise_errors:
                        raise
                else:
                    try:
                        self._late(stage, query, batch, done)
                    except Exception:  # (never in the way of the completion)
                        log.exception("weir: reading the late records of batch %s of "
                                      "query %s failed", batch, query)

    def _late(self, stage: Stage, query: str, batch: int, done: CompletedCheckpoint) -> None:
        """Say the late records of completed ``batch`` (once, however often it is
        completed: by the listener, by finish())."""
        key = (query, stage.store.location.location, stage.store.uid, batch)
        with self.lock:
            if key in self._late_seen:
                return
            self._late_seen[key] = None
            while len(self._late_seen) > _LATE_SEEN:
                self._late_seen.popitem(last=False)
        message = late_warning(stage.store.uid, query, batch,
                               done.metadata.source_positions)
        if message is not None:
            log.warning("%s", message)

    def settle(self, query: Any, *, raise_errors: bool = False) -> int | None:
        """Complete the last batch the query ``query`` (a ``StreamingQuery``) committed
        and, if it is no longer active, give up its stages, without waiting for the
        listener's events. Returns that batch's id (None if it ran none)."""
        batch = last_committed(query.lastProgress)
        query_id, run = str(query.id), str(query.runId)
        with self._events_of(run):
            if run in self.finished:
                return batch
            if batch is not None:
                self.on_progress(query_id, batch, raise_errors=raise_errors,
                                 spark_checkpoint=lambda: spark_checkpoint(query))
            if not query.isActive:
                self.on_terminated(query_id)
                self.finished.add(run)
        return batch

    def settle_stopped(self) -> None:
        """Settle every query of this session that stopped but whose end the listener
        has not handled yet (it runs asynchronously): a query started right after
        ``stop()`` finds the stages free and the last batch complete."""
        with self.lock:
            handles = [q for q in self.started.values() if not q.isActive]
        for query in handles:
            self.settle(query)

    def on_terminated(self, query: str) -> None:
        """Give up every stage ``query`` owns: another query may claim them at once.
        They leave the listener's active stages (so a long session does not read the
        claims of every stage it ever ran at each batch); a restart registers them
        again through process()."""
        with self.lock:
            candidates = [*self.stages.values(), *self.retired.get(query, ())]
        owned = []
        for stage in candidates:  # one read of each stage's head claim
            head = stage.lineage.head()
            if head is None or head.query == query or not stage.lineage.alive(head):
                # a task of it still running may yet take the stage over
                stage.lineage.mark_stopped(query)
            if _owns(head, query):
                owned.append((stage, head))
        for stage, head in owned:
            with stage.lock:
                stage.lineage.release(head.token)
        with self.lock:
            self.started.pop(query, None)
            if query in self.terminated:
                # a second call (finish() and the listener's event, in either order):
                # the registrations now in self.stages may be a newer query's, made
                # by its process() since, and must stay
                return
            self.terminated.add(query)
            for stage, _ in owned:
                key = (stage.store.location.location, stage.store.uid)
                if self.stages.get(key) is stage:
                    del self.stages[key]
                if stage not in self.retired.setdefault(query, []):
                    self.retired[query].append(stage)


COMPLETIONS: dict[int, Completion] = {}


def late_warning(uid: str, query: str, batch: int, positions: Mapping[str, Any]
                 ) -> str | None:
    """The warning about the late records of a completed batch of stage ``uid`` (its
    checkpoint's ``source_positions``), or None: no more than :data:`LATE_SHARE` of its
    records, or fewer than :data:`LATE_MIN`, were late (or it does not say)."""
    spark = positions.get("spark") or {}
    late = int(spark.get("late_records") or 0)
    records = ((positions.get("spark_io") or {}).get("total") or {}).get("records")
    watermark = spark.get("watermark")
    if late < LATE_MIN or records is None or watermark is None:
        return None
    records, watermark = int(records), int(watermark)
    if records <= 0 or late <= LATE_SHARE * records or watermark <= MIN_WATERMARK:
        return None
    try:
        when = datetime.fromtimestamp(watermark / 1000, tz=UTC).isoformat(
            timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        when = "out of range"
    return (
        f"weir: operator {uid!r}, batch {batch} of query {query}: {late} of {records} "
        f"records ({late / records:.1%}) were late — their event time was not after the "
        f"watermark {watermark} ({when}), the largest event time of the batches before "
        f"minus the watermark delay — and were handled as EventTime(late_records=...) "
        f"says (processed, dropped or dead-lettered). Likely causes: input read out of "
        f"event-time order (a file source takes files by modification time, not by the "
        f"event times in them; files written late, copied or backfilled come out of "
        f"order), or a watermark_delay (EventTime(column, watermark_delay=...)) smaller "
        f"than how far out of order the input is")


def spark_checkpoint(query: Any) -> str | None:
    """Where a running query keeps Spark's checkpoint (None if unknown)."""
    try:
        return str(query._jsq.streamingQuery().resolvedCheckpointRoot())
    except Exception:  # not a classic (py4j) query, or gone
        return None


def batch_ran(duration_ms: Mapping[str, Any] | None) -> bool:
    """Whether a progress report is of a batch that ran. Spark also reports a trigger
    that found no new data (every ``noDataProgressEventInterval``), under the id the
    *next* batch will get and without ``addBatch`` (the time of running a batch)."""
    return duration_ms is not None and "addBatch" in duration_ms


def last_committed(progress: Mapping[str, Any] | None) -> int | None:
    """The last batch Spark committed, from a query's ``lastProgress`` (None: none):
    its batch, or the one before a report of a trigger without data."""
    if not progress:
        return None
    batch = int(progress["batchId"])
    if not batch_ran(progress.get("durationMs")):
        batch -= 1
    return batch if batch >= 0 else None


class _Listener:
    """Spark's ``PythonStreamingQueryListener`` (a Py4J callback the JVM's listener bus
    calls), reading only what :class:`Completion` needs: a query's id and run id, a
    batch's id and whether it ran, in five Py4J calls per progress report. PySpark's
    ``StreamingQueryListener`` first converts every report into Python objects (every
    field, every state operator, source and observed metric: dozens of calls and a
    failing class lookup per metric); with one report per batch that was most of the
    driver's CPU in a run of short batches."""

    def __init__(self, spark: SparkSession, completion: Completion) -> None:
        self.spark = spark
        self.completion = completion

    def onQueryStarted(self, jevent: Any) -> None:
        query = str(jevent.id().toString())  # called in the query's start(): before any batch
        handle = self.spark.streams.get(query)
        if handle is not None:
            with self.completion.lock:
                self.completion.started[query] = handle

    def onQueryProgress(self, jevent: Any) -> None:
        progress = jevent.progress()
        if not batch_ran(progress.durationMs()):  # (a Java map: one containsKey call)
            return  # a trigger that found no new data: no batch ran
        query = str(progress.id().toString())
        self.completion.listener_progress(
            query, str(progress.runId().toString()), int(progress.batchId()),
            lambda: spark_checkpoint(self.spark.streams.get(query)))

    def onQueryIdle(self, jevent: Any) -> None:
        pass

    def onQueryTerminated(self, jevent: Any) -> None:
        query = str(jevent.id().toString())
        try:
            self.completion.listener_terminated(query, str(jevent.runId().toString()))
        except Exception:
            log.exception("weir: releasing the stages of query %s failed", query)

    class Java:
        implements: ClassVar[list[str]] = [
            "org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def completion(spark: SparkSession) -> Completion:
    from pyspark.java_gateway import ensure_callback_server_started

    key = id(spark.sparkContext)
    found = COMPLETIONS.get(key)
    if found is not None:
        return found
    completion = Completion()
    gateway = spark.sparkContext._gateway
    assert gateway is not None
    ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]
    jvm = gateway.jvm
    listener = jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper(
        _Listener(spark, completion))
    manager = spark._jsparkSession.streams()
    manager.addListener(listener)
    COMPLETIONS[key] = completion

    def remove() -> None:  # no callbacks into an exiting interpreter
        with contextlib.suppress(Exception):  # the session may be gone already
            manager.removeListener(listener)

    atexit.register(remove)
    return completion
