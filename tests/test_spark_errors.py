"""What a user sees when their function raises on the Spark runtime.

Measured with a program like this module's subprocess test (a query whose function
raises ``KeyError`` on one record, ``weir.spark.session``), lines of its output and how
often the ``KeyError`` is reported, before this module and now:

======================================  ==================  ==================
program                                 before              now
======================================  ==================  ==================
console sink, ``local[2]``, await       418 lines, 7 times  165 lines, 2 times
console sink, ``local[2,4]``, await     656 lines, 11       165 lines, 2
foreachBatch + logging, ``local[2,4]``  587 lines, 9        207 lines, 3
the same, ``supervise(no_restart)``     600 lines, 10       136 lines, 5 (*)
======================================  ==================  ==================

(``local[2,4]``: four attempts per task, as a cluster's ``spark.task.maxFailures``;
(*) the log's one report, and the error raised: ``RestartsExhaustedError`` whose first
line is the user's exception, chained from the ``UserFunctionError``, chained from the
``KeyError``.) Before, each report was the user's traceback under weir's frames
(``task.py``, ``operator.py``) and the raised error Py4J's ``StreamingQueryException``
with it and the query's logical plan.

Now the task raises a :class:`~weir.UserFunctionError` whose message starts with the
user's exception and names the operator, key, record, task and the user's frames
(no weir frame but the one that raises it); the session's log reports the failure once
(the query's error), not per attempt, executor or py4j proxy;
:meth:`UserFunctionError.from_error` gets it back on the driver, chained from the
user's exception rebuilt (a ``KeyError``), and ``supervise`` names it first.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import weir
import weir.spark
from weir.errors import RemoteError, RestartsExhaustedError, UserFunctionError, rebuild_exception

TABLE = {"k0": 0, "k1": 1, "k2": 2}


class Lookup(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Looks the key up in TABLE: KeyError for a key not in it."""

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        yield (value["key"], value["seq"], TABLE[value["key"]])


class PickyLookup(Lookup):
    """Lookup on the per-record path (a ValueError is a bad record; a KeyError is not)."""

    bad_record_exceptions = (ValueError,)


class Ratio(weir.ProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """Not keyed: 1 / (seq - 3)."""

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        yield (value["key"], value["seq"], 1 // (value["seq"] - 3))


class Opener(Lookup):
    """Fails to open."""

    def open(self, ctx: Any) -> None:
        raise RuntimeError("model file /models/lookup.bin is missing")


class Alarm(weir.KeyedProcessFunction[dict[str, Any], tuple[Any, ...]]):
    """An event-time timer 5 after each record; firing it raises."""

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        ctx.timer_service.register_event_time_timer(value["seq"] + 5)
        return ()

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        raise ValueError(f"no alarm configured for {ctx.current_key!r}")


OUT = "key string, seq long, v long"
RECORDS = [{"key": k, "seq": i} for i, k in enumerate(["k0", "k1", "zzz", "k2", "k0"])]


@pytest.fixture(autouse=True)
def _by_value() -> None:
    from pyspark import cloudpickle

    from spark_support import by_value  # type: ignore[import-not-found]

    by_value()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0]


# ------------------------------------------------------------------ real Spark


def _stream(spark: Any, tmp_path: Path, records: list[dict[str, Any]], name: str = "in") -> Any:
    from spark_support import KEYED, write_file  # type: ignore[import-not-found]

    write_file(tmp_path / name, records, KEYED)
    return (spark.readStream.schema("key string, seq long").option("maxFilesPerTrigger", 1)
            .parquet(str(tmp_path / name)))


@pytest.mark.spark
def test_a_key_error_fails_the_query_with_the_users_exception_first(
    spark: Any, tmp_path: Path
) -> None:
    out = weir.spark.process(_stream(spark, tmp_path, RECORDS), key_by="key", function=Lookup(),
                             output_schema=OUT, uid="lookup",
                             config=weir.JobConfig(str(tmp_path / "weir")), parallelism=2,
                             heartbeat=False)
    query = (out.writeStream.foreachBatch(lambda df, b: df.collect())
             .option("checkpointLocation", str(tmp_path / "spark"))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception) as info:  # Spark's StreamingQueryException
        query.awaitTermination()
    text = str(info.value)
    # once in Spark's error, without weir's frames above it (only the one raising it)
    assert text.count("weir.errors.UserFunctionError: KeyError: 'zzz'") == 1
    assert "in _records" not in text and "in process_keyed" not in text
    user = UserFunctionError.from_error(info.value)
    assert user is not None and user.reported_in is info.value
    assert _first_line(user) == (
        "KeyError: 'zzz' (in process_element of operator 'lookup', key 'zzz')")
    assert (user.uid, user.method, user.key) == ("lookup", "process_element", "'zzz'")
    assert user.record == "{'key': 'zzz', 'seq': 2}"
    assert (user.exception_type, user.exception_message) == ("KeyError", "'zzz'")
    assert isinstance(user.__cause__, KeyError) and str(user.__cause__) == "'zzz'"
    assert "    task: subtask " in str(user) and "batch 0" in str(user)
    assert "test_spark_errors.py" in str(user) and 'TABLE[value["key"]]' in str(user)
    assert "weir/runtime" not in str(user)  # the user's frames only
    weir.spark.finish(query)


@pytest.mark.spark
@pytest.mark.parametrize("case", ["per_record", "non_keyed", "open"])
def test_each_users_method_is_named_with_what_is_known(
    spark: Any, tmp_path: Path, case: str
) -> None:
    """Static DataFrames: the per-record path (a function with bad record exceptions), a
    non-keyed function (no key), and ``open`` (no key, no record)."""
    df = spark.createDataFrame([(r["key"], r["seq"]) for r in RECORDS], "key string, seq long")
    function, key_by, first, record = {
        "per_record": (PickyLookup(), "key",
                       "KeyError: 'zzz' (in process_element of operator 'op', key 'zzz')",
                       "{'key': 'zzz', 'seq': 2}"),
        "non_keyed": (Ratio(), None,
                      "ZeroDivisionError: integer division or modulo by zero "
                      "(in process_element of operator 'op')", "{'key': 'k2', 'seq': 3}"),
        "open": (Opener(), "key", "RuntimeError: model file /models/lookup.bin is missing "
                 "(in open of operator 'op')", None),
    }[case]
    out = weir.spark.process(df, key_by=key_by, function=function, output_schema=OUT, uid="op",
                             config=weir.JobConfig(str(tmp_path / "weir")), parallelism=2)
    with pytest.raises(Exception) as info:
        out.collect()
    user = UserFunctionError.from_error(info.value)
    assert user is not None, str(info.value)[:2000]
    assert _first_line(user) == first
    assert user.record == record
    assert "a static DataFrame" in str(user)
    assert isinstance(user.__cause__, (KeyError, ZeroDivisionError, RuntimeError))
    assert type(user.__cause__).__name__ == first.split(":")[0]


@pytest.mark.spark
def test_a_failing_timer_names_its_key_and_time(spark: Any, tmp_path: Path) -> None:
    from spark_support import KEYED, write_file

    write_file(tmp_path / "in", [{"key": "a", "seq": 1}], KEYED)
    write_file(tmp_path / "in", [{"key": "b", "seq": 100}], KEYED)  # watermark 1
    write_file(tmp_path / "in", [{"key": "c", "seq": 200}], KEYED)  # 100: timer 6 fires
    events = (spark.readStream.schema("key string, seq long").option("maxFilesPerTrigger", 1)
              .parquet(str(tmp_path / "in")))
    out = weir.spark.process(events, key_by="key", function=Alarm(), output_schema=OUT,
                             uid="alarm", config=weir.JobConfig(str(tmp_path / "weir")),
                             parallelism=2, event_time="seq", heartbeat=False)
    query = (out.writeStream.foreachBatch(lambda df, b: df.collect())
             .option("checkpointLocation", str(tmp_path / "spark"))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception) as info:
        query.awaitTermination()
    user = UserFunctionError.from_error(info.value)
    assert user is not None
    assert _first_line(user) == ("ValueError: no alarm configured for 'a' "
                                 "(in on_timer of operator 'alarm', key 'a')")
    assert "event-time timer 6" in str(user) and user.record is None
    weir.spark.finish(query)


@pytest.mark.spark
def test_supervise_gives_up_with_the_users_exception_first(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Flink's semantics: a user's exception is restarted as the strategy allows (here
    once); the restart's WARNING and the final error name it first, and the final error
    is chained from it (rebuilt: UserFunctionError, then the KeyError)."""
    import logging

    out = weir.spark.process(_stream(spark, tmp_path, RECORDS), key_by="key", function=Lookup(),
                             output_schema=OUT, uid="lookup",
                             config=weir.JobConfig(str(tmp_path / "weir")), parallelism=2,
                             heartbeat=False)
    starts: list[int] = []

    def start() -> Any:
        starts.append(1)
        return (out.writeStream.foreachBatch(lambda df, b: df.collect()).queryName("lookups")
                .option("checkpointLocation", str(tmp_path / "spark"))
                .trigger(availableNow=True).start())

    sleeps: list[float] = []
    with caplog.at_level(logging.WARNING, logger="weir"), \
            pytest.raises(RestartsExhaustedError) as info:
        weir.spark.supervise(start, restart=weir.RestartStrategy.fixed_delay(
            attempts=1, delay="1 s"), sleep=sleeps.append, poll_s=0.2)
    assert len(starts) == 2 and sleeps == [1.0]
    first = _first_line(info.value)
    assert first.startswith("KeyError: 'zzz' (in process_element of operator 'lookup', "
                            "key 'zzz'): streaming query 'lookups'")
    assert "after 1 restart(s)" in first
    cause = info.value.__cause__
    assert isinstance(cause, UserFunctionError) and cause.uid == "lookup"
    assert isinstance(cause.__cause__, KeyError)
    assert cause.__suppress_context__  # Spark's error is not printed with it
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "weir" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].endswith("UserFunctionError: KeyError: 'zzz' (in process_element of "
                                "operator 'lookup', key 'zzz')")
    assert not spark.streams.active


_SCRIPT = '''
import json, sys, tempfile
from pathlib import Path
import weir, weir.spark

class Lookup(weir.KeyedProcessFunction):
    def process_element(self, value, ctx):
        table = {"a": 1, "b": 2}
        yield (value["key"], table[value["key"]])

tmp = Path(sys.argv[1])
(tmp / "in").mkdir()
(tmp / "in" / "0.json").write_text("\\n".join(
    json.dumps({"key": k, "seq": i}) for i, k in enumerate(["a", "b", "zzz", "a"])))
spark = weir.spark.session("local[2,4]")  # four attempts per task, as on a cluster
spark.sparkContext.setLogLevel("WARN")
events = spark.readStream.schema("key string, seq long").json(str(tmp / "in"))
out = weir.spark.process(events, key_by="key", function=Lookup(),
                         output_schema="key string, v long", uid="lookup",
                         config=weir.JobConfig(str(tmp / "weir")), parallelism=2,
                         heartbeat=False)
query = (out.writeStream.format("console").option("checkpointLocation", str(tmp / "spark"))
         .trigger(availableNow=True).start())
query.awaitTermination()
'''


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("WEIR_SOAK"), reason="its own JVM: make soak (the "
                    "in-process tests above show the same in make test)")
def test_the_output_of_a_failed_query_reports_the_users_exception_once(tmp_path: Path) -> None:
    """A program of its own (its own JVM: what a user's terminal shows), a query whose
    function raises on one record, four attempts per task: Spark's log reports the
    failure once (the query's error) and the program's exception once."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    lines = output.splitlines()
    assert done.returncode != 0 and "StreamingQueryException" in output, output[-3000:]
    assert "failed 4 times" in output  # the attempts did happen
    # the user's exception: in the query's error in the log, and in the one raised
    assert output.count("weir.errors.UserFunctionError: KeyError: 'zzz'") == 2, output
    assert not [line for line in lines if "Lost task" in line or "Aborting task" in line]
    assert len(lines) < 250, (len(lines), time.monotonic() - started)  # was 656


# ------------------------------------------------------------------ no Spark


def _raise_in_user_code() -> UserFunctionError:
    def lookup(value: dict[str, Any]) -> int:
        return TABLE[value["key"]]

    try:
        lookup({"key": "zzz", "payload": "x" * 500})
    except KeyError as exc:
        return UserFunctionError.of(exc, uid="lookup", method="process_element", key="zzz",
                                    keyed=True, record={"key": "zzz", "payload": "x" * 500},
                                    has_record=True, task="subtask 1 of 2, query q, batch 7")
    raise AssertionError("no KeyError")


def test_the_message_starts_with_the_users_exception_and_survives_the_text() -> None:
    error = _raise_in_user_code()
    lines = str(error).splitlines()
    assert lines[0] == "KeyError: 'zzz' (in process_element of operator 'lookup', key 'zzz')"
    assert lines[1].startswith("    record: {'key': 'zzz', 'payload': 'xxxx") and "..." in lines[1]
    assert len(lines[1]) < 150  # a short repr of the record
    assert lines[2] == "    task: subtask 1 of 2, query q, batch 7"
    assert "in lookup" in lines[-2] and 'return TABLE[value["key"]]' in lines[-1]
    # Spark reports it as text; the driver gets the same error back
    spark_text = (f"[PYTHON_EXCEPTION] An exception was thrown from the Python worker: "
                  f"Traceback (most recent call last):\n  File \"task.py\", line 9, in run\n"
                  f"    raise ...\nweir.errors.UserFunctionError: {error}\n SQLSTATE: 38000\n"
                  f"\tat org.apache.spark.api.python.BasePythonRunner...")
    found = UserFunctionError.from_error(spark_text)
    assert found is not None and str(found) == str(error)
    assert (found.uid, found.method, found.key, found.record) == (
        error.uid, error.method, error.key, error.record)
    assert (found.exception_type, found.exception_message) == ("KeyError", "'zzz'")
    assert isinstance(found.__cause__, KeyError) and str(found.__cause__) == "'zzz'"
    assert UserFunctionError.from_error("a Spark error of something else") is None
    copy = pickle.loads(pickle.dumps(found))
    assert str(copy) == str(found) and copy.uid == "lookup"


def test_a_multi_line_message_and_an_unknown_type() -> None:
    class BadRecord(Exception):
        pass

    try:
        raise BadRecord("line one\nline two")
    except BadRecord as exc:
        error = UserFunctionError.of(exc, uid="u", method="process_element")
    lines = str(error).splitlines()
    assert lines[0].endswith("BadRecord: line one (in process_element of operator 'u')")
    assert lines[1] == "    line two"
    found = UserFunctionError.from_error(f"weir.errors.UserFunctionError: {error}\nafter")
    assert found is not None and found.exception_message == "line one\nline two"
    # a type this process cannot name (a local class): a RemoteError, not a guess
    assert isinstance(found.__cause__, RemoteError)
    assert str(found.__cause__) == f"{found.exception_type}: line one\nline two"


def test_rebuilt_exceptions_are_of_their_own_type() -> None:
    key = rebuild_exception("KeyError", "'zzz'", ["raised in task lookup[0]"])
    assert isinstance(key, KeyError) and str(key) == "'zzz'"
    assert key.__notes__ == ["raised in task lookup[0]"]  # type: ignore[attr-defined]
    config = rebuild_exception("ConfigurationError", "bad")
    assert isinstance(config, weir.ConfigurationError) and isinstance(config, ValueError)
    sink = rebuild_exception("weir.errors.SinkError", "gone")
    assert isinstance(sink, weir.SinkError) and str(sink) == "gone"
    here = rebuild_exception(f"{__name__}.Lookup", "not an exception")
    assert isinstance(here, RemoteError)
    assert isinstance(pickle.loads(pickle.dumps(key)), KeyError)


def test_only_exceptions_raised_through_the_users_methods_are_theirs() -> None:
    """A task wraps an exception as the user's only if a frame of the function's class
    (its own methods or a user base class's, not weir's API) is in its traceback."""
    from weir.runtime.spark.user_errors import user_codes

    codes = user_codes(PickyLookup)
    assert Lookup.process_element.__code__ in codes
    assert weir.KeyedProcessFunction.on_timer.__code__ not in codes
    assert Opener.open.__code__ in user_codes(Opener)


def test_py4j_s_report_of_a_foreach_batch_failed_by_a_weir_function_is_dropped() -> None:
    """A ``foreachBatch`` function whose batch failed because a weir function raised:
    py4j logs it at ERROR with its traceback (shown by any program that configured
    logging); the query's failure reports it already, so ``report_failures_once``
    (``weir.spark.session``) drops that record, and only that one."""
    import logging

    from weir.runtime.spark import supervise as supervise_module

    class NoJvm:  # (a Spark Connect session: no py4j JVM)
        pass

    assert supervise_module.report_failures_once(NoJvm()) is False
    supervise_module.report_failures_once(NoJvm())  # (once)
    py4j = logging.getLogger("py4j.clientserver")
    filters = [f for f in py4j.filters if isinstance(f, supervise_module._ReportedByTheQuery)]
    assert len(filters) == 1

    def record(error: BaseException | None) -> logging.LogRecord:
        exc_info = (type(error), error, None) if error is not None else None
        return py4j.makeRecord("py4j.clientserver", logging.ERROR, __file__, 1,
                               "There was an exception while executing the Python Proxy "
                               "on the Python Side.", (), exc_info)

    weirs = RuntimeError("An exception was thrown from the Python worker: ...\n"
                         "weir.errors.UserFunctionError: KeyError: 'zzz' (in ...)")
    assert not filters[0].filter(record(weirs))
    assert filters[0].filter(record(RuntimeError("the user's sink failed")))
    assert filters[0].filter(record(None))
