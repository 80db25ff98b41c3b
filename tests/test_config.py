"""Pipeline validation: every broken file gets a short message naming the YAML path -- never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sluice.config import ConfigError, parse_pipeline

GOOD = """\
source:
  kafka:
    bootstrap_servers: 127.0.0.1:9092
    topics: [reviews]
    group_id: g
batching:
  max_batch_size: 8
  max_queue_delay_ms: 5
engine:
  type: python
  function: examples.functions.text:shout
sink:
  kafka:
    topic: out
dead_letter:
  topic: dlq
"""


def test_good_pipeline_validates_with_defaults() -> None:
    loaded = parse_pipeline(GOOD, environ={})
    p = loaded.pipeline
    assert p.batching.max_batch_size == 8
    assert p.codec.input_field == "text"
    assert p.sink.output.key == "input"
    assert loaded.engine_options.function == "examples.functions.text:shout"


def test_env_interpolation_with_and_without_default() -> None:
    text = GOOD.replace("127.0.0.1:9092", "${BROKER}").replace("max_batch_size: 8", "max_batch_size: ${BATCH:16}")
    p = parse_pipeline(text, environ={"BROKER": "kafka:9093"}).pipeline
    assert p.source.kafka.bootstrap_servers == "kafka:9093"
    assert p.batching.max_batch_size == 16


# (name, pipeline text, environment, fragments the message must contain)
BROKEN = [
    ("unknown key", GOOD.replace("max_batch_size: 8", "max_batch_sise: 8"), {},
     ["batching.max_batch_sise (line 7)", "unknown key"]),
    ("wrong type", GOOD.replace("max_batch_size: 8", "max_batch_size: lots"), {},
     ["batching.max_batch_size (line 7)", "expected an integer"]),
    ("missing section", GOOD.replace("sink:\n  kafka:\n    topic: out\n", ""), {}, ["sink", "required"]),
    ("missing field", GOOD.replace("    group_id: g\n", ""), {}, ["source.kafka.group_id", "required"]),
    ("undefined env var", GOOD.replace("127.0.0.1:9092", "${NO_SUCH_BROKER_VAR}"), {},
     ["source.kafka.bootstrap_servers (line 3)", "NO_SUCH_BROKER_VAR is not set"]),
    ("negative delay", GOOD.replace("max_queue_delay_ms: 5", "max_queue_delay_ms: -5"), {},
     ["batching.max_queue_delay_ms (line 8)", "greater than or equal to 0"]),
    ("yaml syntax error", GOOD.replace("topics: [reviews]", "topics: [reviews"), {}, ["YAML syntax error", "line"]),
    ("empty file", "", {}, ["empty"]),
    ("top level is a list", "- a\n- b\n", {}, ["top level is a list"]),
    ("unknown engine type", GOOD.replace("type: python", "type: pytorch-magic"), {},
     ["engine.type (line 10)", "unknown engine type 'pytorch-magic'"]),
    ("bad engine option", GOOD.replace("function: examples.functions.text:shout", "function: nocolon"), {},
     ["engine.function (line 11)", "package.module:function"]),
    ("unknown engine option", GOOD.replace("  type: python\n", "  type: python\n  threads: 4\n"), {},
     ["engine.threads (line 11)", "unknown key"]),
    ("topics not a list", GOOD.replace("topics: [reviews]", "topics: {a: 1}"), {},
     ["source.kafka.topics (line 4)", "expected a list"]),
    ("empty topic list", GOOD.replace("topics: [reviews]", "topics: []"), {}, ["source.kafka.topics", "at least 1"]),
    ("bad output key", GOOD.replace("    topic: out\n", "    topic: out\n  output:\n    key: whatever\n"), {},
     ["sink.output.key (line 16)", "field:<dotted.path>"]),
    ("bad bucket_by", GOOD.replace("max_queue_delay_ms: 5", "max_queue_delay_ms: 5\n  bucket_by: chars"), {},
     ["batching.bucket_by (line 9)", "expected one of"]),
    ("delivery unknown", GOOD + "delivery: at_most_once\n", {}, ["delivery (line 17)", "expected one of"]),
]


@pytest.mark.parametrize(("name", "text", "env", "fragments"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_pipelines_name_the_path(name: str, text: str, env: dict[str, str], fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_pipeline(text, environ=env)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{name}: {fragment!r} not in {message!r}"
    assert len(message.splitlines()) <= 3


@pytest.mark.parametrize(("name", "text", "env", "fragments"), BROKEN[:12], ids=[b[0] for b in BROKEN[:12]])
def test_validate_command_prints_one_short_error_and_exits_1(tmp_path: Path, name: str, text: str,
                                                             env: dict[str, str], fragments: list[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "sluice.cli", "validate", str(path)],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert str(path) in proc.stderr and fragments[0] in proc.stderr
    assert proc.stdout == ""


def test_validate_command_accepts_the_examples() -> None:
    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "examples" / "pipelines").glob("*.yaml")):
        proc = subprocess.run([sys.executable, "-m", "sluice.cli", "validate", str(path)],
                              capture_output=True, text=True, timeout=60, cwd=root)
        assert proc.returncode == 0, proc.stderr
        assert ": ok (" in proc.stdout


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "sluice.cli", "validate", str(tmp_path / "nope.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "cannot read the file" in proc.stderr and "Traceback" not in proc.stderr
