"""The demo verifies itself against an oracle; the CLI answers key-group questions."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from weir import StateTtlConfig, ValueStateDescriptor
from weir.cli import app
from weir.examples.fraud import (
    CATEGORY_LIMITS,
    CardFraudDetector,
    FraudDetector,
    InvalidTransaction,
    oracle_alerts,
)
from weir.examples.fraud_job import WATERMARK_DELAY_MS
from weir.examples.fraud_stream import Expected, Stream, generate, oracle
from weir.examples.fraud_verify import state_checks
from weir.state.keygroups import assign_key_to_parallel_operator, assign_to_key_group
from weir.testing import KeyedBroadcastOperatorHarness, KeyedOperatorHarness


def test_demo_stream_has_fraud_out_of_order_events_and_invalid_records() -> None:
    stream = generate(20_000, cards=300, seed=3)
    expected = oracle(stream)
    rules = {rule for _, rule in expected.alerts}
    assert rules == {"small-then-large", "over-category-limit"}
    assert expected.dead and expected.unmatched
    times = [t["ts"] for t in stream.events if t["ts"] is not None]
    assert any(b < a for a, b in itertools.pairwise(times))  # out of order
    assert generate(20_000, cards=300, seed=3).events == stream.events  # deterministic


def _simulate(
    stream: Stream, expected: Expected, seed: int
) -> tuple[dict[tuple[str, str], tuple[Any, ...]], set[str], int]:
    """CardFraudDetector as weir's Spark runtime drives it, in one harness: random
    micro-batch cuts, records in a random order within each batch, the watermark of a
    batch from the event times of the batches before it."""
    rng = random.Random(seed)
    harness = KeyedBroadcastOperatorHarness(
        CardFraudDetector(), lambda t: t["card_id"], state_backend="hashmap",
        broadcast_state_descriptors=[CATEGORY_LIMITS],
    )
    harness.open()
    for rules in stream.rules:
        for rule in rules:
            harness.process_broadcast_element(rule)
    alerts: list[dict[str, Any]] = []
    dead: set[str] = set()
    events, top = stream.events, None
    start = 0
    while start < len(events):
        end = start + rng.randint(1, 3_000)
        batch = events[start:end]
        rng.shuffle(batch)
        if top is not None:
            alerts += harness.advance_watermark(top - WATERMARK_DELAY_MS)
        for txn in batch:
            if txn["card_id"] is None:
                dead.add(txn["txn_id"])
                continue
            try:
                alerts += harness.process_element(txn, txn["ts"])
            except InvalidTransaction:
                dead.add(txn["txn_id"])
        known = [t["ts"] for t in batch if t["ts"] is not None]
        top = max([*known, *([top] if top is not None else [])])
        start = end
    got = {(a["txn_id"], a["rule"]): (a["card_id"], a["amount"], a["ts_ms"]) for a in alerts}
    assert len(got) == len(alerts)  # no alert twice
    checks = state_checks(harness, expected, harness.watermark)
    harness.close()
    assert [(c.what, c.lost, c.duplicated, c.wrong) for c in checks] == [
        (c.what, 0, 0, 0) for c in checks
    ]
    return got, dead, harness.watermark


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_card_fraud_detector_equals_the_oracle_for_any_batching_and_arrival_order(
    seed: int,
) -> None:
    """The property the Spark demo relies on: alerts and final state do not depend on
    micro-batch boundaries, the order within a batch or when timers fire."""
    stream = generate(12_000, cards=150, seed=seed)
    expected = oracle(stream)
    alerts, dead, watermark = _simulate(stream, expected, seed)
    assert alerts == expected.alerts
    assert dead == expected.dead
    assert watermark > 0 and expected.timers(watermark)


def test_fraud_detector_alerts_equal_its_oracle() -> None:
    """The original walkthrough detector (in order, the watermark at each record)."""
    rng = random.Random(5)
    stream, ts = [], 1_700_000_000_000
    for _ in range(5_000):
        ts += rng.randint(1, 400)
        card = f"card-{rng.randrange(50):02d}"
        amount = rng.choice([round(rng.uniform(0.01, 0.99), 2), round(rng.uniform(501, 900), 2),
                             round(rng.uniform(1, 300), 2), round(rng.uniform(1, 300), 2)])
        stream.append({"card": card, "ts": ts, "amount": amount, "merchant": "m1"})
    with KeyedOperatorHarness(FraudDetector(), lambda t: t["card"]) as h:
        got = []
        for txn in stream:
            got += h.advance_watermark(txn["ts"] - 1)
            got += h.process_element(txn, timestamp=txn["ts"])
    want = oracle_alerts(stream)
    assert want and [(a["card"], a["at"]) for a in got] == want


@pytest.mark.spark
@pytest.mark.slow  # (a fault run of its own driver: started first)
def test_make_demo_survives_kill_9_exactly_once(tmp_path: Path) -> None:
    """``make demo`` end to end, smaller: Spark job killed with SIGKILL in the middle
    of a batch, restarted from its checkpoints, verified against the oracle."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "weir.examples.fraud_demo", "--events", "6000", "--cards",
         "300", "--files", "6", "--files-per-trigger", "2", "--crash-batch", "1",
         "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "160"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "kill -9" in output
    assert "lost = 0, duplicated = 0, wrong = 0, state mismatches = 0" in output
    print(f"demo test took {time.perf_counter() - started:.1f} s")


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


def test_readme_harness_quick_start_runs_as_written() -> None:
    """The README's harness quick start runs, and the restored harness holds the
    snapshotted count."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    namespace: dict[str, Any] = {}
    exec(block, namespace)
    restored = namespace["h"]
    assert restored.state_of("ann", ValueStateDescriptor("count", ttl=StateTtlConfig(
        ttl_ms=3_600_000))) == 1
    restored.close()


def test_readme_continuous_quick_start_runs_as_pasted_twice_from_an_empty_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's continuous quick start prints its result; a second run continues
    from the storage's last checkpoint and adds nothing."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    (block,) = re.findall(r"```python continuous\n(.*?)```", readme, re.S)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        exec(block, {"__name__": "__main__"})
        assert capsys.readouterr().out.splitlines()[-1] == "[(0, 1000), (1, 1000), (2, 1000)]"
    from weir.connectors import read_stream_sink

    assert len(read_stream_sink(tmp_path / "quickstart" / "continuous-out")) == 10_000


def test_the_readme_stays_a_readme() -> None:
    """What a user reads: at most about 300 lines, no run history, no status lines."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    for stale in ("this session", "not yet on Spark", "Status:", "preview"):
        assert stale not in readme, stale


def test_limits_at_watermark_do_not_depend_on_when_the_rules_arrive() -> None:
    """The continuous demo's detector: transactions arrive before the rules that apply
    to them (rules and transactions flow at once there); as long as the rules come
    before the watermark passes the transactions, alerts and state equal the oracle."""
    stream = generate(12_000, cards=150, seed=4)
    expected = oracle(stream)
    harness = KeyedBroadcastOperatorHarness(
        CardFraudDetector(limits_at_watermark=True), lambda t: t["card_id"],
        state_backend="hashmap", broadcast_state_descriptors=[CATEGORY_LIMITS])
    harness.open()
    alerts: list[dict[str, Any]] = []
    for txn in stream.events:
        if txn["card_id"] is not None:
            with contextlib.suppress(InvalidTransaction):
                alerts += harness.process_element(txn, txn["ts"])
    assert not [a for a in alerts if a["rule"] == "over-category-limit"]  # none yet
    for rules in reversed(stream.rules):  # the newest version first, too
        for rule in rules:
            harness.process_broadcast_element(rule)
    alerts += harness.advance_watermark(2**63 - 1)
    got = {(a["txn_id"], a["rule"]): (a["card_id"], a["amount"], a["ts_ms"]) for a in alerts}
    assert len(got) == len(alerts) and got == expected.alerts
    checks = state_checks(harness, expected, harness.watermark)
    assert not harness.event_time_timers()
    harness.close()
    assert [(c.what, c.lost, c.duplicated, c.wrong) for c in checks] == [
        (c.what, 0, 0, 0) for c in checks]


def test_the_continuous_demo_survives_kill_9_exactly_once(tmp_path: Path) -> None:
    """``python -m weir.examples.fraud_continuous``, smaller: one task process of the
    detector killed with SIGKILL after two checkpoints, restarted, verified."""
    result = subprocess.run(
        [sys.executable, "-m", "weir.examples.fraud_continuous", "--events", "30000",
         "--cards", "400", "--files", "8", "--kill-after", "2", "--work",
         str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "160"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "kill -9 task fraud-detector[" in output
    assert ("lost = 0, duplicated = 0, wrong = 0, state mismatches = 0, kills = 1, "
            "restarts = 1") in output
