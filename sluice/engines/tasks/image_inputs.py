"""Record values to model-ready pixels, and pixels to batches: shared by the image tasks.

A record carries its image as ``engine.image.source`` says: ``bytes`` (the whole value with
``codec.format: raw``, or an Avro / Protobuf ``bytes`` field), ``base64`` (a string; a ``data:`` URL too), or
``location`` (a path or URL, fetched by :class:`sluice.images.fetch.Fetcher` with bounded concurrency, a
timeout and a size cap). The bytes are decoded (:func:`sluice.images.decode.decode_image`: EXIF orientation,
RGB, refused bombs and unknown formats), resized and cropped as the model's own ``preprocessor_config.json``
says (:class:`sluice.images.preprocess.ImagePreprocessor`), all on the intake thread and its pools while the
engine runs the previous batch. A prepared image waits for its batch as uint8 pixels (a quarter of the float
values' memory); :meth:`ImageInputs.collate` rescales and normalises a batch at once.

Guarantees: :meth:`ImageInputs.prepare_each` gives one entry per value, in order, and never raises for a bad
value: a value that fails is its :class:`RecordError` in place, whose ``stage`` says where (``fetch``,
``decode-image``, or ``prepare`` for a value of the wrong kind). A batch's fetches run at once, so a slow store
costs one round trip per batch, not one per record.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sluice.engines.engine_contract import EngineStartError, RecordError
from sluice.images.decode import DecodeLimits, decode_image
from sluice.images.fetch import Fetcher, FetchLimits
from sluice.images.preprocess import ImagePreprocessor

ImageSource = Literal["bytes", "base64", "location"]
Scheme = Literal["file", "http", "https", "s3", "gs", "az"]
_DEFAULT_DECODE = DecodeLimits()
_DEFAULT_FETCH = FetchLimits()


class ImageOptions(BaseModel):
    """``engine.image``: where a record's image is, and the limits that keep a hostile one harmless."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    source: ImageSource = "bytes"
    """`bytes`: the value (with `codec.format: raw`) or an Avro / Protobuf bytes field is the image file;
    `base64`: a base64 string (a `data:` URL too); `location`: a path (relative to the pipeline file) or a URL
    (http, https; s3, gs, az through fsspec) to fetch."""
    max_bytes: int = Field(default=_DEFAULT_FETCH.max_bytes, ge=1)
    """Largest image file accepted, in bytes (a larger one is dead-lettered). A raw record's whole value is
    bounded by `codec.max_record_bytes` (4 MiB by default) before this."""
    max_pixels: int = Field(default=_DEFAULT_DECODE.max_pixels, ge=1)
    """Largest image accepted, in pixels (width x height), read from the file's header before decoding:
    decompression bombs are dead-lettered unread."""
    formats: list[str] = Field(default_factory=lambda: list(_DEFAULT_DECODE.formats), min_length=1)
    """Image formats accepted (Pillow's names)."""
    fetch_timeout_s: float = Field(default=_DEFAULT_FETCH.timeout_s, gt=0)
    """`source: location`: the longest one fetch may take, connect to last byte."""
    fetch_concurrency: int = Field(default=32, ge=1, le=256)
    """`source: location`: fetches in flight at once (a batch's fetches in one round trip when it is at least
    `batching.max_batch_size`)."""
    schemes: list[Scheme] = Field(default_factory=lambda: list(get_args(Scheme)), min_length=1)
    """`source: location`: the kinds of location a record may name (`file`: a path on this machine)."""
    local_roots: list[str] = Field(default_factory=list)
    """`source: location`: read local files only inside these folders (relative to the pipeline file); empty:
    any file the process can read. Whoever writes the input records chooses what is read: restrict `schemes`
    and `local_roots` when they are not trusted."""


@dataclass(frozen=True, slots=True)
class ImageItem:
    """One record's image, ready for the model."""

    pixels: np.ndarray  # (height, width, 3) uint8, resized and cropped: rescaled and normalised per batch


class ImageInputs:
    """One model's image inputs; see the module docstring. Thread-safe for one intake thread."""

    def __init__(self, options: ImageOptions, model_dir: Path, pipeline_dir: Path, task: str) -> None:
        self.task = task
        self.source = options.source
        try:
            import PIL  # noqa: F401 - checked here for a clear message
        except ImportError:
            raise EngineStartError(f"task {task} decodes images with Pillow: pip install 'sluice[images]'") from None
        self.preprocessor = ImagePreprocessor.from_directory(model_dir)
        try:
            self.limits = DecodeLimits(max_pixels=options.max_pixels,
                                       formats=tuple(f.upper() for f in options.formats))
        except ValueError as err:
            raise EngineStartError(f"engine.image: {err}") from None
        self.max_bytes = options.max_bytes
        self.fetch_concurrency = options.fetch_concurrency
        self.fetcher: Fetcher | None = None
        if options.source == "location":
            roots = tuple((pipeline_dir / root).resolve() for root in options.local_roots)
            self.fetcher = Fetcher(FetchLimits(timeout_s=options.fetch_timeout_s, max_bytes=options.max_bytes,
                                               max_concurrency=options.fetch_concurrency,
                                               schemes=tuple(options.schemes), local_roots=roots), pipeline_dir)
        self._decoders = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)),
                                            thread_name_prefix="sluice-decode")

    def prepare_each(self, values: Sequence[Any]) -> list[ImageItem | RecordError]:
        """Each value's image item, or the RecordError that value alone fails with."""
        given = [self._given(value) for value in values]
        data: list[bytes | RecordError] = [d if not isinstance(d, str) else b"" for d in given]
        if self.fetcher is not None:
            locations = [(i, d) for i, d in enumerate(given) if isinstance(d, str)]
            fetched = self.fetcher.fetch([location for _, location in locations])
            for (i, _), result in zip(locations, fetched, strict=True):
                data[i] = result
        if len(data) == 1:
            return [self._item(data[0])]
        return list(self._decoders.map(self._item, data))

    def collate(self, items: Sequence[ImageItem]) -> list[tuple[list[int], np.ndarray]]:
        """Items grouped by size (one group for fixed-size models), each group's indices and its
        ``pixel_values`` (group, 3, height, width) float32: one run per group."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(item.pixels.shape, []).append(index)
        return [(rows, self.preprocessor.values(np.stack([items[i].pixels for i in rows])))
                for rows in groups.values()]

    def warmup_item(self) -> ImageItem:
        from PIL import Image

        image = Image.new("RGB", (self.preprocessor_side(), self.preprocessor_side()), (127, 64, 200))
        return ImageItem(self.preprocessor.pixels(image))

    def preprocessor_side(self) -> int:
        size = self.preprocessor.output_size
        return max(size) if size else 224

    def records_per_poll(self) -> int | None:
        """Fetching: a poll is one round of fetches, so a slow store holds the poll loop one timeout at most."""
        return self.fetch_concurrency if self.fetcher is not None else None

    def close(self) -> None:
        if self.fetcher is not None:
            self.fetcher.close()
        self._decoders.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------------------ internals

    def _given(self, value: Any) -> bytes | str | RecordError:
        """A value as image bytes (``bytes`` / ``base64``) or as the location to fetch them from."""
        if self.source == "bytes":
            if isinstance(value, (bytes, bytearray, memoryview)):
                return bytes(value)
            return RecordError(f"task {self.task} expects image bytes, got {type(value).__name__}"
                               f"{_hint(value)}")
        if isinstance(value, (bytes, bytearray)):
            try:
                value = bytes(value).decode("ascii")
            except UnicodeDecodeError:
                return RecordError(f"task {self.task} expects a {self.source} string, got binary bytes; "
                                   "image files as bytes need engine.image.source: bytes")
        if not isinstance(value, str):
            return RecordError(f"task {self.task} expects a {self.source} string, got {type(value).__name__}")
        if self.source == "location":
            return value
        return _from_base64(value, self.max_bytes)

    def _item(self, data: bytes | RecordError) -> ImageItem | RecordError:
        if isinstance(data, RecordError):
            return data
        if len(data) > self.max_bytes:
            return RecordError(f"the image is {len(data)} bytes, more than engine.image.max_bytes "
                               f"({self.max_bytes})", stage="decode-image")
        try:
            return ImageItem(self.preprocessor.pixels(decode_image(data, self.limits)))
        except RecordError as err:
            return err
        except Exception as err:  # a codec's own failure on a file that passed the checks
            return RecordError(f"cannot decode the image: {type(err).__name__}: {err}", stage="decode-image")


def raise_first_failure(items: list[Any]) -> list[Any]:
    """``items`` of :meth:`ImageInputs.prepare_each`, or the first failure among them raised (a task's
    ``prepare``, which raises rather than give errors in place)."""
    for item in items:
        if isinstance(item, Exception):
            raise item
    return items


def _hint(value: Any) -> str:
    if isinstance(value, str):
        return ("; a base64 string needs engine.image.source: base64, a path or URL engine.image.source: location, "
                "and a JSON record's field codec.input_field")
    if isinstance(value, dict):
        return "; point codec.input_field at the field holding the image"
    return ""


def _from_base64(text: str, max_bytes: int) -> bytes | RecordError:
    """Standard or URL-safe base64, wrapped in lines or not, padded or not (as encoders write it); a ``data:``
    URL's payload."""
    if text[:5].lower() == "data:":  # data:image/png;base64,....
        header, _, text = text.partition(",")
        if not header.lower().endswith(";base64"):
            return RecordError("a data: URL must be base64-encoded (data:<type>;base64,...)", stage="decode-image")
    if len(text) > (max_bytes + 2) // 3 * 4 * 81 // 80 + 4:  # base64 of max_bytes, with line breaks
        return RecordError(f"the base64 image is larger than engine.image.max_bytes ({max_bytes})",
                           stage="decode-image")
    compact = "".join(text.split())
    if "-" in compact or "_" in compact:
        compact = compact.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)
    except (binascii.Error, ValueError):
        return RecordError("the image field is not base64 (expected a base64 string of the image file, or a "
                           "data:image/...;base64, URL)", stage="decode-image")


def check_pixel_input(inputs: Sequence[str], model_name: str, task: str) -> None:
    """EngineStartError unless the model takes ``pixel_values``."""
    if "pixel_values" not in inputs:
        raise EngineStartError(f"model {model_name} takes inputs {list(inputs)}; task {task} feeds pixel_values "
                               "(an image model's input)")
