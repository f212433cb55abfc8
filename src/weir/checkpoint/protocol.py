"""The checkpoint protocol of a job's checkpoint storage: one owner, its checkpoint
ids, its completions, its savepoint directories and what it restores.

The mechanisms are those of the Spark runtime's stages, applied to a whole checkpoint
storage (what is left to a runtime is its policy: the continuous runtime triggers by
barriers and restarts every task together):

* **One owner** (:mod:`weir.checkpoint.ownership`, Flink's leader election): a job run
  claims the storage when it starts — a claim created by compare-and-set, so of two
  drivers starting at once exactly one wins. A running owner (its lease renewed within
  ``lease_timeout``) refuses another run with :class:`~weir.errors.OwnershipError`
  naming it; an owner that is gone (released, its lease expired, or its driver
  process gone from this host) is taken over. The owner renews its lease while it runs
  and releases the storage at its end.
* **Fencing**: once a newer claim exists, the old owner stops at its next storage write
  (trigger, completion, clean-up) with :class:`~weir.errors.FencedError`, and deletes
  nothing: a fenced driver never touches the new owner's files.
* **Ids never repeat** (Flink's ``CheckpointIDCounter``): a run's first id is after
  every id in the storage, every earlier claim's first id and the id of the state it
  restores (a savepoint of a later id than the storage's checkpoints included).
* **Completion**: ``_metadata`` is published with ``create_exclusive`` (one winner) and
  records the writer's lineage and claim token (``CheckpointMetadata.owner``).
* **The restore decision**, when a run starts: an explicit ``restore_from`` always
  wins; otherwise the storage's current state — its head claim's newest completed
  checkpoint, else the state that claim started from (a savepoint given to an earlier
  run), else, for a storage without claims (written before this protocol), its newest
  completed checkpoint; after a run cancelled without retained checkpoints, empty state
  and a new lineage. A restart within the run goes to the run's own newest
  completed checkpoint, else the state the run started from. What is restored is
  logged. A corrupt checkpoint there is an error, never a fallback to an older one:
  its sinks' transactions were committed when it completed, so an older checkpoint
  would commit them again (Flink fails the same way; the error names the file and the
  explicit ``restore_from`` that starts from an older checkpoint, and what that
  re-commits).
* **Lineage**: the id of a job's history of state, kept in every claim and checkpoint.
  A run continuing the storage's state or restoring a checkpoint or savepoint continues
  its lineage; a start from empty state begins a new one. Sinks record the lineage
  they write for and refuse another (a fresh start onto used output).
* **Savepoints** (Flink's ``savepoint-<job>-<random>``): a savepoint of a running job
  goes into a fresh directory inside the target directory the user names; a failed one
  deletes only that directory, never what else the target holds.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weir.checkpoint.completed import CompletedCheckpoint, as_storage, load_checkpoint
from weir.checkpoint.coordinator import CheckpointCoordinator
from weir.checkpoint.ownership import QUERY, Claim, Lineage, wall_ms
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import (
    CheckpointError,
    CorruptCheckpointError,
    FencedError,
    OwnershipError,
    WeirError,
)

__all__ = ["JobOwnership", "RestorePoint", "new_savepoint_directory"]

log = logging.getLogger("weir.checkpoint")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def new_savepoint_directory(
    parent: str, job: str, storage_options: dict[str, Any] | None = None,
) -> CheckpointStorage:
    """A fresh directory for one savepoint of ``job`` inside ``parent`` (Flink's
    ``savepoint-<job>-<random>``): two savepoints never share one, and what else
    ``parent`` holds is never touched."""
    name = f"savepoint-{_UNSAFE.sub('_', job)[:40]}-{uuid.uuid4().hex[:12]}"
    return as_storage(parent, storage_options).child(name)


@dataclass(frozen=True)
class RestorePoint:
    """What a run (or a restart of it) restores, and why."""

    #: None: empty state
    checkpoint: CompletedCheckpoint | None
    #: for people: which state this is
    note: str

    @property
    def url(self) -> str | None:
        """The URL the tasks restore (None: empty state)."""
        return None if self.checkpoint is None else self.checkpoint.url


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie — killed, not yet reaped by
    its parent — does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # (no /proc: alive as far as we can tell)
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


class JobOwnership:
    """One run's ownership of a job's checkpoint storage (see the module doc).

    ``claim`` takes the storage and decides what the run starts from; ``check``
    before every storage write; ``restart_point`` for every restart; ``release`` at
    the end. The lease is renewed by a background thread between ``claim`` and
    ``release``."""

    def __init__(self, coordinator: CheckpointCoordinator, job: str, run_id: str, *,
                 lease_timeout_ms: int = 60_000) -> None:
        self.coordinator = coordinator
        self.storage: CheckpointStorage = coordinator.storage
        self.job, self.run_id = job, run_id
        self.lineage = Lineage(self.storage, lease_timeout_ms)
        self.claim_: Claim | None = None
        self.start: RestorePoint | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._fenced = False

    @property
    def where(self) -> str:
        """The storage, for messages."""
        return f"checkpoint storage {self.storage.url} of job {self.job!r}"

    @property
    def token(self) -> int:
        """The run's claim token."""
        assert self.claim_ is not None, "claim() first"
        return self.claim_.token

    @property
    def lineage_id(self) -> str:
        """The lineage the run continues."""
        assert self.claim_ is not None and self.claim_.lineage is not None
        return self.claim_.lineage

    def owner_record(self) -> dict[str, Any]:
        """What each completed checkpoint records of its writer."""
        return {"lineage": self.lineage_id, "token": self.token, "run": self.run_id}

    # -- starting ------------------------------------------------------------------------

    def claim(self, restore_from: str | None = None,
              storage_options: dict[str, Any] | None = None) -> RestorePoint:
        """Claim the storage for this run and decide what it starts from; raises
        :class:`OwnershipError` while another run owns it."""
        head = self.lineage.head()
        if head is not None and head.query != self.run_id:
            self._refuse_if_running(head)
        if restore_from is not None:
            try:
                source = load_checkpoint(restore_from, storage_options=storage_options)
            except CorruptCheckpointError as exc:  # an explicit restore fails fast
                raise CorruptCheckpointError(
                    f"job {self.job!r}: cannot restore from {restore_from}: {exc}") from exc
            start = RestorePoint(source, f"restore_from {source.url} "
                                         f"({source.metadata.kind.value} {source.checkpoint_id})")
            lineage = str(source.metadata.owner.get("lineage") or uuid.uuid4().hex)
        else:
            start = self._current(head)
            lineage = (head.lineage if head is not None and head.lineage
                       and not self.lineage.discarded(head) else None) or (
                None if start.checkpoint is None
                else start.checkpoint.metadata.owner.get("lineage")) or uuid.uuid4().hex
        ids = [self.coordinator.next_id - 1]
        ids += [c.batch or 0 for c in self.lineage.claims()]
        if start.checkpoint is not None:
            ids.append(start.checkpoint.checkpoint_id)
        first = max(ids) + 1
        token = head.token + 1 if head is not None else 1
        claim = self.lineage.try_claim(
            token, QUERY, self.run_id, first, start.url, start.note,
            "a new run" if head is None else f"after run {head.query}",
            lineage=str(lineage), host=socket.gethostname(), pid=os.getpid())
        if claim is None:
            winner = self.lineage.head()
            raise OwnershipError(
                f"{self.where}: another run ({None if winner is None else winner.query}) "
                f"claimed the storage at the same time; one checkpoint storage has one "
                f"running job. Stop the other run, or give this one another "
                f"checkpoint_storage")
        self.claim_, self.start = claim, start
        self.coordinator.skip_ids_to(first)
        log.warning("weir: job %r (run %s) owns %s from checkpoint id %d and starts from "
                    "%s", self.job, self.run_id, self.storage.url, first, start.note)
        self._renewer = threading.Thread(target=self._renew, daemon=True,
                                         name=f"weir lease {self.job}")
        self._renewer.start()
        return start

    def _refuse_if_running(self, head: Claim) -> None:
        if self.lineage.released(head) or head.kind != QUERY:
            return
        here = head.host == socket.gethostname() and head.pid is not None
        if here and head.pid != os.getpid() and not _process_alive(int(head.pid or 0)):
            return  # its driver process is gone: take over now
        if not self.lineage.alive(head):
            return  # its lease expired: gone, or hung (fenced at its next write)
        seen = max(0, wall_ms() - self.lineage.last_seen_ms(head)) / 1000
        raise OwnershipError(
            f"{self.where} is owned by run {head.query} of the job, which is running "
            f"(driver {head.host} pid {head.pid}, lease renewed {seen:.0f} s ago); one "
            f"checkpoint storage has one running job. Stop that run first, or give this "
            f"one another checkpoint_storage (to start from that job's state, pass "
            f"restore_from=<a savepoint of it>)")

    def _current(self, head: Claim | None) -> RestorePoint:
        """The storage's current state (see the module doc)."""
        mine = self._newest(None if head is None else head.token)
        if mine is not None:
            return RestorePoint(mine, f"checkpoint {mine.checkpoint_id} ({mine.url})")
        if head is not None and self.lineage.discarded(head):
            return RestorePoint(None, f"empty state (run {head.query} was cancelled and "
                                      f"deleted its checkpoints)")
        if head is not None and head.source is not None:
            return RestorePoint(load_checkpoint(head.source), head.source_note)
        if head is not None:
            return RestorePoint(None, f"empty state ({head.source_note})")
        return RestorePoint(None, "empty state (no checkpoint in the storage)")

    def _newest(self, token: int | None) -> CompletedCheckpoint | None:
        """The newest completed checkpoint written under claim ``token`` (None: any
        checkpoint, for a storage without claims), verified; a corrupt one is an error
        that says what to do."""
        chain = [c for c in self.coordinator.completed_checkpoints
                 if token is None or c.metadata.owner.get("token") == token]
        if not chain:
            return None
        newest = chain[-1]
        try:
            newest.verify()
        except CorruptCheckpointError as exc:
            older = [c for c in self.coordinator.completed_checkpoints
                     if c.checkpoint_id < newest.checkpoint_id]
            advice = (f"To start from the newest older one anyway, run the job with "
                      f"restore_from={older[-1].url!r}: the output its sinks committed "
                      f"at checkpoints {older[-1].checkpoint_id + 1}..{newest.checkpoint_id}"
                      f" is then committed again (duplicates)" if older else
                      "No older checkpoint is retained here; start from a savepoint with "
                      "restore_from=<savepoint>, or from empty state with a new "
                      "checkpoint_storage and new sink outputs")
            raise CorruptCheckpointError(
                f"job {self.job!r}: the newest checkpoint {newest.checkpoint_id} in "
                f"{self.storage.url} is corrupt: {exc}. weir does not fall back to an older "
                f"checkpoint by itself: the sinks committed this checkpoint's output when "
                f"it completed. Restore the file if you can. {advice}") from exc
        return newest

    # -- running -------------------------------------------------------------------------

    def restart_point(self) -> RestorePoint:
        """What a restart of the run restores: its own newest completed checkpoint,
        else the state it started from."""
        assert self.start is not None, "claim() first"
        self.check("restore")
        mine = self._newest(self.token)
        if mine is not None:
            return RestorePoint(mine, f"checkpoint {mine.checkpoint_id} ({mine.url})")
        return self.start

    def holds(self) -> bool:
        """Whether the run still owns the storage (one existence check)."""
        if self._fenced:
            return False
        if self.claim_ is not None and not self.lineage.is_head(self.token):
            self._fenced = True
        return not self._fenced

    def check(self, action: str) -> None:
        """Raise :class:`FencedError` if another run took the storage over (before
        ``action``, a write to the storage)."""
        if not self.holds():
            head = self.lineage.head()
            raise FencedError(
                f"{self.where}: run {self.run_id} was fenced off before {action}: run "
                f"{None if head is None else head.query} (driver "
                f"{None if head is None else head.host} pid "
                f"{None if head is None else head.pid}) took the storage over. This run "
                f"stops and deletes nothing; its state is no longer the job's")

    def _renew(self) -> None:
        interval = self.lineage.lease_timeout_ms / 4000
        while not self._stop.wait(interval):
            try:
                if not self.holds():
                    return
                self.lineage.renew(self.token)
            except (OSError, WeirError) as exc:  # (the next check or write reports it)
                log.warning("weir: job %r: renewing the lease on %s failed: %s", self.job,
                            self.storage.url, exc)

    def release(self, *, discarded: bool = False) -> None:
        """Give the storage up (the run ended; ``discarded``: it deleted its checkpoints,
        so the next run starts a new lineage from empty state); nothing if it was
        fenced off."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self.claim_ is None:
            return
        try:
            if self.holds():
                self.lineage.release(self.token, discarded=discarded)
        except (OSError, CheckpointError) as exc:
            log.warning("weir: job %r: releasing %s failed (%s); the next run takes it "
                        "over once this driver is gone", self.job, self.storage.url, exc)
