"""Image pipelines end to end: ``sluice run`` on the real broker and as a bounded Parquet job.

* The classify-images example, pointed at a tiny ViT and a local HTTP server: records carry URLs (and a path);
  every good image's labels equal ``pipeline("image-classification")``'s, and each hostile one -- a truncated
  file, a decompression bomb, text posing as an image, a 404, a server that never answers, a file over the
  size cap -- is dead-lettered with its stage in bounded time, nothing else lost.
* Raw records whose whole value is the image file (``codec.format: raw``), on the torch engine with CLIP.
* The embed-catalogue-images example over a Parquet file of image paths, with CLIP on ONNX.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.support.image_server import serve
from tests.support.kafka import consume_all, create_topic, produce, unique_topic
from tests.support.tiny_images import (
    image_bytes,
    image_files,
    picture,
    png_bomb,
    save_clip,
    save_vit_classifier,
)

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "pipelines"
STAGE_HEADER = "sluice.error.stage"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("image-pipeline-models")
    return {"vit": save_vit_classifier(root / "vit", seed=3), "clip": save_clip(root / "clip", seed=4)}


def _pil(data: bytes) -> Any:
    from PIL import Image, ImageOps

    return ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")


def _image_features(model_dir: Path, files: list[bytes], normalize: bool) -> np.ndarray:
    import torch
    from transformers import AutoImageProcessor, AutoModel

    model = AutoModel.from_pretrained(str(model_dir)).eval()
    processor = AutoImageProcessor.from_pretrained(str(model_dir), backend="pil")
    with torch.no_grad():
        rows = [model.get_image_features(**processor(images=[_pil(data)], return_tensors="pt")) for data in files]
    vectors = np.stack([getattr(row, "pooler_output", row)[0].numpy() for row in rows])
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True) if normalize else vectors


def _run(pipeline: Path, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.cli", "run", str(pipeline), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s)


def _kafka_pipeline(example: str, tmp_path: Path, kafka_bootstrap: str, topic_in: str, export_cache: Path,
                    **engine: Any) -> tuple[Path, str, str]:
    doc = yaml.safe_load((EXAMPLES / example).read_text(encoding="utf-8"))
    out, dlq = unique_topic("images-out"), unique_topic("images-dlq")
    for topic in (out, dlq):
        create_topic(kafka_bootstrap, topic, 1)
    section = {**doc["engine"], **engine}
    if section["type"] == "onnx":
        section.update(providers=["cpu"], intra_op_num_threads=1, export_cache_dir=str(export_cache))
    else:
        section.pop("providers", None)
        section.update(device="cpu")
    doc.update(engine=section, dead_letter={"topic": dlq}, runtime={"commit_interval_ms": 200},
               source={"kafka": {"bootstrap_servers": kafka_bootstrap, "topics": [topic_in],
                                 "group_id": unique_topic("g-images")}})
    doc["sink"]["kafka"] = {"topic": out}
    path = tmp_path / f"{example}"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path, out, dlq


@pytest.mark.kafka
def test_classify_images_by_url_equals_the_pipeline_and_dead_letters_hostile_images(
        kafka_bootstrap: str, tmp_path: Path, models: dict[str, Path], export_cache: Path) -> None:
    from transformers import pipeline

    served = tmp_path / "served"
    served.mkdir()
    good = image_files(seed=9)
    for name, data in good.items():
        (served / name).write_bytes(data)
    (tmp_path / "local.png").write_bytes(good["rgba.png"])  # a path, relative to the pipeline file
    noise = picture(700, 700, seed=1).effect_spread(40)  # noisy: a large PNG
    hostile = {"truncated.jpg": good["rgb-224.jpg"][: len(good["rgb-224.jpg"]) // 2], "bomb.png": png_bomb(30000, 30000),
               "text.jpg": b"I am a JPEG, honestly.\n", "big.png": image_bytes(noise, "PNG")}
    for name, data in hostile.items():
        (served / name).write_bytes(data)
    topic_in = unique_topic("uploads")
    create_topic(kafka_bootstrap, topic_in, 2)
    path, out, dlq = _kafka_pipeline("classify-images.yaml", tmp_path, kafka_bootstrap, topic_in, export_cache,
                                     model=str(models["vit"]),
                                     image={"source": "location", "fetch_timeout_s": 2, "max_bytes": 300_000})
    with serve(served) as base:
        urls = {**{name: f"{base}/{name}" for name in [*good, *hostile]}, "local": "local.png",
                "missing": f"{base}/nothing.jpg", "hang": f"{base}/hang"}
        records = [{"id": i, "url": url} for i, url in enumerate(urls.values())]
        produce(kafka_bootstrap, topic_in, [(f"k{r['id']}", json.dumps(r)) for r in records])
        start = time.monotonic()
        proc = _run(path, "--max-records", str(len(records)), "--idle-exit", "20")
        elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    ids = dict(zip(urls, range(len(urls)), strict=True))
    want_stage = {"truncated.jpg": "decode-image", "bomb.png": "decode-image", "text.jpg": "decode-image",
                  "big.png": "fetch", "missing": "fetch", "hang": "fetch"}
    letters = consume_all(kafka_bootstrap, dlq, expected_count=len(want_stage), timeout_s=60)
    got_stage = {json.loads(m.value)["id"]: dict(m.headers)[STAGE_HEADER].decode() for m in letters}
    assert got_stage == {ids[name]: stage for name, stage in want_stage.items()}
    outputs = {json.loads(m.value)["id"]: json.loads(m.value)
               for m in consume_all(kafka_bootstrap, out, expected_count=len(good) + 1, timeout_s=60)}
    assert sorted(outputs) == sorted(ids[name] for name in [*good, "local"])
    reference = pipeline("image-classification", model=str(models["vit"]), device="cpu")
    for name in [*good, "local"]:
        data = good.get(name, good["rgba.png"])
        want = reference(_pil(data), top_k=3)
        got = outputs[ids[name]]["labels"]
        assert [r["label"] for r in got] == [r["label"] for r in want], name
        np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in want], atol=1e-4, err_msg=name)
    assert elapsed < 120, f"the run took {elapsed:.0f} s: a hostile image held it up"


@pytest.mark.kafka
def test_raw_image_records_embed_as_get_image_features_on_torch(kafka_bootstrap: str, tmp_path: Path,
                                                                models: dict[str, Path], export_cache: Path) -> None:
    files = list(image_files(seed=2).values())
    topic_in = unique_topic("raw-images")
    create_topic(kafka_bootstrap, topic_in, 1)
    path, out, dlq = _kafka_pipeline("classify-images.yaml", tmp_path, kafka_bootstrap, topic_in, export_cache,
                                     type="torch", model=str(models["clip"]), task="image-text-embedding",
                                     top_k=None, image={"source": "bytes"})
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    doc["engine"].pop("top_k")
    doc.update(codec={"format": "raw"}, sink={**doc["sink"], "output": {"mode": "result", "field": "embedding"}})
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    produce(kafka_bootstrap, topic_in, [(f"k{i}", data) for i, data in enumerate(files)])
    proc = _run(path, "--max-records", str(len(files)), "--idle-exit", "20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert consume_all(kafka_bootstrap, dlq) == []
    got = {m.key: json.loads(m.value) for m in consume_all(kafka_bootstrap, out, expected_count=len(files))}
    vectors = np.asarray([got[f"k{i}".encode()]["embedding"] for i in range(len(files))], dtype=np.float32)
    want = _image_features(models["clip"], files, normalize=False)
    cosines = (vectors * want).sum(axis=1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(want, axis=1))
    assert cosines.min() >= 0.9999


def test_embed_catalogue_images_example_as_a_parquet_job(tmp_path: Path, models: dict[str, Path],
                                                         export_cache: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = tmp_path / "images"
    images.mkdir()
    files = image_files(seed=5)
    for name, data in files.items():
        (images / name).write_bytes(data)
    (images / "bomb.png").write_bytes(png_bomb(20000, 20000))
    rows = [*(f"images/{name}" for name in files), "images/bomb.png", "images/nowhere.jpg"]
    pq.write_table(pa.table({"sku": list(range(len(rows))), "image_path": rows}), tmp_path / "catalogue.parquet")
    doc = yaml.safe_load((EXAMPLES / "embed-catalogue-images.yaml").read_text(encoding="utf-8"))
    doc["source"]["file"]["path"] = "catalogue.parquet"
    doc["sink"]["file"]["path"] = "embedded.parquet"
    doc["engine"].update(model=str(models["clip"]), providers=["cpu"], intra_op_num_threads=1,
                         export_cache_dir=str(export_cache))
    pipeline = tmp_path / "job.yaml"
    pipeline.write_text(yaml.safe_dump(doc), encoding="utf-8")
    proc = _run(pipeline)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pq.read_table(tmp_path / "embedded.parquet").to_pylist()
    assert sorted(row["sku"] for row in table) == list(range(len(files)))
    got = np.asarray([row["embedding"] for row in sorted(table, key=lambda row: row["sku"])], dtype=np.float32)
    want = _image_features(models["clip"], list(files.values()), normalize=True)
    assert ((got * want).sum(axis=1)).min() >= 0.9999  # unit vectors: the dot product is the cosine
    letters = [json.loads(line) for line in (tmp_path / "embedded.dead-letters.jsonl").read_text().splitlines()]
    assert {(letter["record"]["image_path"], letter["error"]["stage"]) for letter in letters} == {
        ("images/bomb.png", "decode-image"), ("images/nowhere.jpg", "fetch")}
