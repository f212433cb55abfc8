"""The Python daemon of weir's Spark sessions (``spark.python.daemon.module``, set by
:func:`weir.spark.session`): PySpark's own daemon, with the modules every weir task
imports loaded before it forks the Python workers.

PySpark's daemon (``pyspark.daemon``) forks one worker per task slot and imports
nothing a task needs first, because a process must not fork while other threads run
(a lock held by one of them stays held in the child forever), and numpy, pyarrow and
pandas start threads when they are imported. So every new worker imports PySpark's
worker, pyarrow, pandas and weir itself, about a second of CPU, before its first
task runs. Spark starts a new worker for each task slot at a session's first task and
again after any task raised (PySpark does not reuse a worker that failed).

This daemon imports them once, in the one process that forks, with the threads they
would start turned off: OpenBLAS (numpy) starts none when ``OMP_NUM_THREADS`` is 1,
which Spark sets for its Python processes (``spark.task.cpus``, default 1), and
Arrow's jemalloc starts no background purger with ``background_thread:false``
(``JE_ARROW_MALLOC_CONF``, set only for the import). It then checks that the process
still runs one thread: if not (say ``spark.task.cpus`` > 1, so OpenBLAS started its
pool), or if it cannot count them (no ``/proc``), it replaces itself with PySpark's
daemon unchanged (``exec``), which is what Spark would have run, and says so on stderr.
Workers forked from it find the modules loaded (:data:`preloaded`); their behaviour
is otherwise PySpark's.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys

__all__ = ["PRELOAD", "preloaded", "threads"]

#: what a weir task imports (PySpark's worker and its Arrow serializers, pyarrow,
#: pandas, which pyarrow imports on first use, and weir's Spark task)
PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pyarrow",
    "pandas",
    "weir.runtime.spark.task",
)
_JEMALLOC_CONF = "JE_ARROW_MALLOC_CONF"

#: whether this process preloaded :data:`PRELOAD` and forks workers (a worker sees
#: True: it was forked from this daemon)
preloaded = False


def threads() -> int | None:
    """How many threads this process runs (None where that cannot be read: not Linux)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _preload() -> None:
    unset = _JEMALLOC_CONF not in os.environ
    if unset:
        os.environ[_JEMALLOC_CONF] = "background_thread:false"
    try:
        for name in PRELOAD:
            # a worker that needs a module that is missing fails as it would have
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    finally:
        if unset:
            del os.environ[_JEMALLOC_CONF]


def main() -> None:
    """Preload, then run PySpark's daemon (or exec it unchanged if threads started)."""
    global preloaded
    _preload()
    running = threads()
    if running != 1:
        why = ("could not count its threads" if running is None
               else f"started {running - 1} thread(s)")
        print(f"weir: preloading {', '.join(PRELOAD)} {why}: "
              "running PySpark's daemon without preloading", file=sys.stderr)
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    preloaded = True
    gc.freeze()  # forked workers leave the preloaded objects' pages shared
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":  # run as the module itself, so workers see its `preloaded`
    from weir.runtime.spark import daemon as _daemon

    _daemon.main()
