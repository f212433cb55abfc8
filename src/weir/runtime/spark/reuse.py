"""Which live subtask a task goes on with: this Python worker's copies of a stage's
subtasks, judged against the previous batch's completed checkpoint.

A copy is used when it is exactly the attempt the completion chose (``is_exactly``),
or when it was left at an earlier batch of the same run and the chosen part's
changelog extends its own: it catches up by the deltas written since (``behind``,
``caught_up``). A copy that can never be used again is closed (``useless``). Every
other case restores from checkpoint storage (``new_live`` makes the empty subtask).
"""

from __future__ import annotations

import logging

from weir.checkpoint.changelog import ChangelogPolicy
from weir.checkpoint.epoch_prior import PriorBatch
from weir.checkpoint.epochs import MATERIALIZATION_MAX_LAG
from weir.checkpoint.format import SubtaskStateHandle
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import WeirError
from weir.runtime.checkpointer import SnapshotMode, SubtaskCheckpointer
from weir.runtime.operator import KeyedOperator, NonKeyedOperator, OperatorConfig
from weir.runtime.spark.cache import BatchClock, CurrentKey, LiveSubtask, local_dir
from weir.runtime.spark.spec import StageSpec
from weir.state.rocksdb import RocksDBMemory

__all__ = ["behind", "caught_up", "is_exactly", "new_live", "useless"]

log = logging.getLogger(__name__)


def is_exactly(
    live: LiveSubtask, prior: PriorBatch, query: str, subtask: int, token: int, spec: StageSpec,
) -> bool:
    """Whether the worker-local ``live`` subtask is exactly subtask ``subtask``'s state
    in ``prior`` (a completed batch of ``query``): the attempt the completion chose,
    under the same claim, parallelism and ``process()`` call (so the same function
    code)."""
    return (_same_run(live, prior, query, token, spec) and live.batch == prior.batch
            and prior.attempt(subtask) == live.attempt)


def _same_run(
    live: LiveSubtask, prior: PriorBatch, query: str, token: int, spec: StageSpec,
) -> bool:
    """``live`` ran under the same ``process()`` call, query, claim and parallelism."""
    return (live.instance == spec.instance and live.query == query and live.token == token
            and live.parallelism == spec.parallelism == prior.parallelism)


def behind(
    live: LiveSubtask, prior: PriorBatch, query: str, token: int, spec: StageSpec,
) -> SubtaskStateHandle | None:
    """If the worker-local ``live`` copy was left at an earlier batch of this run (its
    subtask's tasks ran in another Python worker since): the handle of its subtask's
    chosen part in ``prior`` (one read). Else None."""
    if not (_same_run(live, prior, query, token, spec) and 0 <= live.batch < prior.batch):
        return None
    return prior.own_handle(live.spec_key[2])


def caught_up(live: LiveSubtask, handle: SubtaskStateHandle) -> bool:
    """Whether the copy ``live``, left behind, was brought forward to ``handle`` by
    the changelog deltas written since (none if the batches since changed nothing;
    ``SubtaskCheckpointer.catch_up``). On False the copy must be discarded."""
    try:
        return live.checkpointer.catch_up(handle)
    except (WeirError, OSError) as exc:  # the restore from storage says what is wrong
        log.warning("weir: catching up subtask %d of operator %r failed (%s); restoring it "
                    "from checkpoint storage", live.spec_key[2], live.spec_key[1], exc)
        return False


def useless(
    live: LiveSubtask, prior: PriorBatch, query: str, token: int, spec: StageSpec,
) -> bool:
    """Whether this worker's copy ``live`` of another subtask of the stage can never be
    used again: it belongs to an earlier query, or it is behind ``prior`` (a completed
    batch of ``query``) and its subtask's changelog no longer extends its own (a new
    base, a materialization, RocksDB), so it cannot catch up."""
    if live.query != query:
        return True
    handle = behind(live, prior, query, token, spec)
    return handle is not None and not live.checkpointer.can_catch_up(handle)


def new_live(spec: StageSpec, subtask: int, storage: CheckpointStorage) -> LiveSubtask:
    """A fresh subtask whose checkpoints go to ``storage`` (its query's directory)."""
    clock = BatchClock()
    key = CurrentKey()
    rocksdb_dir = (local_dir(spec.location, spec.uid, subtask)
                   if spec.state_backend == "rocksdb" else None)
    config = OperatorConfig(
        uid=spec.uid, state_backend=spec.state_backend, max_parallelism=spec.max_parallelism,
        parallelism=spec.parallelism, subtask_index=subtask, rocksdb_path=rocksdb_dir,
        rocksdb_memory=RocksDBMemory(spec.rocksdb_memory_bytes, spec.rocksdb_write_buffer_ratio,
                                     cache_entries=spec.rocksdb_cache_entries),
    )
    operator: KeyedOperator | NonKeyedOperator
    if spec.keyed:
        operator = KeyedOperator(
            spec.function, key, config, clock=clock,
            broadcast_state_descriptors=spec.broadcast_state_descriptors,
        )
    else:
        operator = NonKeyedOperator(spec.function, config, clock=clock)
    # (spec.snapshot_mode: a SnapshotStrategy value the backend supports; weir.spark)
    mode = SnapshotMode(spec.snapshot_mode) if spec.keyed else SnapshotMode.FULL
    policy = ChangelogPolicy(interval_ms=spec.materialize_interval_ms,
                             max_lag=MATERIALIZATION_MAX_LAG, background=True)
    checkpointer = SubtaskCheckpointer(operator, storage, mode=mode, asynchronous=False,
                                       changelog=policy)
    return LiveSubtask((spec.location, spec.uid, subtask), spec.parallelism, operator,
                 checkpointer, clock, key, rocksdb_dir, instance=spec.instance)
