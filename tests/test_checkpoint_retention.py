"""Checkpoint retention under churn (the FLINK-21351 case, RELIABILITY.md test 10).

A keyed job with two subtasks changes 1-5 % of its keys between checkpoints and
takes 200 incremental RocksDB checkpoints with ``retained=3``: SST files are
shared by consecutive checkpoints and, as RocksDB compacts (by itself after a few
flushes, and forced through the TTL compaction filter), replaced and released. A
savepoint is taken in the middle and the process "crashes" in the middle of a
checkpoint and restarts with a new coordinator over the same storage.

After every checkpoint:

* every file of every retained checkpoint exists and verifies;
* the files under ``chk-*/`` and ``shared/`` are exactly the referenced ones
  (nothing orphaned once released, nothing referenced missing);
* exactly ``retained`` ``chk-*`` directories exist.

Every 20 checkpoints and at the end the latest checkpoint is restored (into either
backend) and compared with an oracle; at the end so is the savepoint, 100
checkpoints after it was taken. A shorter hash-map run with full checkpoints checks
the same invariants without shared files.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import weir
from weir import (
    CheckpointCoordinator,
    CheckpointKind,
    CompletedCheckpoint,
    KeyedContext,
    KeyedProcessFunction,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from weir.checkpoint.format import KeyedFullHandle, KeyedIncrementalHandle
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.testing import KeyedOperatorHarness

MAX_P = 30
VALUE = ValueStateDescriptor("value")
#: never expires (the clock stays at 0); the TTL only makes compact_state() compact it
LAST = MapStateDescriptor("last").enable_time_to_live(
    StateTtlConfig(ttl_ms=10**12).cleanup_in_rocksdb_compact_filter()
)
UID = "churn"


class Churn(KeyedProcessFunction[tuple[Any, int | None], Any]):
    """``(key, n)`` sets ``value = n`` and ``last[n % 4] = n``; ``(key, None)`` clears."""

    def process_element(self, element: tuple[Any, int | None], ctx: KeyedContext) -> None:
        value, last = ctx.get_state(VALUE), ctx.get_map_state(LAST)
        n = element[1]
        if n is None:
            value.clear()
            last.clear()
        else:
            value.update(n)
            last.put(n % 4, n)


def key_of(element: tuple[Any, int | None]) -> Any:
    return element[0]


@dataclass
class Oracle:
    values: dict[Any, int] = field(default_factory=dict)
    last: dict[Any, dict[int, int]] = field(default_factory=dict)

    def apply(self, key: Any, n: int | None) -> None:
        if n is None:
            self.values.pop(key, None)
            self.last.pop(key, None)
        else:
            self.values[key] = n
            self.last.setdefault(key, {})[n % 4] = n

    def copy(self) -> Oracle:
        return Oracle(dict(self.values), {k: dict(v) for k, v in self.last.items()})


class Job:
    """``parallelism`` subtasks of :class:`Churn` fed from one seeded stream."""

    def __init__(self, backend: str, parallelism: int, seed: int) -> None:
        self.backend = backend
        self.parallelism = parallelism
        self.rng = random.Random(seed)
        self.oracle = Oracle()
        self.harnesses: list[KeyedOperatorHarness] = []

    def start(self, restore_from: CompletedCheckpoint | None = None) -> None:
        for index in range(self.parallelism):
            if restore_from is None:
                h = KeyedOperatorHarness(
                    Churn(), key_of, state_backend=self.backend, max_parallelism=MAX_P,
                    parallelism=self.parallelism, subtask_index=index, uid=UID,
                )
                h.open()
            else:
                h = KeyedOperatorHarness.restore(
                    Churn(), key_of, restore_from, parallelism=self.parallelism,
                    subtask_index=index, state_backend=self.backend, uid=UID,
                )
            self.harnesses.append(h)

    def stop(self) -> None:
        for h in self.harnesses:
            h.close()
        self.harnesses = []

    def send(self, key: Any, n: int | None) -> None:
        index = assign_key_to_parallel_operator(key, MAX_P, self.parallelism)
        self.harnesses[index].process_element((key, n))
        self.oracle.apply(key, n)

    def load(self, keys: int) -> None:
        for key in range(keys):
            self.send(key, self.rng.randrange(10**6))

    def churn(self, key_space: int) -> None:
        """Change 1-5 % of ``key_space`` keys: mostly updates (some of new keys), some
        deletes."""
        for _ in range(self.rng.randint(key_space // 100, key_space // 20)):
            if self.oracle.values and self.rng.random() < 0.3:
                self.send(self.rng.choice(sorted(self.oracle.values)), None)
            else:
                self.send(self.rng.randrange(key_space * 6 // 5), self.rng.randrange(10**6))

    def checkpointers(self, coordinator: CheckpointCoordinator, mode: str) -> list[Any]:
        return [h.checkpointer(coordinator.storage, mode) for h in self.harnesses]

    def compact(self) -> None:
        for h in self.harnesses:
            h.compact_state()


def check_storage(coordinator: CheckpointCoordinator, retained: int) -> list[CompletedCheckpoint]:
    """The retention invariants; returns the retained checkpoints."""
    storage = coordinator.storage
    completed = coordinator.completed_checkpoints
    assert len(completed) == retained
    for c in completed:
        c.verify()
    referenced = coordinator.referenced_files()
    on_storage = {
        path for path in storage.walk_files()
        if path.startswith("chk-") or path.startswith("shared/")
    }
    missing = referenced - on_storage
    orphans = on_storage - referenced
    assert not missing, f"referenced files are gone: {sorted(missing)[:5]}"
    assert not orphans, f"orphaned files: {sorted(orphans)[:5]}"
    chk_dirs = sorted(n for n in storage.list_dir() if n.startswith("chk-"))
    assert chk_dirs == sorted(c.directory for c in completed)
    assert set(storage.list_dir()) <= {*chk_dirs, "shared"}
    return completed


def check_restores(artifact: CompletedCheckpoint, oracle: Oracle, backend: str,
                   parallelism: int) -> None:
    """Restore every subtask of ``parallelism`` from ``artifact`` and compare."""
    values: dict[Any, int] = {}
    last: dict[Any, dict[int, int]] = {}
    for index in range(parallelism):
        with KeyedOperatorHarness.restore(
            Churn(), key_of, artifact, parallelism=parallelism, subtask_index=index,
            state_backend=backend, uid=UID,
        ) as h:
            for key in h.keys(VALUE):
                assert key not in values
                values[key] = h.state_of(key, VALUE)
            for key in h.keys(LAST):
                assert key not in last
                last[key] = h.state_of(key, LAST)
    assert values == oracle.values
    assert last == oracle.last


def shared_of(checkpoint: CompletedCheckpoint) -> dict[tuple[int, str], str]:
    """``(subtask, local SST name) -> shared path`` of an incremental checkpoint."""
    out = {}
    for handle in checkpoint.metadata.operators[UID].subtasks:
        assert isinstance(handle.keyed, KeyedIncrementalHandle)
        for name, ref in handle.keyed.shared.items():
            out[(handle.subtask_index, name)] = ref.path
    return out


def test_incremental_rocksdb_retention_under_churn_with_savepoint_and_restart(
    tmp_path: Path,
) -> None:
    retained, total, savepoint_at, crash_at = 3, 200, 100, 140
    root = tmp_path / "checkpoints"
    coordinator = CheckpointCoordinator(root, retained=retained)
    job = Job("rocksdb", parallelism=2, seed=21351)
    job.start()
    job.load(1000)

    savepoint: CompletedCheckpoint | None = None
    savepoint_oracle: Oracle | None = None
    oracle_at: dict[int, Oracle] = {}
    ever_shared: set[str] = set()
    reused = 0
    replaced = 0
    previous: dict[tuple[int, str], str] = {}
    done = 0
    crashed = False
    try:
        while done < total:
            job.churn(1000)
            if done % 7 == 6:
                job.compact()
            if done == crash_at and not crashed:
                crashed = True
                # the process dies after the uploads of a checkpoint, before its
                # metadata is published: the checkpoint never completed
                pending = coordinator.trigger()
                for c in job.checkpointers(coordinator, "incremental"):
                    c.snapshot(pending.checkpoint_id, pending.timestamp_ms).result()
                crashed_dir = pending.directory
                assert (root / crashed_dir).is_dir()
                job.stop()
                before = {c.checkpoint_id for c in coordinator.completed_checkpoints}
                referenced = coordinator.referenced_files()
                coordinator = CheckpointCoordinator(root, retained=retained, clean_up=False)
                assert {c.checkpoint_id for c in coordinator.completed_checkpoints} == before
                assert coordinator.referenced_files() == referenced
                deleted = coordinator.clean_up_orphans()
                # the uploads of the crashed checkpoint are orphans, and only they
                assert any(p.startswith(crashed_dir + "/") for p in deleted)
                assert any(p.startswith("shared/") for p in deleted)
                assert all(p.startswith((crashed_dir + "/", "shared/")) for p in deleted)
                assert not set(deleted) & referenced
                assert not (root / crashed_dir).exists()
                check_storage(coordinator, retained)
                latest = coordinator.latest()
                assert latest is not None and latest.checkpoint_id == max(before)
                # what the crashed process did since its last checkpoint is lost
                job.oracle = oracle_at[latest.checkpoint_id].copy()
                job.start(restore_from=latest)
                check_restores(latest, job.oracle, "hashmap", 3)
                previous = {}
                continue

            completed = weir.take_checkpoint(
                coordinator, job.checkpointers(coordinator, "incremental")
            )
            done += 1
            oracle_at = {completed.checkpoint_id: job.oracle.copy()}
            assert completed.kind is CheckpointKind.CHECKPOINT
            retained_now = check_storage(coordinator, min(done, retained))
            assert retained_now[-1].checkpoint_id == completed.checkpoint_id

            shared = shared_of(completed)
            ever_shared.update(shared.values())
            reused += sum(1 for k, path in shared.items() if previous.get(k) == path)
            replaced += sum(1 for k in previous if k not in shared)
            previous = shared

            if done == savepoint_at:
                savepoint = weir.take_savepoint(
                    coordinator, job.checkpointers(coordinator, "incremental"),
                    tmp_path / "savepoints" / "sp-100",
                )
                savepoint_oracle = job.oracle.copy()
                assert savepoint.kind is CheckpointKind.SAVEPOINT
                # a savepoint neither counts as retained nor touches shared files
                after = check_storage(coordinator, retained)
                assert [c.checkpoint_id for c in after] == [
                    c.checkpoint_id for c in retained_now
                ]
                savepoint.verify()

            if done % 20 == 0 or savepoint_at < done <= savepoint_at + 3:
                latest = CheckpointCoordinator(root, retained=retained, clean_up=False).latest()
                assert latest is not None
                assert latest.checkpoint_id == completed.checkpoint_id
                check_restores(latest, job.oracle, "rocksdb" if done % 40 else "hashmap",
                               (1, 2, 3)[done // 20 % 3])
    finally:
        job.stop()

    assert crashed
    # the incremental machinery was exercised: files shared, replaced and released
    assert reused > total
    assert replaced > 0
    still_referenced = {p for p in coordinator.referenced_files()
                        if p.startswith("shared/") and p.endswith(".sst")}
    assert still_referenced <= ever_shared
    assert len(ever_shared) > 3 * len(still_referenced)

    # the end: the latest checkpoint (after a restart) and the savepoint (100
    # checkpoints old, its checkpoints long subsumed) both restore exactly
    final = CheckpointCoordinator(root, retained=retained)
    latest = final.latest()
    assert latest is not None
    check_storage(final, retained)
    check_restores(latest, job.oracle, "rocksdb", 2)
    check_restores(latest, job.oracle, "hashmap", 3)
    assert savepoint is not None and savepoint_oracle is not None
    reloaded = weir.load_checkpoint(tmp_path / "savepoints" / "sp-100")
    assert reloaded.checkpoint_id == savepoint.checkpoint_id
    for handle in reloaded.metadata.operators[UID].subtasks:
        assert isinstance(handle.keyed, KeyedFullHandle)
    check_restores(reloaded, savepoint_oracle, "rocksdb", 2)
    check_restores(reloaded, savepoint_oracle, "hashmap", 1)


@pytest.mark.parametrize("retained", [1, 3])
def test_full_hashmap_checkpoints_keep_exactly_the_retained_ones(
    tmp_path: Path, retained: int
) -> None:
    root = tmp_path / "checkpoints"
    coordinator = CheckpointCoordinator(root, retained=retained)
    job = Job("hashmap", parallelism=3, seed=retained)
    job.start()
    job.load(500)
    total = 60
    savepoint = savepoint_oracle = None
    try:
        for done in range(1, total + 1):
            job.churn(500)
            completed = weir.take_checkpoint(coordinator, job.checkpointers(coordinator, "full"))
            retained_now = check_storage(coordinator, min(done, retained))
            assert retained_now[-1].checkpoint_id == completed.checkpoint_id
            assert not (root / "shared").exists()
            if done == total // 2:
                savepoint = weir.take_savepoint(
                    coordinator, job.checkpointers(coordinator, "full"), tmp_path / "sp"
                )
                savepoint_oracle = job.oracle.copy()
                check_storage(coordinator, min(done, retained))
            if done % 20 == 0:
                latest = coordinator.latest()
                assert latest is not None
                check_restores(latest, job.oracle, "hashmap", (1, 2, 4)[done // 20 % 3])
    finally:
        job.stop()
    ids = [c.checkpoint_id for c in coordinator.completed_checkpoints]
    assert len(ids) == retained and ids == sorted(ids)
    restarted = CheckpointCoordinator(root, retained=retained)
    assert [c.checkpoint_id for c in restarted.completed_checkpoints] == ids
    latest = restarted.latest()
    assert latest is not None
    check_restores(latest, job.oracle, "rocksdb", 2)
    assert savepoint is not None and savepoint_oracle is not None
    check_restores(weir.load_checkpoint(tmp_path / "sp"), savepoint_oracle, "rocksdb", 3)


def test_aborting_one_of_two_concurrent_incremental_checkpoints_spares_the_others_files(
    tmp_path: Path,
) -> None:
    """Checkpoints n and n+1 pending at once (max_concurrent > 1) on RocksDB: aborting n
    deletes n's new shared files only, never n+1's, which then completes and restores."""
    from weir.testing import KeyedOperatorHarness as Harness

    class Count(weir.KeyedProcessFunction[Any, Any]):
        def open(self, ctx: Any) -> None:
            self.n = ctx.get_state(weir.ValueStateDescriptor[int]("n", weir.IntSerializer()))

        def process_element(self, value: Any, ctx: Any) -> None:
            self.n.update((self.n.value() or 0) + 1)

    coord = weir.CheckpointCoordinator(tmp_path / "chk")
    with Harness(Count(), lambda k: k, uid="count", state_backend="rocksdb") as h:
        h.process_elements(range(1_000))
        checkpointer = h.checkpointer(coord.storage, "incremental")
        first = coord.trigger()
        snap_first = checkpointer.snapshot(first.checkpoint_id, first.timestamp_ms)
        h.process_elements(range(1_000, 2_000))
        second = coord.trigger()
        snap_second = checkpointer.snapshot(second.checkpoint_id, second.timestamp_ms)
        first.acknowledge("count", 1, 128, snap_first.result())
        second.acknowledge("count", 1, 128, snap_second.result())
        coord.abort(first)
        checkpointer.notify_checkpoint_aborted(first.checkpoint_id)
        done = coord.complete(second)
        done.verify()  # every file of the surviving checkpoint is there and intact
    with Harness.restore(Count(), lambda k: k, done, parallelism=1, subtask_index=0,
                         uid="count", state_backend="hashmap") as restored:
        n = weir.ValueStateDescriptor[int]("n", weir.IntSerializer())
        assert restored.state_of(0, n) == 1 and restored.state_of(1_999, n) == 1
