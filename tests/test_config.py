"""One way to configure a job on either runtime (issue 39): the configuration objects,
durations read the same way everywhere, process-wide resources that no stage resizes,
and the keyword arguments of earlier releases still working with a warning."""

from __future__ import annotations

import inspect
import re
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import weir
import weir.spark
from weir.api.durations import byte_size, duration_ms
from weir.errors import ConfigurationError
from weir.runtime.spark.options import EventTime, legacy_arguments
from weir.state.rocksdb_options import RocksDBMemory
from weir.stream import StreamEnvironment
from weir.testing import KeyedOperatorHarness

# ------------------------------------------------------------------ durations


SETTERS: dict[str, Any] = {
    "CheckpointConfig.interval": lambda d: weir.CheckpointConfig(d).interval,
    "CheckpointConfig.timeout": lambda d: weir.CheckpointConfig(timeout=d).timeout,
    "CheckpointConfig.lease_timeout": lambda d: weir.CheckpointConfig(lease_timeout=d)
    .lease_timeout,
    "JobConfig.dead_letter_retention": lambda d: weir.JobConfig(
        "/tmp/x", dead_letter_retention=d).dead_letter_retention,
    "EventTime.watermark_delay": lambda d: timedelta(
        milliseconds=EventTime("ts", watermark_delay=d).watermark_delay_ms),
    "RestartStrategy.fixed_delay": lambda d: timedelta(
        seconds=weir.RestartStrategy.fixed_delay(delay=d).delay),
    "execute(timeout)": lambda d: timedelta(seconds=_timeout(d)),
}


def _timeout(value: Any) -> float:
    from weir.runtime.continuous.settings import timeout_seconds

    seconds = timeout_seconds(value)
    assert seconds is not None
    return seconds


@pytest.mark.parametrize("setting", sorted(SETTERS))
@pytest.mark.parametrize("given", ["90 s", "1.5 min", timedelta(seconds=90), "90000 ms"])
def test_every_duration_setting_reads_strings_and_timedeltas_the_same_way(
    setting: str, given: Any
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these is deprecated
        assert SETTERS[setting](given) == timedelta(seconds=90)


@pytest.mark.parametrize("setting", sorted(set(SETTERS) - {
    "RestartStrategy.fixed_delay", "execute(timeout)"}))
def test_an_int_duration_is_milliseconds(setting: str) -> None:
    assert SETTERS[setting](90_000) == timedelta(seconds=90)


@pytest.mark.parametrize("setting", ["RestartStrategy.fixed_delay", "execute(timeout)"])
def test_a_bare_number_where_seconds_were_read_still_is_seconds_with_a_warning(
    setting: str
) -> None:
    with pytest.warns(DeprecationWarning, match="bare number as seconds is deprecated"):
        assert SETTERS[setting](90) == timedelta(seconds=90)


@pytest.mark.parametrize("bad", ["ten seconds", "10 parsecs", -1, True, None, 1.5])
def test_a_bad_duration_says_what_a_duration_is(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"must be a duration: a datetime\.timedelta, "
                                                 r"a string with a unit like '10 s'"):
        duration_ms(bad, "watermark_delay")


def test_sizes_read_like_sparks_memory_settings() -> None:
    assert byte_size("512m", "x") == 512 << 20 and byte_size("2g", "x") == 2 << 30
    assert weir.RocksDBStateBackend("64m").memory == 64 << 20
    with pytest.raises(ConfigurationError, match="at least 8 MiB"):
        weir.RocksDBStateBackend("1m")


# ------------------------------------------------------------------ the objects


def test_a_job_config_holds_the_settings_of_both_runtimes_with_flinks_defaults() -> None:
    config = weir.JobConfig("/data/ckpt")
    assert config.state_backend == weir.HashMapStateBackend()
    assert config.checkpointing == weir.CheckpointConfig()
    assert config.effective_restart_strategy() == weir.RestartStrategy.no_restart()
    periodic = weir.JobConfig("/data/ckpt", checkpointing=weir.CheckpointConfig("1 s"))
    assert periodic.effective_restart_strategy() == weir.RestartStrategy.exponential_delay()
    assert (config.parallelism, config.max_parallelism, config.restore_from) == (
        None, None, None)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"state_backend": "memory"}, "weir.HashMapStateBackend() or weir.RocksDBStateBackend"),
    ({"max_parallelism": 40_000}, "max_parallelism=40000 must be an int in [1, 32768]"),
    ({"checkpointing": {"interval": 1}}, "checkpointing must be a weir.CheckpointConfig"),
    ({"restart_strategy": "always"}, "restart_strategy must be a weir.RestartStrategy"),
    ({"parallelism": 0}, "parallelism=0 must be a positive int"),
    ({"parallelism": 4, "max_parallelism": 2}, "parallelism=4 is above max_parallelism=2"),
    ({"restore_from": ""}, "restore_from must be the path or URL"),
    ({"storage_options": ["anon"]}, "storage_options must be a mapping"),
])
def test_a_bad_job_config_says_what_is_allowed(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(says)):
        weir.JobConfig("/data/ckpt", **kwargs)


def test_the_snapshot_strategy_defaults_by_backend_the_same_on_both_runtimes() -> None:
    default = weir.CheckpointConfig()
    assert default.snapshot_for("hashmap") is weir.SnapshotStrategy.CHANGELOG
    assert default.snapshot_for("rocksdb") is weir.SnapshotStrategy.INCREMENTAL
    incremental = weir.CheckpointConfig(snapshot=weir.SnapshotStrategy.INCREMENTAL)
    assert incremental.snapshot_for("rocksdb") is weir.SnapshotStrategy.INCREMENTAL
    # the hash map has no files to share: full snapshots (as Flink's HashMapStateBackend)
    assert incremental.snapshot_for("hashmap") is weir.SnapshotStrategy.FULL


def test_weir_spark_process_keeps_the_operators_meaning_in_at_most_a_dozen_parameters() -> None:
    parameters = inspect.signature(weir.spark.process).parameters
    assert len(parameters) <= 12, list(parameters)
    assert list(parameters)[:7] == ["df", "key_by", "function", "output_schema", "uid",
                                    "config", "parallelism"]


# ------------------------------------------------------------------ earlier releases


def test_the_old_process_keywords_map_onto_the_objects_with_one_warning_naming_each() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        legacy = legacy_arguments(None, "ts", None, {
            "checkpoint_location": "/data/ckpt", "state_backend": "rocksdb",
            "rocksdb_memory": "64m", "rocksdb_cache_entries": 10, "retained": 5,
            "snapshot_mode": "full", "watermark_delay": "5 s", "late_records": "drop",
            "max_parallelism": 64, "task_buffer_memory": "8m"})
    assert len(caught) == 1
    message = str(caught[0].message)
    for replacement in ("weir.JobConfig(storage=", "weir.RocksDBStateBackend(memory=",
                        "weir.CheckpointConfig(retained=", "spark.weir.task.bufferMemory",
                        "EventTime(column, watermark_delay="):
        assert replacement in message, replacement
    config = legacy.config
    assert config.storage == "/data/ckpt" and config.max_parallelism == 64
    assert config.state_backend == weir.RocksDBStateBackend("64m", cache_entries=10)
    assert config.checkpointing.retained == 5
    assert config.checkpointing.snapshot is weir.SnapshotStrategy.FULL
    assert legacy.event_time == EventTime("ts", "5 s", weir.LateRecords.DROP)
    assert legacy.resources == {"task_buffer_memory": "8m"}
    with pytest.raises(TypeError, match="unexpected keyword"):
        legacy_arguments(None, None, None, {"checkpoint_locaton": "/x"})


def test_the_old_environment_keywords_still_work_with_a_warning(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match=r"StreamEnvironment\(checkpoint_storage=, "
                                                r"parallelism=, state_backend=\) is deprecated"):
        env = StreamEnvironment(checkpoint_storage=str(tmp_path), parallelism=2,
                                state_backend="rocksdb")
    assert (env.parallelism, env.max_parallelism, env.state_backend) == (2, 128, "rocksdb")
    with pytest.raises(ConfigurationError, match=r"needs a weir\.JobConfig"):
        StreamEnvironment()
    new = StreamEnvironment(weir.JobConfig(tmp_path, parallelism=3,
                                           state_backend=weir.RocksDBStateBackend("32m")))
    assert (new.parallelism, new.state_backend) == (3, "rocksdb")
    assert new.rocksdb_memory is not None and new.rocksdb_memory.total_bytes == 32 << 20


# ------------------------------------------------------------------ resources


class _Count(weir.KeyedProcessFunction[Any, Any]):
    def open(self, ctx: Any) -> None:
        self.n = ctx.get_state(weir.ValueStateDescriptor("n", weir.IntSerializer()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.n.update((self.n.value() or 0) + 1)
        return [value]


def _capacities(harness: KeyedOperatorHarness) -> set[int]:
    db = harness.operator.backend
    families = [db._db, *(db._family(name) for name in ("n",))]
    return {cf.property_int_value("rocksdb.block-cache-capacity") for cf in families}


def test_two_stages_with_different_rocksdb_settings_in_one_process_keep_their_own(
    tmp_path: Path,
) -> None:
    """Before issue 39 the process had one block cache, resized to the budget of
    whichever stage opened a database last: a second stage shrank the first's cache."""
    small, large = (RocksDBMemory.of(weir.RocksDBStateBackend(m, cache_entries=c))
                    for m, c in (("16m", 10), ("48m", 1000)))
    first = KeyedOperatorHarness(_Count(), lambda v: v, state_backend="rocksdb",
                                 rocksdb_path=tmp_path / "a", rocksdb_memory=small)
    second = KeyedOperatorHarness(_Count(), lambda v: v, state_backend="rocksdb",
                                  rocksdb_path=tmp_path / "b", rocksdb_memory=large)
    try:
        first.open()
        first.process_elements(range(100))
        second.open()  # the second stage opens after the first, in the same process
        second.process_elements(range(100))
        first.process_elements(range(100, 200))
        assert _capacities(first) == {16 << 20}
        assert _capacities(second) == {48 << 20}
        assert first.operator.backend.memory.cache_entries == 10
        assert second.operator.backend.memory.cache_entries == 1000
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize(("name", "replacement"), [
    ("SnapshotMode", "weir.SnapshotStrategy"),
    ("StateBackendKind", "weir.HashMapStateBackend()"),
    ("RocksDBMemory", "weir.RocksDBStateBackend(memory=...)"),
    ("OperatorConfig", "weir.testing"),
    ("SubtaskCheckpointer", "weir.testing"),
])
def test_internal_names_left_weirs_public_names_and_warn_for_one_release(
    name: str, replacement: str
) -> None:
    assert name not in weir.__all__
    with pytest.warns(DeprecationWarning, match=re.escape(replacement)):
        assert getattr(weir, name) is not None
