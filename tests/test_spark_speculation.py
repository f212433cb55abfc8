"""Zombie and speculative attempts on real Spark with ``spark.speculation=true``: an
attempt that publishes its part after its speculative copy did, or after completion
swept the batch's files, and a late part forged into a completed batch never replace
the acknowledged state — ``_metadata`` stays what completion wrote, completion chooses
the part of the attempt that acknowledged the batch first (the copy's), and the next
batch restores from it.

The job (``tests/spark_jobs/speculation_job.py``; its docstring says why not
``local-cluster``) is a child driver of a standalone master and two workers on
different hosts (``127.0.0.1``, ``127.0.0.2``) inside its JVM, one executor JVM each.
It runs ``fault_job``'s stage (parallelism 2, ``Tracker``: per key a count, a payload
sum and the map of seen seqs; one output row per record into the ``weir-files`` sink)
for both state backends at once, one query each.

Run 1 (``FILES_RUN_1`` files, ``availableNow``, one file per batch): per backend the
function holds the first attempt of one subtask

* in batch 2 until a speculative copy of the task started and published its part
  (``after_retry``): the held attempt then publishes after its retry;
* in batch 3 until a copy started, batch 3 was completed and its parts swept, and
  batch 4 was completed (so completion's sweep of batch 3 is over: it would delete a
  part published during it) (``after_completion``): the held attempt then publishes
  into a completed batch; the driver waits for that part before it stops.

Spark launches the copies by itself (``SPECULATION``: it speculates a task that has run
1.1 times the median of the stage's finished tasks, and at least 200 ms), and the
holds make the order deterministic: the held attempt goes on only once the copy
exists, the copy goes on only once the held attempt is held, and the test fails (and
says so, with the settings) if Spark launched no copy within ``WAIT_S``.

Between the runs the test forges a late publisher (as ``test_spark_protocol``'s
``test_4``): into the newest completed batch's ``_parts/`` it writes a part per subtask
holding the state of an older batch (``FORGED_FROM``), under a new attempt id and with
the earliest ``written_ms`` (1). Run 2 (the same driver and Spark checkpoints, the
queries started again, ``FILES_RUN_2`` more files) restores every subtask from
storage in its first batch (asserted).

Then, per backend, against the oracle of a failure-free run
(``test_spark_cluster_faults``): L (records without output), D (duplicate or unknown
output), M (keys whose output or final state differs) and C (a retained checkpoint
that fails ``verify()``, or no savepoint) are all 0 and every batch is committed and
complete, and

* Spark speculated every held task: an attempt with ``attemptNumber() >= 1`` of that
  subtask in that batch started while the held attempt 0 was still running;
* the attempt held until after completion published its part into the swept batch,
  later than completion; it is not the attempt ``_metadata`` names;
* in the batch held ``after_retry``, ``_metadata`` names the copy's part (published
  before the held attempt went on);
* the ``_metadata`` the held attempts saw is the one there after run 1, and every
  checkpoint complete after run 1 verifies; the forged parts are still there after
  run 2, never chosen, and that batch's ``_metadata`` did not change;
* a checkpoint file outside ``_parts/`` that no retained checkpoint references is in
  a retained batch that had a late attempt (a zombie that wrote after the sweep: its
  files go when the batch leaves retention); the held zombies' batches have left it.

65-80 s on an idle 2-core machine (of it 10-20 s the driver's start-up and 15-50 s
the first batch, while the executors and their Python workers start); 90-120 s with
another CPU-bound process running.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import test_spark_cluster_faults as faults  # type: ignore[import-not-found]
import weir
from weir import CheckpointCoordinator, CheckpointStorage, CorruptCheckpointError
from weir.checkpoint.format import decode_part, encode_part

#: a minute of its own Spark cluster: in make soak (WEIR_SOAK=1); make test has its
#: short version on the shared session (test_spark_protocol's test_4: a late attempt's
#: part published after completion never replaces the acknowledged state)
pytestmark = [pytest.mark.spark, pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("WEIR_SOAK"),
                                 reason="long real-cluster run: make soak")]

SPECULATION_JOB = Path(__file__).parent / "spark_jobs" / "speculation_job.py"
BACKENDS = faults.BACKENDS
FILES_RUN_1, FILES_RUN_2, PER_FILE, KEYS = 5, 2, 300, 100
FILES = FILES_RUN_1 + FILES_RUN_2
#: per backend, "batch:subtask" -> how long its first attempt is held
INJECTIONS = {
    "hashmap": {"2:0": "after_retry", "3:1": "after_completion"},
    "rocksdb": {"2:1": "after_retry", "3:0": "after_completion"},
}
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.1",
    "spark.speculation.quantile": "0.1",
    "spark.speculation.minTaskRuntime": "200ms",
    # judge a task by its run time only, not by its rows per second
    "spark.speculation.efficiency.enabled": "false",
    # a killed task's Python worker runs on this long (a zombie) before Spark destroys it
    "spark.python.task.killTimeout": "120s",
}
WAIT_S = 30.0  # each wait of a held attempt (for the copy, then for its publish/completion)
FORGED_ATTEMPT = "0badc0de"
FORGED_FROM = 2  # the batch whose (older) state the forged parts hold


def _load(name: str, path: Path) -> ModuleType:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


spec_job = _load("weir_speculation_job", SPECULATION_JOB)
job = spec_job.fault_job  # the same module as faults.job


# ------------------------------------------------------------------ the run


def _query_dir(location: Path) -> Path:
    (query,) = location.glob("stages/*/queries/*")
    return query


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _parts(chk: Path) -> dict[str, tuple[int, dict[str, Any]]]:
    """The parts in ``chk/_parts``: name -> (subtask, epoch facts)."""
    out = {}
    for path in sorted((chk / "_parts").glob("*.part")):
        _, _, _, handle, epoch = decode_part(path.read_bytes(), str(path))
        out[path.name] = (handle.subtask_index, epoch)
    return out


def _batch_facts(chk: Path) -> dict[str, Any]:
    """What completion left in a batch: the chosen attempts, whether it verifies, its
    completion time, the digest of its ``_metadata`` and the parts there (name ->
    (subtask, epoch))."""
    try:
        meta = weir.load_checkpoint(str(chk)).metadata  # verifies every file
        verified = True
    except CorruptCheckpointError:
        meta = weir.load_checkpoint(str(chk), verify=False).metadata
        verified = False
    return {"chosen": dict(meta.source_positions["spark"]["attempts"]), "verified": verified,
            "completed_ms": meta.completion_timestamp_ms, "sha": _sha(chk / "_metadata"),
            "parts": _parts(chk)}


def _orphans(location: Path) -> tuple[list[int], list[str]]:
    """Ids of the retained completed checkpoints, and the files (parts aside) none of
    them references."""
    coordinator = CheckpointCoordinator(CheckpointStorage(_query_dir(location).as_uri()),
                                        clean_up=False)
    return ([c.checkpoint_id for c in coordinator.completed_checkpoints],
            faults.unreferenced_files(coordinator))


def _batch_of(path: str) -> int | None:
    """The batch a checkpoint file belongs to: ``chk-<N>/...`` or ``shared/<uid>/<N>-...``."""
    match = re.match(r"^(?:chk-(\d+)/|shared/[^/]+/(\d+)-)", path)
    return int(match.group(1) or match.group(2)) if match else None


def forge_late_parts(location: Path, into: int, source: int) -> list[str]:
    """Write, per subtask, a part holding batch ``source``'s state into the completed
    batch ``into`` (new attempt id, earliest timestamp). Returns their names."""
    query = _query_dir(location)
    assert (query / f"chk-{into}" / "_metadata").exists()
    meta = weir.load_checkpoint(str(query / f"chk-{source}"), verify=False).metadata
    operator = meta.operators[job.UID]
    forged = []
    for handle in operator.subtasks:
        data = encode_part(job.UID, operator.parallelism, operator.max_parallelism, handle, {
            "attempt": FORGED_ATTEMPT, "written_ms": 1, "watermark": 0, "batch_time": 1,
        })
        name = f"{handle.subtask_index}-{FORGED_ATTEMPT}.part"
        (query / f"chk-{into}" / "_parts").mkdir(exist_ok=True)
        (query / f"chk-{into}" / "_parts" / name).write_bytes(data)
        forged.append(name)
    return forged


@dataclass
class Outcome:
    """What the two runs did and left, per backend."""

    lines: list[dict[str, Any]]
    status_1: dict[str, Any]
    status_2: dict[str, Any]
    results: dict[str, Any]
    #: backend -> batch -> facts of chk-<batch> right after run 1 (:func:`_batch_facts`)
    after_run_1: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    #: backend -> the forged part names
    forged: dict[str, list[str]] = field(default_factory=dict)
    #: backend -> facts of the batch the parts were forged into, after run 2
    forged_into: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: backend -> ids of the retained checkpoints and the files none of them references
    orphans: dict[str, tuple[list[int], list[str]]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    report: str = ""

    def late_batches(self, backend: str) -> set[int]:
        """Batches in which some task had more than one attempt (a copy or a retry)."""
        return {ln["batch"] for ln in self.lines
                if ln["tag"] == backend and ln["attempt"] >= 1 and ln["batch"] is not None}


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    started = time.monotonic()
    tmp = tmp_path_factory.mktemp("speculation")
    paths = job.Paths(tmp / "job")
    files = job.generate(7, FILES, PER_FILE, KEYS)
    job.write_input(paths, files)  # all with increasing mtimes; run 2's kept aside
    aside = tmp / "later"
    aside.mkdir()
    for i in range(FILES_RUN_1, FILES):
        os.replace(paths.input / f"part-{i:04d}.json", aside / f"part-{i:04d}.json")
    (paths.work / spec_job.PLAN).write_text(json.dumps(
        {"wait_s": WAIT_S, "injections": INJECTIONS, "conf": SPECULATION, "runs": 2}))

    last = FILES_RUN_1 - 1  # the newest batch of run 1: the forged parts go there
    driver = faults.Driver(paths, 1, [], job_path=SPECULATION_JOB, master="two-hosts")
    try:
        driver.wait_for("the first run of the queries",
                        lambda: driver.status().get("between") == 1)
        ran_1 = time.monotonic()
        after_run_1 = {}
        forged = {}
        for b in BACKENDS:
            query = _query_dir(paths.weir_chk(b))
            after_run_1[b] = {int(d.name[4:]): _batch_facts(d) for d in query.glob("chk-*")
                              if (d / "_metadata").exists()}
            forged[b] = forge_late_parts(paths.weir_chk(b), into=last, source=FORGED_FROM)
        for i in range(FILES_RUN_1, FILES):
            os.replace(aside / f"part-{i:04d}.json", paths.input / f"part-{i:04d}.json")
        (paths.work / "go-2").touch()
        status = driver.finish()
    finally:
        driver.clean_up()
    ran_2 = time.monotonic()
    forged_into = {b: _batch_facts(_query_dir(paths.weir_chk(b)) / f"chk-{last}")
                   for b in BACKENDS}
    orphans = {b: _orphans(paths.weir_chk(b)) for b in BACKENDS}

    rows_expected, state_expected = faults.oracle(files)
    results = {b: faults.evaluate(paths, b, rows_expected, state_expected, tmp, status,
                                  files=FILES)
               for b in BACKENDS}
    lines = [json.loads(ln) for ln in (paths.work / spec_job.SIDE_LOG).read_text().splitlines()]
    out = Outcome(lines, status["run1"], status["run2"], results, after_run_1, forged,
                  forged_into, orphans, {"run_1": ran_1 - started, "run_2": ran_2 - ran_1,
                                         "startup": float(status.get("startup_s") or 0)})
    out.report = _report(out)
    print(out.report)
    return out


def _report(out: Outcome) -> str:
    text = [
        f"run 1 {out.seconds['run_1']:.0f}s (of it the driver's start-up "
        f"{out.seconds['startup']:.0f}s), forge and run 2 {out.seconds['run_2']:.0f}s; "
        f"settings {SPECULATION}",
    ]
    for b in BACKENDS:
        r = out.results[b]
        text.append(f"  [{b}] L={r.lost} D={r.dups} M={r.mismatched} C={r.corrupt} "
                    f"unreferenced={r.unreferenced} complete={r.complete}")
        text.append(f"    {r.detail}")
        for key, mode in INJECTIONS[b].items():
            batch, subtask = (int(x) for x in key.split(":"))
            mine = [ln for ln in out.lines if ln["tag"] == b and ln["batch"] == batch
                    and ln["subtask"] == subtask]
            attempts = sorted({(ln["attempt"], ln["tid"], ln["pid"]) for ln in mine
                               if ln["phase"] == "start"})
            resume = [{k: ln[k] for k in ("speculated", "reached", "completed", "held_s")}
                      for ln in mine if ln["phase"] == "resume"]
            met = [{k: ln[k] for k in ("attempt", "met", "held_s")}
                   for ln in mine if ln["phase"] == "met"]
            seen = out.status_1.get("parts_seen", {}).get(b, {}).get(str(batch), {})
            ours = sorted(n for n in seen if n.startswith(f"{subtask}-"))
            zombie = out.status_1.get("zombie_parts", {}).get(b, {}).get(str(batch))
            text.append(
                f"    batch {batch} subtask {subtask} ({mode}): attempts (number, tid, pid) "
                f"{attempts}; hold {resume}; copy {met}; parts of subtask {subtask} seen "
                f"during run 1: {len(ours)} {ours}"
                + (f"; late part after the sweep {zombie}" if zombie else ""))
        speculative = sorted({(ln["batch"], ln["subtask"]) for ln in out.lines
                              if ln["tag"] == b and ln["phase"] == "start"
                              and ln["attempt"] >= 1})
        text.append(f"    every (batch, subtask) with an attempt number >= 1: {speculative}")
        retained, files = out.orphans[b]
        text.append(f"    retained checkpoints {retained}; files none references (of late "
                    f"attempts): {files}")
    return "\n".join(text)


# ------------------------------------------------------------------ the checks


def test_zombie_and_speculative_attempts_never_replace_the_acknowledged_state(
    outcome: Outcome, backend: str
) -> None:
    out, b = outcome, backend
    report = out.report
    r = out.results[b]
    assert (r.lost, r.dups, r.mismatched, r.corrupt) == (0, 0, 0, 0), report
    assert r.complete, report
    # a late attempt's files (published after the sweep) stay only while their batch
    # is retained, and only in batches that had one
    retained, files = out.orphans[b]
    assert all(_batch_of(f) in set(retained) & out.late_batches(b) for f in files), report

    # the injected situation really happened: Spark speculated every held task
    for key, mode in INJECTIONS[b].items():
        batch, subtask = (int(x) for x in key.split(":"))
        mine = [ln for ln in out.lines if ln["tag"] == b and ln["batch"] == batch
                and ln["subtask"] == subtask]
        held = [ln for ln in mine if ln["phase"] == "resume"]
        assert len(held) == 1 and held[0]["attempt"] == 0, (
            f"{b}: the first attempt of subtask {subtask} in batch {batch} was not held "
            f"exactly once\n{report}")
        assert held[0]["speculated"] and any(
            ln["phase"] == "start" and ln["attempt"] >= 1 for ln in mine
        ), (f"{b}: Spark never launched a speculative attempt of subtask {subtask} in batch "
            f"{batch} within {WAIT_S}s while its first attempt was held, with {SPECULATION} "
            f"on two workers of different hosts\n{report}")
        assert held[0]["reached"], (
            f"{b}: batch {batch}: the held attempt gave up waiting for "
            f"{'the copy to publish' if mode == 'after_retry' else 'completion'}\n{report}")

    # the attempt held until after completion published into the swept batch; what
    # completion chose (the speculative copy's part) and its _metadata stayed
    for key, mode in INJECTIONS[b].items():
        batch, subtask = (int(x) for x in key.split(":"))
        facts = out.after_run_1[b][batch]
        chosen = facts["chosen"][str(subtask)]
        resumed = next(ln for ln in out.lines if ln["tag"] == b and ln["batch"] == batch
                       and ln["subtask"] == subtask and ln["phase"] == "resume")
        if mode == "after_completion":
            zombie = out.status_1["zombie_parts"].get(b, {}).get(str(batch), [])
            assert len(zombie) == 1 and zombie[0] in facts["parts"], (
                f"{b}: the held attempt published no part into swept batch {batch}\n{report}")
            late_part = facts["parts"][zombie[0]][1]
            assert late_part["attempt"] != chosen, report
            assert late_part["written_ms"] >= facts["completed_ms"], report
        else:
            copy = [n for n in resumed["parts"] if n.startswith(f"{subtask}-")]
            if copy:  # the copy's part, there before the held attempt went on: chosen
                assert copy == [f"{subtask}-{chosen}.part"], report
            else:  # swept before the held attempt looked: it had published nothing yet
                assert resumed["completed"], report
        if resumed["metadata_sha256"] is not None:  # what the held attempt saw stayed
            assert resumed["metadata_sha256"] == facts["sha"], report
    # every checkpoint complete after run 1 (the zombies' batches are gone by now) verified
    assert all(f["verified"] for f in out.after_run_1[b].values()), report

    # the forged late parts: still there, never chosen, and _metadata unchanged; the
    # next batch restored every subtask from storage (run 2: a new process() call)
    last = FILES_RUN_1 - 1
    after = out.forged_into[b]
    assert set(out.forged[b]) <= set(after["parts"]), report
    assert FORGED_ATTEMPT not in after["chosen"].values(), report
    assert after["sha"] == out.after_run_1[b][last]["sha"], report
    restored = {ln["subtask"] for ln in out.lines
                if ln["tag"] == b and ln["batch"] == last + 1 and ln["phase"] == "open"}
    assert restored == set(range(job.PARALLELISM)), report
