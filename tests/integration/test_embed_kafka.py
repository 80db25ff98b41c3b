"""Embedding enrichment end to end on the real broker with the real all-MiniLM-L6-v2 (ONNX Runtime)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from sluice.engines.engine_contract import EngineContext
from sluice.engines.onnx.onnx_engine import OnnxEngine, OnnxOptions
from sluice.model_store import fetch
from tests.integration.pipelines import run_sluice
from tests.support.kafka import consume_all, create_topic, produce, unique_topic

pytestmark = pytest.mark.kafka

WORDS = ("battery screen price delivery quality great terrible okay love hate broke works fast slow "
         "colour size fits returned refund recommend avoid sturdy cheap premium noisy quiet").split()


def review(rng: random.Random, i: int) -> str:
    n = rng.choice([1, 3, 8, 15, 30, 60, 150, 320])  # one word up to a long review
    text = " ".join(rng.choice(WORDS) for _ in range(n))
    return text + (" très bien 👍" if i % 7 == 0 else "")


@pytest.fixture(scope="module")
def minilm() -> Path:
    return fetch("minilm-l6")


def test_2000_reviews_become_2000_unit_embeddings_aligned_with_their_text(kafka_bootstrap: str, tmp_path: Path,
                                                                          minilm: Path) -> None:
    rng = random.Random(7)
    n = 2000
    texts = [review(rng, i) for i in range(n)]
    t_in, t_out, t_dlq = unique_topic("reviews"), unique_topic("emb"), unique_topic("dlq")
    create_topic(kafka_bootstrap, t_in, 3)
    create_topic(kafka_bootstrap, t_out, 3)
    create_topic(kafka_bootstrap, t_dlq, 1)
    produce(kafka_bootstrap, t_in, [(f"r{i}", json.dumps({"id": i, "text": t})) for i, t in enumerate(texts)])
    pipeline = tmp_path / "embed.yaml"
    pipeline.write_text(yaml.safe_dump({
        "source": {"kafka": {"bootstrap_servers": kafka_bootstrap, "topics": [t_in], "group_id": unique_topic("g")}},
        "batching": {"max_batch_size": 32, "max_queue_delay_ms": 20, "bucket_by": "tokens",
                     "max_batch_tokens": 4096},
        "engine": {"type": "onnx", "model": "minilm-l6", "providers": ["cpu"], "intra_op_num_threads": 2},
        "sink": {"kafka": {"topic": t_out}, "output": {"field": "embedding"}},
        "dead_letter": {"topic": t_dlq},
    }))
    proc = run_sluice("run", str(pipeline), "--idle-exit", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]

    out = consume_all(kafka_bootstrap, t_out, expected_count=n, timeout_s=60)
    assert len(out) == n
    by_id = {}
    for rec in out:
        doc = json.loads(rec.value)
        vec = np.asarray(doc["embedding"], dtype=np.float64)
        assert vec.shape == (384,)
        assert abs(np.linalg.norm(vec) - 1.0) < 1e-4
        assert rec.key == f"r{doc['id']}".encode()
        assert doc["text"] == texts[doc["id"]]
        by_id[doc["id"]] = vec
    assert sorted(by_id) == list(range(n))
    assert consume_all(kafka_bootstrap, t_dlq) == []

    # Length buckets reorder records inside the operator: each output must still carry its own text's vector.
    engine = OnnxEngine(OnnxOptions(model=str(minilm), providers=["cpu"]), EngineContext(max_batch_size=1))
    engine.start()
    for i in rng.sample(range(n), 40):
        expected = np.asarray(engine.infer(engine.prepare([texts[i]]))[0], dtype=np.float64)
        assert float(expected @ by_id[i]) > 0.999, f"record {i} carries another text's embedding"
    engine.close()
