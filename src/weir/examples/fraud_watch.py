"""Running and watching the demo's Spark job: the child process, its progress,
the sink and checkpoint status, and the kill -9 of its whole process tree."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import Progress, TaskID

from weir.examples.fraud_job import (
    TABLE,
    Paths,
)

# ---------------------------------------------------------------------------- watching


def sink_status(db: Path) -> tuple[list[int], int]:
    """Batch ids the sink committed and the rows they hold (its commit table)."""
    if not db.exists():
        return [], 0
    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            rows = conn.execute(
                "SELECT batch_id, row_count FROM _weir_commits WHERE table_name = ?", (TABLE,)
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:  # not created yet
        return [], 0
    return sorted(int(b) for b, _ in rows), sum(int(n) for _, n in rows)


def staged_rows(db: Path, batch: int) -> int:
    """Rows the sink's tasks staged for ``batch`` (invisible until its commit)."""
    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute(
                "SELECT count(*) FROM _weir_staging WHERE table_name = ? AND batch_id = ?",
                (TABLE, batch),
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return 0
    return int(row[0])


class Checkpoints:
    """Statistics of every completed weir checkpoint, read from the checkpoint
    location while the job runs (only the newest 3 are retained on disk)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen: dict[int, dict[str, Any]] = {}

    def parts(self, batch: int) -> int:
        """Subtasks that have written their state of ``batch``."""
        return len(list(self.root.glob(f"stages/*/queries/*/chk-{batch}/_parts/*.part")))

    def poll(self) -> None:
        from weir import load_checkpoint

        for meta in self.root.glob("stages/*/queries/*/chk-*/_metadata"):
            cid = int(meta.parent.name.removeprefix("chk-"))
            if cid in self.seen:
                continue
            try:
                m = load_checkpoint(meta.parent.as_uri(), verify=False).metadata
            except Exception:  # pruned while we looked
                continue
            subs = [s for op in m.operators.values() for s in op.subtasks]
            self.seen[cid] = {
                "bytes": m.total_bytes, "files": len(m.files()),
                "new_bytes": sum(s.stats.new_bytes for s in subs),
                "sync_ms": max(s.stats.sync_ms for s in subs),
                "async_ms": max(s.stats.async_ms for s in subs),
                "latency_ms": m.completion_timestamp_ms - m.trigger_timestamp_ms,
            }


@dataclass
class Crash:
    """When to kill the job: during ``batch``, once some subtask has written its weir
    state of it and the sink has not committed it (``"state-written"``), or once the
    sink has committed it and Spark has not yet logged the batch as done
    (``"sink-committed"``: Spark replays it, the sink must not write it twice)."""

    batch: int
    point: str = "state-written"


@dataclass
class JobRun:
    """One start of the Spark job (a child process)."""

    number: int
    log: Path
    spawned: float = 0.0
    startup_s: float | None = None
    batches: dict[int, dict[str, Any]] = field(default_factory=dict)
    finished: dict[str, Any] | None = None
    failed: str | None = None
    killed_in: int | None = None
    wall_s: float = 0.0
    returncode: int | None = None


class View:
    """The progress bar and status line."""

    def __init__(self, progress: Progress, total: int) -> None:
        self.progress = progress
        self.task: TaskID = progress.add_task("", total=total, status="")
        self.events: dict[int, int] = {}  # batch -> events (a replayed batch counts once)

    def update(self, run: JobRun, checkpoints: Checkpoints, sink: tuple[list[int], int]) -> None:
        for batch, line in run.batches.items():
            self.events[batch] = line["events"]
        last = max(run.batches, default=None)
        state = ("finished" if run.finished else "starting Spark" if run.startup_s is None
                 else f"batch {last + 1}" if last is not None else "batch 0")
        self.progress.update(
            self.task, completed=sum(self.events.values()),
            description=f"run {run.number}: events",
            status=f"{state} · {len(checkpoints.seen)} checkpoints · {sink[1]:,} alerts "
                   f"committed",
        )


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the JVM, its Python daemons and workers)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen[str]) -> int:
    """SIGKILL the job and everything it started, at once; how many processes."""
    victims = [proc.pid, *_descendants(proc.pid)]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the job's own process group (a new session)
    for pid in victims:  # and the Python daemons, which make process groups of their own
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in victims[1:]):
        time.sleep(0.05)
    return len(victims)


def run_job(
    paths: Paths, number: int, files_per_trigger: int, view: View, checkpoints: Checkpoints,
    crash: Crash | None, timeout_s: float,
) -> JobRun:
    """Start the job and watch it; with ``crash``, kill it at its point (if that
    batch goes by too quickly to catch, in the next one)."""
    run = JobRun(number, paths.work / f"job-run-{number}.log")
    paths.spark_local.mkdir(exist_ok=True)
    env = dict(os.environ, SPARK_LOCAL_DIRS=str(paths.spark_local), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "weir.examples.fraud_job", "--work", str(paths.work),
           "--files-per-trigger", str(files_per_trigger)]
    lines: queue.Queue[str | None] = queue.Queue()
    with run.log.open("w") as log:
        run.spawned = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                cwd=paths.work, env=env, start_new_session=True)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            _watch(run, proc, lines, paths, view, checkpoints, crash, timeout_s)
        finally:
            if proc.poll() is None:  # interrupted: leave nothing running
                kill_tree(proc)
        run.returncode = proc.wait()
        reader.join(timeout=5)
        while not lines.empty():
            line = lines.get_nowait()
            if line is not None:
                _absorb(run, line)
    run.wall_s = time.perf_counter() - run.spawned
    checkpoints.poll()
    view.update(run, checkpoints, sink_status(paths.sink))
    if run.killed_in is None and run.finished is None and run.failed is None:
        run.failed = f"the job exited with status {run.returncode}"
    return run


def _watch(
    run: JobRun, proc: subprocess.Popen[str], lines: queue.Queue[str | None], paths: Paths,
    view: View, checkpoints: Checkpoints, crash: Crash | None, timeout_s: float,
) -> None:
    sink = sink_status(paths.sink)
    last_sink_poll = 0.0
    eof = False
    while True:
        while True:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            if line is None:
                eof = True
                break
            _absorb(run, line)
        now = time.perf_counter()
        if now - last_sink_poll > 0.3:
            checkpoints.poll()
            sink = sink_status(paths.sink)
            last_sink_poll = now
        view.update(run, checkpoints, sink)
        pause = 0.04
        if crash is not None and checkpoints.parts(crash.batch):
            sink = sink_status(paths.sink)
            spark_done = (paths.spark_checkpoint / "commits" / str(crash.batch)).exists()
            if (crash.point == "state-written" and crash.batch not in sink[0]) or (
                crash.point == "sink-committed" and crash.batch in sink[0] and not spark_done
            ):
                kill_tree(proc)
                run.killed_in = crash.batch
                break
            if spark_done or (crash.point == "state-written" and crash.batch in sink[0]):
                crash.batch += 1  # that batch went by too quickly: the next one
            pause = 0.005 if crash.point == "sink-committed" else pause
        if eof and proc.poll() is not None:
            break
        if now - run.spawned > timeout_s:
            kill_tree(proc)
            run.failed = run.failed or f"timed out after {timeout_s:.0f} s"
            break
        time.sleep(pause)


def _absorb(run: JobRun, line: str) -> None:
    with run.log.with_suffix(".progress.jsonl").open("a") as out:
        out.write(line)
    try:
        doc = json.loads(line)
    except json.JSONDecodeError:
        return  # not one of ours
    kind = doc.get("event")
    if kind == "started":
        run.startup_s = float(doc["startup_s"])
    elif kind == "batch":
        run.batches[int(doc["batch"])] = doc
    elif kind == "finished":
        run.finished = doc
    elif kind == "failed":
        run.failed = str(doc.get("error"))


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


