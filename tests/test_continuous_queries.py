"""Live state queries of a running continuous job (``descriptor.queryable``,
``JobClient.query_state``, ``weir.QueryableStateClient``): a lookup during processing
is the owning task's value between two records (count and last value of a key always
agree with the input order), the secret is enforced, an unknown operator or state is a
clear error, a job between attempts says it is restarting, and queries never hold
checkpoints back — on the local runner and on Spark."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import weir
from continuous_helpers import Running, by_value
from weir.connectors.stream import FileSink, SequenceSource
from weir.runtime.continuous.master import LocalJob
from weir.stream import CheckpointConfig, RestartStrategy, StreamEnvironment

K = 20  # keys
LAST = weir.ValueStateDescriptor[list[int]]("last").queryable("count-and-last")


class CountAndLast(weir.KeyedProcessFunction[int, list[int]]):
    """Per key: how many values so far and the last one, in one queryable state."""

    def open(self, ctx: Any) -> None:
        self.state = ctx.get_state(LAST)

    def process_element(self, value: int, ctx: Any) -> Any:
        count, _ = self.state.value() or [0, None]
        self.state.update([count + 1, value])
        yield [value % K, value, count + 1]


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


def environment(tmp_path: Path, n: int, rate: float, parallelism: int = 2
                ) -> StreamEnvironment:
    env = StreamEnvironment(
        weir.JobConfig(
            tmp_path / "chk",
            parallelism=parallelism,
            checkpointing=CheckpointConfig(interval=100),
            restart_strategy=RestartStrategy.fixed_delay(attempts=1, delay="0 s"),
        )
    )
    # one source subtask: each key's values arrive in order, k, k + K, k + 2K, ...
    (env.from_source(SequenceSource(n, rate), uid="numbers", parallelism=1)
        .key_by(lambda v: v % K).process(CountAndLast(), uid="count")
        .sink_to(FileSink(tmp_path / "out"), uid="sink"))
    return env


def check(key: int, answer: Any, before: dict[int, int]) -> None:
    """A count and last value of one moment: the count-th value of the key, and no
    fewer than an earlier answer."""
    if answer is None:
        assert before.get(key, 0) == 0
        return
    count, last = answer
    assert last == key + (count - 1) * K, (key, answer)
    assert count >= before.get(key, 0)
    before[key] = count


def queries(tmp_path: Path, runner: str, spark: Any = None) -> None:
    # (the test session's Spark has two slots: a source and one keyed task)
    env = environment(tmp_path, 10**9, 10_000, 2 if runner == "local" else 1)
    job = env.execute_async("queries", runner=runner, spark=spark)
    try:
        deadline = time.monotonic() + 60
        while not any(s.status.value == "completed" for s in job.checkpoints()):
            assert time.monotonic() < deadline and not job.done
            time.sleep(0.02)
        seen: dict[int, int] = {}
        with weir.QueryableStateClient(job.query_address, job.query_secret) as client:
            for i in range(300):
                key = i % K
                check(key, job.query_state("count", "count-and-last", key), seen)
                check(key, client.get("count", "count-and-last", key), seen)
            assert sum(seen.values()) > 0
            with pytest.raises(weir.QueryError, match=r"no queryable state 'nope'.*"
                                                      "count-and-last"):
                client.get("count", "nope", 1)
            with pytest.raises(weir.QueryError, match="no keyed operator 'nobody'"):
                job.query_state("nobody", "count-and-last", 1)
            with pytest.raises(weir.QueryError, match="does not encode"):
                client.get("count", "count-and-last", object())
        with pytest.raises(weir.QueryError, match="secret was not proven"):
            weir.QueryableStateClient(job.query_address, "not-the-secret")
        if runner == "local":
            command_line(job)
        completed = len(job.checkpoints())
        started = time.monotonic()
        for i in range(1000):  # a storm of lookups: checkpoints go on
            job.query_state("count", "count-and-last", i % K)
        storm_s = time.monotonic() - started
        assert len(job.checkpoints()) > completed or storm_s < 0.2
        print(f"[{runner}] 1,000 lookups in {storm_s:.2f} s; checkpoints "
              f"{completed} -> {len(job.checkpoints())}")
        assert not job.done and job.cancel().restarts == 0
    finally:
        if not job.done:
            job.cancel()


def command_line(job: Any) -> None:
    """``weir job metrics / checkpoints / query`` against the running job."""
    from typer.testing import CliRunner

    from weir.cli import app

    cli, env = CliRunner(), {"WEIR_QUERY_SECRET": job.query_secret, "COLUMNS": "200"}
    deadline = time.monotonic() + 30  # (rates need two heartbeats of every task)
    while len(job.metrics()) < 3:
        assert time.monotonic() < deadline, job.metrics()
        time.sleep(0.05)
    shown = cli.invoke(app, ["job", "metrics", job.query_address, "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    tasks = {(m["operator"], m["subtask"]) for m in json.loads(shown.output)}
    assert tasks == {("numbers", 0), ("count", 0), ("count", 1)}
    shown = cli.invoke(app, ["job", "checkpoints", job.query_address], env=env)
    assert shown.exit_code == 0 and "completed" in shown.output, shown.output
    shown = cli.invoke(app, ["job", "query", job.query_address, "count", "count-and-last",
                             "3"], env=env)
    assert shown.exit_code == 0, shown.output
    count, last = json.loads(shown.output)
    assert last == 3 + (count - 1) * K
    shown = cli.invoke(app, ["job", "metrics", job.query_address],
                       env={**env, "WEIR_QUERY_SECRET": "wrong"})
    assert shown.exit_code != 0 and "secret" in shown.output


def test_live_lookups_on_the_local_runner(tmp_path: Path) -> None:
    queries(tmp_path, "local")


@pytest.mark.spark
def test_live_lookups_on_spark(tmp_path: Path, spark: Any) -> None:
    queries(tmp_path, "spark", spark)


def test_a_job_between_attempts_says_it_is_restarting(tmp_path: Path) -> None:
    env = environment(tmp_path, 1_000_000, 20_000)
    job = LocalJob(env.job_graph("restarting"), env.checkpointing,
                   restart=RestartStrategy.fixed_delay(attempts=1, delay="1.0 s"))
    running = Running(job)
    running.until(lambda: len(job.result.completed) >= 1)
    assert job.queries.ask("count", "count-and-last", 3).result(10) is not None
    running.kill(("count", 0))
    running.until(lambda: job.attempt == 1 or bool(job.result.failures))
    with pytest.raises(weir.QueryError, match="restarting"):
        job.queries.ask("count", "count-and-last", 3).result(10)
    running.until(lambda: len(job.result.completed) >= 2 and job.attempt == 1)
    deadline = time.monotonic() + 30
    while True:  # the new attempt answers again
        try:
            assert job.queries.ask("count", "count-and-last", 3).result(10) is not None
            break
        except weir.QueryError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    job.cancel()
    running.join()
