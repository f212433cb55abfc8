"""A throwaway Kafka broker for the examples (:mod:`.fraud_kafka`): ``noida-db`` (PyPI,
one binary speaking the Kafka protocol; in weir's dev extras) on a free 127.0.0.1 port
with its own data directory, stopped and removed on exit. A helper of the examples, the
benchmarks and the tests only: a real deployment points the connectors at its own
Kafka cluster."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["Broker", "noida_db"]


def noida_db() -> Path:
    """The ``noida-db`` binary (next to this Python, else on PATH), or a RuntimeError
    saying how to install it."""
    beside = Path(sys.executable).parent / "noida-db"
    found = beside if beside.exists() else shutil.which("noida-db")
    if found is None:
        raise RuntimeError("this example starts its own Kafka broker, noida-db, which is "
                           "not installed: pip install noida-db (it is in weir's dev "
                           "extras: pip install -e '.[dev]')")
    return Path(found)


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out on its own (to ``bind(0)`` and to every
    outgoing connection); 32768 where it does not say."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(
            "/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])
    return 32768


def listen_port(taken: set[int] | None = None, also: int = 0) -> int:
    """A loopback port for a server started later (and ``port + also`` when ``also``,
    a server's second port), free now, below the kernel's ephemeral range: a port of
    that range, free when chosen, can be given to any outgoing connection before the
    server binds it (a server of the test suite once failed so). Random among those
    free, not in ``taken`` (added to it)."""
    taken = set() if taken is None else taken
    low = 10_000
    high = _ephemeral_low() - 1 - also
    rng = random.Random()
    for _ in range(500):
        port = rng.randint(low, high)
        ports = {port, port + also}
        if ports & taken or not all(map(_bindable, ports)):
            continue
        taken.update(ports)
        return port
    raise RuntimeError(f"no free loopback port in {low}..{high}")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Broker:
    """One noida-db broker on ``bootstrap`` (127.0.0.1:<free port>), its data in
    ``data_dir``. :meth:`stop` and :meth:`restart` keep the data (a fault test's broker
    restart), :meth:`close` stops it and deletes the data. A context manager (start,
    close). The examples, the benchmarks (``bench/kafka_broker.py``) and the test
    fixtures (``tests/kafka_support.py``) all start their broker with it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = listen_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = data_dir.parent / f"noida-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def start(self, timeout_s: float = 30.0) -> None:
        """Start it (its own session: a Ctrl-C of the caller does not reach it, the
        caller stops it) and wait until it answers a metadata request."""
        binary = noida_db()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:  # (it warns about GLIBC on Debian 12: harmless)
            self._proc = subprocess.Popen(
                [str(binary), "start", "--only", "kafka", "--kafka-port", str(self.port),
                 "--data-dir", str(self.data_dir)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        try:
            self._wait(timeout_s)
        except BaseException:  # (Ctrl-C too: nothing of it is left behind)
            self.stop(signal.SIGKILL)
            raise

    def _wait(self, timeout_s: float) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        assert self._proc is not None
        admin = None  # (made once the port is open: no "connection refused" logged)
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"noida-db exited with {self._proc.returncode}: "
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    pass
                admin = admin or AdminClient(self.admin_config())
                admin.list_topics(timeout=2)
                return
            except (OSError, KafkaException):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"noida-db did not answer on {self.bootstrap} in "
                                       f"{timeout_s:.0f} s") from None
                time.sleep(0.05)

    def admin_config(self) -> dict[str, str | int | float | bool]:
        """An ``AdminClient``'s settings for this broker."""
        # (log_level 4: warnings and errors, not librdkafka's notice as a client closes)
        return {"bootstrap.servers": self.bootstrap, "log_level": 4}

    def create_topics(self, partitions: dict[str, int]) -> None:
        """Topics ``{name: partitions}`` (one replica each)."""
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient(self.admin_config())
        futures = admin.create_topics([NewTopic(n, p, 1) for n, p in partitions.items()])
        for future in futures.values():
            future.result(30)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the broker (SIGKILL: as a crash); its data stays. Waits until every
        process of its session is gone (noida-db's own children hold its data
        directory's lock a moment after the parent exits: a new one started before
        would refuse it)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        group = proc.pid  # (its own session: the group's id is its pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, sig)
        deadline = time.monotonic() + 20
        while True:
            proc.poll()
            try:
                os.killpg(group, 0)  # (anything of it still alive?)
            except ProcessLookupError:
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
                deadline = time.monotonic() + 20
            time.sleep(0.02)
        proc.wait(timeout=20)

    def restart(self, sig: int = signal.SIGTERM) -> None:
        """Stop the broker (``sig``) and start it again on the same port and data."""
        self.stop(sig)
        self.start()

    def close(self) -> None:
        """Stop the broker and delete its data."""
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.data_dir, ignore_errors=True)
