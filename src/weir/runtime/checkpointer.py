"""Snapshot strategies: how one operator subtask writes its state into storage.

* **Full** (both backends, and every savepoint): the synchronous part freezes keyed
  state — the hash-map backend copies its top-level dicts (copy-on-snapshot, see
  ``HashMapKeyedStateBackend.frozen_sources``), RocksDB takes a RocksDB snapshot per column
  family — and captures timers, operator and broadcast state. A worker thread then
  encodes the canonical entries and uploads them while processing goes on.
* **Changelog** (hash map or RocksDB, ``weir.checkpoint.changelog``): the first
  checkpoint writes the keyed state in full as the base; each later one writes only
  the keys and timers changed since the previous one (nothing when nothing changed)
  and operator state only when it changed; a background thread materializes the
  state now and then, and later checkpoints use it as their base. A changelog
  checkpointer assumes each checkpoint completes or the subtask restarts from the
  last completed one (the Spark runtime's rule); an aborted checkpoint makes the
  next one write a new base. With ``confirmed_only`` (the continuous runtime, where
  a checkpoint may be aborted while the job goes on and the abort can reach the
  subtask after the next barrier) a delta extends only a chain whose checkpoint is
  known complete, else the checkpoint writes a new base; a delta whose upload failed
  is never extended.
* **Incremental** (RocksDB checkpoints): the synchronous part is a native RocksDB
  checkpoint (memtables flushed, SST files hard-linked into a local directory). The
  worker uploads each SST file that the last *completed* checkpoint did not already
  upload to ``shared/`` (once; later checkpoints reference it), and the small private
  files (MANIFEST, CURRENT) to the checkpoint's own directory; the OPTIONS file goes
  to ``shared/`` once per distinct content. Timers are in the SST files too: before
  the native checkpoint the operator writes the timers changed since the last one
  into timer column families (``KeyedOperator._mirror_timers``). Which files
  are shared is learnt only from completed checkpoints (``notify_checkpoint_complete``),
  so a file of an aborted or subsumed checkpoint is never referenced again; after a
  restore, the SST files of the adopted checkpoint are referenced, not re-uploaded,
  when the new checkpoints go to the same storage (a checkpointer made before the
  restore learns them from ``adopt``, as the Spark runtime's tasks do).

Run one checkpoint at a time per subtask (Flink's default of one concurrent
checkpoint): a snapshot's files are referenced by the coordinator only once it
completes.

**Entries.** Every snapshot's ``stats.entries`` (``weir checkpoint inspect``'s and the
Spark runtime's ``state_entries``) is the number of keyed-state entries the subtask's
state holds at the checkpoint, whatever the strategy: one per key of each value,
reducing, aggregating and list state, one per (key, user key) of each map state —
what ``weir.read_state`` returns (a list state's rows are its elements; its keys
count); timers are not counted. A full snapshot counts the entries it writes (after
the ``cleanup_full_snapshot`` TTL filter), less its timers; it costs nothing. A
changelog or incremental snapshot writes only changes or files, so the backend counts
its live state in the synchronous part (``entry_count`` of the hash map and RocksDB
backends, ``weir.state.rocksdb_tables``' "Counting entries": nothing on the write path
of value and list states; a dict lookup per RocksDB map write, and a prefix scan at a
key's first write between two checkpoints; at a checkpoint, at most about a scan of
a RocksDB state, much less when few of its keys changed). There, entries of a TTL
state that expired and were not cleaned up yet count,
as the native RocksDB files hold them; a hash-map changelog whose base left them out
(``cleanup_full_snapshot``) counts them until cleanup removes them.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from weir.checkpoint.changelog import (
    ChangelogPolicy,
    digest,
)
from weir.checkpoint.format import (
    KeyedChangelogHandle,
    KeyedFullHandle,
    KeyedIncrementalHandle,
    SubtaskStateHandle,
    uid_dir,
)
from weir.checkpoint.storage import CheckpointStorage, FileRef
from weir.checkpoint.subtask_files import write_snapshot
from weir.errors import ConfigurationError
from weir.runtime.changelog_snapshots import ChangelogSnapshots, run_now
from weir.runtime.checkpoint_cpu import counted
from weir.runtime.operator import KeyedOperator, NonKeyedOperator
from weir.state.hashmap import HashMapKeyedStateBackend
from weir.state.rocksdb import RocksDBKeyedStateBackend
from weir.state.snapshot import OperatorSubtaskSnapshot

__all__ = ["PendingSnapshot", "SnapshotMode", "SubtaskCheckpointer"]


class SnapshotMode(enum.Enum):
    """How keyed state is written into checkpoints (savepoints are always full)."""

    FULL = "full"
    INCREMENTAL = "incremental"
    CHANGELOG = "changelog"


@dataclass
class PendingSnapshot:
    """A subtask snapshot whose synchronous part is done and whose upload runs."""

    checkpoint_id: int
    subtask_index: int
    sync_ms: float
    future: Future[SubtaskStateHandle]

    def result(self, timeout: float | None = None) -> SubtaskStateHandle:
        """Wait for the upload; the handle to acknowledge to the coordinator."""
        return self.future.result(timeout)


class SubtaskCheckpointer(ChangelogSnapshots):
    """Writes the snapshots of one operator subtask into checkpoint storage (changelog
    snapshots: ``weir.runtime.changelog_snapshots``)."""

    def __init__(
        self,
        operator: KeyedOperator | NonKeyedOperator,
        storage: CheckpointStorage,
        *,
        mode: SnapshotMode | str = SnapshotMode.FULL,
        asynchronous: bool = True,
        changelog: ChangelogPolicy | None = None,
        confirmed_only: bool = False,
    ) -> None:
        self.operator = operator
        self.storage = storage
        try:
            self.mode = SnapshotMode(mode)
        except ValueError:
            raise ConfigurationError(
                f"unknown snapshot mode {mode!r}; choose 'full', 'incremental' or 'changelog'"
            ) from None
        if self.mode is SnapshotMode.CHANGELOG and not (
            isinstance(operator, KeyedOperator)
            and isinstance(operator.backend, HashMapKeyedStateBackend | RocksDBKeyedStateBackend)
        ):
            raise ConfigurationError(
                f"{operator.config.describe()}: changelog snapshots need a keyed operator "
                f"on the hash-map or RocksDB backend"
            )
        self._changelog_mode = self.mode is SnapshotMode.CHANGELOG
        #: extend only a changelog whose checkpoint is known complete (the continuous
        #: runtime, where a checkpoint may be aborted while the job goes on)
        self.confirmed_only = confirmed_only
        self.policy = changelog or ChangelogPolicy(background=asynchronous)
        if self.mode is SnapshotMode.CHANGELOG:
            owner = getattr(operator, "changelog_owner", None)
            if owner is not None and owner() is not None:
                raise ConfigurationError(
                    f"{operator.config.describe()} already has a changelog checkpointer: "
                    f"the operator's record of changes serves one changelog; close() that "
                    f"checkpointer first"
                )
            operator.changelog_owner = weakref.ref(self)  # type: ignore[union-attr]
        #: the changelog this subtask's next checkpoint extends (None: write a base)
        self._chain: KeyedChangelogHandle | None = None
        #: the checkpoint whose snapshot wrote ``_chain`` (-1: adopted, or none yet),
        #: and the newest one known complete (``confirmed_only``)
        self._chain_id = -1
        self._completed_id = -1
        self._op_file: FileRef | None = None
        #: (checkpoint id, generation, upload) of the running materialization
        self._materializing: tuple[int, int, Future[KeyedFullHandle]] | None = None
        self._generation = 0
        self._materialized_at = time.monotonic()
        #: the upload of the last changelog snapshot (the next one extends its chain)
        self._last_changelog: Future[SubtaskStateHandle] | None = None
        self._mat_pool: ThreadPoolExecutor | None = None
        #: a no-op queued behind each pool's work (see :meth:`ended`)
        self._ends: list[Future[None]] | None = None
        self._asynchronous = asynchronous
        self._pool: ThreadPoolExecutor | None = None
        #: local SST file name -> shared file, as of the last completed checkpoint (or
        #: of the checkpoint restored from, when it lives in the same storage)
        self._uploaded: dict[str, FileRef] = {}
        backend = getattr(operator, "backend", None)
        adopted = getattr(backend, "adopted_shared", None)
        if adopted is not None and adopted[0] == storage.location:
            self._uploaded = dict(adopted[1])
        self._pending: dict[int, dict[str, FileRef]] = {}
        #: the keyed entries the next pending snapshot records, from its handle as
        #: written (set by ``snapshot`` in the synchronous part; see "Entries")
        self._entries: Callable[[SubtaskStateHandle], int] | None = None

    def _live_entries(self) -> int:
        """The keyed-state entries the subtask holds now (0 without keyed state)."""
        count = getattr(getattr(self.operator, "backend", None), "entry_count", None)
        return int(count()) if count is not None else 0

    def _timer_entries(self) -> int:
        """The timers a full snapshot of the subtask writes now."""
        op = self.operator
        if not isinstance(op, KeyedOperator):
            return 0
        return len(op.event_timers) + len(op.processing_timers)

    def _incremental(self, savepoint: bool) -> bool:
        return (
            not savepoint
            and self.mode is SnapshotMode.INCREMENTAL
            and isinstance(self.operator, KeyedOperator)
            and isinstance(self.operator.backend, RocksDBKeyedStateBackend)
        )

    def snapshot(
        self,
        checkpoint_id: int,
        timestamp: int,
        *,
        target: CheckpointStorage | None = None,
        savepoint: bool = False,
    ) -> PendingSnapshot:
        """Take the synchronous part now and start the upload (into ``target``, the
        savepoint's storage, when given; else this checkpointer's storage)."""
        storage = target if target is not None else self.storage
        if self.mode is SnapshotMode.CHANGELOG and not savepoint:
            live = self._live_entries()
            self._entries = lambda handle: live
            return self._snapshot_changelog(checkpoint_id, timestamp, storage)
        started = time.perf_counter()
        native_dir: str | None = None
        if self._incremental(savepoint):
            assert isinstance(self.operator, KeyedOperator)
            # next to the working directory: the same filesystem, so hard links
            assert isinstance(self.operator.backend, RocksDBKeyedStateBackend)
            db = self.operator.backend.path
            native_dir = os.path.join(
                tempfile.mkdtemp(prefix=f"{db.name}.native-", dir=db.parent), "db"
            )
            finish = self.operator.prepare_snapshot(
                checkpoint_id, timestamp, native_dir=native_dir
            )
            live = self._live_entries()  # (the native checkpoint flushed every table)
            self._entries = lambda handle: live
        else:
            finish = self.operator.prepare_snapshot(checkpoint_id, timestamp)
            timers = self._timer_entries()  # (the snapshot's entries count them too)
            self._entries = lambda handle: handle.stats.entries - timers
        sync_ms = (time.perf_counter() - started) * 1000
        base = (
            f"{uid_dir(self.uid)}/" if savepoint else f"chk-{checkpoint_id}/{uid_dir(self.uid)}/"
        )
        name = f"{self.operator.config.subtask_index}-{uuid.uuid4().hex[:12]}"

        def work() -> SubtaskStateHandle:
            return self._write(finish, storage, base + name, sync_ms, native_dir)

        return self._pending_snapshot(checkpoint_id, sync_ms, work)

    def _pending_snapshot(
        self, checkpoint_id: int, sync_ms: float, work: Callable[[], SubtaskStateHandle]
    ) -> PendingSnapshot:
        entries, self._entries = self._entries, None
        if entries is not None:
            work = _recording_entries(work, entries)
        future: Future[SubtaskStateHandle]
        if self._asynchronous:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"weir-snapshot-{self.uid}")
            future = self._pool.submit(counted(work))
        else:
            future = run_now(work)
        return PendingSnapshot(
            checkpoint_id, self.operator.config.subtask_index, sync_ms, future
        )

    def adopt(self, handle: SubtaskStateHandle, storage: CheckpointStorage) -> bool:
        """After restoring exactly ``handle`` (this subtask's key groups, in
        ``storage``): go on from it instead of writing the whole state again - a
        changelog goes on with its deltas; incremental RocksDB references the SST files
        it restored. Returns whether it was adopted."""
        keyed = handle.keyed
        if storage.root != self.storage.root or handle.key_group_range != self._range():
            return False
        if self._incremental(False) and isinstance(keyed, KeyedIncrementalHandle):
            assert isinstance(self.operator, KeyedOperator)
            assert isinstance(self.operator.backend, RocksDBKeyedStateBackend)
            adopted = self.operator.backend.adopted_shared
            if adopted is None or adopted[0] != storage.location:
                return False
            self._uploaded = dict(adopted[1])
            self._uploaded.update(
                (_by_content(ref.sha256), ref) for ref in keyed.private.values()
                if ref.path.startswith("shared/")
            )
            return True
        if self.mode is not SnapshotMode.CHANGELOG or not isinstance(
            keyed, KeyedChangelogHandle
        ):
            return False
        assert isinstance(self.operator, KeyedOperator)
        self.operator.track_changes(rebase_share=self.policy.rebase_share)
        self._chain = keyed
        self._chain_id = -1
        self._op_file = handle.operator_file
        self._generation += 1
        return True

    def _write(
        self,
        finish: Callable[[], OperatorSubtaskSnapshot],
        storage: CheckpointStorage,
        prefix: str,
        sync_ms: float,
        native_dir: str | None,
    ) -> SubtaskStateHandle:
        try:
            snap = finish()
            native = None
            if native_dir is not None:
                def native(prefix: str) -> tuple[dict[str, FileRef], dict[str, FileRef], int]:
                    return self._upload_native(storage, prefix, native_dir, snap.checkpoint_id)
            return write_snapshot(snap, storage, prefix, self._range(), sync_ms, native)
        finally:
            if native_dir is not None:
                shutil.rmtree(os.path.dirname(native_dir), ignore_errors=True)

    def _upload_native(
        self, storage: CheckpointStorage, prefix: str, native_dir: str, checkpoint_id: int
    ) -> tuple[dict[str, FileRef], dict[str, FileRef], int]:
        """Upload a native checkpoint: SST files not uploaded before into ``shared/``,
        the options file into ``shared/`` by content (it rarely changes), the rest
        (MANIFEST, CURRENT, ...) under ``prefix``. Returns (shared, private, bytes
        uploaded) and records what a later checkpoint may reference once this one
        completes."""
        shared: dict[str, FileRef] = {}
        private: dict[str, FileRef] = {}
        known: dict[str, FileRef] = {}
        uploaded = 0
        new_name = f"shared/{uid_dir(self.uid)}/{checkpoint_id}-{{}}"
        for name in sorted(os.listdir(native_dir)):
            path = Path(native_dir) / name
            if name.endswith(".sst"):
                ref = self._uploaded.get(name)
                if ref is None:
                    ref = storage.upload(new_name.format(f"{uuid.uuid4().hex}.sst"), path)
                    uploaded += ref.size
                shared[name] = known[name] = ref
            elif name.startswith("OPTIONS-"):
                data = path.read_bytes()
                ref = self._uploaded.get(_by_content(digest(data)))
                if ref is None:
                    # ("options-" sorts after the SST names: a deterministic delete order)
                    ref = storage.write(new_name.format(f"options-{uuid.uuid4().hex}"), data)
                    uploaded += ref.size
                private[name] = known[_by_content(ref.sha256)] = ref
            else:
                ref = storage.upload(f"{prefix}/{name}", path)
                uploaded += ref.size
                private[name] = ref
        self._pending[checkpoint_id] = known
        return shared, private, uploaded

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: its SST files are the base that
        later incremental checkpoints reference."""
        self._completed_id = max(self._completed_id, checkpoint_id)
        shared = self._pending.pop(checkpoint_id, None)
        if shared is not None:
            self._uploaded = shared
        for older in [c for c in self._pending if c < checkpoint_id]:
            del self._pending[older]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete: forget its uploads (a
        changelog starts over with a new base, as the aborted delta may be gone)."""
        self._pending.pop(checkpoint_id, None)
        if self.mode is SnapshotMode.CHANGELOG:
            self._chain = None
            self._generation += 1

    def ended(self, timeout_s: float) -> bool:
        """Whether the work already handed to the worker threads (uploads, a
        materialization) has ended, waiting up to ``timeout_s`` for it (so that a caller
        that must stay alive meanwhile, a task sending heartbeats, waits in steps)."""
        pools = [p for p in (self._pool, self._mat_pool) if p is not None]
        if self._ends is None or len(self._ends) != len(pools):
            # each pool has one thread, which runs its work in order: a no-op queued
            # behind it ends when that work has
            self._ends = [p.submit(_nothing) for p in pools]
        return not wait(self._ends, timeout=timeout_s).not_done

    def close(self) -> None:
        """Wait for running uploads and stop the worker threads (a materialization
        not started yet is cancelled)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._mat_pool is not None:
            self._mat_pool.shutdown(wait=True, cancel_futures=True)
            self._mat_pool = None
        owner = getattr(self.operator, "changelog_owner", None)
        if owner is not None and owner() is self:
            self.operator.changelog_owner = None


def _nothing() -> None:
    return None


def _recording_entries(
    work: Callable[[], SubtaskStateHandle], entries: Callable[[SubtaskStateHandle], int]
) -> Callable[[], SubtaskStateHandle]:
    """``work`` whose handle's ``stats.entries`` are ``entries(handle)``."""

    def recorded() -> SubtaskStateHandle:
        handle = work()
        stats = dataclasses.replace(handle.stats, entries=entries(handle))
        return dataclasses.replace(handle, stats=stats)

    return recorded


def _by_content(sha256: str) -> str:
    """The key of a file reused by content (not by local name) among uploaded files."""
    return f"sha256:{sha256}"
