"""Durable checkpoints and savepoints (public names are re-exported by ``weir``).

* :mod:`weir.checkpoint.storage` — files under an fsspec URL, atomic and checksummed;
* :mod:`weir.checkpoint.format` — the on-disk format (documented there);
* :mod:`weir.checkpoint.coordinator` — trigger/complete/abort, retention and
  subsumption, savepoints, finding and loading what to restore.

A subtask's side of a checkpoint (snapshot strategies) and the in-process drivers
that run one whole checkpoint live in the runtime layer: ``weir.runtime.checkpointer``
and ``weir.runtime.drivers``.
"""

from weir.checkpoint.coordinator import (
    CheckpointCoordinator,
    CompletedCheckpoint,
    PendingCheckpoint,
    load_checkpoint,
)
from weir.checkpoint.format import CheckpointKind
from weir.checkpoint.storage import CheckpointStorage, FileRef

__all__ = [
    "CheckpointCoordinator",
    "CheckpointKind",
    "CheckpointStorage",
    "CompletedCheckpoint",
    "FileRef",
    "PendingCheckpoint",
    "load_checkpoint",
]
