"""Instance slots: a small number, unique among the live Sluice processes of one consumer group on this host.

Two ids must be unique per running process and *stable across its restarts*, and both are named
``sluice-<group>-<hostname>-<slot>`` (:func:`instance_name`):

* the transactional id of exactly-once: a restarted process that registers its predecessor's id aborts the
  transaction the predecessor left open at once, while a fresh id leaves it open until the broker's
  transaction timeout, and ``read_committed`` readers downstream stall behind it;
* the ``group.instance.id`` of static group membership: a process restarted under its predecessor's id gets
  the predecessor's partitions back at once, while a fresh member waits until the group has given up on the
  dead one (``session.timeout.ms``, 45 s by default) and then rebalances.

The hostname alone is stable but not unique once several processes share a host; a random id is unique but
not stable.

A slot gives both. Each process takes the lowest free slot ``0, 1, 2...`` by holding an exclusive ``flock``
on ``<lock dir>/<group>.<slot>.lock`` for as long as it runs. Guarantees:

* two live holders never share a slot (the lock is the kernel's; it works across processes and across
  threads of one process, since every claim opens its own file description);
* a process that dies in any way, ``kill -9`` included, frees its slot: the kernel drops the lock with the
  process, so the one that restarts in its place gets the lowest free slot, which is the dead one's when it
  was the only one to die;
* the lock files are never deleted (deleting one while another process waits to lock it would let two
  processes hold "the same" slot through different inodes); they are empty, one per slot ever used.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

MAX_SLOTS = 4096


class NoFreeSlot(Exception):
    """Every slot is taken, or the lock directory cannot be used. The message says which and what to do."""


def default_lock_dir() -> Path:
    """``$SLUICE_RUN_DIR``, else ``$XDG_RUNTIME_DIR/sluice``, else ``<temp dir>/sluice-<uid>``."""
    if os.environ.get("SLUICE_RUN_DIR"):
        return Path(os.environ["SLUICE_RUN_DIR"])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "sluice"
    return Path(tempfile.gettempdir()) / f"sluice-{os.getuid()}"


@dataclass
class InstanceSlot:
    """A claimed slot. Hold it while the process works; :meth:`release` (or process exit) frees it."""

    name: str
    slot: int
    path: Path
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        """Free the slot. Idempotent."""
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor of the file description drops the flock
            self._fd = None


def instance_name(group: str, hostname: str, slot: int) -> str:
    """The id of the process holding ``slot``: its transactional id and its ``group.instance.id``."""
    return f"sluice-{group}-{hostname}-{slot}"


def claim_slot(name: str, lock_dir: Path | None = None) -> InstanceSlot:
    """Claim the lowest free slot for ``name`` (a consumer group, say). Raises NoFreeSlot."""
    lock_dir = lock_dir or default_lock_dir()
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"
    try:
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise NoFreeSlot(f"cannot create the instance lock directory {lock_dir}: {err.strerror}; "
                         "set SLUICE_RUN_DIR to a writable directory") from None
    for slot in range(MAX_SLOTS):
        path = lock_dir / f"{safe}.{slot}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as err:
            raise NoFreeSlot(f"cannot open {path}: {err.strerror}; set SLUICE_RUN_DIR to a writable "
                             "directory") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except OSError as err:  # no locks on this file system (some network mounts)
            os.close(fd)
            raise NoFreeSlot(f"cannot lock {path}: {err.strerror}; set SLUICE_RUN_DIR to a local directory, "
                             "or give each process its own exactly_once.transactional_id") from None
        return InstanceSlot(name, slot, path, fd)
    raise NoFreeSlot(f"all {MAX_SLOTS} instance slots for '{name}' in {lock_dir} are taken")
