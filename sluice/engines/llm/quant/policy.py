"""Which form each weight takes on the CPU, per the engine's ``weights`` option, and the conversion.

``weights`` (``EngineConfig.weights``):

* ``fp32``: every weight dequantised to float32 (the reference: greedy parity with HF transformers).
* ``bf16``: projections, LM head and embeddings in bf16.
* ``int8``: all of them int8 per output channel (re-quantised from whatever the checkpoint holds).
* ``int4``: projections int4 per group of 32 (a GGUF Q4_0 / Q4_1 / Q4_K tensor repacked as it is, anything
  else quantised from its values); the LM head and embeddings int8, as llama.cpp's quantiser keeps its
  output matrix at 6-8 bits (the logits are the most sensitive).
* ``auto`` (default): a GGUF's quantisation kept where a kernel exists -- Q4_0 / Q4_1 / Q4_K projections
  repacked to int4; other quantised projections (Q8_0, Q5_*, Q6_K, the 2-3-bit ones) to int8; float
  tensors (F32 / F16 files, HF checkpoints) stay float32; a GGUF's quantised embedding table keeps its raw
  rows, dequantised as they are looked up (exact, and as compact as the file). A GGUF's quantised LM head
  is int4 whatever its type (repacked from Q4, else quantised from its values), and its packed logits are
  rescored: the best 32 candidates of each row recomputed from the file's own rows (``model/layers/quantized.py``:
  ``RescoredHead``), which keeps greedy picks and the top of the distribution those of the dequantised head
  (sampling beyond the 32 best reads the packed logits). The packed pass mostly ranks the vocabulary, so
  int4 costs little there (symmetric, without zero points, where quantised from values), and the head is
  the largest matrix a small model reads per decode step, so int4 instead of int8 there shortens a
  single-request decode step and the resident size (``bench/llm_peers.py``).

A tied LM head and embedding table share one matrix when its form can be gathered (dense, bf16, int8); an
int4 LM head gets the embedding table beside it. Forms that cannot take a shape (int4 needs the input size
to be a multiple of 32) fall back to int8. Packed forms run on the CPU only (:mod:`.packed`).
"""

from __future__ import annotations

from typing import Literal

import torch

from sluice.engines.llm.config import WEIGHT_MODES
from sluice.engines.llm.quant.gguf_blocks import INT4_EXACT_TYPES
from sluice.engines.llm.quant.gguf_rows import GGUFRows
from sluice.engines.llm.quant.packed import DenseWeight, Int4Weight, Int8Weight, PackedWeight

__all__ = ["WEIGHT_MODES", "Form", "Materialized", "Role", "Source", "choose_form", "gatherable", "materialize",
           "rescores_head"]
Role = Literal["linear", "lm_head", "embedding"]
Form = Literal["float", "bf16", "int8", "int4", "gguf"]  # float: a plain tensor in the model's dtype
Source = torch.Tensor | GGUFRows
Materialized = torch.Tensor | PackedWeight | GGUFRows


def choose_form(role: Role, source: Source, mode: str) -> Form:
    """The form of one weight matrix (see the module docstring)."""
    shape = tuple(source.shape)
    int4: Form = "int4" if Int4Weight.supports((shape[0], shape[1])) else "int8"
    if mode == "fp32":
        return "float"
    if mode == "bf16":
        return "bf16"
    if mode == "int8":
        return "int8"
    if mode == "int4":
        return int4 if role == "linear" else "int8"
    if mode != "auto":
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_MODES)}, got {mode!r}")
    if not isinstance(source, GGUFRows):
        return "float"
    if role == "embedding":
        return "gguf"
    if role == "lm_head":  # rescored from the file's rows (rescores_head): ranking needs no more than int4
        return int4
    return int4 if source.tensor_type in INT4_EXACT_TYPES else "int8"


def materialize(source: Source, form: Form, ranks: bool = False, scales_only: bool | None = None) -> Materialized:
    """``source`` in ``form``: a float32 tensor for ``float`` (the model casts it), else packed. ``ranks``: the
    matrix only ranks candidates that are then rescored (``rescores_head``), so int4 quantised from values is
    symmetric: no zero points, a tenth fewer bytes read per step for a step about 7 % coarser.
    ``scales_only``: int4 keeps only scales where its zero points are 0 (``Int4Weight``; None: its default)."""
    if form == "float":
        return source.to_float() if isinstance(source, GGUFRows) else source.float()
    if form == "gguf":
        if not isinstance(source, GGUFRows):
            raise ValueError("only a GGUF tensor keeps its raw rows")
        return source.loaded()
    if form == "int4":
        if isinstance(source, GGUFRows) and source.tensor_type in INT4_EXACT_TYPES:
            return Int4Weight.from_gguf(source, scales_only)
        return Int4Weight.quantize(source, symmetric=ranks, scales_only=scales_only)
    if form == "int8":
        return Int8Weight.quantize(source)
    return DenseWeight.convert(source)


def rescores_head(source: Source, mode: str) -> bool:
    """Whether the LM head's packed logits are rescored from the file's own rows (``RescoredHead``): under
    ``auto``, for a GGUF head (the exact rows are the tied embedding table's, or kept beside the head)."""
    return mode == "auto" and isinstance(source, GGUFRows)


def gatherable(weight: Materialized) -> bool:
    """Whether an embedding table can be looked up in this form (int4's packed layout cannot)."""
    return not isinstance(weight, Int4Weight)
