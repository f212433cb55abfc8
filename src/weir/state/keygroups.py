"""Key groups: the unit in which keyed state is partitioned and redistributed.

A keyed operator has ``max_parallelism`` key groups. A key's group is its key hash
(``weir.state.keyhash``: Spark's ``hash()`` of the key as a Spark value, unsigned)
modulo ``max_parallelism``: the same on every machine, interpreter,
``PYTHONHASHSEED`` and runtime, and computable by Spark's own ``hash`` in the JVM.
Python's ``hash()`` is never used. Keys are written as their canonical bytes
(``weir.state.keybytes``; :func:`canonical_key_bytes` and :func:`decode_key` are
re-exported here).

Subtask ``i`` of ``p`` owns the contiguous range
``[ceil(i*M/p), floor(((i+1)*M - 1)/p)]`` and key group ``g`` belongs to subtask
``g*p // M``: Flink's ``KeyGroupRangeAssignment`` formulas, so each subtask owns one
contiguous range and every group belongs to exactly one subtask for any ``p <= M``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from weir.errors import ConfigurationError
from weir.state.keybytes import canonical_key_bytes, decode_key
from weir.state.keyhash import key_hash

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
    "key_group_range_for_operator",
]

#: Largest supported max parallelism (Flink: ``1 << 15``); key groups fit in 2 bytes.
UPPER_BOUND_MAX_PARALLELISM = 1 << 15
#: Smallest default max parallelism (Flink: ``1 << 7``).
DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 1 << 7


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
    def for_subtask(cls, index: int, parallelism: int,
                    max_parallelism: int = 128) -> KeyGroupRange:
        """The key groups subtask ``index`` of ``parallelism`` owns (Flink's
        ``computeKeyGroupRangeForOperatorIndex``)."""
        return key_group_range_for_operator(max_parallelism, parallelism, index)

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


def assign_to_key_group(key: Any, max_parallelism: int) -> int:
    """The key group of ``key``: ``key_hash(key) % max_parallelism`` (raises
    :class:`~weir.errors.StateSerializationError` if ``key`` is not a key)."""
    check_parallelism(1, max_parallelism)
    canonical_key_bytes(key)  # validates the key
    return key_hash(key) % max_parallelism


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
