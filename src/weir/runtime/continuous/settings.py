"""Checks of a continuous job's settings, made when the job is built (Flink validates a
job graph before submitting it): a bad value raises
:class:`~weir.errors.ConfigurationError` naming it and what is allowed, before any task
starts — never inside the tasks, where a restart loop would hide it."""

from __future__ import annotations

import math
import os
from typing import TypeVar

import fsspec

from weir.api.durations import legacy_seconds
from weir.errors import ConfigurationError
from weir.runtime.continuous.queries import QueryServerConfig

__all__ = ["check_job_name", "check_query_server", "check_storage_url", "instance_of",
           "timeout_seconds"]

_T = TypeVar("_T")


def timeout_seconds(timeout: object) -> float | None:
    """``execute``'s ``timeout`` in seconds: None (or infinity) for no deadline; a
    duration (``"10 min"``, a timedelta; a bare number is seconds, deprecated)."""
    if timeout is None or timeout == math.inf:
        return None
    if isinstance(timeout, float) and math.isnan(timeout):
        raise ConfigurationError("timeout must be a duration > 0 or None, got nan")
    seconds = legacy_seconds(timeout, "timeout").total_seconds()
    if seconds <= 0:
        raise ConfigurationError(f"timeout must be None (no deadline: the default) or a "
                                 f"duration > 0 ('10 min', a datetime.timedelta); got "
                                 f"{timeout!r}")
    return seconds


def check_job_name(name: object) -> str:
    """``name`` if it can name a job (its work directory and processes)."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"a job name must be a non-empty string, got {name!r}")
    bad = sorted({c for c in name if c in "/\\" or not c.isprintable()})
    if bad:
        raise ConfigurationError(f"job name {name!r} contains {bad}: it names the job's "
                                 f"work directory and processes; use letters, digits, "
                                 f"'-', '_' or '.'")
    return name


def check_storage_url(url: object) -> str:
    """``checkpoint_storage`` as a URL whose filesystem fsspec knows."""
    if not isinstance(url, str | os.PathLike) or not str(url):
        raise ConfigurationError(f"checkpoint_storage must be a non-empty path or URL, got "
                                 f"{url!r}")
    text = str(url)
    for part in text.split("::"):  # (fsspec's chained URLs: simplecache::s3://...)
        protocol, _ = fsspec.core.split_protocol(part)
        if protocol is None:
            continue
        try:
            fsspec.get_filesystem_class(protocol)
        except ValueError:
            raise ConfigurationError(
                f"checkpoint_storage {text!r}: unknown filesystem {protocol!r}; use a local "
                f"path or a URL of a filesystem fsspec knows (fsspec.available_protocols(): "
                f"file, s3, gcs, abfs, hdfs, memory...)") from None
        except ImportError as exc:
            raise ConfigurationError(f"checkpoint_storage {text!r}: the filesystem "
                                     f"{protocol!r} needs a package that is not installed "
                                     f"({exc})") from exc
    return text


def instance_of(value: _T | None, cls: type[_T], name: str, what: str) -> _T:
    """``value`` if it is a ``cls``, ``cls()`` if None."""
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise ConfigurationError(f"{name} must be a {what}, got {type(value).__name__}")
    return value


def check_query_server(config: QueryServerConfig | None) -> QueryServerConfig:
    """The query endpoint's settings, checked (a default one for None)."""
    config = instance_of(config, QueryServerConfig, "query_server",
                       "weir.stream.QueryServerConfig")
    if not isinstance(config.host, str) or not config.host:
        raise ConfigurationError(f"QueryServerConfig.host must be a host name or address, "
                                 f"got {config.host!r}")
    port = config.port
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigurationError(f"QueryServerConfig.port must be an int in [0, 65535] (0: "
                                 f"any free port), got {port!r}")
    if config.secret is not None and (not isinstance(config.secret, str) or not config.secret):
        raise ConfigurationError("QueryServerConfig.secret must be a non-empty string or "
                                 "None (a random one)")
    return config
