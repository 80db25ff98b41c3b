"""Rotary position embedding: inverse frequencies for every HF scaling variant, cos/sin tables, application.

The frequencies are computed with the same torch operations, in the same order and dtype, as HF
transformers' ``modeling_rope_utils`` -- that is what keeps greedy outputs bit-for-bit on the same path as
HF's in fp32. Tables are precomputed once per model for every position up to ``max_len``:

* plain, ``linear``, ``llama3``, ``yarn``: one inverse-frequency vector for all positions;
* ``dynamic`` (NTK): HF grows the base with the sequence length, and a token generated at position ``p``
  past ``max_position_embeddings`` is rotated with the base for length ``p + 1``. The table does exactly
  that per row (a prompt longer than the trained context is rotated per position too, where HF rotates it
  all with the base of its full length);
* ``longrope``: two tables, short factors then long factors, stacked; row ``max_len + p`` is position ``p``
  with the long factors (see ``ModelConfig.long_rope_switch_len`` for which sequences use them).

The convention is HF's rotate-half (GPT-NeoX): dims ``[0, d/2)`` pair with ``[d/2, d)`` of the rotated
part, which is the first ``rotary_dim`` dims of each head (partial rotary), the rest passing through.
"""

from __future__ import annotations

import math

import torch

from sluice.engines.llm.config import RopeConfig
from sluice.engines.llm.cpu import native_cpu


def _default_inv_freq(base: float | torch.Tensor, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def inverse_frequencies(rope: RopeConfig, head_dim: int, long: bool = False) -> tuple[torch.Tensor, float]:
    """``(inv_freq (rotary_dim // 2,) fp32, attention_factor)`` of ``rope`` as HF computes them at init.

    ``long``: the long-context factors of LongRoPE. Dynamic NTK returns the base frequencies (rows past the
    trained length come from :func:`dynamic_inverse_frequencies`).
    """
    dim = rope.rotary_dim(head_dim)
    base = rope.theta
    if rope.freq_factors:  # llama.cpp's rope_freqs: theta_i / factor_i
        return _default_inv_freq(base, dim) / torch.tensor(rope.freq_factors, dtype=torch.float32), 1.0
    if rope.scaling in ("default", "dynamic"):
        return _default_inv_freq(base, dim), 1.0
    if rope.scaling == "linear":
        inv_freq = _default_inv_freq(base, dim)
        inv_freq /= rope.factor
        return inv_freq, 1.0
    if rope.scaling == "llama3":
        return _llama3_inv_freq(rope, dim), 1.0
    if rope.scaling == "longrope":
        return _longrope_inv_freq(rope, dim, long)
    return _yarn_inv_freq(rope, dim)


def dynamic_inverse_frequencies(rope: RopeConfig, head_dim: int, max_position_embeddings: int,
                                seq_len: int) -> torch.Tensor:  # fmt: skip
    """Dynamic NTK: inverse frequencies (dim // 2,) for a forward pass whose longest sequence is ``seq_len``.

    HF passes the length as a 0-d int64 tensor (``max(position_ids) + 1``), so the base is computed in fp32
    with 0-d tensor arithmetic; the same shapes here give the same bits (a batched pow may round otherwise).
    """
    dim = rope.rotary_dim(head_dim)
    seq = torch.maximum(torch.tensor(seq_len), torch.tensor(max_position_embeddings))
    factor = rope.factor
    base = rope.theta * ((factor * seq / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(rope: RopeConfig, dim: int) -> torch.Tensor:
    inv_freq = _default_inv_freq(rope.theta, dim)
    factor, low, high = rope.factor, rope.low_freq_factor, rope.high_freq_factor
    old_context_len = rope.original_max_position_embeddings
    assert old_context_len is not None  # RopeConfig checks it
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are divided by the factor, short ones kept, the band between them interpolated
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def longrope_attention_factor(rope: RopeConfig) -> float:
    """The cos/sin multiplier of LongRoPE: given, else from the context extension (HF's default)."""
    original = rope.original_max_position_embeddings
    assert original is not None
    if rope.attention_factor is not None:
        return rope.attention_factor
    factor = rope.factor  # the parsers set it to max / original context when a config gives none (as HF)
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def _longrope_inv_freq(rope: RopeConfig, dim: int, long: bool) -> tuple[torch.Tensor, float]:
    ext = torch.tensor(rope.long_factor if long else rope.short_factor, dtype=torch.float32)
    if ext.shape[0] != dim // 2:
        raise ValueError(f"longrope needs {dim // 2} factors (rotary dim {dim}), got {ext.shape[0]}")
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext * rope.theta**shape), longrope_attention_factor(rope)


def _yarn_inv_freq(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    base, factor = rope.theta, rope.factor
    original = rope.original_max_position_embeddings
    assert original is not None

    def mscale(scale: float) -> float:
        return 1.0 if scale <= 1 else 0.1 * math.log(scale) + 1.0

    attention_factor = rope.attention_factor if rope.attention_factor is not None else mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, attention_factor


def rope_tables(rope: RopeConfig, head_dim: int, max_position_embeddings: int,
                max_len: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """cos/sin tables ``(rows, rotary_dim)`` in fp32, halves repeated; ``rows`` is ``max_len``, or
    ``2 * max_len`` for LongRoPE (short-factor rows, then long-factor rows)."""
    positions = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # (max_len, 1)
    if rope.scaling == "longrope":
        tables = [_cos_sin(positions * inv.unsqueeze(0), factor)
                  for inv, factor in (inverse_frequencies(rope, head_dim, long=flag) for flag in (False, True))]
        return torch.cat([tables[0][0], tables[1][0]]), torch.cat([tables[0][1], tables[1][1]])
    inv_freq, factor = inverse_frequencies(rope, head_dim)
    freqs = positions * inv_freq.unsqueeze(0)  # (max_len, dim // 2)
    if rope.scaling == "dynamic":  # rows past the trained length: each with the base of its own length
        for p in range(max_position_embeddings, max_len):
            freqs[p] = p * dynamic_inverse_frequencies(rope, head_dim, max_position_embeddings, p + 1)
    return _cos_sin(freqs, factor)


def _cos_sin(freqs: torch.Tensor, attention_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * attention_factor, emb.sin() * attention_factor


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, native: bool = True) -> torch.Tensor:
    """Rotate ``x`` (num_tokens, num_heads, head_dim) by ``cos``/``sin`` (num_tokens, 1, rotary_dim).

    Dims past ``rotary_dim`` pass through unchanged (partial rotary). ``native``: the native kernel may
    rotate (where it takes ``x``).
    """
    if native and x.dtype in native_cpu.DTYPES and cos.dtype == x.dtype == sin.dtype and native_cpu.takes(x):
        return native_cpu.rotary(x, cos, sin)  # one call, not seven
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return _rotate(x, cos, sin)
    return torch.cat((_rotate(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
