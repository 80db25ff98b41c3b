"""The engine's kernels as torch custom ops, so that a compiled decode step treats each as one opaque call.

``torch.compile`` traces Python; a Triton launch wrapper, the torch path's per-sequence loops or the MoE
alignment's host read would each break the graph. Registered as ``torch.library`` custom ops with a fake
(shape-only) implementation, the compiler sees ``sluice::store_and_attend`` and
``sluice::moe_grouped_matmul`` (and on the CPU ``sluice::onednn_linear``, the prepacked matmul of
``model/layers/row_invariant.py``) as single calls whose outputs it knows the shapes of, and calls the real
implementation (``kernels.store_kv`` and ``kernels.paged_attention`` with the plan's path, or
``kernels/triton_moe.py``) when the compiled step runs. The ops are used only while compiling
(:func:`compiling`): eager steps call the kernels directly, without the dispatcher's cost.

Guarantees: each op computes exactly what the functions it wraps compute (same kernels, same arguments);
``moe_grouped_matmul`` sizes its launch from the shapes alone (no host read), so a CUDA graph can hold it.
"""

from __future__ import annotations

import torch

from sluice.engines.llm import kernels

__all__ = ["compiling", "moe_grouped_matmul", "onednn_linear", "store_and_attend", "store_then_attend"]


def compiling() -> bool:
    """Whether the calling code is being traced by ``torch.compile`` (then the custom ops are called)."""
    return torch.compiler.is_compiling()


def store_then_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                      query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, sliding_window: int | None,
                      softcap: float | None, fixed_tiles: bool, sinks: torch.Tensor | None, path: str
                      ) -> torch.Tensor:  # fmt: skip
    """:func:`~sluice.engines.llm.kernels.store_kv` then :func:`~sluice.engines.llm.kernels.paged_attention`
    on ``path``, into a new tensor: what an eager step calls, and the op below runs."""
    kernels.store_kv(key, value, k_cache, v_cache, slot_mapping, path=path)
    return kernels.paged_attention(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                                   sliding_window=sliding_window, softcap=softcap, fixed_tiles=fixed_tiles,
                                   sinks=sinks, path=path)  # fmt: skip


@torch.library.custom_op("sluice::store_and_attend", mutates_args=())
def store_and_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                     query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, sliding_window: int | None,
                     softcap: float | None, fixed_tiles: bool, sinks: torch.Tensor | None, path: str
                     ) -> torch.Tensor:  # fmt: skip
    """:func:`store_then_attend` as one op.

    It writes ``k_cache`` and ``v_cache`` but does not declare them mutated: every layer's caches are views of
    one KV pool, and for a mutated input that aliases others the compiler keeps a functional copy of the
    whole pool and writes it back after each call, which costs a step far more than its arithmetic.
    Undeclared is safe here because nothing in a compiled step reads the caches
    but this op, which stores before it attends."""
    return store_then_attend(query, key, value, k_cache, v_cache, slot_mapping, block_tables, query_start_loc,
                             seq_lens, scale, sliding_window, softcap, fixed_tiles, sinks, path)


@store_and_attend.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
      slot_mapping: torch.Tensor, block_tables: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
      scale: float, sliding_window: int | None, softcap: float | None, fixed_tiles: bool,
      sinks: torch.Tensor | None, path: str) -> torch.Tensor:  # fmt: skip
    return torch.empty_like(query)


@torch.library.custom_op("sluice::moe_grouped_matmul", mutates_args=())
def moe_grouped_matmul(a: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, rows_per_input: int) -> torch.Tensor:
    """``out[r] = a[r // rows_per_input] @ w[ids[r]]`` (:func:`~.triton_moe.grouped_matmul`), launched over
    the most blocks the rows can need, so that nothing is read back to size it."""
    from sluice.engines.llm.kernels.triton_moe import grouped_matmul

    return grouped_matmul(a, w, ids, rows_per_input, static_grid=True)


@moe_grouped_matmul.register_fake
def _(a: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, rows_per_input: int) -> torch.Tensor:
    return a.new_empty(ids.numel(), w.shape[2])


@torch.library.custom_op("sluice::onednn_linear", mutates_args=())
def onednn_linear(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
                  ) -> torch.Tensor:  # fmt: skip
    """oneDNN's float32 matmul by a weight prepacked for it (``model/layers/row_invariant.py``; the CPU)."""
    return torch.ops.mkldnn._linear_pointwise(rows.contiguous(), packed, bias, "none", [], "")


@onednn_linear.register_fake
def _(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return rows.new_empty(rows.shape[0], out_features)
