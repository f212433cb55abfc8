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
  process gone from this machine: boot id, pid namespace and start time) is taken
  over. The owner renews its lease while it runs
  and releases the storage at its end.
* **Fencing**: once a newer claim exists, the old owner stops at its next storage write
  (trigger, completion — checked before publishing and again before telling the sinks
  to commit — clean-up, per directory) with :class:`~weir.errors.FencedError`, and
  deletes nothing it does not own; losing the exclusive publish of a checkpoint id
  deletes nothing either.
* **Ids never repeat** (Flink's ``CheckpointIDCounter``): a run's first id is after
  every id in the storage, every earlier claim's first id and the id of the state it
  restores (a savepoint of a later id than the storage's checkpoints included).
* **Completion**: ``_metadata`` is published with ``create_exclusive`` (one winner) and
  records the writer's lineage and claim token (``CheckpointMetadata.owner``).
* **The restore decision**, when a run starts, made from the storage read after the
  claim: an explicit ``restore_from`` always wins; otherwise the storage's current
  state — the savepoint the previous run stopped with, else its newest completed
  checkpoint, else the ``restore_from`` it was given, else the newest completed
  checkpoint of any owner (restoring a checkpoint at least as new as the last one
  whose output was committed is always safe); after a run cancelled without retained
  checkpoints, empty state and a new lineage; checkpoints a run recorded as completed
  that are gone are an error, never empty state. A restart within the run goes to
  the run's own newest completed checkpoint, else the state the run started from.
  What is restored is logged. A corrupt checkpoint there (its files, or an unreadable
  ``_metadata`` of a later id) is an error, never a fallback to an older one: its
  sinks' transactions were committed when it completed, so an older checkpoint would
  commit them again (Flink fails the same way; the error names the file and the
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
from collections.abc import Callable
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

__all__ = ["JobOwnership", "RestorePoint", "new_savepoint_directory", "storage_state"]

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


#: a claim's ``source_note`` when its source is an explicit ``restore_from``
EXPLICIT = "restore_from"


def _identity(pid: int) -> str | None:
    """Who process ``pid`` of this machine is: boot id, pid namespace and start time
    (None: no such running process — gone, or a zombie not reaped yet — or no
    ``/proc`` to tell). Two equal identities are one process: a pid reused, or seen from
    another pid namespace or boot, never matches."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    if not fields or fields[0] == "Z":
        return None
    return f"{boot}:{namespace}:{fields[19]}"  # (field 22 of stat: start time)


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
        #: the newest checkpoint the run completed (recorded with its lease)
        self.last_completed: int | None = None
        #: the savepoint the run stopped with (recorded as it releases the storage)
        self.stopped_with: str | None = None

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
        :class:`OwnershipError` while another run owns it.

        The decision is made from the storage as it is *after* the claim: a previous
        owner that published a checkpoint and committed its output did so before its
        own ownership check, so before this claim — the storage read after it holds
        that checkpoint. (Read before, it might not: restoring an older one would
        commit that output again.)"""
        head = self.lineage.head()
        if head is not None and head.query != self.run_id:
            self._refuse_if_running(head)
        source: CompletedCheckpoint | None = None
        if restore_from is not None:
            try:
                source = load_checkpoint(restore_from, storage_options=storage_options)
            except CorruptCheckpointError as exc:  # an explicit restore fails fast
                raise CorruptCheckpointError(
                    f"job {self.job!r}: cannot restore from {restore_from}: {exc}") from exc
        ids = [self.coordinator.next_id - 1, self._recorded(head, "next_id", 1) - 1]
        ids += [c.batch or 0 for c in self.lineage.claims()]
        if source is not None:
            ids.append(source.checkpoint_id)
        first = max(ids) + 1
        token = head.token + 1 if head is not None else 1
        claim = self.lineage.try_claim(
            token, QUERY, self.run_id, first, None if source is None else source.url,
            EXPLICIT if source is not None else "the storage's state",
            "a new run" if head is None else f"after run {head.query}",
            lineage=self._lineage_of(head, source), host=socket.gethostname(),
            pid=os.getpid(), process=_identity(os.getpid()))
        if claim is None:
            winner = self.lineage.head()
            raise OwnershipError(
                f"{self.where}: another run ({None if winner is None else winner.query}) "
                f"claimed the storage at the same time; one checkpoint storage has one "
                f"running job. Stop the other run, or give this one another "
                f"checkpoint_storage")
        self.claim_ = claim
        self._renewer = threading.Thread(target=self._renew, daemon=True,
                                         name=f"weir lease {self.job}")
        self._renewer.start()
        try:
            self.coordinator.rescan()  # (see the docstring)
            if source is not None:
                start = RestorePoint(source, f"restore_from {source.url} "
                                             f"({source.metadata.kind.value} "
                                             f"{source.checkpoint_id})")
            else:
                start = self._current(head)
            self.coordinator.skip_ids_to(first)
        except BaseException:
            self.release()
            raise
        self.start = start
        log.warning("weir: job %r (run %s) owns %s from checkpoint id %d and starts from "
                    "%s", self.job, self.run_id, self.storage.url,
                    self.coordinator.next_id, start.note)
        return start

    def _lineage_of(self, head: Claim | None, source: CompletedCheckpoint | None) -> str:
        """The lineage the run continues: the restored checkpoint's or savepoint's (one
        without a recorded lineage — of another runtime, or an earlier weir — continues
        the storage's), else the storage's, else a new one."""
        if source is not None and source.metadata.owner.get("lineage"):
            return str(source.metadata.owner["lineage"])
        if head is not None and head.lineage and not self.lineage.discarded(head):
            return head.lineage
        if head is None and source is None:  # (a storage of an earlier weir: its newest)
            newest = self.coordinator.completed_checkpoints
            if newest and newest[-1].metadata.owner.get("lineage"):
                return str(newest[-1].metadata.owner["lineage"])
        return uuid.uuid4().hex

    def _recorded(self, head: Claim | None, name: str, default: int) -> int:
        """A number the head's owner recorded as it stopped or ran (``next_id``,
        ``last_completed``); ``default`` if it recorded none."""
        if head is None:
            return default
        for what in ("released", "alive"):
            value = self.lineage.record(head, what).get(name)
            if isinstance(value, int):
                return value
        return default

    def _refuse_if_running(self, head: Claim) -> None:
        if self.lineage.released(head) or head.kind != QUERY:
            return
        here = head.host == socket.gethostname() and head.pid is not None
        if (here and head.pid != os.getpid() and head.process is not None
                and _identity(int(head.pid or 0)) != head.process):
            return  # its driver process is gone (or a zombie): take over now
        if not self.lineage.alive(head):
            return  # its lease expired: gone, or hung (fenced at its next write)
        seen = max(0, wall_ms() - self.lineage.last_seen_ms(head)) / 1000
        raise OwnershipError(
            f"{self.where} is owned by run {head.query} of the job, which is running "
            f"(driver {head.host} pid {head.pid}, lease renewed {seen:.0f} s ago); one "
            f"checkpoint storage has one running job. Stop that run first, or give this "
            f"one another checkpoint_storage (to start from that job's state, pass "
            f"restore_from=<a savepoint of it>)")

    def _load(self, url: str) -> CompletedCheckpoint:
        """A checkpoint or savepoint the storage's history names, opened with the
        storage's options."""
        return load_checkpoint(url, storage_options=self.storage.storage_options)

    def _current(self, head: Claim | None) -> RestorePoint:
        """The storage's current state (see the module doc; :func:`storage_state`),
        verified; none where the last run completed a checkpoint is an error."""
        start = storage_state(self.lineage, head, self._newest, self._load)
        if start.checkpoint is not None or head is None or self.lineage.discarded(head):
            return start
        last = self._recorded(head, "last_completed", 0)
        if last:
            raise CorruptCheckpointError(
                f"job {self.job!r}: run {head.query} completed checkpoint {last} in "
                f"{self.storage.url}, but no completed checkpoint is there any more "
                f"(deleted by hand, or by a lifecycle rule?). weir does not start from "
                f"empty state by itself: its sinks committed that output. Restore the "
                f"checkpoints, start from a savepoint with restore_from=<savepoint>, or "
                f"start afresh with a new checkpoint_storage and new sink outputs")
        return start

    def _newest(self, token: int | None) -> CompletedCheckpoint | None:
        """The newest completed checkpoint written under claim ``token`` (None: by any
        owner), verified; a corrupt one — or an unreadable ``_metadata`` of a later id —
        is an error that says what to do."""
        chain = [c for c in self.coordinator.completed_checkpoints
                 if token is None or c.metadata.owner.get("token") == token]
        newest = chain[-1] if chain else None
        unreadable = [i for i in self.coordinator.corrupt_ids
                      if newest is None or i > newest.checkpoint_id]
        if unreadable and (token is None or newest is not None):
            return self._corrupt(unreadable[-1], f"its metadata chk-{unreadable[-1]}/"
                                                 f"_metadata cannot be read")
        if newest is None:
            return None
        try:
            newest.verify()
        except CorruptCheckpointError as exc:
            return self._corrupt(newest.checkpoint_id, str(exc), exc)
        return newest

    def _corrupt(self, checkpoint_id: int, problem: str,
                 cause: BaseException | None = None) -> CompletedCheckpoint:
        older = [c for c in self.coordinator.completed_checkpoints
                 if c.checkpoint_id < checkpoint_id]
        advice = (f"To start from the newest older one anyway, run the job with "
                  f"restore_from={older[-1].url!r}: the output its sinks committed "
                  f"at checkpoints {older[-1].checkpoint_id + 1}..{checkpoint_id}"
                  f" is then committed again (duplicates)" if older else
                  "No older checkpoint is retained here; start from a savepoint with "
                  "restore_from=<savepoint>, or from empty state with a new "
                  "checkpoint_storage and new sink outputs")
        raise CorruptCheckpointError(
            f"job {self.job!r}: the newest checkpoint {checkpoint_id} in "
            f"{self.storage.url} is corrupt: {problem}. weir does not fall back to an older "
            f"checkpoint by itself: the sinks committed this checkpoint's output when "
            f"it completed. Restore the file if you can. {advice}") from cause

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
                self.lineage.renew(self.token, {"last_completed": self.last_completed})
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
                facts: dict[str, Any] = {"next_id": self.coordinator.next_id,
                                         "last_completed": self.last_completed}
                if self.stopped_with is not None:
                    facts["savepoint"] = self.stopped_with
                self.lineage.release(self.token, discarded=discarded, facts=facts)
        except (OSError, CheckpointError) as exc:
            log.warning("weir: job %r: releasing %s failed (%s); the next run takes it "
                        "over once this driver is gone", self.job, self.storage.url, exc)


def storage_state(
    lineage: Lineage, head: Claim | None,
    newest: Callable[[int | None], CompletedCheckpoint | None],
    load: Callable[[str], CompletedCheckpoint],
) -> RestorePoint:
    """A job's checkpoint storage's current state (see the module doc): what its next
    run restores, and what the state processor reads of the storage's root — the
    savepoint the last run (``head``) stopped with, else that run's newest completed
    checkpoint, else the savepoint it was given (``restore_from``), else the newest
    completed checkpoint of any run, else what the run started from; empty after a
    cancel that deleted the checkpoints. ``newest(token)`` is the newest completed
    checkpoint under claim ``token`` (None: any), ``load(url)`` opens a savepoint."""
    if head is not None and lineage.discarded(head):
        return RestorePoint(None, f"empty state (run {head.query} was cancelled and "
                                  f"deleted its checkpoints)")
    stopped = None if head is None else lineage.record(head, "released").get("savepoint")
    if isinstance(stopped, str):  # (its output is committed: go on from it)
        found = load(stopped)
        return RestorePoint(found, f"the savepoint run {head.query if head else None} "
                                   f"stopped with ({found.url})")
    mine = newest(None if head is None else head.token)
    if mine is not None:
        return RestorePoint(mine, f"checkpoint {mine.checkpoint_id} ({mine.url})")
    if head is not None and head.source is not None and head.source_note == EXPLICIT:
        return RestorePoint(load(head.source), f"restore_from {head.source} "
                                               f"(given to run {head.query})")
    # the newest checkpoint of any owner: output of checkpoints up to it may be
    # committed, and restoring it commits its own transactions once more at most
    anyone = newest(None)
    if anyone is not None:
        return RestorePoint(anyone, f"checkpoint {anyone.checkpoint_id} ({anyone.url})")
    if head is not None and head.source is not None:
        return RestorePoint(load(head.source), head.source_note)
    return RestorePoint(None, "empty state" if head is None else
                        f"empty state (run {head.query} completed no checkpoint)")
