"""Compiling the native CPU kernels (``native/``) once, and sharing the result with every process that can use it.

The kernels are compiled on the machine that runs them, at the first model load that needs them, with
``-march=native`` for the CPU it has (AVX2, AVX-512, AVX512-BF16 each get their own code). The result is
kept in the Sluice cache and loaded in milliseconds by every later start.

Where: ``<sluice cache>/kernels/cpu_ops-<key>/sluice_cpu_ops_<key>.so``, the key naming everything that
changes the binary and nothing else (``native_key.py``): two virtual environments with the same Python and
torch share one build, a new torch or another CPU (a cache volume moved between hosts) gets its own.

How processes share a build (any environment, one machine or one cache volume), :func:`load_or_build`:

1. The module is in the folder: import it.
2. Otherwise take the folder's lock (``flock``: the kernel drops it when its holder dies, so it is never
   stale). The holder logs what it compiles and how long the last build took, builds in a private folder
   and renames the module into place, so no process ever sees half a file. A failure is written down
   (``failed.json``) so that the processes waiting on that build do not repeat it, nor new starts for
   :data:`FAILURE_TTL_S`.
3. A process that finds the lock held logs whose build it waits on (the holder's pid, command and start),
   a line every :data:`_PROGRESS_EVERY_S`, and loads the module once the holder is done; after ``wait_s`` it
   starts without the kernels (the caller's torch path) and says so. It never builds the same key twice.

Only this module touches the cache folder; ``native_cpu.py`` calls :func:`load_or_build` once per process.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TextIO

from sluice.engines.llm.cpu.native_key import CFLAGS, LDFLAGS, build_key, sources

log = logging.getLogger("sluice.engines.llm.cpu.native_cpu")

WAIT_S = 300.0  # longest wait on another process's build before starting without the kernels
FAILURE_TTL_S = 3600.0  # a failed build is not retried by new starts for this long (a compile error repeats)
_PROGRESS_EVERY_S = 15.0
_POLL_S = 0.2
# The lock's holder writes owner.json just after taking it: a waiter that comes in between waits this long for
# it before its first line, so that the line names the process it waits on.
_OWNER_WAIT_S = 2.0
_LAST_BUILD = "last-build.json"  # in <cache>/kernels/: how long the last build on this machine took


@dataclass(frozen=True, slots=True)
class BuildPlace:
    """The folder of one key and the files in it."""

    directory: Path
    name: str  # the module's name: sluice_cpu_ops_<key> (its PyInit_ symbol)

    @property
    def module_file(self) -> Path:
        return self.directory / f"{self.name}.so"

    @property
    def lock_file(self) -> Path:
        return self.directory / "build.lock"

    @property
    def owner_file(self) -> Path:
        return self.directory / "owner.json"

    @property
    def failed_file(self) -> Path:
        return self.directory / "failed.json"


def place(cache_dir: Path, key: str) -> BuildPlace:
    return BuildPlace(cache_dir / "kernels" / f"cpu_ops-{key}", f"sluice_cpu_ops_{key}")


def load_or_build(cache_dir: Path, wait_s: float = WAIT_S, clock: Callable[[], float] = time.monotonic
                  ) -> tuple[ModuleType | None, str]:  # fmt: skip
    """The compiled module and how it was got (``loaded``, ``built``, ``waited``), or None and why not.

    Blocks while this process builds, or while it waits (at most ``wait_s``) on another's build. Raises
    only what interrupts it (KeyboardInterrupt, SystemExit); a build that fails is a None with the reason.
    """
    where = place(cache_dir, build_key())
    if where.module_file.is_file():
        module = _import(where)
        if module is not None:
            return module, "loaded"
    try:
        where.directory.mkdir(parents=True, exist_ok=True)
        lock = open(where.lock_file, "a+")  # noqa: SIM115 - held for the whole build, closed below
    except OSError as err:
        return None, f"cannot write the kernel cache {where.directory}: {err.strerror or err}"
    with lock:
        waited_s = _acquire(lock, where, wait_s, clock)
        if waited_s is None:
            return None, (f"gave up after {wait_s:.0f} s waiting on another process's build in {where.directory}; "
                          "this process keeps the torch path, the next start loads the kernels once built")
        try:
            if where.module_file.is_file():  # built meanwhile by the process we waited on
                module = _import(where)
                if module is not None:
                    if waited_s > 0:
                        log.info("native CPU kernels: loaded the build another process finished (waited %.0f s)",
                                 waited_s)
                    return module, "waited"
            failure = _recent_failure(where, waited=waited_s > 0)
            if failure is not None:
                return None, failure
            return _build(where, cache_dir)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _acquire(lock: TextIO, where: BuildPlace, wait_s: float, clock: Callable[[], float]) -> float | None:
    """Take the folder's lock; the seconds waited for it, or None past ``wait_s``."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return 0.0
    except BlockingIOError:
        pass
    start = clock()
    announced = False  # the first line waits (briefly) for the holder to write who it is
    next_line = start + _PROGRESS_EVERY_S
    while True:
        if not announced and (where.owner_file.is_file() or clock() - start >= _OWNER_WAIT_S):
            log.info("native CPU kernels: waiting for %s, which is compiling them into %s (up to %.0f s; then this "
                     "process starts on the torch path)", _describe_owner(where), where.directory, wait_s)
            announced = True
        time.sleep(_POLL_S)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return max(clock() - start, 1e-3)
        except BlockingIOError:
            pass
        now = clock()
        if now - start >= wait_s:
            log.warning("native CPU kernels: %s has not finished compiling after %.0f s; starting without them "
                        "(the torch path: same results, slower at small batches)", _describe_owner(where),
                        now - start)
            return None
        if now >= next_line:
            log.info("native CPU kernels: still waiting for %s", _describe_owner(where))
            next_line = now + _PROGRESS_EVERY_S


def _describe_owner(where: BuildPlace) -> str:
    try:
        owner = json.loads(where.owner_file.read_text(encoding="utf-8"))
        age_s = time.time() - float(owner["started"])
        return f"process {owner['pid']} ({owner['command']}, building for {age_s:.0f} s)"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _recent_failure(where: BuildPlace, *, waited: bool) -> str | None:
    """The reason of a failed build of this key that should not be repeated now, else None."""
    try:
        failed = json.loads(where.failed_file.read_text(encoding="utf-8"))
        age_s = time.time() - float(failed["at"])
        reason = str(failed["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if waited or age_s < FAILURE_TTL_S:
        return (f"{reason} (a build {age_s / 60:.0f} min ago; retried after {FAILURE_TTL_S / 60:.0f} min, or "
                f"delete {where.failed_file})")
    return None


def _build(where: BuildPlace, cache_dir: Path) -> tuple[ModuleType | None, str]:
    """Compile into a private folder, then rename the module into place. Holds the folder's lock."""
    from torch.utils import cpp_extension

    for stale in where.directory.glob("build-*"):  # left by an interrupted build (its holder is gone)
        shutil.rmtree(stale, ignore_errors=True)
    private = where.directory / f"build-{os.getpid()}"
    _write_json(where.owner_file, {"pid": os.getpid(), "command": _command(), "started": time.time()})
    log.info("native CPU kernels: compiling them for this CPU and torch, once per machine (%s; %d cores), into %s; "
             "later starts load them in milliseconds", _expected_duration(cache_dir), os.cpu_count() or 1,
             where.directory)
    start = time.monotonic()
    try:
        private.mkdir()
        with _ninja_on_path():
            module = cpp_extension.load(
                name=where.name, sources=[str(s) for s in sources() if s.suffix == ".cpp"],
                build_directory=str(private), extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS), verbose=False,
            )  # fmt: skip
        os.replace(private / f"{where.name}.so", where.module_file)
    except Exception as exc:  # no compiler, no ninja, a compile error: the torch path still works
        text = str(exc).strip()
        reason = (text.splitlines()[0] if text else type(exc).__name__)[:300]
        _write_json(where.failed_file, {"reason": reason, "at": time.time()})
        return None, reason
    finally:
        shutil.rmtree(private, ignore_errors=True)
        where.owner_file.unlink(missing_ok=True)
    seconds = time.monotonic() - start
    module.__file__ = str(where.module_file)
    where.failed_file.unlink(missing_ok=True)
    _write_json(cache_dir / "kernels" / _LAST_BUILD, {"seconds": round(seconds, 1), "cores": os.cpu_count()})
    log.info("native CPU kernels: compiled in %.0f s", seconds)
    return module, "built"


def _expected_duration(cache_dir: Path) -> str:
    try:
        last = json.loads((cache_dir / "kernels" / _LAST_BUILD).read_text(encoding="utf-8"))
        return f"the last build here took {float(last['seconds']):.0f} s"
    except (OSError, ValueError, KeyError, TypeError):
        return "usually under a minute"


@contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch's extension builder runs ``ninja`` from PATH; the ``ninja`` package installs it beside this
    Python, which is not on PATH when a virtual environment's ``sluice`` runs without activating it."""
    if shutil.which("ninja") is not None:
        yield
        return
    candidates = [Path(sys.executable).parent]
    try:
        import ninja  # type: ignore[import-untyped]

        candidates.insert(0, Path(ninja.BIN_DIR))
    except (ImportError, AttributeError):
        pass
    found = next((str(d) for d in candidates if (d / "ninja").is_file()), None)
    if found is None:
        yield
        return
    before = os.environ.get("PATH", "")
    os.environ["PATH"] = found + os.pathsep + before
    try:
        yield
    finally:
        os.environ["PATH"] = before


def _import(where: BuildPlace) -> ModuleType | None:
    spec = importlib.util.spec_from_file_location(where.name, where.module_file)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as err:  # a truncated or foreign file: built again
        log.warning("native CPU kernels: cannot load %s (%s); compiling them again", where.module_file, err)
        return None
    return module


def _command() -> str:
    """What this process is, for the line of a process that waits on it: ``sluice run label.yaml``."""
    argv = sys.argv if sys.argv and sys.argv[0] not in ("", "-c") else [Path(sys.executable).name, *sys.argv[:1]]
    return " ".join([Path(argv[0]).name, *argv[1:3]])[:120]


def _write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
