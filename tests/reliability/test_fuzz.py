"""Fuzz: hypothesis-generated pipeline files and record payloads.

Pipeline files (mutated valid pipelines, YAML-ish noise, deep nesting, bytes that are not UTF-8, and the
hostile YAML of issue 16: alias loops, alias and merge-key bombs, tags, scalars YAML resolves and cannot
build, huge scalars) must load or fail with a short ConfigError within a second -- and ``sluice validate``
must exit 0 or 1 without a traceback. Record payloads (random bytes, random and nested JSON, huge strings
and numbers, invalid UTF-8, lone surrogates, tombstones, odd headers, records nested far past
``codec.max_depth`` in every shape, wrong types at the input field) go through a real pipeline: every one
ends in the output or the dead-letter topic, once. Generation is derandomized, so a failure reproduces.
(tests/operator/test_containment.py fuzzes the same classes through the runner without a broker.)
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sluice.config import ConfigError, LoadedPipeline, load_pipeline
from tests.reliability.operators import ROOT, run_until_idle
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

VALID_TEXT = yaml.safe_dump(VALID)
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


@st.composite
def alias_trouble(draw: st.DrawFn) -> str:
    """Alias loops (direct, through mappings, merge keys, several hops) and bombs (lists or merge keys,
    flow or block, any fan-out), appended to a valid pipeline under an x- key or at the top."""
    kind = draw(st.sampled_from(["loop", "bomb", "merge-bomb", "chain"]))
    if kind == "loop":
        body = draw(st.sampled_from(["x-a: &a [*a]", "x-a: &a {b: *a}", "x-a: &a [1, [2, {c: *a}]]", "x-a: &a {<<: *a}",
                                     "x-a: &a\n  b: &b\n    c: *a", "x-a: &a [&b [*b]]", "name: &n [*n]"]))
    elif kind == "chain":  # a long chain of aliases, each used once: deep but not a bomb
        n = draw(st.integers(2, 150))
        body = "\n".join(["x-a0: &a0 [1]"] + [f"x-a{i}: &a{i} [*a{i - 1}]" for i in range(1, n)])
    else:
        levels, fan = draw(st.integers(2, 12)), draw(st.integers(2, 12))
        flow = draw(st.booleans())
        lines = ["x-l0: &l0 {k: v}" if kind == "merge-bomb" else "x-l0: &l0 [x, y]"]
        for i in range(1, levels + 1):
            refs = [f"*l{i - 1}"] * fan
            if kind == "merge-bomb":
                lines.append(f"x-l{i}: &l{i} {{<<: [{', '.join(refs)}], k{i}: 1}}")
            elif flow:
                lines.append(f"x-l{i}: &l{i} [{', '.join(refs)}]")
            else:
                lines.append(f"x-l{i}: &l{i}\n" + "".join(f"  - {r}\n" for r in refs).rstrip("\n"))
        body = "\n".join(lines)
    return VALID_TEXT + body + "\n"


yaml_scalars = st.one_of(
    st.sampled_from(["2001-13-45", "2001-02-30", "2001-12-14t21:59:43.10-25:00", "1_000_", "0x", "0o9", "0b2", ".NaN",
                     "1e400", "-.inf", "=", "<<", "~", "!", "&", "*", "%", "@", "`", "0:0:0:0", "190:20:30"]),
    st.text(max_size=20),
)
tags = st.sampled_from(["!!timestamp", "!!int", "!!float", "!!bool", "!!binary", "!!null", "!!str", "!!set", "!!omap",
                        "!!pairs", "!!seq", "!!map", "!custom", "!!python/name:os.system", "!<tag:yaml.org,2002:int>"])


@st.composite
def tagged_and_odd(draw: st.DrawFn) -> str:
    """A valid pipeline with one value replaced by a tagged or odd plain scalar, written as YAML text."""
    text = VALID_TEXT
    line = draw(st.sampled_from([i for i, ln in enumerate(text.splitlines()) if ": " in ln]))
    lines = text.splitlines()
    key = lines[line].split(": ", 1)[0]
    value = draw(yaml_scalars)
    tag = draw(st.one_of(st.just(""), tags))
    lines[line] = f"{key}: {tag} {json.dumps(value) if draw(st.booleans()) else value}"
    return "\n".join(lines) + "\n"


huge = st.one_of(
    st.integers(10_000, 2_000_000).map(lambda n: VALID_TEXT + "x-big: " + "y" * n + "\n"),  # past 1 MiB too
    st.integers(100, 40_000).map(lambda n: VALID_TEXT + "x-many:\n" + "- 1\n" * n),
    st.integers(50, 2_000).map(lambda n: VALID_TEXT + "x-deep:\n" + "".join("  " * (i + 1) + f"k{i}:\n"
                                                                                        for i in range(n)) + "  1\n"),
)
pipeline_bytes = st.one_of(
    mutated_pipelines().map(str.encode), yaml_noise.map(str.encode), deep.map(str.encode), st.binary(max_size=64),
    mutated_pipelines().map(lambda t: t.encode() + b"\nname: \xff\xfe\n"),
    alias_trouble().map(str.encode), tagged_and_odd().map(str.encode), huge.map(str.encode))


# the hostile classes each get a refusal of their own; the fuzzer must reach every one (each also has an
# explicit example below, so the check does not hang on what one generation run happens to draw)
REFUSALS = ("an alias refers to the value it is part of", "aliases expand this file", "YAML cannot read one of the values",
            "nests more than", "a pipeline file is at most 1 MiB", "the file holds more than", "is not UTF-8")


def load_outcome(path: Path) -> LoadedPipeline | ConfigError:
    """Load ``path``: a pipeline, or a ConfigError that is short and names the file -- within a second.

    A slow answer is timed once more before it fails: a file that makes the loader slow (an alias bomb, say) is
    slow every time, while a pause of the test process itself is not (CI saw one load of a plain 11-line file
    take 2.2 s, late in a suite whose process holds gigabytes of earlier tests' objects)."""
    outcome, elapsed = _timed_load(path)
    if elapsed >= 1.0:
        outcome, elapsed = _timed_load(path)
    assert elapsed < 1.0, f"{elapsed:.2f} s, twice, for {path.read_bytes()[:200]!r}"
    if isinstance(outcome, ConfigError):
        err = outcome
        assert str(err).strip() and str(path) in str(err), f"an unhelpful error: {err!r}"
        lines = str(err).splitlines()
        assert len(lines) <= 21 and max(len(line) for line in lines) < len(str(path)) + 600, f"too long: {err!s:.3000}"
    return outcome


def _timed_load(path: Path) -> tuple[LoadedPipeline | ConfigError, float]:
    started = time.perf_counter()
    try:
        return load_pipeline(path, environ={"SLUICE_FUZZ_SET": "42"}), time.perf_counter() - started
    except ConfigError as err:
        return err, time.perf_counter() - started


@pytest.mark.slow
def test_generated_pipeline_files_load_or_fail_with_a_config_error(tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "pipeline.yaml"
    samples: list[bytes] = []  # a few of the files, for the command line below
    refusals: set[str] = set()

    @settings(max_examples=500, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(pipeline_bytes)
    @example(yaml.safe_dump(VALID).encode())
    @example(b"a: &a [*a]\n")  # issue 16: a 1,000-line RecursionError traceback
    @example("".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9) if i else 'x'}]\n" for i in range(10)).encode())
    @example(b"name: \xff\xfe\n")  # not UTF-8
    @example(b"source: " + b"[" * 1000)  # nesting deeper than the YAML parser's recursion
    @example(b"name: 2001-13-45\n")  # a scalar YAML resolves (a date) but cannot build: a ValueError traceback
    @example(b"x-big: " + b"y" * (1 << 20) + b"\n")  # over the file size bound
    @example(b"x-many:\n" + b"- 1\n" * 30_000)  # more values than the bound
    def check(content: bytes) -> None:
        path.write_bytes(content)
        outcome = load_outcome(path)  # anything but a pipeline or a ConfigError propagates and fails the test
        refusals.update(kind for kind in REFUSALS if kind in str(outcome))
        if len(samples) < 3 or content.startswith((b"name: \xff", b"source: [[[[[[[[[[", b"a: &a")) or (
                b"x-l9:" in content and len(samples) < 10):
            samples.append(content)

    check()
    assert refusals == set(REFUSALS), f"the generators never reached {set(REFUSALS) - refusals}"

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
# issue 16: nesting far past codec.max_depth in every shape (a decoder recursing on it raised RecursionError),
# huge numbers, escapes and byte sequences at the edges of Unicode, brackets that only look like nesting
shapes = st.sampled_from([("[", "]"), ('{"a":', "}"), ('[{"a":', "}]"), ('{"a":[', "]}"), ("[ ", " ]"), ("[[1],", "]")])
hostile_payloads = st.one_of(
    st.tuples(st.integers(129, 100_000), shapes, st.booleans()).map(
        lambda t: ('{"text": "deep", "x": ' + t[1][0] * t[0] + "0" + (t[1][1] * t[0] if t[2] else "") + "}").encode()),
    st.integers(20, 5_000).map(lambda n: b'{"text": ' + b"9" * n + b"}"),
    st.sampled_from([b'{"text": 1e999999}', b'{"text": -1e-999999}', b'{"text": -0.0}', b'{"text": "\\u0000"}',
                     b'{"text": "\\ud83d\\ude00"}', b'{"text": "\\udfff"}', b'{"text": "\xc0\xaf"}',
                     b'{"text": "\xf4\x90\x80\x80"}', b'{"text": "\xed\xa0\x80"}', '{"text": "a\u2028b\x85"}'.encode()]),
    st.integers(1, 60_000).map(lambda n: json.dumps({"text": "[{" * n + '\\"'}).encode()),
    st.builds(lambda path, v: json.dumps({"text": v, path: v}).encode(), st.sampled_from(["text.x", "", "TEXT"]),
              json_values),
)


@pytest.mark.slow
def test_random_payloads_all_come_out(kafka_bootstrap: str, tmp_path: Path) -> None:
    drawn: list[tuple[bytes | None, list[tuple[str, bytes | None]]]] = []

    @settings(max_examples=400, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(payloads, headers)
    def gather(value: bytes | None, hdrs: list[tuple[str, bytes | None]]) -> None:
        drawn.append((value, hdrs))

    gather()

    @settings(max_examples=150, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(hostile_payloads)
    def gather_hostile(value: bytes) -> None:
        drawn.append((value, []))

    gather_hostile()
    # an input whose output (input + result, twice its size) is over the broker's 1 MB message limit
    drawn.append((json.dumps({"text": "x" * 600_000}).encode(), []))
    topics = make_topics(kafka_bootstrap, partitions=3)
    t_in, t_out, t_dlq = topics
    produce(kafka_bootstrap, t_in, [(f"p{i}", value, hdrs) for i, (value, hdrs) in enumerate(drawn)])
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, topics, unique_topic("g"))
    run_until_idle(pipeline, tmp_path / "op.log")

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


# ----------------------------------------------------------------------- coverage-guided findings

def test_atheris_findings_stay_fixed() -> None:
    """Inputs the coverage-guided fuzzer (atheris_fuzz.py) found, and the seeds it starts from, replayed
    through the same checks (which need no atheris)."""
    from tests.reliability.atheris_fuzz import REGRESSIONS, SEEDS, check_codec, check_config

    checks = {"codec": check_codec, "config": check_config}
    for target, check in checks.items():
        found = sorted((REGRESSIONS / target).glob("*")) if (REGRESSIONS / target).is_dir() else []
        for data in SEEDS[target] + [path.read_bytes() for path in found]:
            check(data)
