"""One job, either runtime (issue 39): the card-fraud job of ``make demo`` written once
(:mod:`weir.examples.fraud_anywhere`: the same function, the same ``weir.JobConfig``,
the same SQLite alert table, the same dead-letter reader) runs on the micro-batch
runtime, on the continuous runtime locally and on the continuous runtime hosted on
Spark, and each run is exactly-once against the plain-Python oracle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from weir.examples import fraud_anywhere
from weir.examples.fraud_continuous import write_files
from weir.examples.fraud_stream import generate, oracle

EVENTS, CARDS, SEED = 6_000, 200, 7


@pytest.mark.spark
def test_the_fraud_job_written_once_is_exactly_once_on_every_runtime(
    spark: Any, tmp_path: Path
) -> None:
    stream = generate(EVENTS, CARDS, SEED)
    expected = oracle(stream)
    assert expected.alerts and expected.dead
    events, rules = write_files(stream, tmp_path / "input", files=8)
    results: dict[str, list[dict[str, Any]]] = {}
    # the continuous runtime on Spark needs a slot per task (5) at once: its own
    # application, local[5] (this process's session is local[2]); same module, same job
    hosted = subprocess.Popen(
        [sys.executable, "-m", "weir.examples.fraud_anywhere", "--runtime",
         "continuous-spark", "--work", str(tmp_path / "continuous-spark"), "--events",
         str(EVENTS), "--cards", str(CARDS), "--seed", str(SEED)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for runtime in ("micro-batch", "continuous"):
            work = tmp_path / runtime
            work.mkdir()
            config = fraud_anywhere.run(runtime, work, events, rules, len(stream.events),
                                        spark)
            results[runtime] = [c.__dict__ for c in fraud_anywhere.verify(config, work,
                                                                          expected)]
        out, err = hosted.communicate(timeout=900)
    finally:
        hosted.kill()
    assert hosted.returncode in (0, 1), err[-3000:]
    results["continuous-spark"] = json.loads(out.strip().splitlines()[-1])["checks"]
    for runtime, checks in results.items():
        for c in checks:
            print(f"{runtime}: {c['what']}: expected {c['expected']}, got {c['got']}, "
                  f"L={c['lost']} D={c['duplicated']} wrong={c['wrong']}")
    assert {runtime: [(c["what"], c["got"], c["lost"], c["duplicated"], c["wrong"])
                      for c in checks] for runtime, checks in results.items()} == {
        runtime: [("alerts in the sink", len(expected.alerts), 0, 0, 0),
                  ("dead letters", len(expected.dead), 0, 0, 0)]
        for runtime in fraud_anywhere.RUNTIMES}
