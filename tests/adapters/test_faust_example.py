"""examples/faust/app.py, a real Faust worker using Sluice's batcher and engine, against the real broker:
every record comes out enriched, a record the engine cannot take goes to the dead-letter topic, and on a
graceful stop the group's offsets are committed up to the end (acknowledged only after the sends).

Faust runs from its own environment (``./dev setup`` makes ``.venv/faust``: faust-streaming pins click<8.4,
which the main environment's huggingface-hub cannot use); SLUICE_FAUST_PYTHON overrides it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.pipelines import ROOT
from tests.support.kafka import (
    committed_offsets,
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_topic,
)

pytestmark = pytest.mark.kafka

APP = ROOT / "examples" / "faust" / "app.py"


def _faust_python() -> str:
    candidates = [os.environ.get("SLUICE_FAUST_PYTHON", ""), str(ROOT / ".venv" / "faust" / "bin" / "python"),
                  sys.executable]
    for python in candidates:
        if python and Path(python).exists() and subprocess.run(
                [python, "-c", "import faust, sluice.adapters.faust"], capture_output=True, check=False,
                cwd=ROOT).returncode == 0:
            return python
    pytest.fail("no Python with faust-streaming and sluice: run ./dev setup (it makes .venv/faust), "
                "or set SLUICE_FAUST_PYTHON")


def test_faust_example_enriches_every_record_and_commits_after_sending(kafka_bootstrap: str, tmp_path: Path) -> None:
    python = _faust_python()
    topic_in, topic_out, topic_dlq = unique_topic("faust-in"), unique_topic("faust-out"), unique_topic("faust-dlq")
    for topic, partitions in ((topic_in, 3), (topic_out, 3), (topic_dlq, 1)):
        create_topic(kafka_bootstrap, topic, partitions)
    n = 300
    produce(kafka_bootstrap, topic_in, [(f"k{i}", json.dumps({"seq": i, "text": f"review {i}"})) for i in range(n)]
            + [("broken", json.dumps({"seq": -1, "no_text": "here"}))])
    group = unique_topic("faust-app")
    env = dict(os.environ, SLUICE_KAFKA_BOOTSTRAP=kafka_bootstrap, FAUST_APP_ID=group, FAUST_TOPIC_IN=topic_in,
               FAUST_TOPIC_OUT=topic_out, FAUST_TOPIC_DLQ=topic_dlq, FAUST_DATA_DIR=str(tmp_path / "faust-data"))
    log_path = tmp_path / "faust.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([python, str(APP), "worker", "-l", "info"], cwd=tmp_path, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            out = consume_all(kafka_bootstrap, topic_out, expected_count=n, timeout_s=90)
        except TimeoutError as err:
            raise AssertionError(f"{err}\nfaust log:\n{log_path.read_text()[-4000:]}") from None
        docs = [json.loads(r.value) for r in out]
        assert sorted(d["seq"] for d in docs) == list(range(n))
        assert all(d["shouted"] == d["text"].upper() for d in docs)
        assert {r.key for r in out} == {f"k{i}".encode() for i in range(n)}  # keys kept
        (dead,) = consume_all(kafka_bootstrap, topic_dlq, expected_count=1, timeout_s=30)
        assert json.loads(dead.value)["record"] == {"seq": -1, "no_text": "here"}
        assert "KeyError" in json.loads(dead.value)["error"]

        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 15
    while committed_offsets(kafka_bootstrap, group, topic_in) != end_offsets(kafka_bootstrap, topic_in):
        assert time.monotonic() < deadline, (f"committed {committed_offsets(kafka_bootstrap, group, topic_in)} "
                                             f"!= end {end_offsets(kafka_bootstrap, topic_in)}\n"
                                             f"{log_path.read_text()[-3000:]}")
        time.sleep(0.5)
