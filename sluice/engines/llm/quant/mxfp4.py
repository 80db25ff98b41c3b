"""gpt-oss's expert weights as its checkpoints hold them: MXFP4 blocks, gate/up interleaved, ``(in, out)``.

The published gpt-oss checkpoints store each layer's experts as MXFP4 (the OCP microscaling format):
``<proj>_blocks`` ``(experts, out, groups, 16)`` bytes, each byte two 4-bit e2m1 values (low nibble first),
and ``<proj>_scales`` ``(experts, out, groups)`` bytes, a power-of-two exponent (biased by 127) per group of
32 values along the inputs. :func:`dequantize_mxfp4` expands them to float32 in HF's parameter layout,
``(experts, in, out)``, as transformers' ``convert_moe_packed_tensors`` does. Dequantised at load: the
CPU and Triton kernels take float experts (kept packed is left for later).

:func:`gpt_oss_experts` then brings gpt-oss's experts (MXFP4 or float) to the layout of ``model/layers/moe.py``:
``gate_up_proj`` ``(experts, 2 * width, hidden)`` with the gate rows first (gpt-oss interleaves gate and up
columns: even = gate, odd = up), ``down_proj`` ``(experts, hidden, width)``, biases de-interleaved alike,
the router under ``mlp.gate`` and the attention sinks under ``self_attn.sinks.weight``.
"""

from __future__ import annotations

import re

import torch

# the 16 values of an e2m1 nibble
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_EXPERTS_RE = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?$")


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``(experts, out, groups, 16)`` uint8 blocks and ``(experts, out, groups)`` uint8 exponents ->
    ``(experts, in, out)`` float32, ``in = groups * 32``."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} {blocks.dtype} and scales {tuple(scales.shape)} "
                         f"{scales.dtype} do not match")  # fmt: skip
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    experts, out, groups, nbytes = blocks.shape
    values = torch.empty(experts, out, groups, 2 * nbytes, dtype=torch.float32)
    values[..., 0::2] = lut[(blocks & 0x0F).long()]
    values[..., 1::2] = lut[(blocks >> 4).long()]
    values = torch.ldexp(values, (scales.to(torch.int32) - 127).unsqueeze(-1))
    return values.reshape(experts, out, groups * 2 * nbytes).transpose(1, 2).contiguous()


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    """Along the last dim: the even (gate) entries, then the odd (up) ones."""
    return torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1)


def gpt_oss_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """gpt-oss's router and expert tensors (model names, the decoder prefix stripped) in ``model/layers/moe.py``'s
    layout; every other tensor as it is."""
    parts: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for name in list(tensors):
        if name.endswith(".self_attn.sinks"):
            tensors[f"{name}.weight"] = tensors.pop(name)
            continue
        if ".mlp.router." in name:
            tensors[name.replace(".mlp.router.", ".mlp.gate.")] = tensors.pop(name)
            continue
        m = _EXPERTS_RE.match(name)
        if m is not None:
            parts.setdefault((m.group(1), m.group(2)), {})[m.group(3) or ""] = tensors.pop(name)
    for (module, proj), found in parts.items():
        if "_blocks" in found or "_scales" in found:
            if "_blocks" not in found or "_scales" not in found:
                raise ValueError(f"{module}.{proj}: MXFP4 blocks without scales, or scales without blocks")
            weight = dequantize_mxfp4(found["_blocks"], found["_scales"])
        elif "" in found:
            weight = found[""].float() if found[""].dtype != torch.float32 else found[""]
        else:
            raise ValueError(f"{module}.{proj}: the checkpoint has no weights for it")
        if proj == "gate_up_proj":  # (experts, hidden, 2 * width) interleaved -> (experts, 2 * width, hidden)
            weight = _deinterleave(weight)
        tensors[f"{module}.{proj}.weight"] = weight.transpose(1, 2).contiguous()
        if "_bias" in found:
            bias = found["_bias"].float()
            tensors[f"{module}.{proj}.bias"] = _deinterleave(bias) if proj == "gate_up_proj" else bias
    return tensors
