"""The changelog side of a subtask's checkpoints (``SnapshotMode.CHANGELOG``): a base,
then per checkpoint a delta of the keys and timers changed since; materializations
in the background that later checkpoints use as their base; and, for a copy of the
subtask left behind in another Spark Python worker, catching up by the deltas
written since (``holds``, ``catch_up``). ``SubtaskCheckpointer``
(``weir.runtime.checkpointer``) mixes this in; the rules are in its module doc.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from weir.checkpoint.changelog import (
    ChangelogPolicy,
    chain_after,
    decode_delta,
    digest,
    encode_delta,
)
from weir.checkpoint.format import (
    KeyedChangelogHandle,
    KeyedFullHandle,
    SubtaskStateHandle,
    encode_keyed,
    uid_dir,
)
from weir.checkpoint.storage import CheckpointStorage, FileRef
from weir.checkpoint.subtask_files import operator_file_data, subtask_handle, write_snapshot
from weir.runtime.checkpoint_cpu import counted
from weir.runtime.operator import KeyedOperator, NonKeyedOperator, StateChange
from weir.state.keygroups import KeyGroupRange

if TYPE_CHECKING:
    from weir.runtime.checkpointer import PendingSnapshot

__all__ = ["ChangelogSnapshots", "run_now"]

log = logging.getLogger("weir.runtime.checkpointer")


class ChangelogSnapshots:
    """Changelog checkpoints of one subtask (mixed into ``SubtaskCheckpointer``,
    which sets these fields)."""

    operator: KeyedOperator | NonKeyedOperator
    storage: CheckpointStorage
    policy: ChangelogPolicy
    confirmed_only: bool
    #: the checkpointer writes changelogs (``SnapshotMode.CHANGELOG``)
    _changelog_mode: bool
    _chain: KeyedChangelogHandle | None
    _chain_id: int
    _completed_id: int
    _op_file: FileRef | None
    _materializing: tuple[int, int, Future[KeyedFullHandle]] | None
    _generation: int
    _materialized_at: float
    _last_changelog: Future[SubtaskStateHandle] | None
    _mat_pool: ThreadPoolExecutor | None
    _pending_snapshot: Callable[[int, float, Callable[[], SubtaskStateHandle]],
                                PendingSnapshot]

    @property
    def uid(self) -> str:
        """The operator uid."""
        return self.operator.config.uid

    def _range(self) -> KeyGroupRange:
        return self.operator.config.key_group_range

    def holds(self, handle: SubtaskStateHandle) -> bool:
        """Whether the live state is exactly what ``handle`` (a later checkpoint of
        this subtask, written elsewhere) describes, known without reading it: a
        changelog whose chain — base and deltas, by file and digest — and operator
        state file are the ones this checkpointer last wrote or adopted, over the same
        key groups and states. Every change of keyed state or timers is in a delta and
        every delta file is unique to the attempt that wrote it, so an equal chain
        means no change since: the state of a subtask that moved to another worker
        for idle batches and came back."""
        return self._extends(handle) == ()

    def _extends(self, handle: SubtaskStateHandle) -> tuple[KeyedFullHandle, ...] | None:
        """The deltas by which ``handle`` (a later checkpoint of this subtask, written
        elsewhere) extends the changelog this checkpointer last wrote or adopted —
        same base, this chain's deltas first, the same operator state file, key groups
        and states — or None if it does not extend it."""
        own = self._chain
        keyed = handle.keyed
        if (not self._changelog_mode or own is None
                or not isinstance(keyed, KeyedChangelogHandle) or keyed.base != own.base
                or keyed.deltas[:len(own.deltas)] != own.deltas):
            return None
        assert isinstance(self.operator, KeyedOperator)
        if (handle.operator_file != self._op_file or handle.key_group_range != self._range()
                or dict(handle.metas) != self.operator.keyed_state.metas):
            return None
        return keyed.deltas[len(own.deltas):]

    def can_catch_up(self, handle: SubtaskStateHandle) -> bool:
        """Whether :meth:`catch_up` to ``handle`` can work (no file read)."""
        return self._extends(handle) is not None

    def catch_up(self, handle: SubtaskStateHandle) -> bool:
        """Bring the live state forward to ``handle``, a later checkpoint of this
        subtask written by a copy of it elsewhere (the Spark runtime: another Python
        worker) that extends this checkpointer's changelog: read and apply only the
        deltas since (verified; O(changes)), then go on from ``handle``'s chain.
        False, with nothing changed, if ``handle`` does not extend it or a delta
        names a state not registered here. If it raises, discard the operator."""
        deltas = self._extends(handle)
        if deltas is None:
            return False
        assert isinstance(self.operator, KeyedOperator) and isinstance(
            handle.keyed, KeyedChangelogHandle)
        key_groups = self._range()
        # per delta in order, then per key group (a delta's key groups have disjoint keys)
        changes: list[Mapping[str, StateChange]] = []
        for delta in deltas:
            where = f"{self.storage.url}: {delta.file.path}"
            decoded = decode_delta(self.storage.read(delta.file, where), delta.key_groups,
                                   key_groups, where)
            changes.extend(decoded.values())
        if not self.operator.apply_changes(changes, self.policy.rebase_share):
            return False
        self._chain = handle.keyed
        return True

    def _snapshot_changelog(
        self, checkpoint_id: int, timestamp: int, storage: CheckpointStorage
    ) -> PendingSnapshot:
        op = self.operator
        assert isinstance(op, KeyedOperator)
        started = time.perf_counter()
        # the chain this one extends is written first; if that failed, its changes were
        # taken but never written, and only a base holds them now
        if self._last_changelog is not None and self._last_changelog.exception() is not None:
            self._chain = None
        prefix = f"shared/{uid_dir(self.uid)}/{checkpoint_id}-{uuid.uuid4().hex[:12]}"
        if self.confirmed_only and self._chain_id > self._completed_id:
            # the checkpoint that wrote the chain may still be aborted (and its delta
            # deleted): do not reference it
            self._chain = None
        chain = self._chain
        self._chain_id = checkpoint_id
        rebase = self.policy.rebase_share
        churn = rebase is not None and op.changed_share() >= rebase
        if chain is None or churn or not op.changes_known():
            # a base: the whole state, as a full snapshot does (first, instead of a
            # delta about as large as the state, or after a sampled batch that wrote
            # anything: which keys it changed is unknown, so the chain starts over)
            finish = op.prepare_snapshot(checkpoint_id, timestamp)
            # most keys changed: the next checkpoint is likely a base too, so its
            # writes are only sampled (the share estimated with a hash test per write
            # instead of a set insert); if fewer keys changed then, it is a base all
            # the same and the writes after it are recorded exactly again, until they
            # reach the rebase share of the keys (a base follows then whatever else is
            # written, so only the sample is recorded from there)
            op.track_changes(sampled=churn, rebase_share=rebase)
            self._chain = None
            self._generation += 1  # a running materialization copies an older chain
            self._materialized_at = time.monotonic()
            sync_ms = (time.perf_counter() - started) * 1000

            def base() -> SubtaskStateHandle:
                handle = write_snapshot(finish(), storage, prefix, self._range(), sync_ms)
                assert isinstance(handle.keyed, KeyedFullHandle)
                self._chain = KeyedChangelogHandle(handle.keyed)
                self._op_file = handle.operator_file
                return dataclasses.replace(handle, keyed=self._chain)

            return self._changelog_pending(checkpoint_id, sync_ms, base)
        chain = self._adopt_materialization(checkpoint_id, chain)
        snap, changes, written = op.snapshot_changes(checkpoint_id, timestamp)
        self._maybe_materialize(checkpoint_id, chain, storage, bool(changes or written))
        sync_ms = (time.perf_counter() - started) * 1000

        def delta() -> SubtaskStateHandle:
            upload_started = time.perf_counter()
            new_bytes = 0
            data, index, replaced = encode_delta(changes, written)
            keyed = chain
            if index:
                ref = storage.write(prefix + ".delta", data)
                new_bytes += ref.size
                keyed = KeyedChangelogHandle(chain.base, (*chain.deltas,
                                                          KeyedFullHandle(ref, index)))
            op_file = None
            op_data = operator_file_data(snap)
            if op_data is not None:
                op_file = self._op_file
                if op_file is None or op_file.sha256 != digest(op_data):
                    op_file = storage.write(prefix + ".op", op_data)
                    new_bytes += op_file.size
            self._chain, self._op_file = keyed, op_file
            return subtask_handle(snap, self._range(), keyed, op_file, new_bytes=new_bytes,
                                  sync_ms=sync_ms, started=upload_started, entries=replaced)

        return self._changelog_pending(checkpoint_id, sync_ms, delta)

    def _changelog_pending(
        self, checkpoint_id: int, sync_ms: float, work: Callable[[], SubtaskStateHandle]
    ) -> PendingSnapshot:
        pending = self._pending_snapshot(checkpoint_id, sync_ms, work)
        self._last_changelog = pending.future
        return pending

    def _adopt_materialization(
        self, checkpoint_id: int, chain: KeyedChangelogHandle
    ) -> KeyedChangelogHandle:
        """The changelog to extend: on the finished materialization, if there is one."""
        running = self._materializing
        if running is None or not running[2].done():
            return chain
        self._materializing = None
        materialized_id, generation, future = running
        if generation != self._generation:
            return chain  # it copied a state this changelog no longer extends
        try:
            base = future.result()
        except Exception:
            log.warning("%s: materializing checkpoint %s failed; the changelog goes on from "
                        "its current base", self.operator.config.describe(), materialized_id,
                        exc_info=True)
            return chain
        lag = self.policy.max_lag
        if lag is not None and checkpoint_id - materialized_id > lag:
            log.warning("%s: the materialization of checkpoint %s finished %s checkpoints "
                        "later (more than %s); it is not used", self.operator.config.describe(),
                        materialized_id, checkpoint_id - materialized_id, lag)
            return chain
        self._chain = KeyedChangelogHandle(base, chain_after(chain, materialized_id))
        return self._chain

    def _maybe_materialize(
        self, checkpoint_id: int, chain: KeyedChangelogHandle, storage: CheckpointStorage,
        changed: bool,
    ) -> None:
        """Start a materialization of the state as of now (``checkpoint_id``'s) if one
        is due by the policy (counting this checkpoint's delta if ``changed``; by bytes,
        the deltas written so far: counting this one's bytes would take a pass over
        every changed key in the task's thread) and none is running."""
        policy = self.policy
        deltas = len(chain.deltas) + changed
        if self._materializing is not None or not deltas:
            return
        delta_bytes = sum(d.file.size for d in chain.deltas)
        elapsed_ms = (time.monotonic() - self._materialized_at) * 1000
        if not (
            deltas >= policy.max_deltas
            or delta_bytes >= policy.size_ratio * chain.base.file.size
            or (policy.interval_ms is not None and elapsed_ms >= policy.interval_ms)
        ):
            return
        assert isinstance(self.operator, KeyedOperator)
        freeze = self.operator.prepare_materialization()
        self._materialized_at = time.monotonic()
        path = f"shared/{uid_dir(self.uid)}/m{checkpoint_id}-{uuid.uuid4().hex[:12]}.keyed"

        def work() -> KeyedFullHandle:
            data, index, _ = encode_keyed(freeze().groups)
            return KeyedFullHandle(storage.write(path, data), index)

        if policy.background:
            if self._mat_pool is None:
                self._mat_pool = ThreadPoolExecutor(
                    1, thread_name_prefix=f"weir-materialize-{self.uid}")
            future = self._mat_pool.submit(counted(work))
        else:
            future = run_now(work)
        self._materializing = (checkpoint_id, self._generation, future)

    def materialization(self) -> Future[KeyedFullHandle] | None:
        """The running (or finished, not yet used) materialization, if any."""
        return None if self._materializing is None else self._materializing[2]


_T = TypeVar("_T")


def run_now(work: Callable[[], _T]) -> Future[_T]:
    """``work()`` run in this thread, as a finished future."""
    future: Future[_T] = Future()
    try:
        future.set_result(work())
    except BaseException as exc:
        future.set_exception(exc)
        if not isinstance(exc, Exception):
            raise
    return future
