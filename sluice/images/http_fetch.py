"""HTTP(S) fetches for :mod:`sluice.images.fetch` with a deadline that holds: the standard library's urllib,
through connections that report their socket, so the fetcher can shut it down at the deadline (a server that
trickles header lines never trips a per-read timeout).

:func:`read_http` reads one URL: redirects (at most 10, to http or https only), the environment's proxy and
CA settings as urllib reads them, a URL's user:password sent as Basic auth and never to a redirect's host,
``Content-Length`` checked against ``max_bytes`` before reading and the body counted while reading.
"""

from __future__ import annotations

import base64
import math
import socket
import time
import urllib.parse
import urllib.request
from contextlib import suppress
from functools import partial
from http.client import HTTPConnection, HTTPSConnection
from typing import Any

CHUNK_BYTES = 64 * 1024


class Refused(Exception):
    """A reason to refuse a location, worded for the dead letter (no secrets)."""


class FetchTask:
    """One location's fetch: when its worker started it, the socket to shut down at its deadline. No lock:
    ``abort`` sets ``aborted`` then reads the socket, ``watch`` the reverse, so one of them shuts it down."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.started: float | None = None  # set by the worker when it begins
        self.aborted = False  # set by ``fetch``'s thread at the deadline
        self._sock: socket.socket | None = None  # the connection in use, if any

    def remaining_s(self) -> float:
        return math.inf if self.started is None else self.started + self.timeout_s - time.monotonic()

    def watch(self, sock: socket.socket | None) -> None:
        """The connection now in use (a redirect opens the next one after closing the last)."""
        self._sock = sock
        if self.aborted:
            self.abort()

    def rearm(self) -> None:
        """Before each read: the socket may wait only the time left; none left is a timeout."""
        remaining, sock = self.remaining_s(), self._sock
        if remaining <= 0 or self.aborted:
            raise TimeoutError
        with suppress(OSError):
            if sock is not None:
                sock.settimeout(remaining)

    def abort(self) -> None:
        """At the deadline: wake the worker if it is blocked on the socket (it then reports a timeout)."""
        self.aborted, sock = True, self._sock
        with suppress(OSError):  # closed already
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)


class _Watched:
    """A connection that tells its task which socket it reads from, as soon as it has one."""

    sock: socket.socket | None

    def __init__(self, *args: Any, task: FetchTask, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self._task = task

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self._task.watch(self.sock)


class _WatchedHTTP(_Watched, HTTPConnection): ...


class _WatchedHTTPS(_Watched, HTTPSConnection): ...


class _Handler(urllib.request.HTTPSHandler):
    """Opens http and https URLs through watched connections."""

    http_request = urllib.request.HTTPHandler.http_request  # Host, User-Agent... as https_request adds them

    def __init__(self, task: FetchTask) -> None:
        super().__init__()
        self._task = task

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(partial(_WatchedHTTP, task=self._task), req)

    def https_open(self, req: urllib.request.Request) -> Any:
        context = self._context  # type: ignore[attr-defined]
        return self.do_open(partial(_WatchedHTTPS, task=self._task), req, context=context)


def read_http(location: str, task: FetchTask, max_bytes: int) -> bytes:
    """The body of an http(s) URL within ``task``'s deadline and ``max_bytes``; raises Refused, TimeoutError,
    urllib's errors."""
    parts = urllib.parse.urlsplit(location)
    url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    request = urllib.request.Request(url, headers={"Accept-Encoding": "identity"})
    if parts.username is not None:  # sent as Basic auth, and not on to the host of a redirect
        userinfo = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        token = base64.b64encode(userinfo.encode()).decode()
        request.add_unredirected_header("Authorization", f"Basic {token}")
    opener = urllib.request.OpenerDirector()  # http and https only: no ftp, file or data handlers
    for handler in (urllib.request.ProxyHandler(), _Handler(task), urllib.request.HTTPRedirectHandler(),
                    urllib.request.HTTPDefaultErrorHandler(), urllib.request.HTTPErrorProcessor(),
                    urllib.request.UnknownHandler()):  # a redirect to ftp://: "unknown url type"
        opener.add_handler(handler)
    with opener.open(request, timeout=max(task.remaining_s(), 0.001)) as response:
        declared = (response.headers.get("Content-Length") or "").strip()
        if declared.isdigit() and int(declared) > max_bytes:
            raise Refused(f"Content-Length {declared} is over max_bytes ({max_bytes})")
        chunks, size = [], 0
        while True:
            task.rearm()
            chunk = response.read1(CHUNK_BYTES)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise Refused(f"the body is over max_bytes ({max_bytes})")
            chunks.append(chunk)
    if task.aborted:  # the socket was shut down under the read, which then looked like the end
        raise TimeoutError
    return b"".join(chunks)
