"""fewer_collections: the young-generation threshold is raised while a task runs and
restored afterwards, also when the body raises, and never lowered."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from weir.runtime.collection import TASK_GEN0_THRESHOLD, fewer_collections


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*before)


def test_the_threshold_is_raised_inside_and_restored_after(
    thresholds: tuple[int, int, int],
) -> None:
    with fewer_collections():
        assert gc.get_threshold() == (TASK_GEN0_THRESHOLD, 10, 10)
        collections = gc.get_stats()[0]["collections"]
        garbage = [[i] for i in range(10_000)]  # 10,000 containers: no young collection
        assert gc.get_stats()[0]["collections"] == collections
        del garbage
    assert gc.get_threshold() == thresholds


def test_the_threshold_is_restored_when_the_body_raises(
    thresholds: tuple[int, int, int],
) -> None:
    with pytest.raises(KeyError), fewer_collections(5_000):
        assert gc.get_threshold()[0] == 5_000
        raise KeyError("x")
    assert gc.get_threshold() == thresholds


def test_a_larger_threshold_or_disabled_collection_is_left_alone(
    thresholds: tuple[int, int, int],
) -> None:
    gc.set_threshold(200_000, 10, 10)
    with fewer_collections(), fewer_collections(1_000):
        assert gc.get_threshold()[0] == 200_000
    assert gc.get_threshold()[0] == 200_000
    gc.set_threshold(0)
    with fewer_collections():
        assert gc.get_threshold()[0] == 0
    assert gc.get_threshold()[0] == 0
