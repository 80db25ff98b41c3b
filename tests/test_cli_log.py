"""What ``sluice run`` writes on stderr, as a user runs it (a process, a JSON-lines file in and out, no broker):
``--log-format json`` before or after the command, and one summary line at the end whether the status line
is on or off."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NUM_RECORDS = 300


def _pipeline(tmp_path: Path) -> Path:
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": f"review {i}"}) + "\n"
                                               for i in range(NUM_RECORDS)))
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "source": {"file": {"path": "in.jsonl"}}, "codec": {"format": "json", "input_field": "text"},
        "engine": {"type": "python", "function": "tests.integration.funcs:tag"},
        "sink": {"file": {"path": "out.jsonl"}, "output": {"field": "tagged"}},
        "batching": {"max_batch_size": 64, "max_queue_delay_ms": 2}}))
    return path


def _run(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "sluice.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_log_format_json_writes_one_json_object_per_line(tmp_path: Path, where: str) -> None:
    pipeline = str(_pipeline(tmp_path))
    args = (["--log-format", "json", "run", pipeline] if where == "before"
            else ["run", "--log-format", "json", pipeline])
    lines = _run(*args).splitlines()
    assert lines
    docs = [json.loads(line) for line in lines]  # every line, or it raises
    for doc in docs:
        assert {"time", "level", "logger", "message"} <= doc.keys()
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", doc["time"])
    assert any(d["logger"] == "sluice" and d["message"].startswith("sluice ") for d in docs)


def _summaries(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "done: " in line or "stopped: " in line]


def test_a_run_ends_with_one_summary_line_whether_the_status_line_is_on_or_off(tmp_path: Path) -> None:
    """Issue: the status line's summary and ``sluice run``'s own said different counts; now there is one."""
    pipeline = str(_pipeline(tmp_path))
    (with_status,) = _summaries(_run("run", pipeline))
    for produced in tmp_path.glob("out.*"):
        produced.unlink()  # the file sink's checkpoint would make the second run start at the end
    (without,) = _summaries(_run("run", pipeline, "--set", "telemetry.status=off"))
    counts = re.compile(r"done: ([\d,]+) records in [\d.]+ m?s of work \([\d,]+ rec/s\): ([\d,]+) outputs, "
                        r"([\d,]+) dead-lettered \| ([\d,]+) in, [\d,]+ batches \(mean size [\d.]+\) \| [\d.]+ m?s wall")
    on, off = counts.search(with_status), counts.search(without)
    assert on is not None and off is not None, (with_status, without)
    assert on.groups() == off.groups() == (str(NUM_RECORDS), str(NUM_RECORDS), "0", str(NUM_RECORDS))
