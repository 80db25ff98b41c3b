"""Decoding image bytes: what transformers' pipelines load, and hostile files refused fast with a reason."""

from __future__ import annotations

import io
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageFile, ImageOps

from sluice.engines.engine_contract import RecordError
from sluice.images.decode import DecodeLimits, decode_image
from tests.support.tiny_images import image_bytes, png_bomb

LIMITS = DecodeLimits()
SIZES = [(1, 1), (3, 517), (641, 97), (224, 224), (1000, 333)]  # (width, height)


def _picture(width: int, height: int, seed: int = 0) -> Image.Image:
    """RGB noise over a gradient, so a wrong orientation or channel order shows."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, width * height * 3).reshape(height, width, 3)
    return Image.fromarray((ramp * 0.7 + rng.integers(0, 76, (height, width, 3))).astype(np.uint8))


def _as_pipelines_load(data: bytes) -> Image.Image:
    """What transformers.image_utils.load_image makes of a file."""
    return ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")


# ------------------------------------------------------------------------------------- good images

MODES: dict[str, Callable[[Image.Image], bytes]] = {
    "jpeg-rgb": lambda im: image_bytes(im, "JPEG", quality=85),
    "jpeg-l": lambda im: image_bytes(im.convert("L"), "JPEG"),
    "jpeg-cmyk": lambda im: image_bytes(im.convert("CMYK"), "JPEG"),
    "png-rgb": lambda im: image_bytes(im, "PNG"),
    "png-rgba": lambda im: image_bytes(im.convert("RGBA"), "PNG"),
    "png-l": lambda im: image_bytes(im.convert("L"), "PNG"),
    "png-p": lambda im: image_bytes(im.convert("P"), "PNG"),
    "webp-rgb": lambda im: image_bytes(im, "WEBP", quality=80),
    "webp-rgba": lambda im: image_bytes(im.convert("RGBA"), "WEBP", lossless=True),
    "gif": lambda im: image_bytes(im.convert("P"), "GIF"),
    "bmp": lambda im: image_bytes(im, "BMP"),
    "tiff": lambda im: image_bytes(im, "TIFF"),
    "tiff-cmyk": lambda im: image_bytes(im.convert("CMYK"), "TIFF"),
    "png-1bit": lambda im: image_bytes(im.convert("1"), "PNG"),
    "png-16bit": lambda im: image_bytes(Image.fromarray(np.asarray(im.convert("L")).astype(np.uint16) * 257), "PNG"),
    "png-p-transparent": lambda im: image_bytes(im.convert("P"), "PNG", transparency=0),
}


@pytest.mark.parametrize("kind", list(MODES))
def test_every_accepted_format_and_mode_decodes_to_rgb_as_transformers_loads_it(kind: str) -> None:
    for width, height in SIZES:
        data = MODES[kind](_picture(width, height))
        image = decode_image(data, LIMITS)
        assert (image.mode, image.size) == ("RGB", (width, height))
        assert np.array_equal(np.asarray(image), np.asarray(_as_pipelines_load(data)))


@pytest.mark.parametrize(("orientation", "fmt"), [(6, "JPEG"), (8, "JPEG"), (6, "PNG"), (3, "WEBP")])
def test_the_exif_orientation_is_applied(orientation: int, fmt: str) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = image_bytes(_picture(40, 24), fmt, exif=exif.tobytes())
    image = decode_image(data, LIMITS)
    assert image.size == ((24, 40) if orientation in (6, 8) else (40, 24))
    assert np.array_equal(np.asarray(image), np.asarray(_as_pipelines_load(data)))


def test_a_multi_frame_image_gives_its_first_frame() -> None:
    frames = [_picture(30, 20, seed) for seed in range(3)]
    for fmt, options in [("GIF", {}), ("TIFF", {}), ("WEBP", {"lossless": True}), ("PNG", {})]:
        data = image_bytes(frames[0], fmt, save_all=True, append_images=frames[1:], **options)
        assert np.array_equal(np.asarray(decode_image(data, LIMITS)), np.asarray(_as_pipelines_load(data)))
        assert Image.open(io.BytesIO(data)).n_frames == 3


def test_a_format_beyond_the_defaults_can_be_accepted() -> None:
    data = image_bytes(_picture(16, 16), "ICO", sizes=[(16, 16)])
    assert decode_image(data, DecodeLimits(formats=("PNG", "ICO"))).size == (16, 16)


def test_an_image_at_the_pixel_limit_is_accepted() -> None:
    assert decode_image(image_bytes(_picture(50, 20), "PNG"), DecodeLimits(max_pixels=1000)).size == (50, 20)


# ---------------------------------------------------------------------------------- hostile input

BOMB = png_bomb(30_000, 30_000)  # 900 M pixels: over Pillow's own hard limit
BIG = png_bomb(10_000, 10_000)  # 100 M pixels: between Pillow's warning and its hard limit
JPEG = image_bytes(_picture(641, 97), "JPEG")
PNG = image_bytes(_picture(641, 97), "PNG")


@pytest.mark.parametrize(("data", "limits", "reason"), [
    (b"", LIMITS, "empty"),
    (b"hello, I am a JPEG", LIMITS, "not an image in an accepted format (JPEG, PNG, WEBP, GIF, BMP, TIFF)"),
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, LIMITS, "not an image in an accepted format"),
    (JPEG[: len(JPEG) // 2], LIMITS, "truncated or corrupt"),
    (PNG[: len(PNG) // 2], LIMITS, "truncated or corrupt"),
    (PNG[:60], LIMITS, "truncated or corrupt"),
    (BOMB, LIMITS, "too many pixels"),
    (BIG, LIMITS, "10000x10000 = 100000000 pixels, more than the limit of 89478485"),
    (png_bomb(100, 100), DecodeLimits(max_pixels=9_999), "100x100 = 10000 pixels, more than the limit of 9999"),
    (BOMB, DecodeLimits(max_pixels=400_000_000), "too many pixels"),
    (image_bytes(_picture(8, 8), "GIF"), DecodeLimits(formats=("JPEG", "PNG")),
     "a GIF file; the accepted formats are JPEG, PNG"),
    (image_bytes(_picture(8, 8), "ICO"), LIMITS, "not an image in an accepted format"),
])
def test_hostile_input_is_a_decode_record_error_in_one_line_and_fast(data: bytes, limits: DecodeLimits,
                                                                      reason: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        with pytest.raises(RecordError) as raised:
            decode_image(data, limits)
        elapsed_s = time.perf_counter() - start
    assert raised.value.stage == "decode-image"
    assert reason in str(raised.value) and "\n" not in str(raised.value)
    assert elapsed_s < 2.0
    assert [str(w.message) for w in caught if issubclass(w.category, Image.DecompressionBombWarning)] == []
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_a_limit_above_pillows_warning_threshold_holds_without_its_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100_000)  # Pillow's thresholds scaled down: 100 K warns, 200 K fails
    limits = DecodeLimits(max_pixels=1_000_000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        image = decode_image(image_bytes(_picture(400, 300), "PNG"), limits)
        with pytest.raises(RecordError, match="too many pixels to decode safely"):
            decode_image(image_bytes(_picture(500, 500), "PNG"), limits)
    assert image.size == (400, 300)
    assert [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)] == []


def test_threads_decode_at_once_with_bombs_among_them() -> None:
    inputs = [JPEG, BIG, PNG, BOMB] * 6

    def outcome(data: bytes) -> str:
        try:
            return f"{decode_image(data, LIMITS).size}"
        except RecordError as err:
            return err.stage

    with warnings.catch_warnings(record=True) as caught, ThreadPoolExecutor(4) as pool:
        warnings.simplefilter("always")
        results = list(pool.map(outcome, inputs))
    assert results == ["(641, 97)", "decode-image", "(641, 97)", "decode-image"] * 6
    assert [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)] == []


@pytest.mark.parametrize(("options", "message"), [
    ({"max_pixels": 0}, "max_pixels must be at least 1"),
    ({"formats": ()}, "at least one image format"),
    ({"formats": ("jpeg",)}, "unknown image formats ['jpeg']"),
    ({"formats": ("PNG", "NOPE")}, "unknown image formats ['NOPE']"),
])
def test_impossible_limits_are_refused_when_built(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        DecodeLimits(**options)
    assert message in str(caught.value)
