"""``weir ui LOCATION``: the checkpoint page (:mod:`weir.cli.page`) served over HTTP, or
written to a file.

Serving binds to loopback (``127.0.0.1``) by default. Any other address needs a shared
secret (``--secret`` or ``WEIR_UI_SECRET``); with a secret, every request must carry it
(``?secret=…``, or ``Authorization: Bearer …``), compared in constant time, or gets
401. Routes: ``/`` the page (read afresh from the location on every request),
``/api/checkpoints`` the same data as JSON.
"""

from __future__ import annotations

import hmac
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit

import typer
from rich.console import Console

from weir.cli.common import json_default, print_json
from weir.cli.page import render_page
from weir.errors import WeirError
from weir.processor.history import checkpoint_history
from weir.runtime.endpoints import require_secret

__all__ = ["make_server", "ui"]


def make_server(location: str, *, host: str = "127.0.0.1", port: int = 8081,
                secret: str | None = None, limit: int | None = 100,
                refresh_s: int = 10) -> ThreadingHTTPServer:
    """An HTTP server for the checkpoint page of ``location`` (not yet serving: call its
    ``serve_forever``). Refuses a non-loopback ``host`` without ``secret``."""
    require_secret(host, secret, "weir ui: the checkpoint page",
                   "--secret or WEIR_UI_SECRET")

    class Handler(BaseHTTPRequestHandler):
        server_version = "weir-ui"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # requests are not logged; errors are answered with their message

        def _allowed(self) -> bool:
            if not secret:
                return True
            given = parse_qs(urlsplit(self.path).query).get("secret", [""])[0]
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Bearer "):
                given = auth[len("Bearer "):]
            return hmac.compare_digest(given.encode(), secret.encode())

        def _send(self, status: int, body: str, kind: str) -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if not self._allowed():
                self._send(401, "a valid secret is required (?secret=… or "
                           "Authorization: Bearer …)\n", "text/plain")
                return
            route = urlsplit(self.path).path
            if route not in ("/", "/index.html", "/api/checkpoints"):
                self._send(404, f"no page at {route}; try / or /api/checkpoints\n",
                           "text/plain")
                return
            try:
                history = checkpoint_history(location, limit=limit)
            except WeirError as exc:
                self._send(500, f"cannot read {location}: {exc}\n", "text/plain")
                return
            if route == "/api/checkpoints":
                self._send(200, json.dumps(history.as_json(), default=json_default),
                           "application/json")
            else:
                self._send(200, render_page(history, generated_ms=int(time.time() * 1000),
                                            refresh_s=refresh_s), "text/html")

    return ThreadingHTTPServer((host, port), Handler)


def ui(
    location: Annotated[str, typer.Argument(help=(
        "A Spark stage's checkpoint_location, a checkpoint storage root, or one checkpoint "
        "or savepoint directory; a URL fsspec opens."))],
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback "
                                      "needs --secret.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free one).")] = 8081,
    secret: Annotated[str | None, typer.Option(
        envvar="WEIR_UI_SECRET", help="Shared secret every request must carry.")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="Write the page to this HTML file and exit.")] = None,
    limit: Annotated[int, typer.Option(help="Show the newest N checkpoints.")] = 100,
    refresh: Annotated[int, typer.Option(help="Served page reloads every N s (0: "
                                         "never).")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print the page's data as JSON "
                                          "and exit.")] = False,
) -> None:
    """Show the checkpoint history of a location like Flink's checkpoint tab: counts,
    min/avg/max summary, a plot over time, per-operator and per-subtask sync/async
    durations and sizes. Serves it on http://127.0.0.1:8081/ until interrupted, or
    writes it to a file with --output.

    Example: weir ui /data/chk/fraud --port 8081 --output /tmp/checkpoints.html
    """
    err = Console(stderr=True)
    try:
        if output is not None or as_json:
            history = checkpoint_history(location, limit=limit)
            if as_json:
                print_json(history.as_json())
            if output is not None:
                output.write_text(render_page(history, generated_ms=int(time.time() * 1000)),
                                  encoding="utf-8")
                err.print(f"wrote {output}")
            return
        server = make_server(location, host=host, port=port,
                             secret=secret or os.environ.get("WEIR_UI_SECRET"), limit=limit,
                             refresh_s=refresh)
    except (WeirError, OSError) as exc:
        err.print(f"[red]weir ui: {exc}[/red]")
        raise typer.Exit(1) from None
    typer.echo(f"serving the checkpoint page of {location} on "
               f"http://{host}:{server.server_port}/ (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
