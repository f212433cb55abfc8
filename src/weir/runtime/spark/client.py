"""The job handle of a Spark query that runs weir stages: the same verbs as the
continuous runtime's :class:`weir.stream.JobClient` — :meth:`JobClient.trigger_savepoint`,
:meth:`JobClient.stop_with_savepoint` (``drain=``), :meth:`JobClient.checkpoints` (the
one statistics model, :mod:`weir.checkpoint.stats`), :meth:`JobClient.metrics`,
:meth:`JobClient.cancel`, :meth:`JobClient.wait` and :attr:`JobClient.done` — over
:mod:`weir.runtime.spark.lifecycle`.

.. code-block:: python

    query = out.writeStream.format("weir-files")...start()
    job = weir.spark.JobClient(query, config)
    savepoint = job.trigger_savepoint("/data/savepoints")   # a new savepoint-<query>-<id>/
    final = job.stop_with_savepoint("/data/savepoints", drain=True)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from weir.api.config import JobConfig
from weir.api.durations import Duration, duration
from weir.checkpoint.epochs import EpochStore
from weir.checkpoint.protocol import new_savepoint_directory
from weir.checkpoint.stats import CheckpointStats, checkpoint_stats
from weir.checkpoint.storage import CheckpointStorage
from weir.errors import ConfigurationError
from weir.runtime.spark.lifecycle import finish, savepoint, stop_with_savepoint
from weir.runtime.spark.observed import checkpoint_metrics
from weir.runtime.task_metrics import TaskMetrics

__all__ = ["JobClient"]


class JobClient:
    """A running (or finished) Spark query whose weir stages keep their checkpoints in
    ``config.storage``."""

    def __init__(self, query: Any, config: JobConfig) -> None:
        if not isinstance(config, JobConfig):
            raise ConfigurationError(f"config must be the weir.JobConfig the query's stages "
                                     f"were built with, got {type(config).__name__}")
        self.query, self.config = query, config

    @property
    def job_name(self) -> str:
        """The query's name, or its id."""
        return str(self.query.name or self.query.id)

    @property
    def done(self) -> bool:
        """Whether the query has ended."""
        return not self.query.isActive

    def _options(self) -> dict[str, Any] | None:
        options = self.config.storage_options
        return None if options is None else dict(options)

    def wait(self, timeout: Duration | None = None) -> int | None:
        """Wait for the query to end (at most ``timeout``; None: as long as it runs),
        complete its last batch's checkpoint; the last batch id it committed (None: it
        committed none, or it is still running after ``timeout``)."""
        if timeout is None:
            self.query.awaitTermination()
        elif not self.query.awaitTermination(duration(timeout, "timeout").total_seconds()):
            return None
        return finish(self.query)

    def cancel(self) -> int | None:
        """Stop the query (without a savepoint) and complete its last batch's checkpoint;
        the last batch id it committed."""
        self.query.stop()
        return finish(self.query)

    def trigger_savepoint(self, target: str) -> str:
        """A savepoint of every stage in the storage, as of its newest completed batch,
        in a new ``savepoint-<query>-<id>/`` directory inside ``target`` (what else
        ``target`` holds is never touched); its URL. The query goes on."""
        fresh = new_savepoint_directory(str(target), self.job_name, self._options())
        return savepoint(self.config.storage, fresh.url, storage_options=self._options())

    def stop_with_savepoint(self, target: str, *, drain: bool = False,
                            timeout: Duration = "5 min") -> str:
        """Stop the query with a final savepoint in a new directory inside ``target``
        (``drain``: after one more batch at the final watermark, so every event-time
        timer fires); its URL."""
        fresh = new_savepoint_directory(str(target), self.job_name, self._options())
        return stop_with_savepoint(self.query, self.config.storage, fresh.url, drain=drain,
                                   timeout=duration(timeout, "timeout"),
                                   storage_options=self._options())

    def checkpoints(self) -> list[CheckpointStats]:
        """This query's completed checkpoints (one per batch and stage), oldest first."""
        location = CheckpointStorage(self.config.storage, storage_options=self._options())
        query = str(self.query.id)
        found = [checkpoint_stats(done.metadata, location=done.url, query=query)
                 for directory in EpochStore.stage_dirs(location)
                 for _, done in EpochStore.at(location, directory).completed_checkpoints(query)]
        return sorted(found, key=lambda s: (s.completed_timestamp_ms or 0, s.checkpoint_id))

    def metrics(self) -> list[TaskMetrics]:
        """Each stage's metrics of the newest batch of this query that completed its
        checkpoint, in the shape of the continuous runtime's
        (:class:`~weir.runtime.task_metrics.TaskMetrics`; subtask None: summed over the
        stage's subtasks), by uid: records, outputs, late records, dead letters, timers
        fired, state entries, the checkpoint's state size, checkpointed size and
        duration (``weir.runtime.spark.observed``), read from the checkpoint; per
        second over the batch's duration in Spark's progress. A stage whose newest
        checkpoint was written by a weir that did not record them there has none."""
        location = CheckpointStorage(self.config.storage, storage_options=self._options())
        query = str(self.query.id)
        progress = {int(getattr(p, "batchId", -1)): p for p in self.query.recentProgress}
        found: dict[str, TaskMetrics] = {}
        for directory in EpochStore.stage_dirs(location):
            store = EpochStore.at(location, directory)
            for batch, done in store.completed_checkpoints(query, newest_first=True):
                for uid in done.metadata.operators:  # (a stage's checkpoint: its one uid)
                    values = checkpoint_metrics(done.metadata, uid)
                    if values is not None:
                        found.setdefault(uid, _stage_metrics(
                            uid, batch, progress.get(batch), values, done.metadata))
                break
        return [found[uid] for uid in sorted(found)]

    def __repr__(self) -> str:
        return f"JobClient(query={self.job_name!r}, storage={self.config.storage!r})"


def _stage_metrics(uid: str, batch: int, progress: Any, values: dict[str, float],
                   meta: Any) -> TaskMetrics:
    """One stage's metrics of one batch as :class:`TaskMetrics` (rates over the batch's
    duration in Spark's progress, when it is still there; else over the checkpoint's)."""
    if progress is not None:
        seconds = max(float(getattr(progress, "batchDuration", 0) or 0), 1.0) / 1000
        # (Spark's progress timestamp is ISO-8601 UTC, "...Z"; anything else is an error)
        at_ms = int(datetime.fromisoformat(str(progress.timestamp)).timestamp() * 1000)
    else:
        seconds = max(float(meta.duration_ms or 0), 1.0) / 1000
        at_ms = int(meta.trigger_timestamp_ms)
    count = {name: int(values.get(name, 0) or 0) for name in (
        "records", "outputs", "late_records", "dead_letters", "timers_fired",
        "state_entries", "state_size", "checkpointed_size", "subtasks", "restored")}
    return TaskMetrics(
        uid, None, round(count["records"] / seconds, 1), round(count["outputs"] / seconds, 1),
        None, at_ms, batch=batch,
        records_in=count["records"], records_out=count["outputs"],
        late_records=count["late_records"], dead_letters=count["dead_letters"],
        timers_fired=count["timers_fired"], state_entries=count["state_entries"],
        state_size=count["state_size"], checkpointed_size=count["checkpointed_size"],
        checkpoint_duration_ms=float(values.get("checkpoint_duration_ms", 0) or 0),
        subtasks=count["subtasks"], restored=count["restored"])
