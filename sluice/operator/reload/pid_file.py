"""PID files: how ``sluice reload`` finds the running ``sluice run`` processes of a pipeline on this host.

``sluice run`` announces itself as ``<run dir>/<pipeline>.<group>.<pid>.pid`` -- the run dir of the instance
slots (sluice/operator/instance.py: ``$SLUICE_RUN_DIR``, else ``$XDG_RUNTIME_DIR/sluice``, else
``<temp dir>/sluice-<uid>``) -- holding its PID, and an exclusive ``flock`` on it for as long as it runs.

Guarantees:

* **Only live processes are found.** A file whose lock can be taken belongs to a process that is gone
  (``kill -9`` included: the kernel drops the lock with the process); it is removed when found.
* **Never half-written.** The file is written and locked under a temporary name, then renamed into place.
* **Only processes that reload on SIGHUP are announced**: ``sluice run`` installs its handler first (the
  default action of SIGHUP ends a process, so signalling anything else would stop it).
"""

from __future__ import annotations

import fcntl
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from sluice.operator.instance import default_lock_dir

_SUFFIX = ".pid"


@dataclass
class PidFile:
    """This process's announcement; :meth:`release` (or the process's end) withdraws it."""

    path: Path
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        """Remove the file and drop the lock. Idempotent."""
        if self._fd is not None:
            try:
                self.path.unlink()
            except OSError:
                pass
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class Announced:
    """A live ``sluice run`` found in the run dir."""

    pid: int
    pipeline: str
    group: str


def announce(pipeline: str, group: str, run_dir: Path | None = None) -> PidFile:
    """Announce this process as running ``pipeline`` in consumer group ``group``. Raises OSError."""
    run_dir = run_dir or default_lock_dir()
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    pid = os.getpid()
    path = run_dir / f"{_safe(pipeline)}.{_safe(group)}.{pid}{_SUFFIX}"
    tmp = run_dir / f".{path.name}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{pid}\n".encode())
        os.replace(tmp, path)
    except OSError:
        os.close(fd)
        raise
    return PidFile(path, fd)


def find(pipeline: str | None = None, group: str | None = None, run_dir: Path | None = None) -> list[Announced]:
    """Live announced processes (of ``pipeline`` and ``group`` when given), by PID; stale files removed."""
    run_dir = run_dir or default_lock_dir()
    try:
        names = sorted(p.name for p in run_dir.iterdir() if p.name.endswith(_SUFFIX))
    except OSError:
        return []
    found = []
    for name in names:
        parts = name[: -len(_SUFFIX)].rsplit(".", 2)
        if len(parts) != 3 or not parts[2].isdigit():
            continue
        if (pipeline is not None and parts[0] != _safe(pipeline)) or (group is not None and parts[1] != _safe(group)):
            continue
        if _is_live(run_dir / name):
            found.append(Announced(pid=int(parts[2]), pipeline=parts[0], group=parts[1]))
    return found


def _is_live(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True  # its process holds the lock: alive
    except OSError:
        return False
    else:  # nobody holds it: the process is gone; remove the file (unless a new one took its name meanwhile)
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                path.unlink()
        except OSError:
            pass
        return False
    finally:
        os.close(fd)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "_"
