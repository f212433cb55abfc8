"""Where weir's endpoints may listen: every one (a continuous job's query server, the
``weir ui`` page) binds to loopback by default and refuses any other address without a
shared secret (the security rule of ARCHITECTURE.md). Shared by the runtimes and the
command line, so the rule is written once."""

from __future__ import annotations

import ipaddress

from weir.errors import ConfigurationError

__all__ = ["is_loopback", "require_secret"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_secret(host: str, secret: str | None, what: str, fix: str) -> None:
    """Refuse serving ``what`` on a non-loopback ``host`` without ``secret``; ``fix``
    says how to give one."""
    if not is_loopback(host) and not secret:
        raise ConfigurationError(
            f"{what} on {host!r} (not a loopback address) needs a shared secret: {fix}, "
            f"or bind to 127.0.0.1")
