"""What a completion deletes beyond a query's own old checkpoints, so that a
``checkpoint_location`` stays small however long it runs.

* **Superseded queries.** Once the owning query has ``retained`` completed
  checkpoints of its own, the directories of the queries that owned the stage before
  it (``stages/<uid>/queries/<older query>/``) are older than every checkpoint
  retention keeps and are deleted — unless a running savepoint pins them, or a claim
  of this query without a completed checkpoint yet restores from them
  (``restore_from`` / ``recover`` pointed there). A query directory that is in no
  claim (a new query whose first batches were empty) is left alone: it may be about
  to claim the stage.
* **Dead letters** (``dead-letter/<query>/batch=<batch>/``) are kept
  ``dead_letter_retention`` (default 7 days) after they were written; every
  ``DEAD_LETTER_SWEEP_BATCHES`` batches the completion deletes older ones.
"""

from __future__ import annotations

import json
import logging
import posixpath
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from weir.checkpoint.ownership import Lineage, wall_ms
from weir.errors import CorruptCheckpointError

if TYPE_CHECKING:
    from weir.checkpoint.epochs import EpochStore

__all__ = ["DEAD_LETTER_SWEEP_BATCHES", "drop_superseded_queries", "sweep_dead_letters"]

log = logging.getLogger(__name__)
DEAD_LETTER_SWEEP_BATCHES = 100


def drop_superseded_queries(store: EpochStore, query: str, batch: int) -> list[str]:
    """Delete the directories of queries that owned the stage before ``query`` (which
    has ``retained`` completed checkpoints, the newest ``batch``); returns the queries
    dropped."""
    others = [q for q in store.queries() if q != query]
    if not others:
        return []
    claims = Lineage(store.stage, 0).claims()
    if not claims or claims[-1].query != query:
        return []  # only the stage's current owner cleans up after its predecessors
    first = min(c.token for c in claims if c.query == query)
    older = {c.query for c in claims if c.query is not None and c.token < first}
    # a claim restores from its source until it has a completed checkpoint
    sources = [c.source for c in claims
               if c.token >= first and c.source and (c.batch or 0) > batch]
    pinned = pinned_roots(store)
    dropped = []
    for other in others:
        storage = store.query_storage(other)
        url = storage.url.rstrip("/") + "/"
        if other not in older or storage.root in pinned or any(
            s.startswith(url) or s.startswith(storage.root + "/") for s in sources
        ):
            continue
        log.info("weir: operator %r in %s: deleting the directory of query %s, which owned "
                 "the stage before query %s (older than every retained checkpoint)",
                 store.uid, store.location.url, other, query)
        store.stage.delete(f"queries/{other}", recursive=True)
        dropped.append(other)
    return dropped


def pinned_roots(store: EpochStore) -> set[str]:
    """Storage roots (query directories) holding a checkpoint a savepoint pins."""
    out = set()
    for name in store.stage.list_dir("pins"):
        try:
            doc = json.loads(store.stage.read_bytes(f"pins/{name}", name))
            out.add(str(doc["storage"]))
        except (ValueError, KeyError, TypeError, CorruptCheckpointError):
            continue
    return out


def sweep_dead_letters(store: EpochStore, retention_ms: int) -> int:
    """Delete this stage's dead-letter files written more than ``retention_ms`` ago
    (and directories left empty); returns the number of files deleted."""
    location = store.location
    prefix = "dead-letter"
    cutoff = wall_ms() - retention_ms
    suffix = f"/{_uid_prefix(store)}"
    deleted = 0
    emptied: set[str] = set()
    for path in location.walk_files(prefix):
        if suffix not in path:
            continue  # another stage's
        try:
            modified = location.fs.modified(location.full_path(path))
        except (OSError, NotImplementedError, ValueError):
            continue
        if modified.tzinfo is None:
            modified = modified.replace(tzinfo=UTC)
        if modified.timestamp() * 1000 < cutoff:
            location.delete(path)
            deleted += 1
            emptied.add(posixpath.dirname(path))
    for directory in sorted(emptied):  # batch directories, then their query's
        for empty in (directory, posixpath.dirname(directory)):
            if not location.list_dir(empty):
                location.delete(empty, recursive=True)
    if deleted:
        log.info("weir: operator %r in %s: deleted %d dead-letter files older than %s",
                 store.uid, location.url, deleted,
                 datetime.fromtimestamp(cutoff / 1000, UTC).isoformat())
    return deleted


def _uid_prefix(store: EpochStore) -> str:
    from weir.checkpoint.format import uid_dir

    return f"{uid_dir(store.uid)}-"
