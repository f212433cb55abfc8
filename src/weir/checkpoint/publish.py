"""Writing a whole savepoint directory so that it appears complete or not at all.

On a local disk the directory is written next to its target (``<target>.tmp-<uuid>``)
and renamed into place; elsewhere (object stores have no directory rename) the writer
first creates ``_writing`` in the target exclusively (of two writers exactly one
proceeds), writes in place and, on failure, deletes what it wrote. Either way the
target must be new or empty — a failed savepoint deletes only what it wrote, never
what else a directory holds.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from typing import Any

from weir.checkpoint.format import METADATA_FILE
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import CheckpointError

__all__ = ["write_new_directory"]

#: (object stores) the marker of the one writer of a savepoint directory
_WRITING = "_writing"


def write_new_directory(
    target: str, write: Callable[[CheckpointStorage], None], *,
    storage_options: dict[str, Any] | None = None,
) -> str:
    """Run ``write`` on a storage that becomes the new savepoint directory ``target``
    when it returns (``write`` publishes the metadata last); the target's URL. Nothing
    is left in ``target`` if ``write`` fails."""
    storage = CheckpointStorage(target, storage_options=storage_options)
    if storage.exists(METADATA_FILE):
        raise CheckpointError(f"{storage.url} already holds a savepoint; choose a new directory")
    held = storage.walk_files()
    if held:
        raise CheckpointError(
            f"{storage.url} is not empty (it holds {held[0]!r} and {len(held) - 1} more "
            f"files); a savepoint is written into a new or empty directory. Choose a new "
            f"directory")
    staging = storage
    if storage.is_local:
        staging = CheckpointStorage(f"{storage.root}.tmp-{uuid.uuid4().hex}")
    elif not storage.create_exclusive(_WRITING, b"{}"):
        raise CheckpointError(f"{storage.url}: another savepoint is being written there; "
                              f"choose a new directory")
    try:
        write(staging)
        if staging is storage:
            staging.delete(_WRITING)
        if staging is not storage:
            try:
                os.rename(staging.root, storage.root)
            except OSError as exc:
                raise CheckpointError(
                    f"cannot publish the savepoint at {storage.url}: {exc}; choose a new, "
                    f"empty directory"
                ) from exc
    except BaseException:
        if staging is not storage:
            shutil.rmtree(staging.root, ignore_errors=True)
        else:
            for path in staging.walk_files():
                staging.delete(path)
        raise
    return storage.url
