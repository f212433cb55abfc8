"""Explicit resets of a Spark stage's state (``weir.spark.recover``).

weir never falls back to older or empty state by itself. When a stage cannot go on —
its previous batch's state is missing or corrupt, or Spark committed a batch that some
subtasks never ran — the user chooses what the stage continues from, and this module
records that choice as a *recovery claim* (:mod:`weir.checkpoint.ownership`), which
the next query that runs the stage adopts:

* ``"latest"`` — the newest completed checkpoint of the stage whose files all verify
  (the state changes of later batches are dropped; Spark does not replay batches it
  committed, so their records are not in the state);
* ``"empty"`` — empty state;
* a checkpoint or savepoint URL — verified before the claim is written.
"""

from __future__ import annotations

from dataclasses import dataclass

from weir.checkpoint.coordinator import CompletedCheckpoint, load_checkpoint
from weir.checkpoint.epochs import EpochStore
from weir.checkpoint.ownership import QUERY, RECOVERY, Claim, Lineage
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import CorruptCheckpointError, NoCheckpointError, OwnershipError

__all__ = ["Recovery", "recover_stage"]


@dataclass(frozen=True)
class Recovery:
    """What an explicit recovery set a stage to."""

    uid: str
    #: the checkpoint or savepoint the stage continues from (None: empty state)
    source: str | None
    #: what the stage continues from and what that drops, for people
    message: str


def _newest_intact(
    store: EpochStore, head: Claim
) -> tuple[CompletedCheckpoint | None, list[int], list[str]]:
    """The newest completed checkpoint under ``head`` whose files verify, the batches
    after it that are dropped, and the problems found on the way."""
    problems: list[str] = []
    if head.kind != QUERY or head.query is None:
        return None, [], problems
    ids = [i for i in store.completed_ids(head.query) if i >= (head.batch or 0)]
    for cid in reversed(ids):
        try:
            found = store.completed(head.query, cid)
            if found is None:
                continue
            found.verify()
        except CorruptCheckpointError as exc:
            problems.append(str(exc))
            continue
        later = [b for b in store.batches(head.query) if b > cid]
        return found, later, problems
    return None, store.batches(head.query), problems


def recover_stage(
    location: str, uid: str, source: str = "latest", *, force: bool = False,
    lease_timeout_ms: int = 60_000, storage_options: dict[str, object] | None = None,
) -> Recovery:
    """Reset stage ``uid`` in ``location`` to ``source`` (see the module doc)."""
    storage = CheckpointStorage(location, storage_options=storage_options)
    store = EpochStore(storage, uid)
    lineage = Lineage(store.stage, lease_timeout_ms)
    head = lineage.head()
    where = f"operator {uid!r} in {location}"
    if head is not None and lineage.alive(head) and not force:
        raise OwnershipError(
            f"{where} is owned by query {head.query}, which may still be running (last batch "
            f"less than {lease_timeout_ms / 1000:.0f} s ago); stop it first, or pass "
            f"force=True (--force) if it is gone"
        )
    dropped: list[int] = []
    after: int | None = None
    if source == "empty":
        url, note = None, "empty state"
    elif source == "latest":
        if head is None:
            raise NoCheckpointError(f"{where}: the stage has no state here to recover")
        found, dropped, problems = _newest_intact(store, head)
        if found is not None:
            url, note = found.url, f"checkpoint {found.checkpoint_id} of query {head.query}"
            after = found.checkpoint_id
        elif head.source is not None:
            load_checkpoint(head.source, storage_options=storage_options, verify=True)
            url, note = head.source, head.source_note
        else:
            url, note = None, f"empty state ({head.source_note})"
        if problems:
            note += " (skipped: " + "; ".join(problems) + ")"
    else:
        found = load_checkpoint(source, storage_options=storage_options, verify=True)
        url, note = found.url, f"{found.kind.value} {found.checkpoint_id} at {found.url}"
    token = head.token + 1 if head is not None else 1
    claim = lineage.try_claim(token, RECOVERY, None, None, url, note, f"recover({source!r})")
    if claim is None:
        raise OwnershipError(f"{where}: another claim was written meanwhile; run recover again")
    message = f"{where}: the next query to run the stage continues from {note}"
    if after is not None and head is not None:
        message += (f"; the state changes of every batch of query {head.query} after batch "
                    f"{after} are dropped" + (f" (batches {dropped} are here)" if dropped else "")
                    + ": Spark committed those batches, so their records are not processed "
                    "again")
    return Recovery(uid, url, message)
