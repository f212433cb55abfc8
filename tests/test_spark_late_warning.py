"""Late data is said, not only counted: a batch whose late records (event time not
after the watermark) are more than 1% of its records and at least 10 gets one WARNING
from the driver's query listener (``weir.spark``) — how many, the watermark, the likely
causes — once per batch, however many tasks had late records; batches below either
bound get none."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

import weir
import weir.spark
from weir.runtime.spark.listener import LATE_MIN, LATE_SHARE, late_warning


class Count(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """One output per record."""

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        yield (value["key"], value["seq"])


def _records(times: list[int]) -> list[dict[str, Any]]:
    return [{"key": f"k{t % 10}", "seq": t} for t in times]


def _listener_done(spark: Any) -> None:
    """Wait until Spark's listener bus delivered every event so far (the weir listener
    runs in it)."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(60_000)


@pytest.mark.spark
def test_one_warning_for_the_batch_with_many_late_records(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from pyspark import cloudpickle

    from spark_support import KEYED, by_value, write_file  # type: ignore[import-not-found]

    by_value()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # batch 0: event times 1000..1999 (watermark before it: none)
    write_file(tmp_path / "in", _records(list(range(1000, 2000))), KEYED)
    # batch 1 (watermark 1999): 15 late of 2000 = 0.75%: not said
    write_file(tmp_path / "in", _records(list(range(15)) + list(range(2000, 3985))), KEYED)
    # batch 2 (watermark 3984): all 100 late (a file of old records, read last): said
    write_file(tmp_path / "in", _records([5] * 100), KEYED)
    # batch 3: 9 late of 20 (45%, but fewer than 10): not said
    write_file(tmp_path / "in", _records([7] * 9 + list(range(4000, 4011))), KEYED)
    events = (spark.readStream.schema("key string, seq long").option("maxFilesPerTrigger", 1)
              .parquet(str(tmp_path / "in")))
    out = weir.spark.process(events, key_by="key", function=Count(),
                             output_schema="key string, seq long", uid="late-counter",
                             config=weir.JobConfig(str(tmp_path / "weir")), parallelism=2,
                             event_time="seq", heartbeat=False)
    batches: dict[int, int] = {}
    with caplog.at_level(logging.WARNING, logger="weir.spark"):
        query = (out.writeStream
                 .foreachBatch(lambda df, b: batches.__setitem__(b, df.count()))
                 .option("checkpointLocation", str(tmp_path / "spark"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        weir.spark.finish(query)
        _listener_done(spark)
    assert batches == {0: 1000, 1: 2000, 2: 100, 3: 20}  # late records are processed
    said = [r for r in caplog.records if r.name == "weir.spark" and "were late" in
            r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    message = said[0].getMessage()
    assert said[0].levelno == logging.WARNING and "\n" not in message
    assert "operator 'late-counter', batch 2 of query" in message
    assert "100 of 100 records (100.0%) were late" in message
    assert "watermark 3984 (1970-01-01T00:00:03.984Z)" in message
    assert "out of event-time order" in message and "watermark_delay" in message


def test_the_bounds_of_the_warning() -> None:
    def positions(late: int, records: int | None, watermark: int | None = 5_000
                  ) -> dict[str, Any]:
        io = {} if records is None else {"spark_io": {"total": {"records": records}}}
        return {"spark": {"late_records": late, "watermark": watermark}, **io}

    assert (LATE_SHARE, LATE_MIN) == (0.01, 10)
    assert late_warning("u", "q", 1, positions(10, 999)) is not None  # 1.001%, 10
    assert late_warning("u", "q", 1, positions(10, 1000)) is None  # exactly 1%
    assert late_warning("u", "q", 1, positions(9, 10)) is None  # fewer than 10
    assert late_warning("u", "q", 1, positions(50, None)) is None  # records unknown
    assert late_warning("u", "q", 1, positions(50, 100, None)) is None
    assert late_warning("u", "q", 1, {}) is None
    said = late_warning("u", "q", 4, positions(20, 40))
    assert said is not None and said.startswith(
        "weir: operator 'u', batch 4 of query q: 20 of 40 records (50.0%) were late")
