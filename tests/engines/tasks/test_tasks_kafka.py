"""Every task end to end through ``sluice run`` on the real broker, on the onnx and the torch engine.

Each test takes the task's example pipeline (examples/pipelines/), points it at a tiny random model saved
as a Hugging Face directory (MiniLM for embeddings) and at fresh topics, and runs it twice at once --
``type: onnx`` (exporting the directory, or finding the session's export) and ``type: torch`` -- over the
same input topic. Every output record must equal the reference (transformers' pipelines,
sentence-transformers) for its own input, nothing may be dead-lettered, and keys must be kept.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.support.kafka import consume_all, create_topic, produce, unique_topic
from tests.support.texts import varied_texts

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "pipelines"
TEXTS = [*varied_texts(36, seed=5), "Angela Merkel met Tim Cook in New York.", "word " * 600]


def _pipelines(example: str, kafka_bootstrap: str, tmp_path: Path, model: Path | str, topic_in: str,
               export_cache: Path, **engine: Any) -> dict[str, tuple[Path, str, str]]:
    """The example, once per engine type: backend -> (pipeline file, output topic, dead-letter topic)."""
    doc = yaml.safe_load((EXAMPLES / example).read_text(encoding="utf-8"))
    made = {}
    for backend in ("onnx", "torch"):
        out, dlq = unique_topic(f"{backend}-out"), unique_topic(f"{backend}-dlq")
        create_topic(kafka_bootstrap, out, 1)
        create_topic(kafka_bootstrap, dlq, 1)
        section = {key: value for key, value in doc["engine"].items() if key not in ("providers", "type")}
        section.update(type=backend, model=str(model), **engine)
        if backend == "onnx":
            section.update(providers=["cpu"], intra_op_num_threads=1, export_cache_dir=str(export_cache))
        else:
            section.update(device="cpu")
        pipeline = {**doc, "engine": section,
                    "source": {"kafka": {"bootstrap_servers": kafka_bootstrap, "topics": [topic_in],
                                         "group_id": unique_topic(f"g-{backend}")}},
                    "sink": {**doc["sink"], "kafka": {"topic": out}}, "dead_letter": {"topic": dlq},
                    "runtime": {"commit_interval_ms": 200}}
        path = tmp_path / f"{backend}.yaml"
        path.write_text(yaml.safe_dump(pipeline), encoding="utf-8")
        made[backend] = (path, out, dlq)
    return made


def _run_both(kafka_bootstrap: str, pipelines: dict[str, tuple[Path, str, str]], records: list[dict[str, Any]],
              topic_in: str, field: str) -> dict[str, dict[int, Any]]:
    """Produce ``records`` once, run both pipelines at once; backend -> {record id: result}."""
    produce(kafka_bootstrap, topic_in, [(f"k{r['id']}", json.dumps(r)) for r in records])
    env_args = ["--max-records", str(len(records)), "--idle-exit", "20"]
    procs = {backend: subprocess.Popen([sys.executable, "-m", "sluice.cli", "run", str(path), *env_args], cwd=ROOT,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for backend, (path, _, _) in pipelines.items()}
    results = {}
    for backend, proc in procs.items():
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{backend}: {stderr[-3000:]}"
        _, out, dlq = pipelines[backend]
        assert consume_all(kafka_bootstrap, dlq) == [], f"{backend} dead-lettered records"
        consumed = consume_all(kafka_bootstrap, out, expected_count=len(records), timeout_s=60)
        by_id = {}
        for message in consumed:
            doc = json.loads(message.value)
            assert message.key == f"k{doc['id']}".encode()  # each output carries its own input's key
            by_id[doc["id"]] = doc[field]
        assert sorted(by_id) == [r["id"] for r in records], f"{backend}: missing or extra records"
        results[backend] = by_id
    return results


def _topic(kafka_bootstrap: str) -> str:
    topic = unique_topic("in")
    create_topic(kafka_bootstrap, topic, 2)
    return topic


def test_classify_reviews_equals_the_pipeline_on_both_engines(kafka_bootstrap: str, tmp_path: Path,
                                                              tiny: dict[str, Path], export_cache: Path) -> None:
    from transformers import pipeline

    topic_in = _topic(kafka_bootstrap)
    made = _pipelines("classify-reviews.yaml", kafka_bootstrap, tmp_path, tiny["classifier"], topic_in,
                      export_cache, top_k=2)
    records = [{"id": i, "text": text} for i, text in enumerate(TEXTS)]
    results = _run_both(kafka_bootstrap, made, records, topic_in, "sentiment")
    reference = pipeline("text-classification", model=str(tiny["classifier"]), device="cpu")
    want = reference(TEXTS, top_k=2, truncation=True, max_length=512)
    for backend, by_id in results.items():
        for i, expected in enumerate(want):
            assert [r["label"] for r in by_id[i]] == [r["label"] for r in expected], f"{backend} record {i}"
            np.testing.assert_allclose([r["score"] for r in by_id[i]], [r["score"] for r in expected], atol=1e-4)


def test_ner_events_equals_the_pipeline_on_both_engines(kafka_bootstrap: str, tmp_path: Path,
                                                        tiny: dict[str, Path], export_cache: Path) -> None:
    from transformers import pipeline

    topic_in = _topic(kafka_bootstrap)
    made = _pipelines("ner-events.yaml", kafka_bootstrap, tmp_path, tiny["ner"], topic_in, export_cache)
    records = [{"id": i, "description": text} for i, text in enumerate(TEXTS)]
    results = _run_both(kafka_bootstrap, made, records, topic_in, "entities")
    want = pipeline("token-classification", model=str(tiny["ner"]), device="cpu",
                    aggregation_strategy="simple")(TEXTS)
    assert sum(map(len, want)) > 50
    for backend, by_id in results.items():
        for i, expected in enumerate(want):
            got = by_id[i]
            assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in got] == \
                   [(e["entity_group"], e["word"], e["start"], e["end"]) for e in expected], f"{backend} record {i}"
            np.testing.assert_allclose([e["score"] for e in got], [float(e["score"]) for e in expected], atol=1e-4)


def test_rerank_pairs_equals_cross_encoder_on_both_engines(kafka_bootstrap: str, tmp_path: Path,
                                                           tiny: dict[str, Path], export_cache: Path) -> None:
    from sentence_transformers import CrossEncoder

    topic_in = _topic(kafka_bootstrap)
    made = _pipelines("rerank-pairs.yaml", kafka_bootstrap, tmp_path, tiny["cross-encoder"], topic_in, export_cache,
                      max_length=128)
    pairs = list(zip(TEXTS, TEXTS[5:] + TEXTS[:5], strict=True))
    records = [{"id": i, "query": q, "passage": p} for i, (q, p) in enumerate(pairs)]
    results = _run_both(kafka_bootstrap, made, records, topic_in, "relevance")
    want = CrossEncoder(str(tiny["cross-encoder"]), device="cpu", max_length=128).predict(pairs)
    for backend, by_id in results.items():
        np.testing.assert_allclose([by_id[i] for i in range(len(pairs))], want, atol=1e-4, err_msg=backend)


def test_embed_reviews_with_minilm_equals_sentence_transformers_on_both_engines(
        kafka_bootstrap: str, tmp_path: Path, minilm_dir: Path, export_cache: Path) -> None:
    from sentence_transformers import SentenceTransformer

    topic_in = _topic(kafka_bootstrap)
    made = _pipelines("embed-reviews.yaml", kafka_bootstrap, tmp_path, "minilm-l6", topic_in, export_cache)
    records = [{"id": i, "text": text} for i, text in enumerate(TEXTS)]
    results = _run_both(kafka_bootstrap, made, records, topic_in, "embedding")
    want = SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS)
    for backend, by_id in results.items():
        got = np.asarray([by_id[i] for i in range(len(TEXTS))], dtype=np.float64)
        cosines = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        assert cosines.min() >= 0.9999, f"{backend}: record {int(cosines.argmin())} cosine {cosines.min():.6f}"
