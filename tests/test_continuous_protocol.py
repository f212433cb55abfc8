"""The continuous runtime keeps exactly-once through what users do, on the one
checkpoint protocol (:mod:`weir.checkpoint.protocol`): each test is one situation of
issue 38 that used to duplicate or lose committed output, and ends exactly-once
(lost = duplicated = keys with a wrong count = 0 against the oracle, the injected
failure counted) or in the specific clear error. Where each situation is tested:

1  upgrade from a stop savepoint, same storage     here (both backends)
2  a savepoint of a running job, then a failure    here (both backends)
3  a failed savepoint in a directory with others   here (and exact targets)
4  two sinks (or dead letters) on one directory    test_continuous_protocol_sinks.py
5  a union reordered with records in flight        test_continuous_protocol_channels.py
6  a corrupt newest checkpoint                     here
7  two drivers on one storage                      here: refused; a hung driver taken over
                                                   and fenced (both backends). On Spark:
                                                   test_continuous_spark_cluster.py (driver
                                                   killed, new application at once)
8  a consumer moving committed files away          test_continuous_protocol_sinks.py
9  ENOSPC on ``_metadata``; a failed discard       here
10 a wall-clock step                               test_continuous_protocol_time.py
11 invalid settings; no deadline by default        test_continuous_protocol_time.py
12 event time switched with records in flight;     test_continuous_protocol_channels.py;
   a sink path Spark executors do not share        test_continuous_spark.py
13 a fresh start onto a used sink                  test_continuous_protocol_sinks.py; after
                                                   a cancel that deleted the checkpoints: here
14 every input idle: event time goes on            test_continuous_event_time.py (job),
                                                   test_continuous_protocol_idle.py (valve)
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import weir
from continuous_helpers import Count, Running, by_value, completed, lost_duplicated_wrong, wait_for
from weir.checkpoint.coordinator import load_checkpoint
from weir.checkpoint.ownership import Lineage
from weir.checkpoint.storage import CheckpointStorage
from weir.connectors import FileSink, SequenceSource, read_stream_sink
from weir.errors import (
    CheckpointError,
    CorruptCheckpointError,
    OwnershipError,
)
from weir.runtime.continuous.master import LocalJob
from weir.stream import (
    CheckpointConfig,
    RestartStrategy,
    StreamEnvironment,
)

BACKENDS = ["hashmap", "rocksdb"]
KEYS = 50  # (Count's: n % 50)


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


def fail_once_if(marker: Path) -> Callable[[int], int]:
    """Passes records on; raises once (in one subtask) after ``marker`` appears."""
    def check(value: int) -> int:
        if marker.exists():
            try:
                marker.unlink()
            except FileNotFoundError:
                return value  # another subtask took it
            raise RuntimeError("injected failure")
        return value
    return check


class FailingSnapshot(weir.ProcessFunction[int, int], weir.CheckpointedFunction):
    """Passes records on; its snapshot raises once after ``marker`` appears."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def initialize_state(self, ctx: Any) -> None:
        pass

    def snapshot_state(self, ctx: Any) -> None:
        if self.marker.exists():
            try:
                self.marker.unlink()
            except FileNotFoundError:
                return
            raise RuntimeError("injected snapshot failure")

    def process_element(self, value: int, ctx: Any) -> Any:
        yield value


def counting_job(tmp_path: Path, n: int, *, rate: float | None = 5_000,
                 backend: str = "hashmap", interval_ms: int = 100,
                 tolerable_failures: int = 0, retain_on_cancel: bool = False,
                 restart: Any = None, marker: Path | None = None,
                 snapshot_marker: Path | None = None) -> StreamEnvironment:
    """numbers -> (fail once) -> key_by(n % 50) -> Count -> FileSink(tmp_path/out),
    checkpoints in tmp_path/chk."""
    env = StreamEnvironment(weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                                           state_backend=backend,
                                           checkpointing=CheckpointConfig(interval=interval_ms,
                                       tolerable_failures=tolerable_failures,
                                       retain_on_cancel=retain_on_cancel),
                                       restart_strategy=restart or RestartStrategy.no_restart()))
    stream = env.from_source(SequenceSource(n, rate), uid="numbers")
    if marker is not None:
        stream = stream.map(fail_once_if(marker))
    if snapshot_marker is not None:
        stream = stream.process(FailingSnapshot(snapshot_marker), uid="snapshots")
    (stream.key_by(lambda v: v % KEYS)
        .process(Count(), uid="count")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    return env


def committed(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "out").glob("part-*"))


# ---------------------------------------------------------------- 1. upgrade


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_upgrade_from_a_stop_savepoint_on_the_same_storage_restores_the_savepoint(
        tmp_path: Path, backend: str) -> None:
    n = 30_000
    first = counting_job(tmp_path, n, backend=backend).execute_async("upgrade")
    wait_for(first, "two checkpoints", lambda: completed(first) >= 2)
    savepoint = first.stop_with_savepoint(tmp_path / "savepoints")
    first.wait(60)
    savepoint_id = load_checkpoint(savepoint).checkpoint_id
    older = [int(p.parent.name[4:]) for p in (tmp_path / "chk").glob("chk-*/_metadata")]
    assert older and max(older) < savepoint_id  # the storage's checkpoints are older

    second = counting_job(tmp_path, n, rate=None, backend=backend).execute(
        "upgrade", restore_from=savepoint)
    assert second.restored[0].startswith(f"restore_from {savepoint}")
    assert min(second.completed) > savepoint_id  # ids never repeat
    assert lost_duplicated_wrong(read_stream_sink(tmp_path / "out"), n) == (0, 0, 0)


def test_after_a_stop_savepoint_the_next_run_on_the_storage_goes_on_from_it(
        tmp_path: Path) -> None:
    n = 30_000
    first = counting_job(tmp_path, n).execute_async("again")
    wait_for(first, "two checkpoints", lambda: completed(first) >= 2)
    savepoint = first.stop_with_savepoint(tmp_path / "savepoints")
    first.wait(60)
    # no restore_from: the storage's state is the savepoint it stopped with (its output
    # is committed), not the older checkpoint before it
    second = counting_job(tmp_path, n, rate=None).execute("again")
    assert second.restored[0].startswith("the savepoint run") and savepoint in second.restored[0]
    assert lost_duplicated_wrong(read_stream_sink(tmp_path / "out"), n) == (0, 0, 0)


# ---------------------------------------------------------------- 2. intermediate savepoint


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_savepoint_of_a_running_job_commits_nothing_and_is_no_recovery_point(
        tmp_path: Path, backend: str) -> None:
    n = 20_000
    marker = tmp_path / "fail"
    client = counting_job(tmp_path, n, rate=2_000, interval_ms=3_600_000, marker=marker,
                          backend=backend,
                          restart=RestartStrategy.fixed_delay(1, 0.0)).execute_async("sp")
    pending = tmp_path / "out" / ".pending"
    wait_for(client, "records written", lambda: pending.exists() and any(pending.iterdir()))
    savepoint = client.trigger_savepoint(tmp_path / "savepoints")
    assert load_checkpoint(savepoint).metadata.kind.name == "SAVEPOINT"
    assert committed(tmp_path) == []  # a savepoint commits no side effects
    marker.touch()
    result = client.wait(120)
    assert result.restarts == 1 and "injected failure" in result.failures[0]
    assert result.restored[-1].startswith("empty state")  # not the savepoint
    assert lost_duplicated_wrong(read_stream_sink(tmp_path / "out"), n) == (0, 0, 0)


# ---------------------------------------------------------------- 3. savepoint placement


def test_a_failed_savepoint_deletes_only_its_own_fresh_directory(tmp_path: Path) -> None:
    n = 20_000
    marker = tmp_path / "fail-snapshot"
    target = tmp_path / "savepoints"
    (target / "notes").mkdir(parents=True)
    (target / "notes" / "keep.txt").write_text("not weir's")
    client = counting_job(tmp_path, n, rate=2_000, interval_ms=3_600_000,
                          snapshot_marker=marker,
                          restart=RestartStrategy.fixed_delay(1, 0.0)).execute_async("fail")
    pending = tmp_path / "out" / ".pending"
    wait_for(client, "records written", lambda: pending.exists() and any(pending.iterdir()))
    earlier = client.trigger_savepoint(target)
    marker.touch()
    with pytest.raises(CheckpointError):
        client.trigger_savepoint(target)
    assert not marker.exists()  # the failure was injected
    result = client.wait(120)
    assert result.restarts == 1 and "injected snapshot failure" in result.failures[0]
    assert (target / "notes" / "keep.txt").read_text() == "not weir's"
    assert sorted(p.name for p in target.iterdir()) == sorted(["notes", Path(earlier).name])
    assert load_checkpoint(earlier).metadata.kind.name == "SAVEPOINT"  # intact
    assert lost_duplicated_wrong(read_stream_sink(tmp_path / "out"), n) == (0, 0, 0)


def test_an_exact_savepoint_target_must_be_new_or_empty(tmp_path: Path) -> None:
    coordinator = weir.CheckpointCoordinator(tmp_path / "chk")
    (tmp_path / "sp").mkdir()
    (tmp_path / "sp" / "other.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not empty"):
        coordinator.trigger_savepoint(tmp_path / "sp")
    assert (tmp_path / "sp" / "other.txt").read_text() == "x"


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_written_savepoint_directory_never_deletes_what_it_did_not_write(
        tmp_path: Path, where: str) -> None:
    from weir.checkpoint.publish import write_new_directory

    root = str(tmp_path) if where == "local" else f"memory://protocol-{os.getpid()}-{id(tmp_path)}"
    held = CheckpointStorage(f"{root}/held")
    held.write("other.txt", b"x")
    with pytest.raises(CheckpointError, match="not empty"):
        write_new_directory(f"{root}/held", lambda s: s.write("_metadata", b"m"))
    assert held.read_bytes("other.txt") == b"x"

    def fail(storage: CheckpointStorage) -> None:
        storage.write("part", b"p")
        raise RuntimeError("injected write failure")

    with pytest.raises(RuntimeError, match="injected"):
        write_new_directory(f"{root}/fresh", fail)
    assert CheckpointStorage(f"{root}/fresh").walk_files() == []

    outcomes: list[str] = []

    def writer(name: str, inner: bool) -> Callable[[CheckpointStorage], None]:
        def write(storage: CheckpointStorage) -> None:
            storage.write(name, b"1")
            if inner:  # a second savepoint into the same target while this one writes
                try:
                    write_new_directory(f"{root}/shared", writer("second", False))
                    outcomes.append("second")
                except CheckpointError:
                    pass
            storage.write("_metadata", name.encode())
        return write

    try:
        write_new_directory(f"{root}/shared", writer("first", True))
        outcomes.append("first")
    except CheckpointError:
        pass
    assert len(outcomes) == 1  # exactly one wins, and the directory holds only its files
    shared = CheckpointStorage(f"{root}/shared")
    assert sorted(shared.walk_files()) == sorted(["_metadata", outcomes[0]])
    assert shared.read_bytes("_metadata") == outcomes[0].encode()


# ---------------------------------------------------------------- 6. corrupt newest


def test_a_corrupt_newest_checkpoint_stops_with_the_explicit_way_to_go_on(
        tmp_path: Path) -> None:
    n = 40_000
    client = counting_job(tmp_path, n, retain_on_cancel=True).execute_async("corrupt")
    wait_for(client, "three checkpoints", lambda: completed(client) >= 3)
    client.cancel()
    client.wait(60)
    ids = sorted(int(p.parent.name[4:]) for p in (tmp_path / "chk").glob("chk-*/_metadata"))
    newest = tmp_path / "chk" / f"chk-{ids[-1]}"
    # keyed state the newest checkpoint wrote itself: a full snapshot in its directory, or
    # (changelog checkpoints, the default) a base or delta in shared/ named by its id
    own = [*newest.rglob("*"), *(tmp_path / "chk" / "shared").rglob(f"{ids[-1]}-*")]
    victim = next(p for p in sorted(own)
                  if p.is_file() and p.suffix in (".keyed", ".delta") and p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    before = read_stream_sink(tmp_path / "out")

    with pytest.raises(CorruptCheckpointError) as caught:
        counting_job(tmp_path, n, rate=None).execute("corrupt")
    message = str(caught.value)
    assert f"chk-{ids[-1]}" in message and victim.name in message
    older = f"{tmp_path / 'chk'}/chk-{ids[-2]}"
    assert f"restore_from={older!r}" in message and "again" in message
    assert read_stream_sink(tmp_path / "out") == before  # nothing committed again

    # the explicit way: it restores the older checkpoint, and re-commits what it said
    result = counting_job(tmp_path, n, rate=None).execute("corrupt", restore_from=older)
    assert result.restored[0].startswith(f"restore_from {older}")
    lost, _, _ = lost_duplicated_wrong(read_stream_sink(tmp_path / "out"), n)
    assert lost == 0


def test_an_unreadable_newest_metadata_is_no_reason_to_fall_back_either(
        tmp_path: Path) -> None:
    client = counting_job(tmp_path, 40_000, retain_on_cancel=True).execute_async("meta")
    wait_for(client, "three checkpoints", lambda: completed(client) >= 3)
    client.cancel()
    client.wait(60)
    ids = sorted(int(p.parent.name[4:]) for p in (tmp_path / "chk").glob("chk-*/_metadata"))
    metadata = tmp_path / "chk" / f"chk-{ids[-1]}" / "_metadata"
    metadata.write_bytes(metadata.read_bytes()[:-7])  # truncated
    before = read_stream_sink(tmp_path / "out")
    with pytest.warns(UserWarning), pytest.raises(CorruptCheckpointError,
                                                  match=f"chk-{ids[-1]}/_metadata"):
        counting_job(tmp_path, 40_000, rate=None).execute("meta")
    assert read_stream_sink(tmp_path / "out") == before


def test_a_new_owner_decides_from_the_storage_as_it_is_after_its_claim(
        tmp_path: Path) -> None:
    """A checkpoint the previous owner completed (and committed) between the new run's
    first look at the storage and its claim is what the new run restores."""
    from weir.checkpoint.protocol import JobOwnership
    from weir.testing import KeyedOperatorHarness

    storage = tmp_path / "chk"
    previous = weir.CheckpointCoordinator(storage)
    with KeyedOperatorHarness(Count(), lambda v: v % KEYS, max_parallelism=32) as h:
        h.process_element(1)
        h.checkpoint(previous)
        late_look = weir.CheckpointCoordinator(storage, clean_up=False)  # (the new run's)
        h.process_element(2)
        newest = h.checkpoint(previous)  # completed after that look, before the claim
    owner = JobOwnership(late_look, "job", "run-2")
    start = owner.claim()
    try:
        assert start.checkpoint is not None
        assert start.checkpoint.checkpoint_id == newest.checkpoint_id
        assert owner.coordinator.next_id > newest.checkpoint_id  # ids never repeat
    finally:
        owner.release()


# ---------------------------------------------------------------- 7. two drivers


def test_a_second_driver_on_a_running_jobs_storage_is_refused(tmp_path: Path) -> None:
    n = 20_000
    first = counting_job(tmp_path, n, rate=2_000).execute_async("two")
    wait_for(first, "a checkpoint", lambda: completed(first) >= 1)
    with pytest.raises(OwnershipError, match=f"pid {os.getpid()}") as caught:
        counting_job(tmp_path, n, rate=None).execute_async("two")
    assert "is running" in str(caught.value)
    result = first.wait(120)
    assert not result.failures
    assert lost_duplicated_wrong(read_stream_sink(tmp_path / "out"), n) == (0, 0, 0)
    claims = Lineage(CheckpointStorage(tmp_path / "chk")).claims()
    assert [c.token for c in claims] == [1]  # the refused driver wrote nothing
    # once the first ended (released), the next run continues its state
    again = counting_job(tmp_path, n, rate=None).execute("two")
    assert again.restored[0].startswith(f"checkpoint {max(result.completed)}")


ZOMBIE = textwrap.dedent('''
    import sys
    from pathlib import Path
    from typing import Any

    from pyspark import cloudpickle

    sys.path.insert(0, TESTS)
    import continuous_helpers
    from continuous_helpers import Count
    from weir.connectors import FileSink, SequenceSource
    from weir.runtime.continuous.master import LocalJob
    from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

    def graph(root: Path, n: int, rate: float | None, backend: str) -> Any:
        env = StreamEnvironment(parallelism=2, max_parallelism=32, state_backend=backend,
                                checkpoint_storage=root / "chk",
                                checkpointing=CheckpointConfig(interval_ms=100),
                                restart_strategy=RestartStrategy.no_restart())
        (env.from_source(SequenceSource(n, rate), uid="numbers")
            .key_by(lambda v: v % 50).process(Count(), uid="count")
            .sink_to(FileSink(root / "out"), uid="sink"))
        return env.job_graph("zombie")

    if __name__ == "__main__":
        cloudpickle.register_pickle_by_value(continuous_helpers)
        root, n, backend = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
        job = LocalJob(graph(root, n, 1_000, backend), CheckpointConfig(interval_ms=100),
                       restart=RestartStrategy.no_restart(), lease_timeout_ms=1_500)
        job.run(timeout_s=300)
''')


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hung_driver_is_taken_over_and_fenced_off_at_its_next_write(
        tmp_path: Path, backend: str) -> None:
    n = 30_000
    script = tmp_path / "zombie.py"
    script.write_text(ZOMBIE.replace("TESTS", repr(str(Path(__file__).parent))))
    zombie = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(n), backend],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        storage = CheckpointStorage(tmp_path / "chk")
        lineage = Lineage(storage, lease_timeout_ms=1_500)
        deadline = time.monotonic() + 60
        while len(list((tmp_path / "chk").glob("chk-*/_metadata"))) < 2:
            assert zombie.poll() is None, zombie.communicate()
            assert time.monotonic() < deadline, "the first driver completed no checkpoints"
            time.sleep(0.02)
        os.kill(zombie.pid, signal.SIGSTOP)  # hung: its lease runs out
        head = lineage.head()
        assert head is not None and head.pid == zombie.pid
        while lineage.alive(head):
            assert time.monotonic() < deadline + 30, "the lease never expired"
            time.sleep(0.05)

        sys.path.insert(0, str(tmp_path))
        try:
            import zombie as module  # (the same graph, built here)
        finally:
            sys.path.remove(str(tmp_path))
        cloudpickle.register_pickle_by_value(module)
        job = LocalJob(module.graph(tmp_path, n, None, backend),
                       CheckpointConfig(interval=100),
                       restart=RestartStrategy.no_restart(), lease_timeout_ms=1_500)
        running = Running(job)
        running.until(lambda: job.ownership.start is not None)
        assert job.ownership.token == head.token + 1  # took over from the hung driver
        os.kill(zombie.pid, signal.SIGCONT)  # it wakes up: fenced at its next write
        _, stderr = zombie.communicate(timeout=60)
        assert zombie.returncode != 0 and "FencedError" in stderr, stderr[-2000:]
        assert running.join() == []
    finally:
        if zombie.poll() is None:
            os.kill(zombie.pid, signal.SIGCONT)
            zombie.kill()
            zombie.wait()
    assert lost_duplicated_wrong(read_stream_sink(tmp_path / "out"), n) == (0, 0, 0)
    assert job.result.restored[0].startswith("checkpoint ")  # the hung driver's newest
    state = weir.read_state(str(tmp_path / "chk")).keyed_state("count", "count")
    assert dict(zip(state["key"], state["value"], strict=True)) == dict.fromkeys(
        range(KEYS), n // KEYS)


def test_after_a_cancel_that_deleted_the_checkpoints_the_used_sink_is_refused(
        tmp_path: Path) -> None:
    client = counting_job(tmp_path, 40_000).execute_async("cancelled")
    wait_for(client, "output committed", lambda: committed(tmp_path))
    client.cancel()
    assert client.wait(60).cancelled
    assert not list((tmp_path / "chk").glob("chk-*"))  # deleted, as asked
    before = read_stream_sink(tmp_path / "out")
    with pytest.raises(weir.SinkLineageError) as caught:
        counting_job(tmp_path, 40_000, rate=None).execute("cancelled")
    assert str(tmp_path / "out") in str(caught.value)
    assert read_stream_sink(tmp_path / "out") == before  # nothing committed again


# ---------------------------------------------------------------- 9. metadata write fails


def test_a_failed_metadata_write_is_a_checkpoint_failure_and_a_failed_discard_is_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    n = 10_000
    injected = {"metadata": 0, "discard": 0}
    create, delete = CheckpointStorage.create_exclusive, CheckpointStorage.delete

    def no_space(self: CheckpointStorage, relative: str, data: bytes) -> bool:
        if relative.endswith("/_metadata") and injected["metadata"] == 0:
            injected["metadata"] += 1
            raise CheckpointError(f"cannot write {relative}") from OSError(
                errno.ENOSPC, os.strerror(errno.ENOSPC))
        return create(self, relative, data)

    def cannot_delete(self: CheckpointStorage, relative: str, recursive: bool = False) -> None:
        if relative.endswith("/_metadata") and injected["discard"] == 0:
            injected["discard"] += 1
            raise OSError(errno.EACCES, "injected: permission denied")
        delete(self, relative, recursive)

    monkeypatch.setattr(CheckpointStorage, "create_exclusive", no_space)
    monkeypatch.setattr(CheckpointStorage, "delete", cannot_delete)
    result = counting_job(tmp_path, n, rate=2_000, tolerable_failures=1).execute("enospc")
    assert injected == {"metadata": 1, "discard": 1}
    assert [r for _, r in result.aborted] == ["FINALIZE_CHECKPOINT_FAILURE"]
    assert not result.failures and result.restarts == 0
    assert "discarding subsumed checkpoint" in caplog.text
    assert lost_duplicated_wrong(read_stream_sink(tmp_path / "out"), n) == (0, 0, 0)
