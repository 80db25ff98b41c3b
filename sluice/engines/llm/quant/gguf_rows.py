"""A GGUF quantised matrix carried from the file to the model as its raw rows, read only when converted.

Each row of a GGUF quantised matrix is its own run of blocks, so row operations -- llama.cpp's Q/K row
permutation, concatenating q/k/v (gate/up) rows into one fused projection -- are exact on the raw bytes.
:class:`GGUFRows` records them lazily: its parts are row ranges of the file (``FileRows``), reordered rows
of another part (``PermutedRows``) or bytes in memory (``MemoryRows``), and :meth:`GGUFRows.rows` reads the
bytes of a row range only when asked. The converters ask for a few thousand rows at a time, so loading
never maps the whole file nor holds a second copy of it: the peak is the converted weights plus one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from sluice.engines.llm.quant.gguf_blocks import dequantize


class RowPart(Protocol):
    @property
    def num_rows(self) -> int: ...

    def read(self, start: int, stop: int) -> torch.Tensor:  # (stop - start, row_bytes) uint8
        ...


@dataclass(frozen=True, slots=True)
class FileRows:
    """Rows of one tensor in a file: ``num_rows`` rows of ``row_bytes`` from byte ``offset``."""

    path: Path
    offset: int
    num_rows: int
    row_bytes: int

    def read(self, start: int, stop: int) -> torch.Tensor:
        count = (stop - start) * self.row_bytes
        data = np.fromfile(self.path, dtype=np.uint8, count=count, offset=self.offset + start * self.row_bytes)
        if data.size != count:
            raise ValueError(f"{self.path.name} is truncated: a tensor's rows end past the end of the file")
        return torch.from_numpy(data).view(stop - start, self.row_bytes)


@dataclass(frozen=True, slots=True)
class MemoryRows:
    data: torch.Tensor  # (rows, row_bytes) uint8

    @property
    def num_rows(self) -> int:
        return int(self.data.shape[0])

    def read(self, start: int, stop: int) -> torch.Tensor:
        return self.data[start:stop]


@dataclass(frozen=True, slots=True)
class PermutedRows:
    """Row ``i`` is row ``order[i]`` of ``base`` (read whole: used for a projection's Q/K rows)."""

    base: RowPart
    order: torch.Tensor  # (num_rows,) int64

    @property
    def num_rows(self) -> int:
        return int(self.order.numel())

    def read(self, start: int, stop: int) -> torch.Tensor:
        return self.base.read(0, self.base.num_rows).index_select(0, self.order[start:stop])


@dataclass(frozen=True, slots=True)
class GGUFRows:
    """A quantised matrix ``shape`` ``(rows, cols)`` of ggml type ``tensor_type``, as the rows of ``parts``
    one after the other."""

    tensor_type: int  # ggml type id (gguf.GGMLQuantizationType)
    shape: tuple[int, int]
    parts: tuple[RowPart, ...]

    @classmethod
    def in_memory(cls, tensor_type: int, cols: int, data: torch.Tensor) -> GGUFRows:
        return cls(tensor_type, (int(data.shape[0]), cols), (MemoryRows(data),))

    @property
    def num_rows(self) -> int:
        return self.shape[0]

    @property
    def type_name(self) -> str:
        from gguf.constants import GGMLQuantizationType

        return GGMLQuantizationType(self.tensor_type).name

    def read(self, start: int, stop: int) -> torch.Tensor:
        """Raw rows ``start:stop`` ``(n, row_bytes)`` uint8 (a GGUFRows is itself a part of another)."""
        pieces, base = [], 0
        for part in self.parts:
            lo, hi = max(start, base), min(stop, base + part.num_rows)
            if lo < hi:
                pieces.append(part.read(lo - base, hi - base))
            base += part.num_rows
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def permuted(self, order: torch.Tensor) -> GGUFRows:
        """Row ``i`` is row ``order[i]`` of this matrix (nothing read yet)."""
        return GGUFRows(self.tensor_type, (int(order.numel()), self.shape[1]), (PermutedRows(self, order),))

    def loaded(self) -> GGUFRows:
        """The same rows held in memory (read once), e.g. an embedding table that is looked up every step."""
        return GGUFRows.in_memory(self.tensor_type, self.shape[1], self.read(0, self.num_rows).clone())

    def to_float(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows ``start:stop`` dequantised to float32 ``(n, cols)``."""
        return dequantize(self.tensor_type, self.read(start, self.num_rows if stop is None else min(stop, self.num_rows)),
                          self.shape[1])  # fmt: skip

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (int64, any shape) dequantised, float32 ``(*ids.shape, cols)``: embedding lookups.
        Fast when the rows are in memory (:meth:`loaded`)."""
        flat = ids.reshape(-1)
        if not flat.numel():
            return torch.empty(*ids.shape, self.shape[1])
        if len(self.parts) == 1 and isinstance(self.parts[0], MemoryRows):
            raw = self.parts[0].data.index_select(0, flat)
        else:
            raw = self.read(0, self.num_rows).index_select(0, flat)
        return dequantize(self.tensor_type, raw, self.shape[1]).view(*ids.shape, self.shape[1])


def cat_rows(parts: list[GGUFRows]) -> GGUFRows:
    """Rows of ``parts`` one after the other (all of one type and width; nothing read)."""
    first = parts[0]
    if any(p.tensor_type != first.tensor_type or p.shape[1] != first.shape[1] for p in parts):
        raise ValueError("cat_rows needs parts of one GGUF type and width")
    return GGUFRows(first.tensor_type, (sum(p.shape[0] for p in parts), first.shape[1]), tuple(parts))


@dataclass(frozen=True)
class ExpertRows:
    """A GGUF tensor of stacked expert matrices ``(experts, rows, cols)`` (llama.cpp's ``ffn_*_exps``): each
    expert's matrix its own :class:`GGUFRows`, read only when converted."""

    experts: tuple[GGUFRows, ...]

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self.experts), *self.experts[0].shape)

    @property
    def tensor_type(self) -> int:
        return self.experts[0].tensor_type

    def to_float(self) -> torch.Tensor:
        """Every expert dequantised, float32 ``(experts, rows, cols)``."""
        return torch.stack([expert.to_float() for expert in self.experts])


def cat_expert_rows(parts: list[ExpertRows]) -> ExpertRows:
    """Each expert's rows of ``parts`` one after the other (gate then up: one fused projection per expert)."""
    return ExpertRows(tuple(cat_rows([p.experts[e] for p in parts]) for e in range(len(parts[0].experts))))


Loaded = torch.Tensor | GGUFRows | ExpertRows  # a checkpoint tensor as the loader hands it to the model
