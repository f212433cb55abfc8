"""Rows as stored state entries: the inverse of ``weir.processor.decoding``.

Each keyed row becomes a canonical entry (``weir.state.backend``): the prefixed key
(2 bytes of key group + the key's canonical bytes, ``weir.state.keybytes``), for a
map the user key's bytes after it, the value in the state's serializer, behind an
``int64_be`` timestamp when the state has TTL. A list state's rows of one key become
one framed entry in ``index`` order. Timers become ``prefixed key + int64_be(ts)``
entries of the internal timer states, operator list state its encoded elements in
``index`` order per subtask, broadcast state its encoded ``(key, value)`` pairs.

Entries are grouped by key group and sorted by key (both backends restore any order;
sorted makes a written savepoint byte-for-byte reproducible).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from weir.api.descriptors import StateKind
from weir.api.serializers import Serializer
from weir.errors import ConfigurationError, StateSerializationError
from weir.processor.decoding import TIMER_COLUMNS, TIMER_DOMAINS, TTL_COLUMN, keyed_columns
from weir.state.backend import frame
from weir.state.keybytes import canonical_key_bytes, decode_key
from weir.state.keyhash import key_hash
from weir.state.snapshot import StateMeta

__all__ = [
    "GroupedEntries", "KeyedRow", "TimerRow", "assemble", "assemble_timers", "by_subtask",
    "columns_of", "encode_all", "keyed_entries", "keyed_rows", "list_inline", "timer_entries",
    "timer_rows", "timer_state",
]

#: key group -> state name -> entries
GroupedEntries = dict[int, dict[str, list[tuple[bytes, bytes]]]]

_DOMAIN_STATES = {domain: name for name, domain in TIMER_DOMAINS.items()}


def columns_of(frame_: Any, required: Sequence[str], optional: Sequence[str], what: str
               ) -> dict[str, list[Any]]:
    """The columns of a pandas DataFrame as Python lists (numpy scalars converted),
    checked against the ``required`` and ``optional`` names."""
    present = [str(c) for c in frame_.columns]
    missing = [c for c in required if c not in present]
    extra = [c for c in present if c not in required and c not in optional]
    if missing or extra:
        raise ConfigurationError(
            f"{what}: the DataFrame has columns {present}, expected {list(required)}"
            + (f" (optionally {list(optional)})" if optional else "")
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {extra}" if extra else ""))
    return {c: frame_[c].tolist() for c in present}


def _prefixed(key: Any, max_parallelism: int) -> tuple[int, bytes]:
    raw = canonical_key_bytes(key)
    group = key_hash(key) % max_parallelism
    return group, group.to_bytes(2, "big") + raw


def _stamp(ttl: bool, stamps: list[Any] | None, i: int, what: str) -> bytes:
    if not ttl:
        return b""
    assert stamps is not None
    stamp = stamps[i]
    if stamp is None or stamp != stamp:  # None or NaN
        raise ConfigurationError(f"{what}: row {i} has no {TTL_COLUMN} (the state has TTL)")
    return int(stamp).to_bytes(8, "big", signed=True)


#: one encoded keyed row: (key group, prefixed key [+ user key], list index or -1, bytes)
KeyedRow = tuple[int, bytes, int, bytes]


def keyed_rows(
    meta: StateMeta, frame_: Any, serializers: Sequence[Serializer[Any]],
    max_parallelism: int, what: str,
) -> list[KeyedRow]:
    """The rows of ``frame_`` (columns as :func:`~weir.processor.decoding.keyed_columns`)
    of keyed state ``meta`` encoded one by one; :func:`assemble` turns a key group's rows
    into entries. ``serializers`` are the state's (map: user key, value)."""
    cols = columns_of(frame_, keyed_columns(meta), [], what)
    keys, values = cols["key"], cols["value"]
    stamps = cols.get(TTL_COLUMN)
    ttl = meta.ttl
    encode = serializers[-1].encode
    out: list[KeyedRow] = []
    try:
        if meta.kind is StateKind.LIST:
            for i, (key, index) in enumerate(zip(keys, cols["index"], strict=True)):
                group, prefixed = _prefixed(key, max_parallelism)
                out.append((group, prefixed, int(index),
                            _stamp(ttl, stamps, i, what) + encode(values[i])))
        else:
            encode_user_key = serializers[0].encode
            map_keys = cols.get("map_key")
            for i, key in enumerate(keys):
                group, prefixed = _prefixed(key, max_parallelism)
                if map_keys is not None:
                    prefixed += encode_user_key(map_keys[i])
                out.append((group, prefixed, -1, _stamp(ttl, stamps, i, what) + encode(values[i])))
    except (ConfigurationError, StateSerializationError):
        raise
    except Exception as exc:  # a serializer's error: name the state
        raise StateSerializationError(
            f"{what}: a row cannot be encoded with {meta.serializers} "
            f"({type(exc).__name__}: {exc})") from exc
    return out


def list_inline(meta: StateMeta, serializers: Sequence[Serializer[Any]]) -> bool:
    """Whether a list state's elements are framed inline (``weir.state.backend.frame``)."""
    return serializers[-1].inline_in_msgpack_array and not meta.ttl


def assemble(meta: StateMeta, rows: Iterable[KeyedRow], inline: bool, into: GroupedEntries,
             what: str) -> None:
    """Add the entries of keyed state ``meta`` made of encoded ``rows`` (all rows of each
    of their keys) to ``into``: a list's elements framed in index order (0..n-1), the
    entries of each key group sorted, two rows for one key refused."""
    out: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
    if meta.kind is StateKind.LIST:
        lists: dict[bytes, list[tuple[int, bytes]]] = defaultdict(list)
        groups: dict[bytes, int] = {}
        for group, prefixed, index, data in rows:
            groups[prefixed] = group
            lists[prefixed].append((index, data))
        for prefixed, elements in lists.items():
            elements.sort(key=lambda e: e[0])
            indexes = [e[0] for e in elements]
            if indexes != list(range(len(indexes))):
                raise ConfigurationError(
                    f"{what}: the list of key {decode_key(prefixed[2:])!r} has "
                    f"indexes {indexes}; each key's list needs indexes 0..n-1")
            out[groups[prefixed]].append((prefixed, frame([e[1] for e in elements], inline)))
    else:
        for group, prefixed, _, data in rows:
            out[group].append((prefixed, data))
    for group, entries in out.items():
        entries.sort()
        for a, b in itertools.pairwise(entries):
            if a[0] == b[0]:
                raise ConfigurationError(
                    f"{what}: two rows for the same "
                    f"{'key and map_key' if meta.kind is StateKind.MAP else 'key'}")
        into.setdefault(group, {})[meta.name] = entries


def keyed_entries(
    meta: StateMeta, frame_: Any, serializers: Sequence[Serializer[Any]],
    max_parallelism: int, into: GroupedEntries, what: str,
) -> int:
    """Add the entries of keyed state ``meta`` from the rows of ``frame_`` to ``into``
    (:func:`keyed_rows`, then :func:`assemble`); the number of rows."""
    rows = keyed_rows(meta, frame_, serializers, max_parallelism, what)
    assemble(meta, rows, list_inline(meta, serializers), into, what)
    return len(rows)


#: one encoded timer: (key group, timer state name, prefixed key + int64_be(timestamp))
TimerRow = tuple[int, str, bytes]


def timer_state(domain: Any, what: str) -> str:
    """The internal timer state of a timer ``domain`` (``event_time``/``processing_time``)."""
    name = _DOMAIN_STATES.get(domain)
    if name is None:
        raise ConfigurationError(
            f"{what}: domain {domain!r} is not one of {sorted(_DOMAIN_STATES)}")
    return name


def timer_rows(frame_: Any, max_parallelism: int, what: str) -> list[TimerRow]:
    """The timers in ``frame_`` (``key, domain, timestamp_ms``) encoded one by one."""
    cols = columns_of(frame_, TIMER_COLUMNS, [], what)
    out: list[TimerRow] = []
    for key, domain, stamp in zip(cols["key"], cols["domain"], cols["timestamp_ms"],
                                  strict=True):
        name = timer_state(domain, what)
        group, prefixed = _prefixed(key, max_parallelism)
        out.append((group, name, prefixed + int(stamp).to_bytes(8, "big", signed=True)))
    return out


def assemble_timers(rows: Iterable[TimerRow], into: GroupedEntries) -> tuple[str, ...]:
    """Add encoded timers to ``into`` (duplicates once, sorted); the timer states."""
    out: dict[str, dict[int, set[bytes]]] = defaultdict(lambda: defaultdict(set))
    for group, name, timer in rows:
        out[name][group].add(timer)
    for name, groups in out.items():
        for group, timers in groups.items():
            into.setdefault(group, {})[name] = [(t, b"") for t in sorted(timers)]
    return tuple(sorted(out))


def timer_entries(frame_: Any, max_parallelism: int, into: GroupedEntries, what: str
                  ) -> tuple[str, ...]:
    """Add the timers in ``frame_`` (``key, domain, timestamp_ms``) to ``into``; the
    timer states written."""
    return assemble_timers(timer_rows(frame_, max_parallelism, what), into)


def encode_all(serializer: Serializer[Any], values: Iterable[Any], what: str) -> list[bytes]:
    """``values`` encoded with ``serializer``; an error names ``what``."""
    try:
        return [serializer.encode(v) for v in values]
    except Exception as exc:
        raise StateSerializationError(
            f"{what}: a value cannot be encoded with {serializer.type_id!r} "
            f"({type(exc).__name__}: {exc})") from exc


def by_subtask(cols: Mapping[str, list[Any]], what: str) -> dict[int, list[Any]]:
    """Operator state rows (``subtask, index, value``) as each subtask's values in
    ``index`` order."""
    rows: dict[int, list[tuple[int, Any]]] = defaultdict(list)
    for subtask, index, value in zip(cols["subtask"], cols["index"], cols["value"],
                                     strict=True):
        rows[int(subtask)].append((int(index), value))
    out: dict[int, list[Any]] = {}
    for subtask, items in rows.items():
        items.sort(key=lambda r: r[0])
        if [i for i, _ in items] != list(range(len(items))):
            raise ConfigurationError(
                f"{what}: subtask {subtask}'s indexes are not 0..n-1")
        out[subtask] = [v for _, v in items]
    return out
