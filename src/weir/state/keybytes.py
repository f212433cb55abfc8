"""Canonical key bytes: how a key is written, compared and stored.

A key's **canonical bytes** are one msgpack object (``use_bin_type``), so they are
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
from decimal import Decimal
from typing import Any

import msgpack

from weir.errors import StateSerializationError

__all__ = ["canonical_key_bytes", "decode_key"]

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
