"""The ``weir`` command line over checkpoints, through its console script: listing a
location's checkpoints, inspecting the latest of a location, showing and exporting
state (JSON, parquet, CSV, JSON lines), and clear failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from test_query_state import Count  # type: ignore[import-not-found]
from test_read_state import KEYS, run  # type: ignore[import-not-found]
from weir import CheckpointCoordinator
from weir.testing import KeyedOperatorHarness

WEIR = str(Path(sys.executable).parent / "weir")


def weir(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([WEIR, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "300"})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("cli")
    coord, _ = run(root, "rocksdb", "incremental")
    return root / "chk", coord


def test_checkpoint_list_shows_every_checkpoint_with_readable_times(
    checkpoints: tuple[Path, Any]
) -> None:
    root, coord = checkpoints
    done = coord.completed_checkpoints
    listed = weir("checkpoint", "list", str(root), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["checkpoint_id"], r["status"], r["operators"]) for r in rows] == [
        (c.checkpoint_id, "completed", ["everything"]) for c in done]
    assert [r["state_size"] for r in rows] == [c.metadata.total_bytes for c in done]
    # one statistics model: the rows are what weir ui shows (and JobClient.checkpoints())
    page = json.loads(weir("ui", str(root), "--json").stdout)
    assert rows == page["checkpoints"]
    table = weir("checkpoint", "list", str(root))
    assert table.returncode == 0, table.stderr
    assert "completed" in table.stdout and "Z" in table.stdout  # a UTC time, not raw ms
    assert str(done[-1].metadata.completion_timestamp_ms) not in table.stdout


def test_checkpoint_inspect_of_a_location_shows_its_latest(
    checkpoints: tuple[Path, Any]
) -> None:
    root, coord = checkpoints
    shown = weir("checkpoint", "inspect", str(root))
    assert shown.returncode == 0, shown.stderr
    latest = coord.completed_checkpoints[-1]
    assert f"checkpoint {latest.checkpoint_id} at {latest.url}" in shown.stdout
    assert "files verified" in shown.stdout


def test_state_show_looks_up_keys_and_lists_all(checkpoints: tuple[Path, Any]) -> None:
    root, _ = checkpoints
    one = weir("state", "show", str(root), "--uid", "everything", "--state", "count",
               "a", '["x", 1]', "--json")
    assert one.returncode == 0, one.stderr
    assert sorted(json.loads(one.stdout), key=repr) == sorted(
        [{"key": "a", "value": 6}, {"key": ["x", 1], "value": 3}], key=repr)
    everything = weir("state", "show", str(root), "--uid", "everything", "--state", "seen")
    assert everything.returncode == 0, everything.stderr
    assert f"keyed state 'seen' of 'everything': {3 * len(KEYS) + 3} rows" in (
        everything.stdout)
    timers = weir("state", "show", str(root), "--uid", "everything", "--scope", "timers",
                  "--json", "--limit", "0")
    assert {r["domain"] for r in json.loads(timers.stdout)} == {"event", "processing"}
    rules = weir("state", "show", str(root), "--uid", "everything", "--scope", "broadcast",
                 "--state", "rules", "--json")
    assert {r["key"]: r["value"] for r in json.loads(rules.stdout)} == {"limit": 5, "floor": -1}


@pytest.mark.parametrize("file_format", ["csv", "jsonl"])
def test_state_export_writes_every_row(checkpoints: tuple[Path, Any], tmp_path: Path,
                                       file_format: str) -> None:
    root, _ = checkpoints
    out = tmp_path / f"count.{file_format}"
    done = weir("state", "export", str(root), "--uid", "everything", "--state", "count",
                "--format", file_format, "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"wrote {len(KEYS)} rows" in done.stdout
    frame = pd.read_csv(out) if file_format == "csv" else pd.read_json(out, lines=True)
    assert sorted(frame["value"].tolist()) == [3, 3, 3, 3, 6]


def test_state_commands_fail_clearly(checkpoints: tuple[Path, Any], tmp_path: Path) -> None:
    root, _ = checkpoints
    missing = weir("state", "show", str(root), "--uid", "everything", "--state", "nope")
    assert missing.returncode == 1 and "no keyed state 'nope'" in missing.stderr
    (tmp_path / "empty").mkdir()
    empty = weir("checkpoint", "list", str(tmp_path / "empty"))
    assert empty.returncode == 1 and "holds no checkpoint" in empty.stderr
    for command in (["checkpoint", "list"], ["checkpoint", "inspect"], ["state", "show"],
                    ["state", "export"]):
        helped = weir(*command, "--help")
        assert helped.returncode == 0 and "Example: weir" in helped.stdout, command


def test_state_export_to_parquet_needs_one_type_per_column(
    checkpoints: tuple[Path, Any], tmp_path: Path
) -> None:
    root, _ = checkpoints
    mixed = weir("state", "export", str(root), "--uid", "everything", "--state", "count",
                 "--format", "parquet", "-o", str(tmp_path / "mixed.parquet"))
    assert mixed.returncode == 1  # keys "a", 7 and ("x", 1) in one column
    assert "column key" in mixed.stderr and "--format jsonl holds any value" in mixed.stderr
    coord = CheckpointCoordinator(tmp_path / "chk")
    with KeyedOperatorHarness(Count(), lambda v: v, uid="c") as h:
        h.process_elements([f"k{i % 40}" for i in range(100)])
        h.checkpoint(coord)
    out = tmp_path / "counts.parquet"
    done = weir("state", "export", str(tmp_path / "chk"), "--uid", "c", "--state", "count",
                "--format", "parquet", "-o", str(out))
    assert done.returncode == 0, done.stderr
    frame = pd.read_parquet(out)
    assert dict(zip(frame["key"], frame["value"], strict=True)) == {
        f"k{i}": 3 if i < 20 else 2 for i in range(40)}


def test_savepoint_create_of_a_checkpoint_root_writes_its_latest_state(
    checkpoints: tuple[Path, Any], tmp_path: Path
) -> None:
    import weir as weir_api
    from test_read_state import Upper  # type: ignore[import-not-found]

    root, _ = checkpoints
    made = weir("savepoint", "create", str(root), str(tmp_path / "sp"))
    assert made.returncode == 0, made.stderr
    url = made.stdout.strip()
    saved = weir_api.load_checkpoint(url)
    assert saved.kind is weir_api.CheckpointKind.SAVEPOINT
    latest = weir_api.read_state(str(root), serializers=[Upper()])
    copy = weir_api.read_state(url, serializers=[Upper()])
    for state in ("count", "seen", "by_tag"):
        assert sorted(map(repr, copy.keyed_state("everything", state).values.tolist())) == (
            sorted(map(repr, latest.keyed_state("everything", state).values.tolist())))
    again = weir("savepoint", "create", str(root), str(tmp_path / "sp"))
    assert again.returncode == 1 and "already holds a savepoint" in again.stderr


def test_every_command_shows_an_example_in_its_help() -> None:
    from typer.main import get_command
    from typer.testing import CliRunner

    from weir.cli import app

    def leaves(command: Any, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        subs = getattr(command, "commands", None)
        if not subs:
            return [path]
        return [leaf for name, sub in subs.items() for leaf in leaves(sub, (*path, name))]

    commands = leaves(get_command(app), ())
    assert ("savepoint", "create") in commands and ("dead-letters",) in commands
    runner = CliRunner()
    for path in commands:
        shown = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0 and "Example: weir " + " ".join(path) in shown.output, path


def test_commands_that_move_megabytes_show_their_progress(checkpoints: tuple[Path, Any],
                                                          tmp_path: Path) -> None:
    """Below the threshold (a few MB) nothing; above it a line with the bytes read (the
    threshold lowered here: the fixture's state is small)."""
    from weir.checkpoint.storage import CheckpointStorage, observe_io

    root, _ = checkpoints
    quiet = weir("state", "export", str(root), "--uid", "everything", "--state", "count",
                 "-o", str(tmp_path / "a.jsonl"))
    assert quiet.returncode == 0 and "read" not in quiet.stderr
    env = {**os.environ, "COLUMNS": "300", "WEIR_PROGRESS_MIN_BYTES": "1"}
    for args in (["state", "export", str(root), "--uid", "everything", "--state", "count",
                  "-o", str(tmp_path / "b.jsonl")],
                 ["checkpoint", "inspect", str(root)],
                 ["savepoint", "create", str(root), str(tmp_path / "sp")]):
        loud = subprocess.run([WEIR, *args], capture_output=True, text=True, timeout=120,
                              env=env)
        assert loud.returncode == 0, loud.stderr
        assert ": read " in loud.stderr and "/s)" in loud.stderr, (args, loud.stderr)
    assert "wrote 0 B" not in loud.stderr  # the savepoint's files count as written
    seen: list[tuple[int, int]] = []
    storage = CheckpointStorage(str(tmp_path / "io"))
    with observe_io(lambda r, w: seen.append((r, w))):
        ref = storage.write("x", b"0123456789")
        storage.read(ref)
    storage.read(ref)  # outside the block: not observed
    assert seen == [(0, 10), (10, 0)]
