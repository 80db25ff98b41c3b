"""Tiny random Hugging Face models for the task tests, built once per session (a few seconds).

BERT-style ones share MiniLM's real tokenizer (``minilm_dir``, from tests/engines/conftest.py), so texts
tokenise as a user's would; RoBERTa- and XLM-R-style ones get a tokenizer trained here (no segment ids,
byte-level BPE and Unigram pieces). ONNX exports go to one session folder: each model is exported once
and every later engine start (in-process or ``sluice run``) finds it there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.engines import engine_types
from sluice.engines.engine_contract import EngineContext
from tests.support.texts import varied_texts
from tests.support.tiny_models import NER_LABELS, save_cross_encoder, save_embedding_model, save_model

SENTIMENT = {0: "negative", 1: "neutral", 2: "positive"}


@pytest.fixture(scope="session")
def export_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-exports")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> dict[str, Path]:
    """name -> model directory."""
    root = tmp_path_factory.mktemp("tiny-models")
    corpus = varied_texts(300, seed=3)
    labels = dict(enumerate(NER_LABELS))
    return {
        "classifier": save_model(root / "classifier", "sequence", tokenizer=minilm_dir, id2label=SENTIMENT),
        "multi-label": save_model(root / "multi-label", "sequence", tokenizer=minilm_dir, seed=1,
                                  id2label={0: "shipping", 1: "quality", 2: "price", 3: "service"},
                                  problem_type="multi_label_classification"),
        "xlmr-classifier": save_model(root / "xlmr-classifier", "sequence", family="xlm-roberta", tokenizer="xlmr",
                                      corpus=corpus, id2label=SENTIMENT),
        "ner": save_model(root / "ner", "token", tokenizer=minilm_dir, id2label=labels),
        "roberta-ner": save_model(root / "roberta-ner", "token", family="roberta", tokenizer="roberta",
                                  corpus=corpus, id2label=labels),
        "distilbert-ner": save_model(root / "distilbert-ner", "token", family="distilbert", tokenizer=minilm_dir,
                                     id2label=labels),
        "xlmr-ner": save_model(root / "xlmr-ner", "token", family="xlm-roberta", tokenizer="xlmr", corpus=corpus,
                               id2label=labels),
        "cross-encoder": save_cross_encoder(root / "cross-encoder", minilm_dir),
        "roberta-cross-encoder": save_cross_encoder(root / "roberta-cross-encoder", "roberta", family="roberta",
                                                    corpus=corpus),
        "embedder-cls": save_embedding_model(root / "embedder-cls", minilm_dir, pooling="cls",
                                             prompts={"query": "query: ", "passage": "passage: "},
                                             max_seq_length=128),
        "embedder-last-token": save_embedding_model(root / "embedder-last-token", minilm_dir, pooling="lasttoken",
                                                    prompts={"query": "Represent this query: "},
                                                    default_prompt_name="query", include_prompt=False),
        "embedder-dense": save_embedding_model(root / "embedder-dense", minilm_dir, pooling=["mean", "max"],
                                               dense_features=24, normalize=False),
        "distilbert-embedder": save_embedding_model(root / "distilbert-embedder", minilm_dir, family="distilbert",
                                                    pooling="weightedmean"),
    }


@pytest.fixture(scope="session")
def make_engine(export_cache: Path) -> Callable[..., Any]:
    """``make_engine(kind, **options)``: a started onnx / torch engine (CPU) for the task in ``options``."""

    def make(kind: str, *, max_batch_size: int = 16, **options: Any) -> Any:
        engine_type = engine_types.lookup(kind)
        backend = ({"providers": ["cpu"], "intra_op_num_threads": 2, "export_cache_dir": str(export_cache)}
                   if kind == "onnx" else {"device": "cpu"})
        engine = engine_type.factory(engine_type.options(**backend, **options), EngineContext(max_batch_size))
        engine.start()
        return engine

    return make
