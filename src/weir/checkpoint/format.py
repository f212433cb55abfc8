"""The on-disk format of checkpoints and savepoints (format version 2).

This module defines, encodes and decodes every file weir writes into checkpoint
storage; nothing else writes there. Layout under a checkpoint storage root::

    chk-<id>/_metadata                      published last: the checkpoint is complete
    chk-<id>/<uid-dir>/<subtask>-<attempt>.keyed     full keyed state of one subtask
    chk-<id>/<uid-dir>/<subtask>-<attempt>.timers    timers (incremental RocksDB
                                                     checkpoints written before the
                                                     timer column families; read only)
    chk-<id>/<uid-dir>/<subtask>-<attempt>.op        operator + broadcast state
    chk-<id>/<uid-dir>/<subtask>-<attempt>/<name>    private RocksDB files (MANIFEST,
                                                     CURRENT, OPTIONS, ...)
    chk-<id>/_channels/<vertex-dir>/<subtask>-<attempt>.channels
                                            records in flight of an unaligned
                                            checkpoint (weir.checkpoint.channel_state)
    shared/<uid-dir>/<id>-<uuid>.sst        RocksDB SST files shared by incremental
                                            checkpoints, reference counted; <id> is
                                            the checkpoint that uploaded the file
    shared/<uid-dir>/<id>-options-<uuid>    RocksDB's OPTIONS file, shared by content
                                            (named as a private file in the metadata)
    shared/<uid-dir>/<id>-<uuid>.{keyed,delta,op}
    shared/<uid-dir>/m<id>-<uuid>.keyed     changelog checkpoints of the hash map: a
                                            base, per-checkpoint deltas, operator
                                            state, materializations (format in
                                            ``weir.checkpoint.changelog``)

A savepoint directory has the same layout without ``shared/`` (it is
self-contained, always in the canonical full format, and relocatable: every path in
its metadata is relative to the directory holding ``_metadata``). ``<uid-dir>`` is the
operator uid with unsafe characters replaced, plus 8 hex digits of its SHA-256.
``<attempt>`` is unique per snapshot attempt, so a retried or zombie attempt never
overwrites a published file.

**Data files** (``.keyed``, ``.timers``, ``.op``) start with the 8-byte magic
``WEIRDATA`` and a ``uint16_be`` format version, followed by the body:

* ``.keyed`` / ``.timers`` — one msgpack map per key group, concatenated in key-group
  order: ``{state name: [key0, value0, key1, value1, ...]}`` where keys and values are
  the canonical snapshot entries of ``weir.state.backend`` (prefixed key + optional
  map user key; value bytes of the state's serializer). The metadata holds each key
  group's ``[group, offset, length]`` within the body, so a subtask restoring at
  another parallelism decodes only its own key groups.
* ``.op`` — one msgpack map ``{"operator": {name: [element bytes...]},
  "broadcast": {name: [key0, value0, ...]}}``.

**Metadata** (``_metadata``) is the 8-byte magic ``WEIRMETA``, a ``uint16_be`` format
version, the 32-byte SHA-256 of the body, and the body: UTF-8 JSON (never pickle)::

    {"format": "weir", "format_version": 2,
     "kind": "checkpoint" | "savepoint", "checkpoint_id": 7,
     "trigger_timestamp_ms": ..., "completion_timestamp_ms": ...,
     "source_positions": {...},               # opaque JSON from the runtime
     "stats": {"bytes": ..., "duration_ms": ..., "subtasks": n},
     "channel_state": {...},                  # unaligned checkpoints: records in
                                              # flight (weir.checkpoint.channel_state)
     "owner": {"lineage": ..., "token": n},   # optional: the writer's job lineage
                                              # and claim (weir.checkpoint.protocol)
     "operators": {uid: {"parallelism": p, "max_parallelism": M, "subtasks": [
        {"subtask_index": i, "key_group_range": [start, end],
         "states": [{"name", "kind", "serializers", "ttl", "schemas"?}], "timer_states": [...],
         "keyed": null
                | {"kind": "full", "file": REF, "key_groups": [[g, off, len], ...]}
                | {"kind": "rocksdb-incremental", "shared": {local: REF},
                   "private": {local: REF}, "timers": null | FULL}
                | {"kind": "changelog", "base": FULL, "deltas": [FULL, ...]},
         "operator_states": [{"name", "mode", "serializer", "schema"?}],
         "broadcast_states": [{"name", "serializers", "schemas"?}],
         "operator_file": null | REF,
         "stats": {"bytes", "sync_ms", "async_ms", "entries", "new_bytes",
                   "alignment_ms" (optional: its task's barrier alignment)}}]}}}

where ``REF`` is ``{"path", "size", "sha256"}`` relative to the storage root. Every
file a checkpoint needs is in its metadata with size and checksum; a reader verifies
both and raises ``CorruptCheckpointError`` otherwise, and ``CheckpointFormatError``
for a wrong magic or an unknown format version.

``entries`` is the number of keyed-state entries the subtask's state holds at the
checkpoint, whatever ``keyed`` is: one per key of each value, reducing, aggregating and
list state, one per (key, user key) of each map state, timers not counted — what
``weir.read_state`` returns (``weir.runtime.checkpointer``, "Entries"). Checkpoints
written before this definition recorded the entries written into the checkpoint's own
files instead (a changelog delta's changed keys, 0 for a native RocksDB checkpoint,
timers included); they read the same, with that number.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from weir.api.descriptors import StateKind
from weir.checkpoint.channel_state import ChannelStateHandle
from weir.checkpoint.datafiles import (
    _VERSION,
    FORMAT_VERSION,
    _check_header,
    check_data_header,
    decode_keyed,
    decode_operator_file,
    encode_keyed,
    encode_operator_file,
    version_advice,
)
from weir.checkpoint.storage import FileRef
from weir.errors import CheckpointFormatError, CorruptCheckpointError
from weir.state.keygroups import KeyGroupRange
from weir.state.snapshot import RedistributionMode, StateMeta, canonical_schema

__all__ = [
    "FORMAT_VERSION",
    "METADATA_FILE",
    "CheckpointKind",
    "CheckpointMetadata",
    "check_data_header",
    "KeyedChangelogHandle",
    "KeyedFullHandle",
    "KeyedHandle",
    "KeyedIncrementalHandle",
    "OperatorHandle",
    "SubtaskStateHandle",
    "SubtaskStats",
    "decode_keyed",
    "decode_metadata",
    "decode_operator_file",
    "decode_part",
    "encode_keyed",
    "encode_metadata",
    "encode_operator_file",
    "encode_part",
    "uid_dir",
]

METADATA_FILE = "_metadata"
_META_MAGIC = b"WEIRMETA"
_PART_MAGIC = b"WEIRPART"
_META_HEADER = len(_META_MAGIC) + _VERSION.size + 32


class CheckpointKind(enum.Enum):
    """A checkpoint (owned by weir, retained and subsumed) or a savepoint (owned by
    the user, self-contained, canonical)."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


def uid_dir(uid: str) -> str:
    """A directory name for an operator uid: safe characters plus a short hash."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", uid)[:48]
    return f"{safe}-{hashlib.sha256(uid.encode()).hexdigest()[:8]}"


# ---------------------------------------------------------------- handles (metadata)


@dataclass(frozen=True, slots=True)
class SubtaskStats:
    """What one subtask's snapshot cost."""

    bytes: int = 0
    new_bytes: int = 0
    sync_ms: float = 0.0
    async_ms: float = 0.0
    #: keyed-state entries the subtask holds at the checkpoint, timers not counted (see
    #: the module doc)
    entries: int = 0
    #: its task's barrier alignment, first barrier to last (continuous runtime; None:
    #: not known, or a task without inputs)
    alignment_ms: float | None = None


@dataclass(frozen=True, slots=True)
class KeyedFullHandle:
    """Keyed state in one canonical data file with a key-group index."""

    file: FileRef
    key_groups: Mapping[int, tuple[int, int]]


@dataclass(frozen=True, slots=True)
class KeyedIncrementalHandle:
    """A native RocksDB checkpoint: shared SST files plus private files, and the
    subtask's timers as a canonical file."""

    shared: Mapping[str, FileRef]
    private: Mapping[str, FileRef]
    timers: KeyedFullHandle | None = None


@dataclass(frozen=True, slots=True)
class KeyedChangelogHandle:
    """Hash-map keyed state as a changelog: a full ``base`` (``.keyed``) and the
    ``deltas`` written since, oldest first (``weir.checkpoint.changelog``)."""

    base: KeyedFullHandle
    deltas: tuple[KeyedFullHandle, ...] = ()

    def files(self) -> list[FileRef]:
        """The base file, then every delta file."""
        return [self.base.file, *(d.file for d in self.deltas)]


KeyedHandle = KeyedFullHandle | KeyedIncrementalHandle | KeyedChangelogHandle


@dataclass(frozen=True)
class SubtaskStateHandle:
    """Where the state of one operator subtask lives, and what it is."""

    subtask_index: int
    key_group_range: KeyGroupRange
    metas: Mapping[str, StateMeta]
    timer_states: tuple[str, ...]
    keyed: KeyedHandle | None
    operator_states: Mapping[str, tuple[RedistributionMode, str]] = field(default_factory=dict)
    broadcast_states: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    operator_file: FileRef | None = None
    stats: SubtaskStats = SubtaskStats()
    #: the schemas (canonical JSON) of operator states' serializers that have one
    operator_schemas: Mapping[str, str] = field(default_factory=dict)
    #: the key's and value's serializers' schemas of broadcast states that have one
    broadcast_schemas: Mapping[str, tuple[str | None, str | None]] = field(
        default_factory=dict)

    def files(self) -> list[FileRef]:
        """Every file this subtask's state needs."""
        out: list[FileRef] = []
        if isinstance(self.keyed, KeyedFullHandle):
            out.append(self.keyed.file)
        elif isinstance(self.keyed, KeyedIncrementalHandle):
            out.extend(self.keyed.shared.values())
            out.extend(self.keyed.private.values())
            if self.keyed.timers is not None:
                out.append(self.keyed.timers.file)
        elif isinstance(self.keyed, KeyedChangelogHandle):
            out.extend(self.keyed.files())
        if self.operator_file is not None:
            out.append(self.operator_file)
        return out


@dataclass(frozen=True)
class OperatorHandle:
    """The state of every subtask of one operator."""

    uid: str
    parallelism: int
    max_parallelism: int
    subtasks: tuple[SubtaskStateHandle, ...]


@dataclass(frozen=True)
class CheckpointMetadata:
    """The content of a ``_metadata`` file."""

    checkpoint_id: int
    kind: CheckpointKind
    trigger_timestamp_ms: int
    completion_timestamp_ms: int
    operators: Mapping[str, OperatorHandle]
    source_positions: Mapping[str, Any] = field(default_factory=dict)
    duration_ms: float = 0.0
    format_version: int = FORMAT_VERSION
    #: vertex -> the records its tasks had in flight (unaligned checkpoints only)
    channel_state: Mapping[str, ChannelStateHandle] = field(default_factory=dict)
    #: who wrote it (continuous runtime, :mod:`weir.checkpoint.protocol`): ``lineage``
    #: (the job lineage) and ``token`` (the owner's claim); empty when not recorded
    owner: Mapping[str, Any] = field(default_factory=dict)

    def files(self) -> list[FileRef]:
        """Every file this checkpoint references."""
        return [f for op in self.operators.values() for s in op.subtasks for f in s.files()
                ] + [f for h in self.channel_state.values() for f in h.subtasks.values()]

    def shared_files(self) -> set[str]:
        """Paths of the shared (reference-counted) files it references: everything
        under ``shared/``."""
        return {ref.path for ref in self.files() if ref.path.startswith("shared/")}

    @property
    def total_bytes(self) -> int:
        """Size of all referenced files."""
        return sum(f.size for f in self.files())


# ---------------------------------------------------------------- metadata


def _ref(ref: FileRef | None) -> Any:
    return None if ref is None else ref.to_json()


def _full_json(handle: KeyedFullHandle) -> dict[str, Any]:
    return {
        "kind": "full",
        "file": handle.file.to_json(),
        "key_groups": [[g, off, n] for g, (off, n) in sorted(handle.key_groups.items())],
    }


def _subtask_json(s: SubtaskStateHandle) -> dict[str, Any]:
    keyed: Any = None
    if isinstance(s.keyed, KeyedFullHandle):
        keyed = _full_json(s.keyed)
    elif isinstance(s.keyed, KeyedIncrementalHandle):
        keyed = {
            "kind": "rocksdb-incremental",
            "shared": {k: r.to_json() for k, r in sorted(s.keyed.shared.items())},
            "private": {k: r.to_json() for k, r in sorted(s.keyed.private.items())},
            "timers": None if s.keyed.timers is None else _full_json(s.keyed.timers),
        }
    elif isinstance(s.keyed, KeyedChangelogHandle):
        keyed = {"kind": "changelog", "base": _full_json(s.keyed.base),
                 "deltas": [_full_json(d) for d in s.keyed.deltas]}
    return {
        "subtask_index": s.subtask_index,
        "key_group_range": [s.key_group_range.start, s.key_group_range.end],
        "states": [
            {"name": m.name, "kind": m.kind.value, "serializers": list(m.serializers),
             "ttl": m.ttl, **({"schemas": [None if x is None else json.loads(x)
                                           for x in m.schemas]} if m.schemas else {})}
            for m in s.metas.values()
        ],
        "timer_states": list(s.timer_states),
        "keyed": keyed,
        "operator_states": [
            {"name": n, "mode": mode.value, "serializer": ser,
             **({"schema": json.loads(s.operator_schemas[n])} if n in s.operator_schemas
                else {})}
            for n, (mode, ser) in sorted(s.operator_states.items())
        ],
        "broadcast_states": [
            {"name": n, "serializers": list(sers),
             **({"schemas": [None if x is None else json.loads(x)
                             for x in s.broadcast_schemas[n]]}
                if n in s.broadcast_schemas else {})}
            for n, sers in sorted(s.broadcast_states.items())
        ],
        "operator_file": _ref(s.operator_file),
        "stats": {
            "bytes": s.stats.bytes, "new_bytes": s.stats.new_bytes,
            "sync_ms": round(s.stats.sync_ms, 3), "async_ms": round(s.stats.async_ms, 3),
            "entries": s.stats.entries,
            **({} if s.stats.alignment_ms is None
               else {"alignment_ms": round(s.stats.alignment_ms, 3)}),
        },
    }


def encode_metadata(meta: CheckpointMetadata) -> bytes:
    """The bytes of a ``_metadata`` file."""
    doc = {
        "format": "weir",
        "format_version": FORMAT_VERSION,
        "kind": meta.kind.value,
        "checkpoint_id": meta.checkpoint_id,
        "trigger_timestamp_ms": meta.trigger_timestamp_ms,
        "completion_timestamp_ms": meta.completion_timestamp_ms,
        "source_positions": dict(meta.source_positions),
        "stats": {
            "bytes": meta.total_bytes,
            "duration_ms": round(meta.duration_ms, 3),
            "subtasks": sum(len(op.subtasks) for op in meta.operators.values()),
        },
        "operators": {
            uid: {
                "parallelism": op.parallelism,
                "max_parallelism": op.max_parallelism,
                "subtasks": [_subtask_json(s) for s in op.subtasks],
            }
            for uid, op in sorted(meta.operators.items())
        },
    }
    if meta.channel_state:  # (weir.checkpoint.channel_state)
        doc["channel_state"] = {
            vertex: {"parallelism": h.parallelism,
                     "subtasks": [[i, ref.to_json()] for i, ref in sorted(h.subtasks.items())]}
            for vertex, h in sorted(meta.channel_state.items())}
    if meta.owner:  # (weir.checkpoint.protocol)
        doc["owner"] = dict(meta.owner)
    return _envelope(_META_MAGIC, doc)


def _envelope(magic: bytes, doc: Any) -> bytes:
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return magic + _VERSION.pack(FORMAT_VERSION) + hashlib.sha256(body).digest() + body


def _open_envelope(magic: bytes, data: bytes, where: str) -> Any:
    _check_header(data, magic, where)
    if len(data) < _META_HEADER:
        raise CorruptCheckpointError(f"{where}: file is truncated")
    body = data[_META_HEADER:]
    if hashlib.sha256(body).digest() != data[_META_HEADER - 32 : _META_HEADER]:
        raise CorruptCheckpointError(
            f"{where}: fails its SHA-256 checksum (corrupt or truncated)"
        )
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise CorruptCheckpointError(f"{where}: malformed JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != "weir" or (
        doc.get("format_version") != FORMAT_VERSION
    ):
        version = doc.get("format_version") if isinstance(doc, dict) else None
        raise CheckpointFormatError(
            f"{where}: not a weir version {FORMAT_VERSION} file; it was written by another "
            f"weir version or is foreign"
            + (version_advice(version) if isinstance(version, int) else "")
        )
    return doc


def encode_part(
    uid: str, parallelism: int, max_parallelism: int, handle: SubtaskStateHandle,
    epoch: Mapping[str, Any],
) -> bytes:
    """A *part* file: one subtask's acknowledgement of one Spark epoch (its state
    handle and the runtime's epoch facts, e.g. attempt id and event-time progress).
    Same envelope as ``_metadata`` with the magic ``WEIRPART``."""
    return _envelope(_PART_MAGIC, {
        "format": "weir", "format_version": FORMAT_VERSION, "uid": uid,
        "parallelism": parallelism, "max_parallelism": max_parallelism,
        "subtask": _subtask_json(handle), "epoch": dict(epoch),
    })


def decode_part(
    data: bytes, where: str
) -> tuple[str, int, int, SubtaskStateHandle, dict[str, Any]]:
    """``(uid, parallelism, max_parallelism, handle, epoch)`` of a part file."""
    doc = _open_envelope(_PART_MAGIC, data, where)
    try:
        return (
            str(doc["uid"]), int(doc["parallelism"]), int(doc["max_parallelism"]),
            _subtask_from(doc["subtask"], where), dict(doc["epoch"]),
        )
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
        raise CorruptCheckpointError(f"{where}: malformed part file ({exc!r})") from exc


def _schema_or_none(doc: Any) -> str | None:
    return None if doc is None else canonical_schema(doc)


def _full_from(doc: Any, where: str) -> KeyedFullHandle:
    return KeyedFullHandle(
        FileRef.from_json(doc["file"], where),
        {int(g): (int(off), int(n)) for g, off, n in doc["key_groups"]},
    )


def _subtask_from(doc: Any, where: str) -> SubtaskStateHandle:
    keyed_doc = doc["keyed"]
    keyed: KeyedHandle | None = None
    if keyed_doc is not None:
        if keyed_doc["kind"] == "full":
            keyed = _full_from(keyed_doc, where)
        elif keyed_doc["kind"] == "rocksdb-incremental":
            timers = keyed_doc["timers"]
            keyed = KeyedIncrementalHandle(
                {k: FileRef.from_json(r, where) for k, r in keyed_doc["shared"].items()},
                {k: FileRef.from_json(r, where) for k, r in keyed_doc["private"].items()},
                None if timers is None else _full_from(timers, where),
            )
        elif keyed_doc["kind"] == "changelog":
            keyed = KeyedChangelogHandle(
                _full_from(keyed_doc["base"], where),
                tuple(_full_from(d, where) for d in keyed_doc["deltas"]),
            )
        else:
            raise CheckpointFormatError(f"{where}: unknown keyed state kind {keyed_doc['kind']!r}")
    start, end = doc["key_group_range"]
    metas = {}
    for m in doc["states"]:
        metas[m["name"]] = StateMeta(
            m["name"], StateKind(m["kind"]), tuple(m["serializers"]), bool(m["ttl"]),
            tuple(_schema_or_none(x) for x in m.get("schemas", ())),
        )
    stats = doc.get("stats") or {}
    op_file = doc["operator_file"]
    return SubtaskStateHandle(
        subtask_index=int(doc["subtask_index"]),
        key_group_range=KeyGroupRange(int(start), int(end)),
        metas=metas,
        timer_states=tuple(doc["timer_states"]),
        keyed=keyed,
        operator_states={
            o["name"]: (RedistributionMode(o["mode"]), o["serializer"])
            for o in doc["operator_states"]
        },
        broadcast_states={
            b["name"]: (b["serializers"][0], b["serializers"][1]) for b in doc["broadcast_states"]
        },
        operator_schemas={o["name"]: canonical_schema(o["schema"])
                          for o in doc["operator_states"] if o.get("schema") is not None},
        broadcast_schemas={
            b["name"]: (_schema_or_none(b["schemas"][0]), _schema_or_none(b["schemas"][1]))
            for b in doc["broadcast_states"] if "schemas" in b},
        operator_file=None if op_file is None else FileRef.from_json(op_file, where),
        stats=SubtaskStats(
            int(stats.get("bytes", 0)), int(stats.get("new_bytes", 0)),
            float(stats.get("sync_ms", 0.0)), float(stats.get("async_ms", 0.0)),
            int(stats.get("entries", 0)),
            None if stats.get("alignment_ms") is None else float(stats["alignment_ms"]),
        ),
    )


def decode_metadata(data: bytes, where: str) -> CheckpointMetadata:
    """Parse and verify a ``_metadata`` file (``where`` names it in errors)."""
    _check_header(data, _META_MAGIC, where)
    if len(data) < _META_HEADER:
        raise CorruptCheckpointError(f"{where}: metadata is truncated")
    digest = data[_META_HEADER - 32 : _META_HEADER]
    body = data[_META_HEADER:]
    if hashlib.sha256(body).digest() != digest:
        raise CorruptCheckpointError(
            f"{where}: metadata fails its SHA-256 checksum (corrupt or truncated)"
        )
    try:
        doc = json.loads(body)
        if doc.get("format") != "weir" or doc.get("format_version") != FORMAT_VERSION:
            raise CheckpointFormatError(
                f"{where}: metadata of format {doc.get('format')!r} version "
                f"{doc.get('format_version')!r}; this weir reads weir version {FORMAT_VERSION}"
                + version_advice(doc.get("format_version"))
            )
        operators = {}
        for uid, op in doc["operators"].items():
            subtasks = tuple(_subtask_from(s, where) for s in op["subtasks"])
            operators[uid] = OperatorHandle(
                uid, int(op["parallelism"]), int(op["max_parallelism"]), subtasks
            )
        stats = doc.get("stats") or {}
        return CheckpointMetadata(
            checkpoint_id=int(doc["checkpoint_id"]),
            kind=CheckpointKind(doc["kind"]),
            trigger_timestamp_ms=int(doc["trigger_timestamp_ms"]),
            completion_timestamp_ms=int(doc["completion_timestamp_ms"]),
            operators=operators,
            source_positions=doc.get("source_positions") or {},
            duration_ms=float(stats.get("duration_ms", 0.0)),
            channel_state={
                str(vertex): ChannelStateHandle(
                    str(vertex), int(h["parallelism"]),
                    {int(i): FileRef.from_json(ref, where) for i, ref in h["subtasks"]})
                for vertex, h in (doc.get("channel_state") or {}).items()},
            owner=dict(doc.get("owner") or {}),
        )
    except CorruptCheckpointError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
        raise CorruptCheckpointError(f"{where}: malformed metadata ({exc!r})") from exc
