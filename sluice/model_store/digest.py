"""A model's content hash, and the cheap fingerprint that says when to compute it again.

:func:`content_digest` names a model by what it holds, so an output can say which model made it:

* **Identical for identical content.** A file hashes to the SHA-256 of its bytes; a directory to the
  SHA-256 of its files' relative paths, sizes and SHA-256s, in sorted order. Where the model lies, its
  file times, how it was copied and the symlinks that lead to it do not count.
* **Everything the model loads.** Every regular file under a directory counts, symlinks followed -- except
  names starting with ``.`` (``.git``, ``.cache``, Kubernetes' ``..data`` links: the files they lead to are
  counted through their visible names).
* **Cheap at every start after the first.** Hashing reads each file once (seconds for a
  multi-GB model with SHA-NI); each file's digest is then cached under ``<cache>/digests`` keyed by
  its device, inode, size, modification and change times (``st_ctime`` changes on any write and cannot be
  set back by ``touch`` or ``cp -p``), so an unchanged file is never read again. A file changed within the
  last two seconds is not cached: on file systems with coarse timestamps a later write in the same tick
  would look unchanged (git's "racy" rule).

Sampling (sizes, times and a few blocks) would have been cheaper still, but two versions of a fine-tuned
model have the same sizes, and a sample misses a change outside it: the header would then name the wrong
model, which is worse than a slow first start.

:func:`fingerprint` is what the reload watcher polls: the resolved path and ``(name, device, inode, size,
mtime, ctime)`` of each of those files -- a few ``stat`` calls, no reading. A new file, a directory or a
symlink swapped atomically, or a file written in place all change it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from pathlib import Path

log = logging.getLogger("sluice.model_store")

_CHUNK_BYTES = 8 << 20
_RACY_S = 2.0  # a file changed this recently is hashed but not cached
_TREE_FORMAT = b"sluice-tree-v1\n"

Fingerprint = tuple[str, tuple[tuple[str, int, int, int, int, int], ...]]


def model_files(path: Path) -> list[tuple[str, Path, os.stat_result]]:
    """``(relative name, path, stat)`` of every file that makes up the model at ``path``, sorted by name.

    A file gives itself (named ``""``). Raises OSError when ``path`` is missing or unreadable."""
    st = os.stat(path)
    if not os.path.isdir(path):
        return [("", path, st)]
    found: list[tuple[str, Path, os.stat_result]] = []
    seen_dirs = {(st.st_dev, st.st_ino)}  # a symlink loop inside a model directory is walked once

    def walk(directory: Path, prefix: str) -> None:
        with os.scandir(directory) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.name.startswith("."):
                    continue
                try:
                    est = os.stat(entry.path)  # follows symlinks: what the model loads
                except FileNotFoundError:  # a dangling link: nothing is loaded from it
                    continue
                name = prefix + entry.name
                if entry.is_dir():
                    if (est.st_dev, est.st_ino) not in seen_dirs:
                        seen_dirs.add((est.st_dev, est.st_ino))
                        walk(Path(entry.path), name + "/")
                elif entry.is_file():
                    found.append((name, Path(entry.path), est))

    walk(path, "")
    return found


def fingerprint(path: Path) -> Fingerprint | None:
    """What changes whenever the model at ``path`` does (see the module docstring); None when it is missing
    (in the middle of a non-atomic swap, say)."""
    try:
        files = model_files(path)
        real = os.path.realpath(path)
    except OSError:
        return None
    return real, tuple((name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                       for name, _, st in files)


def content_digest(path: Path, cache_dir: Path | None = None) -> str:
    """The SHA-256 (hex) of the model at ``path``, a file or a directory; see the module docstring.

    ``cache_dir``: where per-file digests are kept (default ``<sluice cache>/digests``). Raises OSError
    when the model cannot be read."""
    cache = _DigestCache(cache_dir)
    files = model_files(path)
    if len(files) == 1 and files[0][0] == "":
        return cache.file_digest(files[0][1], files[0][2])
    tree = hashlib.sha256(_TREE_FORMAT)
    for name, file_path, st in files:
        tree.update(f"{name}\0{st.st_size}\0{cache.file_digest(file_path, st)}\n".encode())
    return tree.hexdigest()


def size_bytes(path: Path) -> int:
    """Bytes of every file that makes up the model at ``path`` (0 when it is missing)."""
    try:
        return sum(st.st_size for _, _, st in model_files(path))
    except OSError:
        return 0


class _DigestCache:
    """Per-file SHA-256s on disk, one small file each (written atomically: processes may share it)."""

    def __init__(self, cache_dir: Path | None) -> None:
        if cache_dir is None:
            from sluice.model_store.download import default_cache_dir

            cache_dir = default_cache_dir() / "digests"
        self.dir = cache_dir

    def file_digest(self, path: Path, st: os.stat_result) -> str:
        key = f"{os.path.realpath(path)}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
        entry = self.dir / hashlib.sha256(key.encode()).hexdigest()[:32]
        try:
            cached = entry.read_text(encoding="ascii").strip()
            if len(cached) == 64:
                return cached
        except (OSError, UnicodeDecodeError):
            pass
        digest = _hash_file(path)
        after = os.stat(path)
        changed = (after.st_size, after.st_mtime_ns, after.st_ctime_ns) != (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        racy = time.time() - max(after.st_mtime_ns, after.st_ctime_ns) / 1e9 < _RACY_S
        if not changed and not racy:
            self._store(entry, digest)
        return digest

    def _store(self, entry: Path, digest: str) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write(digest + "\n")
            os.replace(tmp, entry)
        except OSError as err:  # a read-only cache costs a re-hash next time, nothing else
            log.debug("cannot cache a model digest in %s: %s", self.dir, err)


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while n := handle.readinto(buffer):
            digest.update(view[:n])  # hashlib releases the GIL on large buffers: the engine thread runs on
    return digest.hexdigest()
