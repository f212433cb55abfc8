"""The checkpoint page (``weir ui``): served by the real entry point, loaded in a real
headless Chromium, its numbers compared with the checkpoint metadata on disk; the static
file; the secret off loopback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import weir
import weir.spark
from spark_support import (  # type: ignore[import-not-found]
    KEYED,
    Count,
    by_value,
    keyed_records,
    run,
    write_file,
)
from weir.cli.common import readable_size
from weir.errors import ConfigurationError

WEIR = str(Path(sys.executable).parent / "weir")
SCHEMA = "key string, seq long"
BATCHES = 5
CHROMIUM_FLAGS = [  # without the networking flags Chromium calls Google's hosts at start
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "Chromium is missing: `make setup` installs it (apt-get install chromium)"
    return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chrome'}",
                           *args], capture_output=True, text=True, timeout=120)


class Elements(HTMLParser):
    """Every element with ``data-*`` attributes: (tag, attributes, text inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str], list[str]]] = []
        self._open: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        data = {k: v or "" for k, v in attrs}
        if tag in ("td", "tr", "div", "details", "circle"):
            text: list[str] = []
            self.found.append((tag, data, text))
            self._open.append(text)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "tr", "div", "details", "circle") and self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for text in self._open:
            text.append(data)

    def rows(self, cls: str) -> list[tuple[dict[str, str], dict[str, tuple[float, str]]]]:
        """Rows of class ``cls``: their attributes and, per ``data-field`` cell, the raw
        value and the text shown."""
        out = []
        for i, (tag, attrs, _) in enumerate(self.found):
            if tag == "tr" and attrs.get("class") == cls:
                cells = {}
                for tag2, cell, text in self.found[i + 1:]:
                    if tag2 == "tr":
                        break
                    if "data-field" in cell:
                        cells[cell["data-field"]] = (float(cell["data-value"]), "".join(text))
                out.append((attrs, cells))
        return out


def metadata_on_disk(location: Path) -> dict[tuple[str, int], Any]:
    """Every completed batch's metadata, read straight from its ``_metadata`` file."""
    out = {}
    for meta in location.glob("stages/*/queries/*/chk-*/_metadata"):
        found = weir.load_checkpoint(weir.CheckpointStorage(str(meta.parent)), verify=False)
        out[(meta.parent.parent.name, found.checkpoint_id)] = found.metadata
    return out


@pytest.fixture(scope="module")
def location(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A p = 2 RocksDB stage after ``BATCHES`` batches of a real Spark query."""
    by_value()
    tmp = tmp_path_factory.mktemp("page")

    def build(events: Any) -> Any:
        return weir.spark.process(
            events,
            key_by="key",
            function=Count(),
            output_schema="key string, seq long, n long, subtask int",
            uid="count",
            heartbeat=False,
            parallelism=2,
            config=weir.JobConfig(str(tmp / "weir"), state_backend="rocksdb"),
            retained=BATCHES,
        )

    for b in range(BATCHES):
        write_file(tmp / "in", keyed_records(b * 400, 400, 300 + 100 * b), KEYED)
    run(spark, tmp / "in", SCHEMA, build, tmp / "spark")
    return tmp / "weir"


@pytest.mark.spark
def test_the_page_in_chromium_shows_what_the_metadata_says(location: Path,
                                                           tmp_path: Path) -> None:
    server = subprocess.Popen([WEIR, "ui", str(location), "--port", "0", "--refresh", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert "http://127.0.0.1:" in line, (line, server.stderr and server.stderr.read())
        url = line[line.index("http://"):].split()[0]
        dom = chromium(tmp_path, "--dump-dom", url)
        assert dom.returncode == 0, dom.stderr
        shot = chromium(tmp_path, "--window-size=1280,1500",
                        f"--screenshot={tmp_path / 'page.png'}", url)
        assert shot.returncode == 0, shot.stderr
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 0
    png = (tmp_path / "page.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    if os.environ.get("WEIR_PAGE_SCREENSHOT"):  # how docs/checkpoint-page.png is made
        Path(os.environ["WEIR_PAGE_SCREENSHOT"]).write_bytes(png)

    page = Elements()
    page.feed(dom.stdout)
    on_disk = metadata_on_disk(location)
    assert len(on_disk) == BATCHES
    history = {(a["data-query"], int(a["data-id"])): cells
               for a, cells in page.rows("checkpoint") if a["data-status"] == "completed"}
    assert history.keys() == on_disk.keys()
    for key, meta in on_disk.items():
        cells = history[key]
        changed = sum(s.stats.new_bytes for s in meta.operators["count"].subtasks)
        assert cells["end_to_end_duration_ms"][0] == pytest.approx(meta.duration_ms)
        assert cells["state_size"] == (meta.total_bytes, readable_size(meta.total_bytes))
        assert cells["checkpointed_size"] == (changed, readable_size(changed))
        assert cells["completed_timestamp_ms"][0] == meta.completion_timestamp_ms
    # the newest batch's details: one row per subtask, the numbers of its handle
    newest = max(on_disk.values(), key=lambda m: m.completion_timestamp_ms)
    shown = page.rows("subtask")
    subs = newest.operators["count"].subtasks
    assert [int(a["data-subtask"]) for a, _ in shown[:2]] == [0, 1]
    for (_, cells), handle in zip(shown[:2], subs, strict=True):
        assert cells["sync_ms"][0] == pytest.approx(handle.stats.sync_ms)
        assert cells["async_ms"][0] == pytest.approx(handle.stats.async_ms)
        assert cells["state_size"] == (handle.stats.bytes, readable_size(handle.stats.bytes))
        assert cells["checkpointed_size"][0] == handle.stats.new_bytes
    # the summary: min/avg/max end-to-end duration over every completed batch
    stats = {a["data-stat"]: float(a["data-value"]) for tag, a, _ in page.found
             if tag == "td" and "data-value" in a and "data-stat" in a}
    durations = [m.duration_ms for m in on_disk.values()]
    assert stats["end_to_end_duration_ms-min"] == pytest.approx(min(durations))
    assert stats["end_to_end_duration_ms-max"] == pytest.approx(max(durations))
    assert stats["end_to_end_duration_ms-avg"] == pytest.approx(sum(durations) / len(durations))
    # the plot: one point per completed batch and series
    points = [a for tag, a, _ in page.found if tag == "circle"]
    assert sorted(float(p["data-value"]) for p in points
                  if p["data-series"] == "end_to_end_duration_ms") == sorted(durations)


@pytest.mark.spark
def test_output_writes_the_page_and_json_gives_its_data(location: Path,
                                                        tmp_path: Path) -> None:
    written = subprocess.run([WEIR, "ui", str(location), "--output", str(tmp_path / "p.html"),
                              "--json"], capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    data = json.loads(written.stdout)
    assert data["counts"] == {"completed": BATCHES}
    page = Elements()
    page.feed((tmp_path / "p.html").read_text())
    assert sorted(int(a["data-id"]) for a, _ in page.rows("checkpoint")) == sorted(
        c["checkpoint_id"] for c in data["checkpoints"])
    assert "<script" not in (tmp_path / "p.html").read_text()  # self-contained, no script


@pytest.mark.spark
def test_off_loopback_a_secret_is_required_and_checked(location: Path) -> None:
    from weir.cli.ui import make_server

    with pytest.raises(ConfigurationError, match="secret"):
        make_server(str(location), host="0.0.0.0", port=0)
    refused = subprocess.run([WEIR, "ui", str(location), "--host", "0.0.0.0", "--port", "0"],
                             capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if k != "WEIR_UI_SECRET"})
    assert refused.returncode == 1 and "secret" in refused.stderr

    import threading

    server = make_server(str(location), host="127.0.0.1", port=0, secret="s3cret")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        def status(path: str, headers: dict[str, str] | None = None) -> int:
            try:
                with urllib.request.urlopen(urllib.request.Request(base + path,
                                                                   headers=headers or {})) as r:
                    return int(r.status)
            except urllib.error.HTTPError as exc:
                return exc.code

        assert status("/") == 401
        assert status("/?secret=wrong") == 401
        assert status("/api/checkpoints", {"Authorization": "Bearer wrong"}) == 401
        assert status("/?secret=s3cret") == 200
        assert status("/api/checkpoints", {"Authorization": "Bearer s3cret"}) == 200
        assert status("/nothing?secret=s3cret") == 404
    finally:
        server.shutdown()
        server.server_close()
