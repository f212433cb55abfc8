"""Durable checkpoints and savepoints (public names are re-exported by ``weir``).

* :mod:`weir.checkpoint.storage` — files under an fsspec URL, atomic and checksummed;
* :mod:`weir.checkpoint.format` — the on-disk format (documented there);
* :mod:`weir.checkpoint.snapshotter` — full (asynchronous) and incremental RocksDB
  snapshots of one operator subtask;
* :mod:`weir.checkpoint.coordinator` — trigger/complete/abort, retention and
  subsumption, savepoints, finding and loading what to restore.
"""

from weir.checkpoint.coordinator import (
    CheckpointCoordinator,
    CompletedCheckpoint,
    PendingCheckpoint,
    load_checkpoint,
    take_checkpoint,
    take_savepoint,
)
from weir.checkpoint.format import CheckpointKind
from weir.checkpoint.snapshotter import PendingSnapshot, SnapshotMode, SubtaskCheckpointer
from weir.checkpoint.storage import CheckpointStorage, FileRef

__all__ = [
    "CheckpointCoordinator",
    "CheckpointKind",
    "CheckpointStorage",
    "CompletedCheckpoint",
    "FileRef",
    "PendingCheckpoint",
    "PendingSnapshot",
    "SnapshotMode",
    "SubtaskCheckpointer",
    "load_checkpoint",
    "take_checkpoint",
    "take_savepoint",
]
