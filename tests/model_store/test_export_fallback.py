"""A model the TorchScript exporter cannot trace is exported with torch.export and serves as torch does.

An EmbeddingGemma-shaped encoder (Gemma 3 with bidirectional attention and a sliding window) stops
torch.onnx's TorchScript exporter (``unordered_map::at``); Sluice then exports it with the torch.export-based
exporter, checks the graph against torch on another batch shape, and the onnx engine's vectors equal the
torch engine's. An export both exporters refuse is one line that says to use the torch engine.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sluice.engines import engine_types
from sluice.engines.backends.backend_contract import ModelClass
from sluice.engines.engine_contract import EngineContext
from sluice.model_store import ModelError
from sluice.model_store.export import export_to_onnx
from tests.support.texts import varied_texts
from tests.support.tiny_models import copy_tokenizer


@pytest.fixture(scope="module")
def gemma_embedder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random bidirectional Gemma 3 encoder, saved by sentence-transformers (mean pooling, normalised)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import AutoConfig, AutoModel

    from sluice.model_store import fetch

    root = tmp_path_factory.mktemp("gemma-embedder")
    hf_dir = root / "hf"
    copy_tokenizer(fetch("minilm-l6"), hf_dir)
    config = AutoConfig.for_model("gemma3_text", vocab_size=30522, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  sliding_window=8, max_position_embeddings=512, use_bidirectional_attention=True,
                                  pad_token_id=0, initializer_range=0.2)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(str(hf_dir))
    transformer = Transformer(str(hf_dir), max_seq_length=128)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean"),
                                         Normalize()], device="cpu")
    target = root / "embedder"
    model.save(str(target))
    shutil.rmtree(hf_dir)
    return target


def _engine(kind: str, model: Path, cache: Path) -> Any:
    engine_type = engine_types.lookup(kind)
    backend = ({"providers": ["cpu"], "export_cache_dir": str(cache)} if kind == "onnx" else {"device": "cpu"})
    engine = engine_type.factory(engine_type.options(model=str(model), task="text-embedding", **backend),
                                 EngineContext(16))
    engine.start()
    return engine


@pytest.mark.slow  # ./dev test fast leaves it out
def test_an_encoder_torchscript_cannot_export_serves_from_onnx_as_from_torch(
        gemma_embedder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="sluice.model_store"):
        onnx_engine = _engine("onnx", gemma_embedder, tmp_path)
    assert "exporting with torch.export instead" in caplog.text, \
        "TorchScript exported this model: the fallback is no longer exercised here; pick a model it cannot"
    torch_engine = _engine("torch", gemma_embedder, tmp_path)
    texts = varied_texts(24, seed=5)  # some longer than the sliding window, batched with short ones
    got = np.asarray(onnx_engine.infer(onnx_engine.prepare(texts)))
    expected = np.asarray(torch_engine.infer(torch_engine.prepare(texts)))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)


def test_a_model_no_exporter_takes_is_one_line_that_names_the_torch_engine(
        gemma_embedder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def refuses(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("an operator\nwith a long\nstory")

    monkeypatch.setattr(torch.onnx, "export", refuses)
    with pytest.raises(ModelError) as caught:
        export_to_onnx(gemma_embedder, tmp_path / "model.onnx", ModelClass.ENCODER)
    message = str(caught.value)
    assert "\n" not in message
    assert "cannot be exported to ONNX" in message and "engine type torch" in message
