"""The child driver of ``tests/test_spark_speculation.py``: ``fault_job``'s weir stage
(its input, :class:`Tracker` state and output, ``weir-files`` sinks; one query per
backend, all at once) with ``spark.speculation=true`` on a standalone cluster whose two
workers are on *different hosts*, with zombie attempts injected.

Why not ``local-cluster``: Spark never launches a speculative copy of a task on a host
where an attempt of it runs or ran (``TaskSetManager.dequeueTaskFromList``:
``!(speculative && hasAttemptOnHost(index, host))``), and all workers of
``local-cluster[...]`` are on one host; ``local[*]`` does not speculate at all. So, as
``local-cluster`` does, the driver JVM runs a standalone master and the workers itself
(Spark's ``Master.startRpcEnvAndEndpoint`` / ``Worker.startRpcEnvAndEndpoint``, through
py4j, before the SparkContext starts) — but one worker on ``127.0.0.1`` and one on
``127.0.0.2`` (both loopback on Linux), each with 2 cores and an executor JVM of its
own. ``--master two-hosts`` selects that; any other value is a Spark master URL.

``<work>/plan.json`` says what to do: ``{"injections": {backend: {"B:S": mode}},
"wait_s": seconds, "conf": {Spark settings}, "runs": n}``. The queries run ``runs``
times (``availableNow``; each time a new ``weir.spark.process`` call, so no Python
worker reuses a subtask it kept: every subtask restores from storage in a run's first
batch). Before run ``i`` > 1 the driver writes ``"between": i - 1`` into ``status.json``
and waits for ``<work>/go-<i>`` (the test changes input and checkpoints meanwhile).

The function (:class:`Speculating`) appends one JSON line per event to
``<work>/attempts.jsonl`` — ``tag`` (backend), ``batch``, ``subtask``, ``partition``,
``attempt`` (Spark's attempt number), ``tid`` (task attempt id), ``pid``, ``phase``,
``t`` — with the phases:

* ``open``: the task built the subtask afresh (restored it from storage, or started
  empty) instead of reusing the one its Python worker kept from the batch before;
* ``start``: the task attempt's first record;
* ``resume`` (run 1 only): the first attempt (``attemptNumber() == 0``) of subtask S
  in batch B held its first record until a later attempt of the same task — a
  *speculative* copy, as the first one still runs — had started, and then until

  - ``after_retry``: the copy had published its part of B (``chk-B/_parts/S-*.part``)
    or B was complete; or
  - ``after_completion``: B was complete (``chk-B/_metadata``), completion had swept
    its parts, and B + 1 was complete too (``_metadata`` is written before the sweep;
    the driver completes a stage's batches one at a time, so B's sweep is over once
    B + 1 is complete);

  at most ``wait_s`` seconds each. Spark kills the held attempt once the copy
  succeeds, but a killed task's Python worker is destroyed only
  ``spark.python.task.killTimeout`` (the plan sets it far beyond ``wait_s``) after the
  kill; until then it goes on, writes its state and publishes its part of B late (a
  zombie), then fails to send its output;
* ``met``: the copy waited (at most ``wait_s``) for the held attempt's ``start`` before
  it went on, so that Spark cannot kill the first attempt before it is held.

``status.json`` gets, per run (``run<i>``), ``zombie_parts`` (the parts in each batch
held ``after_completion``: the driver waits for the zombie's before it stops, since
its executors die with it) and ``parts_seen`` (every part of a batch with a hold seen
by :class:`PartWatcher`, polling every 10 ms: whether an ``after_retry`` zombie
published before completion swept the parts is visible only meanwhile).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any


def _fault_job() -> ModuleType:
    """``fault_job.py`` (shared with ``tests/test_spark_cluster_faults.py``, under the
    module name that test gives it)."""
    name = "weir_fault_job"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(
            "fault_job.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


fault_job = _fault_job()
HOSTS = ("127.0.0.1", "127.0.0.2")
CORES_PER_WORKER = 2  # a held attempt on each host still leaves a slot on each
JVM_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
SIDE_LOG = "attempts.jsonl"
PLAN = "plan.json"


def batch_dir(checkpoints: str, batch: int) -> str:
    """The glob pattern of ``chk-<batch>`` of the (one) stage and query of a location."""
    return os.path.join(checkpoints, "stages", "*", "queries", "*", f"chk-{batch}")


class Speculating(fault_job.Tracker):  # type: ignore[misc,name-defined]
    """``fault_job.Tracker`` (same state, same output) that logs its task attempts and
    holds the first attempt of the planned (batch, subtask) tasks (module docstring)."""

    def __init__(self, tag: str, side_log: str, checkpoints: str,
                 holds: dict[str, str], wait_s: float) -> None:
        super().__init__(tag=tag)
        self.side_log = side_log
        self.checkpoints = checkpoints
        self.holds = dict(holds)
        self.wait_s = wait_s
        self._task: int | None = None

    # --------------------------------------------------------------- the side log
    def _facts(self, subtask: int) -> dict[str, Any]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        assert tc is not None
        batch = tc.getLocalProperty("streaming.sql.batchId")
        return {"tag": self.tag, "batch": int(batch) if batch is not None else None,
                "subtask": subtask, "partition": tc.partitionId(),
                "attempt": tc.attemptNumber(), "tid": tc.taskAttemptId(), "pid": os.getpid()}

    def _log(self, phase: str, facts: dict[str, Any], **more: Any) -> None:
        line = json.dumps({**facts, "phase": phase, "t": time.time(), **more}) + "\n"
        fd = os.open(self.side_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write of one line: lines never interleave
        finally:
            os.close(fd)

    def _lines(self) -> list[dict[str, Any]]:
        try:
            with open(self.side_log) as f:
                return [json.loads(ln) for ln in f if ln.endswith("\n")]
        except OSError:
            return []

    # --------------------------------------------------------------- the hooks
    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self._log("open", self._facts(ctx.subtask_index))

    def process_element(self, value: dict[str, Any], ctx: Any) -> list[tuple[Any, ...]]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is not None and tc.taskAttemptId() != self._task:
            self._task = tc.taskAttemptId()
            facts = self._facts(ctx.subtask_index)
            self._log("start", facts)
            mode = self.holds.get(f"{facts['batch']}:{facts['subtask']}")
            if mode is not None and facts["attempt"] == 0:
                self._hold(mode, facts)
            elif mode is not None:
                self._meet(facts)
        return list(super().process_element(value, ctx))

    def _wait(self, ready: Any) -> bool:
        deadline = time.monotonic() + self.wait_s
        while not ready():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _started(self, batch: int, subtask: int, first: bool) -> bool:
        """Whether an attempt of the task (the first one, or a later one) logged its
        start."""
        return any(
            ln["phase"] == "start" and ln["tag"] == self.tag and ln["batch"] == batch
            and ln["subtask"] == subtask and (ln["attempt"] == 0) == first
            for ln in self._lines()
        )

    def _meet(self, facts: dict[str, Any]) -> None:
        """A later attempt of a held task goes on only once the first attempt is
        inside the function (so Spark cannot have killed it before it got there)."""
        started = time.monotonic()
        met = self._wait(lambda: self._started(facts["batch"], facts["subtask"], True))
        self._log("met", facts, met=met, held_s=round(time.monotonic() - started, 2))

    def _hold(self, mode: str, facts: dict[str, Any]) -> None:
        batch, subtask = facts["batch"], facts["subtask"]
        started = time.monotonic()
        wait = self._wait
        speculated = wait(lambda: self._started(batch, subtask, False))
        chk = batch_dir(self.checkpoints, batch)
        metadata = os.path.join(chk, "_metadata")
        parts = os.path.join(chk, "_parts", "*.part")
        # B's _metadata exists before completion swept B (then a part published meanwhile
        # is swept too); the sweep is over once B + 1 is complete: the driver completes a
        # stage's batches one at a time (the listener, finish() under the stage's lock;
        # the planner of B + 1 before B + 1's tasks run)
        after = os.path.join(batch_dir(self.checkpoints, batch + 1), "_metadata")
        if mode == "after_retry":
            mine = os.path.join(chk, "_parts", f"{subtask}-*.part")
            reached = speculated and wait(lambda: bool(glob.glob(mine) or glob.glob(metadata)))
        else:  # complete, and completion's sweep of what it did not choose is over
            reached = speculated and wait(
                lambda: bool(glob.glob(metadata)) and bool(glob.glob(after)) and {
                    os.path.basename(p) for p in glob.glob(parts)} <= chosen_parts(chk))
        found = glob.glob(metadata)
        digest = hashlib.sha256(Path(found[0]).read_bytes()).hexdigest() if found else None
        self._log("resume", facts, mode=mode, speculated=speculated, reached=reached,
                  completed=bool(found), metadata_sha256=digest,
                  parts=sorted(os.path.basename(p) for p in glob.glob(parts)),
                  held_s=round(time.monotonic() - started, 2))


# ------------------------------------------------------------------ the cluster


def start_two_host_cluster(work: Path) -> tuple[str, list[Any]]:
    """A standalone master and one worker per host in ``HOSTS``, all inside the driver
    JVM (what ``local-cluster`` does, but on two hosts); returns the master URL and the
    RPC environments to shut down. Call before the SparkContext exists."""
    from pyspark import SparkConf, SparkContext

    # the driver JVM, launched now with the session's JVM options
    SparkContext._ensure_initialized(conf=SparkConf().set(  # type: ignore[attr-defined]
        "spark.driver.extraJavaOptions", JVM_OPTS).set("spark.driver.memory", "1g"))
    jvm = SparkContext._jvm  # type: ignore[attr-defined]
    gateway = SparkContext._gateway  # type: ignore[attr-defined]
    conf = jvm.org.apache.spark.SparkConf(False)
    master = jvm.org.apache.spark.deploy.master.Master.startRpcEnvAndEndpoint(
        HOSTS[0], 0, 0, conf)._1()  # ports 0: any free port
    url = f"spark://{HOSTS[0]}:{master.address().port()}"
    masters = gateway.new_array(jvm.String, 1)
    masters[0] = url
    no_resources = getattr(getattr(jvm.scala, "None$"), "MODULE$")
    envs = [master]
    for i, host in enumerate(HOSTS, 1):
        work_dir = work / "workers" / f"worker-{i}"  # executors' logs
        work_dir.mkdir(parents=True, exist_ok=True)
        envs.append(jvm.org.apache.spark.deploy.worker.Worker.startRpcEnvAndEndpoint(
            host, 0, 0, CORES_PER_WORKER, 1024, masters, str(work_dir), jvm.scala.Some(i),
            conf, no_resources))
    return url, envs



# ------------------------------------------------------------------ the driver


class PartWatcher(threading.Thread):
    """Lists ``chk-B/_parts`` of the batches with a hold every 10 ms and remembers every
    part seen (name: first seen, wall ms): whether a held attempt published before
    completion swept the parts is visible only meanwhile."""

    def __init__(self, paths: Any, injections: dict[str, dict[str, str]]) -> None:
        super().__init__(daemon=True)
        self.patterns = {
            (b, int(key.split(":")[0])): os.path.join(
                batch_dir(str(paths.weir_chk(b)), int(key.split(":")[0])), "_parts", "*.part")
            for b, holds in injections.items() for key in holds
        }
        self.seen: dict[str, dict[str, dict[str, int]]] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.01):
            for (backend, batch), pattern in self.patterns.items():
                seen = self.seen.setdefault(backend, {}).setdefault(str(batch), {})
                for path in glob.glob(pattern):
                    seen.setdefault(os.path.basename(path), int(time.time() * 1000))


def chosen_parts(chk: str) -> set[str]:
    """The part files completion chose in the batch directory ``chk`` (a glob pattern,
    as ``batch_dir`` gives it) from its summary; none before it completed."""
    out: set[str] = set()
    for summary in glob.glob(os.path.join(chk, "_summary.json")):
        try:
            with open(summary) as f:
                attempts = json.load(f)["positions"]["spark"]["attempts"]
        except (OSError, ValueError, KeyError):
            continue
        out |= {f"{subtask}-{attempt}.part" for subtask, attempt in attempts.items()}
    return out


def _resumes(paths: Any) -> dict[tuple[str, int, int], bool]:
    """(backend, batch, subtask) -> reached, of every ``after_completion`` hold that
    logged its ``resume`` line so far."""
    out = {}
    with contextlib.suppress(OSError):
        for line in (paths.work / SIDE_LOG).read_text().splitlines():
            doc = json.loads(line)
            if doc["phase"] == "resume" and doc["mode"] == "after_completion":
                out[(doc["tag"], doc["batch"], doc["subtask"])] = bool(doc["reached"])
    return out


def wait_for_zombies(paths: Any, injections: dict[str, dict[str, str]],
                     timeout: float) -> dict[str, dict[str, list[str]]]:
    """Before the driver stops (its executors with it): wait until every attempt held
    until after completion logged its ``resume`` line (it holds until the batch after
    its own is complete, which may be the run's last: so the line may still be due)
    and, if it got there, published its part of the swept batch. Returns, per backend
    and batch, the late parts there."""
    out: dict[str, dict[str, list[str]]] = {}
    deadline = time.monotonic() + timeout
    for backend, holds in injections.items():
        for key, mode in holds.items():
            batch, subtask = (int(x) for x in key.split(":"))
            if mode != "after_completion":
                continue
            held = (backend, batch, subtask)
            while held not in _resumes(paths) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not _resumes(paths).get(held):
                continue  # never held, or gave up waiting: the test says which
            pattern = os.path.join(batch_dir(str(paths.weir_chk(backend)), batch), "_parts",
                                   f"{subtask}-*.part")
            chk = batch_dir(str(paths.weir_chk(backend)), batch)

            def late(pattern: str = pattern, chk: str = chk) -> list[str]:
                return sorted(n for n in map(os.path.basename, glob.glob(pattern))
                              if n not in chosen_parts(chk))  # (chosen parts stay)

            while not late() and time.monotonic() < deadline:
                time.sleep(0.1)
            out.setdefault(backend, {})[str(batch)] = late()
    return out


def run_queries(spark: Any, paths: Any, backends: list[str],
                plan: dict[str, Any]) -> dict[str, Any]:
    """Run one query per backend over the input until it ends (``availableNow``), finish
    it, and wait for the zombies (:func:`wait_for_zombies`). Returns status fields."""
    import weir.spark

    side_log = str(paths.work / SIDE_LOG)
    queries = {
        b: fault_job.start_query(spark, paths, b, {}, function=Speculating(
            b, side_log, str(paths.weir_chk(b)), plan["injections"].get(b, {}),
            float(plan["wait_s"])))
        for b in backends
    }
    watcher = PartWatcher(paths, plan["injections"])
    watcher.start()
    status: dict[str, Any] = {}
    try:
        reported = dict.fromkeys(backends, -1)
        while True:
            for b, query in queries.items():
                reported[b] = fault_job.report(b, query, reported[b])
            if all(not q.isActive for q in queries.values()):
                break
            time.sleep(0.5)
        for b, query in queries.items():
            query.awaitTermination()  # raises if the query failed
            reported[b] = fault_job.report(b, query, reported[b])
            status[f"last_batch_{b}"] = weir.spark.finish(query)
        status["zombie_parts"] = wait_for_zombies(paths, plan["injections"],
                                                  float(plan["wait_s"]))
    finally:
        watcher.stopped.set()
        watcher.join()
        for query in queries.values():
            if query.isActive:
                query.stop()
    status["parts_seen"] = watcher.seen
    return status


def run(paths: Any, backends: list[str], master: str) -> int:
    import pyspark

    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_DIRS"] = str(paths.spark_local)
    from pyspark import cloudpickle

    import weir.spark
    from weir.connectors import register_sinks

    cloudpickle.register_pickle_by_value(fault_job)  # Tracker: tests/ is not on their path
    started = time.monotonic()
    plan = json.loads((paths.work / PLAN).read_text())
    paths.spark_local.mkdir(parents=True, exist_ok=True)
    envs: list[Any] = []
    if master == "two-hosts":
        master, envs = start_two_host_cluster(paths.work)
    spark = weir.spark.session(
        master, "weir-speculation-" + "-".join(backends),
        **{
            "spark.sql.shuffle.partitions": str(fault_job.PARALLELISM),
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "1g",
            "spark.executor.memory": "1g",
            "spark.driver.extraJavaOptions": JVM_OPTS,
            "spark.executor.extraJavaOptions": JVM_OPTS,
            **plan["conf"],
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    fault_job.write_status(paths, driver_pid=os.getpid(), jvm_pid=jvm_pid, master=master,
                           app_id=spark.sparkContext.applicationId,
                           startup_s=round(time.monotonic() - started, 1))
    register_sinks(spark)
    for i in range(1, int(plan.get("runs", 1)) + 1):
        if i > 1:  # the test changes the input and checkpoints meanwhile
            fault_job.write_status(paths, between=i - 1)
            go = paths.work / f"go-{i}"
            deadline = time.monotonic() + float(plan.get("between_s", 300))
            while not go.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nobody created {go}")
                time.sleep(0.1)
        status = run_queries(spark, paths, backends,
                             plan if i == 1 else {**plan, "injections": {}})  # holds: run 1
        fault_job.write_status(paths, **{f"run{i}": status}, **{
            k: v for k, v in status.items() if k.startswith("last_batch_")})
    fault_job.write_status(paths, finished=True, seconds=round(time.monotonic() - started, 1))
    spark.stop()
    for env in reversed(envs):  # the workers (they stop their executors), then the master
        env.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--backend", required=True, help="hashmap, rocksdb or both: a,b")
    parser.add_argument("--master", default="two-hosts",
                        help="two-hosts (module docstring) or a Spark master URL")
    parser.add_argument("--pause", action="append", default=[],
                        help="accepted for fault_job's command line; not supported here")
    args = parser.parse_args(argv)
    if args.pause:
        parser.error("--pause is not supported: the injections come from plan.json")
    backends = args.backend.split(",")
    if not set(backends) <= {"hashmap", "rocksdb"}:
        parser.error(f"unknown backend in {args.backend!r}")
    return run(fault_job.Paths(args.work), backends, args.master)


if __name__ == "__main__":
    sys.exit(main())
