"""weir.stream.supervise: a continuous job's driver run again after the job failed, as
its restart strategy allows (``weir.spark.supervise``'s counterpart; the restart loop
of both is ``weir.runtime.supervision``).

A real job whose keyed function fails at three given records — with no restart of its
own (``JobConfig(restart_strategy=no_restart())``), so each failure ends the run — is
supervised to its end: each new run takes the checkpoint storage over from the failed
one at once and continues from the newest completed checkpoint, and the committed
output holds every record exactly once (lost = duplicated = keys with a wrong count =
0), with as many restarts as failures injected. Fake runs cover the messages, giving
up, the arguments and ``KeyboardInterrupt``."""

from __future__ import annotations

import logging
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import weir
import weir.stream
from continuous_helpers import Count, by_value, lost_duplicated_wrong
from weir.connectors import FileSink, SequenceSource, read_stream_sink
from weir.errors import ConfigurationError, JobFailedError, RestartsExhaustedError
from weir.stream import CheckpointConfig, JobResult, RestartStrategy, StreamEnvironment

KEYS = 50  # (Count's: n % 50)


@pytest.fixture(autouse=True)
def _by_value() -> None:
    by_value(sys.modules[__name__])


class FailingCount(Count):
    """Count, raising once at each record ``v`` that has a token file ``fail-at-<v>`` in
    ``tokens`` (the token is taken first: the run after it goes past ``v``)."""

    def __init__(self, tokens: str) -> None:
        self.tokens = tokens

    def process_element(self, value: int, ctx: Any) -> Any:
        import os

        token = os.path.join(self.tokens, f"fail-at-{value}")
        if os.path.exists(token):
            try:
                os.remove(token)
            except FileNotFoundError:
                pass
            else:
                raise RuntimeError(f"injected failure at {value}")
        yield from super().process_element(value, ctx)


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_a_supervised_job_failing_three_times_ends_exactly_once(
    tmp_path: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    n, failing_at = 24_000, [4_000, 11_000, 18_000]
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for value in failing_at:
        (tokens / f"fail-at-{value}").touch()
    config = weir.JobConfig(tmp_path / "chk", parallelism=2, max_parallelism=32,
                            state_backend=backend,
                            checkpointing=CheckpointConfig(interval=100),
                            restart_strategy=RestartStrategy.no_restart())
    runs: list[int] = []

    def run_job() -> JobResult:
        runs.append(1)
        env = StreamEnvironment(config)
        (env.from_source(SequenceSource(n, 4_000), uid="numbers")
            .key_by(lambda v: v % KEYS)
            .process(FailingCount(str(tokens)), uid="count")
            .sink_to(FileSink(tmp_path / "out"), uid="sink"))
        return env.execute("supervised", timeout="240 s")

    sleeps: list[float] = []
    with caplog.at_level(logging.WARNING, logger="weir"):
        restarts, result = weir.stream.supervise(
            run_job, restart=RestartStrategy.fixed_delay(attempts=5, delay="2 s"),
            sleep=sleeps.append)

    assert not list(tokens.iterdir())  # every injected failure happened
    assert restarts == len(failing_at) == len(runs) - 1 and sleeps == [2.0] * restarts
    assert isinstance(result, JobResult) and result.restarts == 0  # (the last run's)
    lost, duplicated, wrong = lost_duplicated_wrong(read_stream_sink(tmp_path / "out"), n)
    print(f"[{backend}] L={lost} D={duplicated} M={wrong} | failures injected="
          f"{len(failing_at)}, restarts={restarts}")
    assert (lost, duplicated, wrong) == (0, 0, 0)
    state = weir.read_state(str(tmp_path / "chk")).keyed_state("count", "count")
    assert dict(zip(state["key"], state["value"], strict=True)) == {
        k: n // KEYS for k in range(KEYS)}
    assert not list((tmp_path / "out" / ".pending").iterdir())

    # one WARNING per restart, naming the run, the strategy and the injected failure
    warnings = [r.getMessage() for r in caplog.records if r.name == "weir"
                and r.getMessage().startswith("weir: continuous job")]
    assert len(warnings) == restarts
    for number, (line, value) in enumerate(zip(warnings, failing_at, strict=True), 1):
        assert "run_job" in line and f"failed; restart {number} (fixed-delay(" in line
        assert "in 2 s: JobFailedError: " in line and f"injected failure at {value}" in line
        assert "\n" not in line
    # each run took the storage over at once from the failed one and went on from the
    # newest completed checkpoint: the first from empty state, the others each from a
    # later checkpoint than the one before
    starts = [r.getMessage() for r in caplog.records if r.name == "weir.checkpoint"
              and "and starts from" in r.getMessage()]
    assert len(starts) == len(runs) and starts[0].endswith("starts from empty state")
    restored = [int(m.group(1)) for s in starts[1:]
                if (m := re.search(r"starts from checkpoint (\d+) ", s))]
    assert len(restored) == restarts and restored == sorted(set(restored))
    assert result.restored[0].startswith(f"checkpoint {restored[-1]} ")


# ------------------------------------------------------------------ fake runs


def test_a_run_raising_is_restarted_until_one_returns(
    caplog: pytest.LogCaptureFixture
) -> None:
    outcomes: list[Any] = [RuntimeError("cannot reach the storage\nsecond line"),
                           JobFailedError("job 'j': task count[0] failed: KeyError: 7"),
                           "done"]
    clock = iter([10.0, 20.0])

    def run_job() -> Any:
        item = outcomes.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    sleeps: list[float] = []
    with caplog.at_level(logging.WARNING, logger="weir"):
        assert weir.stream.supervise(
            run_job, restart=RestartStrategy.failure_rate(2, "60 s", delay="3 s"),
            clock=lambda: next(clock), sleep=sleeps.append) == (2, "done")
    assert sleeps == [3.0, 3.0]
    lines = [r.getMessage() for r in caplog.records if r.name == "weir"]
    assert len(lines) == 2
    assert lines[0].startswith("weir: continuous job run by ") and "run_job" in lines[0]
    assert "restart 1 (failure-rate(" in lines[0]
    assert lines[0].endswith("in 3 s: RuntimeError: cannot reach the storage")
    assert lines[1].endswith("restart 2 (failure-rate(max_failures_per_interval=2, "
                             "failure_rate_interval=60.0, delay=3.0)) in 3 s: "
                             "JobFailedError: job 'j': task count[0] failed: KeyError: 7")


def test_giving_up_raises_from_the_last_error() -> None:
    cause = KeyError(7)
    errors = []
    for _ in range(2):
        try:
            raise JobFailedError("job 'j': task count[0] failed: KeyError: 7") from cause
        except JobFailedError as exc:
            errors.append(exc)
    pending = list(errors)

    def run_job() -> JobResult:
        raise pending.pop(0)

    with pytest.raises(RestartsExhaustedError) as info:
        weir.stream.supervise(run_job, restart=RestartStrategy.fixed_delay(1, "10 ms"),
                              sleep=lambda s: None, rng=random.Random(1))
    message = str(info.value)
    assert message.startswith("continuous job run by ")
    assert ("failed after 1 restart(s) and its restart strategy fixed-delay(attempts=1, "
            "delay=0.01) allows no more: JobFailedError: job 'j': task count[0] failed: "
            "KeyError: 7. Fix the cause") in message
    assert "continues from its newest completed checkpoint" in message
    assert info.value.__cause__ is errors[1] and errors[1].__cause__ is cause
    assert isinstance(info.value, weir.WeirError) and not pending

    def fails() -> None:
        raise ValueError("no such sink directory")

    with pytest.raises(RestartsExhaustedError, match="after 0 restart") as info:
        weir.stream.supervise(fails, restart=RestartStrategy.no_restart())
    assert "ValueError: no such sink directory" in str(info.value)


def test_keyboard_interrupt_propagates_and_the_arguments_are_checked() -> None:
    calls: list[int] = []

    def interrupted() -> None:
        calls.append(1)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        weir.stream.supervise(interrupted, sleep=pytest.fail)
    assert calls == [1]
    with pytest.raises(ConfigurationError, match="restart must be a RestartStrategy"):
        weir.stream.supervise(interrupted, restart="fixed-delay")  # type: ignore[arg-type]
    assert calls == [1]
    assert "supervise" in weir.stream.__all__


def test_a_supervised_job_given_restore_from_restores_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``JobConfig(restore_from=S)`` under supervision: the first run starts from the
    savepoint ``S``; a run after a failure continues the storage's state (Flink: a job
    submitted from a savepoint fails over to its newest checkpoint) — going back to ``S``
    would commit the output since ``S`` once more."""
    n, failing_at = 24_000, [12_000, 18_000]
    from continuous_helpers import completed, wait_for

    def build(env: StreamEnvironment, tokens: str) -> StreamEnvironment:
        (env.from_source(SequenceSource(n, 4_000), uid="numbers")
            .key_by(lambda v: v % KEYS)
            .process(FailingCount(tokens), uid="count")
            .sink_to(FileSink(tmp_path / "out"), uid="sink"))
        return env

    tokens = tmp_path / "tokens"
    tokens.mkdir()
    first = build(StreamEnvironment(weir.JobConfig(
        tmp_path / "chk-a", parallelism=2, max_parallelism=32,
        checkpointing=CheckpointConfig(interval=100))), str(tokens)).execute_async("a")
    wait_for(first, "a checkpoint", lambda: completed(first) >= 1)
    savepoint = first.stop_with_savepoint(str(tmp_path / "sp"))
    first.wait(60)
    done_before = len(read_stream_sink(tmp_path / "out"))
    assert done_before < min(failing_at)  # (the failures come after the savepoint)
    for value in failing_at:
        (tokens / f"fail-at-{value}").touch()

    config = weir.JobConfig(tmp_path / "chk-b", parallelism=2, max_parallelism=32,
                            checkpointing=CheckpointConfig(interval=100),
                            restart_strategy=RestartStrategy.no_restart(),
                            restore_from=savepoint)
    with caplog.at_level(logging.WARNING, logger="weir"):
        restarts, _ = weir.stream.supervise(
            lambda: build(StreamEnvironment(config), str(tokens)).execute(
                "b", timeout="240 s"),
            restart=RestartStrategy.fixed_delay(attempts=5, delay="0 s"))
    assert not list(tokens.iterdir()) and restarts == len(failing_at)
    lost, duplicated, wrong = lost_duplicated_wrong(read_stream_sink(tmp_path / "out"), n)
    print(f"L={lost} D={duplicated} M={wrong} | failures injected={len(failing_at)}, "
          f"restarts={restarts}")
    assert (lost, duplicated, wrong) == (0, 0, 0)
    starts = [r.getMessage() for r in caplog.records if r.name == "weir.checkpoint"
              and "and starts from" in r.getMessage() and "job 'b-" in r.getMessage()]
    assert len(starts) == 1 + restarts and f"restore_from {savepoint}" in starts[0]
    assert all("starts from checkpoint" in s for s in starts[1:])
