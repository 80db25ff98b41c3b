"""The dry run's import guard: make missing what the GPU machine will not have.

On the GPU machine Sluice runs on that machine's python3 plus the wheels of ``bench/gpu_wheels.txt``. A
dependency of Sluice that is on neither list (``bench/gpu_machine.txt``, the wheels) would fail an import
there, eight minutes into a device call. The CPU dry run therefore blocks those dependencies' modules
before anything imports them (``SLUICE_GPU_CHECK_GUARD=1``, set by ``bench/gpu_check.sh --dry-run``): an
engine module that starts importing ``confluent_kafka`` or ``jsonschema`` at import time fails the dry run
in CI instead.

Blocking is ``sys.modules[name] = None``: ``import name`` then raises ``ModuleNotFoundError`` and
``importlib.util.find_spec(name)`` returns None, so libraries that probe for optional packages
(transformers does) see them as absent, as they will be there. A module is blocked when a declared
dependency missing there provides it and nothing there does; the standard library is never touched.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import sys
from pathlib import Path

import tomllib  # Python 3.11+: the GPU check and its dry run need no older interpreter

ROOT = Path(__file__).resolve().parents[1]
ENV = "SLUICE_GPU_CHECK_GUARD"


def canonical(name: str) -> str:
    """A distribution name as the package index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(path: Path) -> set[str]:
    """Distribution names listed one per line (``#`` comments, ``name==version`` pins)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return {canonical(re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0]) for line in lines if line}


def declared_dependencies() -> set[str]:
    """Every distribution pyproject.toml names: the core dependencies and every extra's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    specs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    names = {canonical(re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0]) for spec in specs}
    return names - {"sluice"}


def available_there() -> set[str]:
    """Distributions the GPU machine's python3 will see: its own and the wheel folder's."""
    return _names(ROOT / "bench" / "gpu_machine.txt") | _names(ROOT / "bench" / "gpu_wheels.txt")


def blocked_modules(declared: set[str], there: set[str]) -> set[str]:
    """Top-level modules installed here that some declared dependency provides and nothing ``there`` does.

    (A namespace such as ``opentelemetry`` has many providers, most of them only pulled in by the one
    declared; ``google`` is also provided by protobuf, which the GPU machine has, so it stays.)
    """
    blocked = set()
    for module, dists in md.packages_distributions().items():
        names = {canonical(d) for d in dists}
        if names & (declared - there) and not names & there and module not in sys.stdlib_module_names:
            blocked.add(module)
    return blocked


def install() -> set[str]:
    """Block the modules (see the module docstring); returns them. Call before the imports to police."""
    blocked = blocked_modules(declared_dependencies(), available_there())
    for module in blocked:
        if module not in sys.modules:
            sys.modules[module] = None  # type: ignore[assignment]  # import -> ModuleNotFoundError
    return blocked


def install_if_asked() -> None:
    if os.environ.get(ENV) == "1":
        install()
