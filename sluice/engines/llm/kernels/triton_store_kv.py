"""Triton kernel that scatters new tokens' keys and values into the paged KV cache.

One program per token copies that token's ``(num_kv_heads, head_dim)`` key and value into slot
``slot_mapping[t]`` (``block_id * block_size + offset``) of both caches; negative slots are skipped (their
programs return at once). Same contract as :func:`.reference.store_kv`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    key_stride_t, key_stride_h, value_stride_t, value_stride_h,
    kc_stride_b, kc_stride_s, kc_stride_h, vc_stride_b, vc_stride_s, vc_stride_h,
    num_kv_heads, head_dim, block_size,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:  # a skipped token
        return
    block_id = slot // block_size
    offset = slot % block_size
    heads = tl.arange(0, BLOCK_H)[:, None]  # (BLOCK_H, 1)
    dims = tl.arange(0, BLOCK_D)[None, :]  # (1, BLOCK_D)
    mask = (heads < num_kv_heads) & (dims < head_dim)

    k = tl.load(key_ptr + token * key_stride_t + heads * key_stride_h + dims, mask=mask)
    v = tl.load(value_ptr + token * value_stride_t + heads * value_stride_h + dims, mask=mask)
    k_dst = k_cache_ptr + block_id * kc_stride_b + offset * kc_stride_s + heads * kc_stride_h + dims
    v_dst = v_cache_ptr + block_id * vc_stride_b + offset * vc_stride_s + heads * vc_stride_h + dims
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(
    key: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    value: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim), written in place
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim), written in place
    slot_mapping: torch.Tensor,  # (num_tokens,) int32/int64; < 0 = skip
) -> None:
    """Write token t's key/value into slot ``slot_mapping[t]`` of the caches (negative slots skipped).

    Key/value may be strided views (e.g. slices of a fused QKV projection) as long as ``head_dim`` is
    their innermost, unit-stride dimension; caches must have a unit-stride ``head_dim`` too.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("store_kv: the KV caches' head_dim must be their innermost, contiguous dimension")
    if key.stride(2) != 1:
        key = key.contiguous()
    if value.stride(2) != 1:
        value = value.contiguous()
    slot_mapping = slot_mapping.contiguous()
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        num_kv_heads, head_dim, k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )
