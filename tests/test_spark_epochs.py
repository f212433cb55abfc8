"""The Spark runtime's protocol without Spark: compare-and-set in storage, the claim
chain (one owner, fencing, lineage), batch completion (one winner, attempt choice,
stale parts) and what each task restores — checked directly, with threads racing."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import weir
from weir.checkpoint.epochs import EpochStore, choose_parts
from weir.checkpoint.format import SubtaskStateHandle
from weir.checkpoint.ownership import QUERY, Lineage
from weir.errors import (
    FencedError,
    IncompleteBatchError,
    MissingStateError,
    OwnershipError,
)
from weir.runtime.spark.plan import plan_batch
from weir.runtime.spark.recovery import recover_stage
from weir.state.keygroups import key_group_range_for_operator


def _store(tmp_path: Path, uid: str = "op") -> tuple[EpochStore, Lineage]:
    store = EpochStore(weir.CheckpointStorage(str(tmp_path / "loc")), uid)
    return store, Lineage(store.stage, lease_timeout_ms=60_000)


def _publish(store: EpochStore, query: str, batch: int, p: int, subtasks: Any = None,
             attempt: str = "a1", written_ms: int | None = None) -> None:
    for i in range(p) if subtasks is None else subtasks:
        handle = SubtaskStateHandle(i, key_group_range_for_operator(128, p, i), {}, (), None,
                                    {}, {}, None)
        epoch: dict[str, Any] = {"attempt": f"{attempt}{i:02d}", "batch_time": 1000 + batch}
        store.write_part(query, batch, p, 128, handle, epoch)
        if written_ms is not None:  # rewrite with a chosen publication time
            path = store.query_storage(query).full_path(
                f"chk-{batch}/_parts/{i}-{attempt}{i:02d}.part")
            from weir.checkpoint.format import encode_part

            Path(path).write_bytes(encode_part(store.uid, p, 128, handle,
                                               {**epoch, "written_ms": written_ms}))


def _race(n: int, target: Any) -> list[Any]:
    results: list[Any] = [None] * n
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = target()
        except Exception as exc:  # collected for the assertions
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# ------------------------------------------------------------------ compare-and-set


@pytest.mark.parametrize("url", ["local", "memory://weir-cas"])
def test_create_exclusive_has_exactly_one_winner(tmp_path: Path, url: str) -> None:
    storage = weir.CheckpointStorage(str(tmp_path) if url == "local" else url)
    results = _race(16, lambda: storage.create_exclusive("a/claim", b"x"))
    assert results.count(True) == 1 and results.count(False) == 15
    assert storage.read_bytes("a/claim") == b"x"
    assert [n for n in storage.list_dir("a") if ".tmp-" in n] == []


# ------------------------------------------------------------------ claims


def test_racing_new_queries_give_one_owner_and_refuse_the_others(tmp_path: Path) -> None:
    store, lineage = _store(tmp_path)
    results = _race(8, lambda: plan_batch(
        store, Lineage(store.stage), f"q{threading.get_ident()}", 0, parallelism=2))
    owners = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, OwnershipError)]
    assert len(owners) == 1 and len(refused) == 7
    assert lineage.tokens() == [1]


def test_a_new_query_takes_over_a_released_owner_and_the_old_one_is_fenced(
    tmp_path: Path,
) -> None:
    store, lineage = _store(tmp_path)
    first = plan_batch(store, lineage, "q1", 0, parallelism=2)
    _publish(store, "q1", 0, 2)
    store.complete("q1", 0)
    with pytest.raises(OwnershipError, match="owned by query q1, which is running"):
        plan_batch(store, lineage, "q2", 0, parallelism=2)
    lineage.release(first.claim.token)
    second = plan_batch(store, lineage, "q2", 0, parallelism=2)
    assert second.checkpoint is not None and second.checkpoint.checkpoint_id == 0
    assert "q1" in second.checkpoint.url and second.claim.token == 2
    with pytest.raises(FencedError, match="query q1 was fenced off: query q2"):
        plan_batch(store, lineage, "q1", 1, parallelism=2)
    assert not lineage.is_head(first.claim.token)


def test_a_claim_a_stopped_querys_late_task_writes_does_not_hold_the_stage(
    tmp_path: Path,
) -> None:
    """Spark's stop() returns while a killed task's Python worker may still run (up to
    spark.python.task.killTimeout): here that task takes the stage over only after
    finish() gave the query's stages up. Its claim counts as released at once, so the
    next query is not refused for a lease timeout (and the late one is fenced)."""
    from weir.runtime.spark.listener import Completion, Stage

    store, lineage = _store(tmp_path)
    first = plan_batch(store, lineage, "q1", 0, parallelism=1)
    lineage.release(first.claim.token)  # an earlier query, stopped and finished
    completion = Completion()
    completion.stages[(store.location.location, store.uid)] = Stage(store, lineage, 1)
    completion.on_terminated("q2")  # finish(q2): no claim of q2 to release yet
    late = plan_batch(store, Lineage(store.stage), "q2", 0, parallelism=1)
    assert late.claim.query == "q2" and lineage.head() == late.claim
    taken = plan_batch(store, lineage, "q3", 0, parallelism=1)
    assert taken.claim.query == "q3" and taken.claim.token == late.claim.token + 1
    with pytest.raises(FencedError, match="query q2 was fenced off: query q3"):
        plan_batch(store, lineage, "q2", 1, parallelism=1)
    # the marker went with the claim that followed it; a live owner is never marked
    assert not any(n.startswith("stopped-") for n in store.stage.list_dir("claims"))
    completion.on_terminated("q4")
    assert not lineage.stopped("q4") and lineage.alive(taken.claim)


def test_a_late_termination_event_of_the_previous_query_does_not_lose_the_next_ones_stage(
    tmp_path: Path,
) -> None:
    """The listener's onQueryTerminated of query 1 can arrive after query 2's process()
    registered the same stage (test_spark_protocol test_1 failed so under load): query
    2's registration must survive it, so that finish(query 2) still releases the
    stage and query 3 is not refused for a lease timeout."""
    from weir.runtime.spark.listener import Completion, Stage

    store, lineage = _store(tmp_path)
    key = (store.location.location, store.uid)
    completion = Completion()
    completion.stages[key] = Stage(store, lineage, 1)  # query 1's process()
    plan_batch(store, lineage, "q1", 0, parallelism=1)
    completion.on_terminated("q1")  # finish(query 1)
    completion.stages[key] = Stage(store, lineage, 1)  # query 2's process()
    completion.on_terminated("q1")  # the listener's late event for query 1
    store.mark_empty("q2", 0)  # its batch 0 had no row for the stage
    plan_batch(store, lineage, "q2", 1, parallelism=1)  # query 2 takes the stage over
    completion.on_terminated("q2")  # finish(query 2)
    taken = plan_batch(store, lineage, "q3", 0, parallelism=1)
    assert taken.claim.query == "q3"


def test_an_owner_whose_lease_expired_can_be_taken_over(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    short = Lineage(store.stage, lease_timeout_ms=0)
    plan_batch(store, short, "q1", 0, parallelism=1)
    taken = plan_batch(store, short, "q2", 0, parallelism=1)
    assert taken.claim.query == "q2" and "gone" in taken.claim.reason


# ------------------------------------------------------------------ what a batch restores


def test_a_batch_whose_previous_batch_is_missing_is_an_error_never_a_fallback(
    tmp_path: Path,
) -> None:
    store, lineage = _store(tmp_path)
    with pytest.raises(MissingStateError, match="holds no state of this stage at all"):
        plan_batch(store, lineage, "q1", 5, parallelism=2)
    plan_batch(store, lineage, "q1", 0, parallelism=2)
    for batch in range(3):
        _publish(store, "q1", batch, 2)
    store.complete("q1", 0)
    prior = plan_batch(store, lineage, "q1", 3, parallelism=2).prior
    assert prior is not None and prior.batch == 2
    with pytest.raises(MissingStateError, match="chk-4 is missing"):
        plan_batch(store, lineage, "q1", 5, parallelism=2)


def test_a_committed_batch_with_missing_subtasks_names_partial_output(tmp_path: Path) -> None:
    store, lineage = _store(tmp_path)
    plan_batch(store, lineage, "q1", 0, parallelism=3)
    _publish(store, "q1", 0, 3, subtasks=[0, 2])
    with pytest.raises(IncompleteBatchError, match=r"subtasks \[1\] of 3 never processed"):
        plan_batch(store, lineage, "q1", 1, parallelism=3)


def test_stale_parts_of_another_parallelism_never_block_a_batch(tmp_path: Path) -> None:
    store, lineage = _store(tmp_path)
    plan_batch(store, lineage, "q1", 0, parallelism=4)
    _publish(store, "q1", 0, 4, subtasks=[0, 1, 3], attempt="b")  # crashed at p = 4
    _publish(store, "q1", 0, 2, attempt="c")  # replayed at p = 2
    prior = plan_batch(store, lineage, "q1", 1, parallelism=2).prior
    assert prior is not None and prior.parallelism == 2
    assert prior.full().metadata.operators["op"].parallelism == 2
    assert prior.positions["attempts"] == {"0": "c00", "1": "c01"}


def test_a_late_attempt_never_replaces_the_chosen_one(tmp_path: Path) -> None:
    store, lineage = _store(tmp_path)
    plan_batch(store, lineage, "q1", 0, parallelism=2)
    _publish(store, "q1", 0, 2, attempt="a", written_ms=2000)
    _publish(store, "q1", 0, 2, subtasks=[1], attempt="b", written_ms=1000)  # speculative
    assert [p.epoch["attempt"] for p in choose_parts(store.read_parts("q1", 0)) or []] == [
        "a00", "b01"]
    done = store.complete("q1", 0)
    _publish(store, "q1", 0, 2, attempt="c", written_ms=1)  # a zombie after completion
    again = plan_batch(store, lineage, "q1", 1, parallelism=2).prior
    assert again is not None  # (read from the summary)
    assert again.source_positions == {
        k: v for k, v in done.metadata.source_positions.items() if k != "spark_io"}
    assert [again.for_subtask(i, 2).metadata.operators["op"].subtasks for i in (0, 1)] == [
        (h,) for h in done.metadata.operators["op"].subtasks]


def test_concurrent_completions_write_one_metadata_and_agree(tmp_path: Path) -> None:
    store, lineage = _store(tmp_path)
    plan_batch(store, lineage, "q1", 0, parallelism=3)
    for batch in range(4):
        _publish(store, "q1", batch, 3)
    for batch in range(4):
        results = _race(8, lambda b=batch: store.complete("q1", b, 3))
        assert not [r for r in results if isinstance(r, Exception)]
        assert len({r.metadata.completion_timestamp_ms for r in results}) == 1
    files = store.query_storage("q1").walk_files()
    assert [f for f in files if ".tmp-" in f] == []
    assert store.completed_ids("q1") == [1, 2, 3]  # retained = 3


def test_recover_latest_skips_nothing_silently_and_is_adopted_once(tmp_path: Path) -> None:
    store, lineage = _store(tmp_path)
    plan_batch(store, lineage, "q1", 0, parallelism=1)
    for batch in range(2):
        _publish(store, "q1", batch, 1)
        store.complete("q1", batch)
    lineage.release(1)
    done = recover_stage(str(tmp_path / "loc"), "op", "latest")
    assert "checkpoint 1 of query q1" in done.message
    adopted = plan_batch(store, lineage, "q1", 7, parallelism=1)
    assert adopted.claim.kind == QUERY and adopted.claim.batch == 7
    assert adopted.checkpoint is not None and adopted.checkpoint.checkpoint_id == 1
    assert [c.kind for c in lineage.claims()] == ["query", "recovery", "query"]
    with pytest.raises(OwnershipError, match="may still be running"):
        recover_stage(str(tmp_path / "loc"), "op", "empty")


def test_weir_spark_recover_on_the_command_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from weir.cli import app

    store, lineage = _store(tmp_path)
    first = plan_batch(store, lineage, "q1", 0, parallelism=1)
    runner = CliRunner()
    refused = runner.invoke(app, ["spark", "recover", str(tmp_path / "loc"), "--uid", "op"])
    assert refused.exit_code == 1 and "may still be running" in refused.output
    lineage.release(first.claim.token)
    done = runner.invoke(app, ["spark", "recover", str(tmp_path / "loc"), "--uid", "op",
                               "--from", "empty"])
    assert done.exit_code == 0 and "continues from empty state" in done.output
    assert lineage.head() is not None and lineage.head().kind == "recovery"  # type: ignore[union-attr]


# ------------------------------------------------------------------ changelog sweeping


def test_completion_sweeps_unused_materializations_only_once_no_batch_can_use_them(
    tmp_path: Path,
) -> None:
    from weir.checkpoint.epochs import MATERIALIZATION_MAX_LAG
    from weir.checkpoint.format import uid_dir

    store, _ = _store(tmp_path)
    query = "q"
    shared = store.query_storage(query)
    batch = MATERIALIZATION_MAX_LAG + 10
    names = {
        "old": f"shared/{uid_dir('op')}/m9-aa.keyed",  # 9 < batch - lag: no batch uses it
        "young": f"shared/{uid_dir('op')}/m10-bb.keyed",  # a batch up to 10 + lag may
        "delta": f"shared/{uid_dir('op')}/{batch}-cc.delta",  # an attempt not chosen
        "later": f"shared/{uid_dir('op')}/{batch + 1}-dd.delta",  # the running batch's
    }
    for path in names.values():
        shared.write(path, b"x")
    _publish(store, query, batch, 2)
    store.complete(query, batch)
    left = {k for k, path in names.items() if shared.exists(path)}
    assert left == {"young", "later"}


# ------------------------------------------------------------------ a location that stays small


def test_older_queries_directories_go_once_the_owner_retains_its_own_checkpoints(
    tmp_path: Path,
) -> None:
    store, lineage = _store(tmp_path)
    first = plan_batch(store, lineage, "q1", 0, parallelism=2)
    for batch in range(2):
        _publish(store, "q1", batch, 2)
        store.complete("q1", batch)
    lineage.release(first.claim.token)
    store.stage.write("queries/q9/chk-0/_empty", b"{}")  # a new query, no claim yet
    started = plan_batch(store, lineage, "q2", 0, parallelism=2)
    assert started.checkpoint is not None and "/queries/q1/" in started.checkpoint.url
    for batch in range(store.retained):
        assert "q1" in store.queries()  # still needed, or older than nothing retained
        _publish(store, "q2", batch, 2)
        store.complete("q2", batch)
    assert store.queries() == ["q2", "q9"]


def test_a_pinned_or_restored_from_older_query_stays(tmp_path: Path) -> None:
    store, lineage = _store(tmp_path)
    first = plan_batch(store, lineage, "q1", 0, parallelism=1)
    _publish(store, "q1", 0, 1)
    pinned = store.complete("q1", 0)
    lineage.release(first.claim.token)
    plan_batch(store, lineage, "q2", 0, parallelism=1)
    pin = store.pin(pinned)  # a savepoint copying q1's checkpoint
    for batch in range(store.retained):
        _publish(store, "q2", batch, 1)
        store.complete("q2", batch)
    assert "q1" in store.queries()
    store.unpin(pin)
    _publish(store, "q2", 3, 1)
    store.complete("q2", 3)
    assert store.queries() == ["q2"]


def test_dead_letters_older_than_their_retention_are_swept_every_hundred_batches(
    tmp_path: Path,
) -> None:
    import os
    import time

    from weir.checkpoint.epoch_retention import DEAD_LETTER_SWEEP_BATCHES
    from weir.checkpoint.format import uid_dir

    store, lineage = _store(tmp_path)
    store.dead_letter_retention_ms = 3_600_000
    loc = store.location
    old = f"dead-letter/q/batch=1/{uid_dir('op')}-0.jsonl"
    other_stage = f"dead-letter/q/batch=1/{uid_dir('other')}-0.jsonl"
    young = f"dead-letter/q/batch=2/{uid_dir('op')}-0.jsonl"
    for path in (old, other_stage, young):
        loc.write(path, b'{"reason": "x"}\n')
    day_ago = time.time() - 86_400
    for path in (old, other_stage):
        os.utime(loc.full_path(path), (day_ago, day_ago))
    plan_batch(store, lineage, "q", 0, parallelism=1)
    for batch in (DEAD_LETTER_SWEEP_BATCHES - 1, DEAD_LETTER_SWEEP_BATCHES):
        _publish(store, "q", batch, 1)
        store.complete("q", batch)
        swept = batch % DEAD_LETTER_SWEEP_BATCHES == 0
        assert loc.exists(old) != swept
    assert loc.exists(other_stage) and loc.exists(young)  # another stage's; a young one
