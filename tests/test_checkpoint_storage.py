"""Checkpoint storage on every filesystem weir supports (local path, ``file://``,
``memory://``, ``s3://`` against a local moto server), atomic publishing, the
``weir checkpoint inspect`` command, and the guarantee that restoring never runs
code found in a checkpoint (no pickle unless the user chose PickleSerializer)."""

from __future__ import annotations

import hashlib
import json
import operator
import os
import pickle
import random
import socket
import struct
import subprocess
import sys
import uuid
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem
from typer.testing import CliRunner

from weir import (
    CheckpointCoordinator,
    CheckpointError,
    CheckpointFormatError,
    CheckpointKind,
    CheckpointStorage,
    CompletedCheckpoint,
    CorruptCheckpointError,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    RocksDBCompactFilterCleanup,
    StateSerializationError,
    StateTtlConfig,
    ValueStateDescriptor,
    WeirError,
    load_checkpoint,
    take_checkpoint,
    take_savepoint,
)
from weir.api.serializers import PickleSerializer
from weir.checkpoint.format import FORMAT_VERSION, decode_keyed, encode_keyed
from weir.checkpoint.storage import TMP_MARKER, FileRef
from weir.cli import app
from weir.state.keygroups import assign_key_to_parallel_operator, assign_to_key_group
from weir.testing import KeyedOperatorHarness

MAXP = 32
BUCKET = "weir-checkpoints"
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}

# ------------------------------------------------------------------ a job and its oracle

COUNT = ValueStateDescriptor("count")
SEEN = ListStateDescriptor("seen")
PARITY = MapStateDescriptor("parity")
TOTAL = ReducingStateDescriptor("total", reduce_function=operator.add)


class Tally(KeyedProcessFunction[Any, Any]):
    """Per key: a count, every value seen, a count per parity, a running total and
    an event-time timer per value (all four state kinds plus timers)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)
        self.seen = ctx.get_list_state(SEEN)
        self.parity = ctx.get_map_state(PARITY)
        self.total = ctx.get_reducing_state(TOTAL)

    def process_element(self, value: Any, ctx: Any) -> None:
        _, v = value
        self.count.update((self.count.value() or 0) + 1)
        self.seen.add(v)
        self.parity.put(v % 2, self.parity.get(v % 2, 0) + 1)
        self.total.add(v)
        ctx.timer_service.register_event_time_timer(10_000 + v)


def key_of(element: Any) -> Any:
    return element[0]


class Oracle:
    """What Tally's state must be after the elements fed so far."""

    def __init__(self) -> None:
        self.seen: dict[Any, list[int]] = defaultdict(list)

    def feed(self, element: Any) -> None:
        self.seen[element[0]].append(element[1])

    def copy(self) -> Oracle:
        other = Oracle()
        for key, values in self.seen.items():
            other.seen[key] = list(values)
        return other

    def expected(self, key: Any) -> tuple[Any, ...]:
        values = self.seen[key]
        parity: dict[int, int] = {}
        for v in values:
            parity[v % 2] = parity.get(v % 2, 0) + 1
        return len(values), values, parity, sum(values)

    def timers(self) -> set[tuple[int, Any]]:
        return {(10_000 + v, k) for k, values in self.seen.items() for v in values}


def observed(h: KeyedOperatorHarness, key: Any) -> tuple[Any, ...]:
    return tuple(h.state_of(key, d) for d in (COUNT, SEEN, PARITY, TOTAL))


def stream(seed: int, n: int, keys: int = 40) -> list[tuple[Any, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randrange(keys)
        out.append((f"k{k}" if k % 3 else k, rng.randrange(1000)))
    return out


def feed(h: KeyedOperatorHarness, oracle: Oracle, elements: list[tuple[Any, int]]) -> None:
    for e in elements:
        h.process_element(e)
        oracle.feed(e)


def assert_restores(
    completed: CompletedCheckpoint,
    oracle: Oracle,
    backends: tuple[str, ...] = ("hashmap", "rocksdb"),
    parallelisms: tuple[int, ...] = (1, 2),
) -> None:
    """Restoring ``completed`` at each parallelism on each backend gives the oracle's
    state: every key's four states, no extra keys, and every timer."""
    for backend in backends:
        for p in parallelisms:
            timers: set[tuple[int, Any]] = set()
            for i in range(p):
                h = KeyedOperatorHarness.restore(
                    Tally(), key_of, completed, parallelism=p, subtask_index=i,
                    state_backend=backend,
                )
                try:
                    owned = {
                        k for k in oracle.seen
                        if assign_key_to_parallel_operator(k, MAXP, p) == i
                    }
                    assert set(h.keys(COUNT)) == owned, (backend, p, i)
                    for k in owned:
                        assert observed(h, k) == oracle.expected(k), (backend, p, i, k)
                    timers |= set(h.event_time_timers())
                finally:
                    h.close()
            assert timers == oracle.timers(), (backend, p)


# ------------------------------------------------------------------ storage locations


def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any connection that would leave this machine."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address: Any) -> None:
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"a test tried to connect to {address!r}")

    def connect(self: socket.socket, address: Any) -> Any:
        check(address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> Any:
        check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (ephemeral port) holding one bucket."""
    from s3_support import moto_s3

    with moto_s3(BUCKET) as endpoint:
        yield endpoint


@dataclass
class Location:
    """A fresh checkpoint root URL plus the options its filesystem needs."""

    kind: str
    url: str
    options: dict[str, Any] | None

    def sub(self, name: str) -> str:
        return f"{self.url.rstrip('/')}/{name}"

    def storage(self, name: str = "") -> CheckpointStorage:
        return CheckpointStorage(self.sub(name) if name else self.url,
                                 storage_options=self.options)

    def load(self, url: str, **kwargs: Any) -> CompletedCheckpoint:
        return load_checkpoint(url, storage_options=self.options, **kwargs)


@pytest.fixture(params=["local", "file-url", "memory", "s3"])
def location(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Location]:
    kind = request.param
    if kind == "local":
        yield Location(kind, str(tmp_path / "checkpoints"), None)
    elif kind == "file-url":
        yield Location(kind, (tmp_path / "checkpoints").as_uri(), None)
    elif kind == "memory":
        url = f"memory://weir-{uuid.uuid4().hex}"
        yield Location(kind, url, None)
        fs, root = fsspec.core.url_to_fs(url)
        if fs.exists(root):
            fs.rm(root, recursive=True)
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
        for name, value in AWS_ENV.items():
            monkeypatch.setenv(name, value)
        _loopback_only(monkeypatch)
        options = {
            "endpoint_url": endpoint, "key": "testing", "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"},
        }
        yield Location(kind, f"s3://{BUCKET}/{uuid.uuid4().hex}", options)


@pytest.mark.parametrize("location", ["s3"], indirect=True)
def test_s3_location_cannot_leave_this_machine(location: Location) -> None:
    with pytest.raises(AssertionError, match="tried to connect"):
        socket.create_connection(("192.0.2.1", 443), timeout=1)  # TEST-NET-1
    assert location.options is not None
    assert location.options["endpoint_url"].startswith("http://127.0.0.1:")


def no_tmp_files(storage: CheckpointStorage) -> None:
    leftovers = [p for p in storage.walk_files() if TMP_MARKER in p]
    assert leftovers == [], leftovers


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------ storage round trips


def test_write_read_verify_round_trip(location: Location, tmp_path: Path) -> None:
    storage = location.storage()
    data = os.urandom(10_000)
    ref = storage.write("dir/sub/blob.bin", data)
    assert ref == FileRef("dir/sub/blob.bin", len(data), sha(data))
    assert FileRef.from_json(ref.to_json(), "test") == ref
    assert storage.read(ref) == data
    storage.verify(ref)
    assert storage.read_bytes("dir/sub/blob.bin") == data
    assert storage.exists("dir/sub/blob.bin") and storage.exists("dir")
    assert not storage.exists("dir/other.bin")
    assert storage.list_dir() == ["dir"]
    assert storage.list_dir("dir/sub") == ["blob.bin"]
    assert storage.list_dir("nowhere") == [] and storage.walk_files("nowhere") == []
    assert storage.child("dir").read_bytes("sub/blob.bin") == data

    # upload streams a local file in chunks (more than one 4 MiB chunk here)
    big = os.urandom((4 << 20) + 1234)
    (tmp_path / "local.bin").write_bytes(big)
    up = storage.upload("up/big.bin", tmp_path / "local.bin")
    assert up == FileRef("up/big.bin", len(big), sha(big))
    storage.download(up, tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == big

    # publishing again under the same name replaces the file as a whole
    data2 = b"second version"
    ref2 = storage.write("dir/sub/blob.bin", data2)
    assert storage.read(ref2) == data2
    assert storage.walk_files() == ["dir/sub/blob.bin", "up/big.bin"]
    no_tmp_files(storage)

    # every read verifies size and checksum, naming the file
    full = storage.full_path(ref2.path)
    storage.fs.pipe_file(full, b"second versioN")
    with pytest.raises(CorruptCheckpointError, match="SHA-256") as err:
        storage.read(ref2, "checkpoint 7")
    assert "dir/sub/blob.bin" in str(err.value) and "checkpoint 7" in str(err.value)
    storage.fs.pipe_file(full, b"second")
    with pytest.raises(CorruptCheckpointError, match="is 6 bytes, expected 14"):
        storage.verify(ref2)
    storage.delete("dir", recursive=True)
    with pytest.raises(CorruptCheckpointError, match=r"dir/sub/blob\.bin is missing"):
        storage.read(ref2)
    storage.delete("dir/never/there", recursive=True)  # missing is fine
    assert storage.walk_files() == ["up/big.bin"]


def test_checkpoints_and_savepoints_restore_and_retain(location: Location) -> None:
    """Hash-map full, RocksDB full and RocksDB incremental checkpoints plus a savepoint
    of each, on this storage: restored into both backends they equal the oracle;
    retention leaves exactly the files the retained checkpoints reference."""
    for backend, mode in [("hashmap", "full"), ("rocksdb", "full"), ("rocksdb", "incremental")]:
        root = location.sub(f"{backend}-{mode}")
        storage = CheckpointStorage(root, storage_options=location.options)
        coord = CheckpointCoordinator(storage, retained=2)
        oracle = Oracle()
        completed = []
        with KeyedOperatorHarness(Tally(), key_of, state_backend=backend,
                                  max_parallelism=MAXP) as h:
            for seed in range(3):
                feed(h, oracle, stream(seed, 300))
                completed.append(h.checkpoint(coord, mode=mode))
            sp_target = CheckpointStorage(location.sub(f"savepoints/{backend}-{mode}"),
                                          storage_options=location.options)
            savepoint = h.savepoint(coord, sp_target)
        assert [c.checkpoint_id for c in coord.completed_checkpoints] == [2, 3]
        assert savepoint.kind is CheckpointKind.SAVEPOINT and savepoint.checkpoint_id == 4
        assert all(c.kind is CheckpointKind.CHECKPOINT for c in completed)

        # retention: chk-1 is gone; what remains is exactly what chk-2 and chk-3 need
        names = storage.list_dir()
        assert "chk-1" not in names and {"chk-2", "chk-3"} <= set(names)
        assert set(storage.walk_files()) == coord.referenced_files()
        no_tmp_files(storage)
        if mode == "incremental":
            shared2 = completed[1].metadata.shared_files()
            shared3 = completed[2].metadata.shared_files()
            assert shared2 & shared3, "incremental checkpoints reuse uploaded SST files"
            assert completed[2].metadata.operators["operator"].subtasks[0].stats.new_bytes < (
                completed[2].metadata.total_bytes
            )
        else:
            assert "shared" not in names

        # recovery: a new coordinator over the same URL finds chk-3 and restores it
        recovered = CheckpointCoordinator(root, storage_options=location.options, retained=2)
        latest = recovered.latest()
        assert latest is not None and latest.checkpoint_id == 3
        assert_restores(latest, oracle)
        assert_restores(location.load(completed[2].url), oracle, parallelisms=(1,))

        # the savepoint is self-contained: canonical files, no shared/ references
        sp = location.load(location.sub(f"savepoints/{backend}-{mode}"))
        assert sp.kind is CheckpointKind.SAVEPOINT and sp.metadata.shared_files() == set()
        assert not any(p.startswith("shared/") for p in sp_target.walk_files())
        no_tmp_files(sp_target)
        assert_restores(sp, oracle)


def test_retention_deletes_unreferenced_shared_files(location: Location) -> None:
    """Once no retained checkpoint references an SST file (after a compaction), it is
    deleted from the storage; referenced ones stay."""
    ttl = StateTtlConfig(
        ttl_ms=10**9, rocksdb_compact_filter_cleanup=RocksDBCompactFilterCleanup()
    )
    desc = ValueStateDescriptor("v", ttl=ttl)

    class Put(KeyedProcessFunction[Any, Any]):
        def open(self, ctx: Any) -> None:
            self.v = ctx.get_state(desc)

        def process_element(self, value: Any, ctx: Any) -> None:
            self.v.update(value[1])

    storage = location.storage()
    coord = CheckpointCoordinator(storage, retained=2)
    with KeyedOperatorHarness(Put(), key_of, state_backend="rocksdb",
                              max_parallelism=MAXP) as h:
        h.process_elements((k, k) for k in range(50))
        c1 = h.checkpoint(coord, mode="incremental")
        h.process_elements((k, -k) for k in range(25, 75))
        c2 = h.checkpoint(coord, mode="incremental")
        # (SST files: the options file, shared by content, is in every checkpoint)
        old = {p for c in (c1, c2) for p in c.metadata.shared_files() if p.endswith(".sst")}
        assert len(old) >= 2
        h.compact_state()  # merges the SST files into a new one
        c3 = h.checkpoint(coord, mode="incremental")
        assert not c3.metadata.shared_files() & old
        assert all(storage.exists(p) for p in old), "chk-2 still references them"
        c4 = h.checkpoint(coord, mode="incremental")
    assert [c.checkpoint_id for c in coord.completed_checkpoints] == [3, 4]
    assert not any(storage.exists(p) for p in old)
    assert set(storage.walk_files()) == coord.referenced_files()
    assert set(storage.walk_files("shared")) == c4.metadata.shared_files()
    assert storage.list_dir() == ["chk-3", "chk-4", "shared"]
    no_tmp_files(storage)
    h2 = KeyedOperatorHarness.restore(Put(), key_of, c4, parallelism=1, subtask_index=0,
                                      state_backend="hashmap")
    try:
        assert {k: h2.state_of(k, desc) for k in range(75)} == {
            k: (k if k < 25 else -k) for k in range(75)
        }
    finally:
        h2.close()


def test_savepoint_directory_is_relocatable(tmp_path: Path) -> None:
    coord = CheckpointCoordinator(tmp_path / "chk")
    oracle = Oracle()
    with KeyedOperatorHarness(Tally(), key_of, state_backend="rocksdb",
                              max_parallelism=MAXP) as h:
        feed(h, oracle, stream(1, 200))
        h.savepoint(coord, tmp_path / "sp")
    (tmp_path / "sp").rename(tmp_path / "moved")
    assert_restores(load_checkpoint(tmp_path / "moved"), oracle)
    assert_restores(load_checkpoint(tmp_path / "moved" / "_metadata"), oracle, ("hashmap",), (1,))


# ------------------------------------------------------------------ failed publish


class FailingMove:
    """An fsspec filesystem whose ``mv`` (the publish step) fails when ``fail(dst)``."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped
        self.fail: Callable[[str], bool] = lambda dst: False
        self.failed: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def mv(self, path1: str, path2: str, **kwargs: Any) -> Any:
        if self.fail(path2):
            self.failed.append(path2)
            raise OSError(28, "No space left on device (injected)")
        return self.wrapped.mv(path1, path2, **kwargs)


@pytest.fixture(params=["local", "memory"])
def failing_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStorage]:
    if request.param == "local":
        fs = FailingMove(LocalFileSystem())
        yield CheckpointStorage(str(tmp_path / "root"), fs=fs)
    else:
        memfs = fsspec.filesystem("memory")
        root = f"/weir-{uuid.uuid4().hex}"
        yield CheckpointStorage(f"memory://{root}", fs=FailingMove(memfs))
        if memfs.exists(root):
            memfs.rm(root, recursive=True)


def test_failed_publish_leaves_nothing_at_the_final_name(
    failing_storage: CheckpointStorage,
) -> None:
    storage = failing_storage
    fs: FailingMove = storage.fs
    old = storage.write("a/file.bin", b"version 1")
    fs.fail = lambda dst: True
    with pytest.raises(CheckpointError, match=r"cannot write .*a/file\.bin") as err:
        storage.write("a/file.bin", b"version 2")
    assert isinstance(err.value.__cause__, OSError)
    assert "untouched" in str(err.value)
    with pytest.raises(CheckpointError):
        storage.write("a/new.bin", b"never published")
    assert not storage.exists("a/new.bin")
    assert storage.read(old) == b"version 1"  # the previous file is intact
    assert storage.walk_files() == ["a/file.bin"]  # and no temporary file is left
    assert len(fs.failed) == 2


@pytest.mark.parametrize("mode", ["full", "incremental"])
def test_failed_metadata_publish_aborts_the_checkpoint(
    failing_storage: CheckpointStorage, mode: str
) -> None:
    storage = failing_storage
    fs: FailingMove = storage.fs
    coord = CheckpointCoordinator(storage, retained=3)
    oracle = Oracle()
    with KeyedOperatorHarness(Tally(), key_of, state_backend="rocksdb",
                              max_parallelism=MAXP) as h:
        feed(h, oracle, stream(1, 200))
        c1 = h.checkpoint(coord, mode=mode)
        at_c1 = oracle.copy()
        feed(h, oracle, stream(2, 200))
        fs.fail = lambda dst: dst.endswith("/_metadata")
        with pytest.raises(CheckpointError, match="_metadata"):
            h.checkpoint(coord, mode=mode)
        fs.fail = lambda dst: False
        assert coord.latest() is c1
        assert not storage.exists("chk-2")
        assert set(storage.walk_files()) == coord.referenced_files()
        assert CheckpointCoordinator(storage).latest().checkpoint_id == 1  # type: ignore[union-attr]
        assert_restores(c1, at_c1, parallelisms=(1,))
        # the next checkpoint must not reference anything the aborted one uploaded
        feed(h, oracle, stream(3, 100))
        c3 = h.checkpoint(coord, mode=mode)
    assert c3.checkpoint_id == 3
    assert set(storage.walk_files()) == coord.referenced_files()
    assert_restores(c3, oracle)


# ------------------------------------------------------------------ weir checkpoint inspect


def size_text(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB"


def two_subtask_checkpoint(root: Path, mode: str = "full") -> tuple[CheckpointCoordinator,
                                                                     CompletedCheckpoint,
                                                                     CompletedCheckpoint]:
    """A checkpoint and a savepoint of Tally at parallelism 2."""
    coord = CheckpointCoordinator(root / "chk")
    backend = "rocksdb" if mode == "incremental" else "hashmap"
    hs = [
        KeyedOperatorHarness(Tally(), key_of, state_backend=backend, max_parallelism=MAXP,
                             parallelism=2, subtask_index=i)
        for i in range(2)
    ]
    try:
        for h in hs:
            h.open()
        for e in stream(5, 400):
            hs[assign_key_to_parallel_operator(e[0], MAXP, 2)].process_element(e)
        cps = [h.checkpointer(coord.storage, mode) for h in hs]
        chk = take_checkpoint(coord, cps, source_positions={"input": 400})
        sp = take_savepoint(coord, cps, root / "sp", source_positions={"input": 400})
    finally:
        for h in hs:
            h.close()
    return coord, chk, sp


def run_inspect(path: str) -> Any:
    return CliRunner().invoke(app, ["checkpoint", "inspect", path], env={"COLUMNS": "400"})


@pytest.mark.parametrize("mode", ["full", "incremental"])
def test_inspect_prints_operators_subtasks_states_and_verifies(tmp_path: Path, mode: str) -> None:
    _, chk, sp = two_subtask_checkpoint(tmp_path, mode)
    for completed, title in [(chk, f"checkpoint {chk.checkpoint_id}"),
                             (sp, f"savepoint {sp.checkpoint_id}")]:
        result = run_inspect(completed.url)
        assert result.exit_code == 0, result.output
        out = result.output
        meta = completed.metadata
        assert f"{title} at {completed.url}" in out
        assert f"{size_text(meta.total_bytes)} in {len(meta.files())} files" in out
        assert "operator 'operator': parallelism 2, max parallelism 32" in out
        assert 'source positions: {"input": 400}' in out
        rows = {}
        for sub in meta.operators["operator"].subtasks:
            row = next(line for line in out.splitlines()
                       if f" {sub.key_group_range} " in line)
            rows[sub.subtask_index] = row
            assert row.split()[1] == str(sub.subtask_index)
            assert size_text(sum(f.size for f in sub.files())) in row
        assert "[0, 15]" in rows[0] and "[16, 31]" in rows[1]
        keyed = ("rocksdb incremental (" if mode == "incremental" and completed is chk
                 else "full (")
        assert all(keyed in row for row in rows.values())
        for state in ("count: value msgpack/1", "seen: list msgpack/1",
                      "parity: map msgpack/1/msgpack/1", "total: reducing msgpack/1"):
            assert out.count(state) == 2, state  # once per subtask
        assert f"all {len(meta.files())} files verified (size and SHA-256)" in out
        assert "CORRUPT" not in out


def test_inspect_names_a_corrupt_file_and_exits_1(tmp_path: Path) -> None:
    _, chk, sp = two_subtask_checkpoint(tmp_path)
    for completed, root in [(chk, tmp_path / "chk"), (sp, tmp_path / "sp")]:
        victim = completed.metadata.operators["operator"].subtasks[1].keyed.file  # type: ignore[union-attr]
        path = root / victim.path
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        result = run_inspect(completed.url)
        assert result.exit_code == 1, result.output
        corrupt = [line for line in result.output.splitlines() if "CORRUPT" in line]
        assert len(corrupt) == 1 and victim.path in corrupt[0] and "SHA-256" in corrupt[0]
        assert f"1 of {len(completed.metadata.files())} files missing or corrupt" in (
            result.output
        )
        # --no-verify only describes it
        assert inspect_no_verify(completed.url).exit_code == 0
        path.unlink()
        result = run_inspect(completed.url)
        assert result.exit_code == 1 and "is missing" in result.output
        assert victim.path in result.output


def inspect_no_verify(path: str) -> Any:
    return CliRunner().invoke(app, ["checkpoint", "inspect", "--no-verify", path],
                              env={"COLUMNS": "400"})


def test_inspect_of_something_that_is_not_a_checkpoint_exits_1(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = run_inspect(str(tmp_path / "empty"))
    assert result.exit_code == 1 and "cannot read" in result.output
    assert "no _metadata" in result.output
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "_metadata").write_bytes(b"PK\x03\x04 not weir at all")
    result = run_inspect(str(tmp_path / "junk"))
    assert result.exit_code == 1 and "bad magic" in result.output


def test_inspect_memory_checkpoint_in_process() -> None:
    url = f"memory://weir-{uuid.uuid4().hex}"
    coord = CheckpointCoordinator(url)
    with KeyedOperatorHarness(Tally(), key_of, max_parallelism=MAXP) as h:
        h.process_elements(stream(1, 50))
        chk = h.checkpoint(coord)
    try:
        result = run_inspect(chk.url)
        assert result.exit_code == 0, result.output
        assert f"checkpoint 1 at {url}/chk-1" in result.output
        assert "all 1 files verified" in result.output
    finally:
        fsspec.filesystem("memory").rm(coord.storage.root, recursive=True)


def test_inspect_console_script(tmp_path: Path) -> None:
    _, chk, sp = two_subtask_checkpoint(tmp_path, "incremental")
    weir = Path(sys.executable).parent / "weir"
    env = {**os.environ, "COLUMNS": "400"}
    for completed in (chk, sp):
        proc = subprocess.run([str(weir), "checkpoint", "inspect", completed.url],
                              capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "operator 'operator': parallelism 2, max parallelism 32" in proc.stdout
        assert "count: value msgpack/1" in proc.stdout
        assert f"all {len(completed.metadata.files())} files verified" in proc.stdout
    victim = chk.metadata.files()[0]
    (tmp_path / "chk" / victim.path).write_bytes(b"garbage")
    proc = subprocess.run([str(weir), "checkpoint", "inspect", chk.url],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert victim.path in proc.stdout and "CORRUPT" in proc.stdout


# ------------------------------------------------------------------ security

EXECUTED: list[str] = []


def _mark(tag: str) -> str:
    EXECUTED.append(tag)
    return tag


class Exploit:
    """Unpickling this calls ``_mark`` — what an attacker's payload would do."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_mark, ("pickle payload executed",))


class ShellExploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


PAYLOAD = pickle.dumps(Exploit(), protocol=5)
META_HEADER = struct.Struct(">8sH32s")


def forbid_pickle(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every pickle entry point fail (and record that it was reached)."""
    calls: list[str] = []

    def refuse(name: str) -> Callable[..., Any]:
        def fail(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            raise AssertionError(f"pickle.{name} must not be used")

        return fail

    for name in ("loads", "load", "Unpickler", "dumps", "dump", "Pickler"):
        monkeypatch.setattr(pickle, name, refuse(name))
    return calls


def write_metadata_body(path: Path, body: bytes) -> None:
    """A _metadata that passes the magic, version and checksum checks."""
    path.write_bytes(META_HEADER.pack(b"WEIRMETA", FORMAT_VERSION, hashlib.sha256(body).digest())
                     + body)


def metadata_doc(path: Path) -> Any:
    return json.loads(path.read_bytes()[META_HEADER.size:])


def subtask_doc(doc: Any) -> Any:
    return doc["operators"]["operator"]["subtasks"][0]


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> tuple[Path, Path, Oracle]:
    """A hash-map checkpoint of Tally: (storage root, chk dir, oracle)."""
    coord = CheckpointCoordinator(tmp_path / "root")
    oracle = Oracle()
    with KeyedOperatorHarness(Tally(), key_of, max_parallelism=MAXP) as h:
        feed(h, oracle, stream(3, 100))
        chk = h.checkpoint(coord)
    return tmp_path / "root", tmp_path / "root" / chk.directory, oracle


def assert_never_executed(marker: Path | None = None) -> None:
    assert EXECUTED == []
    if marker is not None:
        assert not marker.exists()


def test_payloads_are_live() -> None:
    """Sanity check of the payloads used below: unpickling them does run code."""
    assert pickle.loads(PAYLOAD) == "pickle payload executed"
    assert EXECUTED == ["pickle payload executed"]
    EXECUTED.clear()


@pytest.mark.parametrize("shape", ["raw pickle file", "pickle body with valid header"])
def test_metadata_that_is_a_pickle_is_rejected_unexecuted(
    checkpoint_dir: tuple[Path, Path, Oracle], shape: str, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    root, chk, _ = checkpoint_dir
    marker = tmp_path / "pwned"
    payload = PAYLOAD + pickle.dumps(ShellExploit(marker))
    forbid_pickle(monkeypatch)
    if shape == "raw pickle file":
        (chk / "_metadata").write_bytes(payload)
        expected: type[Exception] = CheckpointFormatError
    else:
        write_metadata_body(chk / "_metadata", payload)
        expected = CorruptCheckpointError
    with pytest.raises(expected, match="_metadata") as err:
        load_checkpoint(chk)
    if expected is CorruptCheckpointError:
        assert not isinstance(err.value, CheckpointFormatError)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        coord = CheckpointCoordinator(root)  # recovery skips it with a warning
    assert coord.latest() is None
    assert any("unreadable" in str(w.message) for w in caught)
    assert run_inspect(str(chk)).exit_code == 1
    assert_never_executed(marker)


@pytest.mark.parametrize("where", ["checkpoint_id", "kind", "state kind", "states list",
                                   "key_groups", "file sha256"])
def test_pickle_bytes_inside_metadata_values_are_rejected_unexecuted(
    checkpoint_dir: tuple[Path, Path, Oracle], where: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, chk, _ = checkpoint_dir
    text = PAYLOAD.decode("latin-1")
    doc = metadata_doc(chk / "_metadata")
    sub = subtask_doc(doc)
    if where == "checkpoint_id":
        doc["checkpoint_id"] = text
    elif where == "kind":
        doc["kind"] = text
    elif where == "state kind":
        sub["states"][0]["kind"] = text
    elif where == "states list":
        sub["states"] = text  # a string where the list of states belongs
    elif where == "key_groups":
        sub["keyed"]["key_groups"] = [[text, 0, 1]]
    else:
        sub["keyed"]["file"]["sha256"] = list(PAYLOAD)
    write_metadata_body(chk / "_metadata", json.dumps(doc).encode())
    forbid_pickle(monkeypatch)
    with pytest.raises(CorruptCheckpointError, match="malformed"):
        load_checkpoint(chk)
    assert_never_executed()


def test_pickle_in_opaque_metadata_stays_inert_data(
    checkpoint_dir: tuple[Path, Path, Oracle], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Source positions are opaque JSON: a pickle there comes back as a plain string."""
    _, chk, oracle = checkpoint_dir
    text = PAYLOAD.decode("latin-1")
    doc = metadata_doc(chk / "_metadata")
    doc["source_positions"] = {"kafka": text, "nested": [{"x": text}]}
    write_metadata_body(chk / "_metadata", json.dumps(doc).encode())
    forbid_pickle(monkeypatch)
    completed = load_checkpoint(chk)
    assert completed.metadata.source_positions == {"kafka": text, "nested": [{"x": text}]}
    assert_restores(completed, oracle, parallelisms=(1,))
    assert_never_executed()


def _rewrite_keyed(chk: Path, root: Path, make: Callable[[bytes, Any], tuple[bytes, Any]]) -> None:
    """Replace the .keyed file with ``make(old bytes, keyed doc)`` and fix its reference
    (size and checksum), so that verification passes and only decoding can object."""
    doc = metadata_doc(chk / "_metadata")
    keyed = subtask_doc(doc)["keyed"]
    path = root / keyed["file"]["path"]
    data, index = make(path.read_bytes(), keyed)
    path.write_bytes(data)
    keyed["file"].update(size=len(data), sha256=sha(data))
    keyed["key_groups"] = index
    write_metadata_body(chk / "_metadata", json.dumps(doc).encode())


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
@pytest.mark.parametrize("shape", ["raw pickle", "pickle body", "pickle value"])
def test_pickle_in_data_files_is_rejected_unexecuted(
    checkpoint_dir: tuple[Path, Path, Oracle], shape: str, backend: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, chk, oracle = checkpoint_dir
    victim = next(iter(oracle.seen))
    group = assign_to_key_group(victim, MAXP)

    def make(old: bytes, keyed: Any) -> tuple[bytes, Any]:
        if shape == "raw pickle":
            return PAYLOAD, keyed["key_groups"]
        if shape == "pickle body":
            data = b"WEIRDATA" + struct.pack(">H", FORMAT_VERSION) + PAYLOAD
            return data, [[group, 0, len(PAYLOAD)]]
        index = {g: (off, n) for g, off, n in keyed["key_groups"]}
        groups = dict(decode_keyed(old, index, None, "test"))  # (read-only: decoded when read)
        groups[group] = {
            name: entries if name.startswith("__weir") else tuple((k, PAYLOAD) for k, _ in entries)
            for name, entries in groups[group].items()
        }
        data, new_index, _ = encode_keyed(groups)
        return data, [[g, off, n] for g, (off, n) in sorted(new_index.items())]

    _rewrite_keyed(chk, root, make)
    forbid_pickle(monkeypatch)
    if shape == "raw pickle":
        # sizes and checksums match, but verification reads every data file's header
        with pytest.raises(CheckpointFormatError, match=r"\.keyed.*bad magic"):
            load_checkpoint(chk)
        assert_never_executed()
        return
    completed = load_checkpoint(chk)  # sizes, checksums and headers match: it loads
    if shape == "pickle value":
        # the bytes reach the state's msgpack serializer, which refuses them
        with pytest.raises(StateSerializationError, match="cannot be decoded by Msgpack"):
            h = KeyedOperatorHarness.restore(Tally(), key_of, completed, parallelism=1,
                                             subtask_index=0, state_backend=backend)
            try:
                observed(h, victim)
            finally:
                h.close()
    else:
        with pytest.raises(CorruptCheckpointError, match=r"\.keyed") as err:
            KeyedOperatorHarness.restore(Tally(), key_of, completed, parallelism=1,
                                         subtask_index=0, state_backend=backend)
        assert isinstance(err.value, WeirError)
    assert_never_executed()


def _malform(chk: Path, where: str) -> None:
    doc = metadata_doc(chk / "_metadata")
    keyed = subtask_doc(doc)["keyed"]
    if where == "NUL in file path":
        keyed["file"]["path"] = PAYLOAD.decode("latin-1")  # pickle frames hold NUL bytes
    elif where == "file path is a directory":
        keyed["file"]["path"] = chk.name
    elif where == "empty file path":
        keyed["file"]["path"] = ""
    elif where == "checkpoint_id Infinity":
        doc["checkpoint_id"] = float("inf")
    else:
        keyed["key_groups"] = [[float("inf"), 0, 1]]
    write_metadata_body(chk / "_metadata", json.dumps(doc).encode())


@pytest.mark.parametrize("where", ["NUL in file path", "file path is a directory",
                                   "empty file path", "checkpoint_id Infinity",
                                   "key group Infinity"])
def test_malformed_metadata_values_raise_typed_errors(
    checkpoint_dir: tuple[Path, Path, Oracle], where: str,
) -> None:
    _, chk, _ = checkpoint_dir
    _malform(chk, where)
    with pytest.raises(CorruptCheckpointError):
        load_checkpoint(chk)


@pytest.mark.parametrize("where", ["checkpoint_id Infinity", "key group Infinity"])
def test_recovery_skips_checkpoint_with_malformed_numbers(
    checkpoint_dir: tuple[Path, Path, Oracle], where: str,
) -> None:
    """Automatic recovery should warn and skip it, as for any unreadable metadata."""
    root, chk, _ = checkpoint_dir
    _malform(chk, where)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        coord = CheckpointCoordinator(root)
    assert coord.latest() is None
    assert any("unreadable" in str(w.message) for w in caught)


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_msgpack_state_never_touches_pickle(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every pickle entry point failing, full (and for RocksDB incremental)
    checkpoints and a savepoint are written and restored into both backends."""
    calls = forbid_pickle(monkeypatch)
    modes = ["full", "incremental"] if backend == "rocksdb" else ["full"]
    for mode in modes:
        coord = CheckpointCoordinator(tmp_path / f"chk-{mode}")
        oracle = Oracle()
        with KeyedOperatorHarness(Tally(), key_of, state_backend=backend,
                                  max_parallelism=MAXP) as h:
            feed(h, oracle, stream(7, 200))
            h.checkpoint(coord, mode=mode)
            feed(h, oracle, stream(8, 200))
            chk = h.checkpoint(coord, mode=mode)
            sp = h.savepoint(coord, tmp_path / f"sp-{mode}")
        assert_restores(chk, oracle)
        assert_restores(load_checkpoint(sp.url), oracle, parallelisms=(1,))
    assert calls == []


def test_pickle_guard_catches_pickle_serializer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control for the test above: PickleSerializer state does reach pickle."""
    desc = ValueStateDescriptor("obj", serializer=PickleSerializer())

    class Keep(KeyedProcessFunction[Any, Any]):
        def open(self, ctx: Any) -> None:
            self.s = ctx.get_state(desc)

        def process_element(self, value: Any, ctx: Any) -> None:
            self.s.update(value)

    coord = CheckpointCoordinator(tmp_path)
    with KeyedOperatorHarness(Keep(), key_of, max_parallelism=MAXP) as h:
        h.process_element(("a", 1))
        chk = h.checkpoint(coord)
    calls = forbid_pickle(monkeypatch)
    with pytest.raises(StateSerializationError):
        KeyedOperatorHarness.restore(Keep(), key_of, chk, parallelism=1, subtask_index=0)
    assert calls == ["loads"]
