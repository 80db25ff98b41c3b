"""deploy/registry/registry.sh keeps its promises: the URL alone on stdout, ids that survive a crash and a
restart, and it never signals a process it did not start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from tests.support.kafka import free_port_block
from tests.support.registry import REGISTRY_SCRIPT, RegistryServer

pytestmark = pytest.mark.slow

SCHEMA = json.dumps({"type": "record", "name": "T", "fields": [{"name": "a", "type": "long"}]})


def _script(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SLUICE_PYTHON=sys.executable)
    return subprocess.run(["bash", str(REGISTRY_SCRIPT), *args, "--dir", str(run_dir)], capture_output=True,
                          text=True, env=env, check=False, timeout=180)


def test_ids_survive_a_crash_and_restart_and_stop_spares_foreign_processes(tmp_path: Path) -> None:
    server = RegistryServer.start(tmp_path / "r")
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.url.endswith("/apis/ccompat/v7")
        schema_id = SchemaRegistryClient({"url": server.url, "timeout": 10}).register_schema(
            "t-value", Schema(SCHEMA, "AVRO"))
        server.kill()
        assert _script(tmp_path / "r", "status").returncode == 1
        server.restart()
        fresh = SchemaRegistryClient({"url": server.url, "timeout": 10})  # no cache: asks the registry
        assert json.loads(fresh.get_schema(schema_id).schema_str) == json.loads(SCHEMA)
        assert fresh.register_schema("t-value", Schema(SCHEMA, "AVRO")) == schema_id  # same id, no new version
        assert _script(tmp_path / "r", "start").returncode == 1  # refuses a second start over a running one
    finally:
        server.stop()
    # a recorded PID that now belongs to some other process is left alone
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "r" / "pid").write_text(str(stranger.pid))
        assert _script(tmp_path / "r", "stop").returncode == 0
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_watch_pid_stops_the_registry_when_its_owner_exits(tmp_path: Path) -> None:
    owner = subprocess.Popen(["sleep", "300"])
    port, _ = free_port_block(1)
    try:
        started = _script(tmp_path, "start", "--port", str(port), "--watch-pid", str(owner.pid))
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip().splitlines() == [f"http://127.0.0.1:{port}/apis/ccompat/v7"]
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 30
        while _script(tmp_path, "status").returncode == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _script(tmp_path, "status").returncode == 1
    finally:
        owner.kill()
        _script(tmp_path, "stop")
