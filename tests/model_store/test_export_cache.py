"""ONNX exports of Hugging Face directories: graphs checked against torch, cached by content, atomic;
``sluice models export`` ahead of time; a clear message where torch is missing."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sluice.engines.backends.backend_contract import ModelClass
from sluice.model_store import ModelError
from sluice.model_store import store_cli as models_cli
from sluice.model_store.export_cache import content_key, exported_onnx
from tests.support.tiny_models import save_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny RoBERTa-style classifier (no segment ids) with a tokenizer trained here."""
    return save_model(tmp_path_factory.mktemp("export") / "reviews-classifier", "sequence", family="roberta",
                      tokenizer="roberta", corpus=["great product", "terrible delivery", "it works"],
                      id2label={0: "bad", 1: "good"})


def test_an_export_runs_any_batch_shape_like_torch_and_is_made_once(classifier: Path, tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForSequenceClassification

    with caplog.at_level(logging.INFO, logger="sluice.model_store"):
        first = exported_onnx(classifier, ModelClass.SEQUENCE_CLASSIFICATION, cache_dir=tmp_path)
        again = exported_onnx(classifier, ModelClass.SEQUENCE_CLASSIFICATION, cache_dir=tmp_path)
    assert first == again and first.parent.parent == tmp_path and first.parent.name.startswith("reviews-classifier-")
    assert sum("exporting" in r.message for r in caplog.records) == 1
    assert sum("cached at" in r.message for r in caplog.records) == 2  # announced, then found
    session = ort.InferenceSession(str(first), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]  # RoBERTa: no segments
    ids = np.random.default_rng(0).integers(5, 300, size=(5, 23))  # neither shape was traced
    mask = np.ones_like(ids)
    mask[3, 10:] = 0
    (logits,) = session.run(["logits"], {"input_ids": ids, "attention_mask": mask})
    model = AutoModelForSequenceClassification.from_pretrained(str(classifier)).eval()
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    assert logits.shape == (5, 2)
    np.testing.assert_allclose(logits, want, atol=1e-4)


def test_the_key_follows_the_content_not_the_place(classifier: Path, tmp_path: Path) -> None:
    key = content_key(classifier, ModelClass.SEQUENCE_CLASSIFICATION)
    moved = shutil.copytree(classifier, tmp_path / "elsewhere")
    assert content_key(moved, ModelClass.SEQUENCE_CLASSIFICATION) == key
    assert content_key(moved, ModelClass.ENCODER) != key  # another head, another export
    weights = moved / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert content_key(moved, ModelClass.SEQUENCE_CLASSIFICATION) != key
    (moved / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="holds no model weights"):
        content_key(moved, ModelClass.SEQUENCE_CLASSIFICATION)


def test_a_failed_export_leaves_nothing_behind(classifier: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="has no weights for classifier"):
        exported_onnx(classifier, ModelClass.TOKEN_CLASSIFICATION, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_without_torch_the_error_says_how_to_export_elsewhere(classifier: Path, tmp_path: Path) -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from pathlib import Path\n"
            "from sluice.engines.backends.backend_contract import ModelClass\n"
            "from sluice.model_store.export_cache import exported_onnx\n"
            f"exported_onnx(Path({str(classifier)!r}), ModelClass.SEQUENCE_CLASSIFICATION, Path({str(tmp_path)!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "needs torch and transformers" in proc.stderr and "sluice models export" in proc.stderr


def test_models_export_writes_model_onnx_beside_the_model(classifier: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    model = shutil.copytree(classifier, tmp_path / "model")
    parser = models_cli.add_parser(__import__("argparse").ArgumentParser().add_subparsers())
    args = parser.parse_args(["export", str(model), "--task", "text-classification"])
    assert args.handler(args) == 0
    assert capsys.readouterr().out.strip() == str(model / "model.onnx")
    assert args.handler(args) == 1 and "pass --force" in capsys.readouterr().err
    wrong = parser.parse_args(["export", str(model), "--task", "raw"])
    assert wrong.handler(wrong) == 2
    not_hf = parser.parse_args(["export", str(tmp_path), "--task", "text-embedding"])
    assert not_hf.handler(not_hf) == 1 and "no config.json" in capsys.readouterr().err
