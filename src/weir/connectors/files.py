"""The ``weir-files`` sink of the Spark (micro-batch) runtime, :class:`FilesDataSource`
(``TransactionalFileSink``, its former name, is kept as another name for it): batches
published as atomically renamed directories (layout and exactly-once argument in
:mod:`weir.connectors.sinks`).

A commit's work does not depend on how many batches the path holds: it never lists
``<path>`` or reads another batch's manifest. The query that owns the path is read
from ``_lineage.json``; whether the batch is already published is one ``stat``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import (
    Row,
    StructType,
)

from weir.connectors.common import (
    _BATCH_DIR,
    FILE_FORMAT,
    FILE_SINK_NAME,
    LINEAGE_FILE,
    MANIFEST,
    PUBLISHING_DIR,
    SQLITE_SINK_NAME,
    STAGING_DIR,
    UNBATCHED_DIR,
    _check_messages,
    _lineage_error,
    _now,
    _query_of,
    _required_option,
    _row_json,
    _task_info,
)
from weir.errors import SinkError

# --------------------------------------------------------------------------- files


def _local_root(path: str) -> Path:
    """The local directory of a ``path`` option (plain path or ``file://`` URL)."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        local = parsed.path if parsed.scheme == "file" else path
        return Path(os.path.abspath(os.path.expanduser(local)))
    if len(parsed.scheme) == 1:  # a Windows drive letter, not a URL scheme
        return Path(os.path.abspath(path))
    raise SinkError(
        f"{FILE_SINK_NAME} sink: path {path!r} is on {parsed.scheme!r}; the sink publishes "
        "a batch by renaming a directory, which is atomic only on a local filesystem. "
        "Use a local directory (or a file:// URL)."
    )


def _fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _batch_dirs(root: Path) -> list[tuple[int, Path]]:
    """The published ``batch=<N>`` directories under ``root``, in batch order."""
    found: list[tuple[int, Path]] = []
    with os.scandir(root) as entries:
        for entry in entries:
            match = _BATCH_DIR.fullmatch(entry.name)
            if match and entry.is_dir():
                found.append((int(match.group(1)), Path(entry.path)))
    found.sort()
    return found


def _read_manifest(batch_dir: Path) -> dict[str, Any]:
    manifest = batch_dir / MANIFEST
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SinkError(
            f"{FILE_SINK_NAME} sink: committed batch {batch_dir} has no readable {MANIFEST} "
            f"({exc}); the directory was changed after it was published"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
        raise SinkError(f"{FILE_SINK_NAME} sink: {manifest} is not a {FILE_FORMAT} manifest")
    return data


def _newest_query_id(root: Path) -> str | None:
    """The query id of the newest published batch that has one: one scan of ``root``,
    done only where ``_lineage.json`` is missing (a path written by a weir version
    without it, a new path, or a record deleted by hand)."""
    for _, batch_dir in reversed(_batch_dirs(root)):
        stored = _read_manifest(batch_dir).get("query_id")
        if stored is not None:
            return str(stored)
    return None


def _read_lineage(root: Path) -> dict[str, Any] | None:
    """The lineage record ``<root>/_lineage.json``, or ``None`` if there is none."""
    record = root / LINEAGE_FILE
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        problem = str(exc)
    else:
        if (
            isinstance(data, dict)
            and data.get("format") == FILE_FORMAT
            and isinstance(data.get("query_id"), str | None)
        ):
            return data
        problem = f"not a {FILE_FORMAT} lineage record"
    raise SinkError(
        f"{FILE_SINK_NAME} sink: {record} cannot be read ({problem}), so the query that "
        "owns the path is unknown; nothing was written. If the path holds this query's "
        f"output, delete {record}: the next commit rebuilds it from the newest batch's "
        "manifest."
    )


def _write_lineage(root: Path, query_id: str | None, batch_id: int) -> None:
    """Replace ``<root>/_lineage.json`` atomically and durably (temp file, fsync,
    rename, fsync of ``root``)."""
    record = {
        "format": FILE_FORMAT,
        "query_id": query_id,
        "recorded_by_batch": batch_id,
        "recorded_at": _now(),
    }
    tmp = root / f"{LINEAGE_FILE}.tmp"  # a fixed name: a crash's leftover is overwritten
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(record, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, root / LINEAGE_FILE)
    _fsync_dir(root)


@dataclass(frozen=True)
class FileCommitMessage(WriterCommitMessage):
    """What a ``weir-files`` task staged: returned by ``write``, named by ``commit``.

    ``staged_file`` is relative to the sink root (``None`` for an empty partition).
    """

    partition_id: int
    attempt_id: str
    batch_id: int | None
    query_id: str | None
    staged_file: str | None
    rows: int


class FileSinkWriter(DataSourceStreamWriter):
    """The stream writer of :class:`FilesDataSource` (layout: module docstring).

    ``write`` runs in the tasks and stages one JSON-lines file per partition;
    ``commit``/``abort`` run on the driver.
    """

    def __init__(self, path: str, schema: StructType) -> None:
        self.path = path
        self.root = _local_root(path)
        self.schema = schema

    # ---- tasks

    def write(self, iterator: Iterator[Row]) -> FileCommitMessage:
        """Stage this partition's rows in an attempt-unique file, fsynced; return its name."""
        info = _task_info()
        sub = f"batch={info.batch_id}" if info.batch_id is not None else UNBATCHED_DIR
        stage_dir = self.root / STAGING_DIR / sub
        name = f"part-{info.partition_id:05d}-{info.attempt_id}.jsonl"
        target = stage_dir / name
        rows = 0
        out = None
        try:
            for row in iterator:
                if out is None:
                    stage_dir.mkdir(parents=True, exist_ok=True)
                    out = open(target, "x", encoding="utf-8")  # noqa: SIM115 - closed below
                out.write(_row_json(row))
                out.write("\n")
                rows += 1
            if out is not None:
                out.flush()
                os.fsync(out.fileno())
                out.close()
                out = None
                _fsync_dir(stage_dir)
        except BaseException as exc:
            if out is not None:
                out.close()
            target.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise SinkError(
                    f"{FILE_SINK_NAME} sink: staging partition {info.partition_id} of batch "
                    f"{info.batch_id} in {target} failed: {exc}. Check that the sink path "
                    "is writable and has free space; Spark retries the task or the batch."
                ) from exc
            raise
        staged = f"{STAGING_DIR}/{sub}/{name}" if rows else None
        return FileCommitMessage(
            info.partition_id, info.attempt_id, info.batch_id, info.query_id, staged, rows
        )

    # ---- driver

    def _staged_path(self, message: FileCommitMessage) -> Path | None:
        if message.staged_file is None:
            return None
        staged = (self.root / message.staged_file).resolve()
        staging = (self.root / STAGING_DIR).resolve()
        if staging not in staged.parents:
            raise SinkError(
                f"{FILE_SINK_NAME} sink at {self.root}: commit message names "
                f"{message.staged_file!r}, which is not under {STAGING_DIR}/"
            )
        return staged

    def _discard(self, messages: Iterable[FileCommitMessage | None], batch_id: int) -> None:
        """Delete the staged files of ``messages`` and the staging directory of the batch."""
        for message in messages:
            if isinstance(message, FileCommitMessage):
                staged = self._staged_path(message)
                if staged is not None:
                    staged.unlink(missing_ok=True)
        shutil.rmtree(self.root / STAGING_DIR / f"batch={batch_id}", ignore_errors=True)

    def _check_lineage(self, batch_id: int, query_id: str | None) -> None:
        """Refuse a batch of a query other than the one recorded in ``_lineage.json``;
        record the query there first if the path has no record or no query id yet."""
        record = _read_lineage(self.root)
        stored = _newest_query_id(self.root) if record is None else record["query_id"]
        if query_id is not None and stored is not None and stored != query_id:
            raise _lineage_error(
                f"{FILE_SINK_NAME} sink path {self.root}",
                batch_id,
                stored,
                query_id,
                "Write the new query to a new path",
            )
        if record is None or (stored is None and query_id is not None):
            _write_lineage(self.root, stored if stored is not None else query_id, batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Publish the staged files of ``messages`` as ``<path>/batch=<batchId>/``, once.

        An empty batch (no task staged a row) publishes nothing and, once the path has
        its ``_lineage.json``, writes nothing. If the batch is already published (a
        replay after a crash), only deletes the newly staged files.
        """
        where = f"{FILE_SINK_NAME} sink at {self.root}"
        staged_messages: list[FileCommitMessage] = _check_messages(
            messages, FileCommitMessage, batchId, where
        )
        final = self.root / f"batch={batchId}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            query_id = _query_of(staged_messages)
            self._check_lineage(batchId, query_id)
            if final.is_dir():  # a replay of a published batch
                self._discard(staged_messages, batchId)
            elif any(m.staged_file is not None for m in staged_messages):
                self._publish(staged_messages, batchId, query_id, final)
        except OSError as exc:
            raise SinkError(
                f"{where}: commit of batch {batchId} failed: {exc}. Nothing of the batch is "
                f"visible unless batch={batchId}/ exists; restart the query from its "
                "checkpoint to retry (a published batch is not written twice)."
            ) from exc
        # The batch is published (or empty): staged and half-published leftovers of
        # its earlier attempts can go.
        shutil.rmtree(self.root / STAGING_DIR / f"batch={batchId}", ignore_errors=True)
        shutil.rmtree(self.root / PUBLISHING_DIR / f"batch={batchId}", ignore_errors=True)

    def _publish(
        self, messages: list[FileCommitMessage], batch_id: int, query_id: str | None, final: Path
    ) -> None:
        # Leftovers of an earlier commit of this batch that crashed before its rename.
        pending = self.root / PUBLISHING_DIR / f"batch={batch_id}"
        shutil.rmtree(pending, ignore_errors=True)
        staged: list[tuple[FileCommitMessage, Path]] = []
        for message in sorted(messages, key=lambda m: m.partition_id):
            path = self._staged_path(message)
            if path is None:
                continue
            if not path.is_file():  # checked before anything moves
                raise SinkError(
                    f"{FILE_SINK_NAME} sink at {self.root}: staged file {path} of partition "
                    f"{message.partition_id}, batch {batch_id} is missing (deleted by an "
                    "abort or by hand?); nothing was published. Restart the query from its "
                    "checkpoint to re-run the batch."
                )
            staged.append((message, path))
        tmp = pending / uuid.uuid4().hex
        tmp.mkdir(parents=True)
        files: list[dict[str, Any]] = []
        for message, path in staged:
            os.rename(path, tmp / path.name)
            files.append(
                {
                    "name": path.name,
                    "partition": message.partition_id,
                    "attempt": message.attempt_id,
                    "rows": message.rows,
                }
            )
        manifest = {
            "format": FILE_FORMAT,
            "batch_id": batch_id,
            "query_id": query_id,
            "committed_at": _now(),
            "rows": sum(f["rows"] for f in files),
            "files": files,
            "schema": self.schema.jsonValue(),
        }
        with open(tmp / MANIFEST, "x", encoding="utf-8") as out:
            json.dump(manifest, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        _fsync_dir(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if final.is_dir():  # published meanwhile: the batch is there once already
                shutil.rmtree(tmp, ignore_errors=True)
                return
            raise
        _fsync_dir(self.root)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Delete the files staged for batch ``batchId`` (never published batches).

        Spark usually passes ``None`` for every task here, so the whole staging
        directory of the batch is removed, not only the files named.
        """
        try:
            self._discard([m for m in messages if isinstance(m, FileCommitMessage)], batchId)
        except OSError as exc:
            raise SinkError(
                f"{FILE_SINK_NAME} sink at {self.root}: abort of batch {batchId} could not "
                f"delete staged files: {exc}. They are invisible to readers and are removed "
                "when the batch is committed."
            ) from exc


class FilesDataSource(DataSource):
    """``weir-files``: exactly-once JSON-lines files, one directory per micro-batch (a
    PySpark data source of the micro-batch runtime).

    Options: ``path`` (local directory or ``file://`` URL). Append output mode only.
    The layout and the exactly-once argument are in :mod:`weir.connectors.sinks`.
    """

    @classmethod
    def name(cls) -> str:
        """The format name, ``"weir-files"``."""
        return FILE_SINK_NAME

    def streamWriter(self, schema: StructType, overwrite: bool) -> FileSinkWriter:
        """The writer of one micro-batch (Spark calls this on the driver)."""
        path = _required_option(self.options, "path", FILE_SINK_NAME)
        if overwrite:
            raise SinkError(
                f"{FILE_SINK_NAME} sink at {path}: complete output mode is not supported "
                "(every batch is a new directory, readers would see all of them); use "
                f"outputMode('append'), or {SQLITE_SINK_NAME} for complete mode"
            )
        return FileSinkWriter(path, schema)

    @staticmethod
    def committed_batches(path: str) -> list[int]:
        """The batch ids published under ``path``, ascending."""
        return committed_file_batches(path)


TransactionalFileSink = FilesDataSource
"""The former name of :class:`FilesDataSource` (kept)."""


def committed_file_batches(path: str) -> list[int]:
    """The batch ids a ``weir-files`` sink has published under ``path``, ascending."""
    root = _local_root(path)
    if not root.is_dir():
        raise SinkError(f"{FILE_SINK_NAME} sink: no directory at {root}; check the path")
    return [batch for batch, _ in _batch_dirs(root)]


def read_file_sink(path: str) -> list[dict[str, Any]]:
    """All committed rows of a ``weir-files`` sink, in batch order, then partition order.

    Rows are the JSON objects as written (see the module docstring for how values are
    encoded); staged and in-progress data is never included.
    """
    root = _local_root(path)
    if not root.is_dir():
        raise SinkError(f"{FILE_SINK_NAME} sink: no directory at {root}; check the path")
    rows: list[dict[str, Any]] = []
    for _, batch_dir in _batch_dirs(root):
        manifest = _read_manifest(batch_dir)
        for entry in manifest["files"]:
            data_file = batch_dir / entry["name"]
            try:
                with open(data_file, encoding="utf-8") as lines:
                    batch_rows = [json.loads(line) for line in lines if line.strip()]
            except (OSError, ValueError) as exc:
                raise SinkError(
                    f"{FILE_SINK_NAME} sink: cannot read committed file {data_file}: {exc}"
                ) from exc
            if len(batch_rows) != entry["rows"]:
                raise SinkError(
                    f"{FILE_SINK_NAME} sink: {data_file} has {len(batch_rows)} rows, its "
                    f"manifest says {entry['rows']}; the file was changed after publishing"
                )
            rows.extend(batch_rows)
    return rows
