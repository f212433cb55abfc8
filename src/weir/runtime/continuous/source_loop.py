"""The main loop of a source task of a continuous job (the task itself:
:mod:`.task`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from weir.runtime.continuous.barriers import Barrier
from weir.runtime.continuous.split_watermarks import SplitWatermarks
from weir.runtime.operator_base import MAX_WATERMARK, MIN_WATERMARK

if TYPE_CHECKING:
    from weir.runtime.continuous.task import Task

__all__ = ["read_source"]

#: after a poll without records, wait up to this long (from the poll's start) for a
#: message from the coordinator before polling again: a reader that returns at once
#: does not spin the task's core (a reader that waited in its poll is not delayed)
STARVED_WAIT_S = 0.002


def read_source(task: Task) -> None:
    """The main loop of a source task (see :mod:`.task`): read between checks of the
    control connection, checkpoint on the coordinator's trigger, end at the source's
    end or on ``stop``. Time the reader had nothing to read (a poll that returned no
    record, and a short wait for a message after it, instead of polling again at once)
    counts as idle in the task's metrics, as does the time after the source's end.

    With a watermark strategy and a reader that tells its records' splits apart
    (``live_splits()`` not None), each split has its own watermark and idleness and the
    task's watermark is the smallest of them (:mod:`.split_watermarks`); otherwise one
    watermark is generated over all the task reads."""
    source = task.chain.ops[0]
    reader, feed = source.reader, task.chain.after[0]
    strategy = task.chain.watermarks
    stamp = strategy.timestamp_assigner if strategy is not None else None
    batch = task.graph.source_batch
    exhausted = False
    largest, sent = MIN_WATERMARK, MIN_WATERMARK
    next_watermark = last_record = checked = time.monotonic()  # (checked: the last check)
    idle = False
    starved_until: float | None = None  # (an empty poll: wait for a message until then)
    live = reader.live_splits() if strategy is not None else None
    per_split = (None if live is None or strategy is None
                 else SplitWatermarks(strategy, live, next_watermark))
    groups: list[tuple[Hashable, list[Any]]] | None = []

    def send_watermark(watermark: int) -> None:
        nonlocal sent, idle
        if watermark > sent or (idle and watermark >= sent):
            sent, idle = watermark, False
            task.watermark = watermark
            task.forward_event({"kind": "watermark", "ts": watermark})

    def end_of_input(drain: bool) -> None:
        """The source's end (or a stop): with ``drain``, event time jumps to the end
        so every event-time timer fires before the final checkpoint or savepoint
        (every source does, with or without a watermark strategy, as in Flink)."""
        if drain and task.graph.event_time:
            send_watermark(MAX_WATERMARK)
        for out in task.outs:
            out.flush(wait=False)
        task.control.send({"kind": "source_end"})

    idle_flush = task.outs if task.graph.channel.flush_when_idle else []
    # With unaligned checkpoints a source never blocks inside emit (where it could not
    # see a trigger): it reads a batch only while every output takes more, and waits for
    # that here, between batches, taking triggers (Flink's output availability). A
    # channel then holds at most one batch beyond its backlog limit.
    overtakes = task.graph.unaligned
    for out in task.outs:
        out.blocking = not overtakes
    while True:
        if exhausted:  # nothing to read: idle until told to finish
            waited = time.perf_counter_ns()
            message = task.control.receive(0.05)
            task.idle_ns += time.perf_counter_ns() - waited
        elif starved_until is not None:  # nothing to read at the last poll: not busy
            waited = time.perf_counter_ns()
            message = task.control.receive(max(0.0, starved_until - time.monotonic()))
            task.idle_ns += time.perf_counter_ns() - waited
            starved_until = None
        elif overtakes and not all(out.available for out in task.outs):
            waited = time.perf_counter_ns()
            message = task.control.receive(0.002)
            task.backpressured_ns += time.perf_counter_ns() - waited
            if message is None:
                task.heartbeat()
                continue
        else:
            message = task.control.receive(0)
        while message is not None:
            kind = message["kind"]
            if kind == "trigger":
                assert source.state is not None
                source.state.values = reader.snapshot_positions(int(message["id"]))
                task.checkpoint(Barrier(int(message["id"]), int(message["ts"]),
                                        message.get("savepoint"),
                                        aligned=bool(message.get("aligned"))))
            elif kind == "finish":
                return
            elif kind == "stop":  # stop-with-savepoint: read no more
                if not exhausted:
                    exhausted = True
                    end_of_input(drain=bool(message.get("drain")))
            else:
                task.notified(message)
            message = task.control.receive(0)
        task.heartbeat()
        if exhausted:
            continue
        polled, polled_ns = time.monotonic(), time.perf_counter_ns()
        if per_split is None:
            records = reader.poll(batch)
            count = -1 if records is None else len(records)
        else:
            records, groups = [], reader.poll_splits(batch)
            count = -1 if groups is None else sum(len(r) for _, r in groups)
        if count == 0:  # (a reader's wait in its poll: idle)
            task.idle_ns += time.perf_counter_ns() - polled_ns
            starved_until = polled + STARVED_WAIT_S
        if records is None or groups is None:
            exhausted = True
            end_of_input(drain=True)
            continue
        if count:
            last_record = time.monotonic()
            task.records_read += count
        if per_split is not None:
            assert stamp is not None
            for split, group in groups:  # (each split's largest timestamp: its watermark)
                if group:
                    per_split.read(split, _stamped(group, stamp, feed, MIN_WATERMARK),
                                   last_record)
        elif stamp is None:
            for record in records:
                feed(record, None)
        else:
            largest = _stamped(records, stamp, feed, largest)
        if strategy is not None:
            now = time.monotonic()
            if now >= next_watermark:
                next_watermark = now + strategy.interval_ms / 1000
                if per_split is not None:
                    watermark, quiet = per_split.check(now, reader.live_splits() or ())
                else:
                    # never idle at a check with records since the last one: their
                    # watermark goes out first, also from an idle source (which it makes
                    # active again; Flink's WatermarksWithIdleness / IdlenessTimer)
                    quiet = strategy.idleness_ms is not None and last_record < checked and (
                        now - last_record) * 1000 >= strategy.idleness_ms
                    checked = now
                    watermark = (largest - strategy.max_out_of_orderness_ms - 1
                                 if largest > MIN_WATERMARK else None)
                if quiet:
                    if not idle:
                        idle = True  # no longer holds event time back downstream
                        task.forward_event({"kind": "idle"})
                elif watermark is not None:  # (a watermark ends idleness downstream)
                    send_watermark(watermark)
        if count < batch:  # the reader has no more ready: send what waits
            for out in idle_flush:  # (ChannelConfig.flush_when_idle)
                out.flush_idle()


def _stamped(records: list[Any], stamp: Callable[[Any], int | None],
             feed: Callable[[Any, int | None], None], largest: int) -> int:
    """Pass on ``records`` with their timestamps (``stamp``; a record without a usable
    one goes through without); the largest of ``largest`` and theirs."""
    for record in records:
        stamped = stamp(record)
        if stamped is None:  # no usable time: through without a timestamp
            feed(record, None)
            continue
        ts = int(stamped)
        if ts > largest:
            largest = ts
        feed(record, ts)
    return largest
