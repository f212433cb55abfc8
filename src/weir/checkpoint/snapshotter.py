"""Snapshot strategies: how one operator subtask writes its state into storage.

* **Full** (both backends, and every savepoint): the synchronous part freezes keyed
  state — the hash-map backend copies its top-level dicts (copy-on-snapshot, see
  ``HashMapStateBackend.frozen_sources``), RocksDB takes a RocksDB snapshot per column
  family — and captures timers, operator and broadcast state. A worker thread then
  encodes the canonical entries and uploads them while processing goes on.
* **Incremental** (RocksDB checkpoints): the synchronous part is a native RocksDB
  checkpoint (memtables flushed, SST files hard-linked into a local directory). The
  worker uploads each SST file that the last *completed* checkpoint did not already
  upload to ``shared/`` (once; later checkpoints reference it), and the small private
  files (MANIFEST, CURRENT, OPTIONS) to the checkpoint's own directory. Which files
  are shared is learnt only from completed checkpoints (``notify_checkpoint_complete``),
  so a file of an aborted or subsumed checkpoint is never referenced again; after a
  restore, the SST files of the adopted checkpoint are referenced, not re-uploaded,
  when the new checkpoints go to the same storage.

Run one checkpoint at a time per subtask (Flink's default of one concurrent
checkpoint): a snapshot's files are referenced by the coordinator only once it
completes.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from weir.checkpoint.format import (
    KeyedFullHandle,
    KeyedIncrementalHandle,
    SubtaskStateHandle,
    SubtaskStats,
    encode_keyed,
    encode_operator_file,
    uid_dir,
)
from weir.checkpoint.storage import CheckpointStorage, FileRef
from weir.errors import ConfigurationError
from weir.runtime.operator import KeyedOperator, NonKeyedOperator
from weir.state.keygroups import KeyGroupRange
from weir.state.rocksdb import RocksDBStateBackend
from weir.state.snapshot import OperatorSubtaskSnapshot

__all__ = ["PendingSnapshot", "SnapshotMode", "SubtaskCheckpointer", "write_snapshot"]


class SnapshotMode(enum.Enum):
    """How keyed state is written into checkpoints (savepoints are always full)."""

    FULL = "full"
    INCREMENTAL = "incremental"


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


class SubtaskCheckpointer:
    """Writes the snapshots of one operator subtask into checkpoint storage."""

    def __init__(
        self,
        operator: KeyedOperator | NonKeyedOperator,
        storage: CheckpointStorage,
        *,
        mode: SnapshotMode | str = SnapshotMode.FULL,
        asynchronous: bool = True,
    ) -> None:
        self.operator = operator
        self.storage = storage
        try:
            self.mode = SnapshotMode(mode)
        except ValueError:
            raise ConfigurationError(
                f"unknown snapshot mode {mode!r}; choose 'full' or 'incremental'"
            ) from None
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

    @property
    def uid(self) -> str:
        """The operator uid."""
        return self.operator.config.uid

    def _incremental(self, savepoint: bool) -> bool:
        return (
            not savepoint
            and self.mode is SnapshotMode.INCREMENTAL
            and isinstance(self.operator, KeyedOperator)
            and isinstance(self.operator.backend, RocksDBStateBackend)
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
        started = time.perf_counter()
        native_dir: str | None = None
        if self._incremental(savepoint):
            assert isinstance(self.operator, KeyedOperator)
            native_dir = os.path.join(tempfile.mkdtemp(prefix="weir-native-"), "db")
            finish = self.operator.prepare_snapshot(
                checkpoint_id, timestamp, native_dir=native_dir
            )
        else:
            finish = self.operator.prepare_snapshot(checkpoint_id, timestamp)
        sync_ms = (time.perf_counter() - started) * 1000
        base = (
            f"{uid_dir(self.uid)}/" if savepoint else f"chk-{checkpoint_id}/{uid_dir(self.uid)}/"
        )
        name = f"{self.operator.config.subtask_index}-{uuid.uuid4().hex[:12]}"

        def work() -> SubtaskStateHandle:
            return self._write(finish, storage, base + name, sync_ms, native_dir)

        future: Future[SubtaskStateHandle]
        if self._asynchronous:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"weir-snapshot-{self.uid}")
            future = self._pool.submit(work)
        else:
            future = Future()
            try:
                future.set_result(work())
            except BaseException as exc:
                future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
        return PendingSnapshot(
            checkpoint_id, self.operator.config.subtask_index, sync_ms, future
        )

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
                    shared, private, uploaded = self._upload_native(
                        storage, prefix, native_dir, snap.checkpoint_id)
                    self._pending[snap.checkpoint_id] = dict(shared)
                    return shared, private, uploaded
            return write_snapshot(snap, storage, prefix, self._range(), sync_ms, native)
        finally:
            if native_dir is not None:
                shutil.rmtree(os.path.dirname(native_dir), ignore_errors=True)

    def _range(self) -> KeyGroupRange:
        return self.operator.config.key_group_range

    def _upload_native(
        self, storage: CheckpointStorage, prefix: str, native_dir: str, checkpoint_id: int
    ) -> tuple[dict[str, FileRef], dict[str, FileRef], int]:
        shared: dict[str, FileRef] = {}
        private: dict[str, FileRef] = {}
        uploaded = 0
        for name in sorted(os.listdir(native_dir)):
            path = Path(native_dir) / name
            if name.endswith(".sst"):
                ref = self._uploaded.get(name)
                if ref is None:
                    ref = storage.upload(
                        f"shared/{uid_dir(self.uid)}/{checkpoint_id}-{uuid.uuid4().hex}.sst", path
                    )
                    uploaded += ref.size
                shared[name] = ref
            else:
                ref = storage.upload(f"{prefix}/{name}", path)
                uploaded += ref.size
                private[name] = ref
        return shared, private, uploaded

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: its SST files are the base that
        later incremental checkpoints reference."""
        shared = self._pending.pop(checkpoint_id, None)
        if shared is not None:
            self._uploaded = shared
        for older in [c for c in self._pending if c < checkpoint_id]:
            del self._pending[older]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete: forget its uploads."""
        self._pending.pop(checkpoint_id, None)

    def close(self) -> None:
        """Wait for running uploads and stop the worker thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


NativeUpload = Callable[[str], tuple[dict[str, FileRef], dict[str, FileRef], int]]


def write_snapshot(
    snap: OperatorSubtaskSnapshot,
    storage: CheckpointStorage,
    prefix: str,
    key_group_range: KeyGroupRange,
    sync_ms: float = 0.0,
    native: NativeUpload | None = None,
) -> SubtaskStateHandle:
    """Write the files of one subtask snapshot under ``prefix`` (``native`` uploads a
    native RocksDB checkpoint and returns its shared and private files); the handle
    to acknowledge."""
    started = time.perf_counter()
    keyed: KeyedFullHandle | KeyedIncrementalHandle | None = None
    new_bytes = 0
    entries = 0
    metas = snap.keyed.metas if snap.keyed is not None else {}
    timer_states = snap.keyed.timer_states if snap.keyed is not None else ()
    if snap.keyed is not None:
        data, index, entries = encode_keyed(snap.keyed.groups)
        full: KeyedFullHandle | None = None
        if index or native is None:
            suffix = ".timers" if native is not None else ".keyed"
            ref = storage.write(prefix + suffix, data)
            new_bytes += ref.size
            full = KeyedFullHandle(ref, index)
        if native is not None:
            shared, private, uploaded = native(prefix)
            new_bytes += uploaded
            keyed = KeyedIncrementalHandle(shared, private, full)
        else:
            keyed = full
    operator_file = None
    if snap.operator_states or snap.broadcast_states:
        data = encode_operator_file(
            {n: s.elements for n, s in snap.operator_states.items()},
            {n: b.entries for n, b in snap.broadcast_states.items()},
        )
        operator_file = storage.write(prefix + ".op", data)
        new_bytes += operator_file.size
    handle = SubtaskStateHandle(
        subtask_index=snap.subtask_index,
        key_group_range=key_group_range,
        metas=metas,
        timer_states=timer_states,
        keyed=keyed,
        operator_states={n: (s.mode, s.serializer) for n, s in snap.operator_states.items()},
        broadcast_states={n: b.serializers for n, b in snap.broadcast_states.items()},
        operator_file=operator_file,
    )
    stats = SubtaskStats(
        sum(f.size for f in handle.files()), new_bytes, sync_ms,
        (time.perf_counter() - started) * 1000, entries,
    )
    return dataclasses.replace(handle, stats=stats)
