"""Shared fixtures: every behaviour test runs over both state backends."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

BACKENDS = ("hashmap", "rocksdb")

# Every JVM the tests start (the session's, subprocess drivers', a standalone cluster's
# executors) compiles with C1 only and collects with the serial collector: the suite is
# CPU-bound on 2 cores and its JVMs run short, small jobs, where C2 compilation and the
# parallel collector's threads cost more CPU than they save (measured on four Spark and
# Kafka test files: 16% less CPU, 12% less wall time). Behaviour does not change; the
# benchmarks (bench/) run the JVM's defaults.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long runs (marked ``slow``) first: ``make test`` shares tests out between two
    processes that steal work from each other (``--dist worksteal``), so a long run
    started last would leave one process running it alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The name of a state backend; tests using it run once per backend."""
    return str(request.param)


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """The one SparkSession of this test process (``local[2]``; ``make test`` runs two
    processes, pytest-xdist); tests using it are marked ``spark``. Python workers run
    this interpreter, so they see the project's venv."""
    import os
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import weir.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("weir-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.python.daemon.module", weir.spark.DAEMON)  # as weir.spark.session
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def rocksdb_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """RocksDB's own temp dirs, on tmpfs if possible (opening RocksDB on disk is slow)."""
    shm = Path("/dev/shm")
    use_shm = shm.is_dir() and os.access(shm, os.W_OK)
    base = Path(tempfile.mkdtemp(prefix="weir-model-", dir=shm)) if use_shm else tmp_path
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A real Kafka-protocol broker (noida-db) on a free loopback port for this test
    process (:mod:`kafka_support`); tests make their own topics (``create_topic``)."""
    from kafka_support import Broker

    broker = Broker(tmp_path_factory.mktemp("kafka") / "data")
    broker.start()
    yield broker
    broker.close()


@pytest.fixture
def own_kafka(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A broker of the test's own, for tests that stop or restart it."""
    from kafka_support import Broker

    broker = Broker(tmp_path / "kafka-data")
    broker.start()
    yield broker
    broker.close()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A real S3-compatible server (SeaweedFS ``weed mini``) on free loopback ports for
    this test process (:mod:`s3_support`); tests use their own prefixes of its bucket
    (``seaweed.url()``) with ``seaweed.storage_options``."""
    from s3_support import SeaweedS3

    server = SeaweedS3(tmp_path_factory.mktemp("seaweed") / "data")
    server.start()
    yield server
    server.close()
    server.wipe()
