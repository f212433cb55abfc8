"""Hosting a continuous job's tasks on Spark: one barrier-mode stage per attempt.

``StreamEnvironment.execute(..., runner="spark", spark=session)`` runs the job's driver
(the checkpoint coordinator, :mod:`.master`) in this process as on the local runner,
and its tasks as the Spark tasks of one barrier stage (``rdd.barrier().mapPartitions``,
one partition per weir task, all scheduled at once): Spark task ``i`` runs weir task
``i`` in a process of its own on its executor — a fork of its Python worker, which keeps
the imported task code for the next stage (``python -m weir.runtime.continuous.worker``
if that worker has threads) — and waits for it. A weir task registers its channel
address with the coordinator, which hands every address out in the ``start`` message —
the address exchange Spark's ``allGather`` would do, through the coordinator the tasks
need anyway (CONTINUOUS.md: "or the coordinator lives on the driver", as TorchDistributor does).

**Addresses.** On a ``local[N]`` master everything listens on loopback. On any other
master (``local-cluster[...]``, standalone, YARN, Kubernetes) the coordinator listens
on the driver's address the executors reach (``spark.driver.host``) and each task's
channels on its executor's address (``BarrierTaskContext.getTaskInfos()``). Every
connection proves the job's secret (32 random bytes per attempt, HMAC challenge,
:mod:`.wire`) before it is served; the secret reaches the executors inside the
stage's closure, so on an untrusted network turn on Spark's RPC encryption
(``spark.authenticate``, ``spark.network.crypto.enabled``).

**Checkpoint storage and sink paths** must be one place for the driver and every
executor (a shared filesystem, ``s3://``, ``hdfs://``): before a task starts, it looks
for a file the driver has just written into the checkpoint storage and into every
sink's location (``Sink.locations``), and a task that cannot see one fails the job at
once with :class:`~weir.errors.ConfigurationError` naming it (no restart: a local path
on a multi-host cluster does not heal; a sink's output split across hosts could not be
committed after a restart elsewhere).

**Slots.** All of a job's tasks need a task slot at the same time. A job with more
tasks than the application can ever have is refused at once; while executors are
still registering (or a lost one is being replaced, before a restart) the launcher
waits up to ``slot_wait_s`` for the slots, then refuses (Spark itself would re-check
for ten minutes). Dynamic allocation is refused (barrier mode does not support it).

The stage runs in a thread of the driver under a job group of its own. When the
attempt ends — finished, or failed and to be restarted under the job's restart
strategy — the driver cancels the group, which kills the stage's tasks and their
Python workers; each weir task process dies with the Python worker that started it
(``PR_SET_PDEATHSIG``) and, failing that, once the coordinator it talks to closes its
connection. Spark does not retry a failed barrier result stage; a restart is a new
stage (Flink's global restart).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from weir.checkpoint.storage import CheckpointStorage
from weir.errors import ConfigurationError
from weir.runtime.continuous.processes import die_with_parent

__all__ = ["SparkLauncher"]

log = logging.getLogger("weir")

TaskId = tuple[str, int]


class SparkLauncher:
    """Starts an attempt's tasks as one barrier stage of ``spark``'s application."""

    def __init__(self, spark: Any, *, slot_wait_s: float = 60.0) -> None:
        self.sc = spark.sparkContext
        self.master = str(self.sc.master)
        #: a local master's executor is this process's JVM: everything on loopback
        self.local = re.fullmatch(r"local(\[.*\])?", self.master) is not None
        #: how long a launch waits for executors to register before it refuses
        self.slot_wait_s = slot_wait_s
        conf = self.sc.getConf()
        if str(conf.get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
            raise ConfigurationError(
                "the continuous runtime on Spark needs a fixed set of executors (a barrier "
                "stage cannot run with dynamic allocation): start the session with "
                "spark.dynamicAllocation.enabled=false")

    @property
    def host(self) -> str:
        """Where the coordinator listens: loopback on a local master, else the driver's
        address that the executors reach (``spark.driver.host``)."""
        if self.local:
            return "127.0.0.1"
        return str(self.sc.getConf().get("spark.driver.host"))

    def slots(self) -> int:
        """Task slots the application has now (what a barrier stage may use at once:
        Spark's own check, ``maxNumConcurrentTasks``)."""
        try:
            jsc = self.sc._jsc.sc()
            profile = jsc.resourceProfileManager().defaultResourceProfile()
            return int(jsc.maxNumConcurrentTasks(profile))
        except Exception as exc:  # an internal API: if it moved, Spark's public figure
            log.warning("weir: Spark's maxNumConcurrentTasks is not available (%s); "
                        "counting task slots as sc.defaultParallelism, which "
                        "spark.default.parallelism overrides", exc)
            return int(self.sc.defaultParallelism)

    def slot_limit(self) -> int | None:
        """The most slots the application can have, from its master and configuration;
        None when they do not say (executors may still come)."""
        return _slot_limit(self.master, self.sc.getConf())

    def await_slots(self, need: int, job: str, tasks: list[TaskId]) -> None:
        """Return once the application has ``need`` slots; refuse at once when it can
        never have them, and after ``slot_wait_s`` when they did not come."""
        have, limit = self.slots(), self.slot_limit()
        if have < need and (limit is None or limit >= need):
            deadline = time.monotonic() + self.slot_wait_s
            while have < need and time.monotonic() < deadline:
                time.sleep(0.25)
                have = self.slots()
        if have >= need:
            return
        waited = "" if limit is not None and limit < need else (
            f" after waiting {self.slot_wait_s:g} s for executors")
        raise ConfigurationError(
            f"job {job!r} needs {need} task slots at once (one per task: "
            f"{', '.join(f'{v}[{s}]' for v, s in tasks)}) and the Spark application "
            f"has {have}{waited}"
            + ("" if limit is None else f" (at most {limit} with master {self.master!r})")
            + f"; give it more cores (local[{need}], more executors or executor cores) "
            f"or lower the job's parallelism")

    def launch(self, graph: bytes, env: dict[str, str], tasks: list[TaskId], job: str,
               attempt: int, report: Callable[[TaskId, dict[str, Any]], None],
               storage: str, sinks: tuple[tuple[str, str], ...] = (), *,
               storage_options: dict[str, Any] | None = None
               ) -> dict[TaskId, SparkStage]:
        """Submit the stage running ``tasks`` (``graph``: the pickled job graph; ``env``:
        the coordinator's address and the job's secret; ``storage``: the checkpoint
        storage's URL, opened with ``storage_options``, and ``sinks``: (sink uid,
        location) pairs, which every task checks it shares); the stage's handle per
        task.
        A stage that fails on Spark's side is reported through ``report`` as the
        failure of the first task (``fatal`` when restarting cannot help)."""
        self.await_slots(len(tasks), job, tasks)
        probe = _Probe(storage, sinks, storage_options)
        stage = SparkStage(self.sc, _task_runner(graph, env, tasks, attempt, self.local,
                                                 storage, probe.name, sinks, storage_options),
                           len(tasks), tasks[0], job, attempt, report, probe.remove)
        return dict.fromkeys(tasks, stage)


class _Probe:
    """A file the driver writes into the checkpoint storage and every sink location for
    the tasks to find."""

    def __init__(self, storage: str, sinks: tuple[tuple[str, str], ...] = (),
                 storage_options: dict[str, Any] | None = None) -> None:
        self.name = f"_weir-probe-{uuid.uuid4().hex}"
        self._storages = [CheckpointStorage(storage, storage_options=storage_options)]
        self._storages += [CheckpointStorage(location) for _, location in sinks]
        for written in self._storages:
            written.write(self.name, b"written by the driver of a continuous job")

    def remove(self) -> None:
        for written in self._storages:
            with contextlib.suppress(OSError):
                written.delete(self.name)


def _slot_limit(master: str, conf: Any) -> int | None:
    per_task = max(int(conf.get("spark.task.cpus", "1")), 1)
    local = re.fullmatch(r"local(?:\[\s*(\*|\d+)\s*(?:,\s*\d+\s*)?\])?", master)
    if local:
        n = local.group(1)
        return 1 if n is None else (os.cpu_count() or 1) if n == "*" else int(n)
    cluster = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)
    if cluster:
        return int(cluster.group(1)) * int(cluster.group(2)) // per_task
    instances, cores = conf.get("spark.executor.instances"), conf.get("spark.executor.cores")
    if instances and cores:
        return int(instances) * int(cores) // per_task
    if conf.get("spark.cores.max"):
        return int(conf.get("spark.cores.max")) // per_task
    return None


class SparkStage:
    """One attempt's barrier stage; what stopping an attempt needs of its tasks
    (``poll``, ``wait``, ``kill``: all of the stage at once)."""

    #: no OS process of this one's own (its tasks run on executors)
    pid = 0

    def __init__(self, sc: Any, runner: Callable[[Iterator[Any]], Iterator[int]],
                 partitions: int, first: TaskId, job: str, attempt: int,
                 report: Callable[[TaskId, dict[str, Any]], None],
                 on_end: Callable[[], None]) -> None:
        self.sc = sc
        self.group = f"weir-{job}-{attempt}-{uuid.uuid4().hex[:8]}"
        self.code: int | None = None
        self._killed = False
        self._thread = threading.Thread(
            target=self._run, args=(runner, partitions, first, job, attempt, report, on_end),
            name=f"spark stage {self.group}", daemon=True)
        self._thread.start()

    def _run(self, runner: Callable[[Iterator[Any]], Iterator[int]], partitions: int,
             first: TaskId, job: str, attempt: int,
             report: Callable[[TaskId, dict[str, Any]], None],
             on_end: Callable[[], None]) -> None:
        sc = self.sc
        sc.setJobGroup(self.group, f"weir continuous job {job}, attempt {attempt}",
                       interruptOnCancel=True)
        try:
            codes = (sc.parallelize(range(partitions), partitions).barrier()
                     .mapPartitions(runner).collect())
            self.code = next((c for c in codes if c != 0), 0)
        except Exception as exc:
            self.code = 1
            if not self._killed:
                cause = _cause(exc)
                report(first, {
                    "kind": "failed",
                    "error": f"the Spark barrier stage running the job's tasks failed: {cause}",
                    # a task's set-up refused (storage not shared): no restart heals it
                    "fatal": cause.startswith(("ConfigurationError", "weir.errors."))})
        finally:
            on_end()

    def poll(self) -> int | None:
        """None while the stage runs; then 0 if every task exited with 0."""
        return self.code

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the stage's end (``subprocess.TimeoutExpired`` after ``timeout``)."""
        self._thread.join(timeout)
        if self._thread.is_alive() or self.code is None:
            raise subprocess.TimeoutExpired(self.group, timeout or 0.0)
        return self.code

    def kill(self) -> None:
        """Cancel the stage (every task of the attempt)."""
        self._killed = True
        self.sc.cancelJobGroup(self.group)


def _cause(exc: BaseException) -> str:
    """What a failed stage says: the Python error of its tasks when Spark carries one
    (a ``Py4JJavaError``'s first line says only which call failed), with the fix for
    executors whose Python cannot import weir."""
    text = str(exc)
    errors = re.findall(r"^(\w[\w.]*(?:Error|Exception): .*)$", text, re.MULTILINE)
    python = next((e for e in errors if not e.startswith(("py4j", "org.", "java."))), None)
    cause = python or (text.strip().splitlines() or [type(exc).__name__])[0]
    if "No module named 'weir'" in cause:
        cause += (" (the executors' Python cannot import weir: set spark.pyspark.python or "
                  "PYSPARK_PYTHON to an interpreter that has it, before the session starts)")
    return cause


def _task_runner(graph: bytes, env: dict[str, str], tasks: list[TaskId], attempt: int,
                 local: bool, storage: str, probe: str,
                 sinks: tuple[tuple[str, str], ...] = (),
                 storage_options: dict[str, Any] | None = None
                 ) -> Callable[[Iterator[Any]], Iterator[int]]:
    """The function of the stage's partitions: partition ``i`` runs weir task ``i``
    (listening on loopback when ``local``, else on its executor's address), once it
    found the driver's ``probe`` file in the checkpoint ``storage`` (opened with
    ``storage_options``, which travel with the function as the job's secret does in
    ``env``)."""

    def run(_: Iterator[Any]) -> Iterator[int]:
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        partition = context.partitionId()
        vertex, subtask = tasks[partition]
        host = "127.0.0.1" if local else (
            context.getTaskInfos()[partition].address.rsplit(":", 1)[0].strip("[]"))
        if not CheckpointStorage(storage, storage_options=storage_options).exists(probe):
            raise ConfigurationError(
                f"checkpoint storage {storage} is not shared between the driver and the "
                f"executor on {host} (task {vertex}[{subtask}] does not see the file "
                f"{probe} the driver just wrote there): a continuous job on a cluster "
                f"needs checkpoint storage that the driver and every executor share — a "
                f"shared filesystem mounted at the same path, s3://, hdfs://")
        for uid, location in sinks:
            if not CheckpointStorage(location).exists(probe):
                raise ConfigurationError(
                    f"sink {uid!r} writes to {location}, which is not shared between the "
                    f"driver and the executor on {host} (task {vertex}[{subtask}] does not "
                    f"see the file {probe} the driver just wrote there): on a cluster a "
                    f"sink's output must be one place for every task — a shared filesystem "
                    f"mounted at the same path — or its transactions could not be "
                    f"committed after a restart on another host")
        env_of_task = {**env, "WEIR_BIND_HOST": host}
        if threading.active_count() == 1:
            yield _forked(graph, vertex, subtask, attempt, env_of_task)
        else:  # (a fork would copy another thread's locks: a process of its own)
            yield _spawned(graph, vertex, subtask, attempt, env_of_task)

    return run


def _forked(graph: bytes, vertex: str, subtask: int, attempt: int,
            env: dict[str, str]) -> int:
    """Run the weir task in a fork of this Spark Python worker; its exit status. Spark
    reuses a Python worker for the next tasks, so the task code it imported once (here,
    or for an earlier stage) is shared by every fork: a restart's tasks start in
    milliseconds, not in the half second of a fresh interpreter's imports."""
    from weir.runtime.continuous import worker

    pid = os.fork()
    if pid == 0:  # the task: never returns into the Spark worker's code
        code = 1
        try:
            die_with_parent()
            os.environ.update(env)
            code = worker.run(pickle.loads(graph), vertex, subtask, attempt)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    try:
        _, status = os.waitpid(pid, 0)
        pid = 0
        return os.waitstatus_to_exitcode(status)
    finally:
        if pid:  # this Python worker is being stopped
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


def _spawned(graph: bytes, vertex: str, subtask: int, attempt: int,
             env: dict[str, str]) -> int:
    """Run the weir task as ``python -m weir.runtime.continuous.worker`` (its graph in
    a file of a directory of its own)."""
    workdir = tempfile.mkdtemp(prefix=f"weir-task-{vertex}-{subtask}-")
    try:
        path = os.path.join(workdir, "graph.pickle")
        with open(path, "wb") as f:
            f.write(graph)
        proc = subprocess.Popen(
            [sys.executable, "-m", "weir.runtime.continuous.worker", path, vertex,
             str(subtask), str(attempt)],
            env={**os.environ, **env}, preexec_fn=die_with_parent)
        try:
            return proc.wait()
        finally:
            if proc.poll() is None:  # this Python worker is being stopped
                proc.kill()
                proc.wait()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
