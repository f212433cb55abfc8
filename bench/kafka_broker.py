"""A Kafka-protocol broker for the benchmarks: ``noida-db`` (the dev extras' binary next
to the venv's python) on a free loopback port with its own data directory, as
``tests/kafka_support.py`` starts it for the tests (the benchmarks do not import
``tests/``). ``with Broker(directory) as broker: ... broker.bootstrap``."""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

NOIDA = Path(sys.executable).parent / "noida-db"


class Broker:
    """One noida-db Kafka broker on 127.0.0.1 (``bootstrap``), stopped and its data
    removed on exit."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = data_dir.parent / f"noida-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Broker:
        if not NOIDA.exists():
            raise RuntimeError(f"{NOIDA} is missing: pip install -e '.[dev]' (noida-db)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                [str(NOIDA), "start", "--only", "kafka", "--kafka-port", str(self.port),
                 "--data-dir", str(self.data_dir)], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + 30
        while True:  # (until it answers a metadata request)
            if self._proc.poll() is not None:
                raise RuntimeError(f"noida-db exited with {self._proc.returncode}: "
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    pass
                admin.list_topics(timeout=2)
                return self
            except (OSError, KafkaException):
                if time.monotonic() > deadline:
                    self.__exit__(None, None, None)
                    raise RuntimeError(f"noida-db did not answer on {self.port} in 30 s"
                                       ) from None
                time.sleep(0.05)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):  # (its own session: its children too)
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def create_topic(self, name: str, partitions: int) -> str:
        admin_module: Any = importlib.import_module("confluent_kafka.admin")
        admin = admin_module.AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([admin_module.NewTopic(name, partitions, 1)]
                                          ).values():
            future.result(30)
        return name

    def delete_topic(self, name: str) -> None:
        """Delete ``name`` (its disk back between runs); a broker that refuses is let be."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        with contextlib.suppress(Exception):  # (only housekeeping)
            for future in admin.delete_topics([name], operation_timeout=30).values():
                future.result(30)

    def rss_mb(self) -> float | None:
        """The resident memory of the broker's processes (MB), from /proc."""
        if self._proc is None:
            return None
        total = 0
        for pid in _group(self._proc.pid):
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                continue
        return round(total / 1024, 1)

    def cpu_s(self) -> float | None:
        """CPU seconds (user + system) the broker's processes have used so far."""
        if self._proc is None:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in _group(self._proc.pid):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / ticks


def _group(pgid: int) -> list[int]:
    """The processes of process group ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields: Any = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                out.append(int(entry.name))
    return out
