"""Which records of a task's input its function gets: malformed input (Spark's
``_corrupt_record`` set), a null or invalid event time, and records behind the
watermark (``EventTime(late_records=)``) are dead-lettered or dropped before it."""

from __future__ import annotations

import pyarrow as pa

from weir.runtime.spark.spec import StageSpec

__all__ = ["CORRUPT_RECORD", "MALFORMED", "screen_records"]

CORRUPT_RECORD = "_corrupt_record"
MALFORMED = f"malformed input: Spark could not parse it (its raw text is in {CORRUPT_RECORD})"


def screen_records(part: pa.Table, times: list[int | None], spec: StageSpec, watermark: int,
                   counts: dict[str, int]) -> list[str | None] | None:
    """Per record of ``part`` (event times ``times``): None to process it, a reason to
    dead-letter it, "" to drop it; counted in ``counts``. None if every record is
    processed."""
    corrupt = (part[CORRUPT_RECORD].to_pylist() if CORRUPT_RECORD in part.column_names
               else None)
    if corrupt is None and spec.event_time is None:
        return None
    out: list[str | None] = [None] * part.num_rows
    for j, ts in enumerate(times):
        if corrupt is not None and corrupt[j] is not None:
            counts["malformed"] += 1
            out[j] = MALFORMED
        elif spec.event_time is None:
            continue
        elif ts is None:
            counts["null_event_time"] += 1
            out[j] = f"null or invalid event time in column {spec.event_time!r}"
        elif ts <= watermark:
            counts["late"] += 1
            if spec.late_records == "drop":
                out[j] = ""
            elif spec.late_records == "dead_letter":
                out[j] = f"late: event time {ts} is not after the watermark {watermark}"
    return out
