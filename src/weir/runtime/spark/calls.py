"""The user's function called on a task's rows (the process pass, :mod:`.task`):
records one by one or a batch function's batches, broadcast rows, timers; an exception
of the user's code as a :class:`~weir.errors.UserFunctionError` that names the method,
key, record and task; bad records into the task's dead letters.

:class:`FunctionCalls` is the part of the task that does it; :class:`.task._Task`
gathers the rows, gets the state, orders the rows by kind and input order, and commits.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

import pyarrow as pa

from weir.api.functions import KeyedBroadcastProcessFunction
from weir.errors import UserFunctionError
from weir.runtime.batch_function import BatchFunctionAdapter, rejected_rows
from weir.runtime.operator import KeyedOperator, NonKeyedOperator
from weir.runtime.spark.cache import LiveSubtask
from weir.runtime.spark.keys import keys_of
from weir.runtime.spark.records import column_lists, columns_to_records, event_times_ms
from weir.runtime.spark.routing import BROADCAST_PREFIX
from weir.runtime.spark.screen import screen_records
from weir.runtime.spark.spec import StageSpec
from weir.runtime.spark.user_errors import raised_by_user

__all__ = ["FunctionCalls"]


class FunctionCalls:
    """Calls of the user's function for one task (see the module doc); the task sets
    the attributes below."""

    spec: StageSpec
    query: str
    batch: int | None
    subtask: int
    watermark: int
    max_event: int | None
    counts: dict[str, int]
    dead: list[dict[str, Any]]

    def _event_times(self, part: pa.Table) -> list[int | None]:
        """The records' event times (ms; all None without an event-time column); the
        batch's largest so far kept for the next watermark."""
        if self.spec.event_time is None:
            return [None] * part.num_rows
        times = event_times_ms(part[self.spec.event_time])
        known = [t for t in times if t is not None]
        if known:
            top = max(known)
            self.max_event = top if self.max_event is None else max(self.max_event, top)
        return times

    def _batch(self, live: LiveSubtask, part: pa.Table) -> list[pa.RecordBatch | pa.Table]:
        """A batch function's call over the records of ``part`` (those the event time
        and malformed input leave; the others dead-lettered or dropped)."""
        spec = self.spec
        screen = screen_records(part, self._event_times(part), spec, self.watermark, self.counts)
        if screen is not None:
            dead = [j for j, reason in enumerate(screen) if reason]
            if dead:  # records as dicts for the dead letters only
                records = columns_to_records(part.take(dead), spec.columns, spec.record_format)
                for record, j in zip(records, dead, strict=True):
                    self._dead_letter(record, screen[j])  # type: ignore[arg-type]
            part = part.filter(pa.array([reason is None for reason in screen]))
        if not part.num_rows:
            return []
        batch = part.select(list(spec.columns)).combine_chunks().to_batches()[0]
        keys = functools.partial(keys_of, part, spec.key_columns)  # (if the function asks)
        adapter = cast("BatchFunctionAdapter", live.operator.function)  # (the opened one)
        try:
            out = adapter.process_batch(batch, keys)
        except Exception as exc:
            if not self._raised_by_user(exc):
                raise
            raise self._user_error(exc, "process_batch", keyed=True,
                                   note=f", a batch of {batch.num_rows} records") from exc
        rejected = adapter.rejected()  # (ctx.reject: records as the other dead letters')
        if rejected:
            rows = pa.Table.from_batches([rejected_rows(batch, rejected)])
            for record, (_, reason) in zip(columns_to_records(rows, spec.columns,
                                                              spec.record_format),
                                           rejected, strict=True):
                self._dead_letter(record, reason)
        return out

    def _batch_timers(self, op: KeyedOperator, domain: str) -> list[pa.RecordBatch | pa.Table]:
        """A batch function's ``on_timers`` of the ``domain`` timers that just fired."""
        adapter = cast("BatchFunctionAdapter", op.function)
        try:
            return adapter.fire_timers()
        except Exception as exc:
            if not self._raised_by_user(exc):
                raise
            raise self._user_error(exc, "on_timers", keyed=True,
                                   note=f", {domain} timers") from exc

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
            try:
                out += op.process_broadcast_element(record)
            except Exception as exc:
                if not self._raised_by_user(exc):
                    raise
                raise self._user_error(exc, "process_broadcast_element", record=record,
                                       has_record=True) from exc
        return out

    def _records(self, live: LiveSubtask, part: pa.Table) -> list[Any]:
        spec = self.spec
        op = live.operator
        columns = column_lists(part, spec.columns)
        records = columns_to_records(part, spec.columns, spec.record_format, columns)
        times = self._event_times(part)
        keys: list[Any] = (keys_of(part, spec.key_columns, dict(zip(spec.columns, columns,
                                                                    strict=True)))
                           if spec.keyed else [None] * len(records))
        bad = spec.bad_record_exceptions
        current = live.key
        process = op.process_element
        out: list[Any] = []
        screen = screen_records(part, times, spec, self.watermark, self.counts)
        if screen is None and not bad and isinstance(op, KeyedOperator):
            # an exception fails the batch; the iterator's length left says which record
            # raised (process_keyed only iterates its values, once, in step)
            pending = iter(records)
            try:
                op.process_keyed(cast("Sequence[Any]", pending), keys, times, out)
            except Exception as exc:
                if not self._raised_by_user(exc):
                    raise
                j = len(records) - operator.length_hint(pending) - 1
                raise self._user_error(exc, "process_element", key=keys[j], keyed=True,
                                       record=records[j], has_record=True) from exc
            return out
        for j, (record, key, ts) in enumerate(zip(records, keys, times, strict=True)):
            if screen is not None and screen[j] is not None:
                if screen[j]:
                    self._dead_letter(record, screen[j])  # type: ignore[arg-type]
                continue
            current.key = key
            try:
                out += process(record, ts)
            except bad as exc:  # (none: catches nothing)
                self._dead_letter(record, f"{type(exc).__name__}: {exc}")
            except Exception as exc:
                if not self._raised_by_user(exc):
                    raise
                raise self._user_error(exc, "process_element", key=key, keyed=spec.keyed,
                                       record=record, has_record=True) from exc
        return out

    # the user's function failing ----------------------------------------------------------
    def _raised_by_user(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the user's function's to report as a
        :class:`UserFunctionError`: not weir's own (a :class:`WeirError` says what it
        is), and raised in or under a method of the function's class (not by weir's code
        around the call: restoring state, firing timers)."""
        return raised_by_user(self.spec.function, exc)

    def _user_error(self, exc: BaseException, method: str, *, key: Any = None,
                    keyed: bool = False, record: Any = None, has_record: bool = False,
                    note: str = "") -> UserFunctionError:
        """The error of ``exc``, raised by the user's ``method`` in this task."""
        spec = self.spec
        where = (f"query {self.query}, batch {self.batch}" if self.batch is not None
                 else "a static DataFrame")
        return UserFunctionError.of(
            exc, uid=spec.uid, method=method, key=key, keyed=keyed, record=record,
            has_record=has_record,
            task=f"subtask {self.subtask} of {spec.parallelism}, {where}{note}")

    def _call(self, method: Callable[[], Any], name: str) -> None:
        """``method()``, the user's ``name`` run by the operator (``open``)."""
        try:
            method()
        except Exception as exc:
            if not self._raised_by_user(exc):
                raise
            raise self._user_error(exc, name) from exc

    def _timers(self, op: KeyedOperator, fire: Callable[[int], list[Any]], until: int,
                domain: str) -> list[Any]:
        """``fire(until)``: the ``domain`` timers due fire (the user's ``on_timer``)."""
        try:
            return fire(until)
        except Exception as exc:
            if not self._raised_by_user(exc):
                raise
            raise self._user_error(exc, "on_timer", key=op.current_key, keyed=True,
                                   note=f", {domain} timer {op.record_timestamp}") from exc

    def _dead_letter(self, record: Any, reason: str) -> None:
        self.dead.append({
            "uid": self.spec.uid, "query": self.query, "batch": self.batch,
            "subtask": self.subtask, "reason": reason, "record": record,
        })
