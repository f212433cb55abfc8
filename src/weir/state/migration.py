"""State migration on restore (issue 41; Flink's ``TypeSerializerSchemaCompatibility``).

A keyed state restored from a checkpoint whose serializers or schemas differ from the
descriptor registering it is resolved here: the descriptor's value serializer says how
it reads what the old one wrote (:meth:`~weir.api.serializers.Serializer.resolve`):

* compatible **as is** — nothing to do (e.g. a record renamed, a field made nullable);
* compatible **after migration** — every restored entry of the state is rewritten
  before the state is used (:meth:`KeyedStateBackend.migrate_restored`), in the
  canonical entry layout of ``weir.state.backend`` (a TTL state keeps each value's
  timestamp; a list state's elements are rewritten one by one); the next checkpoint
  holds the new format and schema;
* **incompatible** — refused with :class:`~weir.errors.StateMigrationError` naming the
  operator, the state, the field and the rule.

Keys never evolve (a map state's user keys, as Flink's): a changed key serializer is
refused. A changed state kind or TTL setting keeps today's refusal (Flink refuses them
too): the way around is a savepoint rewritten with ``weir.write_savepoint``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

import msgpack

from weir.api.descriptors import StateDescriptor, StateKind
from weir.api.serializers import Compatibility, Serializer
from weir.errors import StateMigrationError
from weir.state.backend import frame
from weir.state.snapshot import StateMeta

__all__ = ["AS_IS", "migration"]

Rewrite = Callable[[bytes], bytes]


def _as_is(data: bytes) -> bytes:
    return data


#: :func:`migration`'s answer for a state that needs no rewriting
AS_IS: Final[Rewrite] = _as_is

#: the serializers whose encodings are msgpack objects framed inline in a list state
#: (``Serializer.inline_in_msgpack_array``) — the old side is known by type_id only
_INLINE = frozenset({"msgpack/1"})


def migration(owner: str, restored: StateMeta, descriptor: StateDescriptor
              ) -> Rewrite | None:
    """How the restored entries of ``descriptor``'s state become readable by it:
    :data:`AS_IS`, a rewrite of each entry's value bytes, or None when the kind or
    TTL setting changed (the caller's refusal). Raises :class:`StateMigrationError`
    for a serializer change no rule covers."""
    if restored.kind != descriptor.kind or restored.ttl != (descriptor.ttl is not None):
        return None
    serializers = descriptor.serializers()
    if len(restored.serializers) != len(serializers):
        return None
    schemas = restored.schemas or (None,) * len(serializers)
    name = descriptor.name
    for old_id, old_schema, new in zip(restored.serializers[:-1], schemas[:-1],
                                       serializers[:-1], strict=True):  # (map user keys)
        if old_id != new.type_id or _load(old_schema) != new.schema():
            raise StateMigrationError(
                f"{owner}: state {name!r}: its user keys were written with {old_id!r} "
                f"and are now read with {new.type_id!r}; keys never evolve (as in Flink): "
                f"keep the key serializer and key type, or move the state to a new name "
                f"with weir.write_savepoint")
    old_id, old_schema = restored.serializers[-1], _load(schemas[-1])
    value = serializers[-1]
    if old_schema is None and value.schema() is None and old_id != value.type_id and (
            type(value).resolve is Serializer.resolve):
        return None  # (two untyped serializers: the caller's refusal says it all)
    found = value.resolve(old_id, old_schema)
    if found.compatibility is Compatibility.INCOMPATIBLE:
        raise StateMigrationError(
            f"{owner}: state {name!r} cannot be restored with {value!r}: {found.reason}. "
            f"Restore with the old type, change it only in the ways weir migrates (fields "
            f"added with defaults or nullable, removed, reordered, int -> float), or "
            f"rewrite the state with weir.write_savepoint")
    if found.compatibility is Compatibility.AS_IS:
        return AS_IS
    assert found.migrate is not None
    return _entry_rewrite(owner, name, descriptor.kind, descriptor.ttl is not None,
                          old_id in _INLINE, value.inline_in_msgpack_array, found.migrate)


def _load(schema: str | None) -> Any:
    return None if schema is None else json.loads(schema)


def _entry_rewrite(owner: str, name: str, kind: StateKind, ttl: bool, old_inline: bool,
                   new_inline: bool, migrate: Rewrite) -> Rewrite:
    """The rewrite of one canonical entry value (see ``weir.state.backend``)."""

    def value(data: bytes) -> bytes:
        try:
            return data[:8] + migrate(data[8:]) if ttl else migrate(data)
        except (TypeError, ValueError, KeyError) as exc:
            raise StateMigrationError(
                f"{owner}: state {name!r}: a stored value could not be migrated: {exc}. "
                f"Restore with the old type, or rewrite the state with "
                f"weir.write_savepoint") from exc

    if kind is not StateKind.LIST:
        return value
    old_in, new_in = old_inline and not ttl, new_inline and not ttl

    def elements(data: bytes) -> bytes:
        items = msgpack.unpackb(data, raw=False, strict_map_key=False)
        old = [msgpack.packb(i, use_bin_type=True) if old_in else i for i in items]
        return frame([value(e) for e in old], inline=new_in)
    return elements
