"""Fuzz: hypothesis-generated pipeline files and record payloads.

Pipeline files (mutated valid pipelines, YAML-ish noise, deep nesting, bytes that are not UTF-8) must load
or fail with a ConfigError -- and ``sluice validate`` must exit 0 or 1 without a traceback. Record payloads
(random bytes, random and nested JSON, huge strings, invalid UTF-8, lone surrogates, tombstones, odd
headers) go through a real pipeline: every one ends in the output or the dead-letter topic, once.
Generation is derandomized, so a failure reproduces.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sluice.config import ConfigError, LoadedPipeline, load_pipeline
from tests.reliability.operators import ROOT, Operator
from tests.reliability.pipelines import make_topics, write_pipeline
from tests.support.kafka import consume_all, produce, unique_topic

pytestmark = pytest.mark.reliability

VALID: dict[str, Any] = yaml.safe_load("""
name: fuzz
source: {kafka: {bootstrap_servers: "127.0.0.1:9092", topics: [in], group_id: g, config: {session.timeout.ms: 6000}}}
codec: {format: json, input_field: text}
batching: {max_batch_size: 32, max_queue_delay_ms: 5}
engine: {type: python, function: "tests.reliability.funcs:paced_tag"}
sink: {kafka: {topic: out}, output: {mode: merge, field: tagged, key: input}}
dead_letter: {topic: dlq}
delivery: exactly_once
exactly_once: {transactional_id: t, transaction_interval_ms: 200}
runtime: {max_in_flight: 100, commit_interval_ms: 100, drain_timeout_s: 5}
""")

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=20),
    st.sampled_from(["${SLUICE_FUZZ_UNSET}", "${SLUICE_FUZZ_SET}", "${SLUICE_FUZZ_UNSET:dflt}", "${", "$}", "${1}",
                     "raw", "tokens", "field:", "field:a.b", "none", "exactly_once", "at_least_once", "python"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)


@st.composite
def mutated_pipelines(draw: st.DrawFn) -> str:
    """A valid pipeline with 1-4 keys deleted, replaced or added at random depths, as YAML text."""
    doc = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 4))):
        parent: Any = doc
        key = draw(st.sampled_from(sorted(parent)))
        while isinstance(parent[key], dict) and parent[key] and draw(st.booleans()):
            parent = parent[key]
            key = draw(st.sampled_from(sorted(map(str, parent))))
        action = draw(st.sampled_from(["delete", "replace", "add"]))
        if action == "delete":
            parent.pop(key, None)
        elif action == "replace":
            parent[key] = draw(values)
        else:
            parent[draw(st.text(min_size=1, max_size=10))] = draw(values)
    return yaml.safe_dump(doc, allow_unicode=draw(st.booleans()))


yaml_noise = st.lists(st.sampled_from([
    "a", "source", "engine", "sink", ":", ": ", "-", " ", "\n", "\t", "{", "}", "[", "]", ",", "#", "&x", "*x", "<<: *x",
    "!!python/object/apply:os.system [true]", "!!binary", "!custom", "|", ">", "'", '"', "%YAML 1.1\n", "---\n",
    "...\n", "? ", "${HOME}", "\x00", "\ufeff", "é", "0x1F", ".inf", "~", "null", "yes",
]), max_size=40).map("".join)
deep = st.integers(1, 3000).map(lambda n: "source: " + "[" * n + "]" * n + "\n")
pipeline_bytes = st.one_of(
    mutated_pipelines().map(str.encode), yaml_noise.map(str.encode), deep.map(str.encode), st.binary(max_size=64),
    mutated_pipelines().map(lambda t: t.encode() + b"\nname: \xff\xfe\n"))


def load_outcome(path: Path) -> LoadedPipeline | ConfigError:
    try:
        return load_pipeline(path, environ={"SLUICE_FUZZ_SET": "42"})
    except ConfigError as err:
        assert str(err).strip() and str(path) in str(err), f"an unhelpful error: {err!r}"
        return err


def test_generated_pipeline_files_load_or_fail_with_a_config_error(tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "pipeline.yaml"
    samples: list[bytes] = []  # a few of the files, for the command line below

    @settings(max_examples=300, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(pipeline_bytes)
    @example(yaml.safe_dump(VALID).encode())
    @example(b"name: \xff\xfe\n")  # not UTF-8
    @example(b"source: " + b"[" * 1000)  # nesting deeper than the YAML parser's recursion
    def check(content: bytes) -> None:
        path.write_bytes(content)
        load_outcome(path)  # anything but a pipeline or a ConfigError propagates and fails the test
        if len(samples) < 3 or content.startswith(b"name: \xff") or content.startswith(b"source: [[[[[[[[[["):
            samples.append(content)

    check()

    # the same through `sluice validate`, as a user runs it
    procs = []
    for index, content in enumerate(samples[:10]):
        file = path.with_name(f"cli{index}.yaml")
        file.write_bytes(content)
        procs.append((file, subprocess.Popen([sys.executable, "-m", "sluice.cli", "validate", str(file)], cwd=ROOT,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             env={"SLUICE_FUZZ_SET": "42", "PATH": ""})))
    for file, proc in procs:
        out, err = proc.communicate(timeout=120)
        expected = 0 if isinstance(load_outcome(file), LoadedPipeline) else 1
        assert "Traceback" not in err, f"sluice validate {file.name} ({file.read_bytes()[:80]!r}):\n{err[-2000:]}"
        assert proc.returncode == expected, (file.read_bytes()[:200], out, err)


# ----------------------------------------------------------------------------------------- payloads

json_leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(allow_nan=False),
                        st.text(max_size=30))
json_values = st.recursive(json_leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                st.dictionaries(st.text(max_size=8), inner,
                                                                                max_size=4)),
                           max_leaves=10)
texts = st.one_of(st.text(max_size=50), st.integers(1, 150_000).map(lambda n: "é" * (n // 2) + "x" * (n // 2)))
payloads = st.one_of(
    st.binary(max_size=100),
    st.none(),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda t, extra, ascii_only: json.dumps({"text": t, **extra}, ensure_ascii=ascii_only).encode(),
              st.one_of(texts, json_values), st.dictionaries(st.text(max_size=8), json_values, max_size=3),
              st.booleans()),
    st.sampled_from([b'{"text": "\\ud800"}', b'{"text": "\xff\xfe"}', b'{"text": "ok"', b'{"text": "a\x00b"}',
                     b'\xef\xbb\xbf{"text": "bom"}', b'{"text": "x", "text": "dup"}', b"{}" * 3]),
)
headers = st.lists(st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=20))), max_size=3)


def test_random_payloads_all_come_out(kafka_bootstrap: str, tmp_path: Path) -> None:
    drawn: list[tuple[bytes | None, list[tuple[str, bytes | None]]]] = []

    @settings(max_examples=400, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(payloads, headers)
    def gather(value: bytes | None, hdrs: list[tuple[str, bytes | None]]) -> None:
        drawn.append((value, hdrs))

    gather()
    # an input whose output (input + result, twice its size) is over the broker's 1 MB message limit
    drawn.append((json.dumps({"text": "x" * 600_000}).encode(), []))
    topics = make_topics(kafka_bootstrap, partitions=3)
    t_in, t_out, t_dlq = topics
    produce(kafka_bootstrap, t_in, [(f"p{i}", value, hdrs) for i, (value, hdrs) in enumerate(drawn)])
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, topics, unique_topic("g"))
    op = Operator(pipeline, tmp_path / "op.log", idle_exit_s=2)
    try:
        assert op.wait(180) == 0, op.log()[-3000:]
    finally:
        op.close()
    assert "Traceback" not in op.log(), op.log()[-3000:]

    out = consume_all(kafka_bootstrap, t_out, timeout_s=60)
    dead = consume_all(kafka_bootstrap, t_dlq, timeout_s=60)
    keys = [r.key for r in out] + [r.key for r in dead]
    assert sorted(keys) == sorted(f"p{i}".encode() for i in range(len(drawn)))  # each exactly once
    for rec in dead:
        assert rec.value == drawn[int((rec.key or b"p").decode()[1:])][0]  # the original bytes
    for rec in out:
        doc = json.loads(rec.value or b"")
        assert doc["tagged"] == f"<{doc['text'].upper()}>"
    print(f"\nfuzz: {len(drawn)} payloads -> {len(out)} outputs, {len(dead)} dead-lettered")
