"""sluice.testing.run_pipeline: a user's pipeline file run in memory gives what `sluice run` gives on Kafka."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.testing import PipelineRunError, run_pipeline

ROOT = Path(__file__).resolve().parents[2]
SHOUT = ROOT / "examples" / "pipelines" / "shout.yaml"


def test_the_example_pipeline_answers_each_record_or_dead_letters_it() -> None:
    values = [{"text": "great phone", "id": 1}, b"not json", {"id": 3}, {"text": "meh", "id": 4}, "{\"text\": \"ok\"}"]
    run = run_pipeline(SHOUT, values, keys=[b"a", b"b", b"c", b"d", b"e"])
    assert run.output_values() == [{"text": "great phone", "id": 1, "shouted": "GREAT PHONE"},
                                   {"text": "meh", "id": 4, "shouted": "MEH"}, {"text": "ok", "shouted": "OK"}]
    assert [r.key for r in run.outputs] == [b"a", b"d", b"e"]  # the input's key is kept
    assert [r.input_offset for r in run.dead_letters] == [1, 2]
    assert [r.topic for r in run.dead_letters] == ["reviews.dlq", "reviews.dlq"]
    reasons = run.dead_letter_reasons()
    assert "JSON" in reasons[0] and "text" in reasons[1]
    assert (run.summary.num_in, run.summary.num_out, run.summary.num_dead_lettered) == (5, 3, 2)


def test_a_file_job_is_refused_with_what_to_do(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(SHOUT.read_text().replace("  kafka:\n    bootstrap_servers: ${SLUICE_KAFKA_BOOTSTRAP:127.0.0.1:9092}\n"
                                             "    topics: [reviews]\n    group_id: sluice-shout\n",
                                             "  file: {path: in.jsonl}\n", 1)
                   .replace("  kafka:\n    topic: reviews.shouted\n", "  file: {path: out.jsonl}\n")
                   .replace("dead_letter:\n  topic: reviews.dlq\n", ""))
    with pytest.raises(PipelineRunError, match="sluice run"):
        run_pipeline(job, ["x"])


def test_a_pipeline_that_stops_on_its_own_raises_why(tmp_path: Path) -> None:
    strict = tmp_path / "strict.yaml"
    strict.write_text(SHOUT.read_text().replace("dead_letter:\n  topic: reviews.dlq\n",
                                                "dead_letter:\n  topic: reviews.dlq\n  max_consecutive_failures: 2\n"))
    with pytest.raises(PipelineRunError, match="stopped"):
        run_pipeline(strict, [b"x", b"y", b"z"])


def test_a_run_longer_than_the_drain_timeout_still_answers_every_record(tmp_path: Path) -> None:
    slow = tmp_path / "slow.yaml"
    slow.write_text(SHOUT.read_text().replace("examples.functions.text:shout", "tests.testing.slow_functions:upper_slowly")
                    .replace("max_batch_size: 64", "max_batch_size: 4") + "runtime: {drain_timeout_s: 1}\n")
    run = run_pipeline(slow, [{"text": f"t{i}"} for i in range(60)])  # 15 batches of 0.1 s: past the drain timeout
    assert [v["shouted"] for v in run.output_values()] == [f"T{i}" for i in range(60)]
    assert sorted(r.input_offset for r in run.outputs) == list(range(60))
