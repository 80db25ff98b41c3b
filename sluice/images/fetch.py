"""Fetching the bytes a record points at (a path or URL) instead of carrying them, a batch at a time.

The intake thread calls :meth:`Fetcher.fetch` with one batch's locations and gets one entry per location,
in order: the bytes, or a :class:`~sluice.engines.engine_contract.RecordError` with ``stage="fetch"`` (that record
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
for those schemes. A scheme not in ``FetchLimits.schemes`` is refused; plain paths count as ``file``, and are
read only inside ``local_roots`` when it names folders, and only when they are regular files (never a FIFO or
a device, which would block a worker for good).
"""

from __future__ import annotations

import math
import os
import re
import socket
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from sluice.engines.engine_contract import RecordError, first_line
from sluice.images.http_fetch import FetchTask, Refused, read_http

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
    local_roots: tuple[Path, ...] = ()  # local files only inside these folders (resolved); () for anywhere

    def __post_init__(self) -> None:
        if not (self.timeout_s > 0 and self.max_bytes >= 0 and self.max_concurrency >= 1):
            raise ValueError(f"fetch limits out of range: {self}")


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
        tasks = [FetchTask(timeout_s) for _ in locations]
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

    def _run(self, location: object, task: FetchTask) -> bytes | RecordError:
        """On a pool thread: one location, every failure turned into a RecordError."""
        task.started = time.monotonic()
        if not isinstance(location, str) or not location:
            return RecordError(f"a location must be a non-empty string, got {location!r:.80}", stage="fetch")
        scheme = location.partition("://")[0].lower() if "://" in location else "file"
        try:
            if scheme not in self._limits.schemes:
                raise Refused(f"scheme {scheme!r} not allowed (only {', '.join(self._limits.schemes)})")
            if scheme in ("http", "https"):
                return read_http(location, task, self._limits.max_bytes)
            return self._read_file(location) if scheme == "file" else self._read_fsspec(location, scheme)
        except Exception as err:  # noqa: BLE001 - any failure belongs to this one record
            return _error(location, _reason(err, timed_out=task.aborted, timeout_s=task.timeout_s))
        finally:
            task.watch(None)  # done with the socket: nothing to shut down any more

    def _read_file(self, location: str) -> bytes:
        if "://" in location:
            parts = urllib.parse.urlsplit(location)
            if parts.netloc not in ("", "localhost"):
                raise Refused(f"a file URL with a host ({parts.netloc}); only this machine's files are read")
            path = Path(urllib.request.url2pathname(parts.path))
        else:
            path = self._base_dir / location  # an absolute location stays itself
        roots = self._limits.local_roots
        if roots and not any(path.resolve().is_relative_to(root) for root in roots):
            raise Refused(f"{path} is outside the folders local files are read from (local_roots)")
        if path.is_dir():
            raise Refused(f"{path} is a directory, not a file")
        # O_NONBLOCK: a FIFO or a device would block the worker for good; only a regular file is read
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(descriptor, "rb") as file:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise Refused(f"{path} is not a regular file")
            if status.st_size > self._limits.max_bytes:
                raise Refused(f"the file is over max_bytes ({self._limits.max_bytes})")
            return self._capped(file.read(self._limits.max_bytes + 1))

    def _read_fsspec(self, location: str, scheme: str) -> bytes:
        package = _PACKAGES.get(scheme, f"{scheme}fs")  # the usual name of a protocol's package
        try:
            import fsspec
        except ImportError:
            raise Refused(f"{scheme}:// locations need fsspec: pip install fsspec {package}") from None
        try:
            with fsspec.open(location, "rb") as file:
                return self._capped(file.read(self._limits.max_bytes + 1))
        except ImportError:  # fsspec knows the protocol; the package that implements it is missing
            raise Refused(f"{scheme}:// locations need {package}: pip install {package}") from None

    def _capped(self, data: bytes) -> bytes:
        if len(data) > self._limits.max_bytes:
            raise Refused(f"the body is over max_bytes ({self._limits.max_bytes})")
        return data


def _error(location: str, reason: str) -> RecordError:
    return RecordError(f"cannot fetch {redact(location)}: {redact(reason, location)}", stage="fetch")


def _reason(err: BaseException, timed_out: bool, timeout_s: float) -> str:
    """Why a fetch failed, in a few words."""
    if isinstance(err, Refused):
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
