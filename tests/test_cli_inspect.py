"""``weir checkpoint inspect``: a person's summary by default (id, kind, times,
operators with parallelism, max parallelism, key groups, state entries, bytes and
files), the whole detail as JSON with ``--json``, and nothing cut at 80 columns when
the output is not a terminal."""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from weir import (
    CheckpointCoordinator,
    KeyedProcessFunction,
    MapStateDescriptor,
    ValueStateDescriptor,
    take_checkpoint,
)
from weir.cli.common import readable_size, readable_time
from weir.state.keygroups import assign_key_to_parallel_operator
from weir.testing import KeyedOperatorHarness

WEIR = str(Path(sys.executable).parent / "weir")
MAXP = 32
#: longer than a terminal line: nothing may cut it
UID = "fraud-detector-with-a-rather-long-operator-uid-" + "x" * 60
COUNT = ValueStateDescriptor[int]("count_of_records_seen_for_this_key_so_far_in_the_stream")
TAGS = MapStateDescriptor[str, int]("tags")


class Tagged(KeyedProcessFunction[tuple[str, int], Any]):
    """A count per key and a map entry per (key, tag)."""

    def process_element(self, value: tuple[str, int], ctx: Any) -> Any:
        state = ctx.get_state(COUNT)
        state.update((state.value() or 0) + 1)
        ctx.get_map_state(TAGS).put(f"t{value[1] % 3}", value[1])
        return ()


def weir_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The console script with its output piped (not a terminal) and no COLUMNS."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run([WEIR, *args], capture_output=True, text=True, timeout=120,
                          env=env)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A checkpoint of ``Tagged`` at parallelism 2 over 50 keys (50 counts, 150 tags)."""
    root = tmp_path_factory.mktemp("inspect")
    coord = CheckpointCoordinator(root / "chk")
    hs = [KeyedOperatorHarness(Tagged(), operator.itemgetter(0), uid=UID,
                               max_parallelism=MAXP, parallelism=2, subtask_index=i)
          for i in range(2)]
    for h in hs:
        h.open()
    try:
        for n in range(300):
            key = f"key-{n % 50}"
            hs[assign_key_to_parallel_operator(key, MAXP, 2)].process_element((key, n))
        completed = take_checkpoint(coord, [h.checkpointer(coord.storage) for h in hs])
    finally:
        for h in hs:
            h.close()
    return completed


def test_the_default_view_is_a_summary_a_person_reads(checkpoint: Any) -> None:
    meta = checkpoint.metadata
    shown = weir_cli("checkpoint", "inspect", checkpoint.url)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    lines = out.splitlines()
    assert f"checkpoint {meta.checkpoint_id} at {checkpoint.url}" in out
    assert readable_time(meta.completion_timestamp_ms) in out
    assert f"{readable_size(meta.total_bytes)} in {len(meta.files())} files" in out
    # the operators: uid, parallelism, max parallelism, key groups, entries, size, files
    (row,) = [line for line in lines if UID in line and "200" in line]
    op = meta.operators[UID]
    for cell in ("2", "32", "200", readable_size(sum(s.stats.bytes for s in op.subtasks)),
                 str(sum(len(s.files()) for s in op.subtasks))):
        assert f" {cell} " in row, (cell, row)
    assert "state entries" in out
    # one row per subtask, with its key groups and entries
    for sub in op.subtasks:
        (sub_row,) = [line for line in lines if f" {sub.key_group_range} " in line]
        assert f" {sub.stats.entries} " in sub_row
    assert sum(s.stats.entries for s in op.subtasks) == 200  # 50 counts + 150 tags
    assert COUNT.name in out
    assert f"all {len(meta.files())} files verified" in out


def test_nothing_is_cut_at_80_columns(checkpoint: Any) -> None:
    shown = weir_cli("checkpoint", "inspect", checkpoint.url)
    assert shown.returncode == 0, shown.stderr
    assert "…" not in shown.stdout
    assert any(UID in line for line in shown.stdout.splitlines())  # on one line
    assert any(COUNT.name in line for line in shown.stdout.splitlines())
    assert max(len(line) for line in shown.stdout.splitlines()) > 80
    listed = weir_cli("checkpoint", "list", str(Path(checkpoint.url).parent))
    assert listed.returncode == 0, listed.stderr
    assert "…" not in listed.stdout and any(UID in line for line in listed.stdout.splitlines())


def test_json_is_the_whole_detail(checkpoint: Any) -> None:
    meta = checkpoint.metadata
    shown = weir_cli("checkpoint", "inspect", checkpoint.url, "--json")
    assert shown.returncode == 0, shown.stderr
    (doc,) = json.loads(shown.stdout)
    assert doc["url"] == checkpoint.url
    assert (doc["kind"], doc["checkpoint_id"]) == ("checkpoint", meta.checkpoint_id)
    assert doc["completion_timestamp_ms"] == meta.completion_timestamp_ms
    assert doc["completed"] == readable_time(meta.completion_timestamp_ms)
    assert (doc["bytes"], doc["files"]) == (meta.total_bytes, len(meta.files()))
    assert doc["state_entries"] == 200
    op = doc["operators"][UID]
    assert (op["parallelism"], op["max_parallelism"], op["key_groups"]) == (2, 32, 32)
    assert op["state_entries"] == 200
    assert [s["key_groups"] for s in op["subtasks"]] == [[0, 15], [16, 31]]
    assert sum(s["state_entries"] for s in op["subtasks"]) == 200
    assert {st["name"] for st in op["subtasks"][0]["states"]} == {COUNT.name, TAGS.name}
    assert doc["verified"] == {"files": len(meta.files()), "bad": []}
    # the metadata as written, every file with its size and checksum
    files = {f["path"] for s in doc["metadata"]["operators"][UID]["subtasks"]
             for f in [s["keyed"]["file"]]}
    assert files == {f.path for f in meta.files()}


def test_json_names_a_corrupt_file_and_exits_1(tmp_path: Path) -> None:
    coord = CheckpointCoordinator(tmp_path / "chk")
    with KeyedOperatorHarness(Tagged(), operator.itemgetter(0)) as h:
        h.process_elements([(f"k{i}", i) for i in range(20)])
        completed = h.checkpoint(coord)
    (victim,) = completed.metadata.files()
    (tmp_path / "chk" / victim.path).write_bytes(b"garbage")
    shown = weir_cli("checkpoint", "inspect", completed.url, "--json")
    assert shown.returncode == 1
    (doc,) = json.loads(shown.stdout)
    assert doc["verified"]["files"] == 1
    assert len(doc["verified"]["bad"]) == 1 and victim.path in doc["verified"]["bad"][0]
