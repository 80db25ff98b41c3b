"""Apply a batch of token bitmasks to the logits, on the logits' device.

A :class:`TokenBitmask` holds one packed mask per constrained row of a step (int32, bit ``t % 32`` of word
``t // 32`` set = token ``t`` allowed) and the logits row each mask belongs to; rows of unconstrained
requests have no mask and are left alone. :func:`apply_token_bitmask_` sets the logits of disallowed tokens
to ``-inf`` in place, so greedy takes the best *allowed* token and sampling renormalises over the allowed
ones; an allowed token's logit is never changed, so where the model's argmax is allowed it stays the argmax.

Paths, the attention kernels' (``kernels.attention``, passed by the sampler): ``torch`` (vectorised unpacking,
the CPU path and the reference), ``triton`` (one kernel launch over rows x vocabulary blocks, for CUDA;
also under ``TRITON_INTERPRET=1`` on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class TokenBitmask:
    """The masks of one step: ``bitmask[i]`` applies to logits row ``rows[i]``."""

    bitmask: torch.Tensor  # (num_masked_rows, num_words) int32, CPU (pinned when the model is on CUDA)
    rows: torch.Tensor  # (num_masked_rows,) int64, CPU: logits row of each mask


def apply_token_bitmask_(logits: torch.Tensor, mask: TokenBitmask, path: str | None = None) -> None:
    """Set ``logits[mask.rows[i], t] = -inf`` for every token ``t`` not allowed by ``mask.bitmask[i]``.

    ``logits``: (num_rows, vocab) float, any device; vocabulary columns past the mask's words are disallowed.
    ``path``: ``triton`` or another kernel path (None: the default for the logits' device).
    """
    if mask.bitmask.shape[0] == 0:
        return
    bitmask = mask.bitmask.to(logits.device, non_blocking=True)
    rows = mask.rows.to(logits.device, non_blocking=True)
    from sluice.engines.llm.kernels import kernel_path

    if (path or kernel_path(logits)) == "triton":
        from sluice.engines.llm.structured.triton_bitmask import apply_token_bitmask_triton

        apply_token_bitmask_triton(logits, bitmask, rows)
        return
    apply_token_bitmask_torch(logits, bitmask, rows)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(num_rows, num_words) int32 -> (num_rows, vocab_size) bool, True = allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # (num_rows, num_words, 32)
    allowed = bits.reshape(bitmask.shape[0], -1).bool()  # (num_rows, 32 * num_words)
    if allowed.shape[1] >= vocab_size:
        return allowed[:, :vocab_size]
    pad = torch.zeros(bitmask.shape[0], vocab_size - allowed.shape[1], dtype=torch.bool, device=bitmask.device)
    return torch.cat([allowed, pad], dim=1)


def apply_token_bitmask_torch(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """The torch path (and reference): unpack the bits, then one masked fill over the masked rows."""
    allowed = unpack_bitmask(bitmask, logits.shape[1])  # (num_masked_rows, vocab)
    if rows.numel() == logits.shape[0] and bool((rows == torch.arange(rows.numel(), device=rows.device)).all()):
        logits.masked_fill_(~allowed, float("-inf"))  # every row masked, in order: no gather/scatter
        return
    picked = logits.index_select(0, rows)
    picked.masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, rows, picked)
