"""``weir.write_savepoint`` from Spark DataFrames: keyed state and timers encoded and
written on the executors (never collected to the driver), the same savepoint as from
the same rows in pandas, errors of the executors raised as weir's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import weir
from test_read_state import COUNT, LAST, NOTE, RECENT, SEEN  # type: ignore[import-not-found]
from test_write_savepoint import _stored  # type: ignore[import-not-found]

KEYS = [f"k{i}" for i in range(60)]
TABLES = {
    "count": pd.DataFrame({"key": KEYS, "value": list(range(60))}),
    "seen": pd.DataFrame({"key": [k for k in KEYS for _ in range(3)],
                          "index": [i for _ in KEYS for i in range(3)],
                          "value": [7 * n + i for n in range(60) for i in range(3)]}),
    "by_tag": pd.DataFrame({"key": [k for k in KEYS[:20] for _ in range(2)],
                            "map_key": ["p", "q"] * 20, "value": list(range(40))}),
    "note": pd.DataFrame({"key": KEYS[:30], "value": [f"n{i}" for i in range(30)],
                          "ttl_timestamp_ms": [1_000 + i for i in range(30)]}),
    "recent": pd.DataFrame({"key": KEYS[:10], "index": [0] * 10, "value": list(range(10)),
                            "ttl_timestamp_ms": [5_000] * 10}),
}
TIMERS = pd.DataFrame({"key": KEYS[:25], "domain": ["event", "processing"] * 12 + ["event"],
                       "timestamp_ms": [100 * i for i in range(25)]})
DESCRIPTORS = [COUNT, SEEN, LAST, NOTE, RECENT]


@pytest.fixture(autouse=True)
def _pickle_by_value() -> None:
    """The descriptors' serializers (Upper) travel to the executors by value."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules["test_read_state"])


@pytest.fixture
def no_collect(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keyed state from Spark must never pass through the driver."""
    from pyspark.sql import DataFrame

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a keyed table was collected to the driver")

    monkeypatch.setattr(DataFrame, "toPandas", refuse)


@pytest.mark.spark
def test_spark_tables_write_on_the_executors_the_savepoint_pandas_writes(
    spark: Any, tmp_path: Path, no_collect: None
) -> None:
    def write(target: Path, convert: Any) -> str:
        return weir.write_savepoint(
            target, uid="op", max_parallelism=32, parallelism=3,
            states={n: convert(t) for n, t in TABLES.items()}, timers=convert(TIMERS),
            descriptors=DESCRIPTORS)

    from_pandas = write(tmp_path / "pandas", lambda t: t)
    from_spark = write(tmp_path / "spark", lambda t: spark.createDataFrame(t))
    assert _stored(from_spark, "op") == _stored(from_pandas, "op")
    subtasks = weir.load_checkpoint(from_spark).metadata.operators["op"].subtasks
    assert len(subtasks) == 3 and all(s.keyed is not None for s in subtasks)
    reader = weir.read_state(from_spark)
    count = reader.keyed_state("op", "count")
    assert dict(zip(count["key"], count["value"], strict=True)) == dict(
        zip(KEYS, range(60), strict=True))
    assert len(reader.timers("op")) == len(TIMERS)


@pytest.mark.spark
def test_a_spark_table_and_a_pandas_table_and_a_base_together(
    spark: Any, tmp_path: Path, no_collect: None
) -> None:
    """A rewrite of a base: one state from Spark replaces the base's, one from pandas
    is added, the rest of the base is kept, at a new parallelism."""
    base = weir.write_savepoint(tmp_path / "base", uid="op", max_parallelism=32,
                                parallelism=2, states=dict(TABLES), descriptors=DESCRIPTORS)
    doubled = TABLES["count"].assign(value=TABLES["count"]["value"] * 2)
    rewritten = weir.write_savepoint(
        tmp_path / "new", uid="op", base=base, parallelism=4,
        states={"count": spark.createDataFrame(doubled),
                "seen": TABLES["seen"].head(0)})
    reader = weir.read_state(rewritten)
    count = reader.keyed_state("op", "count")
    assert dict(zip(count["key"], count["value"], strict=True)) == dict(
        zip(KEYS, [2 * n for n in range(60)], strict=True))
    assert reader.keyed_state("op", "seen").empty
    by_tag = reader.keyed_state("op", "by_tag")
    assert len(by_tag) == len(TABLES["by_tag"])
    assert weir.load_checkpoint(rewritten).metadata.operators["op"].parallelism == 4


@pytest.mark.spark
def test_an_executors_error_is_raised_as_weirs(spark: Any, tmp_path: Path) -> None:
    twice = pd.concat([TABLES["count"], TABLES["count"].head(1)])
    with pytest.raises(weir.ConfigurationError, match="two rows for the same key"):
        weir.write_savepoint(tmp_path / "dup", uid="op", max_parallelism=32, parallelism=2,
                             states={"count": spark.createDataFrame(twice)},
                             descriptors=[COUNT])
    gaps = TABLES["seen"].assign(index=TABLES["seen"]["index"] * 2)
    with pytest.raises(weir.ConfigurationError, match=r"indexes 0\.\.n-1"):
        weir.write_savepoint(tmp_path / "gaps", uid="op", max_parallelism=32, parallelism=2,
                             states={"seen": spark.createDataFrame(gaps)}, descriptors=[SEEN])
    assert not (tmp_path / "dup").exists() and not (tmp_path / "gaps").exists()
    assert not list(tmp_path.iterdir())  # no staging directory left either
