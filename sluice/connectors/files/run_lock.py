"""One run at a time per output: an exclusive ``flock`` on ``<checkpoint or output>.lock`` for as long as a run
works. Two runs writing the same output would interleave their rows and overwrite each other's checkpoint;
the second is refused at start instead. The kernel drops the lock with the process (``kill -9`` included),
so a restart after a crash takes it at once. The lock file is empty and never deleted (deleting it while
another process waits on it would let two hold "the same" lock through different inodes)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class RunLocked(Exception):
    """Another live run holds the lock; one line for the user."""


class RunLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise RunLocked(f"another run is writing these outputs (it holds {path}); wait for it to end, or "
                            "write elsewhere") from None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None
