"""What a Spark task restores, decided from the stage's claims and epochs.

The task of batch N of query Q (:func:`plan_batch`):

1. If Q owns the stage (the head claim is Q's): in the claim's first batch F, the
   claim's source (``restore_from``, the previous owner's newest completed
   checkpoint, a recovery's checkpoint, or empty state); after it, batch N-1 of Q —
   completed now if Spark committed it but nobody completed it yet. N-1 missing is a
   :class:`MissingStateError`, never a fallback; N < F means Spark's checkpoint is
   older than weir's state (also an error).
2. If the head is a recovery claim (:func:`weir.spark.recover`): Q adopts it (a new
   claim from batch N with the recovery's source).
3. Otherwise Q is not the owner: a query that owned the stage before was fenced off
   (:class:`FencedError`); an owner that is still running refuses Q
   (:class:`OwnershipError`); a query that ran batches before without this stage's
   state (N > 0) is refused (:class:`MissingStateError`: the location was deleted,
   moved, restored from an older backup, or the stage is new in an old query); a new
   query (N = 0, or every batch before N marked ``_empty``: no row reached the
   stage yet) claims the stage — compare-and-set, one winner — from
   ``restore_from`` or the previous owner's newest completed checkpoint.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from weir.checkpoint.coordinator import CompletedCheckpoint, load_checkpoint
from weir.checkpoint.epoch_prior import PriorBatch, prior_of
from weir.checkpoint.epochs import EpochStore, lineage_state
from weir.checkpoint.ownership import QUERY, RECOVERY, Claim, Lineage, wall_ms
from weir.errors import (
    CorruptCheckpointError,
    FencedError,
    IncompleteBatchError,
    MissingStateError,
    OwnershipError,
)

__all__ = ["BatchStart", "plan_batch", "recover_hint"]

log = logging.getLogger(__name__)
_CLAIM_ATTEMPTS = 8


@dataclass(frozen=True)
class BatchStart:
    """What the task of one batch starts from."""

    claim: Claim
    #: the state to restore when not an earlier batch of this query (None: ``prior``,
    #: or empty state)
    checkpoint: CompletedCheckpoint | None
    #: the earlier batch of the same query to go on from (the newest one with rows: a
    #: worker-local subtask may be exactly it), read as its summary
    prior: PriorBatch | None = None


def recover_hint(store: EpochStore, source: str = "latest") -> str:
    """The exact call that resets the stage's state explicitly."""
    url, uid = store.location.url, store.uid
    return (f"weir.spark.recover({url!r}, {uid!r}, source={source!r}) (command line: "
            f"`weir spark recover {url} --uid {uid} --from {source}`)")


def _age(ms: int) -> str:
    return f"{max(0, wall_ms() - ms) / 1000:.0f} s ago"


def plan_batch(
    store: EpochStore, lineage: Lineage, query: str, batch: int, *, parallelism: int,
    restore_from: str | None = None, storage_options: dict[str, object] | None = None,
) -> BatchStart:
    """Decide (and claim, if this query takes the stage over) what batch ``batch`` of
    ``query`` restores; see the module documentation."""
    for _ in range(_CLAIM_ATTEMPTS):
        head = lineage.head()
        if head is not None and head.kind == QUERY and head.query == query:
            return _own(store, head, query, batch, parallelism, storage_options)
        claim = _take(store, lineage, head, query, batch, restore_from, storage_options)
        if claim is not None:
            log.warning("weir: query %s took over operator %r in %s from batch %d: %s",
                        query, store.uid, store.location.url, batch, claim.reason)
            return _own(store, claim, query, batch, parallelism, storage_options)
    raise OwnershipError(  # pragma: no cover - needs _CLAIM_ATTEMPTS lost races in a row
        f"operator {store.uid!r} in {store.location.url}: query {query} could not claim "
        f"the stage ({_CLAIM_ATTEMPTS} other claims won meanwhile); retry"
    )


def _take(
    store: EpochStore, lineage: Lineage, head: Claim | None, query: str, batch: int,
    restore_from: str | None, storage_options: dict[str, object] | None,
) -> Claim | None:
    """Claim the stage for ``query`` from ``batch`` if the rules allow; None if
    another writer won the compare-and-set."""
    where = f"operator {store.uid!r} in {store.location.url}"
    token = head.token + 1 if head is not None else 1
    if head is not None and head.kind == RECOVERY:
        return lineage.try_claim(token, QUERY, query, batch, head.source, head.source_note,
                                 f"adopted recovery claim {head.token} ({head.source_note})")
    if head is not None:
        chain = lineage.claims()
        if chain[-1].token != head.token:
            return None  # the chain moved on since we read the head: decide again
        if any(c.query == query for c in chain):
            raise FencedError(
                f"{where}: query {query} was fenced off: query {head.query} took the stage "
                f"over {_age(head.claimed_ms)} ({head.reason}), so this query's state is no "
                f"longer the stage's and it must not run on. Stop this query. To run it "
                f"again, start it with a new Spark checkpointLocation (it then continues "
                f"from the stage's current state)"
            )
        if lineage.alive(head):
            raise OwnershipError(
                f"{where} is owned by query {head.query}, which is running (it last ran a "
                f"batch {_age(lineage.last_seen_ms(head))}); one location has one owner "
                f"query per operator uid. Stop that query first (then call "
                f"weir.spark.finish(query) on it), give this stage another "
                f"checkpoint_location, or, if that query is gone, wait "
                f"{lineage.lease_timeout_ms / 1000:.0f} s after its last batch"
            )
    if batch > 0 and not _only_empty_before(store, query, batch):
        note = lineage_state(store, lineage, head)[1] if head is not None else ""
        state = (f"The stage's state here is {note}" if head is not None else
                 "The location holds no state of this stage at all")
        raise MissingStateError(
            f"{where}: query {query} runs batch {batch}, but the stage has no state of "
            f"this query's batch {batch - 1} here: the checkpoint_location was deleted, "
            f"moved or mistyped, or restored from an older backup, while Spark's "
            f"checkpoint stayed (or the stage is new in a query that already ran). "
            f"{state}. weir does not fall back to older or empty state by itself; choose: "
            f"point checkpoint_location at where the state is; or continue this query "
            f"from the stage's current state with {recover_hint(store, 'latest')}, from "
            f"empty state with source='empty', or from a checkpoint/savepoint URL with "
            f"source=<url>; or start a new query (a new Spark checkpointLocation), "
            f"optionally with restore_from=<url>"
        )
    if restore_from is not None:
        load_checkpoint(restore_from, storage_options=storage_options, verify=False)
        return lineage.try_claim(token, QUERY, query, batch, restore_from,
                                 f"restore_from {restore_from}", "new query from restore_from")
    if head is None:
        return lineage.try_claim(token, QUERY, query, batch, None, "first run",
                                 "first query of the stage")
    current, note = lineage_state(store, lineage, head)
    return lineage.try_claim(
        token, QUERY, query, batch, None if current is None else current.url, note,
        f"new query after query {head.query} ({'released' if lineage.released(head) else 'gone'})",
    )


def _only_empty_before(store: EpochStore, query: str, batch: int) -> bool:
    """Whether every batch of ``query`` before ``batch`` had no row for the stage (a
    new query whose first batches were empty, e.g. the heartbeat's rate source starts
    at 0 rows): no task of it ran, so it never claimed the stage and takes it now."""
    present = set(store.batches(query))
    return all(b in present and store.is_empty(query, b) for b in range(batch))


def _own(
    store: EpochStore, claim: Claim, query: str, batch: int, parallelism: int,
    storage_options: dict[str, object] | None,
) -> BatchStart:
    first = claim.batch or 0
    where = f"operator {store.uid!r} in {store.location.url}"
    if batch < first:
        raise MissingStateError(
            f"{where}: query {query} runs batch {batch}, but its state here starts at batch "
            f"{first}: Spark's checkpoint is older than weir's state (restored from an "
            f"older copy?). Restore Spark's checkpointLocation to its newest state, or start "
            f"a new query (a new Spark checkpointLocation)"
        )
    prev = batch - 1
    while prev >= first and store.is_empty(query, prev):
        prev -= 1  # a batch without any row left the state as it was
    if prev < first:
        if claim.source is None:
            return BatchStart(claim, None)
        source = load_checkpoint(claim.source, storage_options=storage_options, verify=False)
        return BatchStart(claim, source)
    try:
        prior = store.prior(query, prev)
        if prior is None:  # Spark committed it; nobody completed it yet: do it now
            prior = prior_of(store.complete(query, prev, parallelism), store.uid)
        return BatchStart(claim, None, prior)
    except IncompleteBatchError as exc:
        if store.query_storage(query).exists(f"chk-{prev}") or store.incomplete_note(query, prev):
            raise
        newest = [b for b in store.batches(query) if b < prev]
        state = (f"the newest batch of this query here is {newest[-1]}" if newest else
                 "this query has no batch here at all")
        raise MissingStateError(
            f"{where}: query {query} runs batch {batch}, but its state of batch {prev} is "
            f"not here ({store.describe(query, prev)} is missing; {state}). Its directory "
            f"was deleted by hand, the location was restored from an older backup, or the "
            f"stage's output was not computed in batch {prev} (a foreachBatch function "
            f"that skipped it). weir does not fall back to older state by itself: restore "
            f"the missing files, or continue from the newest complete checkpoint with "
            f"{recover_hint(store, 'latest')} (it says which batches that drops)"
        ) from exc
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(
            f"{exc}. To go on from the newest intact checkpoint of this stage, run "
            f"{recover_hint(store, 'latest')} and restart the query (it says which batches "
            f"that drops)"
        ) from exc
