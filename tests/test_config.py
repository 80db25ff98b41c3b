"""Pipeline validation: every broken file gets a short message naming the YAML path -- never a traceback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

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
    # client settings the guarantees rest on: refused, naming what governs them
    ("consumer auto commit", GOOD.replace("group_id: g", "group_id: g\n    config: {enable.auto.commit: true}"), {},
     ["source.kafka.config (line 6)", "'enable.auto.commit' cannot be set here", "`delivery`"]),
    ("consumer isolation", GOOD.replace("group_id: g", "group_id: g\n    config: {isolation.level: read_uncommitted}"),
     {}, ["source.kafka.config", "'isolation.level'", "committed records only"]),
    ("consumer group id", GOOD.replace("group_id: g", "group_id: g\n    config: {group.id: other}"), {},
     ["'group.id'", "source.kafka.group_id"]),
    ("producer acks", GOOD.replace("topic: out", "topic: out\n    config: {acks: 1}"), {},
     ["sink.kafka.config (line 15)", "'acks' cannot be set here", "acks=all"]),
    ("producer idempotence", GOOD.replace("topic: out", "topic: out\n    config: {enable.idempotence: false}"), {},
     ["sink.kafka.config", "'enable.idempotence'", "idempotent"]),
    ("producer transactional id", GOOD.replace("topic: out", "topic: out\n    config: {transactional.id: t}"), {},
     ["'transactional.id'", "delivery.exactly_once.transactional_id"]),
    ("stall timeout", GOOD + "runtime:\n  stall_timeout_s: 0\n", {}, ["runtime.stall_timeout_s", "greater than 0"]),
]


def test_other_client_settings_pass_through() -> None:
    text = GOOD.replace("group_id: g", "group_id: g\n    config: {fetch.max.bytes: 1048576, group.instance.id: me}")
    p = parse_pipeline(text.replace("topic: out", "topic: out\n    config: {compression.type: zstd}"),
                       environ={}).pipeline
    assert p.source.kafka.config == {"fetch.max.bytes": 1048576, "group.instance.id": "me"}
    assert p.sink.kafka.config == {"compression.type": "zstd"}


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


def test_validate_warns_when_the_model_would_not_resolve_where_run_looks(tmp_path: Path) -> None:
    """``sluice validate`` resolves ``engine.model`` as ``sluice run`` does, against the pipeline file's
    directory: a model that is not there is a warning naming what to do (the file may be meant for another
    machine, so it still exits 0); a relative path that exists next to the file is no warning, from any cwd."""
    pipelines = tmp_path / "pipelines"
    (pipelines / "models" / "mine").mkdir(parents=True)
    engine = "  function: examples.functions.text:shout\n"
    for model, warned in (("./models/missing", True), ("models/mine", False)):
        path = pipelines / "p.yaml"
        path.write_text(GOOD.replace(engine, f"  factory: examples.functions.text:shout\n  model: {model}\n"))
        proc = subprocess.run([sys.executable, "-m", "sluice.cli", "validate", str(path)], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path)
        assert proc.returncode == 0 and ": ok (" in proc.stdout, proc.stderr
        assert ("warning: engine.model: model path" in proc.stderr) is warned, proc.stderr
        if warned:
            assert str(pipelines / "models" / "missing") in proc.stderr and "would stop at start" in proc.stderr


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "sluice.cli", "validate", str(tmp_path / "nope.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "cannot read the file" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------ hostile files (issue 16)

def alias_bomb(levels: int = 9, fan_out: int = 9) -> str:
    """Each level a list of ``fan_out`` aliases of the level above: a few hundred bytes, 9**9 values."""
    lines = ["a0: &a0 [" + ", ".join(['"x"'] * fan_out) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan_out) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


HOSTILE = [
    ("alias loop", "a: &a [*a]\n", "an alias refers to the value it is part of"),
    ("mapping alias loop", GOOD + "x-loop: &m {self: *m}\n", "line 17: an alias refers to the value it is part of"),
    ("alias bomb", alias_bomb(), "aliases expand this file to more than 20,000 values"),
    ("merge-key bomb", "".join(f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9) if i else ''}], k{i}: 1}}\n"
                               .replace("<<: [], ", "") for i in range(9)), "aliases expand this file"),
    ("deep block nesting", "".join("  " * i + f"k{i}:\n" for i in range(150)) + "  " * 150 + "v\n",
     "nests more than 100 levels deep"),
    ("deep flow nesting", "source: " + "[" * 5000 + "]" * 5000 + "\n", "nests"),
    ("a date that is no date", GOOD.replace("group_id: g", "group_id: 2001-13-45"),
     "YAML cannot read one of the values (ValueError: month must be in 1..12); if it is meant as text, put it in"),
    ("a bool that is no bool", "name: !!bool maybe\n", "YAML cannot read one of the values (KeyError"),
    ("python tag", "name: !!python/object/apply:os.system [true]\n", "could not determine a constructor"),
    ("many values", "x:\n" + "- 1\n" * 30_000, "the file holds more than 20,000 values"),
]


@pytest.mark.parametrize(("name", "text", "fragment"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_yaml_is_refused_in_one_line_quickly(name: str, text: str, fragment: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        parse_pipeline(text, environ={})
    assert time.perf_counter() - started < 1.0
    assert fragment in str(info.value) and len(str(info.value).splitlines()) == 1, str(info.value)


def test_validate_answers_alias_loop_alias_bomb_and_50_mb_in_one_line_under_a_second(tmp_path: Path) -> None:
    files = {"loop.yaml": b"a: &a [*a]\n", "bomb.yaml": alias_bomb().encode(),
             "big.yaml": b"name: big\nx: |\n" + (b"  " + b"y" * 98 + b"\n") * 500_000}
    expected = {"loop.yaml": "an alias refers to the value it is part of",
                "bomb.yaml": "aliases expand this file to more than 20,000 values",
                "big.yaml": "the file is 50.5 MB; a pipeline file is at most 1 MiB"}
    for name, content in files.items():
        path = tmp_path / name
        path.write_bytes(content)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "sluice.cli", "validate", str(path)], capture_output=True,
                              text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
        elapsed = time.perf_counter() - started
        assert proc.returncode == 1 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and expected[name] in proc.stderr, proc.stderr[:2000]
        assert elapsed < 1.0, f"{name}: {elapsed:.2f} s (the interpreter start included)"
    # nothing is read past the limit: a device that never ends is refused too
    proc = subprocess.run([sys.executable, "-m", "sluice.cli", "validate", "/dev/zero"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "a pipeline file is at most 1 MiB" in proc.stderr


def test_merge_keys_and_x_anchors_share_settings() -> None:
    text = GOOD.replace("source:\n  kafka:\n    bootstrap_servers: 127.0.0.1:9092\n",
                        "x-kafka: &kafka\n  bootstrap_servers: 127.0.0.1:9092\nsource:\n  kafka:\n    <<: *kafka\n")
    text = text.replace("sink:\n  kafka:\n    topic: out\n", "sink:\n  kafka:\n    <<: *kafka\n    topic: out\n")
    p = parse_pipeline(text, environ={}).pipeline
    assert p.source.kafka.bootstrap_servers == p.sink.kafka.bootstrap_servers == "127.0.0.1:9092"
    with pytest.raises(ConfigError, match="unknown key 'y-kafka'"):  # only x- keys are free
        parse_pipeline(text.replace("x-kafka", "y-kafka").replace("*kafka", "*kafka"), environ={})


def test_huge_values_and_many_mistakes_keep_the_message_short() -> None:
    huge = GOOD.replace("max_batch_size: 8", "max_batch_size: " + "9" * 500_000 + "x")
    message = str(pytest.raises(ConfigError, parse_pipeline, huge, environ={}).value)
    assert len(message) < 400 and "as an integer" in message
    many = GOOD + "".join(f"unknown_{i}_{'k' * 1000}: 1\n" for i in range(100))
    message = str(pytest.raises(ConfigError, parse_pipeline, many, environ={}).value)
    lines = message.splitlines()
    assert len(lines) == 21 and lines[-1].endswith("... and 80 more problems")
    assert max(len(line) for line in lines) < 400


def test_the_demo_creates_every_topic_the_example_pipelines_use() -> None:
    from examples.demo import TOPICS

    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "examples" / "pipelines").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())  # the topics are written out; no engine needs importing
        kafka_in, kafka_out = doc["source"].get("kafka") or {}, doc["sink"].get("kafka") or {}
        used = {*kafka_in.get("topics", []), kafka_out.get("topic"), (doc.get("dead_letter") or {}).get("topic")}
        used.discard(None)  # a file source or sink (examples/pipelines/reindex-parquet.yaml) names no topic
        assert used <= set(TOPICS), f"{path.name} uses {used - set(TOPICS)}; examples/demo.py lacks them"


def sluice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])


def test_validate_takes_several_files_and_quoted_globs(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yaml").write_text(GOOD.replace("max_batch_size: 8", "max_batch_sise: 8"))
    proc = sluice("validate", str(tmp_path / "*.yaml"))
    assert proc.returncode == 1
    assert f"{tmp_path / 'a.yaml'}: ok" in proc.stdout
    assert "unknown key 'max_batch_sise' (did you mean 'max_batch_size'?)" in proc.stderr
    assert "1 of 2 pipeline files valid" in proc.stderr
    proc = sluice("validate", str(tmp_path / "a.yaml"), str(tmp_path / "a.yaml"))
    assert proc.returncode == 0 and "2 of 2 pipeline files valid" in proc.stdout
    assert sluice("validate", str(tmp_path / "none-*.yaml")).returncode == 1


def test_set_overrides_the_file_by_dotted_path_and_is_validated_with_it() -> None:
    overrides = [("batching.max_batch_size", 32), ("telemetry.metrics.enabled", True),
                 ("source.kafka.config.fetch.max.bytes", 1048576)]
    p = parse_pipeline(GOOD, environ={}, overrides=overrides).pipeline
    assert p.batching.max_batch_size == 32 and p.telemetry.metrics.enabled
    assert p.source.kafka is not None and p.source.kafka.config == {"fetch.max.bytes": 1048576}
    with pytest.raises(ConfigError, match=r"batching\.max_batch_size.*greater than or equal to 1"):
        parse_pipeline(GOOD, environ={}, overrides=[("batching.max_batch_size", 0)])
    with pytest.raises(ConfigError, match="batching.max_batch_size is not a section"):
        parse_pipeline(GOOD, environ={}, overrides=[("batching.max_batch_size.x", 1)])
    proc = sluice("validate", "examples/pipelines/shout.yaml", "--set", "batching.max_batch_size=-1")
    assert proc.returncode == 1 and "batching.max_batch_size" in proc.stderr


@pytest.mark.parametrize(("args", "fragment"), [
    (["run", "examples/pipelines/shout.yaml", "--max-records", "-5"], "--max-records: must be greater than 0"),
    (["run", "examples/pipelines/shout.yaml", "--idle-exit", "0"], "--idle-exit: must be greater than 0"),
    (["run", "examples/pipelines/shout.yaml", "--max-records", "many"], "expected a whole number"),
    (["validate", "examples/pipelines/shout.yaml", "--set", "nothing"], "expected path=value"),
])
def test_numeric_options_and_set_are_checked_before_anything_runs(args: list[str], fragment: str) -> None:
    proc = sluice(*args)
    assert proc.returncode == 2 and fragment in proc.stderr, proc.stderr
