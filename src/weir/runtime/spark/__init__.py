"""The Spark micro-batch runtime (public entry points are in :mod:`weir.spark`).

* :mod:`~weir.runtime.spark.routing` — partition ``i`` == subtask ``i``;
* :mod:`~weir.runtime.spark.records` — records in, outputs out (Arrow);
* :mod:`~weir.checkpoint.epochs` — one checkpoint per batch: parts, completion;
* :mod:`~weir.runtime.spark.task` — the task that runs a subtask for one batch.
"""
