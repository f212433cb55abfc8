"""Checkpoint storage: files under a filesystem URL, written atomically, checksummed.

``CheckpointStorage(url)`` takes anything fsspec understands: a local path or
``file://`` URL (the default), ``memory://`` (tests), ``s3://bucket/prefix`` (with
the ``s3`` extra; ``storage_options`` go to ``s3fs``, e.g. ``endpoint_url``).

Every file is written under an attempt-unique temporary name
(``<name>.tmp-<uuid>``), flushed (and fsynced on a local disk), then published by
a rename — atomic on a local filesystem; on an object store the server-side copy
publishes the whole object at once. A reader therefore sees a file completely or
not at all. Each write returns a :class:`FileRef` (path relative to the storage
root, size, SHA-256); every read verifies size and checksum and raises
:class:`~weir.errors.CorruptCheckpointError` naming the file when they differ.

All filesystem calls go through ``self.fs``, so a test can wrap it
(``weir.testing.faults.FaultInjectingFileSystem``) to crash at any write step.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from weir.errors import CheckpointError, CorruptCheckpointError

__all__ = ["CheckpointStorage", "FileRef", "StorageCounts", "observe_io", "storage_counts"]

TMP_MARKER = ".tmp-"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 4 << 20


@dataclass(frozen=True, slots=True)
class StorageCounts:
    """Storage operations of this process since it started (:func:`storage_counts`):
    files read and their bytes, files written and their bytes, directory listings,
    existence checks and deletes. Subtract two to get what something in between did."""

    reads: int = 0
    read_bytes: int = 0
    writes: int = 0
    write_bytes: int = 0
    lists: int = 0
    exists: int = 0
    deletes: int = 0

    def __sub__(self, other: StorageCounts) -> StorageCounts:
        return StorageCounts(*(a - b for a, b in zip(_fields(self), _fields(other), strict=True)))

    def to_json(self) -> dict[str, int]:
        """The counts as a JSON object."""
        return dict(zip(StorageCounts.__slots__, _fields(self), strict=True))


def _fields(counts: StorageCounts) -> tuple[int, ...]:
    return tuple(getattr(counts, name) for name in StorageCounts.__slots__)


_counts = [0] * len(StorageCounts.__slots__)
_counts_lock = threading.Lock()
_READS, _READ_BYTES, _WRITES, _WRITE_BYTES, _LISTS, _EXISTS, _DELETES = range(7)


_observers: list[Callable[[int, int], None]] = []


def _count(index: int, amount: int = 1, size_index: int = -1, size: int = 0) -> None:
    with _counts_lock:
        _counts[index] += amount
        if size_index >= 0:
            _counts[size_index] += size
    if size and _observers:
        read = size if size_index == _READ_BYTES else 0
        for observer in list(_observers):
            observer(read, size - read)


@contextlib.contextmanager
def observe_io(observer: Callable[[int, int], None]) -> Iterator[None]:
    """Within the block, ``observer(read_bytes, written_bytes)`` is called after every
    file any :class:`CheckpointStorage` of this process reads or writes (from any
    thread): what progress bars of the command line follow."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


def storage_counts() -> StorageCounts:
    """What every :class:`CheckpointStorage` of this process did so far (all threads);
    the Spark runtime records each task's share in its batch's part."""
    with _counts_lock:
        return StorageCounts(*_counts)


@dataclass(frozen=True, slots=True)
class FileRef:
    """A published file: path relative to its storage root, size and SHA-256."""

    path: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        """As stored in checkpoint metadata."""
        return {"path": self.path, "size": self.size, "sha256": self.sha256}

    @staticmethod
    def from_json(data: Any, where: str) -> FileRef:
        """Parse a file reference from metadata (``where`` names the metadata file)."""
        try:
            path, size, digest = data["path"], data["size"], data["sha256"]
        except (TypeError, KeyError) as exc:
            raise CorruptCheckpointError(f"{where}: malformed file reference {data!r}") from exc
        if (
            not isinstance(path, str)
            or not isinstance(size, int)
            or isinstance(size, bool)
            or size < 0
            or not isinstance(digest, str)
            or not _SHA256.fullmatch(digest)
            or not path
            or "\x00" in path
            or path.startswith("/")
            or path.endswith("/")
            or TMP_MARKER in path
            or any(part in ("", ".", "..") for part in path.split("/"))
        ):
            raise CorruptCheckpointError(f"{where}: malformed file reference {data!r}")
        return FileRef(path, size, digest)


def _precondition_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is an object store's refused precondition:
    S3's ``PreconditionFailed``/HTTP 412 (s3fs raises ``FileExistsError`` only when the
    reply names ``If-None-Match``; otherwise an ``OSError`` caused by botocore's error)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        response = getattr(cause, "response", None)
        if isinstance(response, dict):
            error = response.get("Error") or {}
            meta = response.get("ResponseMetadata") or {}
            if error.get("Code") in ("PreconditionFailed", "412") or meta.get(
                    "HTTPStatusCode") == 412:
                return True
        cause = cause.__cause__ or cause.__context__
    return False


class CheckpointStorage:
    """Files of checkpoints and savepoints under one root URL."""

    def __init__(
        self,
        url: str | Path,
        *,
        storage_options: dict[str, Any] | None = None,
        fs: Any = None,
    ) -> None:
        url = str(url)
        if fs is None:
            fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        else:
            root = fs._strip_protocol(url)
        self.url = url
        #: what the filesystem was opened with (may hold credentials: never in a repr,
        #: a log line or metadata); the checkpoints and savepoints a protocol restores
        #: from the storage are opened with them too
        self.storage_options: dict[str, Any] = dict(storage_options or {})
        self.fs: Any = fs
        self.root: str = root.rstrip("/") or "/"
        # fsync only on a plain local filesystem (wrappers do their own flushing)
        self._local = isinstance(fs, LocalFileSystem)

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.url!r})"

    @property
    def location(self) -> str:
        """``protocol:root``: equal for two storages over the same place however the URL
        was spelt (trailing slash, ``file://`` or a plain path)."""
        protocol = getattr(self.fs, "protocol", "file")
        if isinstance(protocol, tuple | list):
            protocol = protocol[0]
        return f"{protocol}:{self.root}"

    @property
    def is_local(self) -> bool:
        """Whether this is a plain local filesystem (``root`` is a local path)."""
        return self._local

    def child(self, relative: str) -> CheckpointStorage:
        """A storage rooted at ``relative`` under this one (same filesystem)."""
        sub = CheckpointStorage.__new__(CheckpointStorage)
        sub.url = self.url.rstrip("/") + "/" + relative
        sub.fs = self.fs
        sub.root = self.full_path(relative)
        sub.storage_options = self.storage_options
        sub._local = self._local
        return sub

    def full_path(self, relative: str) -> str:
        """The filesystem path of ``relative``."""
        return posixpath.join(self.root, relative) if relative else self.root

    # writing ------------------------------------------------------------------------

    def write(self, relative: str, data: bytes) -> FileRef:
        """Publish ``data`` at ``relative`` atomically; returns its reference."""
        return self._publish(relative, (data,))

    def upload(self, relative: str, local_path: str | Path) -> FileRef:
        """Publish a local file at ``relative`` atomically, streamed in 4 MiB chunks."""
        with open(local_path, "rb") as f:
            return self._publish(relative, iter(lambda: f.read(_CHUNK), b""))

    def _publish(self, relative: str, chunks: Iterable[bytes]) -> FileRef:
        final = self.full_path(relative)
        tmp = f"{final}{TMP_MARKER}{uuid.uuid4().hex}"
        digest = hashlib.sha256()
        size = 0
        try:
            self.fs.makedirs(posixpath.dirname(final), exist_ok=True)
            with self.fs.open(tmp, "wb") as f:
                for chunk in chunks:
                    digest.update(chunk)
                    size += len(chunk)
                    f.write(chunk)
                if self._local:
                    f.flush()
                    os.fsync(f.fileno())
            self.fs.mv(tmp, final)
            _count(_WRITES, 1, _WRITE_BYTES, size)
        except OSError as exc:
            self._forget(tmp)
            raise CheckpointError(
                f"cannot write {self.url}/{relative}: {exc}; the previous checkpoint is "
                f"untouched. Check free space and permissions of the checkpoint storage"
            ) from exc
        return FileRef(relative, size, digest.hexdigest())

    def create_exclusive(self, relative: str, data: bytes) -> bool:
        """Publish ``data`` at ``relative`` only if nothing is there yet: the storage's
        compare-and-set. True if this call created the file, False if it existed (then
        nothing is written). Of several concurrent callers exactly one gets True.

        A local filesystem links a fully written, fsynced temporary file to the name
        (``link`` fails if the name exists); other filesystems open the name in
        exclusive-create mode (``"xb"``: ``If-None-Match: *`` on S3; its only
        precondition, so a refused one — HTTP 412, which some S3-compatible servers, e.g.
        SeaweedFS, send without naming the condition — means the object exists)."""
        final = self.full_path(relative)
        _count(_WRITES, 1, _WRITE_BYTES, len(data))
        try:
            self.fs.makedirs(posixpath.dirname(final), exist_ok=True)
            if not self._local:
                try:
                    with self.fs.open(final, "xb") as f:
                        f.write(data)
                except FileExistsError:
                    return False
                except OSError as exc:
                    if _precondition_failed(exc):
                        return False
                    raise
                return True
            if os.path.lexists(final):
                return False
            tmp = f"{final}{TMP_MARKER}{uuid.uuid4().hex}"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, final)
                except FileExistsError:
                    return False
                except FileNotFoundError:
                    # the winner's clean-up swept our temporary file: we lost anyway
                    if os.path.lexists(final):
                        return False
                    raise
                return True
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        except (NotImplementedError, ValueError) as exc:
            raise CheckpointError(
                f"{self.url}: the filesystem cannot create a file exclusively ({exc}); weir "
                f"needs that to give a location one owner. Use a local path, s3:// or memory://"
            ) from exc
        except OSError as exc:
            raise CheckpointError(
                f"cannot write {self.url}/{relative}: {exc}. Check free space and permissions "
                f"of the checkpoint storage"
            ) from exc

    def _fresh(self, path: str) -> None:
        """Drop what the filesystem remembers of listings of ``path`` and its parents
        before a question about what exists: fsspec's object stores (s3fs) answer
        ``exists``/``ls``/``info`` from listings cached by this process, which miss what
        other processes wrote since — a stale "absent" would break fencing (a newer
        claim unseen) and retention. The storage never trusts such a cache."""
        if self._local:
            return
        invalidate = getattr(self.fs, "invalidate_cache", None)
        if invalidate is not None:
            invalidate(path)

    def _forget(self, path: str) -> None:
        self._fresh(path)
        try:
            if self.fs.exists(path):
                self.fs.rm(path)
        except OSError:
            pass

    def delete(self, relative: str, recursive: bool = False) -> None:
        """Remove a file (or a directory tree); missing is fine."""
        path = self.full_path(relative)
        _count(_DELETES)
        self._fresh(path)
        try:
            if self.fs.exists(path):
                self.fs.rm(path, recursive=recursive)
        except FileNotFoundError:
            pass

    # reading ------------------------------------------------------------------------

    def read(self, ref: FileRef, where: str = "") -> bytes:
        """The bytes of ``ref``, verified against its size and checksum."""
        data = self.read_bytes(ref.path, where)
        if len(data) != ref.size:
            raise CorruptCheckpointError(
                f"{self._describe(ref.path, where)} is {len(data)} bytes, expected {ref.size}: "
                f"truncated or overwritten"
            )
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise CorruptCheckpointError(
                f"{self._describe(ref.path, where)} fails its SHA-256 checksum: the file is "
                f"corrupt"
            )
        return data

    def read_bytes(self, relative: str, where: str = "") -> bytes:
        """The bytes of a file, unverified (metadata verifies its own checksum)."""
        return self._cat(relative, where)

    def _cat(self, relative: str, where: str, start: int | None = None,
             end: int | None = None) -> bytes:
        """A file's bytes (from ``start`` to ``end``), counted; a missing or unreadable
        file is a CorruptCheckpointError."""
        try:
            data = bytes(self.fs.cat_file(self.full_path(relative), start=start, end=end))
        except FileNotFoundError as exc:
            raise CorruptCheckpointError(
                f"{self._describe(relative, where)} is missing"
            ) from exc
        except (OSError, ValueError) as exc:
            raise CorruptCheckpointError(
                f"{self._describe(relative, where)} cannot be read: {exc}"
            ) from exc
        _count(_READS, 1, _READ_BYTES, len(data))
        return data

    def read_range(self, relative: str, start: int, length: int, where: str = "") -> bytes:
        """``length`` bytes of a file from offset ``start``, unverified (a file's
        checksum covers all of it); fewer bytes there is a CorruptCheckpointError."""
        data = self._cat(relative, where, start, start + length)
        if len(data) != length:
            raise CorruptCheckpointError(
                f"{self._describe(relative, where)} ends before byte {start + length}: "
                f"truncated")
        return data

    def verify(self, ref: FileRef, where: str = "") -> None:
        """Raise CorruptCheckpointError unless ``ref`` is present and intact."""
        self.read(ref, where)

    def download(self, ref: FileRef, local_path: str | Path, where: str = "") -> None:
        """Copy ``ref`` to a local file, verified."""
        data = self.read(ref, where)  # (counted as a read)
        with open(local_path, "wb") as f:
            f.write(data)

    def exists(self, relative: str) -> bool:
        """Whether a file or directory exists."""
        _count(_EXISTS)
        path = self.full_path(relative)
        self._fresh(path)
        return bool(self.fs.exists(path))

    def list_dir(self, relative: str = "") -> list[str]:
        """Names directly under ``relative`` (empty if it does not exist)."""
        path = self.full_path(relative)
        _count(_LISTS)
        self._fresh(path)
        try:
            entries = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        names = []
        for entry in entries:
            name = posixpath.basename(str(entry).rstrip("/"))
            if name:
                names.append(name)
        return sorted(set(names))

    def walk_files(self, relative: str = "") -> list[str]:
        """Every file under ``relative``, as paths relative to the root."""
        base = self.full_path(relative)
        _count(_LISTS)
        self._fresh(base)
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        root = self.root.rstrip("/") + "/"
        out = []
        for path in found:
            path = str(path)
            stripped = self.fs._strip_protocol(path) if "://" in path else path
            if not stripped.startswith("/") and root.startswith("/"):
                stripped = "/" + stripped
            if stripped.startswith(root):
                out.append(stripped[len(root) :])
        return sorted(out)

    def _describe(self, relative: str, where: str) -> str:
        prefix = f"{where}: " if where else ""
        return f"{prefix}file {self.url.rstrip('/')}/{relative}"
