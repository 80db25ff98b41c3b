"""One small HTTP server on a daemon thread: ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

* ``/healthz`` -- 200 while every part of the run that owes work gets some done (a model load included);
  503 with the stalled parts in the body once one has made no progress for ``runtime.stall_timeout_s``
  (liveness: sluice/operator/watchdog.py).
* ``/readyz``  -- 200 once the engine is warmed up and at least one partition is assigned, 503 with the
  reason otherwise (readiness: a Kubernetes Service or a rollout waits for it).
* ``/metrics`` -- the runner's private registry in the Prometheus text format.

Binds to loopback unless configured otherwise. The server starts before the engine so that liveness
answers during a long model load; it stops with :meth:`TelemetryServer.close`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)

# () -> None when ready, else the reason it is not (one line for the 503 body)
Readiness = Callable[[], str | None]
Health = Callable[[], str | None]  # () -> None when healthy, else the stalled parts (one line)


class TelemetryServer:
    """Serves the three endpoints for one runner. ``port`` is the bound port (useful with port 0)."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, readiness: Readiness,
                 health: Health = lambda: None) -> None:
        handler = _handler(registry, readiness, health)
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as err:
            raise OSError(f"cannot serve metrics on {host}:{port}: {err.strerror or err}; "
                          "choose another telemetry.metrics.port (0 picks a free one)") from None
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="sluice-telemetry-http", daemon=True)
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics (health: /healthz, /readyz)", host, self.port)

    def close(self) -> None:
        """Stop serving and free the port. Safe to call twice."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()


def _handler(registry: CollectorRegistry, readiness: Readiness, health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                except Exception as err:  # a collector bug must not kill the server thread
                    log.exception("metrics scrape failed")
                    self._send(500, f"metrics unavailable: {err}\n".encode())
            elif path == "/healthz":
                stalled = health()
                if stalled is None:
                    self._send(200, b"ok\n")
                else:
                    self._send(503, f"stalled: {stalled}\n".encode())
            elif path == "/readyz":
                reason = readiness()
                if reason is None:
                    self._send(200, b"ready\n")
                else:
                    self._send(503, f"not ready: {reason}\n".encode())
            else:
                self._send(404, b"not found; try /metrics, /healthz or /readyz\n")

        def _send(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
            log.debug("http: " + format, *args)

    return Handler
