"""``sluice run`` before the broker is reachable: it waits for it, without a traceback, and stops cleanly."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.pipelines import write_pipeline

ROOT = Path(__file__).resolve().parents[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


@pytest.mark.slow  # ./dev test fast leaves it out
def test_an_unreachable_broker_is_waited_for_and_sigterm_stops_cleanly(tmp_path: Path) -> None:
    pipeline = write_pipeline(tmp_path / "p.yaml", f"127.0.0.1:{closed_port()}", ("in", "out", "dlq"), "g")
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "run", str(pipeline)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(17)  # past the 15 s in which the output topic's size limit is asked for at start
        assert proc.poll() is None, proc.communicate()[1][-3000:]  # still waiting for the broker
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "cannot read max.message.bytes of topic out" in err
    assert "SIGTERM received" in err
