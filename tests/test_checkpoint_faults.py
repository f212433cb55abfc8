"""Checkpoint fault tests (RELIABILITY.md tests 2, 3, 4 and 6) on a real local disk.

One deterministic keyed job — 2 subtasks, max parallelism 30, 24 keys; per key a
value, a list and a map state and one event-time timer per record; per subtask a
union operator state — runs on the hash-map backend (full checkpoints) and RocksDB
(full and incremental), against a pure-Python oracle. Its source is replayable: each
checkpoint stores the source offset, and a restarted job replays from there.

1. Crash points: checkpoint 2 (and, separately, a savepoint) is cut off by
   ``weir.testing.faults`` at every write step — before, after and half way through
   each file write, rename and delete, including the subsumption of checkpoint 1
   (retained=1). A restarted process must recover checkpoint 2 iff its _metadata
   was published, else checkpoint 1, read no temporary/foreign file, match the
   oracle, and after its start-up clean-up hold no orphan file. ``make soak`` crashes
   at every step; ``make test`` at the first step of each kind of file (the second
   subtask and further SST files repeat it).
2. Corruption: bit flip, truncation, zero length, missing file and a wrong format
   version of every kind of checkpoint file: automatic recovery warns and falls back
   to checkpoint 1; an explicit restore raises the typed error naming the file.
3. Disk full (ENOSPC at every write): a typed CheckpointError, nothing left behind,
   the previous checkpoint restores and the job goes on checkpointing.
4. Zombie attempts: a subtask's old attempt publishing after the retry completed
   changes nothing (attempt-unique names, on a storage whose rename cannot overwrite).

Every fault test counts L (lost records), D (duplicated records), M (keys whose state
differs from the oracle) and C (corrupt, partial or foreign files loaded), prints them
with the number of faults injected (``pytest -s``) and asserts they are zero and that
every planned fault was injected.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import struct
import threading
import warnings
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pytest

from weir import (
    CheckpointCoordinator,
    CheckpointedFunction,
    CheckpointError,
    CheckpointFormatError,
    CheckpointStorage,
    CompletedCheckpoint,
    CorruptCheckpointError,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    KeyedContext,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    NoCheckpointError,
    ValueStateDescriptor,
    load_checkpoint,
    take_checkpoint,
    take_savepoint,
)
from weir.checkpoint.format import (
    FORMAT_VERSION,
    KeyedChangelogHandle,
    KeyedFullHandle,
    KeyedIncrementalHandle,
    check_data_header,
)
from weir.checkpoint.storage import TMP_MARKER
from weir.runtime.checkpointer import SubtaskCheckpointer
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.testing import KeyedOperatorHarness
from weir.testing.faults import WHEN, FaultInjectingFileSystem, InjectedCrash

MAX_PARALLELISM = 30
PARALLELISM = 2
KEYS = [f"k{i:02d}" for i in range(24)]
N1, N2, N = 60, 100, 120
CONFIGS = [("hashmap", "full"), ("hashmap", "changelog"), ("rocksdb", "full"),
           ("rocksdb", "incremental")]
TIMER_BASE = 1_000_000

COUNT = ValueStateDescriptor("count")
SEQS = ListStateDescriptor("seqs")
PAYLOADS = MapStateDescriptor("payloads")
PROCESSED = ListStateDescriptor("processed")


def _checksum(key: str, seq: int) -> int:
    return zlib.crc32(f"{key}:{seq}".encode())


RECORDS = [(k, i, _checksum(k, i)) for i, k in ((i, KEYS[(i * 7) % len(KEYS)]) for i in range(N))]


def _subtask_of(key: str) -> int:
    return assign_key_to_parallel_operator(key, MAX_PARALLELISM, PARALLELISM)


class CountingJob(KeyedProcessFunction[Any, Any], CheckpointedFunction):
    """Per key: a count, the list of sequence numbers, a map seq -> checksum and one
    event-time timer per record; per subtask: the number of records (union list state)."""

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        self._processed_state = ctx.operator_state_store.get_union_list_state(PROCESSED)
        self._restored = [tuple(e) for e in self._processed_state.get()] if ctx.is_restored else []

    def open(self, ctx: KeyedContext) -> None:
        self.subtask = ctx.subtask_index
        self.processed = dict(self._restored).get(self.subtask, 0)
        self.count = ctx.get_state(COUNT)
        self.seqs = ctx.get_state(SEQS)
        self.payloads = ctx.get_state(PAYLOADS)

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        self._processed_state.update([[self.subtask, self.processed]])

    def process_element(self, value: Any, ctx: KeyedContext) -> None:
        _, seq, checksum = value
        self.processed += 1
        self.count.update((self.count.value() or 0) + 1)
        self.seqs.add(seq)
        self.payloads.put(seq, checksum)
        ctx.timer_service.register_event_time_timer(TIMER_BASE + seq)

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> list[Any]:
        return [(ctx.current_key, timestamp)]


KeyStates = dict[str, tuple[int, tuple[int, ...], dict[int, int]]]


def oracle(upto: int) -> KeyStates:
    out: KeyStates = {}
    for key, seq, checksum in RECORDS[:upto]:
        count, seqs, payloads = out.get(key, (0, (), {}))
        out[key] = (count + 1, (*seqs, seq), {**payloads, seq: checksum})
    return out


def oracle_processed(upto: int) -> dict[int, int]:
    out = dict.fromkeys(range(PARALLELISM), 0)
    for key, _, _ in RECORDS[:upto]:
        out[_subtask_of(key)] += 1
    return out


class Job:
    """Two subtasks of CountingJob, fed by a replayable source."""

    def __init__(self, backend: str, restore_from: CompletedCheckpoint | None = None):
        self.backend = backend
        self.harnesses: list[KeyedOperatorHarness] = []
        self._synchronous: dict[tuple[int, str], list[SubtaskCheckpointer]] = {}
        try:
            for i in range(PARALLELISM):
                if restore_from is None:
                    h = KeyedOperatorHarness(
                        CountingJob(), lambda r: r[0], state_backend=backend,
                        max_parallelism=MAX_PARALLELISM, parallelism=PARALLELISM,
                        subtask_index=i,
                    )
                    h.open()
                else:
                    h = KeyedOperatorHarness.restore(
                        CountingJob(), lambda r: r[0], restore_from, parallelism=PARALLELISM,
                        subtask_index=i, state_backend=backend,
                        max_parallelism=MAX_PARALLELISM,
                    )
                self.harnesses.append(h)
        except BaseException:
            self.close()
            raise

    def run(self, start: int, end: int) -> None:
        for record in RECORDS[start:end]:
            self.harnesses[_subtask_of(record[0])].process_element(record)

    def checkpointers(
        self, storage: CheckpointStorage, mode: str, asynchronous: bool = True
    ) -> list[SubtaskCheckpointer]:
        """The subtasks' checkpointers (kept, so incremental snapshots share files);
        synchronous ones upload inside ``snapshot``, one subtask after the other."""
        if asynchronous:
            out = [h.checkpointer(storage, mode) for h in self.harnesses]
        else:
            key = (id(storage), mode)
            if key not in self._synchronous:
                self._synchronous[key] = [
                    SubtaskCheckpointer(h.operator, storage, mode=mode, asynchronous=False)
                    for h in self.harnesses
                ]
            out = self._synchronous[key]
        for c in out:  # every checkpoint changes most keys: deltas, not new bases
            c.policy = dataclasses.replace(c.policy, rebase_share=None)
        return out

    def checkpoint(
        self, coordinator: CheckpointCoordinator, storage: CheckpointStorage, mode: str,
        offset: int, *, asynchronous: bool = True,
    ) -> CompletedCheckpoint:
        return take_checkpoint(
            coordinator, self.checkpointers(storage, mode, asynchronous),
            source_positions={"offset": offset},
        )

    def state(self) -> KeyStates:
        out: KeyStates = {}
        for key in KEYS:
            h = self.harnesses[_subtask_of(key)]
            count = h.state_of(key, COUNT)
            if count is None:
                continue
            out[key] = (count, tuple(h.state_of(key, SEQS)), h.state_of(key, PAYLOADS))
        return out

    def processed(self) -> dict[int, int]:
        return {i: h.operator.function.processed for i, h in enumerate(self.harnesses)}

    def fire_timers(self) -> set[tuple[str, int]]:
        fired = set()
        for h in self.harnesses:
            fired.update(h.advance_watermark(TIMER_BASE * 2))
        return fired

    def close(self) -> None:
        for h in self.harnesses:
            h.close()


# ---------------------------------------------------------------- filesystems


class DyingFileSystem(FaultInjectingFileSystem):
    """FaultInjectingFileSystem whose process stays dead after the injected crash: no
    later write step of any thread happens (as after ``kill -9``)."""

    def _step(self, op: str, path: str, action: Any, torn: Any) -> Any:
        if self.crashed:
            raise InjectedCrash(f"process is dead: {op} {path}")
        return super()._step(op, path, action, torn)


class ReadRecordingFileSystem:
    """Delegates to ``wrapped`` and records the path of every file read."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped
        self.reads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def cat_file(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self.reads.append(str(path))
        return self.wrapped.cat_file(path, *args, **kwargs)

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" in mode:
            self.reads.append(str(path))
        return self.wrapped.open(path, mode, **kwargs)


def _local_fs() -> Any:
    return fsspec.filesystem("file")


# ---------------------------------------------------------------- L/D/M/C


@dataclass
class Tally:
    """RELIABILITY.md's numbers for one fault test."""

    lost: int = 0
    duplicated: int = 0
    mismatched: int = 0
    corrupt_loads: int = 0
    injected: int = 0
    runs: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)

    def report(self, name: str) -> str:
        line = (
            f"{name}: runs={self.runs} injected={self.injected} L={self.lost} "
            f"D={self.duplicated} M={self.mismatched} C={self.corrupt_loads} "
            f"outcomes={dict(sorted(self.outcomes.items()))}"
        )
        print(line)
        return line

    def assert_clean(self) -> None:
        assert (self.lost, self.duplicated, self.mismatched, self.corrupt_loads) == (0, 0, 0, 0)


def _compare(tally: Tally, got: KeyStates, want: KeyStates) -> None:
    """Count lost and duplicated records (per-key sequence numbers) and mismatching keys."""
    for key in set(got) | set(want):
        have = Counter(got.get(key, (0, (), {}))[1])
        expected = Counter(want.get(key, (0, (), {}))[1])
        tally.lost += sum((expected - have).values())
        tally.duplicated += sum((have - expected).values())
        if got.get(key) != want.get(key):
            tally.mismatched += 1


def _restores_to(
    tally: Tally, backend: str, checkpoint: CompletedCheckpoint, upto: int
) -> Job:
    """Restore a job from ``checkpoint`` and count its differences from the oracle at
    offset ``upto``; the caller closes the job."""
    restored = Job(backend, restore_from=checkpoint)
    try:
        _compare(tally, restored.state(), oracle(upto))
        tally.mismatched += restored.processed() != oracle_processed(upto)
    except BaseException:
        restored.close()
        raise
    return restored


def _chk_ids(root: Path) -> set[int]:
    return {int(p.name[4:]) for p in root.glob("chk-*")}


def _restart_and_check(
    tally: Tally, root: Path, backend: str, mode: str, expected_id: int, label: str,
    deep: bool = False,
) -> None:
    """A restarted process over ``root``: a new coordinator (startup clean-up),
    automatic recovery, restore, replay of the source from the checkpoint's offset,
    comparison with the oracle; then the restarted job takes its next checkpoint
    (with ``deep``, a third process restores that one too)."""
    seen = _chk_ids(root)
    reads = ReadRecordingFileSystem(_local_fs())
    storage = CheckpointStorage(str(root), fs=reads)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an interrupted checkpoint is not "corrupt"
        coordinator = CheckpointCoordinator(storage, retained=1)
        latest = coordinator.latest()
    assert latest is not None, label
    on_disk = set(storage.walk_files())
    referenced = coordinator.referenced_files()
    assert on_disk == referenced, (
        f"{label}: orphans {sorted(on_disk - referenced)}, missing {sorted(referenced - on_disk)}"
    )
    assert latest.checkpoint_id == expected_id, label
    offset = latest.metadata.source_positions["offset"]
    assert offset == {1: N1, 2: N2}[expected_id], label
    tally.outcomes[f"restored chk-{latest.checkpoint_id}"] += 1

    job = Job(backend, restore_from=latest)
    try:
        # C: every data file read belongs to the restored checkpoint (never a
        # temporary, torn or foreign file)
        allowed = {storage.full_path(ref.path) for ref in latest.metadata.files()}
        tally.corrupt_loads += sum(
            1 for p in reads.reads
            if TMP_MARKER in p or (not p.endswith("/_metadata") and p not in allowed)
        )
        _compare(tally, job.state(), oracle(offset))
        tally.mismatched += job.processed() != oracle_processed(offset)
        job.run(offset, N)
        _compare(tally, job.state(), oracle(N))
        tally.mismatched += job.processed() != oracle_processed(N)
        # the restarted job goes on checkpointing: ids continue after every id seen
        nxt = job.checkpoint(coordinator, storage, mode, N)
        assert nxt.checkpoint_id == max(seen) + 1, label
        tally.mismatched += job.fire_timers() != {(k, TIMER_BASE + s) for k, s, _ in RECORDS}
    finally:
        job.close()
    assert set(storage.walk_files()) == coordinator.referenced_files(), label
    assert [c.checkpoint_id for c in coordinator.completed_checkpoints] == [nxt.checkpoint_id]
    nxt.verify()
    if deep:
        again = CheckpointCoordinator(str(root), retained=1).latest()
        assert again is not None and again.checkpoint_id == nxt.checkpoint_id, label
        job = Job(backend, restore_from=again)
        try:
            _compare(tally, job.state(), oracle(N))
            tally.mismatched += job.processed() != oracle_processed(N)
        finally:
            job.close()


def _published(steps: list[tuple[str, str]], crash_at: int, when: str, metadata: str) -> bool:
    """Whether the crash at ``crash_at`` came after ``metadata`` was renamed into place."""
    for index, (op, path) in enumerate(steps[: crash_at + 1]):
        if op == "rename" and path.endswith(metadata):
            return index < crash_at or when == "after"
    return False


def _setup(
    root: Path, backend: str, mode: str, asynchronous: bool, wrapper: Any = None
) -> tuple[Job, CheckpointCoordinator, Any, Any]:
    """Checkpoint 1 at offset N1 (no fault), then the records up to N2, over a
    filesystem wrapped by ``wrapper`` (DyingFileSystem by default)."""
    fs = (wrapper or DyingFileSystem)(_local_fs())
    storage = CheckpointStorage(str(root), fs=fs)
    coordinator = CheckpointCoordinator(storage, retained=1)
    job = Job(backend)
    job.run(0, N1)
    chk1 = job.checkpoint(coordinator, storage, mode, N1, asynchronous=asynchronous)
    assert chk1.checkpoint_id == 1
    job.run(N1, N2)
    return job, coordinator, storage, fs


def _relative(steps: list[tuple[str, str]], root: Path) -> list[tuple[str, str]]:
    prefix = str(root).rstrip("/") + "/"
    return [(op, path.removeprefix(prefix)) for op, path in steps]


def _shape(step: tuple[str, str]) -> tuple[str, str]:
    """A step with its attempt ids and uuids blanked (they differ between runs)."""
    return step[0], re.sub(r"[0-9a-f]{12,}", "*", step[1])


def _attempt_checkpoint(
    root: Path, backend: str, mode: str, crash_at: int | None, when: str, fresh: bool,
    asynchronous: bool,
) -> tuple[bool, list[tuple[str, str]]]:
    """Checkpoint 2 of a fresh run, crashed at step ``crash_at``; the steps (relative
    to ``root``) up to the crash."""
    job, coordinator, storage, fs = _setup(root, backend, mode, asynchronous)
    if fresh:
        # a checkpointer that knows no earlier upload (as for a task restored from a
        # savepoint): it uploads every SST again, so subsuming checkpoint 1 deletes
        # shared files
        storage = CheckpointStorage(str(root), fs=fs)
    fs.arm(crash_at, when)
    try:
        job.checkpoint(coordinator, storage, mode, N2, asynchronous=asynchronous)
    except InjectedCrash:
        pass
    finally:
        job.close()  # the process is gone: wait for its threads
    return fs.crashed, _relative(fs.steps, root)


# ---------------------------------------------------------------- 1. crash points


#: make soak crashes at every step; make test at the first step of each kind (the
#: second subtask's files and a checkpoint's further SST files repeat the first's)
EVERY_STEP = bool(os.environ.get("WEIR_SOAK"))


def _kind(step: tuple[str, str]) -> tuple[str, str]:
    """A step with subtask indexes, attempt ids, uuids and file numbers blanked."""
    return step[0], re.sub(r"[0-9a-f]{12,}|\d+", "*", step[1])


def _crash_points(
    steps: list[tuple[str, str]], first: int, dedupe: bool
) -> list[tuple[int, str]]:
    """Each (step, when) from step ``first`` on (see ``EVERY_STEP``). ``during`` tears
    a file write; for a rename or delete the injector has nothing to tear, so there it
    is ``before`` again and (with ``dedupe``) is not run twice."""
    seen: set[tuple[str, str]] = set()
    chosen = []
    for k in range(first, len(steps)):
        if EVERY_STEP or _kind(steps[k]) not in seen:
            chosen.append(k)
        seen.add(_kind(steps[k]))
    return [
        (k, when)
        for k in chosen
        for when in WHEN
        if not dedupe or when != "during" or steps[k][0] == "write"
    ]


CRASH_SCENARIOS = [
    # Synchronous uploads write subtask after subtask, so the steps come in the same
    # order in every run and each (step, when) is hit exactly. Asynchronous uploads
    # interleave the subtasks' steps differently from run to run; the crash then
    # also lands in an upload thread while the other thread is still writing.
    pytest.param("hashmap", "full", False, False, id="hashmap-full"),
    pytest.param("rocksdb", "full", False, False, id="rocksdb-full"),
    pytest.param("rocksdb", "incremental", False, False, id="rocksdb-incremental"),
    # a base, then a delta (and a materialization, written inside the checkpoint here)
    pytest.param("hashmap", "changelog", False, False, id="hashmap-changelog"),
    # a checkpointer that knows no earlier upload sends every SST again, so completing
    # its first checkpoint releases shared files of the subsumed one: crash among
    # those deletes
    pytest.param("rocksdb", "incremental", True, False, id="rocksdb-incremental-subsume"),
    pytest.param("hashmap", "full", False, True, id="hashmap-full-async"),
    pytest.param("rocksdb", "full", False, True, id="rocksdb-full-async"),
]


@pytest.mark.parametrize(("backend", "mode", "fresh", "asynchronous"), CRASH_SCENARIOS)
def test_a_crash_at_any_write_step_of_a_checkpoint_restores_the_newest_complete_one(
    tmp_path: Path, backend: str, mode: str, fresh: bool, asynchronous: bool
) -> None:
    dry = tmp_path / "dry"
    crashed, steps = _attempt_checkpoint(dry, backend, mode, None, "before", fresh, asynchronous)
    assert not crashed
    # the metadata is published after every data file, and only then is checkpoint 1
    # subsumed (retained=1): its metadata first, then its directory, then shared files
    publish = steps.index(("rename", "chk-2/_metadata"))
    assert steps[publish - 1][0] == "write"
    assert steps[publish - 1][1].startswith("chk-2/_metadata" + TMP_MARKER)
    assert all(op != "delete" for op, _ in steps[:publish])
    assert steps[publish + 1 : publish + 3] == [("delete", "chk-1/_metadata"), ("delete", "chk-1")]
    shared_deletes = [p for op, p in steps[publish + 3 :] if op == "delete" and "shared/" in p]
    assert len(steps) == publish + 3 + len(shared_deletes)
    # (a changelog's operator state changed: its file of checkpoint 1 is released too)
    assert bool(shared_deletes) == (fresh or mode == "changelog")
    tally = Tally()
    _restart_and_check(tally, dry, backend, mode, 2, "no crash", deep=True)
    tally.assert_clean()

    # the steps before the metadata publish of the re-uploading scenario are the same
    # kind as in the plain incremental one: enumerate its publish and deletes only
    points = _crash_points(steps, publish if fresh else 0, dedupe=not asynchronous)
    tally = Tally()
    for crash_at, when in points:
        root = tmp_path / f"{crash_at}-{when}"
        crashed, armed = _attempt_checkpoint(
            root, backend, mode, crash_at, when, fresh, asynchronous
        )
        tally.runs += 1
        tally.injected += crashed
        if not asynchronous:
            assert [_shape(s) for s in armed] == [_shape(s) for s in steps[: crash_at + 1]]
        tally.outcomes[f"{when} {armed[crash_at][0]}"] += 1
        published = _published(armed, crash_at, when, "chk-2/_metadata")
        assert (root / "chk-2" / "_metadata").exists() == published
        label = f"crash {when} step {crash_at} {armed[crash_at]}"
        deep = (crash_at, when) in (points[0], points[-1])
        _restart_and_check(tally, root, backend, mode, 2 if published else 1, label, deep)
    tally.report(
        f"checkpoint crash points [{backend}/{mode}{'/subsume' if fresh else ''}"
        f"{'/async' if asynchronous else ''}] steps={len(steps)} enumerated={len(points)}"
    )
    assert tally.injected == tally.runs == len(points)
    assert tally.outcomes["restored chk-1"] and tally.outcomes["restored chk-2"]
    tally.assert_clean()


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_a_crash_at_any_write_step_of_a_savepoint_never_leaves_a_loadable_partial_one(
    tmp_path: Path, backend: str
) -> None:
    # (savepoints are always in the canonical full format, whatever the checkpoint mode)
    def attempt(root: Path, crash_at: int | None, when: str) -> tuple[bool, list[Any], Path]:
        job, coordinator, storage, fs = _setup(root, backend, "full", asynchronous=False)
        target = root.parent / f"{root.name}-savepoint"
        fs.arm(crash_at, when)
        try:
            take_savepoint(
                coordinator, job.checkpointers(storage, "full", asynchronous=False),
                CheckpointStorage(str(target), fs=fs), source_positions={"offset": N2},
            )
        except InjectedCrash:
            pass
        finally:
            job.close()
        return fs.crashed, _relative(fs.steps, target), target

    crashed, steps, _ = attempt(tmp_path / "dry", None, "before")
    assert not crashed
    assert steps[-2][1].startswith("_metadata" + TMP_MARKER)
    assert steps[-1] == ("rename", "_metadata")
    assert all(not path.startswith("/") and op != "delete" for op, path in steps)
    points = _crash_points(steps, 0, dedupe=True)
    tally = Tally()
    leftovers = 0
    for crash_at, when in points:
        root = tmp_path / f"{crash_at}-{when}"
        crashed, armed, target = attempt(root, crash_at, when)
        tally.runs += 1
        tally.injected += crashed
        assert [_shape(s) for s in armed] == [_shape(s) for s in steps[: crash_at + 1]]
        if _published(armed, crash_at, when, "_metadata"):
            reads = ReadRecordingFileSystem(_local_fs())
            savepoint = load_checkpoint(CheckpointStorage(str(target), fs=reads))
            tally.outcomes["savepoint loads"] += 1
            job = Job(backend, restore_from=savepoint)
            try:
                allowed = {savepoint.storage.full_path(r.path) for r in savepoint.metadata.files()}
                tally.corrupt_loads += sum(
                    1 for p in reads.reads if not p.endswith("/_metadata") and p not in allowed
                )
                _compare(tally, job.state(), oracle(N2))
                job.run(N2, N)
                _compare(tally, job.state(), oracle(N))
            finally:
                job.close()
        else:
            with pytest.raises((NoCheckpointError, CorruptCheckpointError)) as info:
                load_checkpoint(str(target))
            tally.outcomes[f"refused: {type(info.value).__name__}"] += 1
            leftovers += sum(1 for p in target.rglob("*") if p.is_file())
        # a crashed savepoint leaves the checkpoints alone
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            coordinator = CheckpointCoordinator(str(root), retained=1)
        latest = coordinator.latest()
        assert latest is not None and latest.checkpoint_id == 1
        assert set(coordinator.storage.walk_files()) == coordinator.referenced_files()
    tally.report(
        f"savepoint crash points [{backend}] steps={len(steps)} enumerated={len(points)} "
        f"(files left in crashed savepoint directories: {leftovers})"
    )
    assert tally.injected == tally.runs == len(points)
    assert tally.outcomes["savepoint loads"] == 1  # only the crash after the last rename
    tally.assert_clean()


# ---------------------------------------------------------------- 2. corruption

CORRUPTIONS = ("bit-flip", "truncated", "zero-length", "missing", "format-version")
_META_HEADER = 8 + 2 + 32  # magic, uint16 version, SHA-256 of the body


def _corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "bit-flip":
        data[len(data) // 2] ^= 0x10
    elif how == "truncated":
        del data[len(data) // 2 :]
    elif how == "zero-length":
        data = bytearray()
    elif how == "format-version":
        # the uint16 after the 8-byte magic; the metadata body checksum does not
        # cover it, a data file's SHA-256 in the metadata does
        struct.pack_into(">H", data, 8, FORMAT_VERSION + 1)
    if how == "missing":
        path.unlink()
    else:
        path.write_bytes(bytes(data))


def _reseal(root: Path, checkpoint: str, relative: str) -> None:
    """Make the metadata of ``checkpoint`` vouch for the current bytes of ``relative``
    (new SHA-256 in the body, new body checksum): a data file that is intact but of
    another format version."""
    meta_path = root / checkpoint / "_metadata"
    meta = meta_path.read_bytes()
    text = meta[_META_HEADER:].decode()
    old = re.findall(r'\{"path":"' + re.escape(relative) + r'","sha256":"([0-9a-f]+)"', text)
    assert len(old) == 1, relative
    new = hashlib.sha256((root / relative).read_bytes()).hexdigest()
    payload = text.replace(old[0], new).encode()
    json.loads(payload)
    meta_path.write_bytes(meta[:10] + hashlib.sha256(payload).digest() + payload)


def _build_two_checkpoints(root: Path, backend: str, mode: str) -> tuple[Any, Any]:
    coordinator = CheckpointCoordinator(str(root))
    job = Job(backend)
    try:
        job.run(0, N1)
        chk1 = job.checkpoint(coordinator, coordinator.storage, mode, N1)
        job.run(N1, N2)
        chk2 = job.checkpoint(coordinator, coordinator.storage, mode, N2)
        if mode == "full":
            savepoint = take_savepoint(
                coordinator, [h.checkpointer(coordinator.storage) for h in job.harnesses],
                str(root.parent / "savepoint"), source_positions={"offset": N2},
            )
            assert savepoint.checkpoint_id == 3
    finally:
        job.close()
    return chk1, chk2


def _targets(chk1: CompletedCheckpoint, chk2: CompletedCheckpoint) -> dict[str, str]:
    """One file of checkpoint 2 of every kind it has (relative to the storage root)."""
    subtasks = chk2.metadata.operators["operator"].subtasks
    out = {"metadata": "chk-2/_metadata"}
    first, second = subtasks
    assert second.operator_file is not None
    out["op"] = second.operator_file.path
    keyed = first.keyed
    if isinstance(keyed, KeyedFullHandle):
        out["keyed"] = keyed.file.path
    elif isinstance(keyed, KeyedChangelogHandle):
        # checkpoint 2's own delta (the base is checkpoint 1's: both need it)
        assert keyed.base.file.path in chk1.metadata.shared_files() and keyed.deltas
        out["delta"] = keyed.deltas[-1].file.path
    else:
        # timers live in timer column families: in the SST files, no .timers file
        assert isinstance(keyed, KeyedIncrementalHandle) and keyed.timers is None
        own = sorted(chk2.metadata.shared_files() - chk1.metadata.shared_files())
        assert own, "checkpoint 2 uploads SST files of its own"
        out["shared-sst"] = own[0]
        private = second.keyed
        assert isinstance(private, KeyedIncrementalHandle)
        manifest = [n for n in private.private if n.startswith("MANIFEST")]
        out["private-manifest"] = private.private[manifest[0]].path
        out["private-current"] = private.private["CURRENT"].path
    return out


WEIR_FORMAT = ("metadata", "op", "keyed", "timers", "delta")


@pytest.mark.parametrize(("backend", "mode"), CONFIGS, ids=[f"{b}-{m}" for b, m in CONFIGS])
def test_corrupt_checkpoint_files_are_detected_skipped_by_recovery_and_refused_explicitly(
    tmp_path: Path, backend: str, mode: str
) -> None:
    base = tmp_path / "base" / "checkpoints"
    chk1, chk2 = _build_two_checkpoints(base, backend, mode)
    targets = _targets(chk1, chk2)
    tally = Tally()
    cases = detected = 0
    for target, relative in targets.items():
        for how in CORRUPTIONS:
            if how == "format-version" and target not in WEIR_FORMAT:
                continue  # RocksDB's own files have no weir header
            cases += 1
            root = tmp_path / f"{target}-{how}" / "checkpoints"
            shutil.copytree(base, root)
            _corrupt(root / relative, how)
            label = f"{target} {how}"
            names_file = relative if not (target == "metadata" and how == "missing") else "chk-2"

            # explicit restore: a typed error naming the file, nothing loaded
            expected: type[Exception] = CorruptCheckpointError
            if target == "metadata" and how == "missing":
                expected = NoCheckpointError
            elif target == "metadata" and how == "format-version":
                expected = CheckpointFormatError
            with pytest.raises(expected) as info:
                load_checkpoint(str(root / "chk-2"))
            assert names_file in str(info.value), (label, str(info.value))
            if target != "metadata":
                # checksums are verified on every read, not only by load_checkpoint
                unverified = load_checkpoint(str(root / "chk-2"), verify=False)
                with pytest.raises(CorruptCheckpointError, match=re.escape(relative)):
                    Job(backend, restore_from=unverified)

            # automatic recovery: warns, falls back to checkpoint 1
            reads = ReadRecordingFileSystem(_local_fs())
            if target == "metadata" and how == "missing":
                # indistinguishable from a checkpoint that never completed
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    coordinator = CheckpointCoordinator(CheckpointStorage(str(root), fs=reads))
                    latest = coordinator.latest()
            else:
                with pytest.warns(UserWarning, match=re.escape(relative)):
                    coordinator = CheckpointCoordinator(CheckpointStorage(str(root), fs=reads))
                    latest = coordinator.latest()
            assert latest is not None and latest.checkpoint_id == 1, label
            loads_before = tally.corrupt_loads
            reads.reads.clear()
            job = Job(backend, restore_from=latest)
            try:
                allowed = {latest.storage.full_path(r.path) for r in latest.metadata.files()}
                tally.corrupt_loads += sum(1 for p in reads.reads if p not in allowed)
                mismatched = tally.mismatched
                _compare(tally, job.state(), oracle(N1))
                tally.mismatched += job.processed() != oracle_processed(N1)
            finally:
                job.close()
            detected += tally.mismatched == mismatched and tally.corrupt_loads == loads_before
            tally.outcomes[type(info.value).__name__] += 1
    tally.runs = cases
    tally.report(f"corruption [{backend}/{mode}] files={sorted(targets)} detected={detected}")
    assert detected == cases == len(targets) * len(CORRUPTIONS) - sum(
        1 for t in targets if t not in WEIR_FORMAT
    )
    tally.assert_clean()


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_an_explicit_restore_of_a_corrupt_savepoint_fails_fast_naming_the_file(
    tmp_path: Path, backend: str
) -> None:
    base = tmp_path / "base" / "checkpoints"
    _build_two_checkpoints(base, backend, "full")
    savepoint = load_checkpoint(str(base.parent / "savepoint"))
    first, second = savepoint.metadata.operators["operator"].subtasks
    assert isinstance(first.keyed, KeyedFullHandle) and second.operator_file is not None
    targets = {
        "metadata": "_metadata", "keyed": first.keyed.file.path, "op": second.operator_file.path,
    }
    refused = Counter[str]()
    for target, relative in targets.items():
        for how in CORRUPTIONS:
            copy = tmp_path / f"{target}-{how}"
            shutil.copytree(base.parent / "savepoint", copy)
            _corrupt(copy / relative, how)
            expected: type[Exception] = CorruptCheckpointError
            if target == "metadata" and how == "missing":
                expected = NoCheckpointError
            elif target == "metadata" and how == "format-version":
                expected = CheckpointFormatError
            with pytest.raises(expected) as info:
                load_checkpoint(str(copy))
            assert (relative if how != "missing" or target != "metadata" else "_metadata") in str(
                info.value
            )
            refused[type(info.value).__name__] += 1
    print(f"savepoint corruption [{backend}]: refused {sum(refused.values())} of "
          f"{len(targets) * len(CORRUPTIONS)}: {dict(refused)}")
    assert sum(refused.values()) == len(targets) * len(CORRUPTIONS)


@pytest.mark.parametrize(("backend", "mode"), CONFIGS, ids=[f"{b}-{m}" for b, m in CONFIGS])
def test_a_data_file_of_another_format_version_is_refused_even_with_a_matching_checksum(
    tmp_path: Path, backend: str, mode: str
) -> None:
    base = tmp_path / "base" / "checkpoints"
    chk1, chk2 = _build_two_checkpoints(base, backend, mode)
    targets = {t: r for t, r in _targets(chk1, chk2).items()
               if t in ("op", "keyed", "timers", "delta")}
    # (incremental RocksDB: keyed state and timers are in RocksDB's own files)
    assert len(targets) == (1 if mode == "incremental" else 2)
    for target, relative in targets.items():
        root = tmp_path / target / "checkpoints"
        shutil.copytree(base, root)
        _corrupt(root / relative, "format-version")
        _reseal(root, "chk-2", relative)
        try:
            checkpoint = load_checkpoint(str(root / "chk-2"))  # sizes and checksums match
        except CheckpointFormatError as exc:
            assert relative in str(exc)  # (should verification learn to read headers)
        else:
            with pytest.raises(CheckpointFormatError, match=re.escape(relative)) as info:
                Job(backend, restore_from=checkpoint)
            assert f"version {FORMAT_VERSION + 1}" in str(info.value)
        # automatic recovery never loads it either: latest() verifies sizes and
        # checksums only, so it offers checkpoint 2 and the restore refuses it (or,
        # should latest() learn to read headers, it falls back to checkpoint 1)
        latest = CheckpointCoordinator(str(root)).latest()
        assert latest is not None
        print(f"resealed {target} of version {FORMAT_VERSION + 1}: latest() -> "
              f"checkpoint {latest.checkpoint_id}")
        if latest.checkpoint_id == 2:
            with pytest.raises(CheckpointFormatError, match=re.escape(relative)):
                Job(backend, restore_from=latest)
        else:
            job = Job(backend, restore_from=latest)
            try:
                assert job.state() == oracle(N1)
            finally:
                job.close()


def test_a_shared_file_every_retained_checkpoint_needs_leaves_nothing_to_recover(
    tmp_path: Path,
) -> None:
    root = tmp_path / "checkpoints"
    chk1, chk2 = _build_two_checkpoints(root, "rocksdb", "incremental")
    common = sorted(chk1.metadata.shared_files() & chk2.metadata.shared_files())
    assert common, "checkpoint 2 reuses SST files uploaded by checkpoint 1"
    _corrupt(root / common[0], "bit-flip")
    with pytest.warns(UserWarning, match=re.escape(common[0])) as caught:
        latest = CheckpointCoordinator(str(root)).latest()
    assert latest is None
    assert sum("is corrupt and is skipped" in str(w.message) for w in caught) == 2
    for chk in ("chk-1", "chk-2"):
        with pytest.raises(CorruptCheckpointError, match=re.escape(common[0])):
            load_checkpoint(str(root / chk))


# ---------------------------------------------------------------- 3. disk full


class DiskFullFileSystem:
    """Delegates to ``wrapped``; file write number ``fail_at`` (counted from
    :meth:`arm`) — and with ``persistent`` every later one — writes half its bytes and
    raises ``OSError(ENOSPC)``."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped
        self.fail_at: int | None = None
        self.persistent = False
        self.writes: list[str] = []
        self.failed: list[str] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def arm(self, fail_at: int | None, persistent: bool = False) -> None:
        with self._lock:
            self.fail_at, self.persistent = fail_at, persistent
            self.writes, self.failed = [], []

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        f = self.wrapped.open(path, mode, **kwargs)
        if "w" not in mode:
            return f
        with self._lock:
            index = len(self.writes)
            self.writes.append(str(path))
            fail = self.fail_at is not None and (
                index == self.fail_at or (self.persistent and index > self.fail_at)
            )
            if fail:
                self.failed.append(str(path))
        return _NoSpaceFile(f, str(path)) if fail else f


class _NoSpaceFile:
    """A file on a full disk: the first write stores half its bytes and fails; a file
    nothing was written to (an empty RocksDB log) fails when it is closed."""

    def __init__(self, f: Any, path: str) -> None:
        self._f = f
        self._path = path
        self._raised = False

    def _no_space(self) -> OSError:
        self._raised = True
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)

    def write(self, data: bytes) -> int:
        self._f.write(data[: len(data) // 2])
        raise self._no_space()

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()
        if not self._raised:
            raise self._no_space()

    def __enter__(self) -> _NoSpaceFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.mark.parametrize(("backend", "mode"), CONFIGS, ids=[f"{b}-{m}" for b, m in CONFIGS])
def test_a_full_disk_fails_the_checkpoint_cleanly_and_the_previous_one_still_restores(
    tmp_path: Path, backend: str, mode: str
) -> None:
    # Uploads run synchronously, subtask after subtask, so that every write of the
    # failed checkpoint has happened when it is aborted (see the asynchronous case
    # below for what happens otherwise).
    def setup(root: Path) -> tuple[Job, CheckpointCoordinator, CheckpointStorage, Any]:
        return _setup(root, backend, mode, False, DiskFullFileSystem)

    job, coordinator, storage, fs = setup(tmp_path / "dry")
    fs.arm(None)
    job.checkpoint(coordinator, storage, mode, N2, asynchronous=False)
    job.close()
    writes = len(fs.writes)
    assert writes >= 5 and "/chk-2/_metadata" in fs.writes[-1]

    tally = Tally()
    # every write fails once; a disk that stays full is tried at the first data
    # write, half way and at the metadata write
    runs = [(i, False) for i in range(writes)] + [(i, True) for i in (0, writes // 2, writes - 1)]
    for fail_at, persistent in runs:
        label = f"ENOSPC at write {fail_at}{' onwards' if persistent else ''}"
        root = tmp_path / f"{fail_at}-{persistent}"
        job, coordinator, storage, fs = setup(root)
        try:
            fs.arm(fail_at, persistent)
            with pytest.raises(CheckpointError, match="free space") as info:
                job.checkpoint(coordinator, storage, mode, N2, asynchronous=False)
            tally.runs += 1
            tally.injected += bool(fs.failed)
            cause = info.value.__cause__
            assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC, label
            # the failed checkpoint is aborted: nothing of it is left behind
            latest = coordinator.latest()
            assert latest is not None and latest.checkpoint_id == 1, label
            on_disk = set(storage.walk_files())
            assert on_disk == coordinator.referenced_files(), (
                f"{label}: left behind {sorted(on_disk - coordinator.referenced_files())}"
            )
            # and a restarted job (no clean-up needed) restores checkpoint 1
            fallback = CheckpointCoordinator(str(root), retained=1, clean_up=False).latest()
            assert fallback is not None and fallback.checkpoint_id == 1, label
            _restores_to(tally, backend, fallback, N1).close()
            # space is freed: the job goes on and its next checkpoint completes
            fs.arm(None)
            job.run(N2, N)
            chk3 = job.checkpoint(coordinator, storage, mode, N, asynchronous=False)
            assert chk3.checkpoint_id == 3, label
            assert set(storage.walk_files()) == coordinator.referenced_files(), label
        finally:
            job.close()
        if fail_at == 0:
            latest = CheckpointCoordinator(str(root), retained=1, clean_up=False).latest()
            assert latest is not None and latest.checkpoint_id == 3, label
            _restores_to(tally, backend, latest, N).close()
    tally.report(f"disk full [{backend}/{mode}] writes per checkpoint={writes}")
    assert tally.injected == tally.runs == len(runs)
    tally.assert_clean()


class _SlowSecondSubtask:
    """Once armed: subtask 1 publishes its first file, then is slow (it goes on only
    once subtask 0 failed); subtask 0 then fails with ENOSPC. (Not until the
    checkpoint directory is deleted: the abort waits for the uploads still running.)"""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped
        self.armed = False
        self.first_published = threading.Event()
        self.failed = threading.Event()
        self.aborted = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if self.armed and "w" in mode and "/0-" in path:
            self.first_published.wait(10)
            self.failed.set()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return self.wrapped.open(path, mode, **kwargs)

    def mv(self, path1: str, path2: str, **kwargs: Any) -> Any:
        result = self.wrapped.mv(path1, path2, **kwargs)
        if self.armed and "/1-" in path2 and not self.first_published.is_set():
            self.first_published.set()
            assert self.failed.wait(10)
        return result

    def rm(self, path: str, recursive: bool = False, **kwargs: Any) -> Any:
        result = self.wrapped.rm(path, recursive=recursive, **kwargs)
        if self.armed and str(path).rstrip("/").endswith("/chk-2"):
            self.aborted.set()
        return result


def test_an_aborted_asynchronous_checkpoint_leaves_no_files_of_subtasks_still_uploading(
    tmp_path: Path,
) -> None:
    fs = _SlowSecondSubtask(_local_fs())
    storage = CheckpointStorage(str(tmp_path), fs=fs)
    coordinator = CheckpointCoordinator(storage, retained=1)
    job = Job("hashmap")
    try:
        job.run(0, N1)
        job.checkpoint(coordinator, storage, "full", N1)
        job.run(N1, N2)
        fs.armed = True
        with pytest.raises(CheckpointError, match="free space"):
            job.checkpoint(coordinator, storage, "full", N2)
    finally:
        job.close()  # joins the upload threads
    assert fs.first_published.is_set() and fs.aborted.is_set()  # the scenario happened
    latest = coordinator.latest()
    assert latest is not None and latest.checkpoint_id == 1
    on_disk = set(storage.walk_files())
    assert on_disk == coordinator.referenced_files(), sorted(
        on_disk - coordinator.referenced_files()
    )


class _TaskStillWriting:
    """Delegates to ``wrapped``; the first recursive delete of a checkpoint directory
    races with a task in another process that writes one more file into it meanwhile,
    and fails as a local disk's does then (ENOTEMPTY)."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped
        self.raced = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def rm(self, path: str, recursive: bool = False, **kwargs: Any) -> Any:
        result = self.wrapped.rm(path, recursive=recursive, **kwargs)
        if recursive and not self.raced and re.search(r"/chk-\d+$", str(path).rstrip("/")):
            self.raced += 1
            self.wrapped.makedirs(f"{path}/op", exist_ok=True)
            with self.wrapped.open(f"{path}/op/late.bin", "wb") as f:
                f.write(b"an upload that ended after the abort")
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(path))
        return result


def test_a_checkpoint_aborted_while_a_task_still_writes_it_is_deleted_again_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The continuous runtime aborts a checkpoint while tasks in other processes may
    still upload into it: the abort must not fail the job (it raised the disk's
    ENOTEMPTY into the driver, which crashed), says what it left, and aborting it again
    once the tasks are stopped (the attempt's end) deletes the rest."""
    fs = _TaskStillWriting(_local_fs())
    storage = CheckpointStorage(str(tmp_path), fs=fs)
    coordinator = CheckpointCoordinator(storage)
    pending = coordinator.trigger()
    storage.write(f"{pending.directory}/op/part.bin", b"a task's upload")
    with caplog.at_level(logging.WARNING, "weir.checkpoint"):
        coordinator.abort(pending)
    assert fs.raced == 1
    assert f"aborted checkpoint {pending.checkpoint_id}" in caplog.text
    assert f"{tmp_path}/{pending.directory}" in caplog.text
    assert storage.walk_files() == [f"{pending.directory}/op/late.bin"]
    coordinator.abort(pending)  # the attempt's end: its tasks are stopped
    assert storage.walk_files() == []


# ---------------------------------------------------------------- 4. zombie attempts


class _Gated:
    """Delegates to ``wrapped``; every file write waits until ``gate`` is set."""

    def __init__(self, wrapped: Any, gate: threading.Event) -> None:
        self.wrapped = wrapped
        self.gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "w" in mode:
            assert self.gate.wait(30)
        return self.wrapped.open(path, mode, **kwargs)


class _NoOverwrite:
    """A storage whose rename refuses to replace an existing file."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def mv(self, path1: str, path2: str, **kwargs: Any) -> Any:
        if self.wrapped.exists(path2):
            raise FileExistsError(errno.EEXIST, "rename would overwrite", path2)
        return self.wrapped.mv(path1, path2, **kwargs)


# a changelog checkpointer owns its operator's change record: a second one on the same
# operator is refused (test_changelog), so a zombie attempt is another process there
ZOMBIE_CONFIGS = [c for c in CONFIGS if c[1] != "changelog"]


@pytest.mark.parametrize(("backend", "mode"), ZOMBIE_CONFIGS,
                         ids=[f"{b}-{m}" for b, m in ZOMBIE_CONFIGS])
def test_a_zombie_attempt_publishing_after_the_retry_completed_changes_nothing(
    tmp_path: Path, backend: str, mode: str
) -> None:
    root = tmp_path / "checkpoints"
    fs = _NoOverwrite(_local_fs())
    storage = CheckpointStorage(str(root), fs=fs)
    coordinator = CheckpointCoordinator(storage, retained=1)
    gate = threading.Event()
    zombie_storage = CheckpointStorage(str(root), fs=_Gated(fs, gate))
    job = Job(backend)
    zombies = []
    try:
        job.run(0, N1)
        job.checkpoint(coordinator, storage, mode, N1)
        pending = coordinator.trigger()
        # attempt 1 snapshots the state at N2 - 10 and hangs in its upload ...
        job.run(N1, N2 - 10)
        zombies = [SubtaskCheckpointer(h.operator, zombie_storage, mode=mode)
                   for h in job.harnesses]
        late = [z.snapshot(pending.checkpoint_id, pending.timestamp_ms) for z in zombies]
        # ... the retry of the same checkpoint snapshots N2 and is acknowledged
        job.run(N2 - 10, N2)
        retry = job.checkpointers(storage, mode)
        for c in retry:
            handle = c.snapshot(pending.checkpoint_id, pending.timestamp_ms).result(30)
            pending.acknowledge(c.uid, PARALLELISM, MAX_PARALLELISM, handle)
        completed = coordinator.complete(pending, {"offset": N2})
        for c in retry:
            c.notify_checkpoint_complete(pending.checkpoint_id)
        # now the zombie publishes its files
        gate.set()
        zombie_files = {ref.path for s in late for ref in s.result(30).files()}
    finally:
        gate.set()
        for z in zombies:
            z.close()
        job.close()
    committed = {ref.path for ref in completed.metadata.files()}
    assert zombie_files and zombie_files.isdisjoint(committed)  # attempt-unique names
    assert zombie_files <= set(storage.walk_files())  # the zombie really did publish
    completed.verify()  # and overwrote nothing of the committed attempt

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restarted = CheckpointCoordinator(str(root), retained=1)
    latest = restarted.latest()
    assert latest is not None and latest.checkpoint_id == completed.checkpoint_id == 2
    assert set(restarted.storage.walk_files()) == restarted.referenced_files()  # zombie gone
    tally = Tally(injected=1, runs=1)
    restored = _restores_to(tally, backend, latest, N2)
    try:
        restored.run(N2, N)
        _compare(tally, restored.state(), oracle(N))
    finally:
        restored.close()
    tally.report(f"zombie attempt [{backend}/{mode}] zombie files={len(zombie_files)}")
    tally.assert_clean()


def test_a_format_1_checkpoint_is_refused_because_its_keys_are_in_other_key_groups(
    tmp_path: Path,
) -> None:
    """Format 1 placed keys by murmur3 of their bytes; restoring it with the key hash of
    format 2 would look every key up in another group (state silently empty): its
    metadata and its data files are refused, saying why and what to do."""
    root = tmp_path / "checkpoints"
    _, chk2 = _build_two_checkpoints(root, "hashmap", "full")
    meta = root / "chk-2" / "_metadata"
    data = meta.read_bytes()
    doc = json.loads(data[8 + 2 + 32:])
    assert doc["format_version"] == FORMAT_VERSION == 2
    doc["format_version"] = 1
    body = json.dumps(doc).encode()
    meta.write_bytes(data[:8] + struct.pack(">H", 1) + hashlib.sha256(body).digest() + body)
    with pytest.raises(CheckpointFormatError, match="format 1 put keys in other key groups"):
        load_checkpoint(str(root / "chk-2"))
    first = chk2.metadata.operators["operator"].subtasks[0]
    assert first.operator_file is not None
    op_file = root / first.operator_file.path
    raw = bytearray(op_file.read_bytes())
    struct.pack_into(">H", raw, 8, 1)
    with pytest.raises(CheckpointFormatError, match="start the query on a new checkpoint"):
        check_data_header(bytes(raw), str(op_file))
