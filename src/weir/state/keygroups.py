"""Key groups: the unit in which keyed state is partitioned and redistributed.

A keyed operator has ``max_parallelism`` key groups. A key's group is a stable
32-bit murmur3 hash (seed 0, unsigned) of the key's canonical bytes (see
:func:`canonical_key_bytes`) modulo ``max_parallelism``: the same on every machine,
interpreter, ``PYTHONHASHSEED`` and runtime. Python's ``hash()`` is never used.

Subtask ``i`` of ``p`` owns the contiguous range
``[ceil(i*M/p), floor(((i+1)*M - 1)/p)]`` and key group ``g`` belongs to subtask
``g*p // M``: Flink's ``KeyGroupRangeAssignment`` formulas, so each subtask owns one
contiguous range and every group belongs to exactly one subtask for any ``p <= M``.

**Canonical key bytes** are one msgpack object (``use_bin_type``), so they are
prefix-free. Equal keys of the same type have the same bytes; keys of different types
never do (``1``, ``1.0``, ``True`` and ``Decimal(1)`` are four keys), except that a
``list`` is the tuple of its items:

============================  ==============================================================
key (Python value)            bytes
============================  ==============================================================
``str``, ``int``, ``bool``,   msgpack's own encoding (``int`` in ``[-2**63, 2**64)``; floats
``float``, ``bytes``,         as float64 by their bits, so ``0.0``/``-0.0`` and NaNs with
``None``                      other payloads are different keys)
``tuple``, ``list``           msgpack array of the items' canonical objects; a ``list`` is
                              the same key as the tuple of its items (decoded as a tuple)
``dict`` (a struct)           msgpack map, entries sorted by name (code points, i.e. UTF-8
                              bytes); names must be ``str``. Equal dicts are one key
                              whatever their insertion order. Decoded as a ``dict``
``datetime.date``             ext 16, 4 bytes: int32 big-endian days since 1970-01-01
``datetime.datetime``, aware  ext 17, 8 bytes: int64 big-endian microseconds since
                              1970-01-01T00:00Z: the instant, whatever the time zone
                              (decoded in UTC)
``datetime.datetime``, naive  ext 18, 8 bytes: int64 big-endian microseconds from
                              1970-01-01T00:00 to the wall-clock reading: a local date-time
                              with no zone (Spark's ``TIMESTAMP_NTZ``), a different key
                              from every instant
``decimal.Decimal``           ext 19: int32 big-endian scale, then the unscaled value in
                              big-endian two's complement, minimal length (Java's
                              ``BigDecimal.stripTrailingZeros()`` then ``scale()`` and
                              ``unscaledValue().toByteArray()``)
============================  ==============================================================

Aware means ``utcoffset()`` is not None; ``fold`` matters only through it. Datetimes
are keyed to the microsecond; an aware one must be within ``datetime.min`` ..
``datetime.max`` in UTC. Decimals are keyed by numeric value: trailing zeros are
stripped, so ``Decimal("1.50")``, ``Decimal("1.5")`` and ``Decimal("1.500")`` are one
key, and ``-0`` is ``0``; they decode in that stripped form (``Decimal("1.5")``,
``Decimal("1E+2")``). NaN and infinite decimals are not keys. The ext codes are weir's
own (the value serializer's 1, 2 and 3 are not reused). Encodings of ``str``, ``int``,
``float``, ``bool``, ``bytes``, ``None`` and tuples never change: savepoints depend on
them.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import mmh3
import msgpack

from weir.errors import ConfigurationError, StateSerializationError

__all__ = [
    "DEFAULT_LOWER_BOUND_MAX_PARALLELISM",
    "UPPER_BOUND_MAX_PARALLELISM",
    "KeyGroupRange",
    "assign_key_to_parallel_operator",
    "assign_to_key_group",
    "canonical_key_bytes",
    "check_parallelism",
    "compute_default_max_parallelism",
    "compute_operator_index_for_key_group",
    "decode_key",
    "key_group_for_key_bytes",
    "key_group_range_for_operator",
]

#: Largest supported max parallelism (Flink: ``1 << 15``); key groups fit in 2 bytes.
UPPER_BOUND_MAX_PARALLELISM = 1 << 15
#: Smallest default max parallelism (Flink: ``1 << 7``).
DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 1 << 7

_SCALARS = (str, int, bytes, float, bool, type(None))
_pack = msgpack.Packer(use_bin_type=True).pack
#: msgpack extension type codes of keys (documented in the module docstring)
_EXT_DATE, _EXT_TIMESTAMP, _EXT_TIMESTAMP_NTZ, _EXT_DECIMAL = 16, 17, 18, 19
_INT32, _INT64 = struct.Struct(">i"), struct.Struct(">q")
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_MICROSECOND = dt.timedelta(microseconds=1)
#: microseconds from the epoch of datetime.min and datetime.max (as UTC instants)
_MIN_MICROS = (dt.datetime.min - _EPOCH_NAIVE) // _MICROSECOND
_MAX_MICROS = (dt.datetime.max - _EPOCH_NAIVE) // _MICROSECOND


@dataclass(frozen=True, slots=True)
class KeyGroupRange:
    """An immutable, inclusive range of key groups ``[start, end]``.

    As Flink's ``KeyGroupRange``: ``0 <= start <= end``, except the one empty range
    ``KeyGroupRange.empty()`` (``[0, -1]``); anything else raises
    :class:`ConfigurationError`.
    """

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or (self.start > self.end and (self.start, self.end) != (0, -1)):
            raise ConfigurationError(
                f"KeyGroupRange({self.start}, {self.end}) is invalid: key groups start at 0 "
                f"and a range needs 0 <= start <= end; use KeyGroupRange.empty() for no key "
                f"groups"
            )

    @classmethod
    def empty(cls) -> KeyGroupRange:
        """The range that contains no key group."""
        return cls(0, -1)

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        """The key groups in both ranges (possibly empty)."""
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(start, end) if start <= end else KeyGroupRange.empty()

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}]" if len(self) else "[]"


def check_parallelism(parallelism: int, max_parallelism: int) -> None:
    """Raise :class:`ConfigurationError` unless ``0 < parallelism <= max_parallelism <= 2**15``."""
    if type(max_parallelism) is not int or not 0 < max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise ConfigurationError(
            f"max_parallelism={max_parallelism!r} is out of range: it must be an int in "
            f"[1, {UPPER_BOUND_MAX_PARALLELISM}] (it is the number of key groups)"
        )
    if type(parallelism) is not int or parallelism < 1:
        raise ConfigurationError(f"parallelism={parallelism!r} must be a positive int")
    if parallelism > max_parallelism:
        raise ConfigurationError(
            f"parallelism={parallelism} is above max_parallelism={max_parallelism}: a subtask "
            f"needs at least one key group; raise max_parallelism or lower parallelism"
        )


def compute_default_max_parallelism(parallelism: int) -> int:
    """Flink's default: ``min(max(next_pow2(p + p // 2), 128), 32768)``."""
    if not isinstance(parallelism, int) or not 0 < parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise ConfigurationError(
            f"parallelism={parallelism!r} must be in [1, {UPPER_BOUND_MAX_PARALLELISM}]"
        )
    wanted = parallelism + parallelism // 2
    pow2 = 1 << (wanted - 1).bit_length()
    return min(max(pow2, DEFAULT_LOWER_BOUND_MAX_PARALLELISM), UPPER_BOUND_MAX_PARALLELISM)


def _key_error(key: Any) -> StateSerializationError:
    return StateSerializationError(
        f"a key of type {type(key).__name__} cannot be used as a state key: keys must be "
        f"str, int, float, bool, bytes, None, datetime.date, datetime.datetime, "
        f"decimal.Decimal, or tuples, lists and dicts (with str names) of those (return a "
        f"tuple from the key selector for composite keys)"
    )


def _decimal_ext(key: Decimal) -> msgpack.ExtType:
    if not key.is_finite():
        raise StateSerializationError(f"key {key!r}: NaN and infinite decimals are not keys")
    sign, digits, exponent = key.as_tuple()
    assert isinstance(exponent, int)
    stripped = len(digits)
    while stripped > 1 and digits[stripped - 1] == 0:  # stripTrailingZeros
        stripped -= 1
    exponent += len(digits) - stripped
    unscaled = int("".join(map(str, digits[:stripped])))  # ValueError past 4300 digits
    if unscaled == 0:
        sign, exponent = 0, 0
    scale = -exponent
    if not -(2**31) <= scale < 2**31:
        raise StateSerializationError(f"key {key!r}: its scale {scale} does not fit in 32 bits")
    if sign:
        unscaled = -unscaled
    size = ((unscaled if unscaled >= 0 else ~unscaled).bit_length() + 8) // 8
    return msgpack.ExtType(
        _EXT_DECIMAL, _INT32.pack(scale) + unscaled.to_bytes(size, "big", signed=True)
    )


def _canonical(key: Any) -> Any:
    """``key`` as the plain object msgpack packs into its canonical bytes (see the
    module docstring); :class:`StateSerializationError` if it is not a key."""
    if isinstance(key, _SCALARS):
        return key
    if isinstance(key, tuple | list):
        for part in key:
            if not isinstance(part, _SCALARS):
                return [_canonical(p) for p in key]
        return key  # scalars only (the common composite key): packed as it is
    if isinstance(key, dict):
        for name in key:
            if not isinstance(name, str):
                raise StateSerializationError(
                    f"a dict key needs str names (struct fields), got {name!r} "
                    f"({type(name).__name__}) in {key!r}"
                )
        return {name: _canonical(key[name]) for name in sorted(key)}
    if isinstance(key, dt.datetime):
        if key.utcoffset() is None:
            return msgpack.ExtType(
                _EXT_TIMESTAMP_NTZ, _INT64.pack((key - _EPOCH_NAIVE) // _MICROSECOND)
            )
        micros = (key - _EPOCH_UTC) // _MICROSECOND
        if not _MIN_MICROS <= micros <= _MAX_MICROS:
            raise StateSerializationError(
                f"key {key!r} cannot be encoded: in UTC it is outside the range of "
                f"datetime (years 1 to 9999)"
            )
        return msgpack.ExtType(_EXT_TIMESTAMP, _INT64.pack(micros))
    if isinstance(key, dt.date):
        return msgpack.ExtType(_EXT_DATE, _INT32.pack(key.toordinal() - _EPOCH_ORDINAL))
    if isinstance(key, Decimal):
        return _decimal_ext(key)
    raise _key_error(key)


def canonical_key_bytes(key: Any) -> bytes:
    """The canonical bytes of a key: one msgpack object (tuples and lists as arrays,
    dicts as maps sorted by name, dates, datetimes and decimals as extension types; the
    table is in the module docstring).

    The encoding is prefix-free, so key bytes can be followed by other bytes (a map
    state's user key) and still be split unambiguously.
    """
    try:
        data: bytes = _pack(key if type(key) is str or type(key) is int else _canonical(key))
        return data
    except StateSerializationError:
        raise
    except (OverflowError, ValueError, TypeError, RecursionError) as exc:
        raise StateSerializationError(f"key {key!r} cannot be encoded: {exc}") from exc


def _key_ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_DATE and len(data) == 4:
        return dt.date.fromordinal(_INT32.unpack(data)[0] + _EPOCH_ORDINAL)
    if code == _EXT_TIMESTAMP and len(data) == 8:
        return _EPOCH_UTC + dt.timedelta(microseconds=_INT64.unpack(data)[0])
    if code == _EXT_TIMESTAMP_NTZ and len(data) == 8:
        return _EPOCH_NAIVE + dt.timedelta(microseconds=_INT64.unpack(data)[0])
    if code == _EXT_DECIMAL and len(data) > 4:
        scale = _INT32.unpack_from(data)[0]
        unscaled = int.from_bytes(data[4:], "big", signed=True)
        digits = tuple(int(c) for c in str(abs(unscaled)))
        return Decimal((int(unscaled < 0), digits, -scale))
    raise StateSerializationError(
        f"key bytes hold msgpack extension type {code} with {len(data)} bytes, which is "
        f"not a weir key encoding"
    )


def decode_key(data: bytes) -> Any:
    """Inverse of :func:`canonical_key_bytes`: composite keys (and lists) come back as
    tuples, dicts as dicts, aware datetimes in UTC, decimals with trailing zeros
    stripped; the decoded key has the same bytes again."""
    return msgpack.unpackb(data, use_list=False, raw=False, ext_hook=_key_ext_hook)


def key_group_for_key_bytes(key_bytes: bytes, max_parallelism: int) -> int:
    """The key group of a key given its canonical bytes."""
    return mmh3.hash(key_bytes, 0, False) % max_parallelism


def assign_to_key_group(key: Any, max_parallelism: int) -> int:
    """The key group of ``key``: ``murmur3_32(canonical_key_bytes(key)) % max_parallelism``."""
    check_parallelism(1, max_parallelism)
    return key_group_for_key_bytes(canonical_key_bytes(key), max_parallelism)


def compute_operator_index_for_key_group(
    max_parallelism: int, parallelism: int, key_group: int
) -> int:
    """The subtask that owns ``key_group``: ``key_group * parallelism // max_parallelism``."""
    check_parallelism(parallelism, max_parallelism)
    if not 0 <= key_group < max_parallelism:
        raise ConfigurationError(f"key group {key_group} is outside [0, {max_parallelism})")
    return key_group * parallelism // max_parallelism


def assign_key_to_parallel_operator(key: Any, max_parallelism: int, parallelism: int) -> int:
    """The subtask that owns ``key``."""
    return compute_operator_index_for_key_group(
        max_parallelism, parallelism, assign_to_key_group(key, max_parallelism)
    )


def key_group_range_for_operator(
    max_parallelism: int, parallelism: int, index: int
) -> KeyGroupRange:
    """The key groups owned by subtask ``index`` of ``parallelism`` (Flink's formula)."""
    check_parallelism(parallelism, max_parallelism)
    if not 0 <= index < parallelism:
        raise ConfigurationError(f"subtask index {index} is outside [0, {parallelism})")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)
