"""A task's rows in bounded memory: Arrow batches in memory up to a limit, then in a
local file the worker reads back memory-mapped.

A task must hold its whole partition before it handles a record — Spark's shuffle does
not keep input order, and the task handles rows in (kind, input order) so that a replay
is identical — and it must hold every output until its state is durable (outputs leave
only after the part is published). Both are kept as Arrow, never as Python objects:
:class:`SpillBuffer` keeps record batches in memory until they pass ``limit_bytes``,
then writes them and every later one to an Arrow IPC stream in an anonymous file under
the executor's local directory (``SPARK_LOCAL_DIRS``; unlinked at creation, so a killed
worker leaves nothing behind) and reads them back through ``mmap``: the page cache, not
the worker's heap. :func:`sorted_slices` hands the rows over in order, a slice at a
time, so the Python objects of only one slice exist at once: one ``take`` of the whole
input when it is in memory, one ``take`` per slice from the mapped file otherwise.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["SpillBuffer", "local_base", "merged_slices", "sorted_runs", "sorted_slices"]


def local_base() -> str:
    """The executor's first local directory (``SPARK_LOCAL_DIRS``, Spark's
    ``spark.local.dir``), else the system temporary directory."""
    return os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or tempfile.gettempdir()


class SpillBuffer:
    """Record batches of one schema, in append order; in memory up to ``limit_bytes``
    of Arrow buffers, in an anonymous local file beyond."""

    def __init__(self, limit_bytes: int, directory: str | None = None) -> None:
        self.limit_bytes = limit_bytes
        self.directory = directory
        self.rows = 0
        self.nbytes = 0
        self._held: list[pa.RecordBatch] = []
        self._schema: pa.Schema | None = None
        self._file: IO[bytes] | None = None
        self._writer: Any = None
        self._map: mmap.mmap | None = None
        self._read: list[pa.RecordBatch] | None = None

    @property
    def spilled(self) -> bool:
        """Whether the batches went to the local file."""
        return self._file is not None

    def append(self, batch: pa.RecordBatch) -> None:
        """Add a batch (after the last one)."""
        if self._read is not None:
            raise RuntimeError("SpillBuffer: append after the batches were read")
        if not batch.num_rows:
            return
        if self._schema is None:
            self._schema = batch.schema
        self.rows += batch.num_rows
        self.nbytes += batch.nbytes
        if self._writer is not None:
            self._writer.write_batch(batch)
            return
        self._held.append(batch)
        if self.nbytes > self.limit_bytes:
            self._spill()

    def _spill(self) -> None:
        directory = self.directory or os.path.join(local_base(), "weir-spark")
        os.makedirs(directory, exist_ok=True)
        self._file = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115 (closed in close())
        self._writer = pa.ipc.new_stream(pa.PythonFile(self._file, mode="w"), self._schema)
        for held in self._held:
            self._writer.write_batch(held)
        self._held = []

    def batches(self) -> list[pa.RecordBatch]:
        """Every batch, in append order (mapped from the file if spilled); no append
        after this."""
        if self._read is None:
            if self._writer is None:
                self._read = self._held
            else:
                assert self._file is not None
                self._writer.close()
                self._file.flush()
                self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
                self._read = list(pa.ipc.open_stream(pa.py_buffer(self._map)))
        return self._read

    def table(self) -> pa.Table | None:
        """Every row as one table (chunked as appended); None if there is none."""
        batches = self.batches()
        return pa.Table.from_batches(batches) if batches else None

    def close(self) -> None:
        """Drop the batches and the file."""
        self._held, self._read = [], []
        if self._map is not None:
            # a batch still referencing the mapping: the garbage collector unmaps it
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
        if self._file is not None:
            self._file.close()
            self._file = None


def sorted_slices(
    table: pa.Table,
    sort_keys: Sequence[tuple[str, str]],
    group_column: str,
    groups: Sequence[int],
    slice_rows: int,
    in_memory: bool,
) -> Iterator[tuple[int, pa.Table]]:
    """``(group, rows)`` of ``table`` sorted by ``sort_keys`` (whose first key is
    ``group_column``), for each value of ``groups`` in turn, at most ``slice_rows``
    rows at a time; rows of other groups are skipped. When each group's rows lie in a
    few runs already in order (``sorted_runs``: a shuffle's blocks, each in its map
    task's order), zero-copy slices of the runs; else ``in_memory``: one take of the
    whole table, then zero-copy slices; else one take per slice (from a mapped file,
    without materializing the whole input)."""
    runs = sorted_runs(table, sort_keys, group_column, groups)
    if runs is not None:
        for group, start, length in runs:
            for at in range(start, start + length, slice_rows):
                yield group, table.slice(at, min(slice_rows, start + length - at))
        return
    order = pc.sort_indices(table.select([k for k, _ in sort_keys]), sort_keys=sort_keys)
    whole = table.take(order) if in_memory else None
    values = (whole[group_column] if whole is not None
              else pc.take(table[group_column], order)).to_numpy()
    for group in groups:
        lo = int(values.searchsorted(group, "left"))
        hi = int(values.searchsorted(group, "right"))
        for start in range(lo, hi, slice_rows):
            end = min(hi, start + slice_rows)
            if whole is not None:
                yield group, whole.slice(start, end - start)
            else:
                yield group, table.take(order[start:end])


def merged_slices(slices: Iterator[tuple[int, pa.Table]], kind: int, limit: int
            ) -> Iterator[tuple[int, pa.Table]]:
    """``slices`` with consecutive ones of ``kind`` concatenated up to ``limit`` rows
    (a shuffle's runs of records: one per map output block)."""
    pending: list[pa.Table] = []
    rows = 0
    for group, part in slices:
        if group == kind and rows + part.num_rows <= limit:
            pending.append(part)
            rows += part.num_rows
            continue
        if pending:
            yield kind, pa.concat_tables(pending)
            pending, rows = [], 0
        if group == kind:
            pending, rows = [part], part.num_rows
        else:
            yield group, part
    if pending:
        yield kind, pa.concat_tables(pending)


#: runs at most per group for :func:`sorted_runs` (beyond: a take is as cheap)
MAX_RUNS = 256


def sorted_runs(
    table: pa.Table, sort_keys: Sequence[tuple[str, str]], group_column: str,
    groups: Sequence[int],
) -> list[tuple[int, int, int]] | None:
    """``(group, first row, rows)`` of ranges of ``table`` that, in this order, are the
    rows of ``groups`` stably sorted by ``sort_keys`` (``group_column``, then one
    integer column, both ascending), when each group's sorted rows are at most
    ``MAX_RUNS`` ranges of consecutive rows (a shuffle's blocks, each in its map
    task's order: a sort of a few runs, no take). None otherwise (more runs, nulls,
    other sort keys: take the rows in order)."""
    if (len(sort_keys) != 2 or sort_keys[0] != (group_column, "ascending")
            or sort_keys[1][1] != "ascending"):
        return None
    kind_column, order_column = table[group_column], table[sort_keys[1][0]]
    if (kind_column.null_count or order_column.null_count
            or not pa.types.is_integer(order_column.type)):
        return None
    kinds = kind_column.to_numpy()
    order = order_column.to_numpy()
    out: list[tuple[int, int, int]] = []
    for group in groups:
        rows = np.flatnonzero(kinds == group)
        if not len(rows):
            continue
        # stable, as sort_indices: a merge of the runs already in order (timsort)
        positions = rows[np.argsort(order[rows], kind="stable")]
        cut = np.flatnonzero(np.diff(positions) != 1) + 1
        if len(cut) >= MAX_RUNS:
            return None
        starts = np.concatenate(([0], cut))
        ends = np.concatenate((cut, [len(positions)]))
        out += [(group, int(positions[a]), int(b - a)) for a, b in zip(starts, ends,
                                                                       strict=True)]
    return out
