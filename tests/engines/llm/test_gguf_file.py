"""Sluice's GGUF reader against the ``gguf`` package's ``GGUFReader``: same metadata, same tensor values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sluice.engines.llm.loading.gguf_file import GGUFFile


@pytest.mark.slow
def test_reader_matches_the_gguf_package_on_a_quantised_model(smollm2_gguf: Path) -> None:
    from gguf import GGUFReader

    ours, theirs = GGUFFile(smollm2_gguf), GGUFReader(str(smollm2_gguf))
    expected = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata == expected
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    kinds = {int(t.tensor_type) for t in ours.tensors}
    assert len(kinds) > 1  # quantised and plain tensors both
    from gguf.quants import dequantize

    for mine, ref in list(zip(ours.tensors, theirs.tensors, strict=True))[:12]:
        assert mine.shape == tuple(int(d) for d in reversed(ref.shape))
        np.testing.assert_array_equal(mine.to_float32(), dequantize(ref.data, ref.tensor_type).reshape(mine.shape))


def test_a_file_that_is_not_gguf_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf file at all" * 4)
    with pytest.raises(ValueError, match="is not a GGUF file"):
        GGUFFile(bad)
