"""Key columns: which Spark types can be keys, and how Arrow key columns become keys.

**Types** (:func:`check_key_types`, called by ``weir.spark.process`` before the query
starts). A key column may be a string (also char/varchar), an integral, float,
double, boolean, binary, date, timestamp, timestamp_ntz or decimal column, or an
array or struct of those (nested at any depth; struct field names unique). Anything
else — map, interval, variant, time, void, user-defined and spatial types — is
refused with a :class:`~weir.errors.ConfigurationError` that names the operator, the
column, its type and the cast to use: such a column would otherwise make every record
a dead letter while the query runs on.

**Values** (:func:`keys_of`, the one function the route pass and the process pass use).
Each key column becomes the Python values of ``weir.state.keygroups``'s canonical
encoding:

==================  ================================================================
Spark type          key
==================  ================================================================
string, binary,     ``str``, ``bytes``, ``int``, ``float``, ``bool``
numbers, boolean
date                ``datetime.date``
timestamp           ``datetime.datetime`` in UTC (``tzinfo=datetime.timezone.utc``):
                    Spark sends the column in the session time zone; the key is the
                    instant, the same whatever the session time zone
timestamp_ntz       naive ``datetime.datetime`` (the wall-clock reading)
decimal(p, s)       ``decimal.Decimal`` with scale ``s``, as Spark gives it
array               ``tuple`` of its elements (hashable; the key of a list is the key
                    of the tuple of its items)
struct              ``dict`` of its fields in field order (keyed by name)
==================  ================================================================

With several key columns the key is the tuple of their values. Nested values follow
the same rules. A value that Python cannot hold (a timestamp beyond year 9999) becomes
the unencodable :data:`UNCONVERTIBLE`, so only its own record is routed as a bad key;
a null key is a bad key too (the route pass checks).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    CharType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    MapType,
    NullType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
)

from weir.errors import ConfigurationError

__all__ = ["UNCONVERTIBLE", "check_key_types", "keys_of"]

KEY_COLUMN = "_weir_key"  # the column of a key_by Column expression (routing.KEY)


class _Unconvertible:
    """The key of a row whose key column value Python cannot hold. Not a key type, so
    ``canonical_key_bytes`` refuses it and the route pass dead-letters the row."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<key value Python cannot hold>"


UNCONVERTIBLE: Any = _Unconvertible()


# ------------------------------------------------------------------------- values


def keys_of(
    table: pa.Table | pa.RecordBatch, key_columns: Sequence[str],
    converted: Mapping[str, list[Any]] | None = None,
) -> list[Any]:
    """The key of every row of ``table``: the value of its one key column, or the
    tuple of the values of several (see the module docstring for the Python types).
    ``converted``: columns' ``to_pylist()`` already made (the process pass's records),
    used as the keys of a column whose values are its keys as they are."""
    given = converted or {}
    if len(key_columns) == 1:
        return _column_keys(table.column(key_columns[0]), given.get(key_columns[0]))
    return list(zip(*(_column_keys(table.column(c), given.get(c)) for c in key_columns),
                    strict=True))


def _column_keys(column: pa.Array | pa.ChunkedArray, values: list[Any] | None = None
                 ) -> list[Any]:
    target, freeze = _plan(column.type)
    if values is not None and target is None and not freeze:
        return values  # the column's to_pylist(), made for the records
    if target is not None:
        column = column.cast(target)
    try:
        values = column.to_pylist()
    except (ValueError, OverflowError, TypeError, pa.ArrowException):
        values = [_one_value(column[i]) for i in range(len(column))]
    return [_freeze(v) for v in values] if freeze else values


def _one_value(scalar: pa.Scalar) -> Any:
    try:
        return scalar.as_py()
    except (ValueError, OverflowError, TypeError, pa.ArrowException):
        return UNCONVERTIBLE


_UTC = "+00:00"


@functools.lru_cache(maxsize=256)
def _plan(kind: pa.DataType) -> tuple[pa.DataType | None, bool]:
    """``(type to cast to first or None, whether lists must become tuples)``."""
    target = _utc(kind)
    return (target if target != kind else None), _has_list(kind)


def _utc(kind: pa.DataType) -> pa.DataType:
    """``kind`` with every zoned timestamp in UTC (the same instants: a metadata-only
    cast, which needs no time-zone database and gives ``datetime.timezone.utc``)."""
    if pa.types.is_timestamp(kind):
        return pa.timestamp(kind.unit, _UTC) if kind.tz is not None else kind
    if pa.types.is_struct(kind):
        return pa.struct([kind.field(i).with_type(_utc(kind.field(i).type))
                          for i in range(kind.num_fields)])
    if pa.types.is_large_list(kind):
        return pa.large_list(kind.value_field.with_type(_utc(kind.value_type)))
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(kind.value_field.with_type(_utc(kind.value_type)), kind.list_size)
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_utc(kind.value_type)))
    return kind


def _has_list(kind: pa.DataType) -> bool:
    if pa.types.is_struct(kind):
        return any(_has_list(kind.field(i).type) for i in range(kind.num_fields))
    return bool(pa.types.is_list(kind) or pa.types.is_large_list(kind)
                or pa.types.is_fixed_size_list(kind) or pa.types.is_map(kind))


def _freeze(value: Any) -> Any:
    """Lists (at any depth) as tuples, so array keys are hashable."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    return value


# -------------------------------------------------------------------------- types

_SCALAR_TYPES = (StringType, CharType, VarcharType, IntegralType, FloatType, DoubleType,
                 BooleanType, BinaryType, DateType, TimestampType, TimestampNTZType,
                 DecimalType)
_SUPPORTED = ("string, integral, float, double, boolean, binary, date, timestamp, "
              "timestamp_ntz, decimal, and arrays and structs of those")


def check_key_types(schema: StructType, key_columns: Sequence[str], uid: str) -> None:
    """Raise :class:`ConfigurationError` unless every key column of ``schema`` has a
    type that can be a key (see the module docstring). ``key_columns`` are column
    names; ``_weir_key`` is the column of a ``key_by`` Column expression."""
    fields: dict[str, StructField] = {}
    for each in schema.fields:
        fields.setdefault(each.name, each)
    for name in key_columns:
        what = "the key_by expression" if name == KEY_COLUMN else f"key column {name!r}"
        field = fields.get(name)
        if field is None:
            raise ConfigurationError(
                f"operator {uid!r}: {what} is not in the input's columns "
                f"{[f.name for f in schema.fields]}"
            )
        if isinstance(field.dataType, NullType):
            raise ConfigurationError(
                f"operator {uid!r}: {what} has type void (null in every row), so every "
                f"record would be dead-lettered for its null key; key by a typed column "
                f"(cast it: F.col(...).cast('string'))"
            )
        problem = _problem(field.dataType, "")
        if problem is not None:
            path, kind, fix = problem
            base = "key_by" if name == KEY_COLUMN else name
            where = f"{what} (type {field.dataType.simpleString()}) at {base}{path}" \
                if path else what
            raise ConfigurationError(
                f"operator {uid!r}: {where} has type {kind.simpleString()}, which cannot "
                f"be a key; {fix}. Key types weir supports: {_SUPPORTED}"
            )


def _problem(kind: DataType, path: str) -> tuple[str, DataType, str] | None:
    """``(path, type, what to do)`` of the first part of ``kind`` that cannot be a key."""
    if isinstance(kind, _SCALAR_TYPES) or (isinstance(kind, NullType) and path):
        return None
    if isinstance(kind, ArrayType):
        return _problem(kind.elementType, f"{path}[]")
    if isinstance(kind, StructType):
        names = [f.name for f in kind.fields]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            return (path, kind, f"its struct has duplicate field names {twice}: rename them "
                                f"(F.struct(F.col(...).alias(...), ...))")
        for field in kind.fields:
            found = _problem(field.dataType, f"{path}.{field.name}")
            if found is not None:
                return found
        return None
    if isinstance(kind, MapType):
        return (path, kind, "a map has no canonical entry order (Spark cannot group by maps "
                            "either): key by F.array_sort(F.map_entries(col)) or by the "
                            "entries you need")
    name = type(kind).__name__
    if "Interval" in name:
        fix = "cast it to a number or a string (e.g. F.col(...).cast('string'))"
    elif name == "VariantType":
        fix = "key by a typed value (F.to_json(col), or variant_get(col, path, type))"
    elif name == "TimeType":
        fix = "cast it to a string or key by a number (e.g. seconds since midnight)"
    else:
        fix = "cast it to one of the supported types (e.g. F.col(...).cast('string'))"
    return path, kind, fix
