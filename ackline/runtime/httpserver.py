"""The worker's one HTTP server: ``/metrics``, ``/healthz`` and ``/readyz``.

stdlib ``ThreadingHTTPServer`` in a daemon thread, bound to ``metrics_host:metrics_port``
(default 127.0.0.1:9400; port 0 disables it; see ``Ingest.serve`` in
:mod:`ackline.runtime.wiring`). ``/healthz`` is 200 while the process serves requests;
``/readyz`` is 200 or 503 with a JSON body giving the reasons
(:func:`ackline.runtime.health.readiness`); ``/metrics`` is the Prometheus text format of the
worker's own registry.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ackline.core.errors import SettingsError
from ackline.core.metrics import Metrics
from ackline.runtime.health import ReadyLimits, readiness, snapshot
from ackline.settings import Settings

log = logging.getLogger(__name__)


Respond = Callable[[str], tuple[int, str, bytes]]
"""A request path → (status, content type, body)."""


class HttpServer:
    """A small HTTP server of ``respond`` in a daemon thread; binds in :meth:`start`."""

    def __init__(self, respond: Respond) -> None:
        self._respond = respond
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the HTTP server is not started")
        return int(self._server.server_address[1])

    def start(self, host: str, port: int) -> None:
        """Bind ``host:port`` (0 picks a free port) and serve in a daemon thread."""
        try:
            self._server = ThreadingHTTPServer((host, port), _handler(self._respond))
        except OSError as exc:  # the port in use, or the host not an address of this one
            setting = (
                "ACKLINE_METRICS_PORT" if exc.errno == errno.EADDRINUSE else "ACKLINE_METRICS_HOST"
            )
            raise SettingsError(setting, f"cannot listen on {host}:{port}: {exc}") from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ackline-http", daemon=True
        )
        self._thread.start()
        log.debug("serving /metrics, /healthz and /readyz on %s:%d", host, self.port)

    def serve(self, settings: Settings) -> str:
        """Start on ``metrics_host:metrics_port`` unless the port is 0; return the address
        of /metrics (or why it is off) for a start-up line.

        The default port taken by another process (a second worker or processor on one
        host) falls back to a free port, with a warning; an explicitly set port that
        cannot be bound is a SettingsError naming ACKLINE_METRICS_PORT, and a host that is
        not an address of this one names ACKLINE_METRICS_HOST (it named the port).
        """
        if not settings.metrics_port:
            return "off (ACKLINE_METRICS_PORT=0)"
        try:
            self.start(settings.metrics_host, settings.metrics_port)
        except SettingsError as exc:
            if (
                exc.setting != "ACKLINE_METRICS_PORT"
                or settings.sources().get("metrics_port") != "default"
            ):
                raise
            log.warning(
                "the default metrics port %d is in use; serving on a free port instead "
                "(set ACKLINE_METRICS_PORT to choose one)",
                settings.metrics_port,
            )
            self.start(settings.metrics_host, 0)
        return f"http://{settings.metrics_host}:{self.port}/metrics"

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class StatusServer(HttpServer):
    """A worker's ``/metrics``, ``/healthz`` and ``/readyz``."""

    def __init__(self, metrics: Metrics, limits: ReadyLimits, started: float) -> None:
        super().__init__(self._status)
        self._metrics = metrics
        self._limits = limits
        self._started = started

    def _status(self, path: str) -> tuple[int, str, bytes]:
        route = path.split("?", 1)[0]
        if route == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._metrics.registry)
        if route == "/healthz":
            return 200, "application/json", json_body({"status": "alive"})
        if route == "/readyz":
            snap = snapshot(self._metrics, self._started)
            reasons = readiness(snap, time.time(), self._limits)
            body = {
                "ready": not reasons,
                "reasons": reasons,
                "assigned_partitions": snap.assigned,
                "lag": snap.lag,
                "last_commit": snap.last_commit or None,
                "database_up": snap.db_up,
            }
            return (503 if reasons else 200), "application/json", json_body(body)
        return not_found(route)


def not_found(route: str) -> tuple[int, str, bytes]:
    return 404, "application/json", json_body({"error": f"no such path: {route}"})


def json_body(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode() + b"\n"


def _handler(respond: Respond) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, content_type, body = respond(self.path)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler
