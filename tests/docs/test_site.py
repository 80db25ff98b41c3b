"""The documentation site builds with warnings as errors, and the examples in it and in the README work.

* Sphinx builds docs/ with ``-W``: a broken link or anchor, a page outside the navigation, a malformed
  table fail the build.
* Every ``yaml`` block of README.md, bench/README.md and docs/ passes ``sluice validate``, unless its first
  line says it is a fragment (``# fragment: ...``).
* Every shell block runs, from the repository root with this environment's ``sluice`` on PATH, unless its
  first line says why it does not (``# not run by the docs tests: <why>``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.pipelines import ROOT

PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_SHELL = {"bash", "sh", "shell", "console"}
FRAGMENT = "# fragment"
NOT_RUN = "# not run by the docs tests:"
# Variables the examples take from the environment (secrets, addresses), set to placeholders for `validate`
PLACEHOLDERS = {"KAFKA_BOOTSTRAP_SERVERS": "broker:9092", "KAFKA_USERNAME": "user", "KAFKA_PASSWORD": "secret",
                "SCHEMA_REGISTRY_URL": "http://registry:8081", "SCHEMA_REGISTRY_KEY": "key",
                "SCHEMA_REGISTRY_SECRET": "secret"}


def _blocks(languages: set[str]) -> list[tuple[str, str]]:
    """(where, body) of every fenced block in those languages."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            if match.group(1) in languages:
                line = text[: match.start()].count("\n") + 1
                found.append((f"{page.relative_to(ROOT)}:{line}", match.group(2)))
    return found


def _first_line(body: str) -> str:
    return body.strip().splitlines()[0] if body.strip() else ""


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           str(ROOT / "docs"), str(tmp_path / "html")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert (tmp_path / "html" / "reference" / "configuration.html").is_file()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The same build, on a copy of the docs with one link to an anchor that does not exist."""
    import shutil

    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("_build"))
    page = docs / "concepts.md"
    page.write_text(page.read_text() + "\nSee [nowhere](guarantees.md#no-such-heading).\n")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(docs),
                           str(tmp_path / "html")], capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "no-such-heading" in proc.stderr


@pytest.mark.parametrize(("where", "body"), _blocks({"yaml"}), ids=lambda v: v if ".md:" in str(v) else "")
def test_every_yaml_block_is_a_valid_pipeline_or_says_it_is_a_fragment(where: str, body: str,
                                                                       tmp_path: Path) -> None:
    if _first_line(body).startswith(FRAGMENT):
        return
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(body)
    proc = subprocess.run([sys.executable, "-m", "sluice.cli", "validate", str(pipeline)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, **PLACEHOLDERS}, timeout=120)
    assert proc.returncode == 0, f"{where}: {proc.stderr.strip()} (a fragment starts with '{FRAGMENT}: ...')"


@pytest.mark.parametrize(("where", "body"), _blocks(_SHELL), ids=lambda v: v if ".md:" in str(v) else "")
def test_every_shell_block_runs_or_says_why_not(where: str, body: str) -> None:
    first = _first_line(body)
    if first.startswith("# not run"):
        assert first.startswith(NOT_RUN) and len(first) > len(NOT_RUN) + 5, f"{where}: say why ({NOT_RUN} <why>)"
        return
    bin_dir = str(Path(sys.executable).parent)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", body], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
                          timeout=600)
    assert proc.returncode == 0, f"{where}:\n{body}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
