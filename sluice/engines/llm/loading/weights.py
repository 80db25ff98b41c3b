"""Load a model's weights from a HF safetensors directory or a GGUF file, for any registered family.

Both loaders read the checkpoint's family and :class:`ModelConfig` first (``checkpoint.py``: the
refusals ``sluice validate`` shares), then return the tensors under the model's names (``layers.0.self_attn.qkv_proj.weight``...) on the CPU, as the
checkpoint holds them: a HF checkpoint's matrices in its own dtype (vectors in float32), a GGUF's float
tensors in float32 and its quantised ones as raw rows (:class:`~sluice.engines.llm.quant.gguf_blocks.GGUFRows`,
views of the mapped file). The model converts each into its final form one at a time
(``quant/policy.py``), so a float32 copy of a quantised or 16-bit checkpoint is never held. On the way, per
the family's :class:`WeightNames`:

* the decoder's name prefix is stripped (``model.``; ``model.language_model.`` in multimodal checkpoints,
  whose vision towers are skipped), the family's renames applied (Mixtral's ``block_sparse_moe.experts.N.w1``
  is ``mlp.experts.N.gate_proj``), and q/k/v and gate/up rows (weights and biases) are concatenated into
  the fused projections; the experts of a mixture-of-experts layer are stacked into one
  ``(experts, out, in)`` tensor per projection (llama.cpp's GGUF files store them stacked already; gpt-oss's
  HF checkpoints store them stacked ``(in, out)``, gate/up interleaved, often MXFP4: ``quant/mxfp4.py``);
* Gemma norms become ``1 + w`` (HF stores ``w``; llama.cpp's GGUF already stores ``1 + w``);
* GGUF tensors are renamed from llama.cpp's names; for the ``llama`` architecture the Q/K rows are put back
  into HF's rotary layout (llama.cpp's converter permutes them so that each head's two rotary halves are
  interleaved; only its Llama-derived converters do). Row permutations and row concatenations act on
  quantised rows exactly (each row is its own run of blocks); parts of one fused projection stored in
  different types are dequantised to float32 before they are joined.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import torch

from sluice.engines.llm.config import ModelConfig
from sluice.engines.llm.loading.checkpoint import Checkpoint, read_checkpoint
from sluice.engines.llm.loading.gguf_file import GGUFFile, GGUFTensor
from sluice.engines.llm.model.families.common import ModelFamily
from sluice.engines.llm.quant.gguf_rows import (
    ExpertRows,
    FileRows,
    GGUFRows,
    Loaded,
    cat_expert_rows,
    cat_rows,
)

log = logging.getLogger(__name__)

_GGUF_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_CONFIG_ONLY = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
_GGUF_LAYER_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_FUSABLE_RE = re.compile(r"^(.*)\.(\w+)\.(weight|bias)$")
_EXPERT_RE = re.compile(r"^(.*\.experts)\.(\d+)\.(\w+)\.weight$")


def load_weights(path: str | Path, gguf_file: GGUFFile | None = None) -> tuple[ModelConfig, dict[str, Loaded]]:
    """Load a ``.gguf`` file or a directory holding ``config.json`` and ``*.safetensors``; ValueError (one
    line) for a checkpoint the engine cannot run (:func:`~sluice.engines.llm.loading.checkpoint.read_checkpoint`).

    ``gguf_file``: that file already opened (its tokenizer is read from the same parse).
    """
    checkpoint = read_checkpoint(path, gguf_file)
    if checkpoint.gguf is not None:
        return checkpoint.config, _gguf_tensors(checkpoint, checkpoint.gguf)
    return checkpoint.config, _safetensors_tensors(checkpoint)


# ---------------------------------------------------------------- safetensors


def _safetensors_tensors(checkpoint: Checkpoint) -> dict[str, Loaded]:
    from safetensors.torch import load_file

    family, path = checkpoint.family, checkpoint.path
    files = sorted(path.glob("*.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        for name, tensor in load_file(str(f)).items():
            renamed = _hf_name(family, name)
            if renamed is not None:  # matrices stay in the checkpoint's dtype until the model converts them
                keep = (tensor.dim() >= 2 and tensor.is_floating_point()) or tensor.dtype == torch.uint8  # MXFP4
                tensors[renamed] = tensor if keep else tensor.float()
    if family.weights.hf_experts == "gpt_oss":
        from sluice.engines.llm.quant.mxfp4 import gpt_oss_experts

        tensors = gpt_oss_experts(tensors)
    if family.weights.hf_norm_plus_one:
        for name in tensors:
            if name.endswith("norm.weight"):
                tensors[name] = 1.0 + tensors[name]
    return fuse(family, dict[str, Loaded](tensors))


def _hf_name(family: ModelFamily, name: str) -> str | None:
    """The model's name for a checkpoint tensor, or None for tensors the engine does not load."""
    names = family.weights
    if any(s in name for s in names.skipped):
        return None
    for old, new in names.hf_renames:
        name = name.replace(old, new)
    if name in names.hf_lm_head:
        return "lm_head.weight"
    for prefix in names.hf_prefixes:
        if name.startswith(prefix):
            return name.removeprefix(prefix)
    raise ValueError(f"unexpected tensor {name!r} for a {family.name} checkpoint")


def fuse(family: ModelFamily, tensors: dict[str, Loaded]) -> dict[str, Loaded]:
    """Concatenate the family's packed projections (q/k/v -> qkv_proj, gate/up -> gate_up_proj), rows in
    the listed order, weights and biases alike; the parts are removed from ``tensors``."""
    part_of = {part: fused for fused, parts in family.weights.packed.items() for part in parts}
    groups: dict[tuple[str, str, str], dict[str, Loaded]] = {}
    for name in list(tensors):
        m = _FUSABLE_RE.match(name)
        if m is not None and m.group(2) in part_of:
            module, part, kind = m.groups()
            groups.setdefault((module, part_of[part], kind), {})[part] = tensors.pop(name)
    for (module, fused, kind), parts in groups.items():
        order = family.weights.packed[fused]
        if set(parts) != set(order):
            raise ValueError(f"{module}: found {sorted(parts)} of {list(order)}; the checkpoint is incomplete")
        tensors[f"{module}.{fused}.{kind}"] = _cat_rows([parts[p] for p in order], kind)
    return stack_experts(tensors)


def stack_experts(tensors: dict[str, Loaded]) -> dict[str, Loaded]:
    """``<layer>.experts.<i>.<proj>.weight`` of every expert ``i`` -> one ``<layer>.experts.<proj>.weight``
    ``(experts, out, in)``, in expert order; the parts are removed from ``tensors``."""
    groups: dict[tuple[str, str], dict[int, Loaded]] = {}
    for name in list(tensors):
        m = _EXPERT_RE.match(name)
        if m is not None:
            groups.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = tensors.pop(name)
    for (module, proj), experts in groups.items():
        if sorted(experts) != list(range(len(experts))):
            raise ValueError(f"{module}.{proj}: experts {sorted(experts)} are not 0..{len(experts) - 1}")
        parts = [experts[i] for i in range(len(experts))]
        tensors[f"{module}.{proj}.weight"] = torch.stack([p.to_float() if isinstance(p, (GGUFRows, ExpertRows))
                                                          else p for p in parts])  # fmt: skip
    return tensors


def _cat_rows(parts: list[Loaded], kind: str = "weight") -> Loaded:
    """Rows of ``parts`` in order: quantised rows stay quantised when all parts share one GGUF type."""
    if all(isinstance(p, GGUFRows) for p in parts):
        rows = [p for p in parts if isinstance(p, GGUFRows)]
        if len({p.tensor_type for p in rows}) == 1:
            return cat_rows(rows)
    if all(isinstance(p, ExpertRows) for p in parts):
        stacks = [p for p in parts if isinstance(p, ExpertRows)]
        if len({p.tensor_type for p in stacks}) == 1 and kind == "weight":
            return cat_expert_rows(stacks)
    floats = [p.to_float() if isinstance(p, (GGUFRows, ExpertRows)) else p for p in parts]
    dtype = floats[0].dtype if len({f.dtype for f in floats}) == 1 else torch.float32
    # along the output features: a matrix's rows, a bias's entries, per expert in a stack (experts, out, in)
    dim = floats[0].dim() - (2 if kind == "weight" else 1)
    return torch.cat([f.to(dtype) for f in floats], dim=dim)


# ---------------------------------------------------------------- GGUF


def unpermute_rotary_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of a Q/K projection ``(num_heads * head_dim, ...)``.

    llama.cpp stores, per head, rows ``[0, d/2, 1, d/2+1, ...]`` of HF's layout (interleaved rotary
    pairs); this returns rows in HF order ``[0, 1, ..., d/2-1, d/2, ...]`` (rotate-half pairs).
    """
    head_dim = w.shape[0] // num_heads
    return w.reshape(num_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_tensors(checkpoint: Checkpoint, file: GGUFFile) -> dict[str, Loaded]:
    family, config, path = checkpoint.family, checkpoint.config, checkpoint.path
    layer_names = family.weights.gguf_layer_names
    tensors: dict[str, Loaded] = {}
    for t in file.tensors:
        if t.name in _GGUF_CONFIG_ONLY:
            continue
        value = _gguf_value(file.path, t)
        if t.name in _GGUF_NAMES:
            name = _GGUF_NAMES[t.name]
        else:
            m = _GGUF_LAYER_RE.match(t.name)
            if m is None or m.group(2) not in layer_names:
                raise ValueError(f"unexpected tensor {t.name!r} in {path.name} ({file.get('general.architecture')})")
            layer, kind, suffix = m.groups()
            if family.weights.gguf_permute_qk and kind in ("attn_q", "attn_k"):
                heads = config.num_heads if kind == "attn_q" else config.num_kv_heads
                value = _unpermute(value, heads)
            name = f"layers.{layer}.{layer_names[kind]}.{suffix}"
        tensors[name] = value
    return fuse(family, tensors)


def _gguf_value(path: Path, t: GGUFTensor) -> Loaded:
    """A GGUF tensor as the loader returns it: float32 (a copy) for float types, the file's rows for
    quantised matrices (read when the model converts them)."""
    if t.is_quantized and len(t.shape) == 2:
        rows = FileRows(path, t.offset, t.shape[0], int(t.data.shape[-1]))
        return GGUFRows(t.tensor_type, (t.shape[0], t.shape[1]), (rows,))
    if t.is_quantized and len(t.shape) == 3:  # stacked experts: each expert's rows, read when converted
        experts, num_rows, cols = t.shape
        row_bytes = int(t.data.shape[-1])
        return ExpertRows(tuple(
            GGUFRows(t.tensor_type, (num_rows, cols), (FileRows(path, t.offset + e * num_rows * row_bytes, num_rows,
                                                                row_bytes),))
            for e in range(experts)
        ))  # fmt: skip
    return torch.from_numpy(np.array(t.to_float32(), dtype=np.float32, order="C", copy=True))


def _unpermute(value: Loaded, num_heads: int) -> Loaded:
    assert not isinstance(value, ExpertRows), "Q/K projections are never stacked"
    if isinstance(value, GGUFRows):
        order = unpermute_rotary_rows(np.arange(value.shape[0]), num_heads)
        return value.permuted(torch.from_numpy(order))
    return torch.from_numpy(np.ascontiguousarray(unpermute_rotary_rows(value.numpy(), num_heads)))
