"""What both two-phase-commit sinks share: task identity, JSON values, options,
commit-message checks (see :mod:`weir.connectors.sinks` for the protocol)."""

from __future__ import annotations

import datetime as _dt
import json
import re
import uuid
from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import (
    Row,
)

from weir.errors import SinkError
from weir.runtime.spark.records import json_safe

FILE_SINK_NAME = "weir-files"
"""Format name of :class:`~weir.connectors.spark.FilesDataSource`
(``df.writeStream.format(...)``)."""

SQLITE_SINK_NAME = "weir-sqlite"
"""Format name of :class:`~weir.connectors.spark.SqliteDataSource`
(``df.writeStream.format(...)``)."""

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"

STAGING_DIR = "_staging"
UNBATCHED_DIR = "unbatched"
PUBLISHING_DIR = "_publishing"
MANIFEST = "_manifest.json"
LINEAGE_FILE = "_lineage.json"
FILE_FORMAT = "weir-files/1"
_BATCH_DIR = re.compile(r"batch=(\d+)")

STAGING_TABLE = "_weir_staging"
COMMITS_TABLE = "_weir_commits"
LINEAGE_TABLE = "_weir_lineage"
DEFAULT_BUSY_TIMEOUT = 60.0
_CHUNK_ROWS = 10_000


# --------------------------------------------------------------------------- shared


@dataclass(frozen=True, slots=True)
class _TaskInfo:
    """What ``write`` knows about the task it runs in."""

    partition_id: int
    attempt_id: str
    batch_id: int | None
    query_id: str | None


def _task_info() -> _TaskInfo:
    """Partition, a fresh attempt id, batch id and query id of the running Spark task.

    Outside a Spark task (``TaskContext.get()`` is ``None``, e.g. in unit tests) the
    partition is 0 and the batch and query ids are unknown.
    """
    from pyspark import TaskContext

    attempt = uuid.uuid4().hex
    ctx = TaskContext.get()
    if ctx is None:
        return _TaskInfo(0, attempt, None, None)
    try:
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY)
    except AttributeError:  # a TaskContext without local properties
        batch = query = None
    partition = ctx.partitionId()
    return _TaskInfo(
        partition if partition is not None else 0,
        attempt,
        int(batch) if batch is not None else None,
        query,
    )


def _row_json(row: Row) -> str:
    """One row as a compact JSON object."""
    record = {k: json_safe(v) for k, v in row.asDict(recursive=True).items()}
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _option(options: MutableMapping[str, str], name: str) -> str | None:
    """Option ``name``, case-insensitively (Spark passes a case-insensitive mapping)."""
    value = options.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in options.items() if k.lower() == lowered), None)
    return value


def _required_option(options: MutableMapping[str, str], name: str, sink: str) -> str:
    value = _option(options, name)
    if value is None or not str(value).strip():
        raise SinkError(
            f"{sink} sink: option {name!r} is missing; set it with "
            f".option({name!r}, ...) on writeStream"
        )
    return str(value)


def _check_messages(
    messages: Sequence[WriterCommitMessage | None], kind: type[Any], batch_id: int, where: str
) -> list[Any]:
    """The commit messages, all present, of ``kind``, and all of batch ``batch_id``."""
    checked: list[Any] = []
    for index, message in enumerate(messages):
        if message is None:
            raise SinkError(
                f"{where}: commit of batch {batch_id} got no commit message for task "
                f"{index}, so the batch is incomplete; nothing was published. Spark "
                "retries the batch when the query is restarted from its checkpoint."
            )
        if not isinstance(message, kind):
            raise SinkError(
                f"{where}: commit of batch {batch_id} got a {type(message).__name__}, "
                f"not a {kind.__name__}; is the query writing to another sink's location?"
            )
        if message.batch_id is not None and message.batch_id != batch_id:
            raise SinkError(
                f"{where}: commit of batch {batch_id} got rows staged for batch "
                f"{message.batch_id}; nothing was published"
            )
        checked.append(message)
    return checked


def _query_of(messages: Iterable[Any]) -> str | None:
    for message in messages:
        if message is not None and message.query_id is not None:
            return str(message.query_id)
    return None


def _lineage_error(where: str, batch_id: int, stored: str, query_id: str, fix: str) -> SinkError:
    return SinkError(
        f"{where} belongs to streaming query {stored}, but batch {batch_id} comes "
        f"from query {query_id}. Batch ids restart at 0 with a new checkpoint, so this "
        "query's batches would be taken for replays and dropped; nothing was written. "
        f"{fix}, or restart the original query with its original checkpoint."
    )


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")
