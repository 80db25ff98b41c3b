"""Fetching images from locations (sluice/images/fetch.py), against a real HTTP server on 127.0.0.1 and real
files: results in order, each failure a RecordError naming its reason, deadlines that hold against servers
that hang or trickle, bounded concurrency, and no secret of a URL in any message."""

from __future__ import annotations

import base64
import importlib.util
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sluice.engines.engine_contract import RecordError
from sluice.images.fetch import Fetcher, FetchLimits, redact

CAP_BYTES = 4096  # max_bytes of the fetchers here
BODY = bytes(range(256)) * 4  # what /ok serves: 1 KiB, under the cap
STOP = threading.Event()  # set at the server's teardown: handlers that hang or trickle return


class Routes(BaseHTTPRequestHandler):
    """One behaviour per path; HTTP/1.0, so every body ends when the connection closes."""

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        try:
            getattr(self, "route_" + self.path.partition("?")[0].strip("/").replace("-", "_"))()
        except OSError:  # the client gave up first (a body over the cap, a timeout)
            pass

    def send_body(self, body: bytes, length: int | None = None) -> None:
        self.send_response(200)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()
        self.wfile.write(body)

    def route_ok(self) -> None:
        self.send_body(BODY, len(BODY))

    def route_missing(self) -> None:
        self.send_error(404)

    def route_hang(self) -> None:
        STOP.wait(30)  # accepted, request read, never an answer

    def route_trickle(self) -> None:
        self.send_body(b"")
        while not STOP.wait(0.2):  # a byte every 0.2 s, forever
            self.wfile.write(b"x")
            self.wfile.flush()

    def route_trickle_headers(self) -> None:
        self.wfile.write(b"HTTP/1.0 200 OK\r\n")
        while not STOP.wait(0.2):  # a header every 0.2 s, forever: no single read ever waits long
            self.wfile.write(b"X-More: 1\r\n")
            self.wfile.flush()

    def route_big(self) -> None:
        self.send_body(b"", length=CAP_BYTES * 100)

    def route_big_no_length(self) -> None:
        self.send_body(b"y" * CAP_BYTES * 4)

    def route_redirect(self) -> None:
        self.send_response(302)
        self.send_header("Location", "/ok")
        self.end_headers()

    def route_slow(self) -> None:
        STOP.wait(0.3)
        self.route_ok()

    def route_slower(self) -> None:
        STOP.wait(0.6)
        self.route_ok()

    def route_auth(self) -> None:  # echoes the Authorization header
        header = self.headers.get("Authorization")
        self.send_body(header.encode()) if header else self.send_error(401)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a handler still hanging never holds up server_close
    request_queue_size = 64  # a batch connects all at once


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = Server(("127.0.0.1", 0), Routes)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        STOP.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture
def make_fetcher(tmp_path: Path) -> Iterator[Callable[..., Fetcher]]:
    made: list[Fetcher] = []

    def make(**limits: Any) -> Fetcher:
        made.append(Fetcher(FetchLimits(**{"max_bytes": CAP_BYTES, **limits}), base_dir=tmp_path))
        return made[-1]

    yield make
    for fetcher in made:
        fetcher.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def failure(result: bytes | RecordError) -> str:
    """The message of a failed entry (asserting it is one, from the fetch stage)."""
    assert isinstance(result, RecordError), result
    assert result.stage == "fetch"
    return str(result)


def test_a_batch_comes_back_in_order_with_each_failure_naming_its_reason(
        server: str, make_fetcher: Callable[..., Fetcher]) -> None:
    locations: list[Any] = [f"{server}/ok", f"{server}/missing", f"{server}/redirect", f"{server}/big",
                            f"{server}/big-no-length", f"http://127.0.0.1:{closed_port()}/x",
                            "http://no-such-host.invalid/x", 42, f"{server}/ok"]
    results = make_fetcher(timeout_s=5).fetch(locations)
    assert len(results) == len(locations)
    assert results[0] == results[2] == results[8] == BODY  # a redirect is followed
    assert failure(results[1]) == f"cannot fetch {server}/missing: HTTP 404 Not Found"
    assert f"Content-Length {CAP_BYTES * 100} is over max_bytes ({CAP_BYTES})" in failure(results[3])
    assert f"the body is over max_bytes ({CAP_BYTES})" in failure(results[4])
    assert failure(results[5]).endswith("connection refused")
    assert "DNS lookup failed" in failure(results[6])
    assert "a location must be a non-empty string, got 42" in failure(results[7])


def test_a_server_that_hangs_or_trickles_costs_the_timeout_and_frees_its_worker(
        server: str, make_fetcher: Callable[..., Fetcher]) -> None:
    fetcher = make_fetcher(timeout_s=1, max_concurrency=3)
    start = time.monotonic()
    results = fetcher.fetch([f"{server}/hang", f"{server}/trickle", f"{server}/trickle-headers"])
    assert time.monotonic() - start < 4.0  # the deadline, with room for a loaded machine
    for path, result in zip(("hang", "trickle", "trickle-headers"), results, strict=True):
        assert failure(result) == f"cannot fetch {server}/{path}: timed out after 1 s"
    start = time.monotonic()  # all three workers are free again: three 0.6 s fetches side by side
    assert fetcher.fetch([f"{server}/slower"] * 3) == [BODY] * 3
    assert time.monotonic() - start < 1.1  # with a worker still stuck: 1.2 s


def test_a_batch_takes_about_its_slowest_fetch_with_at_most_max_concurrency_in_flight(
        server: str, make_fetcher: Callable[..., Fetcher]) -> None:
    start = time.monotonic()
    assert make_fetcher(max_concurrency=16).fetch([f"{server}/slow"] * 16) == [BODY] * 16
    assert time.monotonic() - start < 3.0  # one after another: 4.8 s
    start = time.monotonic()
    assert make_fetcher(max_concurrency=4).fetch([f"{server}/slow"] * 8) == [BODY] * 8
    assert time.monotonic() - start >= 0.55  # two rounds of 0.3 s


def test_local_files_by_relative_and_absolute_path_and_file_url(tmp_path: Path,
                                                                make_fetcher: Callable[..., Fetcher]) -> None:
    (tmp_path / "images").mkdir()
    image = tmp_path / "images" / "a.png"
    image.write_bytes(b"\x89PNG fake")
    (tmp_path / "images" / "huge.png").write_bytes(b"z" * (CAP_BYTES + 1))
    results = make_fetcher().fetch(["images/a.png", str(image), image.as_uri(), "images/none.png", "images",
                                    "images/huge.png"])
    assert results[:3] == [b"\x89PNG fake"] * 3
    assert "no such file" in failure(results[3]) and "none.png" in failure(results[3])
    assert "is a directory" in failure(results[4])
    assert f"the file is over max_bytes ({CAP_BYTES})" in failure(results[5])


def test_local_roots_bound_what_a_record_can_read_and_a_fifo_is_never_opened_for_reading(
        tmp_path: Path, make_fetcher: Callable[..., Fetcher]) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(b"png")
    (tmp_path / "secret.txt").write_bytes(b"secret")
    os.mkfifo(tmp_path / "images" / "pipe.png")  # opened for reading, it would block until a writer came
    fetcher = make_fetcher(local_roots=((tmp_path / "images").resolve(),))
    start = time.monotonic()
    results = fetcher.fetch(["images/a.png", "secret.txt", "images/../secret.txt", str(tmp_path / "secret.txt"),
                             "images/pipe.png"])
    assert time.monotonic() - start < 5
    assert results[0] == b"png"
    for result in results[1:4]:
        assert "outside the folders local files are read from" in failure(result)
    assert "is not a regular file" in failure(results[4])


def test_a_scheme_not_allowed_is_refused(tmp_path: Path, make_fetcher: Callable[..., Fetcher]) -> None:
    (tmp_path / "a.png").write_bytes(b"png")
    only_http = make_fetcher(schemes=("http",))
    assert "scheme 'file' not allowed (only http)" in failure(only_http.fetch(["a.png"])[0])
    assert "scheme 'ftp' not allowed" in failure(make_fetcher().fetch(["ftp://host/a.png"])[0])


def test_no_message_shows_a_urls_password_or_query(server: str, make_fetcher: Callable[..., Fetcher]) -> None:
    host = server.removeprefix("http://")
    fetcher = make_fetcher(timeout_s=5)
    port = closed_port()
    missing, refused, auth = fetcher.fetch([f"http://user:pass@{host}/missing?X-Amz-Signature=secret",
                                            f"http://user:pass@127.0.0.1:{port}/x?Signature=secret#token",
                                            f"http://user:pass@{host}/auth"])
    assert failure(missing) == f"cannot fetch http://{host}/missing?…: HTTP 404 Not Found"
    assert "connection refused" in failure(refused)
    for message in (failure(missing), failure(refused)):
        assert "pass" not in message and "secret" not in message and "token" not in message
    assert auth == b"Basic " + base64.b64encode(b"user:pass")  # the credentials go as Basic auth
    assert redact("s3://k:sEcReT@bkt/a.png?sig=abc#f or https://h/p") == "s3://bkt/a.png?… or https://h/p"
    assert redact("a message quoting sig=abc", "https://h/p?sig=abc") == "a message quoting …"


@pytest.mark.skipif(not importlib.util.find_spec("fsspec") or importlib.util.find_spec("s3fs") is not None,
                    reason="needs fsspec installed and s3fs not")
def test_a_protocol_without_its_package_names_what_to_install(make_fetcher: Callable[..., Fetcher]) -> None:
    message = failure(make_fetcher().fetch(["s3://bucket/images/a.png?versionId=v1"])[0])
    assert message == "cannot fetch s3://bucket/images/a.png?…: s3:// locations need s3fs: pip install s3fs"


def test_limits_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="fetch limits out of range"):
        FetchLimits(max_concurrency=0)
