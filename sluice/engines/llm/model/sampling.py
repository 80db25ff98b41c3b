"""Pick the next token of every sampling row of a step: greedy, temperature, top-k, top-p, seeds.

Guarantees:

* Greedy rows (``temperature == 0``) take the argmax, all in one vectorised op.
* Random rows draw from ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens
  and to the smallest set whose probability reaches ``top_p``; the support never includes a token outside
  those limits.
* A row with a ``seed`` draws its noise from its own generator, seeded from ``(seed, step index)`` where the
  step index is the number of tokens the request has generated so far. Its tokens therefore depend only on
  its own logits, seed and history -- never on which other requests share the batch, nor on preemption.
  Rows without a seed use the sampler's generator (reproducible for one whole run, not per request).
* ``logprobs`` are log-probabilities of the chosen tokens under the model's raw distribution
  (``log_softmax(logits)``, before temperature, top-k, top-p and any grammar mask).
* Rows with a grammar mask (:class:`~sluice.engines.llm.structured.bitmask.TokenBitmask`) choose only
  among the tokens it allows: disallowed logits become ``-inf`` before anything else, so greedy takes the
  best allowed token (the plain argmax whenever that one is allowed) and sampling renormalises over the
  allowed tokens, top-k and top-p counting only those.

Sampling uses the exponential-race form: ``argmax(p / E)`` with ``E ~ Exp(1)`` i.i.d. draws token ``i``
with probability ``p_i``, and turns per-row randomness into one noise vector per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sluice.engines.llm.core.request import SamplingParams
from sluice.engines.llm.structured.bitmask import TokenBitmask, apply_token_bitmask_

_SEED_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, step) pairs over the 64-bit space


@dataclass(frozen=True, slots=True)
class SamplingRow:
    """One row of the logits to sample: whose it is and where its request stands."""

    params: SamplingParams
    step_index: int  # number of tokens the request has generated before this one


@dataclass(frozen=True, slots=True)
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[float] | None  # one per row when any row asked for log-probs, else None


def seed_for(seed: int, step_index: int) -> int:
    """A 63-bit generator seed for draw ``step_index`` of a request seeded with ``seed``."""
    return ((seed * _SEED_MIX) ^ (step_index + 1) * 0xBF58476D1CE4E5B9) & 0x7FFF_FFFF_FFFF_FFFF


class Sampler:
    """Stateless apart from the generator of unseeded rows."""

    def __init__(self, seed: int = 0, kernel_path: str | None = None) -> None:
        """``kernel_path``: the engine's ``KernelPlan.attention``, which the grammar masks follow too."""
        self.kernel_path = kernel_path
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(seed)
        self._row_generator = torch.Generator(device="cpu")

    def sample(
        self, logits: torch.Tensor, rows: list[SamplingRow], token_bitmask: TokenBitmask | None = None
    ) -> SamplerOutput:
        """``logits``: (num_rows, vocab) float32, row ``i`` belonging to ``rows[i]``; ``token_bitmask``: the
        grammar masks of the constrained rows. The logits may be masked in place."""
        raw = logits
        if token_bitmask is not None:
            if any(r.params.logprobs for r in rows):
                logits = logits.clone()  # log-probs stay those of the model's raw distribution
            apply_token_bitmask_(logits, token_bitmask, self.kernel_path)
        num_rows = logits.shape[0]
        token_ids = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
        greedy = [i for i, r in enumerate(rows) if r.params.temperature == 0.0]
        random = [i for i, r in enumerate(rows) if r.params.temperature != 0.0]
        if len(greedy) == num_rows:
            token_ids = argmax_rows(logits)
        elif greedy:
            sel = torch.tensor(greedy, device=logits.device)
            token_ids[sel] = argmax_rows(logits.index_select(0, sel))
        if random:
            sel = torch.tensor(random, device=logits.device)
            token_ids[sel] = self._sample_random(logits.index_select(0, sel), [rows[i] for i in random])
        logprobs = None
        if any(r.params.logprobs for r in rows):
            lp = torch.log_softmax(raw, dim=-1).gather(1, token_ids.unsqueeze(1)).squeeze(1)
            logprobs = lp.tolist()
        return SamplerOutput(token_ids.tolist(), logprobs)

    def _sample_random(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        # logits: (n, vocab) -> (n,) sampled token ids
        n, vocab = logits.shape
        temps = torch.tensor([r.params.temperature for r in rows], dtype=logits.dtype, device=logits.device)
        logits = logits / temps.unsqueeze(1)
        top_ks = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in rows]
        top_ps = [r.params.top_p for r in rows]
        if min(top_ks) < vocab or min(top_ps) < 1.0:
            logits = _restrict(logits, top_ks, top_ps)
        probs = torch.softmax(logits, dim=-1)  # (n, vocab); zero outside the allowed support
        noise = torch.empty(n, vocab, dtype=torch.float32)
        for i, r in enumerate(rows):
            gen = self._generator
            if r.params.seed is not None:
                gen = self._row_generator
                gen.manual_seed(seed_for(r.params.seed, r.step_index))
            noise[i].exponential_(generator=gen)
        return argmax_rows(probs / noise.to(probs.device))


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of ``(n, vocab)`` rows (int64): the first index of each row's largest value, a NaN
    counting as largest. On the CPU through numpy's vectorised argmax: the same indices in a fraction of
    the time of torch's reduction, which shows on a small model's decode step."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and not x.requires_grad:
        return torch.from_numpy(x.contiguous().numpy().argmax(axis=-1)).to(torch.int64)
    return x.argmax(dim=-1)


def _restrict(logits: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p support to -inf. ``logits``: (n, vocab)."""
    n, vocab = logits.shape
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (n, vocab)
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)  # (1, vocab)
    k = torch.tensor(top_ks, device=logits.device).unsqueeze(1)  # (n, 1)
    drop = ranks >= k
    p = torch.tensor(top_ps, dtype=logits.dtype, device=logits.device).unsqueeze(1)
    sorted_probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    # Keep a token while the probability mass strictly before it is < top_p (the top token always stays).
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop |= mass_before >= p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
