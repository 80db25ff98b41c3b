"""Test helpers for a real Schema Registry: run one with deploy/registry/registry.sh (Apicurio Registry,
its Confluent-compatible API), crash it and bring it back. Clients are confluent-kafka's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.kafka import free_port_block

REGISTRY_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "registry" / "registry.sh"


class RegistryServer:
    """A registry started by registry.sh in ``run_dir``; the test owns it and must call :meth:`stop`."""

    def __init__(self, run_dir: Path, url: str) -> None:
        self.run_dir = run_dir
        self.url = url  # http://127.0.0.1:P/apis/ccompat/v7: what a SchemaRegistryClient is given

    @classmethod
    def start(cls, run_dir: Path, timeout_s: float = 120.0, host: str = "127.0.0.1") -> RegistryServer:
        """A fresh registry (empty, file-backed storage) on a free port of ``host`` (an address of this
        machine); returns once it answers. It also stops by itself once this Python process exits, even if
        it is killed."""
        port, _ = free_port_block(1)
        url = _run_script(run_dir, "start", "--port", str(port), "--host", host, "--watch-pid", str(os.getpid()),
                          "--timeout", str(int(timeout_s))).strip()
        return cls(run_dir, url)

    def kill(self) -> None:
        """Crash it (SIGKILL), keeping what it stored."""
        _run_script(self.run_dir, "kill", "--signal", "KILL")

    def restart(self, timeout_s: float = 120.0) -> None:
        """Start it again on its old port and storage; returns once it answers."""
        _run_script(self.run_dir, "restart", "--timeout", str(int(timeout_s)))

    def stop(self) -> None:
        _run_script(self.run_dir, "stop", "--timeout", "15")


def _run_script(run_dir: Path, *args: str) -> str:
    env = dict(os.environ, SLUICE_PYTHON=os.environ.get("SLUICE_PYTHON", sys.executable))
    proc = subprocess.run(["bash", str(REGISTRY_SCRIPT), *args, "--dir", str(run_dir)],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"registry.sh {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    return proc.stdout
