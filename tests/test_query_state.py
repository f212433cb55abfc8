"""Point lookups (``weir.query_state``): the same rows as reading the whole state, for
the given keys only, over every checkpoint kind of both backends; only the keys'
key groups are read (bytes counted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import weir
from test_read_state import KEYS, MODES, Upper, run  # type: ignore[import-not-found]
from weir import CheckpointCoordinator, ConfigurationError, ValueStateDescriptor
from weir.checkpoint.format import METADATA_FILE, KeyedChangelogHandle, KeyedFullHandle
from weir.checkpoint.storage import storage_counts
from weir.state.keygroups import assign_to_key_group
from weir.testing import KeyedOperatorHarness

STATES = ["count", "seen", "by_tag", "total", "mean", "note", "recent", "tags"]


def rows(frame: Any) -> list[tuple[Any, ...]]:
    return sorted(frame.itertuples(index=False, name=None), key=repr)


@pytest.mark.parametrize(("backend", "mode"), MODES)
def test_a_lookup_returns_exactly_the_keys_rows_of_the_whole_state(
    tmp_path: Path, backend: str, mode: str
) -> None:
    _, url = run(tmp_path, backend, mode)
    wanted = ["a", ("x", 1), "never-seen"]
    whole = weir.read_state(url, serializers=[Upper()])
    for name in STATES:
        everything = whole.keyed_state("everything", name)
        expected = everything[everything["key"].map(lambda k: k in wanted)]
        found = weir.query_state(url, "everything", name, wanted, serializers=[Upper()])
        assert list(found.columns) == list(everything.columns)
        assert rows(found) == rows(expected), name
        assert {k for k in found["key"]} == {"a", ("x", 1)}
    # a coordinator root: its latest checkpoint
    assert weir.query_state(tmp_path / "chk", "everything", "count", [7])["value"].tolist() == [3]


COUNT = ValueStateDescriptor[int]("count")


class Count(weir.KeyedProcessFunction[Any, Any]):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: Any, ctx: Any) -> None:
        self.count.update((self.count.value() or 0) + 1)


@pytest.mark.parametrize("mode", ["full", "changelog"])
def test_a_lookup_reads_only_its_key_group_of_each_file(tmp_path: Path, mode: str) -> None:
    coord = CheckpointCoordinator(tmp_path / "chk")
    with KeyedOperatorHarness(Count(), lambda v: v, uid="c", max_parallelism=64) as h:
        h.process_elements(range(20_000))
        take = h.checkpoint(coord, mode=mode)
        h.process_elements(range(0, 20_000, 7))  # a delta in changelog mode
        take = h.checkpoint(coord, mode=mode)
    handle = take.metadata.operators["c"].subtasks[0].keyed
    files = ([handle] if isinstance(handle, KeyedFullHandle) else
             [handle.base, *handle.deltas] if isinstance(handle, KeyedChangelogHandle) else [])
    assert files and (mode == "full" or len(files) > 1)
    key = 7 * 1763
    group = assign_to_key_group(key, 64)
    metadata = (tmp_path / "chk" / take.directory / METADATA_FILE).stat().st_size
    expected = metadata + sum(10 + f.key_groups[group][1] for f in files if group in f.key_groups)
    before = storage_counts()
    found = weir.query_state(take.url, "c", "count", [key])
    read = storage_counts() - before
    assert found["value"].tolist() == [2]  # counted again by the second pass
    assert read.read_bytes == expected
    assert read.read_bytes * 20 < sum(f.file.size for f in files)


def test_an_unknown_state_names_the_keyed_states(tmp_path: Path) -> None:
    _, url = run(tmp_path, "hashmap", "full")
    with pytest.raises(ConfigurationError, match=r"no keyed state 'nope'.*'count'"):
        weir.query_state(url, "everything", "nope", ["a"])
    assert weir.query_state(url, "everything", "count", []).empty
    assert len(KEYS) == 5
