"""KV-store and paged-attention kernels of the LLM engine, with dispatch by device.

Two ops, three implementations behind one interface:

* ``triton``: Triton kernels (:mod:`.triton_store_kv`, :mod:`.triton_paged_attention`), chosen for CUDA
  tensors when ``triton`` imports;
* ``torch``: vectorised torch (:mod:`.torch_ops`), chosen otherwise (the CPU hot path);
* ``reference``: slow per-sequence loops (:mod:`.reference`), what the tests compare against.

The engine passes the path its :class:`~sluice.engines.llm.kernel_plan.KernelPlan` chose
(``kernels.attention``); without one, the ops take :func:`kernel_path`'s default for the tensors' device.
``triton`` on CPU tensors works only under the Triton interpreter (``TRITON_INTERPRET=1`` set before
``triton`` is imported, as the tests do).

Cache layout for both ops: ``(num_blocks, block_size, num_kv_heads, head_dim)`` per layer, ``head_dim``
contiguous. Allocate caches with ``torch.zeros``: the torch path needs every slot finite (see
:mod:`.torch_ops`).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["KERNEL_PATHS", "kernel_path", "paged_attention", "store_kv", "triton_importable", "triton_interpreted"]

KERNEL_PATHS = ("triton", "torch", "reference")


@dataclass(frozen=True)
class _Ops:
    store_kv: Callable[..., None]
    paged_attention: Callable[..., torch.Tensor]


@functools.cache
def _load(path: str) -> _Ops:
    if path == "triton":
        try:
            store = importlib.import_module(f"{__name__}.triton_store_kv")
            attn = importlib.import_module(f"{__name__}.triton_paged_attention")
        except ImportError as exc:
            raise RuntimeError(f"Triton kernels unavailable ({exc}); install sluice[triton]") from exc
        return _Ops(store.store_kv, attn.paged_attention)
    module = importlib.import_module(f"{__name__}.{'torch_ops' if path == 'torch' else 'reference'}")
    return _Ops(module.store_kv, module.paged_attention)


@functools.cache
def triton_importable() -> bool:
    """Whether ``triton`` imports here (imports it: call only where Triton may be used)."""
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def triton_interpreted() -> bool:
    """Whether Triton's CPU interpreter is on (Triton's own setting, ``TRITON_INTERPRET=1``; the tests')."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernel_path(tensor: torch.Tensor) -> str:
    """The default path (one of ``KERNEL_PATHS``) for tensors on ``tensor``'s device: Triton on CUDA where it
    imports, torch elsewhere (what ``kernels.attention: auto`` resolves to)."""
    return "triton" if tensor.is_cuda and triton_importable() else "torch"


def store_kv(
    key: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    value: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim), written in place
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim), written in place
    slot_mapping: torch.Tensor,  # (num_tokens,) int32/int64; slot = block_id * block_size + offset; < 0 = skip
    path: str | None = None,  # one of KERNEL_PATHS; None: kernel_path(k_cache)
) -> None:
    """Write each new token's key and value into its cache slot; tokens with a negative slot are skipped."""
    _load(path or kernel_path(k_cache)).store_kv(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(
    query: torch.Tensor,  # (num_tokens, num_heads, head_dim) new tokens of all sequences, concatenated
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # (num_seqs, max_blocks_per_seq) int32, padded with 0
    query_start_loc: torch.Tensor,  # (num_seqs + 1,) int32 cumulative query lengths
    seq_lens: torch.Tensor,  # (num_seqs,) int32 KV length including the new tokens
    scale: float,
    out: torch.Tensor | None = None,  # (num_tokens, num_heads, head_dim)
    *,
    sliding_window: int | None = None,  # attend only to the last this-many positions (itself included)
    softcap: float | None = None,  # scores -> softcap * tanh(scores / softcap) before the softmax
    fixed_tiles: bool = False,  # Triton: one tile shape for every batch (batch-invariant rows)
    sinks: torch.Tensor | None = None,  # (num_heads,) a logit per head joining each row's softmax (gpt-oss)
    path: str | None = None,  # one of KERNEL_PATHS; None: kernel_path(query)
) -> torch.Tensor:
    """Causal attention of every sequence's new tokens over its paged KV (prefill and decode mixed).

    Row j of sequence s (``q_len = qsl[s+1] - qsl[s]`` rows) sits at position ``seq_lens[s] - q_len + j``
    and attends to KV positions ``0..`` that position (``> pos - sliding_window`` with a window), whose K/V
    must already be in the cache (store_kv first). Query head h reads KV head ``h // (num_heads //
    num_kv_heads)``. Returns ``out`` (allocated when None) with the query's dtype; the softmax is accumulated
    in fp32.
    """
    path = path or kernel_path(query)
    extra = {"fixed_tiles": fixed_tiles} if path == "triton" else {}
    return _load(path).paged_attention(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, out,
                                       sliding_window=sliding_window, softcap=softcap, sinks=sinks,
                                       **extra)  # fmt: skip
