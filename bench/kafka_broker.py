"""A Kafka-protocol broker for the benchmarks: ``noida-db`` (the dev extras' binary next
to the venv's python) on a free loopback port with its own data directory, started as
the examples and the tests start theirs (``weir.examples._kafka_broker``). ``with
Broker(directory) as broker: ... broker.bootstrap``."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from weir.examples._kafka_broker import Broker as _Broker


class Broker(_Broker):
    """One noida-db Kafka broker on 127.0.0.1 (``bootstrap``), stopped and its data
    removed on exit; with what the benchmark reads of it (topics made and deleted, the
    broker's memory and CPU)."""

    def create_topic(self, name: str, partitions: int) -> str:
        """A topic ``name`` of ``partitions`` partitions; its name."""
        self.create_topics({name: partitions})
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
