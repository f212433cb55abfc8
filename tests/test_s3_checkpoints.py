"""Checkpoint storage on ``s3://`` against real S3-compatible servers: SeaweedFS (a
``weed mini`` of this test process, :mod:`s3_support`) and moto's server. The
compare-and-set of the storage (``If-None-Match: *``) has exactly one winner among
racing writers on both; a claim of a stage likewise. Both runtimes checkpoint on
SeaweedFS, restore after a failure exactly once, and retention deletes only the
checkpoints it wrote. Never mocks: every request goes to a server on 127.0.0.1."""

from __future__ import annotations

import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import weir
from continuous_helpers import Count, by_value, completed, wait_for
from weir.checkpoint.ownership import QUERY, Lineage
from weir.checkpoint.storage import CheckpointStorage
from weir.connectors.stream import FileSink, SequenceSource, read_stream_sink
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

MOTO_BUCKET = "weir-moto"


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def moto_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (ephemeral port) holding one bucket."""
    from s3_support import moto_s3

    with moto_s3(MOTO_BUCKET) as endpoint:
        yield endpoint


@pytest.fixture(params=["seaweedfs", "moto"])
def s3(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """(a fresh ``s3://`` root, its storage options) on each server."""
    if request.param == "seaweedfs":
        server = request.getfixturevalue("seaweed")
        return server.url(), server.storage_options
    endpoint = request.getfixturevalue("moto_server")
    return f"s3://{MOTO_BUCKET}/{uuid.uuid4().hex}", {
        "key": "testing", "secret": "testing", "endpoint_url": endpoint,
        "client_kwargs": {"region_name": "us-east-1"}}


def own_storage(url: str, options: dict[str, Any]) -> CheckpointStorage:
    """A storage with a filesystem (and connection pool) of its own, like another process."""
    return CheckpointStorage(url, storage_options={**options, "skip_instance_cache": True})


def race(n: int, attempt: Any) -> list[Any]:
    """Run ``attempt(i)`` in ``n`` threads released together; their results (an
    exception is re-raised)."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(30)
            results[i] = attempt(i)
        except BaseException as exc:  # (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


# ------------------------------------------------------------------ compare-and-set


def test_the_test_servers_listen_below_the_kernels_ephemeral_ports() -> None:
    """A server's port is chosen free and bound later; a port of the ephemeral range can
    be given to an outgoing connection in between (weed mini once failed so), a port
    below it cannot. Ports and their second port (+10000) are free, distinct, and not
    chosen twice."""
    import socket

    from weir.examples._kafka_broker import _ephemeral_low, listen_port

    low = _ephemeral_low()
    taken: set[int] = set()
    pairs = [listen_port(taken, also=10_000) for _ in range(20)]
    assert len(taken) == 40 and all(p + 10_000 < low for p in pairs)
    with socket.socket() as held:
        held.bind(("127.0.0.1", pairs[0]))  # (still free: nothing binds until asked)
    assert listen_port() < low


def test_an_exclusive_create_of_an_existing_object_is_false_not_an_error(
    s3: tuple[str, dict[str, Any]]
) -> None:
    url, options = s3
    storage = own_storage(url, options)
    assert storage.create_exclusive("claims/0000000001.json", b"first")
    assert storage.create_exclusive("claims/0000000001.json", b"second") is False
    assert storage.read_bytes("claims/0000000001.json") == b"first"
    # a plain write still replaces (what compare-and-set is not for)
    storage.write("plain", b"a")
    storage.write("plain", b"b")
    assert storage.read_bytes("plain") == b"b"


def test_racing_exclusive_creators_have_exactly_one_winner(
    s3: tuple[str, dict[str, Any]]
) -> None:
    """8 writers (each with its own connections) race for each of 5 names: exactly one
    gets True per name, and the object holds the winner's bytes."""
    url, options = s3
    storages = [own_storage(url, options) for _ in range(8)]
    for round_ in range(5):
        name = f"race/{round_}/_metadata"
        won = race(8, lambda i, name=name: storages[i].create_exclusive(
            name, f"writer {i}".encode()))
        assert won.count(True) == 1, won
        assert storages[0].read_bytes(name) == f"writer {won.index(True)}".encode()


def test_racing_claims_of_a_stage_have_exactly_one_owner(
    s3: tuple[str, dict[str, Any]]
) -> None:
    """6 drivers claim the same next token of a stage at once: one owns it, the others
    learn they lost (None) and read the winner's claim; its release is written once."""
    url, options = s3
    lineages = [Lineage(own_storage(url, options)) for _ in range(6)]
    claims = race(6, lambda i: lineages[i].try_claim(
        1, QUERY, f"query-{i}", None, None, "", "test"))
    winners = [c for c in claims if c is not None]
    assert len(winners) == 1, claims
    head = lineages[0].head()
    assert head is not None and head.query == winners[0].query and head.token == 1
    assert lineages[3].is_head(1)
    race(6, lambda i: lineages[i].release(1, facts={"by": i}))
    assert lineages[0].released(head)
    assert lineages[0].record(head, "released")["by"] in range(6)


# ------------------------------------------------------------------ continuous runtime


def stream_env(tmp_path: Path, url: str, options: dict[str, Any], n: int,
               rate: float | None) -> StreamEnvironment:
    env = StreamEnvironment(weir.JobConfig(
        url, storage_options=options, parallelism=2, max_parallelism=32,
        checkpointing=CheckpointConfig(interval=200, retained=2),
        restart_strategy=RestartStrategy.fixed_delay(attempts=1, delay="0 s")))
    (env.from_source(SequenceSource(n, rate), uid="numbers")
        .key_by(lambda v: v % 50)
        .process(Count(), uid="count")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    return env


def test_a_continuous_job_on_seaweedfs_restores_a_killed_task_exactly_once(
    seaweed: Any, tmp_path: Path
) -> None:
    """A keyed job checkpointing into ``s3://`` on SeaweedFS: a task SIGKILLed after
    two checkpoints restores from the latest; the output holds every number once, the
    state in the bucket is the oracle's, retention keeps ``retained`` checkpoints, and
    objects weir did not write (in its prefix and next to it) survive."""
    prefix = f"job-{uuid.uuid4().hex[:8]}"
    url = seaweed.url(prefix)
    client = seaweed.client()
    # not weir's: a file of the prefix outside weir's names, a sibling prefix
    foreign = [f"{prefix}/README.txt", f"{prefix}-other/chk-1/_metadata"]
    # weir's: a checkpoint directory a crashed writer left without _metadata
    orphan = f"{prefix}/chk-7/count-0.bin"
    for key in [*foreign, orphan]:
        client.put_object(Bucket=seaweed.bucket, Key=key, Body=b"not weir's")

    n = 30_000
    job = stream_env(tmp_path, url, seaweed.storage_options, n, rate=3_000)
    running = job.execute_async("on-s3", timeout="180 s")
    wait_for(running, "two checkpoints", lambda: completed(running) >= 2, timeout=90)
    local = running._job
    wait_for(running, "the keyed task", lambda: ("count", 1) in local._procs)
    seen = completed(running)
    local._procs[("count", 1)].kill()  # SIGKILL
    wait_for(running, "the restart", lambda: local.attempt == 1, timeout=90)
    wait_for(running, "a checkpoint after the restart",
             lambda: completed(running) > seen, timeout=90)
    result = running.wait(180)
    assert result.restarts == 1

    out = read_stream_sink(tmp_path / "out")
    numbers = Counter(r[1] for r in out)
    assert set(numbers) == set(range(n)) and max(numbers.values()) == 1
    per_key: dict[int, list[int]] = {}
    for key, _, count in out:
        per_key.setdefault(key, []).append(count)
    assert all(sorted(c) == list(range(1, n // 50 + 1)) for c in per_key.values())
    assert not list((tmp_path / "out" / ".pending").iterdir())

    state = weir.read_state(url, storage_options=seaweed.storage_options).keyed_state(
        "count", "count")
    assert dict(zip(state["key"], state["value"], strict=True)) == {
        k: n // 50 for k in range(50)}

    keys = seaweed.keys(prefix + "/")
    checkpoints = sorted({k.split("/")[1] for k in keys
                          if k.split("/")[1].startswith("chk-") and k.endswith("/_metadata")})
    assert len(checkpoints) == 2, checkpoints  # retained=2
    assert not [k for k in keys if ".tmp-" in k]
    assert orphan not in keys
    for key in foreign:
        assert client.get_object(Bucket=seaweed.bucket, Key=key)["Body"].read() == (
            b"not weir's"), key
    # the credentials are in no object weir wrote
    for key in keys:
        body = client.get_object(Bucket=seaweed.bucket, Key=key)["Body"].read()
        assert b"weir-test-secret" not in body, key


# ------------------------------------------------------------------ Spark runtime


@pytest.mark.spark
def test_a_spark_stage_on_seaweedfs_restores_after_a_query_restart(
    spark: Any, seaweed: Any, tmp_path: Path
) -> None:
    """A keyed stage with its checkpoints in ``s3://`` on SeaweedFS: a few batches, the
    query stopped and started again on the same Spark checkpoint; every record out
    once, the last counts the oracle's, the batches' checkpoints in the bucket."""
    from spark_support import KEYED, keyed_records, run, write_file
    from spark_support import Count as SparkCount
    from spark_support import by_value as spark_by_value

    spark_by_value()
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    prefix = f"spark-{uuid.uuid4().hex[:8]}"
    config = weir.JobConfig(storage=seaweed.url(prefix),
                            storage_options=seaweed.storage_options, parallelism=2)

    def build(events: Any) -> Any:
        return weir.spark.process(events, key_by="key", function=SparkCount(),
                                  output_schema="key string, seq long, n long, subtask int",
                                  uid="count", heartbeat=False, config=config)

    n = 1200
    records = keyed_records(0, n, 20)
    for start in range(0, n // 2, 200):
        write_file(tmp_path / "in", records[start:start + 200], KEYED)
    sink = run(spark, tmp_path / "in", "key string, seq long", build, tmp_path / "spark")
    first = len(sink.batches)
    assert first >= 3
    for start in range(n // 2, n, 200):
        write_file(tmp_path / "in", records[start:start + 200], KEYED)
    run(spark, tmp_path / "in", "key string, seq long", build, tmp_path / "spark", sink)
    assert len(sink.batches) > first
    rows = sink.rows()
    assert sorted(r[1] for r in rows) == list(range(n))
    last: dict[str, int] = {}
    for row in rows:
        last[row[0]] = max(last.get(row[0], 0), row[2])
    assert last == dict(Counter(r["key"] for r in records))

    keys = seaweed.keys(prefix + "/")
    assert any(k.endswith("/_metadata") for k in keys), keys[:20]
    assert not [k for k in keys if ".tmp-" in k]
