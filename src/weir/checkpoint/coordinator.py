"""The checkpoint coordinator: trigger, acknowledge, complete, abort, subsume, retain,
and find what to restore.

A checkpoint is complete exactly when its ``chk-<id>/_metadata`` is published (the
last write of a checkpoint). The coordinator keeps the newest ``retained``
completed checkpoints; completing one subsumes the oldest beyond that: its metadata
is deleted first (so it is no longer complete), then its own directory, then every
shared file whose reference count — over the *retained* checkpoints only — dropped
to zero. The new checkpoint's references are counted before anything is released,
so a file still referenced is never deleted (the case of FLINK-21351). Savepoints
live in their own self-contained directories: they neither count as retained
checkpoints nor hold references into ``shared/``, so taking one never subsumes or
releases anything.

After a crash, a new coordinator over the same storage reads every
``chk-*/_metadata`` (corrupt ones are reported and skipped), continues the ids
after the highest seen, and deletes what no complete checkpoint references:
temporary files, directories of checkpoints that never completed, unreferenced
shared files.
"""

from __future__ import annotations

import collections
import logging
import os
import posixpath
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weir.checkpoint.changelog import replay
from weir.checkpoint.channel_state import ChannelStateHandle
from weir.checkpoint.format import (
    METADATA_FILE,
    CheckpointKind,
    CheckpointMetadata,
    KeyedChangelogHandle,
    KeyedFullHandle,
    KeyedIncrementalHandle,
    OperatorHandle,
    SubtaskStateHandle,
    check_data_header,
    decode_keyed,
    decode_metadata,
    decode_operator_file,
    encode_metadata,
)
from weir.checkpoint.storage import TMP_MARKER, CheckpointStorage, FileRef
from weir.errors import (
    CheckpointError,
    ConfigurationError,
    CorruptCheckpointError,
    NoCheckpointError,
    RestoreError,
)
from weir.state.keygroups import (
    KeyGroupRange,
    check_parallelism,
    key_group_range_for_operator,
)
from weir.state.snapshot import (
    BroadcastStateSnapshot,
    KeyedStateSnapshot,
    NativeRocksDBState,
    OperatorListStateSnapshot,
    OperatorSubtaskSnapshot,
)

__all__ = [
    "CheckpointCoordinator",
    "CompletedCheckpoint",
    "PendingCheckpoint",
    "load_checkpoint",
]

log = logging.getLogger("weir.checkpoint")
_CHK = re.compile(r"^chk-(\d+)$")


def _wall_clock() -> int:
    return time.time_ns() // 1_000_000


def _as_storage(
    location: str | Path | CheckpointStorage, storage_options: dict[str, Any] | None
) -> CheckpointStorage:
    if isinstance(location, CheckpointStorage):
        return location
    return CheckpointStorage(location, storage_options=storage_options)


# ------------------------------------------------------------------ completed


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A complete checkpoint or savepoint: its metadata and where its files are.

    ``storage`` is the root its file references are relative to (the checkpoint
    storage root, or the savepoint directory); ``directory`` holds ``_metadata``.
    """

    storage: CheckpointStorage
    directory: str
    metadata: CheckpointMetadata

    @property
    def checkpoint_id(self) -> int:
        """The checkpoint id."""
        return self.metadata.checkpoint_id

    @property
    def kind(self) -> CheckpointKind:
        """Checkpoint or savepoint."""
        return self.metadata.kind

    @property
    def url(self) -> str:
        """Where its ``_metadata`` lives (what ``load_checkpoint`` accepts)."""
        base = self.storage.url.rstrip("/")
        return f"{base}/{self.directory}" if self.directory else base

    def _where(self) -> str:
        return f"{self.kind.value} {self.checkpoint_id} at {self.url}"

    def verify(self) -> None:
        """Raise CorruptCheckpointError unless every file is present and intact (and
        every weir data file has a readable format version)."""
        data_files = {
            ref.path
            for op in self.metadata.operators.values()
            for sub in op.subtasks
            for ref in _data_files(sub)
        }
        for ref in self.metadata.files():
            data = self.storage.read(ref, self._where())
            if ref.path in data_files:
                check_data_header(data, f"{self._where()}: {ref.path}")

    def check_operators(self, uids: Iterable[str], allow_non_restored_state: bool) -> None:
        """Raise RestoreError if it holds state of an operator not in ``uids``
        (unless ``allow_non_restored_state``)."""
        unknown = sorted(set(self.metadata.operators) - set(uids))
        if unknown and not allow_non_restored_state:
            raise RestoreError(
                f"{self._where()} holds state of operator(s) {unknown} that the job does not "
                f"have; restoring would drop it. Give those operators their old uids, or "
                f"pass allow_non_restored_state=True"
            )

    def load(
        self, uid: str, parallelism: int, subtask_index: int, local_dir: str | None = None
    ) -> list[OperatorSubtaskSnapshot]:
        """What subtask ``subtask_index`` of ``parallelism`` of operator ``uid`` needs to
        restore: every old subtask's operator and broadcast state, and the keyed state
        of the key groups it now owns (only those are decoded or downloaded; native
        RocksDB files into a new directory under ``local_dir``, default the system's
        temporary directory: put it on the filesystem of the RocksDB working
        directory, so adopting it is a rename). Empty if the checkpoint has no state
        for ``uid``."""
        op = self.metadata.operators.get(uid)
        if op is None:
            return []
        where = f"{self._where()}, operator {uid!r}"
        try:
            check_parallelism(parallelism, op.max_parallelism)
        except ConfigurationError as exc:
            raise RestoreError(
                f"{where}: cannot restore at parallelism {parallelism}: {exc}. The key "
                f"groups of a savepoint are fixed by its max_parallelism "
                f"({op.max_parallelism}); restore at a parallelism <= {op.max_parallelism}"
            ) from exc
        mine = key_group_range_for_operator(op.max_parallelism, parallelism, subtask_index)
        out = []
        try:
            for handle in op.subtasks:
                out.append(self._load_subtask(op, handle, mine, f"{where} subtask "
                                              f"{handle.subtask_index}", local_dir))
        except BaseException:
            for snap in out:
                if snap.keyed is not None and snap.keyed.native is not None:
                    shutil.rmtree(snap.keyed.native.path, ignore_errors=True)
            raise
        return out

    def load_subtask(
        self, uid: str, subtask_index: int, key_groups: KeyGroupRange | None = None,
        local_dir: str | None = None,
    ) -> OperatorSubtaskSnapshot:
        """Subtask ``subtask_index``'s snapshot of operator ``uid`` as it was written
        (for reading state offline): its operator and broadcast state and the keyed
        state of its key groups in ``key_groups`` (all of them if None; a native RocksDB
        checkpoint is downloaded into a new directory under ``local_dir``, which the
        caller removes)."""
        op = self.metadata.operators.get(uid)
        handles = {h.subtask_index: h for h in op.subtasks} if op is not None else {}
        if op is None or subtask_index not in handles:
            raise RestoreError(
                f"{self._where()} has no subtask {subtask_index} of operator {uid!r} "
                f"(operators: {sorted(self.metadata.operators)})"
            )
        handle = handles[subtask_index]
        mine = handle.key_group_range if key_groups is None else key_groups
        return self._load_subtask(op, handle, mine, f"{self._where()}, operator {uid!r} "
                                  f"subtask {subtask_index}", local_dir)

    def _load_subtask(
        self, op: OperatorHandle, handle: SubtaskStateHandle, mine: Any, where: str,
        local_dir: str | None = None,
    ) -> OperatorSubtaskSnapshot:
        overlap = handle.key_group_range.intersection(mine)
        keyed = None
        groups: dict[int, Any] = {}
        native = None
        full: KeyedFullHandle | None = None
        if isinstance(handle.keyed, KeyedFullHandle):
            full = handle.keyed
        elif isinstance(handle.keyed, KeyedChangelogHandle) and len(overlap):
            groups = replay(lambda ref: self.storage.read(ref, where), handle.keyed, overlap,
                            handle.metas, where)
        elif isinstance(handle.keyed, KeyedIncrementalHandle):
            full = handle.keyed.timers
            if len(overlap):
                native = NativeRocksDBState(
                    self._download_native(handle.keyed, where, local_dir),
                    handle.key_group_range,
                    (self.storage.location, dict(handle.keyed.shared)),
                )
        if full is not None and len(overlap):
            data = self.storage.read(full.file, where)
            groups = decode_keyed(data, full.key_groups, overlap, f"{where}: {full.file.path}")
        if handle.keyed is not None:
            keyed = KeyedStateSnapshot(
                op.max_parallelism, handle.key_group_range, handle.metas,
                handle.timer_states, groups, native,
            )
        operator_states: dict[str, OperatorListStateSnapshot] = {}
        broadcast_states: dict[str, BroadcastStateSnapshot] = {}
        if handle.operator_file is not None:
            data = self.storage.read(handle.operator_file, where)
            elements, entries = decode_operator_file(
                data, f"{where}: {handle.operator_file.path}"
            )
            for name, (mode, serializer) in handle.operator_states.items():
                operator_states[name] = OperatorListStateSnapshot(
                    name, mode, serializer, elements.get(name, ())
                )
            for name, serializers in handle.broadcast_states.items():
                broadcast_states[name] = BroadcastStateSnapshot(
                    name, serializers, entries.get(name, ())
                )
        return OperatorSubtaskSnapshot(
            op.uid, self.checkpoint_id, self.metadata.trigger_timestamp_ms, op.parallelism,
            handle.subtask_index, op.max_parallelism, keyed, operator_states, broadcast_states,
        )

    def _download_native(
        self, handle: KeyedIncrementalHandle, where: str, local_dir: str | None
    ) -> str:
        if local_dir is not None:
            os.makedirs(local_dir, exist_ok=True)
        target = Path(tempfile.mkdtemp(prefix="weir-restore-", dir=local_dir))
        try:
            for files in (handle.shared, handle.private):
                for name, ref in files.items():
                    self.storage.download(ref, target / name, where)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        return str(target)


def _data_files(sub: SubtaskStateHandle) -> list[FileRef]:
    out = [] if sub.operator_file is None else [sub.operator_file]
    if isinstance(sub.keyed, KeyedFullHandle):
        out.append(sub.keyed.file)
    elif isinstance(sub.keyed, KeyedIncrementalHandle) and sub.keyed.timers is not None:
        out.append(sub.keyed.timers.file)
    elif isinstance(sub.keyed, KeyedChangelogHandle):
        out.extend(sub.keyed.files())
    return out


def load_checkpoint(
    location: str | Path | CheckpointStorage,
    *,
    storage_options: dict[str, Any] | None = None,
    verify: bool = True,
) -> CompletedCheckpoint:
    """Open the checkpoint or savepoint whose ``_metadata`` is in ``location`` (a
    directory URL, or the ``_metadata`` file itself) for an explicit restore.

    Fails fast: a missing, corrupt or foreign file raises
    :class:`~weir.errors.CorruptCheckpointError` (checksums of every data file are
    verified unless ``verify=False``).
    """
    storage = _as_storage(location, storage_options)
    if storage.url.rstrip("/").endswith("/" + METADATA_FILE):
        parent_url = storage.url.rstrip("/")[: -len(METADATA_FILE) - 1]
        storage = CheckpointStorage(parent_url, fs=storage.fs)
    where = f"{storage.url.rstrip('/')}/{METADATA_FILE}"
    if not storage.exists(METADATA_FILE):
        raise NoCheckpointError(
            f"no {METADATA_FILE} in {storage.url}: not a complete checkpoint or savepoint "
            f"(an interrupted one never publishes its metadata)"
        )
    meta = decode_metadata(storage.read_bytes(METADATA_FILE, where), where)
    if meta.kind is CheckpointKind.SAVEPOINT:
        completed = CompletedCheckpoint(storage, "", meta)
    else:
        directory = posixpath.basename(storage.root.rstrip("/"))
        parent = storage.url.rstrip("/")[: -len(directory) - 1]
        completed = CompletedCheckpoint(CheckpointStorage(parent, fs=storage.fs), directory, meta)
    if verify:
        completed.verify()
    return completed


# ------------------------------------------------------------------ pending


@dataclass
class PendingCheckpoint:
    """A triggered checkpoint or savepoint collecting its subtasks' handles."""

    checkpoint_id: int
    timestamp_ms: int
    kind: CheckpointKind
    storage: CheckpointStorage
    directory: str
    started: float = field(default_factory=time.perf_counter)
    operators: dict[str, tuple[int, int]] = field(default_factory=dict)
    acks: dict[str, dict[int, SubtaskStateHandle]] = field(default_factory=dict)
    #: vertex -> (parallelism, subtask -> its channel-state file)
    channel_state: dict[str, tuple[int, dict[int, FileRef]]] = field(default_factory=dict)

    def acknowledge_channel_state(self, vertex: str, parallelism: int, subtask: int,
                                  ref: FileRef | None) -> None:
        """Record the channel-state file (``weir.checkpoint.channel_state``; None: it
        had no records in flight) of one task of an unaligned checkpoint."""
        files = self.channel_state.setdefault(vertex, (parallelism, {}))[1]
        if ref is not None:
            files[subtask] = ref

    def acknowledge(
        self, uid: str, parallelism: int, max_parallelism: int, handle: SubtaskStateHandle
    ) -> None:
        """Record the state handle of one operator subtask."""
        known = self.operators.setdefault(uid, (parallelism, max_parallelism))
        if known != (parallelism, max_parallelism):
            raise CheckpointError(
                f"checkpoint {self.checkpoint_id}: operator {uid!r} acknowledged with "
                f"parallelism/max_parallelism {(parallelism, max_parallelism)} and {known}"
            )
        self.acks.setdefault(uid, {})[handle.subtask_index] = handle

    def _operators(self) -> dict[str, OperatorHandle]:
        out = {}
        for uid, (parallelism, max_parallelism) in self.operators.items():
            acks = self.acks.get(uid, {})
            if sorted(acks) != list(range(parallelism)):
                raise CheckpointError(
                    f"checkpoint {self.checkpoint_id}: operator {uid!r} has acknowledgements "
                    f"from subtasks {sorted(acks)} of {parallelism}; it cannot complete"
                )
            out[uid] = OperatorHandle(
                uid, parallelism, max_parallelism, tuple(acks[i] for i in range(parallelism))
            )
        return out


# ------------------------------------------------------------------ coordinator


class CheckpointCoordinator:
    """Checkpoints of one job in one checkpoint storage (see the module doc)."""

    def __init__(
        self,
        storage: str | Path | CheckpointStorage,
        *,
        retained: int = 3,
        clock: Any = None,
        storage_options: dict[str, Any] | None = None,
        clean_up: bool = True,
    ) -> None:
        if not isinstance(retained, int) or retained < 1:
            raise ConfigurationError(f"retained checkpoints must be >= 1, got {retained!r}")
        self.storage = _as_storage(storage, storage_options)
        self.retained = retained
        self.clock = clock or _wall_clock
        self._completed: list[CompletedCheckpoint] = []
        self._refs: collections.Counter[str] = collections.Counter()
        self._corrupt: set[str] = set()
        self._next_id = 1
        self._scan()
        if clean_up:
            self.clean_up_orphans()

    # recovery -------------------------------------------------------------------------

    def _scan(self) -> None:
        ids = []
        for name in self.storage.list_dir():
            match = _CHK.match(name)
            if match:
                ids.append(int(match.group(1)))
        for cid in sorted(ids):
            directory = f"chk-{cid}"
            path = f"{directory}/{METADATA_FILE}"
            if not self.storage.exists(path):
                continue
            where = f"{self.storage.url.rstrip('/')}/{path}"
            try:
                meta = decode_metadata(self.storage.read_bytes(path, where), where)
            except CorruptCheckpointError as exc:
                self._warn(f"checkpoint {cid} is unreadable and is skipped: {exc}")
                self._corrupt.add(directory)
                continue
            self._add(CompletedCheckpoint(self.storage, directory, meta))
        self._next_id = max(ids, default=0) + 1

    def _warn(self, message: str) -> None:
        log.warning(message)
        warnings.warn(message, stacklevel=3)

    def clean_up_orphans(self) -> list[str]:
        """Delete files no complete checkpoint references: temporary files,
        directories of checkpoints that never completed, unreferenced shared files.
        Run only when no checkpoint is in flight. Returns the deleted paths."""
        keep = self.referenced_files()
        deleted = []
        for name in self.storage.list_dir():
            if not (_CHK.match(name) or name == "shared") or name in self._corrupt:
                continue
            for path in self.storage.walk_files(name):
                if path not in keep or TMP_MARKER in path:
                    self.storage.delete(path)
                    deleted.append(path)
            if _CHK.match(name) and not any(p.startswith(name + "/") for p in keep):
                self.storage.delete(name, recursive=True)
        if deleted:
            log.info("removed %d orphaned checkpoint files", len(deleted))
        return deleted

    # queries ----------------------------------------------------------------------------

    @property
    def completed_checkpoints(self) -> list[CompletedCheckpoint]:
        """Retained completed checkpoints, oldest first."""
        return list(self._completed)

    def latest(self, *, verify: bool = True) -> CompletedCheckpoint | None:
        """The newest complete checkpoint that is intact, for automatic recovery. A
        corrupt one (missing, truncated, checksum mismatch) is reported with a warning
        and skipped in favour of the one before it."""
        for completed in reversed(self._completed):
            if not verify:
                return completed
            try:
                completed.verify()
            except CorruptCheckpointError as exc:
                self._warn(
                    f"checkpoint {completed.checkpoint_id} is corrupt and is skipped for "
                    f"recovery: {exc}"
                )
                continue
            return completed
        return None

    def referenced_files(self) -> set[str]:
        """Paths of every file that a retained checkpoint references."""
        out = {f"{c.directory}/{METADATA_FILE}" for c in self._completed}
        out.update(ref.path for c in self._completed for ref in c.metadata.files())
        return out

    # life cycle ---------------------------------------------------------------------

    @property
    def next_id(self) -> int:
        """The id the next :meth:`trigger` gives (after every id seen in the storage)."""
        return self._next_id

    def trigger(self, timestamp_ms: int | None = None) -> PendingCheckpoint:
        """Start checkpoint ``n+1``."""
        cid = self._next_id
        self._next_id += 1
        ts = self.clock() if timestamp_ms is None else timestamp_ms
        return PendingCheckpoint(
            cid, ts, CheckpointKind.CHECKPOINT, self.storage, f"chk-{cid}"
        )

    def trigger_savepoint(
        self,
        target: str | Path | CheckpointStorage,
        *,
        timestamp_ms: int | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> PendingCheckpoint:
        """Start a savepoint into the directory ``target`` (which must not hold one)."""
        storage = _as_storage(target, storage_options)
        if storage.exists(METADATA_FILE):
            raise CheckpointError(
                f"{storage.url} already holds a savepoint; choose a new directory"
            )
        cid = self._next_id
        self._next_id += 1
        ts = self.clock() if timestamp_ms is None else timestamp_ms
        return PendingCheckpoint(cid, ts, CheckpointKind.SAVEPOINT, storage, "")

    def complete(
        self, pending: PendingCheckpoint, source_positions: Mapping[str, Any] | None = None
    ) -> CompletedCheckpoint:
        """Publish the metadata of ``pending`` (which makes it complete); for a
        checkpoint, then subsume checkpoints beyond the retained count."""
        meta = CheckpointMetadata(
            checkpoint_id=pending.checkpoint_id,
            kind=pending.kind,
            trigger_timestamp_ms=pending.timestamp_ms,
            completion_timestamp_ms=self.clock(),
            operators=pending._operators(),
            source_positions=dict(source_positions or {}),
            duration_ms=(time.perf_counter() - pending.started) * 1000,
            channel_state={v: ChannelStateHandle(v, p, dict(files))
                           for v, (p, files) in pending.channel_state.items()},
        )
        path = f"{pending.directory}/{METADATA_FILE}" if pending.directory else METADATA_FILE
        pending.storage.write(path, encode_metadata(meta))
        completed = CompletedCheckpoint(pending.storage, pending.directory, meta)
        if pending.kind is CheckpointKind.CHECKPOINT:
            self._add(completed)
            self.enforce_retention()
        return completed

    def enforce_retention(self, pinned: Collection[int] = ()) -> None:
        """Subsume the oldest completed checkpoints beyond the retained count; a
        ``pinned`` one (a savepoint is copying it) is kept and not counted."""
        while True:
            free = [c for c in self._completed if c.checkpoint_id not in pinned]
            if len(free) <= self.retained:
                return
            self._completed.remove(free[0])
            self._discard(free[0])

    def discard_all(self) -> None:
        """Delete every retained checkpoint and what only they referenced (a job
        cancelled without retention). Run only when no checkpoint is in flight."""
        while self._completed:
            self._discard(self._completed.pop(0))
        self.clean_up_orphans()

    def abort(self, pending: PendingCheckpoint) -> None:
        """Give up ``pending``: delete what it wrote — its directory and the shared files
        it uploaded (named ``shared/<operator>/<id>-…``) that no completed checkpoint
        references. Shared files of other checkpoints are never touched: another one may
        be pending at the same time (``max_concurrent`` > 1) and reference them.

        Tasks in other processes may still be writing into it (the continuous runtime
        cannot wait for them): what cannot be deleted now is logged, and the runtime
        deletes it once the attempt's tasks are stopped (:meth:`clean_up_orphans`; a
        savepoint's directory: by aborting it again)."""
        savepoint = pending.kind is CheckpointKind.SAVEPOINT
        where = pending.storage.url if savepoint else (
            f"{pending.storage.url.rstrip('/')}/{pending.directory}")
        try:
            if savepoint:
                for path in pending.storage.walk_files():
                    pending.storage.delete(path)
                return
            pending.storage.delete(pending.directory, recursive=True)
            keep = self.referenced_files()
            mine = f"{pending.checkpoint_id}-"
            for path in self.storage.walk_files("shared"):
                if posixpath.basename(path).startswith(mine) and path not in keep:
                    self.storage.delete(path)
        except OSError as exc:
            log.warning("aborted checkpoint %d: not every file of it could be deleted in %s "
                        "(%s: %s), probably a task still writing it; they are deleted once "
                        "the attempt's tasks are stopped",
                        pending.checkpoint_id, where, type(exc).__name__, exc)

    def _add(self, completed: CompletedCheckpoint) -> None:
        self._completed.append(completed)
        self._refs.update(completed.metadata.shared_files())

    def _discard(self, old: CompletedCheckpoint) -> None:
        self.storage.delete(f"{old.directory}/{METADATA_FILE}")
        self.storage.delete(old.directory, recursive=True)
        for path in sorted(old.metadata.shared_files()):
            self._refs[path] -= 1
            if self._refs[path] <= 0:
                del self._refs[path]
                self.storage.delete(path)
