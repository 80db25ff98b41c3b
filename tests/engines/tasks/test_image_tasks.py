"""The image tasks on the onnx and torch engines against transformers, image by image, on tiny random models.

References, from the very same directories: ``pipeline("image-classification")`` over the image files, and
``CLIPModel`` / ``SiglipModel``'s ``get_image_features`` / ``get_text_features`` on what the model's own
processor and tokenizer make of them. Images: JPEG, PNG, WebP in RGB, RGBA, L, CMYK and P, odd sizes, one
EXIF-rotated; batches mix them.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sluice.engines.engine_contract import RecordError
from tests.support.task_runs import cosines, infer_one_by_one
from tests.support.tiny_images import image_files, save_clip, save_siglip, save_vit_classifier

SCORE_TOLERANCE = 1e-4
MIN_COSINE = 0.9999
TEXTS = ["a photo of a cat", "a red car on a street", "", "two dogs playing in the snow " * 20, "Zürich 東京 👍"]


@pytest.fixture(scope="module")
def images() -> dict[str, bytes]:
    return image_files()


@pytest.fixture(scope="module")
def image_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("image-models")
    return {"vit": save_vit_classifier(root / "vit"), "clip": save_clip(root / "clip"),
            "clip-legacy-eos": save_clip(root / "clip-legacy-eos", seed=1, legacy_eos=True),
            "siglip": save_siglip(root / "siglip"), "siglip-ids-only": save_siglip(root / "siglip-ids", ids_only=True)}


def _pil(data: bytes) -> Any:
    from PIL import Image, ImageOps

    return ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_image_classification_equals_the_pipeline(backend: str, image_models: dict[str, Path],
                                                  images: dict[str, bytes], make_engine: Callable[..., Any],
                                                  tmp_path: Path) -> None:
    from transformers import pipeline

    paths = []
    for name, data in images.items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    want = pipeline("image-classification", model=str(image_models["vit"]), device="cpu")(paths, top_k=3)
    engine = make_engine(backend, model=str(image_models["vit"]), task="image-classification", top_k=3)
    got = infer_one_by_one(engine, list(images.values()))
    for name, got_one, want_one in zip(images, got, want, strict=True):
        assert [r["label"] for r in got_one] == [r["label"] for r in want_one], name
        np.testing.assert_allclose([r["score"] for r in got_one], [r["score"] for r in want_one],
                                   atol=SCORE_TOLERANCE, err_msg=name)
    assert len({r[0]["label"] for r in got}) > 1, "a model that gives one label everywhere proves little"


@pytest.mark.parametrize(("model", "backend"), [("clip", "onnx"), ("clip", "torch"), ("clip-legacy-eos", "onnx"),
                                                ("siglip", "onnx"), ("siglip", "torch"), ("siglip-ids-only", "onnx")])
def test_image_text_embedding_equals_get_features(model: str, backend: str, image_models: dict[str, Path],
                                                  images: dict[str, bytes], make_engine: Callable[..., Any]) -> None:
    import torch
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    directory = image_models[model]
    reference = AutoModel.from_pretrained(str(directory)).eval()
    processor = AutoImageProcessor.from_pretrained(str(directory), backend="pil")
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    padding: dict[str, Any] = {"padding": "max_length"} if model.startswith("siglip") else {}
    with torch.no_grad():
        want_images = [reference.get_image_features(**processor(images=[_pil(data)], return_tensors="pt"))
                       for data in images.values()]
        want_texts = [reference.get_text_features(**tokenizer([text], truncation=True, return_tensors="pt",
                                                              **padding)) for text in TEXTS]
    want = np.stack([getattr(w, "pooler_output", w)[0].numpy() for w in [*want_images, *want_texts]])
    engine = make_engine(backend, model=str(directory), task="image-text-embedding",
                         inputs={"image": "picture", "text": "caption"})
    records = [{"picture": data} for data in images.values()] + [{"caption": text} for text in TEXTS]
    got = np.asarray(infer_one_by_one(engine, records, batch_size=5), dtype=np.float32)  # batches mix images and texts
    assert got.shape == want.shape
    assert cosines(got, want).min() >= MIN_COSINE
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)


def test_images_from_base64_and_locations_equal_images_from_bytes(image_models: dict[str, Path],
                                                                   images: dict[str, bytes], tmp_path: Path,
                                                                   make_engine: Callable[..., Any]) -> None:
    model = str(image_models["vit"])
    for name, data in images.items():
        (tmp_path / name).write_bytes(data)
    from_bytes = infer_one_by_one(make_engine("onnx", model=model, task="image-classification"), list(images.values()))
    from_base64 = infer_one_by_one(make_engine("onnx", model=model, task="image-classification", warmup=False,
                                     image={"source": "base64"}),
                         [base64.b64encode(d).decode() for d in images.values()])
    located = make_engine("onnx", model=model, task="image-classification", warmup=False,
                          image={"source": "location"})
    from_paths = infer_one_by_one(located, [str(tmp_path / name) for name in images])
    assert from_bytes == from_base64 == from_paths
    assert len(from_bytes[0]) == 5  # the pipeline's default top_k


def test_a_bad_image_fails_alone_with_its_stage(image_models: dict[str, Path], images: dict[str, bytes],
                                                make_engine: Callable[..., Any], tmp_path: Path) -> None:
    engine = make_engine("torch", model=str(image_models["vit"]), task="image-classification", warmup=False,
                         image={"source": "location"})
    good = tmp_path / "good.png"
    good.write_bytes(images["rgb-odd.png"])
    (tmp_path / "text.jpg").write_text("I am not a JPEG")
    items = engine.prepare_each([str(good), str(tmp_path / "missing.jpg"), str(tmp_path / "text.jpg"), 42])
    assert not isinstance(items[0], RecordError)
    assert [getattr(item, "stage", None) for item in items[1:]] == ["fetch", "decode-image", "prepare"]
    with pytest.raises(RecordError):
        engine.prepare([str(tmp_path / "missing.jpg")])


@pytest.mark.slow  # ./dev test fast leaves it out
def test_an_export_made_ahead_of_time_runs_as_the_directory_does(image_models: dict[str, Path], tmp_path: Path,
                                                                  images: dict[str, bytes],
                                                                  make_engine: Callable[..., Any]) -> None:
    """``sluice models export --task image-text-embedding`` writes both towers; a folder holding them runs."""
    import shutil
    import subprocess
    import sys

    folder = tmp_path / "clip-onnx"
    shutil.copytree(image_models["clip"], folder)
    proc = subprocess.run([sys.executable, "-m", "sluice.cli", "models", "export", str(folder), "--task",
                           "image-text-embedding", "--out", str(folder / "clip.onnx")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in folder.glob("*.onnx")) == ["clip.onnx", "clip.text.onnx"]
    records = [{"picture": data} for data in list(images.values())[:3]] + [{"caption": "a photo of a cat"}]
    options = {"task": "image-text-embedding", "inputs": {"image": "picture", "text": "caption"}, "warmup": False}
    exported = infer_one_by_one(make_engine("onnx", model=str(folder / "clip.onnx"), **options), records)
    from_directory = infer_one_by_one(make_engine("onnx", model=str(image_models["clip"]), **options), records)
    np.testing.assert_allclose(exported, from_directory, atol=1e-5)
    (folder / "clip.text.onnx").unlink()
    with pytest.raises(Exception, match="clip.text.onnx"):
        make_engine("onnx", model=str(folder / "clip.onnx"), **options)


def test_a_mixed_batch_prepared_at_once_equals_records_prepared_alone(image_models: dict[str, Path],
                                                                       images: dict[str, bytes],
                                                                       make_engine: Callable[..., Any]) -> None:
    """What the operator does with a poll: prepare_each over images, texts and broken records together."""
    engine = make_engine("onnx", model=str(image_models["clip"]), task="image-text-embedding", warmup=False,
                         inputs={"image": "picture", "text": "caption"})
    records: list[Any] = [{"caption": TEXTS[0]}, {"picture": b"not an image"}]
    records += [{"picture": data} for data in images.values()] + [{"caption": t} for t in TEXTS[1:]] + [{"x": 1}]
    together = engine.prepare_each(records)
    failed = [i for i, item in enumerate(together) if isinstance(item, RecordError)]
    assert failed == [1, len(records) - 1]
    kept = [i for i in range(len(records)) if i not in failed]
    got = engine.infer([together[i] for i in kept])
    alone = [engine.infer(engine.prepare([records[i]]))[0] for i in kept]
    np.testing.assert_allclose(np.asarray(got), np.asarray(alone), atol=1e-5)


def test_what_cannot_work_is_refused_at_start_in_one_line(image_models: dict[str, Path], tmp_path: Path,
                                                          make_engine: Callable[..., Any]) -> None:
    import subprocess
    import sys

    import yaml

    with pytest.raises(Exception, match="max_length 100 is more than the model's text length \\(77 tokens\\)"):
        make_engine("torch", model=str(image_models["clip"]), task="image-text-embedding", max_length=100,
                    inputs={"text": "."})
    pipeline = {"source": {"file": {"path": "in.jsonl"}}, "codec": {"format": "raw"},
                "engine": {"type": "torch", "model": str(image_models["vit"]), "task": "image-classification"},
                "sink": {"file": {"path": "out.jsonl"}, "output": {"mode": "merge", "field": "labels"}}}
    (tmp_path / "in.jsonl").write_text("x\n")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pipeline))
    proc = subprocess.run([sys.executable, "-m", "sluice.cli", "run", str(tmp_path / "p.yaml")], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    assert "sink.output.mode merge would copy every image" in proc.stderr and "Traceback" not in proc.stderr
