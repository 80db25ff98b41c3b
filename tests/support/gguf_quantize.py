"""Quantised GGUF files for tests: a float GGUF (llama.cpp's converter's output) copied with its matrices
re-quantised by the ``gguf`` package's own quantisers (bit-exact with ggml's reference ``quantize_row_*``
for Q4_0, Q4_1 and Q8_0), metadata and every other tensor unchanged.

llama.cpp's ``llama-quantize`` needs a C++ build (minutes) and its converter writes only F32 / F16 / BF16 /
Q8_0, so this is how a test gets Q4 files from tiny random models: an independent writer of the format,
whose dequantisation (the ``gguf`` package's) is the reference the engine is compared against.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def requantize(src: Path, dst: Path, qtype_name: str, overrides: dict[str, str] | None = None) -> Path:
    """Copy ``src`` to ``dst`` with every 2-D float tensor (and stacked 3-D experts) quantised to ``qtype_name`` (``"Q4_0"``...), or to
    ``overrides[part]`` for tensors whose name contains ``part`` (``{"token_embd": "Q8_0"}``, ``"F32"`` to
    keep one as it is). Returns ``dst``."""
    import gguf
    from gguf.quants import quantize

    def qtype_of(name: str) -> gguf.GGMLQuantizationType:
        chosen = next((q for part, q in (overrides or {}).items() if part in name), qtype_name)
        return gguf.GGMLQuantizationType[chosen]

    reader = gguf.GGUFReader(str(src))
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for t in reader.tensors:
        data = np.asarray(t.data)
        qtype = qtype_of(t.name)
        if t.tensor_type == gguf.GGMLQuantizationType.F32 and data.ndim in (2, 3) and qtype != t.tensor_type:
            writer.add_tensor(t.name, quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
