"""A completed checkpoint or savepoint: its metadata, where its files are, verifying
its data files and loading a subtask's state from it (``CompletedCheckpoint``); and
opening one for an explicit restore (``load_checkpoint``). The coordinator that makes
and retains them is ``weir.checkpoint.coordinator``.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weir.checkpoint.changelog import replay
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
)
from weir.checkpoint.storage import CheckpointStorage, FileRef
from weir.errors import (
    ConfigurationError,
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

__all__ = ["CompletedCheckpoint", "load_checkpoint"]


def as_storage(
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
        groups: Mapping[int, Any] = {}
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
                    name, mode, serializer, elements.get(name, ()),
                    handle.operator_schemas.get(name),
                )
            for name, serializers in handle.broadcast_states.items():
                broadcast_states[name] = BroadcastStateSnapshot(
                    name, serializers, entries.get(name, ()),
                    handle.broadcast_schemas.get(name, (None, None)),
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
    storage = as_storage(location, storage_options)
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
