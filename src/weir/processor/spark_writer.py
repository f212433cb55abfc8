"""The keyed state of :func:`~weir.processor.writer.write_savepoint` from Spark
DataFrames, encoded and written on the executors: Flink's bootstrap as a distributed job,
so a savepoint can hold more state than the driver's memory.

Three passes, one Spark job:

1. each keyed table (and the timers) is encoded row by row where it lies
   (``mapInArrow``: :func:`~weir.processor.encoding.keyed_rows`, ``timer_rows``) into
   ``subtask, state, grp, k, idx, v`` rows — the owning subtask, the state, the key
   group, the prefixed key, a list element's index and the encoded bytes;
2. the rows of all tables are unioned and shuffled by subtask, so every row of a key
   meets in one task;
3. each task assembles its subtasks' entries (lists framed, duplicates refused,
   :func:`~weir.processor.encoding.assemble`), adds what the driver built for that
   subtask (pandas tables, a base's kept states, operator and broadcast state), writes
   the subtask's files into the savepoint directory and returns its state handle as a
   part file (``weir.checkpoint.format.encode_part``).

The driver writes the subtasks no row reached and the metadata. The savepoint
directory must be reachable by the executors (a shared filesystem or object store on
a cluster).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from weir.api.serializers import Serializer
from weir.checkpoint.format import SubtaskStateHandle, decode_part, encode_part, uid_dir
from weir.checkpoint.storage import CheckpointStorage
from weir.checkpoint.subtask_files import write_snapshot
from weir.errors import ConfigurationError, StateSerializationError, WeirError
from weir.processor.encoding import (
    GroupedEntries,
    assemble,
    assemble_timers,
    keyed_rows,
    list_inline,
    timer_rows,
    timer_state,
)
from weir.state.keygroups import (
    compute_operator_index_for_key_group,
    key_group_range_for_operator,
)
from weir.state.snapshot import OperatorSubtaskSnapshot, StateMeta

__all__ = ["TIMERS", "is_spark_frame", "timer_states_of", "write_on_executors"]

ROWS = "subtask int, state string, grp int, k binary, idx long, v binary"
TIMERS = "\x00timers"  # the state column of timer rows (no state name starts with NUL)


def is_spark_frame(table: Any) -> bool:
    """Whether ``table`` is a Spark DataFrame (classic or Connect)."""
    return hasattr(table, "mapInArrow") and hasattr(table, "sparkSession")


def _batch(columns: dict[str, list[Any]]) -> Any:
    """A record batch of :data:`ROWS`."""
    import pyarrow as pa

    return pa.RecordBatch.from_pydict(columns, schema=pa.schema([
        ("subtask", pa.int32()), ("state", pa.string()), ("grp", pa.int32()),
        ("k", pa.binary()), ("idx", pa.int64()), ("v", pa.binary())]))


@dataclasses.dataclass(frozen=True)
class _Encode:
    """Pass 1 for one table (pickled to the executors)."""

    meta: StateMeta | None  # None: the timers
    serializers: Sequence[Serializer[Any]]
    max_parallelism: int
    parallelism: int
    what: str

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        m, p = self.max_parallelism, self.parallelism
        for batch in batches:
            frame = batch.to_pandas()
            if self.meta is None:  # a timer: its bytes in k, its timer state's name in v
                timers = timer_rows(frame, m, self.what)
                yield _batch({
                    "subtask": [compute_operator_index_for_key_group(m, p, t[0]) for t in timers],
                    "state": [TIMERS] * len(timers), "grp": [t[0] for t in timers],
                    "k": [t[2] for t in timers], "idx": [-1] * len(timers),
                    "v": [t[1].encode() for t in timers],
                })
                continue
            rows = keyed_rows(self.meta, frame, self.serializers, m, self.what)
            yield _batch({
                "subtask": [compute_operator_index_for_key_group(m, p, r[0]) for r in rows],
                "state": [self.meta.name] * len(rows),
                "grp": [r[0] for r in rows], "k": [r[1] for r in rows],
                "idx": [r[2] for r in rows], "v": [r[3] for r in rows],
            })


@dataclasses.dataclass(frozen=True)
class _Write:
    """Pass 3 (pickled to the executors): the subtasks of one partition."""

    uid: str
    metas: Mapping[str, StateMeta]
    inline: Mapping[str, bool]
    whats: Mapping[str, str]
    snaps: Sequence[OperatorSubtaskSnapshot]  # what the driver built, per subtask
    url: str
    storage_options: Mapping[str, Any] | None

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        rows: dict[int, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
        for batch in batches:
            cols = batch.to_pydict()
            for subtask, state, grp, k, idx, v in zip(
                    cols["subtask"], cols["state"], cols["grp"], cols["k"], cols["idx"],
                    cols["v"], strict=True):
                rows[subtask][state].append((grp, k, idx, v))
        storage = CheckpointStorage(self.url, storage_options=dict(self.storage_options or {}))
        for subtask, per_state in sorted(rows.items()):
            yield pa.RecordBatch.from_pydict(
                {"part": [self._write(subtask, per_state, storage)]})

    def _write(self, subtask: int, per_state: Mapping[str, list[Any]],
               storage: CheckpointStorage) -> bytes:
        snap = self.snaps[subtask]
        assert snap.keyed is not None
        groups: GroupedEntries = {g: {n: list(e) for n, e in per.items()}
                                  for g, per in snap.keyed.groups.items()}
        for state, rows in per_state.items():
            if state == TIMERS:
                assemble_timers(((g, v.decode(), k) for g, k, _, v in rows), groups)
            else:
                assemble(self.metas[state], rows, self.inline[state], groups, self.whats[state])
        keyed = dataclasses.replace(snap.keyed, groups={
            g: {n: tuple(e) for n, e in per.items()} for g, per in groups.items()})
        snap = dataclasses.replace(snap, keyed=keyed)
        kgr = key_group_range_for_operator(snap.max_parallelism, snap.parallelism, subtask)
        handle = write_snapshot(snap, storage, f"{uid_dir(self.uid)}/{subtask}-savepoint", kgr)
        return encode_part(self.uid, snap.parallelism, snap.max_parallelism, handle, {})


def write_on_executors(
    tables: Mapping[str, tuple[StateMeta, Sequence[Serializer[Any]], Any]], timers: Any,
    snaps: Sequence[OperatorSubtaskSnapshot], *, uid: str, storage: CheckpointStorage,
    storage_options: Mapping[str, Any] | None,
) -> dict[int, SubtaskStateHandle]:
    """Write the subtasks that rows of the Spark ``tables`` (state name -> (meta,
    serializers, DataFrame)) and ``timers`` reach, each merged with its snapshot in
    ``snaps`` (the driver's: keyed state of the same names is replaced); their handles.
    The state metas of ``tables`` and the timer states must already be in ``snaps``."""
    first = snaps[0]
    m, p = first.max_parallelism, first.parallelism
    encoded = []
    for name, (meta, sers, frame) in tables.items():
        what = f"keyed state {name!r} of operator {uid!r}"
        encoded.append(frame.mapInArrow(_Encode(meta, sers, m, p, what), ROWS))
    if timers is not None:
        encoded.append(timers.mapInArrow(
            _Encode(None, (), m, p, f"timers of operator {uid!r}"), ROWS))
    union = encoded[0]
    for more in encoded[1:]:
        union = union.unionByName(more)
    write = _Write(uid, {n: t[0] for n, t in tables.items()},
                   {n: list_inline(t[0], t[1]) for n, t in tables.items()},
                   {n: f"keyed state {n!r} of operator {uid!r}" for n in tables},
                   list(snaps), storage.url, storage_options)
    try:
        parts = union.repartition(p, "subtask").mapInArrow(write, "part binary").collect()
    except WeirError:
        raise
    except Exception as exc:  # an executor's error arrives as Spark's
        raise _executor_error(exc, uid) from exc
    out = {}
    for row in parts:
        _, _, _, handle, _ = decode_part(bytes(row["part"]), f"a subtask of {uid!r}")
        out[handle.subtask_index] = handle
    return out


def _executor_error(exc: Exception, uid: str) -> WeirError:
    """The weir error an executor raised (its class and message), or a WeirError naming
    Spark's."""
    text = str(exc)
    for kind in (ConfigurationError, StateSerializationError):
        marker = f"{kind.__name__}: "
        if marker in text:
            line = text[text.rindex(marker) + len(marker):].splitlines()[0]
            return kind(line)
    first = next((ln for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return ConfigurationError(
        f"write_savepoint of operator {uid!r}: the Spark job writing its keyed state failed: "
        f"{first}")


def timer_states_of(timers: Any, what: str) -> tuple[str, ...]:
    """The timer states the Spark DataFrame ``timers`` writes (a distinct of its
    ``domain`` column)."""
    domains = [row[0] for row in timers.select("domain").distinct().collect()]
    return tuple(sorted({timer_state(d, what) for d in domains}))
