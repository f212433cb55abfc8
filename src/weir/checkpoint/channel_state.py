"""Channel state: the in-flight records an unaligned checkpoint stores (Flink's
``InputChannelStateHandle`` / ``ResultSubpartitionStateHandle``).

An unaligned checkpoint lets its barriers overtake records in flight, so those records
belong to the checkpoint: each task of the continuous runtime writes, per checkpoint
that had any, one file with

* its **input state**: per input channel (edge, producer subtask), the buffers that came
  before that channel's barrier and that the task had not processed when it
  checkpointed;
* its **output state**: per output channel (edge, consumer subtask), the buffers its
  barrier overtook in its own send queue.

The records in flight on a channel from producer j to consumer k at checkpoint n are
consumer k's input state for j, then producer j's output state for k (the producer
sent the barrier ahead of the latter). A restore replays them to the consumer that now
owns them before any new input (:mod:`weir.runtime.continuous.inflight`).

File (``chk-<id>/_channels/<vertex-dir>/<subtask>-<attempt>.channels``): the data-file
header of :mod:`weir.checkpoint.format` (magic ``WEIRDATA``, ``uint16_be`` version), then
one msgpack map::

    {"inputs":  [[edge, producer, [buffer, ...]], ...],
     "outputs": [[edge, consumer, [buffer, ...]], ...]}

Each buffer is a list of records as the channels carry it: pickle protocol 5 of a list
of records (of ``(timestamp, record)`` pairs in a job with event time). Restoring
channel state therefore unpickles data from the checkpoint storage — trust it as you
trust the job's own code; the checkpoint metadata is never unpickled.

``edge`` is the edge's name, which says what the edge connects and how its records are
stored (:func:`weir.runtime.continuous.graph.edge_name`)::

    <producer>-><consumer>[<occurrence>(,broadcast)(,timestamped)]

producer and consumer the vertex ids (their operators' uids), ``occurrence`` which of
the edges from producer into consumer on that side, ``broadcast`` the broadcast input
of a keyed broadcast function, ``timestamped`` records stored as ``(timestamp,
record)`` (else bare). A restore matches the rows to its job's edges by these — not by
the order of a consumer's inputs (:mod:`weir.runtime.continuous.inflight`). Files
written before (same header version, same map) name an edge
``<producer>-><consumer>#<index of the input at the consumer>`` and do not say how
their records are stored; they still restore (by producer and consumer; by that index
among several edges between the same two vertices), and the form of their records is
not checked.

In ``_metadata``: ``"channel_state": {vertex: {"parallelism": p, "subtasks":
[[i, REF], ...]}}``, per vertex of an unaligned checkpoint, ``subtasks`` listing the
tasks that wrote a file; absent for aligned checkpoints and savepoints, which never
hold records in flight.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgpack

from weir.checkpoint.datafiles import _DATA_HEADER, _header, check_data_header
from weir.checkpoint.storage import FileRef
from weir.errors import CorruptCheckpointError

__all__ = ["Buffers", "ChannelState", "ChannelStateHandle", "decode_channel_state",
           "encode_channel_state"]

#: (edge name — see the module doc —, the other end's subtask) -> buffers, oldest first
Buffers = Mapping[tuple[str, int], Sequence[bytes]]


@dataclass(frozen=True)
class ChannelState:
    """The content of one task's channel-state file."""

    #: (edge, producer subtask) -> buffers before that channel's barrier, unprocessed
    inputs: Buffers = field(default_factory=dict)
    #: (edge, consumer subtask) -> buffers the barrier overtook in the send queue
    outputs: Buffers = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Whether no buffer was in flight."""
        return not any(self.inputs.values()) and not any(self.outputs.values())

    @property
    def buffers(self) -> int:
        """Buffers stored."""
        return sum(map(len, self.inputs.values())) + sum(map(len, self.outputs.values()))


@dataclass(frozen=True)
class ChannelStateHandle:
    """The channel-state files of one vertex's tasks in a checkpoint."""

    vertex: str
    #: the vertex's parallelism when the checkpoint was taken
    parallelism: int
    #: subtask -> its file (only subtasks that had records in flight)
    subtasks: Mapping[int, FileRef]


def encode_channel_state(state: ChannelState) -> bytes:
    """The bytes of a channel-state file."""
    def rows(buffers: Buffers) -> list[list[object]]:
        return [[edge, other, list(bufs)] for (edge, other), bufs in sorted(buffers.items())
                if bufs]
    body: bytes = msgpack.packb({"inputs": rows(state.inputs),
                                 "outputs": rows(state.outputs)}, use_bin_type=True)
    return _header() + body


def decode_channel_state(data: bytes, where: str) -> ChannelState:
    """Parse a channel-state file (``where`` names it in errors)."""
    check_data_header(data, where)
    try:
        doc = msgpack.unpackb(data[_DATA_HEADER:], raw=False)
        return ChannelState(
            {(str(e), int(o)): [bytes(b) for b in bufs] for e, o, bufs in doc["inputs"]},
            {(str(e), int(o)): [bytes(b) for b in bufs] for e, o, bufs in doc["outputs"]})
    except (ValueError, TypeError, KeyError, msgpack.ExtraData,
            msgpack.FormatError, msgpack.StackError) as exc:
        raise CorruptCheckpointError(f"{where}: malformed channel-state file ({exc!r})") from exc
