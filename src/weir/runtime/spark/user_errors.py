"""Which exceptions are the user's function's: raised in or under a method of its class
(not by weir's code around the call), and not weir's own errors.

The process pass reports those as a :class:`~weir.errors.UserFunctionError` (the
user's exception first, then where); any other exception is weir's and fails the task
as it is.
"""

from __future__ import annotations

from types import CodeType
from typing import Any

from weir.errors import WeirError
from weir.runtime.batch_function import BatchFunctionAdapter

__all__ = ["raised_by_user", "user_codes"]

_USER_CODES: dict[type, frozenset[CodeType]] = {}


def user_codes(cls: type) -> frozenset[CodeType]:
    """The code of every method the user's function class defines or inherits from a
    class that is not weir's API (``weir.api``: the base classes)."""
    found = _USER_CODES.get(cls)
    if found is not None:
        return found
    codes = set()
    for klass in cls.__mro__:
        if klass is object or klass.__module__.startswith("weir.api"):
            continue
        for value in vars(klass).values():
            function = getattr(value, "__func__", value)  # (static and class methods)
            code = getattr(function, "__code__", None)
            if isinstance(code, CodeType):
                codes.add(code)
    found = _USER_CODES[cls] = frozenset(codes)
    return found


def raised_by_user(function: Any, exc: BaseException) -> bool:
    """Whether ``exc`` is the user's ``function``'s to report as a
    :class:`~weir.errors.UserFunctionError`: not weir's own (a :class:`WeirError` says
    what it is), and raised in or under a method of the function's class (a batch
    function's own class, not its adapter's)."""
    if isinstance(exc, WeirError):
        return False
    user = function.function if isinstance(function, BatchFunctionAdapter) else function
    codes = user_codes(type(user))
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False
