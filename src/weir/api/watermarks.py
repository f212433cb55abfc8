"""Event time for the continuous runtime: where a record's timestamp comes from and how
far behind the largest one seen the watermark trails (Flink's ``WatermarkStrategy``).

A source task assigns each record its timestamp and, every ``interval_ms`` (Flink's
``pipeline.auto-watermark-interval``, 200 ms), sends the watermark ``largest
timestamp - max_out_of_orderness - 1`` downstream when it advanced. A task's event
time is the smallest watermark of its inputs (an idle one no longer holds it back:
``with_idleness``; once every input is idle, it is the largest watermark of them all,
as Flink's ``StatusWatermarkValve`` does); event-time timers fire as it passes them. At
the end of a bounded input the source sends the largest watermark, so every event-time
timer fires before the final checkpoint. An assigner that returns None (a record
without a usable time) lets the record through without a timestamp (``ctx.timestamp``
is None) and without moving the watermark: a process function can reject it into its
dead letters (``bad_record_exceptions``).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from typing import Any

from weir.errors import ConfigurationError

__all__ = ["MAX_WATERMARK", "MIN_WATERMARK", "WatermarkStrategy"]

#: The watermark before any has been seen (Java's Long.MIN_VALUE, as in Flink).
MIN_WATERMARK = -(2**63)
#: the final watermark of a drained stage (Flink's ``Watermark.MAX_WATERMARK``)
MAX_WATERMARK = 2**63 - 1


def _ms(value: float | datetime.timedelta, name: str) -> int:
    ms = value.total_seconds() * 1000 if isinstance(value, datetime.timedelta) else value
    if isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0:
        raise ConfigurationError(f"{name} must be milliseconds >= 0 or a timedelta, got "
                                 f"{value!r}")
    return int(ms)


@dataclasses.dataclass(frozen=True)
class WatermarkStrategy:
    """Timestamps and watermarks of a source's records (see the module doc)."""

    #: the record's event time in epoch milliseconds (None: it has none)
    timestamp_assigner: Callable[[Any], int | None]
    #: how far (ms) the watermark trails the largest timestamp seen
    max_out_of_orderness_ms: int = 0
    #: how often (ms) a source task sends its watermark
    interval_ms: int = 200
    #: a source task without records this long (ms) is idle: it sends the watermark of
    #: the records it read, then no longer holds event time back until it has records
    #: again (None: never idle)
    idleness_ms: int | None = None

    def with_idleness(self, timeout: float | datetime.timedelta) -> WatermarkStrategy:
        """The same strategy, with a source task idle after ``timeout`` (ms or
        timedelta) without records (Flink's ``withIdleness``)."""
        return dataclasses.replace(self, idleness_ms=max(1, _ms(timeout, "timeout")))

    @staticmethod
    def bounded_out_of_orderness(max_out_of_orderness: float | datetime.timedelta,
                                 timestamp_assigner: Callable[[Any], int | None], *,
                                 interval: float | datetime.timedelta = 200
                                 ) -> WatermarkStrategy:
        """Records may come up to ``max_out_of_orderness`` (ms or timedelta) late."""
        if not callable(timestamp_assigner):
            raise ConfigurationError("timestamp_assigner must be a function of the record")
        return WatermarkStrategy(timestamp_assigner,
                                 _ms(max_out_of_orderness, "max_out_of_orderness"),
                                 max(1, _ms(interval, "interval")))

    @staticmethod
    def for_monotonous_timestamps(timestamp_assigner: Callable[[Any], int | None]
                                  ) -> WatermarkStrategy:
        """Timestamps never decrease (no out-of-orderness)."""
        return WatermarkStrategy.bounded_out_of_orderness(0, timestamp_assigner)
