"""The records an unaligned checkpoint had in flight: writing a task's channel state
(format: :mod:`weir.checkpoint.channel_state`) and, on restore, handing each task the
records it now owns, to replay before any new input.

On channel (producer j -> consumer k) of edge e, the records in flight at checkpoint n
are k's input state for j, then j's output state for k. At the same parallelism they go
back to consumer k. Rescaled (Flink's ``UnalignedCheckpointRescaleITCase`` edges):

* by key (``HASH``): every old channel of the edge is read, and each record goes to the
  new subtask that owns its key group;
* ``BROADCAST``: new subtask i replays old consumer ``i % p_old``'s channels — the
  subtask whose broadcast state it also restores, so its broadcast state and its
  broadcast input stay one consistent prefix of the broadcast stream;
* ``REBALANCE`` and ``FORWARD``: old consumer k's channels go to new subtask
  ``k % p_new``, each to exactly one.

Per old channel, order is kept; channels replay one after the other.
"""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from weir.checkpoint.channel_state import (
    ChannelState,
    decode_channel_state,
    encode_channel_state,
)
from weir.checkpoint.coordinator import CompletedCheckpoint
from weir.checkpoint.format import uid_dir
from weir.checkpoint.storage import CheckpointStorage, FileRef
from weir.errors import RestoreError
from weir.runtime.continuous.graph import JobGraph, Partitioner
from weir.state.keygroups import assign_key_to_parallel_operator

__all__ = ["check_edges", "replay_records", "write_channel_state"]


def write_channel_state(storage: CheckpointStorage, checkpoint_id: int, vertex: str,
                        subtask: int, state: ChannelState) -> FileRef | None:
    """Publish one task's channel state of ``checkpoint_id`` (None if it is empty)."""
    if state.empty:
        return None
    name = f"chk-{checkpoint_id}/_channels/{uid_dir(vertex)}/{subtask}-{uuid.uuid4().hex[:12]}"
    return storage.write(f"{name}.channels", encode_channel_state(state))


def _read(completed: CompletedCheckpoint, vertex: str
          ) -> tuple[int, dict[int, ChannelState]] | None:
    handle = completed.metadata.channel_state.get(vertex)
    if handle is None:
        return None
    files = {}
    for subtask, ref in handle.subtasks.items():
        where = f"{completed.url}: channel state of {vertex}[{subtask}] ({ref.path})"
        data = completed.storage.read_bytes(ref.path, where)
        files[subtask] = decode_channel_state(data, where)
    return handle.parallelism, files


def check_edges(completed: CompletedCheckpoint, graph: JobGraph,
                allow_non_restored_state: bool) -> None:
    """Refuse a checkpoint whose records in flight belong to a task this job does not
    have (unless ``allow_non_restored_state``: they are dropped)."""
    missing = sorted(set(completed.metadata.channel_state)
                     - {v.id for v in graph.vertices})
    if missing and not allow_non_restored_state:
        raise RestoreError(
            f"checkpoint {completed.checkpoint_id} at {completed.url} holds records in "
            f"flight of tasks {missing}, which this job does not have; keep their operator "
            f"uids, or pass allow_non_restored_state=True to drop them")


def replay_records(completed: CompletedCheckpoint, graph: JobGraph, vertex: str,
                   subtask: int) -> list[tuple[str, list[Any]]]:
    """The records to replay at ``vertex[subtask]`` before any new input: per old
    channel, ``(edge name, records)`` (records as the channels carry them)."""
    if not completed.metadata.channel_state:
        return []
    out: list[tuple[str, list[Any]]] = []
    consumer = graph.vertex(vertex)
    mine = _read(completed, vertex)
    for edge in graph.inputs(vertex):
        producer = _read(completed, edge.producer)
        old_consumers = (mine[0] if mine is not None else None)
        old_producers = (producer[0] if producer is not None else None)
        if old_consumers is None or old_producers is None:
            if mine is None and producer is None:
                continue
            raise RestoreError(
                f"checkpoint {completed.checkpoint_id} at {completed.url}: channel state "
                f"of edge {edge.name} lacks the parallelism of "
                f"{vertex if old_consumers is None else edge.producer}")
        for k in _old_consumers(edge.partitioner, subtask, consumer.parallelism,
                                old_consumers):
            for j in range(old_producers):
                buffers: list[bytes] = []
                if mine is not None and k in mine[1]:
                    buffers += mine[1][k].inputs.get((edge.name, j), ())
                if producer is not None and j in producer[1]:
                    buffers += producer[1][j].outputs.get((edge.name, k), ())
                if not buffers:
                    continue
                records = [r for b in buffers for r in pickle.loads(b)]
                if edge.partitioner is Partitioner.HASH:
                    records = list(_owned(records, edge.key_selector, graph, subtask,
                                          consumer.parallelism))
                if records:
                    out.append((edge.name, records))
    return out


def _old_consumers(partitioner: Partitioner, subtask: int, parallelism: int,
                   old_parallelism: int) -> Sequence[int]:
    if partitioner is Partitioner.HASH:
        return range(old_parallelism)
    if partitioner is Partitioner.BROADCAST:
        return [subtask % old_parallelism]
    return [k for k in range(old_parallelism) if k % parallelism == subtask]


def _owned(records: list[Any], key_selector: Any, graph: JobGraph, subtask: int,
           parallelism: int) -> Iterator[Any]:
    event_time = graph.event_time
    for item in records:
        record = item[1] if event_time else item
        try:
            owner = assign_key_to_parallel_operator(key_selector(record),
                                                    graph.max_parallelism, parallelism)
        except Exception:  # (the key selector fails on it: subtask 0's dead letters)
            owner = 0
        if owner == subtask:
            yield item

