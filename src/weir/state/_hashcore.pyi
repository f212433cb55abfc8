"""Types of the C fast paths in ``_hashcore.c`` (see the comment at its top)."""

from collections.abc import Callable, Iterable
from typing import Any

class KeyCell:
    """The current key where C code reads it directly (KeyContext's base)."""

    key_bytes: Any
    key: Any
    key_group: int
    max_parallelism: int
    _kg_start: int
    _kg_end: int

    def set_current_key(self, key: Any) -> None:
        """Make ``key`` current; raises KeyGroupError if another subtask owns it."""

    def prefixed_keys(self, keys: list[Any]) -> list[bytes]:
        """The prefixed keys of ``keys``, each checked as ``set_current_key`` checks it."""

def route_keys(
    keys: list[Any], max_parallelism: int, parallelism: int, table: tuple[int, ...]
) -> tuple[bytearray, list[int]]:
    """Native int32 routes of str and int keys; the positions of the others (route 0)."""

def process_keyed(
    cell: KeyCell, values: Any, keys: list[Any], timestamps: list[int | None], operator: Any,
    process: Callable[[Any, Any], Any], out: list[Any], cleaners: list[Any],
    on_record: Callable[[], Any],
) -> None:
    """``KeyedOperator.process_keyed``'s loop (see ``_keycell.c``)."""

def int64_range(start: int, count: int) -> bytearray:
    """``count`` native int64s from ``start``."""

def dict_get_numbers(data: dict[bytes, Any], keys: list[bytes], kind: str
                     ) -> tuple[bytearray, bytearray | None, int] | None:
    """Each key's value as native int64 (``kind`` "i") or float64 ("f") bytes, an Arrow
    validity bitmap (None without nulls) and the null count; None if a stored value is
    not exactly of that kind (or an int beyond int64)."""

def dict_put_numbers(data: dict[bytes, Any], keys: list[bytes], values: Any, kind: str
                     ) -> None:
    """``data[keys[i]] =`` the i-th native int64 ("i") or float64 ("f") of ``values``."""

def dict_append_many(data: dict[bytes, Any], keys: list[bytes], values: list[Any]) -> None:
    """``values[i]`` appended to the list ``data[keys[i]]`` (a new list where absent)."""

def cache_get_fixed(cache: dict[bytes, bytes | None], keys: list[bytes], kind: str,
                    complete: bool) -> tuple[bytearray, bytearray | None, int] | None:
    """Each key's stored 8 big-endian bytes as native int64 ("i") or float64 ("f"),
    null where absent; None where the cache cannot answer (a miss of an incomplete
    cache, a value of another length)."""

def cache_put_fixed(cache: dict[bytes, bytes | None], record: dict[bytes, bytes | None],
                    keys: list[bytes], values: Any) -> None:
    """The i-th 8 bytes of ``values`` stored for ``keys[i]`` in ``cache`` and ``record``."""

def tuple_columns(rows: list[Any], width: int) -> list[list[Any]] | None:
    """Each column of ``rows`` when every row is a tuple of exactly ``width`` items
    (the i-th list: each row's i-th item), else None."""

def spark_hash_int(value: int, seed: int) -> int:
    """Spark's Murmur3 ``hashInt`` of ``value``'s low 32 bits, unsigned."""

def spark_hash_long(value: int, seed: int) -> int:
    """Spark's Murmur3 ``hashLong`` of ``value``'s low 64 bits, unsigned."""

def common_key_hash(key: Any, seed: int) -> int | None:
    """The key hash of None, str, int64 and tuples of them; None for other keys."""

def spark_hash_bytes(data: bytes, seed: int) -> int:
    """Spark's Murmur3 ``hashUnsafeBytes`` of ``data``, unsigned."""

#: sampled change tracking: a key is in the sample when its hash has none of these bits
SAMPLE_MASK: int

class TableCore:
    """Fields shared by the hash-map tables' C fast paths."""

    _ctx: Any
    _data: dict[bytes, Any]
    _ok: set[type]
    _key_ok: set[type]
    _dirty: set[bytes] | None
    _writes: int
    _sample_mask: int
    _dirty_limit: int

    def _mark(self, key: bytes) -> None:
        """Record a write of ``key`` when changes are tracked (counted; tracked, or only
        sampled; at the dirty limit the record turns sampled)."""

    def _mark_many(self, keys: list[bytes]) -> None:
        """Record a write of each key (changelog tracking), as a single write does."""

class ValueCore(TableCore):
    def value(self) -> Any: ...
    def update(self, value: Any) -> None: ...
    def reduce_add(self, function: Any, value: Any) -> None: ...
    def aggregate_add(self, add: Any, create: Any, value: Any) -> None: ...

class ListCore(TableCore):
    def get(self) -> list[Any]: ...
    def add(self, value: Any) -> None: ...

class MapCore(TableCore):
    def get(self, user_key: Any, default: Any = None) -> Any: ...
    def put(self, user_key: Any, value: Any) -> None: ...

class RocksPointCore:
    """Fields of a RocksDB value or list state's entry cache (``_rockscore.c``)."""

    _ctx: Any
    _cache: dict[bytes, bytes | None]
    _dirty: dict[bytes, bytes | None]
    _written: dict[bytes, bytes | None] | None
    _fast_encode: Any
    _fast_decode: Any
    _fast_scalars: bool

class RocksValueCore(RocksPointCore):
    def value(self) -> Any: ...
    def update(self, value: Any) -> None: ...

def pack_changes(
    written: dict[bytes, bytes | None],
) -> dict[int, tuple[bytearray, int, bytearray, int]]: ...
def pack_entries(entries: Any) -> dict[int, tuple[bytearray, int]]:
    """Each ``(prefixed key, value)`` bytes pair as two msgpack bin objects, per key group
    (the key's first two bytes): the group's buffer and its number of entries."""

def pack_fixed(values: dict[bytes, Any], kind: int, pos: int, limit: int
               ) -> tuple[dict[int, tuple[bytearray, int]], int]:
    """:func:`pack_entries` of up to ``limit`` entries of ``values`` from dict position
    ``pos``, each value an int encoded as big-endian int64 (``kind`` 0), an int or
    float as a big-endian double (1) or a msgpack scalar as MsgpackSerializer encodes
    it (2), in C: the groups and the next position (-1 at the end). Raises TypeError /
    OverflowError for any other value."""

def load_values(data: dict[bytes, Any], entries: Iterable[tuple[bytes, bytes]],
                decode: Callable[[bytes], Any], scalars: bool, types: set[type]) -> None:
    """``data[key] = decode(raw)`` for each ``(key, raw)`` of ``entries`` — a msgpack
    scalar decoded in C when ``scalars`` — and each value's type added to ``types``.
    ``decode``'s exceptions propagate."""

def load_flat(data: dict[bytes, Any], flat: list[bytes], decode: Callable[[bytes], Any],
              scalars: bool, types: set[type]) -> None:
    """:func:`load_values` of ``[key0, raw0, key1, raw1, ...]`` (a restore's unpacked
    form), without a tuple per entry. TypeError unless ``flat`` is a list of even
    length."""

def sorted_writes(
    entries: dict[bytes, bytes | None],
) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """Writes (None: a delete) as (put keys, their values, deleted keys), each in the
    keys' byte order."""
