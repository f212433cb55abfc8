"""The current key of a keyed operator subtask.

Keyed state reads and writes the state of the current key. Setting a key computes,
once per record, its canonical bytes and key group and checks that this subtask owns
that group. Backends address state by the *prefixed key*: two big-endian bytes of
key group followed by the canonical key bytes (``weir.state.keygroups``).
"""

from __future__ import annotations

from typing import Any

from weir.errors import KeyGroupError, NoKeyContextError
from weir.state._hashcore import KeyCell
from weir.state.keygroups import KeyGroupRange, canonical_key_bytes, decode_key
from weir.state.keyhash import key_hash

__all__ = ["NO_KEY", "KeyContext", "key_group_of_prefixed", "split_prefixed"]


class _NoKey:
    """Sentinel for 'no current key'. Unhashable and not bytes, so using it as a dict
    key or RocksDB key fails at once instead of reading some other key's state."""

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "<no current key>"


NO_KEY: Any = _NoKey()


def key_group_of_prefixed(prefixed: bytes) -> int:
    """The key group stored in a prefixed key."""
    return (prefixed[0] << 8) | prefixed[1]


def split_prefixed(prefixed: bytes) -> tuple[int, Any]:
    """``(key_group, key)`` of a prefixed key."""
    return key_group_of_prefixed(prefixed), decode_key(prefixed[2:])


class KeyContext(KeyCell):
    """Holds the current key of one keyed operator subtask. ``key``, ``key_group``,
    ``key_bytes`` and ``max_parallelism`` are fields of the C base, which makes str and
    int keys current in C (``set_current_key``) and where the hash map's fast paths read
    the key; every other key takes :meth:`_slow_set_current_key`."""

    __slots__ = ("_range", "description")

    def __init__(
        self, max_parallelism: int, key_group_range: KeyGroupRange, description: str = ""
    ) -> None:
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.description = description
        self.key = None
        self.key_group = -1
        self.key_bytes = NO_KEY

    @property
    def key_group_range(self) -> KeyGroupRange:
        """The key groups this subtask owns."""
        return self._range

    @key_group_range.setter
    def key_group_range(self, value: KeyGroupRange) -> None:
        self._range = value
        self._kg_start, self._kg_end = value.start, value.end

    def _slow_set_current_key(self, key: Any) -> None:
        """``set_current_key`` for every key (the C base handles str and int keys of
        this subtask's groups and calls this for the rest)."""
        raw = canonical_key_bytes(key)
        group = key_hash(key) % self.max_parallelism
        kgr = self.key_group_range
        if not kgr.start <= group <= kgr.end:
            raise KeyGroupError(
                f"key {key!r} is in key group {group}, outside the key-group range {kgr} of "
                f"{self.description or 'this subtask'} (max_parallelism="
                f"{self.max_parallelism}): route records by "
                f"weir.state.keygroups.assign_key_to_parallel_operator"
            )
        self.key = key
        self.key_group = group
        self.key_bytes = group.to_bytes(2, "big") + raw

    def set_current_prefixed_key(self, prefixed: bytes) -> None:
        """Make current the key stored in a prefixed key (timers, state iteration)."""
        self.key_group, self.key = split_prefixed(prefixed)
        self.key_bytes = prefixed

    def clear(self) -> None:
        """No key is current any more."""
        self.key = None
        self.key_group = -1
        self.key_bytes = NO_KEY

    def no_key_error(self, what: str) -> NoKeyContextError:
        """The error for keyed access without a current key."""
        return NoKeyContextError(
            f"{what} was used without a current key in {self.description or 'this operator'}: "
            f"keyed state and timers are only available in process_element and on_timer of a "
            f"keyed function (not in open, close or on the broadcast side)"
        )
