"""How a task sends a record on: one function per output edge, by the edge's
partitioner (forward, by key group, round robin, broadcast), over that edge's output
channels (:mod:`.channels`). Keyed by a column (``key_by("name")``), a record that is
an Arrow batch is split by key group, each part one record to its subtask."""

from __future__ import annotations

import itertools
from typing import Any

from weir.runtime.continuous.chain import Push
from weir.runtime.continuous.channels import OutputChannel
from weir.runtime.continuous.graph import Edge, KeyColumn, Partitioner
from weir.state.keygroups import assign_key_to_parallel_operator

__all__ = ["discard", "route"]


def discard(value: Any, ts: int | None) -> None:
    """Where the records of a chain without outputs go (it ends in sinks)."""


def route(edge: Edge, channels: list[OutputChannel], max_parallelism: int,
           subtask: int, event_time: bool, rejects: bool = False,
           batches: bool = False) -> Push:
    """Send a record by ``edge``'s partitioner (as ``(timestamp, record)`` with event
    time). With ``rejects`` (the consumer is a keyed function with dead letters), a
    record whose key selector raises goes to the consumer's first subtask, whose own
    call of the same key selector raises it again — into its dead letters if the
    exception is one of its ``bad_record_exceptions``, else failing that task. With
    ``batches`` (records may be batches of records: ``JobGraph.may_emit_batches``) a
    batch counts its rows toward its channel's full buffer."""
    emits = [c.emit if not batches else _weighed(c.emit, event_time) for c in channels]
    if edge.partitioner is Partitioner.HASH:
        key_of, n = edge.key_selector, len(channels)
        assert key_of is not None

        def by_key(record: Any, ts: int | None) -> None:
            emits[assign_key_to_parallel_operator(key_of(record), max_parallelism, n)](
                (ts, record) if event_time else record)

        def by_key_or_first(record: Any, ts: int | None) -> None:
            try:
                target = assign_key_to_parallel_operator(key_of(record), max_parallelism, n)
            except Exception:
                target = 0
            emits[target]((ts, record) if event_time else record)
        if isinstance(key_of, KeyColumn):  # batches of records split by their column
            return by_column(key_of, by_key_or_first if rejects else by_key, emits,
                             max_parallelism, event_time)
        return by_key_or_first if rejects else by_key
    if edge.partitioner is Partitioner.BROADCAST:
        def to_all(record: Any, ts: int | None) -> None:
            item = (ts, record) if event_time else record
            for emit in emits:
                emit(item)
        return to_all
    if edge.partitioner is Partitioner.REBALANCE:  # (each producer starts elsewhere)
        k = subtask % len(emits)
        turn = itertools.cycle(emits[k:] + emits[:k])

        def round_robin(record: Any, ts: int | None) -> None:
            next(turn)((ts, record) if event_time else record)
        return round_robin
    emit = emits[0]

    def forward(record: Any, ts: int | None) -> None:
        emit((ts, record) if event_time else record)
    return forward


def _weighed(emit: Any, event_time: bool) -> Any:
    """``emit``, giving a record that is a batch of records the weight of its rows."""
    def weighed(item: Any, rows: int | None = None) -> None:
        if rows is None:
            rows = getattr(item[1] if event_time else item, "num_rows", 1)
        emit(item, rows)
    return weighed


def by_column(key_of: KeyColumn, by_key: Push, emits: list[Any], max_parallelism: int,
              event_time: bool) -> Push:
    """Route by a key column: a record that is a ``pyarrow.RecordBatch`` goes to each
    consumer subtask as the batch of its rows whose keys that subtask owns
    (:meth:`KeyColumn.split`; an empty batch goes nowhere); any other record by
    ``by_key``."""
    import pyarrow as pa

    n = len(emits)

    def split(record: Any, ts: int | None) -> None:
        if type(record) is not pa.RecordBatch:
            by_key(record, ts)
            return
        for target, part in key_of.split(record, max_parallelism, n):
            emits[target]((ts, part) if event_time else part, part.num_rows)
    return split
