"""The model's image preprocessing: bit-exact against transformers' PIL image processors, refusals at start."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from sluice.engines.engine_contract import EngineStartError, RecordError
from sluice.images.decode import DecodeLimits, decode_image
from sluice.images.preprocess import MAX_RESIZED_PIXELS, ImagePreprocessor
from tests.support.tiny_images import image_bytes

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
HALF = [0.5, 0.5, 0.5]

# name -> preprocessor_config.json, as real checkpoints write them (legacy and current), most at small sizes
CONFIGS: dict[str, dict[str, Any]] = {
    # google/vit-base-patch16-224 (legacy feature extractor, int size)
    "vit-224": {"feature_extractor_type": "ViTFeatureExtractor", "do_normalize": True, "do_resize": True,
                "image_mean": HALF, "image_std": HALF, "resample": 2, "size": 224},
    "vit-fast-32x40": {"image_processor_type": "ViTImageProcessorFast", "size": {"height": 32, "width": 40},
                       "do_center_crop": None, "crop_size": None, "data_format": "channels_first",
                       "processor_class": "ViTProcessor"},
    "vit-max-hw": {"image_processor_type": "ViTImageProcessor", "size": {"max_height": 30, "max_width": 40},
                   "resample": 1},
    "vit-crop-bigger": {"image_processor_type": "ViTImageProcessor", "size": 24, "do_center_crop": True,
                        "crop_size": [30, 27], "resample": 0},
    # openai/clip-vit-base-patch32
    "clip-224": {"feature_extractor_type": "CLIPFeatureExtractor", "crop_size": 224, "do_center_crop": True,
                 "do_normalize": True, "do_resize": True, "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
                 "resample": 3, "size": 224},
    "clip-32": {"image_processor_type": "CLIPImageProcessor", "crop_size": {"height": 32, "width": 32},
                "size": {"shortest_edge": 32}, "do_convert_rgb": True, "rescale_factor": 0.00392156862745098},
    "clip-square": {"image_processor_type": "CLIPImageProcessor", "use_square_size": True, "size": 32},
    # google/siglip-base-patch16-224, smaller
    "siglip-32": {"image_processor_type": "SiglipImageProcessor", "processor_class": "SiglipProcessor",
                  "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": HALF,
                  "image_std": HALF, "resample": 3, "rescale_factor": 0.00392156862745098,
                  "size": {"height": 32, "width": 32}},
    "siglip-int": {"image_processor_type": "SiglipImageProcessorFast", "size": 20},  # not square by default
    # facebook/deit-base-distilled-patch16-224, smaller
    "deit-36-32": {"feature_extractor_type": "DeiTFeatureExtractor", "crop_size": 32, "do_center_crop": True,
                   "do_normalize": True, "do_resize": True, "image_mean": IMAGENET_MEAN,
                   "image_std": IMAGENET_STD, "resample": 3, "size": 36},
    # facebook/convnext-tiny-224: resize to 256 on the short side, crop 224
    "convnext-224": {"feature_extractor_type": "ConvNextFeatureExtractor", "crop_pct": 0.875, "do_normalize": True,
                     "do_resize": True, "image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD, "resample": 3,
                     "size": 224},
    "convnext-32": {"image_processor_type": "ConvNextImageProcessor", "crop_pct": 0.9, "size": {"shortest_edge": 32},
                    "do_pad": False},
    "convnext-warp-384": {"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 384}},
    # google/bit-50 and DINOv2 (BitImageProcessor), smaller
    "bit-40-32": {"image_processor_type": "BitImageProcessor", "crop_size": {"height": 32, "width": 32},
                  "do_center_crop": True, "do_convert_rgb": True, "resample": 3, "size": {"shortest_edge": 40},
                  "image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD},
    "bit-bounded": {"image_processor_type": "BitImageProcessor", "do_center_crop": False,
                    "size": {"shortest_edge": 24, "longest_edge": 40}},
    "no-rescale": {"image_processor_type": "ViTImageProcessor", "size": 16, "do_rescale": False,
                   "image_mean": [100.0, 120.5, 90], "image_std": 60},
    "nothing": {"image_processor_type": "ViTImageProcessor", "do_resize": False, "do_rescale": False,
                "do_normalize": False},
}


def _images() -> list[Image.Image]:
    """Noise and gradients (resampling filters differ most on them) in awkward sizes, RGB."""
    rng = np.random.default_rng(7)
    images = []
    for width, height in [(1, 1), (3, 517), (641, 97), (224, 224), (1000, 333), (31, 32), (20, 13)]:
        noise = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        ramp = np.linspace(0, 255, width * height * 3).reshape(height, width, 3).astype(np.uint8)
        images.append(Image.fromarray(np.where(rng.random((height, width, 1)) < 0.5, noise, ramp)))
    return images


IMAGES = _images()


def _write(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "preprocessor_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def _reference(directory: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoImageProcessor.from_pretrained(str(directory), backend="pil")


def _max_diff(ours: np.ndarray, theirs: np.ndarray) -> float:
    assert ours.shape == theirs.shape
    return float(np.max(np.abs(ours.astype(np.float64) - theirs.astype(np.float64))))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_pixels_equal_transformers_slow_processor_bit_for_bit(name: str, tmp_path: Path) -> None:
    directory = _write(tmp_path / name, CONFIGS[name])
    ours, theirs = ImagePreprocessor.from_directory(directory), _reference(directory)
    assert ours.processor == type(theirs).__name__.removesuffix("Pil")
    for image in IMAGES:
        try:
            pixels = ours(image)
        except RecordError:  # a side resized to 0 pixels: transformers fails too (Pillow refuses it)
            with pytest.raises(ValueError):
                theirs(images=image, return_tensors="np")
            continue
        expected = theirs(images=image, return_tensors="np")["pixel_values"][0]
        assert pixels.dtype == np.float32 and pixels.flags.c_contiguous
        assert _max_diff(pixels, expected) == 0.0, (name, image.size)
        if ours.output_size is not None:
            assert pixels.shape[1:] == ours.output_size


def _files() -> list[bytes]:
    """Files as records carry them: formats, modes, an EXIF rotation, transparency."""
    rgb = IMAGES[2]
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to display
    return [image_bytes(rgb, "JPEG", quality=90), image_bytes(rgb, "PNG"), image_bytes(rgb, "WEBP", quality=80),
            image_bytes(rgb.convert("RGBA"), "PNG"), image_bytes(rgb.convert("L"), "JPEG"),
            image_bytes(rgb.convert("CMYK"), "JPEG"), image_bytes(rgb.convert("P"), "GIF"),
            image_bytes(IMAGES[4], "JPEG", exif=exif.tobytes())]


@pytest.mark.parametrize("name", ["clip-32", "convnext-32", "deit-36-32"])
def test_decoded_files_give_what_a_transformers_pipeline_gives(name: str, tmp_path: Path) -> None:
    load_image = pytest.importorskip("transformers.image_utils").load_image
    directory = _write(tmp_path / name, CONFIGS[name])
    ours, theirs = ImagePreprocessor.from_directory(directory), _reference(directory)
    for data in _files():
        pixels = ours(decode_image(data, DecodeLimits()))
        expected = theirs(images=load_image(Image.open(io.BytesIO(data))), return_tensors="np")["pixel_values"][0]
        assert _max_diff(pixels, expected) == 0.0


def test_output_size_is_known_when_every_output_has_it() -> None:
    def size(name: str) -> tuple[int, int] | None:
        return ImagePreprocessor.from_config(CONFIGS[name], name).output_size

    assert [size(n) for n in ("vit-224", "vit-fast-32x40", "clip-224", "convnext-224", "convnext-warp-384")] == [
        (224, 224), (32, 40), (224, 224), (224, 224), (384, 384)]
    assert [size(n) for n in ("vit-crop-bigger", "bit-40-32")] == [(30, 27), (32, 32)]
    assert [size(n) for n in ("siglip-int", "bit-bounded", "vit-max-hw", "nothing")] == [None] * 4


def test_an_extreme_aspect_ratio_is_a_record_error_not_a_giant_array() -> None:
    clip = ImagePreprocessor.from_config(CONFIGS["clip-224"], "clip")
    sliver = Image.new("RGB", (MAX_RESIZED_PIXELS // 224 // 224 + 10, 1))
    with pytest.raises(RecordError, match="would resize to"):
        clip(sliver)
    with pytest.raises(ValueError, match="RGB"):
        clip(Image.new("RGBA", (4, 4)))


@pytest.mark.parametrize(("config", "fragments"), [
    ({"image_processor_type": "BeitImageProcessor", "do_reduce_labels": True},
     ["image_processor_type BeitImageProcessor is not supported", "ViTImageProcessor, CLIPImageProcessor"]),
    ({"size": 224}, ["image_processor_type is missing"]),
    ({"image_processor_type": "ViTImageProcessor", "auto_map": {"AutoImageProcessor": "x.Y"}}, ["custom code"]),
    ({"image_processor_type": "ViTImageProcessor", "do_pad": True, "pad_size": {"height": 9, "width": 9}},
     ["do_pad"]),
    ({"image_processor_type": "ViTImageProcessor", "size": {"longest_edge": 224}}, ["size {'longest_edge': 224}"]),
    ({"image_processor_type": "ViTImageProcessor", "size": {"min_pixels": 9, "max_pixels": 99}}, ["size"]),
    ({"image_processor_type": "ViTImageProcessor", "size": [224]}, ["size [224]"]),
    ({"image_processor_type": "ViTImageProcessor", "size": 0}, ["size 0"]),
    ({"image_processor_type": "ViTImageProcessor", "resample": 7}, ["resample", "got 7"]),
    ({"image_processor_type": "ViTImageProcessor", "image_std": [0.5, 0, 0.5]}, ["image_std", "non-zero"]),
    ({"image_processor_type": "ViTImageProcessor", "image_mean": [0.5, 0.5]}, ["image_mean", "three"]),
    ({"image_processor_type": "ViTImageProcessor", "rescale_factor": "1/255"}, ["rescale_factor"]),
    ({"image_processor_type": "CLIPImageProcessor", "crop_size": {"shortest_edge": 9}}, ["crop_size"]),
    ({"image_processor_type": "ConvNextImageProcessor", "size": {"height": 9, "width": 9}}, ["shortest_edge"]),
    ({"image_processor_type": "ConvNextImageProcessor", "crop_pct": 0}, ["crop_pct"]),
])
def test_what_is_not_computed_exactly_is_refused_at_start(config: dict[str, Any], fragments: list[str],
                                                          tmp_path: Path) -> None:
    with pytest.raises(EngineStartError) as caught:
        ImagePreprocessor.from_directory(_write(tmp_path, config))
    message = str(caught.value)
    assert "\n" not in message and "preprocessor_config.json" in message
    for fragment in fragments:
        assert fragment in message


def test_a_missing_or_broken_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(EngineStartError, match=r"preprocessor_config.json not found"):
        ImagePreprocessor.from_directory(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(EngineStartError, match=r"cannot read .*preprocessor_config.json"):
        ImagePreprocessor.from_directory(tmp_path)
