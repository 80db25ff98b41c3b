"""bench/gpu_check.sh and its driver: on a machine without a GPU they stop at once and say why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402


def _gpu_listed() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return listing.returncode == 0 and listing.stdout.startswith("GPU")


def _run_script(env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh")], capture_output=True, text=True,
                          env=env, timeout=60)
    return proc, time.perf_counter() - start


@pytest.mark.skipif(_gpu_listed(), reason="this machine has a GPU")
def test_the_script_stops_at_once_on_a_machine_without_a_gpu(tmp_path: Path) -> None:
    proc, took_s = _run_script({**os.environ, "SLUICE_VENV": str(tmp_path / "no-venv")})
    assert proc.returncode == 2 and took_s < 5
    assert "no NVIDIA GPU on this machine" in proc.stderr
    assert not (tmp_path / "no-venv").exists()  # nothing was set up or installed


def test_an_nvidia_smi_that_lists_no_gpu_counts_as_no_gpu(tmp_path: Path) -> None:
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "SLUICE_VENV": str(tmp_path / "no-venv")}
    proc, _ = _run_script(env)
    assert proc.returncode == 2 and "lists no GPU" in proc.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CUDA is visible here")
def test_the_driver_stops_at_once_without_cuda(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == gpu_check.NO_GPU
    assert not out.exists()


def test_each_step_gets_at_most_its_cap_and_leaves_the_reserve() -> None:
    clock = gpu_check.Clock(budget_s=100)
    assert clock.grant(30) == 30
    assert 69 < clock.grant(90, reserve_s=30) <= 70
    assert clock.grant(60, reserve_s=200) == 0
