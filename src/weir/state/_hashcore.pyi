"""Types of the C fast paths in ``_hashcore.c`` (see the comment at its top)."""

from typing import Any

class KeyCell:
    """Holds the current key's prefixed bytes where C code reads them directly."""

    key_bytes: Any

class TableCore:
    """Fields shared by the hash-map tables' C fast paths."""

    _ctx: Any
    _data: dict[bytes, Any]
    _ok: set[type]
    _key_ok: set[type]
    _dirty: set[bytes] | None

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
