"""A :class:`~weir.KeyedBatchFunction` on the continuous runtime: records gathered into
Arrow batches between the task's other duties.

A keyed operator whose function is a batch function (run through
:class:`~weir.runtime.batch_function.BatchFunctionAdapter`, as on Spark) takes its
records from the chain one at a time into a :class:`BatchBuffer`; the task **flushes**
the buffer — one ``process_batch`` call over everything gathered — before it does
anything that must see those records processed: a barrier or cancellation marker
reaching the barrier handler (so a checkpoint's state holds every record before its
barrier, and the outputs go ahead of the forwarded barrier), a watermark or idleness
event, processing-time timers, a control message (a live state query answers over the
records taken), a broadcast element (:meth:`BatchBuffer.broadcast`), the end of the
input; and whenever no input is waiting (so a record
waits for no timeout at a low rate) or the buffer holds ``max_records``. A batch is
thus the records taken since the last flush, in input order, all keys mixed.

Records to rows: a ``dict`` record is a row of its items (columns by name); any other
record is a row with one column, ``value`` (both kinds in one batch: an error). The
batch's schema is the operator's ``schema`` when the job gives one, else inferred from
the batch (Arrow's ``from_pylist``). A record that is itself a ``pyarrow.RecordBatch``
(a stream keyed by a column, ``key_by("name")``, whose records travel in batches:
:mod:`.routing` splits them by key group) is taken whole (cast to ``schema`` when one is
given), its keys its key column. Outputs back to records, the reverse: each row of an
output batch as a ``dict``, or its value when the batch's only column is ``value`` — or,
with ``output_batches``, each output batch as one record. An output carries the largest
timestamp of the records (or timers) of the call that made it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from weir.errors import ConfigurationError
from weir.runtime.batch_function import BatchFunctionAdapter, rejected_rows
from weir.runtime.continuous.graph import KeyColumn
from weir.runtime.operator import KeyedOperator

__all__ = ["MAX_BATCH_RECORDS", "BatchBuffer", "records_of", "rows_of"]

#: records gathered before a flush at the latest (a micro-batch slice on Spark is
#: 131,072; here a batch also ends at every barrier, watermark and pause of the input)
MAX_BATCH_RECORDS = 16_384
#: the one column of a batch of records that are not dicts
VALUE = "value"

Push = Callable[[Any, "int | None"], None]


def rows_of(records: list[Any], schema: pa.Schema | None, where: str) -> pa.RecordBatch:
    """``records`` as one Arrow batch (see the module doc); records of both kinds,
    dicts and others, are an error (their batch would have no one shape)."""
    dicts = sum(type(r) is dict for r in records)
    if dicts == len(records):
        rows = records
    elif not dicts:
        rows = [{VALUE: r} for r in records]
    else:
        raise ConfigurationError(
            f"{where}: {dicts} of {len(records)} records taken together are dicts and the "
            f"others are not, so they make no one batch; map them to one kind first")
    try:
        return pa.RecordBatch.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, KeyError) as exc:
        raise ConfigurationError(
            f"{where}: its records do not make an Arrow batch"
            + (" in the schema given" if schema is not None else "")
            + f" ({type(exc).__name__}: {exc}); map them to dicts of Arrow-typed values, "
              f"or give the operator's schema (process(..., schema=pa.schema(...)))"
        ) from None


def records_of(output: pa.RecordBatch | pa.Table, whole: bool = False) -> list[Any]:
    """The records of a batch function's output (see the module doc); ``whole``: the
    output as one record (a ``RecordBatch``)."""
    if whole:
        if isinstance(output, pa.Table):
            return list(output.combine_chunks().to_batches()) if output.num_rows else []
        return [output] if output.num_rows else []
    if output.schema.names == [VALUE]:
        return output.column(0).to_pylist()  # type: ignore[no-any-return]
    return output.to_pylist()  # type: ignore[no-any-return]


class BatchBuffer:
    """The records a batch function's keyed operator ``op`` has taken since its last
    call, and the calls: :meth:`flush` on the records, :meth:`timers` after a
    time advance. Outputs go to ``emit`` (the next operator's push)."""

    def __init__(self, op: KeyedOperator, schema: pa.Schema | None, where: str,
                 output_batches: bool = False, max_records: int = MAX_BATCH_RECORDS) -> None:
        adapter = op.function
        assert isinstance(adapter, BatchFunctionAdapter)
        self.op, self.adapter, self.schema, self.where = op, adapter, schema, where
        self.output_batches, self.max_records = output_batches, max_records
        selector = op.key_selector
        #: the key column of batches taken whole (None: records one by one only)
        self.column = selector.name if isinstance(selector, KeyColumn) else None
        self.emit: Push | None = None
        #: writes a record ``ctx.reject`` sent to the dead letters (None: none kept)
        self.reject: Callable[[Any, str], None] | None = None
        self.records: list[Any] = []  # records since the last part
        self.parts: list[pa.RecordBatch] = []  # batches taken, in order
        self.size = 0  # rows taken
        self.latest: int | None = None  # the largest timestamp taken

    def push(self, value: Any, ts: int | None) -> None:
        """Take one record, or a batch of them (flushing once ``max_records`` rows
        are gathered)."""
        if type(value) is pa.RecordBatch:
            if not value.num_rows:
                return
            if self.column is None:
                raise ConfigurationError(
                    f"{self.where}: a record is a RecordBatch but the stream is keyed by "
                    f"a function; key it by the batch's key column (key_by(\"name\"))")
            if self.schema is not None and value.schema != self.schema:
                value = self._cast(value)
            self._records_to_part()
            self.parts.append(value)
            self.size += value.num_rows
        else:
            self.records.append(value)
            self.size += 1
        if ts is not None and (self.latest is None or ts > self.latest):
            self.latest = ts
        if self.size >= self.max_records:
            self.flush()

    def _records_to_part(self) -> None:
        if self.records:
            schema = self.schema if self.schema is not None or not self.parts else (
                self.parts[0].schema)
            self.parts.append(rows_of(self.records, schema, self.where))
            self.records = []

    def flush(self) -> None:
        """One ``process_batch`` over the records taken (none: nothing happens)."""
        if not self.size:
            return
        ts, self.latest, self.size = self.latest, None, 0
        keys: Any
        records: list[Any] | None = None
        if self.parts:
            self._records_to_part()
            parts, self.parts = self.parts, []
            batch = parts[0] if len(parts) == 1 else self._concat(parts)
            keys = batch.column(self.column)
        else:
            records, self.records = self.records, []
            keys = list(map(self.op.key_selector, records))
            batch = rows_of(records, self.schema, self.where)
        self._emit(self.adapter.process_batch(batch, keys), ts)
        rejected = self.adapter.rejected()
        if rejected:  # (ctx.reject: each record as taken; a batch's row as a dict)
            if self.reject is None:
                raise ConfigurationError(f"{self.where}: rows rejected without dead letters")
            dead = ([records[i] for i, _ in rejected] if records is not None
                    else rejected_rows(batch, rejected).to_pylist())
            for record, (_, reason) in zip(dead, rejected, strict=True):
                self.reject(record, reason)

    def _cast(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        try:
            return batch.cast(self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
            raise ConfigurationError(
                f"{self.where}: a batch of records does not cast to the schema given "
                f"({type(exc).__name__}: {exc}); its schema: {batch.schema}") from None

    def _concat(self, parts: list[pa.RecordBatch]) -> pa.RecordBatch:
        try:
            return pa.concat_batches(parts)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ConfigurationError(
                f"{self.where}: the records taken since the last call do not make one "
                f"batch ({exc}); give batches and records one schema, or the operator's "
                f"schema (process(..., schema=pa.schema(...)))") from None

    def broadcast(self, value: Any, ts: int | None) -> list[Any]:
        """A broadcast element (a :class:`~weir.KeyedBroadcastBatchFunction`'s): the
        records taken before it are processed first, so they see the broadcast state
        it found; its outputs as records."""
        self.flush()
        return [record for output in self.op.process_broadcast_element(value, ts)
                for record in records_of(output, self.output_batches)]

    def timers(self) -> None:
        """``on_timers`` of the timers the operator just fired (their outputs carry the
        latest timer's time)."""
        latest = self.adapter.fired_until
        self._emit(self.adapter.fire_timers(), latest)

    def _emit(self, outputs: list[pa.RecordBatch | pa.Table], ts: int | None) -> None:
        emit = self.emit
        assert emit is not None
        for output in outputs:
            for record in records_of(output, self.output_batches):
                emit(record, ts)
