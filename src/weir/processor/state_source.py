"""State as a Spark DataFrame: the ``weir-state`` Python data source (Spark's own
``statestore`` source, for weir's checkpoints), read in parallel, one Spark partition
per stored subtask (each a contiguous key-group range), so a table larger than the
driver's memory reads as any other DataFrame::

    weir.spark.register_state_source(spark)
    df = (spark.read.format("weir-state").option("uid", "count").option("state", "count")
          .load("/chk/fraud"))

Options: ``uid`` (needed when the location holds several operators), ``state`` (the
state's name), ``scope`` (``keyed`` — the default —, ``timers``, ``operator`` or
``broadcast``), ``checkpointId`` and ``query`` (as :func:`weir.read_state`), and
``serializers``: comma-separated ``module:Class`` names of serializers of your own.

The driver resolves the path once, to one checkpoint (a running query's later
batches do not mix in), and infers the schema: the table's columns
(``weir.processor.decoding``) with types from the state's first rows — ``bigint``,
``double``, ``string``, ``binary``, ``boolean``; values of any other type (lists,
maps, tuples, mixed types) become JSON strings. A schema given with ``.schema(...)``
is used instead.
"""

from __future__ import annotations

import importlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from weir.api.serializers import Serializer
from weir.errors import ConfigurationError
from weir.processor.reader import TIMERS, StateReader, StateScope, read_state

__all__ = ["StateDataSource"]

_SAMPLE = 200
_FIXED: dict[str, DataType] = {
    "index": IntegerType(), "subtask": IntegerType(), "timestamp_ms": LongType(),
    "ttl_timestamp_ms": LongType(), "domain": StringType(),
}


@dataclass(frozen=True)
class _Table:
    """What one read of the source means, resolved on the driver."""

    url: str
    uid: str
    scope: str
    name: str
    subtasks: tuple[int, ...]
    serializers: str


@dataclass(frozen=True)
class SubtaskPartition(InputPartition):
    """One stored subtask's part of the table."""

    subtask: int


def _serializers(names: str) -> list[Serializer[Any]]:
    """Instances of the ``module:Class`` serializers named in ``names``."""
    out: list[Serializer[Any]] = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        module, _, attr = name.partition(":")
        try:
            out.append(getattr(importlib.import_module(module), attr)())
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"weir-state option serializers: cannot create {name!r} ({exc}); give "
                f"'module:Class' of a Serializer whose class takes no arguments") from exc
    return out


def _reader(table: _Table) -> StateReader:
    return read_state(table.url, uid=table.uid, serializers=_serializers(table.serializers))


def _spark_type(values: list[Any]) -> DataType:
    """The Spark type of a column whose first values are ``values``."""
    kinds = {type(v) for v in values if v is not None}
    if kinds == {bool}:
        return BooleanType()
    if kinds and kinds <= {int}:
        return LongType()
    if kinds and kinds <= {int, float}:
        return DoubleType()
    if kinds == {bytes}:
        return BinaryType()
    return StringType()


def _converter(data_type: DataType) -> Any:
    """How a decoded value becomes a value of ``data_type``."""
    if isinstance(data_type, StringType):
        return lambda v: v if v is None or isinstance(v, str) else json.dumps(
            v, default=repr, sort_keys=True)
    if isinstance(data_type, DoubleType):
        return lambda v: None if v is None else float(v)
    return lambda v: v


class StateDataSource(DataSource):
    """``spark.read.format("weir-state")``: see the module doc."""

    @classmethod
    def name(cls) -> str:
        return "weir-state"

    def _table(self) -> _Table:
        cached: _Table | None = self.__dict__.get("_resolved")
        if cached is not None:
            return cached
        options = self.options
        path = options.get("path")
        if not path:
            raise ConfigurationError(
                "weir-state needs a path: spark.read.format('weir-state').option('uid', U)"
                ".option('state', S).load(LOCATION)")
        scope = str(options.get("scope", "keyed")).lower()
        name = str(options.get("state", ""))
        if scope != TIMERS and not name:
            raise ConfigurationError(
                f"weir-state of {path}: option 'state' names the {scope} state to read")
        checkpoint_id = options.get("checkpointid")
        names = str(options.get("serializers", ""))
        reader = read_state(path, uid=options.get("uid"),
                            checkpoint_id=None if checkpoint_id is None else int(checkpoint_id),
                            query=options.get("query"), serializers=_serializers(names))
        if len(reader.uids) != 1:
            raise ConfigurationError(
                f"weir-state of {path}: it holds operators {reader.uids}; choose one with "
                f".option('uid', ...)")
        (uid,) = reader.uids
        completed = reader.checkpoint(uid)
        handles = completed.metadata.operators[uid].subtasks
        subtasks = tuple(sorted(h.subtask_index for h in handles))
        if scope == StateScope.BROADCAST.value:
            subtasks = subtasks[:1]
        table = _Table(completed.url, uid, scope, name, subtasks, names)
        reader.rows(uid, scope, name)  # an unknown state or scope fails here, on the driver
        self.__dict__["_resolved"] = table
        return table

    def schema(self) -> StructType:
        table = self._table()
        reader = _reader(table)
        columns, _ = reader.rows(table.uid, table.scope, table.name)
        sample: list[tuple[Any, ...]] = []
        for subtask in table.subtasks:  # the first subtask that has rows
            _, rows = reader.rows(table.uid, table.scope, table.name, [subtask])
            sample = list(itertools.islice(rows, _SAMPLE))
            if sample:
                break
        return StructType([
            StructField(c, _FIXED.get(c) or _spark_type([r[i] for r in sample]), True)
            for i, c in enumerate(columns)])

    def reader(self, schema: StructType) -> DataSourceReader:
        return _StateReader(self._table(), schema)


class _StateReader(DataSourceReader):
    def __init__(self, table: _Table, schema: StructType) -> None:
        self.table = table
        self.converters = [_converter(f.dataType) for f in schema.fields]

    def partitions(self) -> list[InputPartition]:
        return [SubtaskPartition(i) for i in self.table.subtasks]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, SubtaskPartition)
        table = self.table
        columns, rows = _reader(table).rows(table.uid, table.scope, table.name,
                                            [partition.subtask])
        if len(columns) != len(self.converters):
            raise ConfigurationError(
                f"weir-state: the schema has {len(self.converters)} columns, the "
                f"{table.scope} state {table.name!r} of {table.uid!r} has {columns}")
        convert = self.converters
        for row in rows:
            yield tuple(c(v) for c, v in zip(convert, row, strict=True))
