"""In-memory snapshots of one operator subtask, and how they are redistributed.

A snapshot holds only bytes and plain metadata (no pickled objects): keyed state in
the canonical per-key-group form of ``weir.state.backend`` (timers included, as the
internal states ``__weir_timers/event`` and ``__weir_timers/processing``), operator
list state as encoded elements with their redistribution mode, and broadcast state
as encoded entries. Restoring at another parallelism:

* keyed state — each new subtask takes the key groups of its range from every old
  snapshot whose range intersects it;
* even-split list state, as Flink's ``RoundRobinOperatorStateRepartitioner``
  (``repartitionState`` / ``repartitionSplitState``):

  - at the *same* parallelism every subtask keeps exactly its own old list;
  - at another parallelism ``p``, each state's old elements, concatenated in old
    subtask order (``n`` of them), are cut into ``p`` contiguous chunks of
    ``n // p`` elements, the first ``n % p`` chunks one longer. Chunk ``k`` goes to
    subtask ``(start + k) % p``. The states are taken in order of name; the first
    starts at subtask 0 and each next one starts where the previous one's longer
    chunks ended, ``start = (start + n % p) % p``, so the extra elements of several
    states land on different subtasks and the totals per subtask differ by at most
    one element;

* union list state — every new subtask gets every old element (also at the same
  parallelism);
* broadcast state — new subtask ``i`` gets old subtask ``i % p_old``'s copy.

Durable storage of these snapshots is ``weir.checkpoint``'s job.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from weir.api.descriptors import StateKind
from weir.errors import RestoreError
from weir.state.keygroups import KeyGroupRange
from weir.state.packed import Entries, PackedGroups

__all__ = [
    "BroadcastStateSnapshot",
    "KeyedStateSnapshot",
    "NativeRocksDBState",
    "OperatorListStateSnapshot",
    "OperatorSubtaskSnapshot",
    "RedistributionMode",
    "StateMeta",
    "assign_broadcast_state",
    "assign_keyed_state",
    "assign_operator_state",
    "canonical_schema",
    "schema_json",
]

class RedistributionMode(enum.Enum):
    """How operator state is divided when the parallelism changes."""

    SPLIT_DISTRIBUTE = "split_distribute"
    UNION = "union"
    BROADCAST = "broadcast"


def canonical_schema(schema: Any) -> str:
    """A serializer's schema document as the canonical JSON :class:`StateMeta` keeps."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def schema_json(serializer: Any) -> str | None:
    """``serializer.schema()`` as canonical JSON, None for a serializer without one."""
    schema = serializer.schema()
    return None if schema is None else canonical_schema(schema)


@dataclass(frozen=True, slots=True)
class StateMeta:
    """What a keyed state was registered as: compared on restore."""

    name: str
    kind: StateKind
    serializers: tuple[str, ...]
    ttl: bool = False
    #: each serializer's schema (``Serializer.schema()``) as canonical JSON, None for
    #: one without; empty when no serializer has one (issue 41: typed records)
    schemas: tuple[str | None, ...] = ()


@dataclass(frozen=True, slots=True)
class NativeRocksDBState:
    """A RocksDB database directory restored from an incremental checkpoint (local,
    verified), of which only ``key_group_range`` is to be used. Its keys and values
    are in the canonical layout, one column family ``s:<state name>`` per state."""

    path: str
    key_group_range: KeyGroupRange
    #: where its SST files live in checkpoint storage: (storage URL, local file name
    #: -> file reference), so the next incremental checkpoint to the same storage
    #: references them instead of uploading them again
    shared: tuple[str, Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class KeyedStateSnapshot:
    """Keyed state of one subtask: key group -> state name -> canonical entries (packed
    as they go into a ``.keyed`` file when snapshotted, ``weir.state.packed``), plus
    (from an incremental RocksDB checkpoint) a native database holding the states
    while ``groups`` holds only the timers."""

    max_parallelism: int
    key_group_range: KeyGroupRange
    metas: Mapping[str, StateMeta]
    timer_states: tuple[str, ...]
    groups: Mapping[int, Mapping[str, Entries]]
    native: NativeRocksDBState | None = None

    def entry_count(self) -> int:
        """Number of stored entries (for statistics and tests)."""
        return sum(len(e) for per in self.groups.values() for e in per.values())


@dataclass(frozen=True, slots=True)
class OperatorListStateSnapshot:
    """One operator list state of one subtask."""

    name: str
    mode: RedistributionMode
    serializer: str
    elements: tuple[bytes, ...]
    #: the serializer's schema as canonical JSON (typed records), else None
    schema: str | None = None


@dataclass(frozen=True, slots=True)
class BroadcastStateSnapshot:
    """One broadcast state of one subtask."""

    name: str
    serializers: tuple[str, str]
    entries: Entries
    #: the key's and the value's serializer's schemas as canonical JSON, or None each
    schemas: tuple[str | None, str | None] = (None, None)


@dataclass(frozen=True)
class OperatorSubtaskSnapshot:
    """Everything one operator subtask needs to resume, as bytes and metadata."""

    operator_uid: str
    checkpoint_id: int
    timestamp_ms: int
    parallelism: int
    subtask_index: int
    max_parallelism: int
    keyed: KeyedStateSnapshot | None = None
    operator_states: Mapping[str, OperatorListStateSnapshot] = field(default_factory=dict)
    broadcast_states: Mapping[str, BroadcastStateSnapshot] = field(default_factory=dict)


def _check_same_job(
    snapshots: Sequence[OperatorSubtaskSnapshot], own: tuple[int, int] | None = None
) -> None:
    """One snapshot per old subtask of one operator; or, for the restoring subtask
    ``own = (parallelism, subtask_index)``, exactly its own snapshot from the same
    parallelism without union state — all it needs then (the Spark runtime's tasks
    read only their own part)."""
    if not snapshots:
        raise RestoreError("no snapshots to restore from")
    first = snapshots[0]
    for s in snapshots:
        if s.operator_uid != first.operator_uid:
            raise RestoreError(
                f"snapshots of different operators mixed in one restore: "
                f"{first.operator_uid!r} and {s.operator_uid!r}"
            )
        if s.max_parallelism != first.max_parallelism:
            raise RestoreError(
                f"operator {first.operator_uid!r}: snapshots disagree on max_parallelism "
                f"({first.max_parallelism} vs {s.max_parallelism})"
            )
    if own is not None and len(snapshots) == 1 and (
        (first.parallelism, first.subtask_index) == own
    ) and all(st.mode is not RedistributionMode.UNION for st in first.operator_states.values()):
        return
    indexes = sorted(s.subtask_index for s in snapshots)
    if indexes != list(range(first.parallelism)) or any(
        s.parallelism != first.parallelism for s in snapshots
    ):
        raise RestoreError(
            f"operator {first.operator_uid!r}: expected one snapshot per subtask "
            f"0..{first.parallelism - 1}, got subtasks {indexes}: a restore from an incomplete "
            f"set would lose state"
        )


def assign_keyed_state(
    snapshots: Sequence[OperatorSubtaskSnapshot], key_group_range: KeyGroupRange
) -> list[KeyedStateSnapshot]:
    """The keyed snapshots whose key groups intersect ``key_group_range``, clipped to it."""
    first = snapshots[0] if snapshots else None
    own = None  # a subtask's own snapshot from the same parallelism covers its range
    if first is not None and first.keyed is not None and (
        first.keyed.key_group_range == key_group_range
    ):
        own = (first.parallelism, first.subtask_index)
    _check_same_job(snapshots, own)
    out = []
    for s in sorted(snapshots, key=lambda s: s.subtask_index):
        keyed = s.keyed
        if keyed is None:
            continue
        overlap = keyed.key_group_range.intersection(key_group_range)
        groups: Mapping[int, Mapping[str, Entries]]
        if isinstance(keyed.groups, PackedGroups):  # stays packed: decoded when loaded
            groups = keyed.groups.restrict(overlap.__contains__)
        else:
            groups = {g: e for g, e in keyed.groups.items() if g in overlap}
        native = keyed.native
        if native is not None:
            native = NativeRocksDBState(native.path, overlap, native.shared)
        out.append(
            KeyedStateSnapshot(
                keyed.max_parallelism, overlap, keyed.metas, keyed.timer_states, groups, native
            )
        )
    return out


def assign_operator_state(
    snapshots: Sequence[OperatorSubtaskSnapshot], parallelism: int, subtask_index: int
) -> dict[str, OperatorListStateSnapshot]:
    """Operator list states of new subtask ``subtask_index`` of ``parallelism``, by
    Flink's round-robin rules (module docstring): at the old parallelism each subtask
    keeps its own even-split lists; otherwise the even-split states, in name order,
    are cut into contiguous chunks whose starting subtask rotates from state to state."""
    _check_same_job(snapshots, (parallelism, subtask_index))
    ordered = sorted(snapshots, key=lambda s: s.subtask_index)
    names: dict[str, OperatorListStateSnapshot] = {}
    for s in ordered:
        for name, st in s.operator_states.items():
            known = names.setdefault(name, st)
            if (known.mode, known.serializer, known.schema) != (st.mode, st.serializer,
                                                                 st.schema):
                raise RestoreError(
                    f"operator {s.operator_uid!r}: operator state {name!r} has different "
                    f"modes or serializers in different subtasks"
                )
    # at the old parallelism a subtask keeps its own lists (its snapshot is enough)
    same_parallelism = all(s.parallelism == parallelism for s in ordered)
    own = next((s for s in ordered if s.subtask_index == subtask_index), None) if (
        same_parallelism) else None
    out = {}
    start = 0  # the subtask that gets the first chunk of the next even-split state
    for name in sorted(names):
        first = names[name]
        mine: Sequence[bytes]
        if first.mode is RedistributionMode.SPLIT_DISTRIBUTE and own is not None:
            kept = own.operator_states.get(name)
            mine = kept.elements if kept is not None else ()
        elif first.mode is RedistributionMode.BROADCAST:
            old = [s for s in ordered if name in s.operator_states]
            mine = old[subtask_index % len(old)].operator_states[name].elements
        else:
            elements = [
                e
                for s in ordered
                for e in (s.operator_states[name].elements if name in s.operator_states else ())
            ]
            if first.mode is RedistributionMode.UNION:
                mine = elements
            else:
                mine = _split_chunk(elements, parallelism, start, subtask_index)
                start = (start + len(elements) % parallelism) % parallelism
        out[name] = OperatorListStateSnapshot(name, first.mode, first.serializer, tuple(mine),
                                              first.schema)
    return out


def _split_chunk(
    elements: Sequence[bytes], parallelism: int, start: int, subtask_index: int
) -> Sequence[bytes]:
    """Subtask ``subtask_index``'s contiguous chunk of ``elements`` when chunk 0 goes
    to subtask ``start`` and chunk ``k`` to ``(start + k) % parallelism``; the first
    ``len(elements) % parallelism`` chunks are one element longer."""
    base, extra = divmod(len(elements), parallelism)
    k = (subtask_index - start) % parallelism
    offset = k * base + min(k, extra)
    return elements[offset : offset + base + (1 if k < extra else 0)]


def assign_broadcast_state(
    snapshots: Sequence[OperatorSubtaskSnapshot], subtask_index: int, parallelism: int = 0
) -> dict[str, BroadcastStateSnapshot]:
    """Broadcast states for new subtask ``subtask_index`` (of ``parallelism``): old
    subtask ``i % p_old``'s."""
    _check_same_job(snapshots, (parallelism, subtask_index))
    ordered = sorted(snapshots, key=lambda s: s.subtask_index)
    source = ordered[subtask_index % len(ordered)]
    return dict(source.broadcast_states)
