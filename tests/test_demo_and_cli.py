"""The demo verifies itself against an oracle; the CLI answers key-group questions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from weir import StateTtlConfig, ValueStateDescriptor
from weir.cli import app
from weir.examples.fraud import oracle_alerts
from weir.examples.fraud_demo import main as demo_main
from weir.examples.fraud_demo import transactions
from weir.state.keygroups import assign_key_to_parallel_operator, assign_to_key_group


def test_demo_alerts_equal_the_oracle_across_a_rescale_and_backend_switch() -> None:
    assert demo_main() == 0


def test_demo_stream_contains_fraud_for_the_oracle_to_find() -> None:
    assert len(oracle_alerts(transactions(5_000, cards=50))) > 0


def test_cli_keygroup_prints_group_and_owner() -> None:
    result = CliRunner().invoke(app, ["keygroup", "card-42", "-m", "128", "-p", "3"])
    assert result.exit_code == 0, result.output
    group = assign_to_key_group("card-42", 128)
    owner = assign_key_to_parallel_operator("card-42", 128, 3)
    row = next(line for line in result.output.splitlines() if "card-42" in line)
    assert f" {group} " in row and f" {owner} " in row


def test_cli_parses_json_keys_as_tuples() -> None:
    result = CliRunner().invoke(app, ["keygroup", '["a", 1]'])
    assert result.exit_code == 0, result.output
    assert f" {assign_to_key_group(('a', 1), 128)} " in result.output


def test_cli_default_max_parallelism_follows_flink() -> None:
    result = CliRunner().invoke(app, ["default-max-parallelism", "100"])
    assert result.exit_code == 0
    assert result.output.strip() == "256"


def test_readme_quick_start_runs_as_written(tmp_path: Path) -> None:
    """The README's code blocks run top to bottom (paths moved under tmp_path) and
    the restored harness holds the checkpointed count."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) >= 2
    namespace: dict[str, Any] = {}
    for block in blocks:
        exec(block.replace("/tmp/", f"{tmp_path}/"), namespace)
    restored = namespace["h"]
    assert restored.state_of("ann", ValueStateDescriptor("count", ttl=StateTtlConfig(
        ttl_ms=3_600_000))) == 1
    restored.close()
    assert (tmp_path / "savepoints" / "sp-1" / "_metadata").exists()
