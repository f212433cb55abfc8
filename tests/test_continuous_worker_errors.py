"""A task whose user function fails says so in one line on its stderr — no traceback
per failed task attempt — while the job's driver gets the whole error: the
``JobFailedError`` the program sees is chained from the user's exception, rebuilt,
with the task's traceback as a note.

The job runs in a fresh interpreter, so that its task processes (forked by a zygote
that process starts) write to a stderr this test reads."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import sys
    from typing import Any

    import weir
    from weir.connectors import FileSink, SequenceSource
    from weir.errors import JobFailedError
    from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

    TABLE = {k: k * 10 for k in range(10) if k != 7}

    class Lookup(weir.KeyedProcessFunction[int, list[Any]]):
        def process_element(self, value: int, ctx: Any) -> Any:
            yield [value, TABLE[value % 10]]

    base = sys.argv[1]
    env = StreamEnvironment(weir.JobConfig(
        base + "/chk", parallelism=2, max_parallelism=32,
        checkpointing=CheckpointConfig(interval=200), restart_strategy=RESTART))
    (env.from_source(SequenceSource(1_000), uid="numbers")
        .key_by(lambda v: v % 10)
        .process(Lookup(), uid="lookup")
        .sink_to(FileSink(base + "/out"), uid="sink"))
    try:
        env.execute("lookup", timeout="120 s")
    except JobFailedError as exc:
        cause = exc.__cause__
        print("FIRST:", str(exc).splitlines()[0])
        print("CAUSE:", type(cause).__name__, cause)
        print("NOTES:", "\\n".join(getattr(cause, "__notes__", [])))
    else:
        print("NO ERROR")
""")


def failures(stderr: str) -> list[str]:
    """The lines of ``stderr`` in which a task says it failed."""
    return [line for line in stderr.splitlines() if re.fullmatch(
        r"weir: task \S+ \(attempt \d+\) failed: .* \(reported to the job's driver\)", line)]


def run_job(tmp_path: Path, restart: str) -> tuple[str, str]:
    """The script's stdout and stderr (its task processes' stderr with it)."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.replace("RESTART", restart))
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr


def test_a_failed_task_writes_one_line_and_the_driver_gets_the_traceback(
    tmp_path: Path
) -> None:
    out, err = run_job(tmp_path, "RestartStrategy.no_restart()")
    assert "FIRST:" in out and "KeyError: 7" in out.split("FIRST:", 1)[1].splitlines()[0]
    assert "CAUSE: KeyError 7" in out
    notes = out.split("NOTES:", 1)[1]
    assert "raised in task lookup[" in notes and "TABLE[value % 10]" in notes
    assert "Traceback" not in err, err[-3000:]
    failed = failures(err)
    assert len(failed) == 1, err[-3000:]
    assert failed[0].startswith("weir: task lookup[") and "KeyError: 7" in failed[0]
    assert "reported to the job's driver" in failed[0]


def test_every_failed_attempt_writes_one_line(tmp_path: Path) -> None:
    out, err = run_job(tmp_path, 'RestartStrategy.fixed_delay(attempts=2, delay="10 ms")')
    assert "CAUSE: KeyError 7" in out
    assert "Traceback" not in err, err[-3000:]
    failed = failures(err)
    assert [line.split("(attempt ")[1][0] for line in failed] == ["0", "1", "2"], err[-3000:]
