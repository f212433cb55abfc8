"""The records an unaligned checkpoint had in flight: writing a task's channel state
(format: :mod:`weir.checkpoint.channel_state`) and, on restore, handing each task the
records it now owns, to replay before any new input.

Channel state is stored under edge names (:func:`~weir.runtime.continuous.graph.edge_name`)
and is matched to the restoring job's edges by what they connect — the producer's and
the consumer's vertex (their uids), the side and which of the edges between the two it
is (:func:`belongs_to`) — never by the position of an input at its consumer: a job that
lists a union's inputs (or any consumer's) in another order restores every record. An
edge name of the layout written before (``<producer>-><consumer>#<input index>``)
belongs to the only edge from that producer into that consumer, or, when there are
several, to the consumer's input of that index (the rule it was written by).

When a job starts from a checkpoint (:func:`check_edges`, in the driver, before any
task runs) records in flight are refused if they were stored in the other form than the
job's records take — bare without event time, ``(timestamp, record)`` with it — as
they would be misread (whatever ``allow_non_restored_state`` says; names of the earlier
layout do not tell, and are not checked); and records on an edge the job does not have
(its producer or consumer gone, or no longer connected) are refused unless
``allow_non_restored_state``: then they are dropped, and logged.

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

import logging
import pickle
import re
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from weir.checkpoint.channel_state import (
    Buffers,
    ChannelState,
    decode_channel_state,
    encode_channel_state,
)
from weir.checkpoint.coordinator import CompletedCheckpoint
from weir.checkpoint.format import uid_dir
from weir.checkpoint.storage import CheckpointStorage, FileRef
from weir.errors import RestoreError
from weir.runtime.continuous.graph import TIMESTAMPED, Edge, JobGraph, KeyColumn, Partitioner
from weir.state.keygroups import assign_key_to_parallel_operator

__all__ = ["belongs_to", "check_edges", "replay_records", "stored_timestamps",
           "write_channel_state"]

log = logging.getLogger("weir")

#: the tags that end an edge name (graph.edge_name)
_TAGS = re.compile(rf"\[[0-9]+(,broadcast)?(,{TIMESTAMPED})?\]\Z")
#: the end of an edge name of the earlier layout: the input's index at the consumer
_INDEX = re.compile(r"#([0-9]+)\Z")


def write_channel_state(storage: CheckpointStorage, checkpoint_id: int, vertex: str,
                        subtask: int, state: ChannelState) -> FileRef | None:
    """Publish one task's channel state of ``checkpoint_id`` (None if it is empty)."""
    if state.empty:
        return None
    name = f"chk-{checkpoint_id}/_channels/{uid_dir(vertex)}/{subtask}-{uuid.uuid4().hex[:12]}"
    return storage.write(f"{name}.channels", encode_channel_state(state))


def stored_timestamps(name: str) -> bool | None:
    """Whether the records stored under edge name ``name`` are ``(timestamp, record)``
    pairs (True) or bare records (False); None for a name of the earlier layout, which
    does not say."""
    tags = _TAGS.search(name)
    return None if tags is None else tags.group(2) is not None


def _identity(name: str) -> str:
    """An edge name without its record-form tag: producer, consumer, occurrence, side."""
    timestamped = f",{TIMESTAMPED}]"
    return name[:-len(timestamped)] + "]" if name.endswith(timestamped) else name


def belongs_to(name: str, edge: Edge, graph: JobGraph) -> bool:
    """Whether the channel state stored under edge name ``name`` — in a file of the
    edge's consumer (input state) or producer (output state) — belongs to ``edge`` of
    ``graph``: from the same producer vertex into the same consumer vertex, on the same
    side, the same one of the edges between them (see the module doc for names of the
    earlier layout)."""
    if _TAGS.search(name) is not None:
        return _identity(name) == _identity(edge.name)
    pair = f"{edge.producer}->{edge.consumer}"
    index = _INDEX.search(name)
    if index is None or name[:index.start()] != pair:
        return False
    inputs = [e.name for e in graph.inputs(edge.consumer)]
    from_producer = [e for e in graph.inputs(edge.consumer) if e.producer == edge.producer]
    return len(from_producer) == 1 or inputs.index(edge.name) == int(index.group(1))


def _ends(name: str, vertex: str, inputs: bool) -> tuple[str, str]:
    """The producer and the consumer a stored edge name connects, read in a file of
    ``vertex`` (its input state: it is the consumer; else the producer)."""
    tags = _TAGS.search(name) or _INDEX.search(name)
    pair = name if tags is None else name[:tags.start()]
    if inputs:
        end = f"->{vertex}"
        return (pair[:-len(end)] if pair.endswith(end) else pair), vertex
    start = f"{vertex}->"
    return vertex, (pair[len(start):] if pair.startswith(start) else pair)


def _where(completed: CompletedCheckpoint) -> str:
    return f"checkpoint {completed.checkpoint_id} at {completed.url}"


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


def _form(timestamps: bool) -> str:
    return "as (timestamp, record) pairs" if timestamps else "as bare records"


def _refuse_other_form(completed: CompletedCheckpoint, graph: JobGraph,
                       names: Sequence[str]) -> RestoreError:
    stored = not graph.event_time
    return RestoreError(
        f"{_where(completed)} holds records in flight stored {_form(stored)} (the job "
        f"it was taken of {'had' if stored else 'had no'} event time), on edges "
        f"{sorted(set(names))[:3]}; this job {'has no' if stored else 'has'} event time "
        f"({'no source has' if stored else 'a source has'} a watermark strategy) and "
        f"would read them {_form(not stored)}. Start the job as it was checkpointed "
        f"(event time {'on' if stored else 'off'}) from this checkpoint, take a savepoint "
        f"of it (savepoints hold no records in flight), and start this job from that "
        f"savepoint")


def check_edges(completed: CompletedCheckpoint, graph: JobGraph,
                allow_non_restored_state: bool) -> None:
    """Refuse to start ``graph`` from ``completed`` if records it holds in flight
    cannot be restored (in the driver, before any task runs; see the module doc):
    records stored in the other form (bare, or with timestamps) than this job's, always;
    records on an edge this job does not have unless ``allow_non_restored_state`` — then
    they are dropped, and logged."""
    vertices = {v.id for v in graph.vertices}
    other_form: list[str] = []
    #: (edge name, producer, consumer) -> buffers of records in flight on no edge here
    unmatched: dict[tuple[str, str, str], int] = {}
    for vertex in sorted(completed.metadata.channel_state):
        read = _read(completed, vertex)
        if read is None:
            continue
        for _, state in sorted(read[1].items()):
            for inputs, rows in ((True, state.inputs), (False, state.outputs)):
                edges = [] if vertex not in vertices else (
                    graph.inputs(vertex) if inputs else graph.outputs(vertex))
                for (name, _), buffers in sorted(rows.items()):
                    if not buffers:
                        continue
                    if any(belongs_to(name, e, graph) for e in edges):
                        if stored_timestamps(name) not in (None, graph.event_time):
                            other_form.append(name)
                        continue
                    key = (name, *_ends(name, vertex, inputs))
                    unmatched[key] = unmatched.get(key, 0) + len(buffers)
    if other_form:
        raise _refuse_other_form(completed, graph, other_form)
    if not unmatched:
        return
    lost = [f"{name!r} from {producer!r} into {consumer!r} ({buffers} buffers; "
            f"{_why(graph, producer, consumer)})"
            for (name, producer, consumer), buffers in sorted(unmatched.items())]
    if not allow_non_restored_state:
        raise RestoreError(
            f"{_where(completed)} holds records in flight on edges this job does not "
            f"have: {'; '.join(lost)}. Keep those operators (with their uids) connected "
            f"as they were, or pass allow_non_restored_state=True to drop these records")
    for what in lost:
        log.warning("weir: %s: dropped the records in flight on edge %s "
                    "(allow_non_restored_state)", _where(completed), what)


def _why(graph: JobGraph, producer: str, consumer: str) -> str:
    """Why this job has no edge for records in flight from producer into consumer."""
    vertices = {v.id for v in graph.vertices}
    for end in (producer, consumer):
        if end not in vertices:
            return f"this job has no task {end!r}"
    if not any(e.producer == producer for e in graph.inputs(consumer)):
        return f"{producer!r} no longer feeds {consumer!r}"
    return (f"none of this job's edges from {producer!r} into {consumer!r} is that one "
            f"(another side, or fewer of them)")


def _rows(completed: CompletedCheckpoint, graph: JobGraph, edge: Edge, rows: Buffers
          ) -> dict[int, list[bytes]]:
    """The buffers stored in ``rows`` (one file's input or output state) that belong to
    ``edge``, by the other end's subtask."""
    found: dict[int, list[bytes]] = {}
    for (name, other), buffers in sorted(rows.items()):
        if not buffers or not belongs_to(name, edge, graph):
            continue
        if stored_timestamps(name) not in (None, graph.event_time):  # (check_edges refuses)
            raise _refuse_other_form(completed, graph, [name])
        found.setdefault(other, []).extend(buffers)
    return found


def replay_records(completed: CompletedCheckpoint, graph: JobGraph, vertex: str,
                   subtask: int) -> list[tuple[str, list[Any]]]:
    """The records to replay at ``vertex[subtask]`` before any new input: per old
    channel, ``(edge name, records)`` (this job's edge; records as the channels carry
    them)."""
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
                f"{_where(completed)}: channel state of edge {edge.name} lacks the "
                f"parallelism of {vertex if old_consumers is None else edge.producer}")
        assert mine is not None and producer is not None
        inputs = {k: _rows(completed, graph, edge, state.inputs)
                  for k, state in mine[1].items()}
        outputs = {j: _rows(completed, graph, edge, state.outputs)
                   for j, state in producer[1].items()}
        for k in _old_consumers(edge.partitioner, subtask, consumer.parallelism,
                                old_consumers):
            for j in range(old_producers):
                buffers = inputs.get(k, {}).get(j, []) + outputs.get(j, {}).get(k, [])
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
    batch_type: Any = None
    if isinstance(key_selector, KeyColumn):  # (records may be batches split by it)
        import pyarrow as pa

        batch_type = pa.RecordBatch
    for item in records:
        record = item[1] if event_time else item
        if batch_type is not None and type(record) is batch_type:
            # a batch of records keyed by its column: this subtask's rows of it
            for owner, part in key_selector.split(record, graph.max_parallelism, parallelism):
                if owner == subtask:
                    yield (item[0], part) if event_time else part
            continue
        try:
            owner = assign_key_to_parallel_operator(key_selector(record),
                                                    graph.max_parallelism, parallelism)
        except Exception:  # (the key selector fails on it: subtask 0's dead letters)
            owner = 0
        if owner == subtask:
            yield item

