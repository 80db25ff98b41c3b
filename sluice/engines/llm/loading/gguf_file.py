"""A GGUF file's metadata and tensors, read directly (format v2/v3, little-endian).

The ``gguf`` package's ``GGUFReader`` builds a numpy view per array element, which for a 150k-token
vocabulary (tokens + merges) takes tens of seconds; this reads the key/values in one pass (strings decoded
from a memory map, numeric arrays with ``np.frombuffer``) in well under a second, and exposes each tensor as
a read-only view of the mapped file. Dequantisation of quantised tensors is the ``gguf`` package's.

Layout: magic ``GGUF``, version, tensor count, key/value count; the key/values (typed, arrays nested); the
tensor infos (name, dims innermost first, ggml type, offset); then the data, aligned to
``general.alignment`` (32).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
          12: "<f8"}  # fmt: skip
_STRING, _ARRAY = 8, 9
_DIRECT = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first): (rows, cols) of a projection is (out, in)
    tensor_type: int  # ggml type (gguf.GGMLQuantizationType value)
    data: np.ndarray  # read-only view of the file: elements, or the raw bytes of a quantised tensor
    offset: int  # of the data in the file, in bytes

    @property
    def is_quantized(self) -> bool:
        """Whether ``data`` holds raw quantised blocks (not elements)."""
        return self.tensor_type not in _DIRECT

    def to_float32(self) -> np.ndarray:
        """The values as a float32 array of ``shape`` (dequantised; a copy unless the file holds F32)."""
        if self.tensor_type in _DIRECT:
            return np.asarray(self.data, dtype=np.float32).reshape(self.shape)
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        values = dequantize(self.data, GGMLQuantizationType(self.tensor_type))
        return np.asarray(values, dtype=np.float32).reshape(self.shape)


class GGUFFile:
    """``metadata`` (key -> str / int / float / bool / list) and ``tensors`` of one ``.gguf`` file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._map = np.memmap(self.path, mode="r", dtype=np.uint8)
        self._view = memoryview(self._map)  # type: ignore[arg-type]
        if bytes(self._view[:4]) != b"GGUF":
            raise ValueError(f"{self.path.name} is not a GGUF file (no GGUF magic)")
        try:
            version, num_tensors, num_kv = struct.unpack_from("<IQQ", self._view, 4)
        except struct.error as err:
            raise self._incomplete(err) from None
        if version not in (2, 3):
            raise ValueError(f"{self.path.name}: GGUF version {version} is not supported (2 and 3 are)")
        try:
            self._parse(num_tensors, num_kv)
        except (struct.error, UnicodeDecodeError, ValueError) as err:  # numpy: ValueError past the end
            raise self._incomplete(err) from None

    def _incomplete(self, err: Exception) -> ValueError:
        return ValueError(f"{self.path.name} is not a complete GGUF file ({err}): truncated or corrupt; copy or "
                          "download it again")

    def _parse(self, num_tensors: int, num_kv: int) -> None:
        self._offset = 24
        self.metadata: dict[str, Any] = {}
        for _ in range(num_kv):
            key = self._string()
            (value_type,) = self._unpack("<I")
            self.metadata[key] = self._value(value_type)
        infos = []
        for _ in range(num_tensors):
            name = self._string()
            (num_dims,) = self._unpack("<I")
            dims = self._unpack(f"<{num_dims}Q")
            tensor_type, offset = self._unpack("<IQ")
            infos.append((name, tuple(int(d) for d in reversed(dims)), int(tensor_type), int(offset)))
        alignment = int(self.metadata.get("general.alignment", 32))
        start = -(-self._offset // alignment) * alignment
        self.tensors = [self._tensor(name, shape, kind, start + offset) for name, shape, kind, offset in infos]

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    # ---- parsing -------------------------------------------------------------------------------------

    def _unpack(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from(fmt, self._view, self._offset)
        self._offset += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (length,) = struct.unpack_from("<Q", self._view, self._offset)
        start = self._offset + 8
        self._offset = start + length
        return str(self._view[start : self._offset], "utf-8", errors="replace")

    def _value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self._string()
        if value_type == _ARRAY:
            item_type, count = self._unpack("<IQ")
            if item_type == _STRING:
                return [self._string() for _ in range(count)]
            if item_type == _ARRAY:
                return [self._value(_ARRAY) for _ in range(count)]
            dtype = np.dtype(_NUMPY[item_type])
            values = np.frombuffer(self._view, dtype=dtype, count=count, offset=self._offset)
            self._offset += count * dtype.itemsize
            return values.tolist()
        if value_type not in _NUMPY:
            raise ValueError(f"{self.path.name}: unknown GGUF value type {value_type}")
        dtype = np.dtype(_NUMPY[value_type])
        (value,) = np.frombuffer(self._view, dtype=dtype, count=1, offset=self._offset).tolist()
        self._offset += dtype.itemsize
        return value

    def _tensor(self, name: str, shape: tuple[int, ...], kind: int, offset: int) -> GGUFTensor:
        num_elements = int(np.prod(shape)) if shape else 1
        if kind in _DIRECT:
            data = np.frombuffer(self._view, dtype=_DIRECT[kind], count=num_elements, offset=offset).reshape(shape)
            return GGUFTensor(name, shape, kind, data, offset)
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        row_bytes = shape[-1] // block_size * type_size
        data = np.frombuffer(self._view, dtype=np.uint8, count=num_elements // block_size * type_size,
                             offset=offset).reshape(*shape[:-1], row_bytes)  # fmt: skip
        return GGUFTensor(name, shape, kind, data, offset)
