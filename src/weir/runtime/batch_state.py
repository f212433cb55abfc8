"""The value state of a :class:`~weir.KeyedBatchFunction`, read and written for many
keys per call (:class:`BatchStateView`, the :class:`~weir.BatchValueState` a batch
context gives).

It reads and writes the state's own table under the same descriptor, so the entries,
checks and checkpoints are a per-record function's:

* the hash map's plain value state: one dict operation over the keys' prefixed bytes
  (the same write check and change tracking as ``ValueState.update``); int64 and
  float64 values read into, and ints and floats written from, one native buffer in C
  (``_batchvalues.c``: no Python list of the values);
* RocksDB's plain value state: the table's entry cache, many keys per call
  (``get_stored`` / ``store_many``: a read misses into RocksDB only where the cache
  does not hold the key, a write is two dict updates where the cache takes every key);
  the fixed-width serializers' (``IntSerializer``, ``FloatSerializer``) values moved
  between the cache and one native buffer in C where the cache holds every key
  (``cache_get_fixed``, ``cache_put_fixed``), else packed and unpacked as one array;
* the hash map's plain list state (:class:`BatchListView`): reads of each key's
  stored list, appends in C (``dict_append_many``) after the same write check;
* every other table (TTL states among them), and list, map, reducing and aggregating
  states (:class:`BatchListView`, :class:`BatchMapView`, :class:`BatchAppendingView`):
  key by key through the state's own API.

Keys given as an Arrow array (immutable) are encoded once: a ``get`` and then a ``put``
of the same array reuse them.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence, Sized
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from weir.api.batch import BatchAppendingState, BatchListState, BatchMapState, BatchValueState
from weir.api.descriptors import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from weir.api.serializers import BytesSerializer, FloatSerializer, IntSerializer, StrSerializer
from weir.errors import StateError
from weir.state._hashcore import dict_append_many, dict_get_numbers, dict_put_numbers
from weir.state.hashmap_tables import HashMapListTable, HashMapValueTable
from weir.state.rocksdb_tables import RocksValueTable

if TYPE_CHECKING:
    from weir.api.batch import Keys

__all__ = ["BatchAppendingView", "BatchListView", "BatchMapView", "BatchStateView", "pylist"]

_ARROW_TYPES: dict[type, pa.DataType] = {
    IntSerializer: pa.int64(), FloatSerializer: pa.float64(), StrSerializer: pa.string(),
    BytesSerializer: pa.binary(),
}
#: fixed-width serializers: (NumPy type of their bytes, Arrow type, Python types taken)
_FIXED: dict[type, tuple[str, pa.DataType, set[type]]] = {
    IntSerializer: (">i8", pa.int64(), {int}),
    FloatSerializer: (">f8", pa.float64(), {float}),
}


def pylist(values: Any) -> list[Any]:
    """Python values of an Arrow array, a NumPy array (``tolist``: Python ints, not
    NumPy scalars, reach the state) or any sequence."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.to_pylist()  # type: ignore[no-any-return]
    if isinstance(values, list):
        return values
    tolist = getattr(values, "tolist", None)
    return tolist() if callable(tolist) else list(values)


def _array(values: list[Any], kind: pa.DataType | None, name: str) -> pa.Array:
    """``values`` as one Arrow array of ``kind`` (None: inferred), or a StateError."""
    try:
        return pa.array(values, type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as exc:
        raise StateError(
            f"state {name!r}: its values do not make one Arrow array ({exc}); "
            f"pass get(keys, type=...)"
        ) from None


def _numeric_kind(values: Any) -> str | None:
    """NumPy's kind of an Arrow or NumPy 1-d array of numbers without nulls (``"i"``
    signed ints, ``"u"`` unsigned, ``"f"`` floats), else None (a masked array too: its
    masked values are nulls)."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        kind = values.type
        if values.null_count:
            return None
        if pa.types.is_signed_integer(kind):
            return "i"
        if pa.types.is_unsigned_integer(kind):
            return "u"
        return "f" if pa.types.is_floating(kind) else None
    if type(values) is np.ndarray and values.ndim == 1 and values.dtype.kind in "iuf":
        return str(values.dtype.kind)
    return None


#: numbers moved in C (``dict_get_numbers``, ``dict_put_numbers``): the kind of each
#: Arrow type read, the native NumPy type of each kind written and the Python type the
#: state holds of it (unsigned ints take the checked path: beyond int64 they are ints
#: some serializers refuse)
_NUMBER_KIND: dict[pa.DataType, str] = {pa.int64(): "i", pa.float64(): "f"}
_NUMBER_DTYPE: dict[str | None, str] = {"i": "=i8", "f": "=f8"}
_PYTHON_TYPE: dict[str, type] = {"i": int, "f": float}


def _as_numpy(values: Any, dtype: str) -> np.ndarray:
    """An Arrow or NumPy array of numbers without nulls as a contiguous NumPy array of
    ``dtype`` (a cast where the width or byte order differs)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        values = values.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(values, dtype=dtype)


def _has_none(values: list[Any]) -> bool:
    """Whether ``values`` holds None (by identity: ``None in values`` compares each
    value with ``==``, which a NumPy array answers element-wise)."""
    return any(map(operator.is_, values, itertools.repeat(None)))


def _check_types(table: Any, values: list[Any]) -> None:
    """A hash-map table's write check of ``values``: one value of each type it has
    not accepted yet (as its per-record writes check them)."""
    for kind in set(map(type, values)) - table._ok:
        table._check(next(v for v in values if type(v) is kind))


def _from_buffers(kind: pa.DataType, n: int, got: tuple[bytearray, bytearray | None, int]
                  ) -> pa.Array:
    """An int64 or float64 Arrow array of ``n`` values from ``(native values, validity
    bitmap or None, null count)``, as the C readers give them."""
    data, validity, nulls = got
    return pa.Array.from_buffers(kind, n, [
        None if validity is None else pa.py_buffer(validity), pa.py_buffer(data)],
        null_count=nulls)


def _decode_fixed(stored: list[bytes | None], fixed: tuple[str, pa.DataType, set[type]]
                  ) -> pa.Array:
    """Fixed-width stored values as one Arrow array, null where absent."""
    if None not in stored:
        values = np.frombuffer(b"".join(stored), dtype=fixed[0])  # type: ignore[arg-type]
        return pa.array(values.astype(values.dtype.newbyteorder("=")), type=fixed[1])
    absent = np.fromiter((d is None for d in stored), dtype=bool, count=len(stored))
    present = np.frombuffer(b"".join(d for d in stored if d is not None), dtype=fixed[0])
    values = np.zeros(len(stored), dtype=present.dtype.newbyteorder("="))
    values[~absent] = present
    return pa.array(values, type=fixed[1], mask=absent if absent.any() else None)


#: the items of a list state's absent key (read only: Arrow copies it)
_NO_ITEMS: list[Any] = []


def _prefixed_keys(op: Any, keys: list[Any]) -> list[bytes]:
    """Each key's prefixed bytes (checked: a key of the subtask's key groups, as
    ``set_current_key`` checks it)."""
    ctx = op.key_context
    try:
        return ctx.prefixed_keys(keys)  # type: ignore[no-any-return]
    finally:
        ctx.clear()


class BatchStateView(BatchValueState[Any]):
    """A value state read and written for many keys at once (see the module doc)."""

    def __init__(self, op: Any, state: Any, descriptor: ValueStateDescriptor[Any]) -> None:
        self._op = op
        self._state = state
        self._name = descriptor.name
        self._type = _ARROW_TYPES.get(type(descriptor.serializer))
        # the hash map's plain value state: one dict operation over the keys
        self._table = state if type(state) is HashMapValueTable else None
        # RocksDB's plain value state: its entry cache, many keys per call
        self._rocks = state if type(state) is RocksValueTable else None
        self._fixed = _FIXED.get(type(descriptor.serializer))
        #: the Arrow keys of the last call, their Python values and prefixed bytes
        self._last: tuple[Any, list[Any], list[bytes]] | None = None

    def _keys(self, keys: Any) -> tuple[list[Any], list[bytes] | None]:
        """``keys`` as Python values, and their prefixed bytes when the hash map's path
        needs them: an Arrow array (immutable) given again, as a ``get`` and then a
        ``put`` of the same keys do, reuses the last call's."""
        if self._table is None and self._rocks is None:
            return pylist(keys), None
        last = self._last
        if last is not None and last[0] is keys:
            return last[1], last[2]
        values = pylist(keys)
        prefixed = _prefixed_keys(self._op, values)
        self._last = ((keys, values, prefixed) if isinstance(keys, pa.Array | pa.ChunkedArray)
                      else None)
        return values, prefixed

    def get(self, keys: Keys, type: pa.DataType | None = None) -> pa.Array:
        keys, prefixed = self._keys(keys)
        kind = type or self._type
        if self._rocks is not None and prefixed is not None:
            fixed = self._fixed
            if fixed is not None and (kind is None or kind == fixed[1]):
                got = self._rocks.get_fixed(prefixed, _NUMBER_KIND[fixed[1]])
                if got is not None:  # (None: the entry cache cannot answer alone)
                    return _from_buffers(fixed[1], len(prefixed), got)
                return _decode_fixed(self._rocks.get_stored(prefixed), fixed)
            decode = self._rocks._decode
            values = [None if d is None else decode(d)
                      for d in self._rocks.get_stored(prefixed)]
        elif self._table is not None and prefixed is not None:
            number = _NUMBER_KIND.get(kind) if kind is not None else None
            got = (None if number is None
                   else dict_get_numbers(self._table._data, prefixed, number))
            if got is not None:  # (None: a stored value is not exactly of that kind)
                assert kind is not None
                return _from_buffers(kind, len(prefixed), got)
            values = list(map(self._table._data.get, prefixed))
        else:
            values = self._each(keys, lambda: self._state.value())
        return _array(values, kind, self._name)

    def put(self, keys: Keys, values: pa.Array | pa.ChunkedArray | Sequence[Any]) -> None:
        keys, prefixed = self._keys(keys)
        rocks = self._rocks
        if rocks is not None:
            assert prefixed is not None
            packed = self._packed(values)
            if packed is None:
                values = pylist(values)
                packed = self._packed_list(values)
            if packed is not None:  # (stored from the array where the cache takes it)
                self._check_length(keys, packed)
                rocks.store_fixed(prefixed, packed)
                return
            self._check_length(keys, values)
            encode = rocks._encode
            rocks.store_many(prefixed, [None if v is None else encode(v) for v in values])
            return
        table = self._table
        numeric = _numeric_kind(values)
        if table is not None and numeric in _NUMBER_DTYPE:  # ints or floats, no nulls
            assert prefixed is not None and numeric is not None
            array = _as_numpy(values, _NUMBER_DTYPE[numeric])
            self._check_length(keys, array)
            if len(array):  # the write check, once per type
                _check_types(table, [_PYTHON_TYPE[numeric](array[0])])
            try:
                dict_put_numbers(table._data, prefixed, array, numeric)
            finally:  # (recorded even if it stopped part way)
                self._mark(prefixed)
            return
        values = pylist(values)
        self._check_length(keys, values)
        if table is None:
            state = self._state
            try:
                for key, value in zip(keys, values, strict=True):
                    self._at(key)
                    if value is None:
                        state.clear()
                    else:
                        state.update(value)
            finally:
                self._op.key_context.clear()
            return
        assert prefixed is not None
        if _has_none(values):  # a null deletes, as update(None) does; each key's last
            last = dict(zip(prefixed, values, strict=True))  # counts
            self._remove([k for k, v in last.items() if v is None])
            prefixed = [k for k, v in last.items() if v is not None]
            values = [last[k] for k in prefixed]
        _check_types(table, values)
        table._data.update(zip(prefixed, values, strict=True))
        self._mark(prefixed)

    def delete(self, keys: Keys) -> None:
        keys, prefixed = self._keys(keys)
        if self._rocks is not None:
            assert prefixed is not None
            self._rocks.store_many(prefixed, [None] * len(prefixed))
            return
        if prefixed is None:
            try:
                for key in keys:
                    self._at(key)
                    self._state.clear()
            finally:
                self._op.key_context.clear()
            return
        self._remove(prefixed)

    # helpers ---------------------------------------------------------------------------
    def _check_length(self, keys: list[Any], values: Sized) -> None:
        if len(keys) != len(values):
            raise ValueError(f"state {self._name!r}: put of {len(keys)} keys with "
                             f"{len(values)} values")

    def _packed(self, values: Any) -> np.ndarray | None:
        """RocksDB's stored form of an Arrow or NumPy array of a fixed-width state's
        own kind (signed ints for ``IntSerializer``, floats for ``FloatSerializer``)
        without nulls: one contiguous big-endian array, no Python object per value;
        None for anything else (the checked path)."""
        fixed = self._fixed
        if fixed is None or _numeric_kind(values) != _NUMBER_KIND[fixed[1]]:
            return None
        return _as_numpy(values, fixed[0])

    def _packed_list(self, values: list[Any]) -> np.ndarray | None:
        """:meth:`_packed` of Python ints or floats of a fixed-width state's own types
        (None: another value, or an int beyond int64, for the checked encode)."""
        fixed = self._fixed
        if fixed is None or not values or not set(map(type, values)) <= fixed[2]:
            return None
        try:
            return np.asarray(values, dtype=fixed[0])
        except OverflowError:  # (an int beyond int64: the checked encode says so)
            return None

    def _at(self, key: Any) -> None:
        self._op.key_context.set_current_key(key)

    def _each(self, keys: list[Any], read: Any) -> list[Any]:
        out: list[Any] = []
        try:
            for key in keys:
                self._at(key)
                out.append(read())
        finally:
            self._op.key_context.clear()
        return out

    def _remove(self, prefixed: list[bytes]) -> None:
        assert self._table is not None
        pop = self._table._data.pop
        for key in prefixed:
            pop(key, None)
        self._mark(prefixed)

    def _mark(self, prefixed: list[bytes]) -> None:
        """Record the writes as ``ValueState.update`` does (``_hashcore.c``'s mark_dirty
        for each key)."""
        assert self._table is not None
        self._table._mark_many(prefixed)



class _KeyByKey:
    """A state read and written key by key through its own API (the key context set
    per key, cleared after each call)."""

    def __init__(self, op: Any, state: Any, name: str, item_type: pa.DataType | None
                 ) -> None:
        self._op, self._state, self._name, self._type = op, state, name, item_type

    def _each(self, keys: Keys, act: Any, *columns: Any) -> list[Any]:
        """``act(*row)`` with each key current in turn (``columns`` beside the keys)."""
        keys = pylist(keys)
        rows = [pylist(c) for c in columns]
        if any(len(r) != len(keys) for r in rows):
            raise ValueError(f"state {self._name!r}: {len(keys)} keys with "
                             f"{[len(r) for r in rows]} values")
        ctx = self._op.key_context
        try:
            if not rows:
                return [(ctx.set_current_key(k), act())[1] for k in keys]
            return [(ctx.set_current_key(k), act(*row))[1]
                    for k, *row in zip(keys, *rows, strict=True)]
        finally:
            ctx.clear()


class BatchListView(_KeyByKey, BatchListState[Any]):
    """A list state read and appended for many keys at once: the hash map's plain list
    state through its dict (reads: each key's stored list, absent ``[]``; appends in C,
    ``dict_append_many``, after the write check per new type), every other table key
    by key."""

    def __init__(self, op: Any, state: Any, descriptor: ListStateDescriptor[Any]) -> None:
        super().__init__(op, state, descriptor.name,
                         _ARROW_TYPES.get(type(descriptor.value_serializer)))
        self._table = state if type(state) is HashMapListTable else None

    def get(self, keys: Keys, type: pa.DataType | None = None) -> pa.Array:
        table = self._table
        if table is not None:  # (Arrow copies the stored lists: no copy here)
            prefixed = _prefixed_keys(self._op, pylist(keys))
            lists = list(map(table._data.get, prefixed, itertools.repeat(_NO_ITEMS)))
        else:
            lists = self._each(keys, self._state.get)
        item = type or self._type
        return _array(lists, None if item is None else pa.list_(item), self._name)

    def add(self, keys: Keys, values: pa.Array | pa.ChunkedArray | Sequence[Any]) -> None:
        table = self._table
        items = pylist(values)
        if table is None or _has_none(items):  # (a None fails at its row, as add does)
            self._each(keys, self._state.add, items)
            return
        keys = pylist(keys)
        if len(keys) != len(items):
            raise ValueError(f"state {self._name!r}: {len(keys)} keys with "
                             f"{[len(items)]} values")
        prefixed = _prefixed_keys(self._op, keys)
        _check_types(table, items)
        try:
            dict_append_many(table._data, prefixed, items)
        finally:  # (recorded even if it stopped part way)
            table._mark_many(prefixed)

    def update(self, keys: Keys, lists: pa.Array | pa.ChunkedArray | Sequence[Any]) -> None:
        state = self._state
        self._each(keys, lambda items: state.update(() if items is None else pylist(items)),
                   lists)

    def delete(self, keys: Keys) -> None:
        self._each(keys, self._state.clear)


class BatchMapView(_KeyByKey, BatchMapState[Any, Any]):
    """A map state's entries read and written for many pairs at once (key by key)."""

    def __init__(self, op: Any, state: Any, descriptor: MapStateDescriptor[Any, Any]
                 ) -> None:
        super().__init__(op, state, descriptor.name,
                         _ARROW_TYPES.get(type(descriptor.value_serializer)))

    def get(self, keys: Keys, user_keys: Keys, type: pa.DataType | None = None
            ) -> pa.Array:
        return _array(self._each(keys, self._state.get, user_keys), type or self._type, self._name)

    def put(self, keys: Keys, user_keys: Keys,
            values: pa.Array | pa.ChunkedArray | Sequence[Any]) -> None:
        state = self._state

        def put(user_key: Any, value: Any) -> None:
            if value is None:
                state.remove(user_key)
            else:
                state.put(user_key, value)
        self._each(keys, put, user_keys, values)

    def contains(self, keys: Keys, user_keys: Keys) -> pa.Array:
        return pa.array(self._each(keys, self._state.contains, user_keys), pa.bool_())

    def delete(self, keys: Keys) -> None:
        self._each(keys, self._state.clear)


class BatchAppendingView(_KeyByKey, BatchAppendingState[Any]):
    """A reducing or aggregating state, added to and read for many keys at once (key by
    key)."""

    def __init__(self, op: Any, state: Any, name: str) -> None:
        super().__init__(op, state, name, None)

    def add(self, keys: Keys, values: pa.Array | pa.ChunkedArray | Sequence[Any]) -> None:
        self._each(keys, self._state.add, values)

    def get(self, keys: Keys, type: pa.DataType | None = None) -> pa.Array:
        return _array(self._each(keys, self._state.get), type, self._name)

    def delete(self, keys: Keys) -> None:
        self._each(keys, self._state.clear)
