"""Image file bytes to an upright RGB image, refusing what is not a safe image of an accepted format.

:func:`decode_image` loads an image as transformers' pipelines do (``transformers.image_utils.load_image``):
the EXIF orientation applied (``PIL.ImageOps.exif_transpose``), then ``convert("RGB")`` (alpha dropped;
L, P, CMYK, I;16... converted by Pillow). A multi-frame image (GIF, APNG, multipage TIFF) gives its first
frame.

Guarantees:

* Every failure is a :class:`~sluice.engines.engine_contract.RecordError` with ``stage="decode-image"`` and a one-line
  reason a user understands: empty input, not an image in an accepted format, a format not accepted, too
  many pixels, truncated or corrupt data. Nothing else escapes, and Pillow's ``DecompressionBombWarning``
  is never printed.
* Bounded work: only the formats in :attr:`DecodeLimits.formats` are parsed at all, and the pixel count is
  checked from the header before any pixel is decoded, so a decompression bomb costs a header read. Pillow's
  own hard limit (``2 * PIL.Image.MAX_IMAGE_PIXELS``, 179 M pixels by default) also holds when
  ``max_pixels`` is larger.
* No global state is changed: ``ImageFile.LOAD_TRUNCATED_IMAGES`` and ``Image.MAX_IMAGE_PIXELS`` are left
  alone. Pillow's bomb warning is silenced with ``warnings.catch_warnings``, which swaps the process's
  warning filters; one module lock keeps this module's threads from swapping them at once.
* Safe to call from several threads at once. Pillow is imported on first use (the ``images`` extra), so
  :class:`DecodeLimits` can be built without it.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from io import BytesIO
from typing import TYPE_CHECKING

from sluice.engines.engine_contract import RecordError, first_line

if TYPE_CHECKING:
    from PIL import Image

STAGE = "decode-image"
# The defaults: Pillow built-ins (no check needed), and what a refused file is identified as for its message.
_COMMON_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
# warnings.catch_warnings swaps process-global filters: one thread of this module at a time does it.
_WARNINGS_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """What :func:`decode_image` accepts. ValueError at construction for an impossible value."""

    max_pixels: int = 89_478_485  # width x height refused above this (bombs); Pillow's own warning threshold
    formats: tuple[str, ...] = _COMMON_FORMATS  # Pillow's format names accepted, upper case

    def __post_init__(self) -> None:
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be at least 1, got {self.max_pixels}")
        if not self.formats:
            raise ValueError("formats must name at least one image format")
        rare = [name for name in self.formats if name not in _COMMON_FORMATS]
        known = _known_formats() if rare else frozenset()  # Pillow is imported only to check a rare name
        unknown = [name for name in rare if name != name.upper() or (known and name not in known)]
        if unknown:
            raise ValueError(f"unknown image formats {unknown}: Pillow's names are upper case, "
                             f"e.g. {', '.join(_COMMON_FORMATS)}")


def decode_image(data: bytes, limits: DecodeLimits) -> Image.Image:
    """Image file bytes -> an upright RGB PIL image (see the module docstring). RecordError on any failure."""
    from PIL import Image, ImageOps

    if not data:
        raise RecordError("the image is empty (0 bytes)", stage=STAGE)
    image = _open(data, limits)
    width, height = image.size
    pixels = width * height
    if pixels > limits.max_pixels:
        raise RecordError(f"the image is {width}x{height} = {pixels} pixels, more than the limit of "
                          f"{limits.max_pixels} (checked before decoding)", stage=STAGE)
    try:
        if Image.MAX_IMAGE_PIXELS is not None and pixels > Image.MAX_IMAGE_PIXELS:
            with _bomb_warnings_silenced():  # a limit set above Pillow's: it would warn while loading
                image.load()
        else:
            image.load()  # the first frame of a multi-frame image
    except Image.DecompressionBombError as err:
        raise RecordError(f"the image has too many pixels to decode safely ({first_line(err)})",
                          stage=STAGE) from None
    except Exception as err:  # a codec's error on hostile data: OSError, SyntaxError, ValueError, EOFError...
        raise RecordError(f"the image data is truncated or corrupt ({type(err).__name__}: {first_line(err)})",
                          stage=STAGE) from None
    try:
        ImageOps.exif_transpose(image, in_place=True)
    except Exception as err:  # a malformed EXIF block
        raise RecordError(f"the image's EXIF orientation cannot be read ({type(err).__name__}: "
                          f"{first_line(err)})", stage=STAGE) from None
    try:
        return image.convert("RGB")
    except Exception as err:  # a mode Pillow cannot convert (e.g. some float images)
        raise RecordError(f"the image's {image.mode} pixels cannot be converted to RGB ({first_line(err)})",
                          stage=STAGE) from None


def _open(data: bytes, limits: DecodeLimits) -> Image.Image:
    """The image with its header read and no pixel decoded, parsed by the accepted formats' readers only."""
    from PIL import Image

    try:
        with _bomb_warnings_silenced():
            return Image.open(BytesIO(data), formats=limits.formats)
    except Image.UnidentifiedImageError:
        pass
    except Image.DecompressionBombError as err:
        raise RecordError(f"the image has too many pixels to decode safely ({first_line(err)})",
                          stage=STAGE) from None
    except Exception as err:  # a reader that recognised the file and then failed on its header
        raise RecordError(f"the image data is truncated or corrupt ({type(err).__name__}: {first_line(err)})",
                          stage=STAGE) from None
    accepted = ", ".join(limits.formats)
    other = _identify(data, [name for name in _COMMON_FORMATS if name not in limits.formats])
    if other is not None:
        raise RecordError(f"the image is a {other} file; the accepted formats are {accepted}", stage=STAGE)
    raise RecordError(f"the data is not an image in an accepted format ({accepted})", stage=STAGE)


def _identify(data: bytes, formats: list[str]) -> str | None:
    """The name of the common format among ``formats`` the data is in (for the message), if any."""
    from PIL import Image

    if not formats:
        return None
    try:
        with _bomb_warnings_silenced():
            return str(Image.open(BytesIO(data), formats=formats).format)
    except Exception:  # not one of them either (or a bomb of one): the generic message says enough
        return None


@contextmanager
def _bomb_warnings_silenced() -> Iterator[None]:
    """Pillow's DecompressionBombWarning ignored (this module checks the size itself)."""
    from PIL import Image

    with _WARNINGS_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


def _known_formats() -> frozenset[str]:
    """Every format Pillow can open here; empty when Pillow is not installed (nothing to check against)."""
    try:
        from PIL import Image
    except ImportError:
        return frozenset()
    Image.init()
    return frozenset(Image.OPEN)
