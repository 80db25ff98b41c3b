"""GGUFRows: lazy row ranges of a file, permutations and concatenations read back as the bytes they name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sluice.engines.llm.quant.gguf_rows import FileRows, GGUFRows, MemoryRows, cat_rows

Q8_0 = 8  # 34 bytes per 32 values


def file_with_rows(tmp_path: Path, rows: int, row_bytes: int, offset: int) -> tuple[Path, np.ndarray]:
    data = np.random.default_rng(rows).integers(0, 256, (rows, row_bytes), dtype=np.uint8)
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\xaa" * offset + data.tobytes() + b"\xbb" * 5)
    return path, data


def test_file_rows_read_the_named_rows_only(tmp_path: Path) -> None:
    path, data = file_with_rows(tmp_path, 10, 34, offset=7)
    rows = GGUFRows(Q8_0, (10, 32), (FileRows(path, 7, 10, 34),))
    assert torch.equal(rows.read(3, 8), torch.from_numpy(data[3:8]))
    assert torch.equal(rows.loaded().read(0, 10), torch.from_numpy(data))
    with pytest.raises(ValueError, match="truncated"):
        FileRows(path, 7, 11, 34).read(0, 11)  # one row past the data runs into the 5 trailing bytes


def test_permuted_and_concatenated_rows(tmp_path: Path) -> None:
    path, data = file_with_rows(tmp_path, 6, 34, offset=0)
    a = GGUFRows(Q8_0, (6, 32), (FileRows(path, 0, 6, 34),))
    order = torch.tensor([5, 0, 3, 1, 4, 2])
    b = GGUFRows.in_memory(Q8_0, 32, torch.arange(4 * 34, dtype=torch.uint8).view(4, 34))
    fused = cat_rows([a.permuted(order), b])
    assert fused.shape == (10, 32)
    want = torch.cat([torch.from_numpy(data)[order], b.read(0, 4)])
    for start, stop in [(0, 10), (4, 7), (6, 10), (2, 3)]:  # within a part and across the boundary
        assert torch.equal(fused.read(start, stop), want[start:stop])
    assert torch.equal(fused.to_float(4, 7), fused.loaded().to_float(4, 7))
    ids = torch.tensor([[9, 0], [3, 3]])
    assert torch.equal(fused.gather(ids), fused.to_float()[ids])  # file-backed and in-memory alike
    assert torch.equal(fused.loaded().gather(ids), fused.to_float()[ids])


def test_cat_rows_refuses_mixed_types() -> None:
    a = GGUFRows(Q8_0, (1, 32), (MemoryRows(torch.zeros(1, 34, dtype=torch.uint8)),))
    b = GGUFRows(2, (1, 32), (MemoryRows(torch.zeros(1, 18, dtype=torch.uint8)),))
    with pytest.raises(ValueError, match="one GGUF type"):
        cat_rows([a, b])
