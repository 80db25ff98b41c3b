"""Writes pipeline files for integration tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def run_sluice(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """``sluice ARGS`` as a user runs it (from the repository root), output captured."""
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s)


def write_pipeline(path: Path, bootstrap: str, topic_in: str, topic_out: str, group: str, *,
                   function: str = "tests.integration.funcs:tag", dlq: str | None = None,
                   batching: dict[str, object] | None = None, runtime: dict[str, object] | None = None) -> Path:
    doc: dict[str, object] = {
        "name": "it",
        "source": {"kafka": {"bootstrap_servers": bootstrap, "topics": [topic_in], "group_id": group,
                             "config": {"session.timeout.ms": 10000}}},
        "codec": {"format": "json", "input_field": "text"},
        "batching": batching or {"max_batch_size": 64, "max_queue_delay_ms": 5},
        "engine": {"type": "python", "function": function},
        "sink": {"kafka": {"topic": topic_out}, "output": {"mode": "merge", "field": "tagged"}},
        "runtime": runtime or {"commit_interval_ms": 200, "drain_timeout_s": 20},
    }
    if dlq:
        doc["dead_letter"] = {"topic": dlq}
    path.write_text(yaml.safe_dump(doc))
    return path
