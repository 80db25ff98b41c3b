"""Sluice as people and the images install it: the wheel, by deploy/install.sh, into a clean environment.

The install script builds the wheel from this checkout and installs it with the pinned dependencies into a
new virtual environment; that environment's ``sluice`` then runs the example pipelines
(examples/pipelines/embed-reviews.yaml and label-reviews.yaml, topics renamed for the test) against the
broker, beside the development install running the same pipelines: the outputs must be the same.

Both LLM pipelines start at the same moment on an empty cache: one environment compiles the native kernels,
the other waits for that build (the two share it: same torch, same CPU) and says so, and both are running
within the build time plus 20 s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.integration.pipelines import ROOT
from tests.support.kafka import consume_all, create_topic, produce, unique_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

EXTRAS = "onnx,torch,llm,export,telemetry,schema-registry,files,images"  # the CPU image's
NUM_REVIEWS = 48


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new virtual environment with Sluice installed by deploy/install.sh from a wheel of this checkout."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    proc = subprocess.run([str(ROOT / "deploy" / "install.sh"), "--venv", str(venv), "--extras", EXTRAS,
                           "--python", sys.executable], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sluice; print(sluice.__file__)"],
                          capture_output=True, text=True, check=True, cwd="/").stdout
    assert str(venv) in site, f"the environment imports Sluice from {site}, not from its own install"
    yield venv
    shutil.rmtree(venv.parent, ignore_errors=True)  # some 6 GB (torch): not left for pytest's retention


def _reviews() -> list[tuple[bytes, bytes]]:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from demo import REVIEWS  # the demo's sample reviews
    finally:
        sys.path.pop(0)
    records = [(f"sku-{i % 7}".encode(), json.dumps({"review_id": i, "product": f"sku-{i % 7}",
                                                     "text": REVIEWS[i % len(REVIEWS)]}).encode())
               for i in range(NUM_REVIEWS)]
    return [*records, (b"broken", b"{this is not json")]


def _example(name: str, directory: Path, bootstrap: str, topic_in: str, tag: str) -> tuple[Path, str, str]:
    """examples/pipelines/NAME with its topics and group renamed for this test; (file, output, dead letters)."""
    doc = yaml.safe_load((ROOT / "examples" / "pipelines" / name).read_text())
    out, dlq = unique_topic(f"{tag}-out"), unique_topic(f"{tag}-dlq")
    doc["source"]["kafka"].update(bootstrap_servers=bootstrap, topics=[topic_in], group_id=unique_topic(tag))
    doc["sink"]["kafka"]["topic"] = out
    doc["dead_letter"]["topic"] = dlq
    for topic in (out, dlq):
        create_topic(bootstrap, topic, 1)
    path = directory / f"{tag}-{name}"
    path.write_text(yaml.safe_dump(doc))
    return path, out, dlq


def _run(command: list[str], pipeline: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SLUICE_CACHE_DIR=str(cache))
    return subprocess.run([*command, "run", str(pipeline), "--until-end"], capture_output=True, text=True,
                          env=env, timeout=900, cwd=pipeline.parent)


def _outputs(bootstrap: str, topic: str, field: str) -> dict[int, object]:
    records = consume_all(bootstrap, topic, expected_count=NUM_REVIEWS, timeout_s=60)
    values = [json.loads(r.value) for r in records]
    return {v["review_id"]: v[field] for v in values}


def test_the_installed_wheel_runs_the_examples_as_the_development_install(
        wheel_env: Path, kafka_bootstrap: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"  # empty: models fetched and kernels compiled by this test
    fetch = subprocess.run([str(wheel_env / "bin" / "sluice"), "models", "fetch", "minilm-l6"], capture_output=True,
                           text=True, env=dict(os.environ, SLUICE_CACHE_DIR=str(cache)), timeout=600)
    assert fetch.returncode == 0, fetch.stderr[-3000:]
    subprocess.run([str(wheel_env / "bin" / "sluice"), "models", "fetch", "smollm2-135m"], check=True,
                   capture_output=True, env=dict(os.environ, SLUICE_CACHE_DIR=str(cache)), timeout=600)
    topic_in = unique_topic("reviews")
    create_topic(kafka_bootstrap, topic_in, 3)
    produce(kafka_bootstrap, topic_in, _reviews())
    installs = {"development": [sys.executable, "-m", "sluice.cli"], "wheel": [str(wheel_env / "bin" / "sluice")]}

    for example, field in (("label-reviews.yaml", "label"), ("embed-reviews.yaml", "embedding")):
        pipelines = {tag: _example(example, tmp_path, kafka_bootstrap, topic_in, tag) for tag in installs}
        with ThreadPoolExecutor(2) as pool:  # at the same moment, on one cache
            futures = {tag: pool.submit(_run, command, pipelines[tag][0], cache) for tag, command in installs.items()}
            runs = {tag: future.result() for tag, future in futures.items()}
        for tag, proc in runs.items():
            assert proc.returncode == 0, f"{tag} install, {example}:\n{proc.stderr[-4000:]}"
            assert "Traceback" not in proc.stderr
        results = {tag: _outputs(kafka_bootstrap, out, field) for tag, (_, out, _) in pipelines.items()}
        assert sorted(results["wheel"]) == list(range(NUM_REVIEWS))
        if field == "embedding":
            for review_id, vector in results["development"].items():
                np.testing.assert_allclose(results["wheel"][review_id], vector, rtol=0, atol=1e-5)
        else:
            assert results["wheel"] == results["development"]
            assert set(results["wheel"].values()) <= {"positive", "negative", "neutral"}
            _both_started_within_the_build_time(runs)
        for tag, (_, _, dlq) in pipelines.items():
            (dead,) = consume_all(kafka_bootstrap, dlq, expected_count=1, timeout_s=30)
            assert dead.value == b"{this is not json", tag


def _both_started_within_the_build_time(runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    """One of the two compiled the kernels, the other waited on it and said so; both ran within build + 20 s."""
    logs = {tag: proc.stderr for tag, proc in runs.items()}
    builders = [tag for tag, log in logs.items() if "native CPU kernels: compiled in" in log]
    waiters = [tag for tag, log in logs.items() if re.search(r"native CPU kernels: waiting for process \d+ \(", log)]
    kernel_lines = {tag: [line for line in log.splitlines() if "native CPU kernels" in line] for tag, log in logs.items()}
    assert len(builders) == 1 and len(waiters) == 1 and builders != waiters, kernel_lines
    assert "loaded the build another process finished" in logs[waiters[0]]
    build_s = float(re.search(r"native CPU kernels: compiled in (\d+) s", logs[builders[0]]).group(1))  # type: ignore[union-attr]
    for tag, log in logs.items():
        started_s = float(re.search(r", started in ([\d.]+) s", log).group(1))  # type: ignore[union-attr]
        assert started_s <= build_s + 20, f"{tag}: started in {started_s} s, the build took {build_s} s"
