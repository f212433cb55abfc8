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
import posixpath
import re
import time
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weir.checkpoint.channel_state import ChannelStateHandle
from weir.checkpoint.completed import CompletedCheckpoint, as_storage, load_checkpoint
from weir.checkpoint.format import (
    METADATA_FILE,
    CheckpointKind,
    CheckpointMetadata,
    OperatorHandle,
    SubtaskStateHandle,
    decode_metadata,
    encode_metadata,
)
from weir.checkpoint.storage import TMP_MARKER, CheckpointStorage, FileRef
from weir.errors import (
    CheckpointError,
    ConfigurationError,
    CorruptCheckpointError,
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
    #: a savepoint's directory was made for it alone (an abort removes the directory)
    fresh_directory: bool = False

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
        self.storage = as_storage(storage, storage_options)
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

    def rescan(self) -> None:
        """Read the storage again (another writer may have completed checkpoints since
        this coordinator read it: the continuous runtime's driver, right after it
        claimed the storage); ids go on after every id seen, never lower."""
        before = self._next_id
        self._completed, self._refs, self._corrupt = [], collections.Counter(), set()
        self._scan()
        self._next_id = max(self._next_id, before)

    @property
    def corrupt_ids(self) -> list[int]:
        """Ids of checkpoints whose ``_metadata`` exists but cannot be read."""
        return sorted(int(d[4:]) for d in self._corrupt)

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

    def clean_up_orphans(self, still_owner: Callable[[], bool] | None = None) -> list[str]:
        """Delete files no complete checkpoint references: temporary files,
        directories of checkpoints that never completed, unreferenced shared files.
        Run only when no checkpoint is in flight. Returns the deleted paths.
        ``still_owner`` is asked before each directory (a driver taken over stops
        deleting at once: what it does not know may be the new owner's)."""
        keep = self.referenced_files()
        deleted = []
        for name in self.storage.list_dir():
            if not (_CHK.match(name) or name == "shared") or name in self._corrupt:
                continue
            if still_owner is not None and not still_owner():
                break
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
        """The newest complete checkpoint that is intact, for a recovery of your own
        (the harness). A corrupt one (missing, truncated, checksum mismatch) is reported
        with a warning and skipped in favour of the one before it — which re-commits
        what sinks committed since; the runtimes never do that
        (:mod:`weir.checkpoint.protocol`)."""
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

    def skip_ids_to(self, first: int) -> None:
        """Give ids from ``first`` on (never lower than those already given): ids never
        repeat in a storage, also after a restore from a savepoint of a later id."""
        self._next_id = max(self._next_id, first)

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
        fresh_directory: bool = False,
    ) -> PendingCheckpoint:
        """Start a savepoint into the directory ``target``, which must be new or empty:
        an aborted savepoint deletes what is in its directory (a job's savepoints go
        into fresh directories, :func:`weir.checkpoint.protocol.new_savepoint_directory`:
        ``fresh_directory``, which an abort removes)."""
        storage = as_storage(target, storage_options)
        if storage.exists(METADATA_FILE):
            raise CheckpointError(
                f"{storage.url} already holds a savepoint; choose a new directory"
            )
        held = storage.walk_files()
        if held:
            raise CheckpointError(
                f"{storage.url} is not empty (it holds {held[0]!r} and {len(held) - 1} more "
                f"files); a savepoint goes into a new or empty directory, so that a failed "
                f"one deletes nothing else. Choose a new directory")
        cid = self._next_id
        self._next_id += 1
        ts = self.clock() if timestamp_ms is None else timestamp_ms
        return PendingCheckpoint(cid, ts, CheckpointKind.SAVEPOINT, storage, "",
                                 fresh_directory=fresh_directory)

    def complete(
        self, pending: PendingCheckpoint, source_positions: Mapping[str, Any] | None = None,
        *, owner: Mapping[str, Any] | None = None, exclusive: bool = False,
        subsume: bool = True,
    ) -> CompletedCheckpoint:
        """Publish the metadata of ``pending`` (which makes it complete); for a
        checkpoint, then subsume checkpoints beyond the retained count (a failure to
        delete one is logged, never the checkpoint's). ``exclusive``: publish with the
        storage's compare-and-set — of two writers of one checkpoint exactly one
        succeeds, the other gets a :class:`CheckpointError` (a job's driver,
        :mod:`weir.checkpoint.protocol`; atomic on local disks and object stores);
        otherwise by an atomic rename. ``owner``: what the metadata records of its
        writer. ``subsume=False``: the caller applies retention itself, later
        (:meth:`enforce_retention`: a driver first checks it still owns the storage)."""
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
            owner=dict(owner or {}),
        )
        path = f"{pending.directory}/{METADATA_FILE}" if pending.directory else METADATA_FILE
        if not exclusive:
            pending.storage.write(path, encode_metadata(meta))
        elif not pending.storage.create_exclusive(path, encode_metadata(meta)):
            raise CheckpointError(
                f"{pending.storage.url.rstrip('/')}/{path} was published by another writer "
                f"first: checkpoint {pending.checkpoint_id} is not this coordinator's (two "
                f"writers on one checkpoint storage?)")
        completed = CompletedCheckpoint(pending.storage, pending.directory, meta)
        if pending.kind is CheckpointKind.CHECKPOINT:
            self._add(completed)
            if subsume:
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

    def discard_all(self, still_owner: Callable[[], bool] | None = None) -> None:
        """Delete every retained checkpoint and what only they referenced (a job
        cancelled without retention). Run only when no checkpoint is in flight.
        ``still_owner``: as for :meth:`clean_up_orphans`."""
        while self._completed:
            if still_owner is not None and not still_owner():
                return
            self._discard(self._completed.pop(0))
        self.clean_up_orphans(still_owner)
        if (still_owner is None or still_owner()) and self.storage.exists("shared") and not (
                self.storage.walk_files("shared")):
            self.storage.delete("shared", recursive=True)  # (its empty directories)

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
            if not savepoint and self.storage.exists(f"{pending.directory}/{METADATA_FILE}"):
                # another writer completed this id (two drivers, one storage): its files
                # are referenced by its metadata; ours are orphans a clean-up removes
                log.warning("aborted checkpoint %d: %s holds another writer's completed "
                            "checkpoint; nothing of it is deleted", pending.checkpoint_id,
                            where)
                return
            if savepoint:  # (a new or empty directory, or a fresh one of the job's)
                for path in pending.storage.walk_files():
                    pending.storage.delete(path)
                if pending.fresh_directory and not pending.storage.walk_files():
                    pending.storage.delete("", recursive=True)  # (its empty directories)
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
        """Delete a subsumed checkpoint; a failure is logged (its files are orphans the
        next clean-up deletes), never fatal (Flink: discarding subsumed checkpoints)."""
        released = []
        for path in sorted(old.metadata.shared_files()):
            self._refs[path] -= 1
            if self._refs[path] <= 0:
                del self._refs[path]
                released.append(path)
        try:
            self.storage.delete(f"{old.directory}/{METADATA_FILE}")
            self.storage.delete(old.directory, recursive=True)
            for path in released:
                self.storage.delete(path)
        except (OSError, CheckpointError) as exc:
            log.warning("discarding subsumed checkpoint %d in %s failed (%s: %s); what is "
                        "left is deleted by the next clean-up", old.checkpoint_id,
                        self.storage.url, type(exc).__name__, exc)
