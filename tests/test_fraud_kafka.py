"""``python -m weir.examples.fraud_kafka``: the fraud demo with Kafka in and out, on a
broker the example starts itself (noida-db). Run as the user runs it, with and without
``--kill`` (a detector task killed with SIGKILL mid-run, the job restarting from its
checkpoint): it must exit 0, say "exactly once: yes", put exactly the oracle's number
of alerts in the ``alerts`` topic, restart as often as it was killed, and leave no
broker and no work directory behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


# (make test runs the kill: the run without it is the same job, less the restart)
@pytest.mark.parametrize("kill", [True, False] if os.environ.get("WEIR_SOAK") else [True],
                         ids=["kill-9", "clean"][:2 if os.environ.get("WEIR_SOAK") else 1])
def test_the_kafka_fraud_demo_is_exactly_once(tmp_path: Path, kill: bool) -> None:
    work = tmp_path / "work"
    result = subprocess.run(
        [sys.executable, "-m", "weir.examples.fraud_kafka", "--work", str(work),
         *(["--kill"] if kill else [])],
        capture_output=True, text=True, timeout=240, env={**os.environ, "COLUMNS": "160"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "exactly once: yes" in output, output
    alerts = re.search(r"alerts out: +([\d,]+) \(oracle: ([\d,]+)\)", output)
    assert alerts is not None, output
    assert alerts[1] == alerts[2] and int(alerts[1].replace(",", "")) > 0, output
    assert re.search(rf"kills: +{int(kill)}, restarts: {int(kill)}\b", output), output
    assert ("kill -9 task fraud-detector[" in output) is kill, output
    assert not work.exists(), "the work directory was left behind"
    broker = re.search(r"noida-db on (127\.0\.0\.1:\d+)", output)
    assert broker is not None, output
    leftover = subprocess.run(["pgrep", "-f", "--", f"--kafka-port {broker[1].split(':')[1]} "],
                              capture_output=True, text=True)
    assert leftover.stdout == "", f"the example's broker still runs: {leftover.stdout}"
