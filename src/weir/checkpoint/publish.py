"""Writing a whole savepoint directory so that it appears complete or not at all.

On a local disk the directory is written next to its target (``<target>.tmp-<uuid>``)
and renamed into place; elsewhere (object stores have no directory rename) it is
written in place and, on failure, what was written is deleted. Either way a target
that already holds a ``_metadata`` is refused.
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
    staging = storage
    if storage.is_local:
        staging = CheckpointStorage(f"{storage.root}.tmp-{uuid.uuid4().hex}")
    try:
        write(staging)
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
