"""Shared fixtures: every behaviour test runs over both state backends."""

from __future__ import annotations

import pytest

BACKENDS = ("hashmap", "rocksdb")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The name of a state backend; tests using it run once per backend."""
    return str(request.param)
