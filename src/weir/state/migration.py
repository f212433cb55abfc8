"""State migration on restore (issue 41; Flink's ``TypeSerializerSchemaCompatibility``).

A state restored from a checkpoint whose serializers or schemas differ from the
descriptor registering it is resolved here (keyed states in the backends, operator and
broadcast states in ``weir.state.operator_state``, value by value): the descriptor's
value serializer says how it reads what the old one wrote
(:meth:`~weir.api.serializers.Serializer.resolve`):

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

__all__ = ["AS_IS", "checked", "migration", "same_keys", "value_migration"]

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
        same_keys(f"{owner}: state {name!r}", old_id, old_schema, new)
    old_id, value = restored.serializers[-1], serializers[-1]
    migrate = value_migration(f"{owner}: state {name!r}", old_id, schemas[-1], value)
    if migrate is None or migrate is AS_IS:
        return migrate
    return _entry_rewrite(owner, name, descriptor.kind, descriptor.ttl is not None,
                          old_id in _INLINE, value.inline_in_msgpack_array, migrate)


def value_migration(what: str, old_id: str, old_schema: str | None, new: Serializer[Any]
                    ) -> Rewrite | None:
    """How one value written by serializer ``old_id`` with ``old_schema`` (canonical
    JSON) becomes readable by ``new``: :data:`AS_IS`, a rewrite of its bytes, or None
    for two different serializers without schemas or rules (the caller's refusal,
    which names both). Raises :class:`StateMigrationError` naming ``what`` (operator
    and state) for a change no rule covers."""
    schema = _load(old_schema)
    if schema is None and new.schema() is None and old_id != new.type_id and (
            type(new).resolve is Serializer.resolve):
        return None
    found = new.resolve(old_id, schema)
    if found.compatibility is Compatibility.INCOMPATIBLE:
        raise StateMigrationError(
            f"{what} cannot be restored with {new!r}: {found.reason}. Restore with the "
            f"old type, change it only in the ways its serializer migrates (see 'Changing "
            f"your state' in the docs), or rewrite the state with weir.write_savepoint")
    if found.compatibility is Compatibility.AS_IS:
        return AS_IS
    assert found.migrate is not None
    return found.migrate


def same_keys(what: str, old_id: str, old_schema: str | None, new: Serializer[Any]) -> None:
    """Refuses a changed key serializer or key schema (keys never evolve, as in
    Flink), naming ``what`` (operator and state)."""
    if old_id != new.type_id or _load(old_schema) != new.schema():
        raise StateMigrationError(
            f"{what}: its user keys were written with {old_id!r} and are now read with "
            f"{new.type_id!r}; keys never evolve (as in Flink): keep the key serializer "
            f"and key type, or move the state to a new name with weir.write_savepoint")


def checked(what: str, migrate: Rewrite) -> Rewrite:
    """``migrate`` with a stored value it cannot rewrite reported as a
    :class:`StateMigrationError` naming ``what`` (operator and state)."""

    def rewrite(data: bytes) -> bytes:
        try:
            return migrate(data)
        except (TypeError, ValueError, KeyError) as exc:
            raise StateMigrationError(
                f"{what}: a stored value could not be migrated: {exc}. Restore with the "
                f"old type, or rewrite the state with weir.write_savepoint") from exc
    return rewrite


def _load(schema: str | None) -> Any:
    return None if schema is None else json.loads(schema)


def _entry_rewrite(owner: str, name: str, kind: StateKind, ttl: bool, old_inline: bool,
                   new_inline: bool, migrate: Rewrite) -> Rewrite:
    """The rewrite of one canonical entry value (see ``weir.state.backend``)."""

    one = checked(f"{owner}: state {name!r}", migrate)

    def value(data: bytes) -> bytes:
        return data[:8] + one(data[8:]) if ttl else one(data)

    if kind is not StateKind.LIST:
        return value
    old_in, new_in = old_inline and not ttl, new_inline and not ttl

    def elements(data: bytes) -> bytes:
        items = msgpack.unpackb(data, raw=False, strict_map_key=False)
        old = [msgpack.packb(i, use_bin_type=True) if old_in else i for i in items]
        return frame([value(e) for e in old], inline=new_in)
    return elements
