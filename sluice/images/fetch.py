"""Fetching the bytes a record points at (a path or URL) instead of carrying them, a batch at a time.

The intake thread calls :meth:`Fetcher.fetch` with one batch's locations and gets one entry per location,
in order: the bytes, or a :class:`~sluice.engines.base.RecordError` with ``stage="fetch"`` (that record
alone goes to the dead-letter topic). ``fetch`` never raises for a bad location. Guarantees:

* At most ``max_concurrency`` fetches in flight: one pool of that many threads, made once, for all calls.
* ``timeout_s`` bounds the whole fetch of one location from the moment a worker starts it (connect,
  headers, body): each read waits only the time left, and a fetch still running at its deadline has its
  socket shut down, so a server that never answers or trickles bytes forever costs ``timeout_s``. A batch
  of up to ``max_concurrency`` locations returns within ``timeout_s`` plus a little slack; any batch within
  ``ceil(n / max_concurrency) * timeout_s`` plus slack. A DNS lookup or an fsspec read cannot be
  interrupted: its entry still fails on time, but its worker stays busy until the call returns.
* A body over ``max_bytes`` is refused: from ``Content-Length`` before reading, else while reading.
* Messages never show secrets: a URL's user:password, query and fragment (presigned URLs carry signatures)
  become ``https://host/path?…``. A URL's user:password is sent as Basic auth, never to a redirect's host.

Schemes: a plain path (a relative one resolves against ``base_dir``, the pipeline file's folder) or
``file://``; ``http``/``https`` through the standard library (the environment's proxy and CA settings, as
urllib reads them; at most 10 redirects, to http or https only); any other scheme through fsspec and the
protocol's package (s3fs, gcsfs, adlfs: credentials from the environment, as they read them), needed only
for those schemes. A scheme not in ``FetchLimits.schemes`` is refused; plain paths count as ``file``.
"""

from __future__ import annotations

import base64
import math
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from http.client import HTTPConnection, HTTPSConnection
from pathlib import Path
from typing import Any

from sluice.engines.base import RecordError, first_line

_CHUNK_BYTES = 64 * 1024
_SLACK_S = 0.5  # past a fetch's deadline, how long ``fetch`` still waits for its worker to report
_POLL_S = 0.1  # how often ``fetch`` looks for fetches past their deadline
_URL = re.compile(r"([a-z][a-z0-9+.-]*://)([^\s/?#@]*@)?([^\s?#]*)([?#]\S*)?", re.I)  # 2: userinfo, 4: query
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
             "abfss": "adlfs"}  # fsspec protocol -> the package that implements it


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """What a fetch may do; validated on creation."""

    timeout_s: float = 10.0  # the whole fetch of one location (connect + headers + body), not one read
    max_bytes: int = 32 * 1024**2  # a larger body is refused
    max_concurrency: int = 16  # fetches in flight at once (the pool's threads)
    schemes: tuple[str, ...] = ("file", "http", "https", "s3", "gs", "az")  # plain paths count as "file"

    def __post_init__(self) -> None:
        if not (self.timeout_s > 0 and self.max_bytes >= 0 and self.max_concurrency >= 1):
            raise ValueError(f"fetch limits out of range: {self}")


class _Failed(Exception):
    """A reason to refuse a location, worded for the dead letter (no secrets)."""


def redact(text: str, location: str = "") -> str:
    """``text`` with each URL in it shown without its user:password, query and fragment (``https://h/p?…``),
    and any other copy of ``location``'s password or query (a library's message may quote them) replaced."""
    text = _URL.sub(lambda m: f"{m[1]}{m[3]}{'?…' if m[4] else ''}", text)
    if found := _URL.fullmatch(location):
        userinfo, tail = (found[2] or "")[:-1], (found[4] or "")[1:]
        for secret in (userinfo, userinfo.partition(":")[2], tail):
            if len(secret) >= 3:
                text = text.replace(secret, "…")
    return text


class _Task:
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

    def __init__(self, *args: Any, task: _Task, **kwargs: Any) -> None:
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

    def __init__(self, task: _Task) -> None:
        super().__init__()
        self._task = task

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(partial(_WatchedHTTP, task=self._task), req)

    def https_open(self, req: urllib.request.Request) -> Any:
        context = self._context  # type: ignore[attr-defined]
        return self.do_open(partial(_WatchedHTTPS, task=self._task), req, context=context)


class Fetcher:
    """Fetches a batch of locations concurrently, at most ``max_concurrency`` at once; thread-safe; reusable.

    Made once by whoever wires the pipeline; ``fetch`` is called from the intake thread, ``close`` once at
    the end (a ``fetch`` after it raises RuntimeError).
    """

    def __init__(self, limits: FetchLimits, base_dir: Path) -> None:
        self._limits = limits
        self._base_dir = base_dir  # relative paths resolve against it (the pipeline file's folder)
        self._pool = ThreadPoolExecutor(limits.max_concurrency, thread_name_prefix="sluice-fetch")

    def fetch(self, locations: Sequence[str]) -> list[bytes | RecordError]:
        """One entry per location, in order: its bytes or a RecordError(stage="fetch"). Blocks until all
        are done or past their deadline (see the module's guarantees)."""
        timeout_s = self._limits.timeout_s
        tasks = [_Task(timeout_s) for _ in locations]
        futures = [self._pool.submit(self._run, at, task) for at, task in zip(locations, tasks, strict=True)]
        results: list[bytes | RecordError | None] = [None] * len(futures)
        waves = math.ceil(len(futures) / self._limits.max_concurrency)
        hard_stop = time.monotonic() + waves * (timeout_s + _SLACK_S)  # even with workers stuck in DNS
        pending, timed_out = set(range(len(futures))), f"timed out after {timeout_s:g} s"
        while pending:
            now = time.monotonic()
            for i in sorted(pending):
                future, task = futures[i], tasks[i]
                if task.remaining_s() <= 0:
                    task.abort()  # its worker reports the timeout as soon as its read returns
                if future.done() or task.remaining_s() <= -_SLACK_S or now >= hard_stop:
                    results[i] = future.result() if future.done() else _error(locations[i], timed_out)
                    future.cancel()  # one not started yet never will be
                    pending.discard(i)
            if pending:
                wait([futures[i] for i in pending], timeout=_POLL_S, return_when=FIRST_COMPLETED)
        return [result for result in results if result is not None]

    def close(self) -> None:
        """Stop the pool; fetches still running (stuck past their deadline) are not waited for."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self, location: object, task: _Task) -> bytes | RecordError:
        """On a pool thread: one location, every failure turned into a RecordError."""
        task.started = time.monotonic()
        if not isinstance(location, str) or not location:
            return RecordError(f"a location must be a non-empty string, got {location!r:.80}", stage="fetch")
        scheme = location.partition("://")[0].lower() if "://" in location else "file"
        try:
            if scheme not in self._limits.schemes:
                raise _Failed(f"scheme {scheme!r} not allowed (only {', '.join(self._limits.schemes)})")
            if scheme in ("http", "https"):
                return self._read_http(location, task)
            return self._read_file(location) if scheme == "file" else self._read_fsspec(location, scheme)
        except Exception as err:  # noqa: BLE001 - any failure belongs to this one record
            return _error(location, _reason(err, timed_out=task.aborted, timeout_s=task.timeout_s))
        finally:
            task.watch(None)  # done with the socket: nothing to shut down any more

    def _read_file(self, location: str) -> bytes:
        if "://" in location:
            parts = urllib.parse.urlsplit(location)
            if parts.netloc not in ("", "localhost"):
                raise _Failed(f"a file URL with a host ({parts.netloc}); only this machine's files are read")
            path = Path(urllib.request.url2pathname(parts.path))
        else:
            path = self._base_dir / location  # an absolute location stays itself
        if path.is_dir():
            raise _Failed(f"{path} is a directory, not a file")
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size > self._limits.max_bytes:
                raise _Failed(f"the file is over max_bytes ({self._limits.max_bytes})")
            return self._capped(file.read(self._limits.max_bytes + 1))

    def _read_http(self, location: str, task: _Task) -> bytes:
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
            if declared.isdigit() and int(declared) > self._limits.max_bytes:
                raise _Failed(f"Content-Length {declared} is over max_bytes ({self._limits.max_bytes})")
            chunks, size = [], 0
            while True:
                task.rearm()
                chunk = response.read1(_CHUNK_BYTES)
                if not chunk:
                    break
                size += len(chunk)
                if size > self._limits.max_bytes:
                    raise _Failed(f"the body is over max_bytes ({self._limits.max_bytes})")
                chunks.append(chunk)
        if task.aborted:  # the socket was shut down under the read, which then looked like the end
            raise TimeoutError
        return b"".join(chunks)

    def _read_fsspec(self, location: str, scheme: str) -> bytes:
        package = _PACKAGES.get(scheme, f"{scheme}fs")  # the usual name of a protocol's package
        try:
            import fsspec
        except ImportError:
            raise _Failed(f"{scheme}:// locations need fsspec: pip install fsspec {package}") from None
        try:
            with fsspec.open(location, "rb") as file:
                return self._capped(file.read(self._limits.max_bytes + 1))
        except ImportError:  # fsspec knows the protocol; the package that implements it is missing
            raise _Failed(f"{scheme}:// locations need {package}: pip install {package}") from None

    def _capped(self, data: bytes) -> bytes:
        if len(data) > self._limits.max_bytes:
            raise _Failed(f"the body is over max_bytes ({self._limits.max_bytes})")
        return data


def _error(location: str, reason: str) -> RecordError:
    return RecordError(f"cannot fetch {redact(location)}: {redact(reason, location)}", stage="fetch")


def _reason(err: BaseException, timed_out: bool, timeout_s: float) -> str:
    """Why a fetch failed, in a few words."""
    if isinstance(err, _Failed):
        return str(err)
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {first_line(Exception(err.reason))}"
    if timed_out or isinstance(err, TimeoutError):
        return f"timed out after {timeout_s:g} s"
    if isinstance(err, urllib.error.URLError):
        reason = err.reason
        return _reason(reason, timed_out, timeout_s) if isinstance(reason, BaseException) else str(reason)
    if isinstance(err, socket.gaierror):
        return f"DNS lookup failed ({err.strerror})"
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    if isinstance(err, FileNotFoundError):
        return f"no such file{f' ({err.filename})' if err.filename else ''}"
    return f"{type(err).__name__}: {first_line(err)}"
