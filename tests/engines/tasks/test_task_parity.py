"""Every task on the onnx and torch engines against its reference, record by record, on tiny random models.

References: transformers' ``pipeline("text-classification")`` / ``pipeline("token-classification")`` and
sentence-transformers' ``SentenceTransformer.encode`` / ``CrossEncoder.predict``, loaded from the very
same directories. Texts: varied lengths, accents, CJK, emoji, the empty string, whitespace, texts past the
truncation length; batches mix lengths, so padding is exercised. Models: BERT (MiniLM's tokenizer, with
segment ids), RoBERTa- and XLM-R-style (trained byte-level BPE / Unigram tokenizers, no segment ids),
DistilBERT (no segment input at all).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.task_runs import cosines, infer_one_by_one
from tests.support.texts import varied_texts

SCORE_TOLERANCE = 1e-4
MIN_COSINE = 0.9999
TEXTS = [*varied_texts(30, seed=11), "", " ", "Angela Merkel met Tim Cook in New York.",
         "word " * 700]  # the last one is far past every model's limit: truncated
# Each case runs on both backends where it matters most (BERT, the common case) and on one backend for the
# other families: the backend decides the logits, the task code after them is shared.
BOTH = ("onnx", "torch")


@pytest.fixture(scope="module")
def pipelines() -> Callable[..., Any]:
    from transformers import pipeline
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return lambda task, model, **kw: pipeline(task, model=str(model), device="cpu", **kw)


# ------------------------------------------------------------------------------------ text-classification


@pytest.mark.slow
@pytest.mark.parametrize(("model", "backends"), [("classifier", BOTH), ("xlmr-classifier", ("onnx",)),
                                                 ("multi-label", ("torch",))])
def test_text_classification_equals_the_pipeline(model: str, backends: tuple[str, ...], tiny: dict[str, Path],
                                                 make_engine: Callable[..., Any], pipelines: Any) -> None:
    reference = pipelines("text-classification", tiny[model])
    for backend in backends:
        best = make_engine(backend, model=str(tiny[model]), task="text-classification")
        ranked = make_engine(backend, model=str(tiny[model]), task="text-classification", top_k=2, warmup=False)
        limit = {"truncation": True, "max_length": best.task.max_tokens, "batch_size": 8}
        want_best = [r[0] for r in reference(TEXTS, top_k=1, **limit)]
        want_ranked = reference(TEXTS, top_k=2, **limit)
        got_best, got_ranked = infer_one_by_one(best, TEXTS), infer_one_by_one(ranked, TEXTS)
        for index in range(len(TEXTS)):
            where = f"{backend}/{model}, text {index}"
            assert got_best[index]["label"] == want_best[index]["label"], where
            assert abs(got_best[index]["score"] - want_best[index]["score"]) <= SCORE_TOLERANCE, where
            assert [r["label"] for r in got_ranked[index]] == [r["label"] for r in want_ranked[index]], where
            np.testing.assert_allclose([r["score"] for r in got_ranked[index]],
                                       [r["score"] for r in want_ranked[index]], atol=SCORE_TOLERANCE)
        assert len({r["label"] for r in got_best}) > 1, "a model that gives one label everywhere proves little"


@pytest.mark.parametrize("function", ["sigmoid", "none"])
def test_function_to_apply_and_pairs_equal_the_pipeline(function: str, tiny: dict[str, Path],
                                                        make_engine: Callable[..., Any], pipelines: Any) -> None:
    reference = pipelines("text-classification", tiny["classifier"])
    engine = make_engine("onnx", model=str(tiny["classifier"]), task="text-classification", top_k=3,
                         function_to_apply=function, inputs={"text": "premise", "text_pair": "hypothesis"})
    pairs = list(zip(TEXTS[:17], TEXTS[17:], strict=True))
    got = infer_one_by_one(engine, [{"premise": a, "hypothesis": b} for a, b in pairs])
    for (text, pair), result in zip(pairs, got, strict=True):
        want = reference({"text": text, "text_pair": pair}, top_k=3, function_to_apply=function, truncation=True,
                         max_length=engine.task.max_tokens)
        assert [r["label"] for r in result] == [r["label"] for r in want]
        np.testing.assert_allclose([r["score"] for r in result], [r["score"] for r in want], atol=SCORE_TOLERANCE)


# ----------------------------------------------------------------------------------- token-classification


@pytest.mark.slow
@pytest.mark.parametrize(("model", "backends", "strategies"), [
    ("ner", BOTH, ("none", "simple", "first", "average", "max")),  # WordPiece: words marked by ##
    ("roberta-ner", ("torch",), ("none", "first", "max")),  # byte-level BPE: words by the space heuristic
    ("xlmr-ner", ("onnx",), ("simple", "average")),  # Unigram, ▁ word marks
    ("distilbert-ner", ("onnx",), ("simple", "first")),  # no segment input
])
def test_token_classification_equals_the_pipeline(model: str, backends: tuple[str, ...], strategies: tuple[str, ...],
                                                  tiny: dict[str, Path], make_engine: Callable[..., Any],
                                                  pipelines: Any) -> None:
    for strategy in strategies:
        want_all = pipelines("token-classification", tiny[model], aggregation_strategy=strategy)(TEXTS, batch_size=8)
        key = "entity" if strategy == "none" else "entity_group"
        for backend in backends:
            engine = make_engine(backend, model=str(tiny[model]), task="token-classification",
                                 aggregation_strategy=strategy, warmup=False)
            got_all = infer_one_by_one(engine, TEXTS)
            for index, (text, got, want) in enumerate(zip(TEXTS, got_all, want_all, strict=True)):
                where = f"{backend}/{model}/{strategy}, text {index} ({text[:30]!r})"
                assert [(e[key], e["word"], e["start"], e["end"]) for e in got] == \
                       [(e[key], e["word"], e["start"], e["end"]) for e in want], where
                np.testing.assert_allclose([e["score"] for e in got], [float(e["score"]) for e in want],
                                           atol=SCORE_TOLERANCE, err_msg=where)
                if strategy == "none":
                    assert [e["index"] for e in got] == [e["index"] for e in want], where
            assert sum(map(len, got_all)) > 50, f"{model}/{strategy}: too few entities to prove anything"


# ---------------------------------------------------------------------------------------- cross-encoder


@pytest.mark.parametrize(("model", "backend"), [("cross-encoder", "onnx"), ("cross-encoder", "torch"),
                                               ("roberta-cross-encoder", "onnx")])
def test_cross_encoder_scores_equal_sentence_transformers(backend: str, model: str, tiny: dict[str, Path],
                                                          make_engine: Callable[..., Any]) -> None:
    from sentence_transformers import CrossEncoder

    pairs = [(query, passage) for query, passage in zip(TEXTS, TEXTS[7:] + TEXTS[:7], strict=True)]
    want = CrossEncoder(str(tiny[model]), device="cpu").predict(pairs, batch_size=16)
    engine = make_engine(backend, model=str(tiny[model]), task="cross-encoder",
                         inputs={"text": "query", "text_pair": "doc.body"})
    got = infer_one_by_one(engine, [{"query": q, "doc": {"body": p}} for q, p in pairs])
    assert all(isinstance(score, float) for score in got)
    np.testing.assert_allclose(got, want, atol=SCORE_TOLERANCE)
    assert float(np.std(got)) > 0.01  # scores that differ per pair
    # Both texts count towards the batcher's token budget.
    item = engine.prepare([{"query": "short query", "doc": {"body": "a passage of several more words"}}])[0]
    assert engine.item_length(item) == len(engine.task.inputs.tokenizer.encode_pairs(
        [("short query", "a passage of several more words")])[0].ids)


# --------------------------------------------------------------------------------------- text-embedding


@pytest.mark.parametrize(("backend", "model", "options", "encode"), [
    ("onnx", "embedder-cls", {}, {}),  # CLS pooling, Normalize
    ("torch", "embedder-cls", {"prompt_name": "query"}, {"prompt_name": "query"}),
    ("onnx", "embedder-cls", {"prompt": "passage: "}, {"prompt": "passage: "}),
    ("onnx", "embedder-last-token", {}, {}),  # default prompt, excluded from the pooling
    ("torch", "embedder-last-token", {}, {}),
    ("onnx", "embedder-dense", {}, {}),  # mean + max concatenated, a Dense (tanh) module, no Normalize
    ("torch", "distilbert-embedder", {}, {}),  # weighted mean
])
def test_embeddings_equal_sentence_transformers(backend: str, model: str, options: dict[str, Any],
                                                encode: dict[str, Any], tiny: dict[str, Path],
                                                make_engine: Callable[..., Any]) -> None:
    from sentence_transformers import SentenceTransformer

    want = SentenceTransformer(str(tiny[model]), device="cpu").encode(TEXTS, **encode)
    engine = make_engine(backend, model=str(tiny[model]), **options)
    got = np.asarray(infer_one_by_one(engine, TEXTS), dtype=np.float32)
    assert got.shape == want.shape
    similarity = cosines(got, want)
    assert similarity.min() >= MIN_COSINE, f"text {int(similarity.argmin())}: cosine {similarity.min():.6f}"
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1), rtol=1e-4)


def test_pooling_and_dimensions_overrides_equal_sentence_transformers(tiny: dict[str, Path],
                                                                      make_engine: Callable[..., Any]) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(tiny["embedder-cls"]), device="cpu")
    reference[1].pooling_mode = "max"
    want = reference.encode(TEXTS, truncate_dim=12, normalize_embeddings=True)
    engine = make_engine("onnx", model=str(tiny["embedder-cls"]), pooling="max", dimensions=12)
    got = np.asarray(infer_one_by_one(engine, TEXTS), dtype=np.float32)
    assert got.shape == (len(TEXTS), 12)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # normalised again after truncation
    assert cosines(got, want).min() >= MIN_COSINE
    plain = np.asarray(infer_one_by_one(make_engine("onnx", model=str(tiny["embedder-cls"]), warmup=False), TEXTS[:5]))
    assert cosines(plain[:, :12], got[:5]).max() < 0.9999  # the override changed something


def test_an_older_layout_with_the_transformer_in_a_subfolder_equals_sentence_transformers(
        tmp_path: Path, tiny: dict[str, Path], make_engine: Callable[..., Any]) -> None:
    """sentence-transformers 2.x saved the transformer in 0_Transformer/ (with do_lower_case there)."""
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    source, model = tiny["embedder-last-token"], tmp_path / "old-layout"
    (model / "0_Transformer").mkdir(parents=True)
    for path in source.iterdir():
        if path.is_dir():
            shutil.copytree(path, model / path.name)
        elif path.name in ("modules.json", "config_sentence_transformers.json"):
            shutil.copy(path, model / path.name)
        else:
            shutil.copy(path, model / "0_Transformer" / path.name)
    modules = json.loads((model / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (model / "modules.json").write_text(json.dumps(modules))
    (model / "0_Transformer" / "sentence_bert_config.json").write_text('{"max_seq_length": 24, "do_lower_case": true}')
    want = SentenceTransformer(str(model), device="cpu").encode(TEXTS)
    for backend in BOTH:
        engine = make_engine(backend, model=str(model))
        assert engine.task.max_tokens == 24
        assert cosines(np.asarray(infer_one_by_one(engine, TEXTS)), want).min() >= MIN_COSINE


def test_an_embedding_does_not_depend_on_its_batch_mates(tiny: dict[str, Path], make_engine: Callable[..., Any]) -> None:
    engine = make_engine("torch", model=str(tiny["embedder-last-token"]))
    alone = engine.infer(engine.prepare(["short review"]))[0]
    mixed = engine.infer(engine.prepare(["short review", "a much longer review " * 30, ""]))[0]
    np.testing.assert_allclose(alone, mixed, atol=1e-5)


# ------------------------------------------------------------------------------------------------- GPU


def _gpu_backends() -> list[Any]:
    import importlib.util

    import torch

    cuda = torch.cuda.is_available()
    has_trt = importlib.util.find_spec("tensorrt") is not None
    return [pytest.param("torch", {"device": "cuda"}, marks=pytest.mark.skipif(not cuda, reason="needs CUDA")),
            pytest.param("tensorrt", {}, marks=pytest.mark.skipif(not (cuda and has_trt),
                                                                  reason="needs TensorRT and CUDA"))]


@pytest.mark.gpu
@pytest.mark.parametrize(("kind", "device_options"), _gpu_backends())
@pytest.mark.parametrize(("model", "options"), [
    ("classifier", {"task": "text-classification", "top_k": 3}),
    ("ner", {"task": "token-classification", "aggregation_strategy": "simple"}),
    ("cross-encoder", {"task": "cross-encoder", "inputs": {"text": "q", "text_pair": "p"}}),
    ("embedder-last-token", {}),
])
def test_every_text_task_on_the_gpu_equals_the_cpu(kind: str, device_options: dict[str, Any], model: str,
                                                   options: dict[str, Any], tiny: dict[str, Path],
                                                   make_engine: Callable[..., Any], tmp_path: Path) -> None:
    from sluice.engines import engine_types
    from sluice.engines.engine_contract import EngineContext

    values: list[Any] = ([{"q": a, "p": b} for a, b in zip(TEXTS, TEXTS[3:] + TEXTS[:3], strict=True)]
                         if options.get("task") == "cross-encoder" else TEXTS)
    want = infer_one_by_one(make_engine("torch", model=str(tiny[model]), **options), values)
    engine_type = engine_types.lookup(kind)
    extra = {"engine_cache_dir": str(tmp_path), "export_cache_dir": str(tmp_path)} if kind == "tensorrt" else {}
    engine = engine_type.factory(engine_type.options(model=str(tiny[model]), **device_options, **extra, **options),
                                 EngineContext(max_batch_size=16))
    engine.start()
    got = infer_one_by_one(engine, values)
    if model.startswith("embedder"):
        assert cosines(np.asarray(got), np.asarray(want)).min() >= 0.999
    elif model == "cross-encoder":
        np.testing.assert_allclose(got, want, atol=1e-3)
    elif model == "ner":
        assert [[(e["entity_group"], e["start"], e["end"]) for e in g] for g in got] == \
               [[(e["entity_group"], e["start"], e["end"]) for e in w] for w in want]
    else:
        assert [[r["label"] for r in g] for g in got] == [[r["label"] for r in w] for w in want]
    engine.close()
