"""How records cross between Arrow batches and user functions.

**In:** a record reaches the function as a ``dict`` of its columns (``record_format=
"dict"``, the default) or a ``tuple`` in column order (``"tuple"``), built from
whole Arrow columns at once (``to_pylist``) — no per-row Spark ``Row`` objects.
Values are plain Python: ``str``, ``int``, ``float``, ``bool``, ``bytes``,
``datetime`` (timestamps, UTC), ``Decimal``, lists and dicts for nested types.

**Out:** a function emits tuples (in ``output_schema`` order) or dicts (by field
name); :func:`to_record_batch` builds the Arrow batch and raises
:class:`~weir.errors.OutputSchemaError` naming the operator, the field and the value
when an output does not fit.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Row

from weir.errors import ConfigurationError, OutputSchemaError
from weir.state._hashcore import tuple_columns

__all__ = ["column_lists", "columns_to_records", "conform_batch", "event_times_ms", "json_safe",
           "to_record_batch"]


def columns_to_records(
    table: pa.Table | pa.RecordBatch, names: Sequence[str], record_format: str,
    columns: Sequence[list[Any]] | None = None,
) -> list[Any]:
    """The rows of ``names`` in ``table`` as dicts or tuples; ``columns``: the
    columns' Python values if already converted (``column_lists``)."""
    if columns is None:
        columns = column_lists(table, names)
    if record_format == "tuple":
        if not columns:
            return [() for _ in range(table.num_rows)]
        return list(zip(*columns, strict=True))
    if record_format == "dict":
        return _dict_builder(tuple(names))(*columns) if columns else [
            {} for _ in range(table.num_rows)]
    raise ConfigurationError(f"record_format must be 'dict' or 'tuple', got {record_format!r}")


def column_lists(table: pa.Table | pa.RecordBatch, names: Sequence[str]) -> list[list[Any]]:
    """The Python values of each column of ``names`` in ``table``."""
    return [table.column(n).to_pylist() for n in names]


@functools.lru_cache(maxsize=256)
def _dict_builder(names: tuple[str, ...]) -> Callable[..., list[dict[str, Any]]]:
    """``f(*columns) -> [ {name: value, ...} per row ]`` compiled for these names: a
    dict display per row is several times faster than ``dict(zip(names, row))``."""
    args = ", ".join(f"c{i}" for i in range(len(names)))
    values = ", ".join(f"v{i}" for i in range(len(names)))
    items = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
    source = (f"def build({args}):\n"
              f"    return [{{{items}}} for ({values},) in zip({args}, strict=True)]\n")
    namespace: dict[str, Any] = {}
    exec(compile(source, "<weir records>", "exec"), namespace)  # names are repr()-quoted
    return namespace["build"]  # type: ignore[no-any-return]


def event_times_ms(column: pa.ChunkedArray | pa.Array) -> list[int | None]:
    """Event times in epoch milliseconds from a timestamp, date or integer column
    (integers are taken as epoch milliseconds)."""
    kind = column.type
    if pa.types.is_timestamp(kind):
        column = pc.cast(column, pa.timestamp("ms", tz=kind.tz)).cast(pa.int64())
    elif pa.types.is_date(kind):
        column = pc.multiply(pc.cast(pc.cast(column, pa.date32()), pa.int64()), 86_400_000)
    elif not pa.types.is_integer(kind):
        raise ConfigurationError(
            f"event_time column must be a timestamp, date or integer (epoch ms), got {kind}"
        )
    return column.to_pylist()  # type: ignore[no-any-return]


def to_record_batch(rows: Sequence[Any], schema: pa.Schema, uid: str) -> pa.RecordBatch:
    """Arrow batch of ``rows`` (tuples or dicts) in ``schema``."""
    names = schema.names
    width = len(names)
    # the fast path: tuples of the schema's width, transposed in C (one pass, no type
    # scan), then each column converted by Arrow
    columns = tuple_columns(rows if type(rows) is list else list(rows), width)
    if columns is None:
        columns = _columns_of_mixed(rows, schema, uid)
    arrays = []
    for field, values in zip(schema, columns, strict=True):
        try:
            arrays.append(pa.array(values, type=field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            bad = _first_bad(values, field.type)
            raise OutputSchemaError(
                f"operator {uid!r}: output field {field.name!r} is {field.type} but the "
                f"function emitted {bad!r} ({type(bad).__name__}) for it"
            ) from None
        _check_not_null(field, arrays[-1], uid)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def conform_batch(out: Any, schema: pa.Schema, uid: str) -> list[pa.RecordBatch]:
    """A batch function's output (a ``RecordBatch`` or ``Table``) as batches of
    ``schema``: its fields by name, cast to their types (safely: a value that does not
    fit fails); :class:`~weir.errors.OutputSchemaError` names what does not fit."""
    if not isinstance(out, pa.RecordBatch | pa.Table):
        raise OutputSchemaError(
            f"operator {uid!r}: process_batch returned {type(out).__name__}; it returns a "
            f"pyarrow RecordBatch or Table in output_schema {_ddl(schema)}, several, or None"
        )
    missing = [n for n in schema.names if n not in out.schema.names]
    if missing:
        raise OutputSchemaError(
            f"operator {uid!r}: process_batch returned columns {out.schema.names}; "
            f"output_schema {_ddl(schema)} also needs {missing}"
        )
    columns = []
    for field in schema:
        column = out.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise OutputSchemaError(
                    f"operator {uid!r}: output field {field.name!r} is {field.type} but "
                    f"process_batch returned {column.type} ({exc})"
                ) from None
        _check_not_null(field, column, uid)
        columns.append(column)
    if isinstance(out, pa.RecordBatch):
        return [pa.RecordBatch.from_arrays(columns, schema=schema)] if out.num_rows else []
    table = pa.Table.from_arrays(columns, schema=schema)
    return [b for b in table.to_batches() if b.num_rows]


def _check_not_null(field: pa.Field, array: pa.Array, uid: str) -> None:
    if not field.nullable and array.null_count:
        raise OutputSchemaError(
            f"operator {uid!r}: output field {field.name!r} is NOT NULL but the function "
            f"emitted None for it"
        )


def _columns_of_mixed(rows: Sequence[Any], schema: pa.Schema, uid: str) -> list[list[Any]]:
    names = schema.names
    width = len(names)
    columns: list[list[Any]] = [[] for _ in range(width)]
    for row in rows:
        if isinstance(row, dict):
            if len(row) != width or any(n not in row for n in names):
                missing = [n for n in names if n not in row]
                extra = [k for k in row if k not in names]
                raise OutputSchemaError(
                    f"operator {uid!r} emitted {row!r}, which does not match output_schema "
                    f"{_ddl(schema)}: missing fields {missing}, unknown fields {extra}"
                )
            for j, name in enumerate(names):
                columns[j].append(row[name])
        elif isinstance(row, tuple | list):
            if len(row) != width:
                raise OutputSchemaError(
                    f"operator {uid!r} emitted {len(row)} values {row!r}; output_schema "
                    f"{_ddl(schema)} has {width} fields"
                )
            for j in range(width):
                columns[j].append(row[j])
        else:
            raise OutputSchemaError(
                f"operator {uid!r} emitted {row!r} ({type(row).__name__}); emit tuples or "
                f"dicts matching output_schema {_ddl(schema)}"
            )
    return columns


def _first_bad(values: Iterable[Any], kind: pa.DataType) -> Any:
    for value in values:
        try:
            pa.array([value], type=kind)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            return value
    return None  # pragma: no cover - only called when some value failed


def _ddl(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{f.name} {f.type}" for f in schema) + ")"


def json_safe(value: Any) -> Any:
    """``value`` (a record field or a PySpark row) as plain JSON types: datetimes in
    ISO 8601, decimals as strings, bytes in base64, non-string dict keys as JSON."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Row):
        return {k: json_safe(v) for k, v in value.asDict(recursive=True).items()}
    if isinstance(value, dict):
        return {_json_key(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v) for v in value]
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


def _json_key(key: Any) -> str:
    safe = json_safe(key)
    return safe if isinstance(safe, str) else json.dumps(safe, sort_keys=True)


def dumps_line(doc: Any) -> bytes:
    """One JSON line."""
    return (json.dumps(json_safe(doc), sort_keys=True) + "\n").encode()
