"""After the fact: completing a stopped query's last batch (:func:`finish`), dead
letters, savepoints (:func:`savepoint`, :func:`stop_with_savepoint` with Flink's
drain) and explicit recovery (:func:`recover`). Re-exported by :mod:`weir.spark`."""

from __future__ import annotations

import logging
import posixpath
import time
from datetime import timedelta
from typing import Any

from weir.api.durations import duration_ms
from weir.checkpoint.coordinator import CompletedCheckpoint
from weir.checkpoint.epochs import EpochStore, lineage_state
from weir.checkpoint.ownership import QUERY, Lineage
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import ConfigurationError, NoCheckpointError
from weir.runtime.spark.listener import COMPLETIONS, last_committed

__all__ = [
    "finish", "recover", "savepoint", "stop_with_savepoint",
]

log = logging.getLogger("weir.spark")


def finish(query: Any) -> int | None:
    """Complete the checkpoint of the last batch ``query`` committed, now; and if the
    query is no longer active, give up its stages so that another query may take them
    over at once. The query listener does both asynchronously; call ``finish`` after
    ``stop()`` or ``awaitTermination()`` so that the final batch is complete before the
    process exits or a savepoint is taken (a new query built with ``process()`` in the
    same session settles a stopped one by itself; one in another process does not).
    Raises
    :class:`~weir.errors.IncompleteBatchError` if Spark committed that batch with some
    subtasks' output never computed. Returns the batch id (None if the query ran no
    batch)."""
    batch = last_committed(query.lastProgress)
    for completion in list(COMPLETIONS.values()):
        completion.settle(query, raise_errors=True)
    return batch


def savepoint(
    checkpoint_location: str,
    target: str,
    *,
    uid: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> str:
    """Write a self-contained, backend-independent savepoint into ``target`` of every
    stage in ``checkpoint_location`` (or only of ``uid``), each from its latest
    completed checkpoint (of a running query: its state as of the latest completed
    batch; of a stopped one: its final state). Start a query from it with
    ``process(..., restore_from=target)``. Returns the savepoint's URL."""
    storage = CheckpointStorage(checkpoint_location, storage_options=storage_options)
    if uid is not None:
        stores = [EpochStore(storage, uid)]
    else:
        stores = [EpochStore.at(storage, d) for d in EpochStore.stage_dirs(storage)]
    return _savepoint(stores, target, storage_options,
                      f"{checkpoint_location}" + (f" (operator {uid!r})" if uid else ""))


def _savepoint(
    stores: list[EpochStore], target: str, storage_options: dict[str, Any] | None,
    where: str,
) -> str:
    from weir.checkpoint.savepoints import spark_offsets, write_savepoint

    checkpoints: list[CompletedCheckpoint] = []
    offsets: dict[str, dict[str, Any]] = {}
    pins: list[tuple[EpochStore, str]] = []
    try:
        for store in stores:
            found = _pinned_state(store, pins)
            if found is None:
                continue
            checkpoints.append(found)
            query = posixpath.basename(found.storage.root.rstrip("/"))
            root = store.spark_checkpoint(query) if found.directory else None
            sources = spark_offsets(root, found.checkpoint_id) if root else None
            for op_uid in found.metadata.operators:
                offsets[op_uid] = {"source_offsets": sources} if sources else {}
        if not checkpoints:
            raise NoCheckpointError(
                f"{where} has no completed checkpoint to take a savepoint from; run the "
                f"query until a batch completes"
            )
        return write_savepoint(checkpoints, target, storage_options=storage_options,
                               stage_positions=offsets)
    finally:
        for store, pin in pins:
            store.unpin(pin)


def _pinned_state(
    store: EpochStore, pins: list[tuple[EpochStore, str]]
) -> CompletedCheckpoint | None:
    """The stage's current state, pinned against retention while a savepoint copies
    it (re-resolved if retention removed it between finding and pinning)."""
    lineage = Lineage(store.stage)
    for _ in range(5):
        found = lineage_state(store, lineage)[0]
        if found is None or not found.directory:  # empty, or a savepoint (not retained)
            return found
        pin = store.pin(found)
        pins.append((store, pin))
        if found.storage.exists(f"{found.directory}/_metadata"):
            return found
    raise NoCheckpointError(  # pragma: no cover - retention won 5 races in a row
        f"{store.location.url}: the stage's checkpoints were subsumed while the savepoint "
        f"tried to pin one; retry"
    )


def stop_with_savepoint(
    query: Any,
    checkpoint_location: str,
    target: str,
    *,
    drain: bool = False,
    timeout: int | str | timedelta = "5 min",
    storage_options: dict[str, Any] | None = None,
) -> str:
    """Flink's stop-with-savepoint for a running query: stop it, complete its last
    batch and write a savepoint of the stages it owns in ``checkpoint_location`` into
    ``target``; returns the savepoint's URL.

    With ``drain=True`` (Flink's ``--drain``) the stages first run one more batch at
    the final watermark (+inf): every pending event-time timer fires once, and its
    outputs reach the query's sink like any batch's, exactly-once. A batch runs within
    a second or so (the heartbeat); a query whose input has ended
    (``trigger(availableNow=True)`` finished) cannot run it — start the same query
    again with a ``processingTime`` trigger and call this on it."""
    storage = CheckpointStorage(checkpoint_location, storage_options=storage_options)
    query_id = str(query.id)
    stores = []
    for directory in EpochStore.stage_dirs(storage):
        store = EpochStore.at(storage, directory)
        head = Lineage(store.stage).head()
        if head is not None and head.kind == QUERY and head.query == query_id:
            stores.append(store)
    if not stores:
        raise NoCheckpointError(
            f"query {query_id} owns no stage in {checkpoint_location}: it has not run a "
            f"batch with a weir stage there"
        )
    if drain:
        if not query.isActive:
            raise ConfigurationError(
                f"query {query_id} is not running, so it cannot run the draining batch; "
                f"start it again (same checkpointLocation, a processingTime trigger) and "
                f"call stop_with_savepoint on it"
            )
        committed = last_committed(query.lastProgress)
        # batch committed + 1 may be running already; + 2 starts after this request
        first = (committed if committed is not None else -1) + 2
        for store in stores:
            store.request_drain(query_id, first)
        deadline = time.monotonic() + duration_ms(timeout, "timeout") / 1000
        while not all(any(b >= first for b in s.completed_ids(query_id)) for s in stores):
            if not query.isActive:
                raise ConfigurationError(
                    f"query {query_id} stopped before its draining batch {first} completed: "
                    f"{query.exception()}"
                )
            if time.monotonic() > deadline:
                raise ConfigurationError(
                    f"query {query_id} did not complete its draining batch {first} within "
                    f"{timeout}; is it running batches (heartbeat on, or new input)?"
                )
            time.sleep(0.1)
    query.stop()
    finish(query)
    return _savepoint(stores, target, storage_options,
                      f"{checkpoint_location} (query {query_id})")


def recover(
    checkpoint_location: str,
    uid: str,
    source: str = "latest",
    *,
    force: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> str:
    """Choose explicitly what stage ``uid`` continues from when it cannot go on by
    itself (its previous state is missing or corrupt, or a batch was only partly
    computed — the error says so and names this call). ``source`` is ``"latest"``
    (the newest completed checkpoint whose files all verify), ``"empty"``, or a
    checkpoint/savepoint URL. The next query that runs the stage — the same one
    restarted, or a new one — continues from it. Refused while the stage's owner query
    may still be running, unless ``force``. Returns what the stage continues from and
    which batches' state that drops."""
    from weir.runtime.spark.recovery import recover_stage

    done = recover_stage(checkpoint_location, uid, source, force=force,
                         storage_options=storage_options)
    log.warning("weir: %s", done.message)
    return done.message
