"""Serializers turn state values into bytes and back.

Every descriptor has one (default: :class:`MsgpackSerializer`). A serializer's
``type_id`` names its format; it is stored with every snapshot so a restore can
refuse an incompatible change instead of misreading bytes. Users may write their
own by subclassing :class:`Serializer`.

Formats:

* ``msgpack/1`` — msgpack with ``use_bin_type``; tuples, sets and frozensets keep
  their type through msgpack extension types 1, 2 and 3.
* ``pickle/5`` — the user's explicit choice for arbitrary Python objects; never used
  for anything weir reads on its own (checkpoint metadata is never unpickled).
* ``int64`` / ``float64`` / ``utf8`` / ``bytes`` — fixed formats for common scalars.
* ``record/1`` — typed records (:class:`~weir.api.record_serializer.RecordSerializer`),
  whose schema is stored with the state and may evolve.
* ``avro/1`` — Avro's binary encoding with a user-given schema
  (:class:`~weir.api.avro_serializer.AvroSerializer`), stored with the state; a
  restore follows Avro's schema resolution.

A restore asks the new descriptor's serializer how to read what the old one wrote
(:meth:`Serializer.resolve`, Flink's ``TypeSerializerSnapshot.resolveSchemaCompatibility``):
:class:`Compatibility` ``AS_IS``, ``AFTER_MIGRATION`` (with a function rewriting each
stored value) or ``INCOMPATIBLE`` (the restore is refused with the reason).
"""

from __future__ import annotations

import enum
import pickle
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgpack

__all__ = [
    "BytesSerializer",
    "Compatibility",
    "SchemaResolution",
    "FloatSerializer",
    "IntSerializer",
    "MsgpackSerializer",
    "PickleSerializer",
    "Serializer",
    "StrSerializer",
]

T = TypeVar("T")

_EXT_TUPLE, _EXT_SET, _EXT_FROZENSET = 1, 2, 3


class Compatibility(enum.Enum):
    """Whether a state written by one serializer can be read by another (Flink's
    ``TypeSerializerSchemaCompatibility``)."""

    AS_IS = "compatible as is"
    AFTER_MIGRATION = "compatible after migration"
    INCOMPATIBLE = "incompatible"


@dataclass(frozen=True)
class SchemaResolution:
    """The answer of :meth:`Serializer.resolve`: the compatibility, for
    ``AFTER_MIGRATION`` the function turning a stored value's old bytes into new ones,
    and for ``INCOMPATIBLE`` the reason (naming the field and the rule)."""

    compatibility: Compatibility
    migrate: Callable[[bytes], bytes] | None = None
    reason: str = ""


class Serializer(ABC, Generic[T]):
    """Encodes values of one type to bytes and back.

    Subclasses set :attr:`type_id` (a stable name of the byte format, including a
    version) and implement :meth:`encode` and :meth:`decode`. Raise ``TypeError`` or
    ``ValueError`` for a value that cannot be encoded; weir turns it into a
    :class:`~weir.errors.StateSerializationError` naming the state.
    """

    type_id: str = ""
    #: True if every encoding is exactly one msgpack object and :meth:`decode` of a
    #: msgpack array of such encodings returns the list of values. List state then
    #: stores elements inline in the array instead of wrapping each in a ``bin``.
    inline_in_msgpack_array: bool = False

    @abstractmethod
    def encode(self, value: T) -> bytes:
        """The bytes of ``value``."""

    @abstractmethod
    def decode(self, data: bytes) -> T:
        """The value encoded in ``data``."""

    def accepts(self, value: object) -> bool:
        """Whether ``value`` can be encoded; used for a cheap check at write time."""
        try:
            self.encode(value)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            return False
        return True

    def schema(self) -> Any:
        """What, besides :attr:`type_id`, a reader needs to know of the stored bytes (a
        msgpack-able document, stored once per state in the checkpoint), or None."""
        return None

    def resolve(self, old_type_id: str, old_schema: Any) -> SchemaResolution:
        """How this serializer reads a state written by ``old_type_id`` with
        ``old_schema``. Default: as is when both are this one's, else incompatible."""
        if old_type_id == self.type_id and old_schema == self.schema():
            return SchemaResolution(Compatibility.AS_IS)
        return SchemaResolution(
            Compatibility.INCOMPATIBLE,
            reason=f"it was written with serializer {old_type_id!r} and is now read with "
                   f"{self.type_id!r}, which cannot read it")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.type_id == self.type_id

    def __hash__(self) -> int:
        return hash((type(self).__qualname__, self.type_id))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _msgpack_default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return msgpack.ExtType(_EXT_TUPLE, _PACK(list(obj)))
    if isinstance(obj, frozenset):
        return msgpack.ExtType(_EXT_FROZENSET, _PACK(list(obj)))
    if isinstance(obj, set):
        return msgpack.ExtType(_EXT_SET, _PACK(list(obj)))
    raise TypeError(f"cannot encode an object of type {type(obj).__name__}")


def _msgpack_ext_hook(code: int, data: bytes) -> Any:
    items = msgpack.unpackb(data, raw=False, ext_hook=_msgpack_ext_hook, strict_map_key=False)
    if code == _EXT_TUPLE:
        return tuple(items)
    if code == _EXT_SET:
        return set(items)
    if code == _EXT_FROZENSET:
        return frozenset(items)
    return msgpack.ExtType(code, data)


def _PACK(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, strict_types=True, default=_msgpack_default)  # type: ignore[no-any-return]


class MsgpackSerializer(Serializer[Any]):
    """The default: msgpack for None, bool, int, float, str, bytes, list, dict, and
    (through extension types) tuple, set and frozenset. Compact and fast; other
    types are rejected with a clear error — use :class:`PickleSerializer` or your own."""

    type_id = "msgpack/1"
    inline_in_msgpack_array = True

    def __init__(self) -> None:
        self._packer = msgpack.Packer(
            use_bin_type=True, strict_types=True, default=_msgpack_default
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # the packer is a C object that does not pickle: a copy makes its own (descriptors
        # travel to Spark's executors, e.g. in write_savepoint from Spark DataFrames)
        return (type(self), ())

    def encode(self, value: Any) -> bytes:
        # strict_types keeps tuples (and bool/int subclasses) from being silently coerced.
        return self._packer.pack(value)  # type: ignore[no-any-return]

    def decode(self, data: bytes) -> Any:
        return msgpack.unpackb(data, raw=False, ext_hook=_msgpack_ext_hook, strict_map_key=False)


class PickleSerializer(Serializer[Any]):
    """Pickle (protocol 5) for arbitrary Python objects, when the user chooses it.

    Restoring pickled values runs code from the snapshot: use it only for snapshots
    you trust. weir never pickles its own metadata.
    """

    type_id = "pickle/5"

    def encode(self, value: Any) -> bytes:
        try:
            return pickle.dumps(value, protocol=5)
        except (pickle.PicklingError, AttributeError) as exc:
            raise TypeError(str(exc)) from exc

    def decode(self, data: bytes) -> Any:
        return pickle.loads(data)


_INT64 = struct.Struct(">q")
_FLOAT64 = struct.Struct(">d")


class IntSerializer(Serializer[int]):
    """Signed 64-bit big-endian integers."""

    type_id = "int64"

    def encode(self, value: int) -> bytes:
        if type(value) is not int:
            raise TypeError(f"IntSerializer needs an int, got {type(value).__name__}")
        try:
            return _INT64.pack(value)
        except struct.error as exc:
            raise OverflowError(f"{value} does not fit in 64 bits") from exc

    def decode(self, data: bytes) -> int:
        return _INT64.unpack(data)[0]  # type: ignore[no-any-return]


class FloatSerializer(Serializer[float]):
    """IEEE 754 double, big-endian."""

    type_id = "float64"

    def encode(self, value: float) -> bytes:
        if type(value) is not float and type(value) is not int:
            raise TypeError(f"FloatSerializer needs a float, got {type(value).__name__}")
        return _FLOAT64.pack(value)

    def decode(self, data: bytes) -> float:
        return _FLOAT64.unpack(data)[0]  # type: ignore[no-any-return]


class StrSerializer(Serializer[str]):
    """UTF-8 text."""

    type_id = "utf8"

    def encode(self, value: str) -> bytes:
        if type(value) is not str:
            raise TypeError(f"StrSerializer needs a str, got {type(value).__name__}")
        return value.encode()

    def decode(self, data: bytes) -> str:
        return data.decode()


class BytesSerializer(Serializer[bytes]):
    """Raw bytes, stored as they are."""

    type_id = "bytes"

    def encode(self, value: bytes) -> bytes:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"BytesSerializer needs bytes, got {type(value).__name__}")
        return bytes(value)

    def decode(self, data: bytes) -> bytes:
        return bytes(data)
