"""Another commit of Sluice beside this checkout, for benchmarks that compare against it in the same run
(``--baseline-ref``)."""

from __future__ import annotations

from pathlib import Path


def baseline_checkout(ref: str) -> str:
    """A ``git worktree`` of ``ref`` (resolved to its commit) in the Sluice cache, outside the checkout; its path."""
    import subprocess

    from sluice.model_store import default_cache_dir

    repo = Path(__file__).resolve().parent.parent
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=repo, check=True,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    path = default_cache_dir() / "bench-worktrees" / commit[:12]
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), commit], cwd=repo, check=True,
                       capture_output=True)  # fmt: skip
    return str(path)


def import_sluice_from(root: str) -> None:
    """Make ``root`` (a baseline checkout) the Sluice this process imports; call before anything imports it.
    RuntimeError when another copy is imported all the same."""
    import sys

    sys.path.insert(0, root)
    import sluice

    if not (sluice.__file__ or "").startswith(root):
        raise RuntimeError(f"sluice imported from {sluice.__file__}, not from {root}")
