"""The sdist and the wheel built from the checkout carry every file of the package, as users install it.

An editable install (the one the test suite runs from) reads the source tree and hides a file the wheel
leaves out: the LLM engine's kernel header once stopped every LLM pipeline of an installed Sluice. Here the
sdist is built from the tracked files, the wheel from the sdist (the path ``pip install sluice-X.tar.gz``
takes), and both are checked against ``git ls-files sluice``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.integration.pipelines import ROOT


def _tracked(prefix: str) -> set[str]:
    out = subprocess.run(["git", "ls-files", prefix], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {line for line in out.splitlines() if line and (ROOT / line).is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist from a copy of the tracked files, the wheel from the sdist."""
    tmp = tmp_path_factory.mktemp("packaging")
    source = tmp / "source"
    for name in _tracked("."):
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(dist), str(source)],
                   check=True, capture_output=True, text=True)
    (sdist,) = dist.glob("sluice-*.tar.gz")
    unpacked = tmp / "unpacked"
    with tarfile.open(sdist) as archive:
        archive.extractall(unpacked, filter="data")
    (root,) = unpacked.iterdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w",
                    str(dist), str(root)], check=True, capture_output=True, text=True)
    (wheel,) = dist.glob("sluice-*.whl")
    return sdist, wheel


def test_the_wheel_carries_every_file_of_the_package(built: tuple[Path, Path]) -> None:
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = sorted(_tracked("sluice") - names)
    assert not missing, f"the wheel leaves out {missing}: add them to [tool.setuptools.package-data]"
    assert "sluice/engines/llm/cpu/native/cpu_ops.h" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        assert "sluice = sluice.cli:main" in archive.read(entry_points).decode()


def test_the_sdist_carries_the_package_and_what_builds_it(built: tuple[Path, Path]) -> None:
    sdist, _ = built
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    missing = sorted((_tracked("sluice") | {"pyproject.toml", "README.md"}) - names)
    assert not missing, f"the sdist leaves out {missing}"


def test_no_file_of_the_package_is_left_out_of_the_package_data_rules() -> None:
    """Every non-Python file under sluice/ is one the code reads at run time: each must match a rule."""
    import tomllib

    rules = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = sorted(name for name in _tracked("sluice") if not name.endswith(".py"))
    uncovered = [name for name in data
                 if not any(Path(name).match(f"{package.replace('.', '/')}/{pattern}")
                            for package, patterns in rules.items() for pattern in patterns)]
    assert not uncovered, f"no package-data rule covers {uncovered}"
