"""File jobs as a user runs them (``sluice run``, its exit code): a Parquet file of 10,000 rows to completion,
a ``kill -9`` in the middle and a restart, SIGTERM and a restart; files to a topic and a topic to a file."""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.integration.pipelines import ROOT, run_sluice
from tests.support.kafka import consume_all, create_topic, unique_topic

N = 10_000


def parquet_input(path: Path, n: int = N) -> None:
    pq.write_table(pa.table({"id": pa.array(range(n), pa.int32()), "text": [f"review {i}" for i in range(n)]}),
                   path, row_group_size=1000)


def file_pipeline(tmp_path: Path, function: str = "tag", sink: dict[str, Any] | None = None, **extra: Any) -> Path:
    doc = {"source": {"file": {"path": "in.parquet"}},
           "engine": {"type": "python", "function": f"tests.integration.funcs:{function}"},
           "sink": {"file": sink or {"path": "out.parquet"}, "output": {"field": "tagged"}},
           "batching": {"max_batch_size": 64, "max_queue_delay_ms": 2},
           "runtime": {"commit_interval_ms": 100}, **extra}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def output_ids(tmp_path: Path) -> collections.Counter[int]:
    return collections.Counter(pq.read_table(tmp_path / "out.parquet").column("id").to_pylist())


def checkpoint_row(tmp_path: Path) -> int:
    path = tmp_path / "out.parquet.checkpoint"
    return int(json.loads(path.read_text())["inputs"]["in.parquet"]["row"]) if path.exists() else 0


def start(pipeline: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "sluice.cli", "run", str(pipeline)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for_checkpoint(tmp_path: Path, proc: subprocess.Popen[str], at_least: int, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = checkpoint_row(tmp_path)
        if row >= at_least:
            return row
        assert proc.poll() is None, "the run ended before the test could interrupt it"
        time.sleep(0.05)
    raise TimeoutError(f"the checkpoint did not pass row {at_least} in {timeout_s} s")


def test_a_10k_row_parquet_file_runs_to_completion_and_exits_0_with_one_output_row_each(tmp_path: Path) -> None:
    parquet_input(tmp_path / "in.parquet")
    proc = run_sluice("run", str(file_pipeline(tmp_path)), timeout_s=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert output_ids(tmp_path) == collections.Counter(range(N))  # exactly one output row per input row
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("tagged").to_pylist()[:2] == ["<REVIEW 0>", "<REVIEW 1>"]
    assert (tmp_path / "out.dead-letters.jsonl").read_text() == ""
    assert "done: 10,000 records in" in proc.stderr


@pytest.mark.slow
def test_kill_9_in_the_middle_and_a_restart_give_every_row_an_output_duplicates_only_after_the_checkpoint(
        tmp_path: Path) -> None:
    parquet_input(tmp_path / "in.parquet")
    # a slow model, and part files closed every 0.2 s: the checkpoint moves while the test watches
    pipeline = file_pipeline(tmp_path, "slow_tag", sink={"path": "out.parquet", "roll_interval_s": 0.2})
    proc = start(pipeline)
    try:
        wait_for_checkpoint(tmp_path, proc, at_least=3000)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    saved = checkpoint_row(tmp_path)
    assert 3000 <= saved < N

    again = run_sluice("run", str(pipeline), timeout_s=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from the checkpoint" in again.stderr
    ids = output_ids(tmp_path)  # the directory reads: no torn part left behind
    assert set(ids) == set(range(N))  # every row has its output
    duplicated = sorted(i for i, count in ids.items() if count > 1)
    assert all(i >= saved for i in duplicated), duplicated[:10]  # only rows after the last checkpoint
    assert max(ids.values()) <= 2


@pytest.mark.slow
def test_sigterm_stops_cleanly_and_the_restart_gives_each_row_exactly_one_output(tmp_path: Path) -> None:
    parquet_input(tmp_path / "in.parquet")
    # few records in flight: a drain on SIGTERM finishes those, the rest of the file waits for the restart
    pipeline = file_pipeline(tmp_path, "slow_tag", sink={"path": "out.parquet", "roll_interval_s": 0.5},
                             runtime={"commit_interval_ms": 100, "max_in_flight": 500})
    proc = start(pipeline)
    try:
        wait_for_checkpoint(tmp_path, proc, at_least=1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
    finally:
        proc.kill()
    assert 0 < checkpoint_row(tmp_path) < N
    again = run_sluice("run", str(pipeline), timeout_s=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert output_ids(tmp_path) == collections.Counter(range(N))


@pytest.mark.kafka
@pytest.mark.slow
def test_json_lines_into_a_topic_and_a_topic_into_json_lines(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = unique_topic("from-files")
    create_topic(kafka_bootstrap, topic, 2)
    lines = [json.dumps({"seq": i, "text": f"line {i}"}) for i in range(1000)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    to_topic = {"source": {"file": {"path": "in.jsonl", "checkpoint": "in.checkpoint"}},
                "engine": {"type": "python", "function": "tests.integration.funcs:tag"},
                "sink": {"kafka": {"topic": topic, "bootstrap_servers": kafka_bootstrap}}}
    (tmp_path / "to-topic.yaml").write_text(yaml.safe_dump(to_topic))
    proc = run_sluice("run", str(tmp_path / "to-topic.yaml"), timeout_s=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(json.loads(r.value)["seq"] for r in consume_all(kafka_bootstrap, topic, 1000)) == list(range(1000))
    assert json.loads((tmp_path / "in.checkpoint").read_text())["complete"] is True

    back = unique_topic("g")
    from_topic = {"source": {"kafka": {"bootstrap_servers": kafka_bootstrap, "topics": [topic], "group_id": back}},
                  "engine": {"type": "python", "function": "tests.integration.funcs:tag"},
                  "sink": {"file": {"path": "back.jsonl"}, "output": {"field": "again"}}}
    (tmp_path / "from-topic.yaml").write_text(yaml.safe_dump(from_topic))
    proc = run_sluice("run", str(tmp_path / "from-topic.yaml"), "--until-end", timeout_s=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = [json.loads(x) for x in (tmp_path / "back.jsonl").read_text().splitlines()]
    assert sorted(o["seq"] for o in out) == list(range(1000))
    assert all(o["again"] == o["result"] == f"<LINE {o['seq']}>" for o in out)  # the topic's records, tagged again
