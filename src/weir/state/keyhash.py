"""The key hash: the 32-bit hash that places a key in its key group.

A key's group is ``key_hash(key) % max_parallelism`` (``weir.state.keygroups``). The
key hash is Spark's own ``hash()`` of the key taken as a Spark value: Murmur3 x86_32
with seed 42 as ``org.apache.spark.unsafe.hash.Murmur3_x86_32`` computes it, read as
an unsigned int. So the Spark runtime computes a record's key group in the JVM with
Spark's built-in ``hash`` (``weir.runtime.spark.jvm_route``) and a Python pass over
the records is not needed to route them; every runtime, the test harness and the
state backends compute the same function here (and in C for str and int keys,
``weir/state/_keybytes.h``), so a savepoint taken on one runtime restores on another.

==========================  =====================================================
key (Python value)          hash, with the running seed ``h`` (42 for the key)
==========================  =====================================================
``None``                    ``h`` (Spark skips a null)
``bool``                    ``hashInt(1 or 0, h)`` (Spark's boolean)
``int`` in ``[-2**63,       ``hashLong(v, h)`` (Spark's long; an int, short or byte
2**63)``                    column is cast to long first)
``str``                     ``hashUnsafeBytes(UTF-8, h)`` (Spark's string)
``bytes``                   ``hashUnsafeBytes(bytes, h)`` (Spark's binary)
``float``                   ``hashLong(bits, h)`` of the float64, ``-0.0`` as ``0.0``
                            and every NaN as Java's canonical NaN (Spark's double;
                            a float column is cast to double first)
``datetime.date``           ``hashInt(days since 1970-01-01, h)`` (Spark's date)
``datetime.datetime``       ``hashLong(microseconds, h)``: since the epoch in UTC when
                            aware (Spark's timestamp), of the wall-clock reading when
                            naive (timestamp_ntz), the values of its canonical bytes
``tuple``, ``list``         the items folded left: each item's hash is the seed of
                            the next (Spark's array, and ``hash(c1, c2, ...)`` of
                            several columns)
anything else: ``dict``,    ``hashUnsafeBytes(canonical_key_bytes(item), h)``
``Decimal``, an int         (Spark hashes structs by field order and decimals by
outside int64               their column's scale, weir keys neither way, so these
                            keys are routed in Python)
==========================  =====================================================

Keys of different types may share a hash (``0``, ``False``, ``None`` in a tuple):
they are still different keys, in the same group. ``hashUnsafeBytes`` is not the
reference Murmur3 tail: each byte after the last 4-byte block is mixed alone,
sign-extended (Spark keeps it for compatibility); ``spark_hash_bytes`` in C is it.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from typing import Any

from weir.state._hashcore import (
    common_key_hash,
    spark_hash_bytes,
    spark_hash_int,
    spark_hash_long,
)
from weir.state.keybytes import (
    _EPOCH_NAIVE,
    _EPOCH_ORDINAL,
    _EPOCH_UTC,
    _MICROSECOND,
    canonical_key_bytes,
)

__all__ = ["KEY_HASH_SEED", "key_hash"]

#: The seed of Spark's ``hash()`` function (``Murmur3Hash``'s default).
KEY_HASH_SEED = 42

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_DOUBLE = struct.Struct("<d")
_LONG = struct.Struct("<q")
_JAVA_NAN_BITS = 0x7FF8000000000000


def _double_bits(value: float) -> int:
    """Java's ``doubleToLongBits`` after Spark's ``-0.0 -> 0.0``."""
    if math.isnan(value):
        return _JAVA_NAN_BITS
    bits: int = _LONG.unpack(_DOUBLE.pack(value + 0.0))[0]  # -0.0 + 0.0 is 0.0
    return bits


def key_hash(key: Any, seed: int = KEY_HASH_SEED) -> int:
    """The unsigned 32-bit key hash of ``key`` (a valid key: see
    :func:`weir.state.keybytes.canonical_key_bytes`), as the table above."""
    common = common_key_hash(key, seed)  # None, str, int64 and tuples of them, in C
    if common is not None:
        return common
    if key is None:
        return seed
    if isinstance(key, bool):
        return spark_hash_int(int(key), seed)
    if isinstance(key, int):
        if _INT64_MIN <= key <= _INT64_MAX:
            return spark_hash_long(key, seed)
    elif isinstance(key, str):
        return spark_hash_bytes(key.encode("utf-8"), seed)
    elif isinstance(key, bytes):
        return spark_hash_bytes(key, seed)
    elif isinstance(key, float):
        return spark_hash_long(_double_bits(key), seed)
    elif isinstance(key, tuple | list):
        for item in key:
            seed = key_hash(item, seed)
        return seed
    elif isinstance(key, dt.datetime):
        epoch = _EPOCH_NAIVE if key.utcoffset() is None else _EPOCH_UTC
        return spark_hash_long((key - epoch) // _MICROSECOND, seed)
    elif isinstance(key, dt.date):
        return spark_hash_int(key.toordinal() - _EPOCH_ORDINAL, seed)
    return spark_hash_bytes(canonical_key_bytes(key), seed)
