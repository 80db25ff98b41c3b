"""A local HTTP server for image pipelines' tests: serves a folder, with a delay, and one path that never answers.

    with serve(folder, delay_s=0.05) as base_url:
        f"{base_url}/cat.jpg"    # the file, after the delay
        f"{base_url}/hang"       # accepts, never answers (until the server stops)
        f"{base_url}/nothing"    # 404
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class _Handler(SimpleHTTPRequestHandler):
    delay_s = 0.0
    stop: threading.Event

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/hang":
            self.stop.wait(120)
            return
        if self.delay_s:
            time.sleep(self.delay_s)
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass


@contextmanager
def serve(folder: Path, delay_s: float = 0.0) -> Iterator[str]:
    """Serve ``folder`` on 127.0.0.1 (a free port) while the block runs; yields the base URL."""
    stop = threading.Event()
    handler = type("Handler", (_Handler,), {"delay_s": delay_s, "stop": stop})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(folder)))
    server.daemon_threads = True
    server.request_queue_size = 128
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
