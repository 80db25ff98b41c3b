"""A model's own image preprocessing, computed exactly as transformers' PIL ("slow") image processors do.

:meth:`ImagePreprocessor.from_directory` reads the model's ``preprocessor_config.json``; the result, called
on an RGB image (:func:`sluice.images.decode.decode_image`'s), gives ``pixel_values[0]`` of
``AutoImageProcessor.from_pretrained(dir, backend="pil")(images=image, return_tensors="np")``: a Pillow resize
of uint8 pixels, a center crop (zero-padded around a smaller image), rescale (float64, then float32), normalize
(float32). Processors: ViT, CLIP, SigLIP, DeiT, ConvNeXT (its ``crop_pct`` rule), BiT (DINOv2's), named by
``image_processor_type`` (``...Fast`` and ``...Pil`` names count as the same) or the legacy
``feature_extractor_type``. Sizes: ``{height, width}``, ``{shortest_edge}``, ``{shortest_edge, longest_edge}``,
``{max_height, max_width}``, an int (square or shortest edge, per ``default_to_square``), ``[height, width]``.

Guarantees:

* Exact: the same float32 values as transformers, bit for bit (the tests compare). Rescale and normalize
  act on uint8 pixels, so they are one lookup table per channel, computed with transformers' dtypes.
* Nothing that changes pixels is ignored: an unknown processor, remote code (``auto_map``), padding
  (``do_pad``), a size form or value not computed here is an EngineStartError at start (one line, naming the
  file and key). Keys the processor itself ignores are ignored.
* The output is a (3, height, width) float32 array, also when the model neither rescales nor normalizes
  (transformers then gives uint8 of the same values). An image whose resize would pass ``MAX_RESIZED_PIXELS``
  (an extreme aspect ratio) or reach zero pixels is a RecordError, not a giant array.
* Immutable and pure: it may be called from several threads at once. A non-RGB image is a ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sluice.engines.engine_contract import EngineStartError, RecordError
from sluice.engines.tasks.model_config import read_json
from sluice.images.sizes import Size, read_size, shortest_edge_target

if TYPE_CHECKING:
    from PIL import Image

MAX_RESIZED_PIXELS = 4096 * 4096
_HALF = (0.5, 0.5, 0.5)
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_SQUARE_224 = {"height": 224, "width": 224}


def _defaults(resample: int, mean: tuple[float, ...], size: dict[str, int], **more: Any) -> dict[str, Any]:
    std = _CLIP_STD if mean is _CLIP_MEAN else mean
    return {"do_resize": True, "do_rescale": True, "do_normalize": True, "resample": resample, "image_mean": mean,
            "image_std": std, "size": size, **more}


# Each processor's class defaults, which a key absent from (or null in) the config falls back to.
_CROP_224 = {"do_center_crop": True, "crop_size": _SQUARE_224}
_PROCESSORS: dict[str, dict[str, Any]] = {
    "ViTImageProcessor": _defaults(2, _HALF, _SQUARE_224),
    "CLIPImageProcessor": _defaults(3, _CLIP_MEAN, {"shortest_edge": 224}, default_to_square=False, **_CROP_224),
    "SiglipImageProcessor": _defaults(3, _HALF, _SQUARE_224, default_to_square=False),
    "DeiTImageProcessor": _defaults(3, _HALF, {"height": 256, "width": 256}, **_CROP_224),
    "ConvNextImageProcessor": _defaults(3, _HALF, {"shortest_edge": 384}, default_to_square=False,
                                        crop_pct=224 / 256),
    "BitImageProcessor": _defaults(3, _CLIP_MEAN, {"shortest_edge": 224}, default_to_square=False, **_CROP_224),
}
_BASE_DEFAULTS: dict[str, Any] = {"default_to_square": True, "rescale_factor": 1 / 255}
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}  # Pillow's codes
_CONVNEXT_WARP_FROM = 384  # ConvNeXT: a shortest_edge this big warps to a square instead of resize-and-crop


@dataclass(frozen=True, slots=True)
class ImagePreprocessor:
    """The steps of one model's preprocessing, in transformers' order; None skips a step."""

    processor: str  # the slow processor this computes, e.g. "CLIPImageProcessor"
    size: Size | None  # resize target; None: do_resize false
    resample: int  # Pillow filter code (2 bilinear, 3 bicubic...)
    crop_pct: float | None  # ConvNeXT's resize rule (shortest_edge / crop_pct, then crop); None: others
    crop: tuple[int, int] | None  # (height, width) of the center crop; None: do_center_crop false
    rescale_factor: float | None  # None: do_rescale false
    mean: tuple[float, float, float] | None  # None (with std): do_normalize false
    std: tuple[float, float, float] | None
    _table: np.ndarray = field(init=False, repr=False, compare=False)  # (3, 256) float32: uint8 -> output

    def __post_init__(self) -> None:
        values = np.arange(256, dtype=np.float64)
        # transformers' rescale: float64 product, then float32; normalize: float32 throughout
        scaled = (values * self.rescale_factor if self.rescale_factor is not None else values).astype(np.float32)
        table = np.broadcast_to(scaled, (3, 256))
        if self.mean is not None and self.std is not None:
            mean, std = np.array(self.mean, np.float32)[:, None], np.array(self.std, np.float32)[:, None]
            table = (table - mean) / std
        object.__setattr__(self, "_table", np.ascontiguousarray(table, dtype=np.float32))

    @classmethod
    def from_directory(cls, model_dir: Path) -> ImagePreprocessor:
        """What ``model_dir/preprocessor_config.json`` describes; EngineStartError when it cannot be followed."""
        try:
            import PIL  # noqa: F401 - the images extra
        except ImportError:
            raise EngineStartError("image models need Pillow: pip install 'sluice[images]'") from None
        path = model_dir / "preprocessor_config.json"
        if not path.is_file():
            raise EngineStartError(f"{path} not found: an image model's directory needs the "
                                   "preprocessor_config.json that says how to prepare its images")
        return cls.from_config(read_json(path), str(path))

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str) -> ImagePreprocessor:
        """The preprocessing a ``preprocessor_config.json``'s content describes (``source`` names it)."""
        processor = _processor_name(config, source)
        if config.get("do_pad"):
            raise EngineStartError(f"{source}: do_pad: true (padding) is not supported")
        # null means the processor's default, as in transformers
        settings = {**_BASE_DEFAULTS, **_PROCESSORS[processor], **{k: v for k, v in config.items() if v is not None}}
        if processor == "CLIPImageProcessor" and settings.get("use_square_size"):
            settings["size"] = _SQUARE_224  # CLIP's legacy flag: a square of its default shortest_edge
        size = resample = crop_pct = None
        if settings.get("do_resize"):
            size = read_size(settings["size"], bool(settings["default_to_square"]), "size", source)
            resample = settings["resample"]
            if isinstance(resample, bool) or resample not in _RESAMPLE:
                raise EngineStartError(f"{source}: resample must be one of Pillow's filter codes {_RESAMPLE}, "
                                       f"got {resample!r}")
            if processor == "ConvNextImageProcessor":
                crop_pct = _number(settings["crop_pct"], "crop_pct", source, positive=True)
                if size.shortest_edge is None:
                    raise EngineStartError(f"{source}: size of ConvNextImageProcessor must give shortest_edge, "
                                           f"got {settings['size']!r}")
        crop = None
        if settings.get("do_center_crop"):
            crop_size = read_size(settings.get("crop_size"), True, "crop_size", source)
            if crop_size.height is None or crop_size.width is None:
                raise EngineStartError(f"{source}: crop_size must give height and width, got "
                                       f"{settings.get('crop_size')!r}")
            crop = (crop_size.height, crop_size.width)
        rescale = _number(settings["rescale_factor"], "rescale_factor", source) if settings.get("do_rescale") else None
        mean = std = None
        if settings.get("do_normalize"):
            mean = _channels(settings.get("image_mean"), "image_mean", source, nonzero=False)
            std = _channels(settings.get("image_std"), "image_std", source, nonzero=True)
        return cls(processor=processor, size=size, resample=resample if resample is not None else 2,
                   crop_pct=crop_pct, crop=crop, rescale_factor=rescale, mean=mean, std=std)

    @property
    def output_size(self) -> tuple[int, int] | None:
        """(height, width) of every output when fixed (a center crop, a resize to height and width, ConvNeXT),
        None when it follows the image's aspect ratio."""
        size = self.size
        if self.crop is not None or size is None:
            return self.crop
        if self.crop_pct is not None and size.shortest_edge is not None:
            return size.shortest_edge, size.shortest_edge
        return (size.height, size.width) if size.height is not None and size.width is not None else None

    def __call__(self, image: Image.Image) -> np.ndarray:
        """An RGB image -> (3, height, width) float32. RecordError: see the module docstring."""
        return self.values(self.pixels(image)[None])[0]

    def pixels(self, image: Image.Image) -> np.ndarray:
        """The resize and crop alone: an RGB image -> (height, width, 3) uint8, a quarter of the float values'
        memory while it waits for its batch. RecordError: see the module docstring."""
        if image.mode != "RGB":
            raise ValueError(f"ImagePreprocessor takes RGB images (decode_image's), got mode {image.mode}")
        if self.size is None:
            pixels: np.ndarray = np.asarray(image)  # (H, W, 3) uint8
        else:
            (height, width), then_crop = self._resize_plan(image.height, image.width)
            if height < 1 or width < 1 or height * width > MAX_RESIZED_PIXELS:
                raise RecordError(f"the {image.width}x{image.height} image would resize to {width}x{height} "
                                  f"for the model (at most {MAX_RESIZED_PIXELS} pixels, at least 1x1)")
            pixels = np.asarray(image.resize((width, height), resample=self.resample))
            if then_crop is not None:
                pixels = _center_crop(pixels, then_crop)
        if self.crop is not None:
            pixels = _center_crop(pixels, self.crop)
        return pixels

    def values(self, pixels: np.ndarray) -> np.ndarray:
        """Rescale and normalize a batch of :meth:`pixels` outputs of one size: (batch, height, width, 3) uint8
        -> (batch, 3, height, width) float32, the model's ``pixel_values``."""
        out = np.empty((pixels.shape[0], 3, *pixels.shape[1:3]), dtype=np.float32)
        for channel in range(3):
            np.take(self._table[channel], pixels[..., channel], out=out[:, channel], mode="clip")
        return out

    def _resize_plan(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int] | None]:
        """The resize target and, for ConvNeXT below 384, the square crop that follows it."""
        assert self.size is not None
        edge = self.size.shortest_edge
        if self.crop_pct is None or edge is None:
            return self.size.target(height, width), None
        if edge >= _CONVNEXT_WARP_FROM:
            return (edge, edge), None
        return shortest_edge_target(height, width, int(edge / self.crop_pct)), (edge, edge)


def _processor_name(config: dict[str, Any], source: str) -> str:
    supported = ", ".join(_PROCESSORS)
    if "AutoImageProcessor" in (config.get("auto_map") or {}):
        raise EngineStartError(f"{source}: the model's image processor is custom code (auto_map); supported "
                               f"processors: {supported}")
    name = config.get("image_processor_type")
    if name is None and isinstance(config.get("feature_extractor_type"), str):
        name = config["feature_extractor_type"].replace("FeatureExtractor", "ImageProcessor")
    if not isinstance(name, str):
        raise EngineStartError(f"{source}: image_processor_type is missing; supported processors: {supported}")
    base = name.removesuffix("Fast").removesuffix("Pil")
    if base not in _PROCESSORS:
        raise EngineStartError(f"{source}: image_processor_type {name} is not supported; supported processors: "
                               f"{supported} (or their Fast versions)")
    return base


def _number(value: Any, key: str, source: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value <= 0):
        raise EngineStartError(f"{source}: {key} must be a {'positive ' if positive else ''}number, got {value!r}")
    return value


def _channels(value: Any, key: str, source: str, nonzero: bool) -> tuple[float, float, float]:
    """A per-channel mean or std: three numbers, or one for all three."""
    values = [value] * 3 if isinstance(value, (int, float)) else value
    if (not isinstance(values, list | tuple) or len(values) != 3
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) or (nonzero and v == 0) for v in values)):
        raise EngineStartError(f"{source}: {key} must be three {'non-zero ' if nonzero else ''}numbers "
                               f"(one per RGB channel), got {value!r}")
    return values[0], values[1], values[2]


def _center_crop(pixels: np.ndarray, crop: tuple[int, int]) -> np.ndarray:
    """(H, W, C) -> (crop height, crop width, C): the centre, floor offsets; zero-padded around a smaller image
    (the image then sits at offset ceil(missing / 2)), as transformers' center_crop."""
    (rows, out_rows), (cols, out_cols) = _span(pixels.shape[0], crop[0]), _span(pixels.shape[1], crop[1])
    if crop[0] <= pixels.shape[0] and crop[1] <= pixels.shape[1]:
        return pixels[rows, cols].copy()  # not a view: a waiting item must not keep the whole resized image
    out = np.zeros((crop[0], crop[1], pixels.shape[2]), dtype=pixels.dtype)
    out[out_rows, out_cols] = pixels[rows, cols]
    return out


def _span(length: int, crop: int) -> tuple[slice, slice]:
    """The source and destination slices of one axis of a center crop."""
    if length >= crop:
        start = (length - crop) // 2
        return slice(start, start + crop), slice(0, crop)
    start = (crop - length + 1) // 2
    return slice(0, length), slice(start, start + length)
