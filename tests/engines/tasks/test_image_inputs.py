"""Image inputs alone (no model): where a record's image comes from, and how prepared images batch.

A model whose preprocessing keeps the aspect ratio (a shortest-edge resize without a crop) gives images of
several sizes: each size is its own run, and every image's pixel values are what its processor gives alone.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest

from sluice.engines.engine_contract import RecordError
from sluice.engines.tasks.image_inputs import ImageInputs, ImageItem, ImageOptions
from tests.support.tiny_images import image_bytes, picture


def _inputs(tmp_path: Path, config: dict[str, object], **options: object) -> ImageInputs:
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config), encoding="utf-8")
    return ImageInputs(ImageOptions(**options), tmp_path, tmp_path, "image-classification")


def test_images_of_several_sizes_run_a_size_at_a_time_and_equal_the_processor_alone(tmp_path: Path) -> None:
    from PIL import Image
    from transformers import AutoImageProcessor

    inputs = _inputs(tmp_path, {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 24},
                                "do_center_crop": False})
    sizes = [(40, 30), (30, 40), (40, 30), (50, 50), (30, 40)]  # (width, height): three shapes after resizing
    files = [image_bytes(picture(w, h, seed=i), "PNG") for i, (w, h) in enumerate(sizes)]
    items = inputs.prepare_each(files)
    assert all(isinstance(item, ImageItem) for item in items)
    runs = inputs.collate([item for item in items if isinstance(item, ImageItem)])
    assert sorted(rows for rows, _ in runs) == [[0, 2], [1, 4], [3]]
    reference = AutoImageProcessor.from_pretrained(str(tmp_path), backend="pil")
    for rows, pixel_values in runs:
        for row, values in zip(rows, pixel_values, strict=True):
            image = Image.open(io.BytesIO(files[row])).convert("RGB")
            want = reference(images=image, return_tensors="np")["pixel_values"][0]
            np.testing.assert_array_equal(values, want)
    inputs.close()


@pytest.mark.parametrize(("source", "value", "stage", "fragment"), [
    ("bytes", "a text", "prepare", "engine.image.source: base64"),
    ("bytes", {"image": "x"}, "prepare", "codec.input_field"),
    ("base64", "not base64!", "decode-image", "is not base64"),
    ("base64", "data:image/png,abc", "decode-image", "base64-encoded"),
    ("base64", base64.b64encode(b"plain text").decode(), "decode-image", "not an image"),
    ("location", 42, "prepare", "expects a location string"),
])
def test_a_value_of_the_wrong_kind_fails_alone_saying_what_to_set(tmp_path: Path, source: str, value: object,
                                                                   stage: str, fragment: str) -> None:
    inputs = _inputs(tmp_path, {"image_processor_type": "ViTImageProcessor", "size": {"height": 8, "width": 8}},
                     source=source)
    good = image_bytes(picture(20, 10), "PNG")
    if source == "base64":
        good = base64.b64encode(good).decode()  # type: ignore[assignment]
    elif source == "location":
        (tmp_path / "good.png").write_bytes(good)
        good = "good.png"  # type: ignore[assignment]
    first, second = inputs.prepare_each([value, good])
    assert isinstance(first, RecordError) and first.stage == stage and fragment in str(first), str(first)
    assert isinstance(second, ImageItem) and second.pixels.shape == (8, 8, 3)
    inputs.close()
