"""Prompt-lookup speculative decoding: draft tokens from n-grams of a request's own tokens, verify in one pass.

A request that is decoding normally computes one position per step. With speculation, the scheduler asks
the :class:`Drafter` for up to ``num_speculative_tokens`` draft tokens, found by matching the request's last
``n`` tokens (``n`` from ``ngram_max`` down to ``ngram_min``) against its earlier tokens -- the prompt and
the output so far -- and copying what followed the most recent match. The step then computes the last
token *and* the drafts (``1 + k`` query positions, like a small prefill chunk), samples a target token at
every position, and keeps (:func:`accept_drafts`) the longest run of drafts equal to their targets plus the
target after it: between 1 and ``k + 1`` tokens per step.

Why the output distribution is unchanged. A prompt-lookup draft is a point mass ``q = δ_d``. The standard
rejection rule accepts ``d`` with probability ``min(1, p(d) / q(d)) = p(d)`` and otherwise samples from
``max(p - q, 0)`` normalised, i.e. ``p`` with ``d`` removed. Drawing ``t ~ p`` (with the request's own
sampler, seed and step index) and accepting iff ``t == d``, else emitting ``t``, is exactly that rule:
``P(accept) = p(d)`` and ``P(t = x | t != d) = p(x) / (1 - p(d))``. Greedy is the special case ``p = δ_argmax``.
So seeded requests even draw the same tokens with and without speculation.

When drafting pays (the adaptive gate). Verifying a draft costs one more token of compute; it pays only if
it is accepted often enough. The :class:`StepCostModel` fits ``step_s = fixed_s + per_token_s * tokens`` on
the engine's measured steps; each request keeps a decayed estimate ``a`` of its per-draft acceptance
probability. Draft ``j`` (1-based) is proposed while ``a**j * seconds_per_emitted_token >= per_token_s``:
on a small batch (a step's fixed cost dominates) even poor drafts pay, on a large compute-bound CPU batch
only drafts that are nearly always right do. Pure Python: never imports torch.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.engines.llm.request import Request

_PRIOR_WEIGHT = 2.0  # pseudo-observations of the engine-wide acceptance rate behind each request's estimate
_PRIOR_FLOOR = 0.2  # the prior never drops below this, so drafting is retried where it is cheap
_DECAY_ON_VERIFY = 0.8  # weight of a request's older evidence after each verify (recent text matters most)
_DECAY_IDLE = 0.95  # per step without drafts: evidence fades, so a request gated off is retried later
_MIN_STEPS_FOR_MODEL = 8  # steps the cost model sees before it gates anything


def propose_ngram_drafts(
    token_ids: Sequence[int], num_drafts: int, ngram_max: int, ngram_min: int
) -> list[int]:
    """Up to ``num_drafts`` tokens that followed the most recent earlier occurrence of the longest suffix.

    Tries suffix lengths ``n = ngram_max .. ngram_min``; the first ``n`` whose last ``n`` tokens occur earlier
    (an occurrence ending before the last token, so that at least one token follows it) wins. Returns ``[]``
    when no suffix recurs or ``num_drafts < 1``. Token ids must be in ``[0, 2**32)``.
    """
    length = len(token_ids)
    if num_drafts < 1 or length < 2:
        return []
    packed = array("I", token_ids)
    width = packed.itemsize
    data = packed.tobytes()  # fixed-width tokens: bytes.rfind searches in C
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        pattern = data[(length - n) * width :]
        end = (length - 1) * width  # the match must end at or before the last token's start
        while True:
            index = data.rfind(pattern, 0, end)
            if index < 0:
                break
            if index % width == 0:
                start = index // width + n
                return list(token_ids[start : start + num_drafts])
            end = index + len(pattern) - 1  # misaligned byte match: look further left
    return []


def accept_drafts(draft_ids: Sequence[int], target_ids: Sequence[int]) -> list[int]:
    """Tokens a verify step emits: the longest prefix of drafts equal to their targets, then one target.

    ``target_ids[j]`` is the token sampled at draft position ``j`` (``len(draft_ids) + 1`` of them, the last
    one after every draft). Returns between 1 and ``len(draft_ids) + 1`` tokens.
    """
    if len(target_ids) != len(draft_ids) + 1:
        raise ValueError(
            f"need {len(draft_ids) + 1} target tokens for {len(draft_ids)} drafts, got {len(target_ids)}"
        )
    num_accepted = 0
    while num_accepted < len(draft_ids) and draft_ids[num_accepted] == target_ids[num_accepted]:
        num_accepted += 1
    return list(target_ids[: num_accepted + 1])


@dataclass(slots=True)
class SpecStats:
    """Engine-wide speculation counters."""

    num_draft_tokens: int = 0  # drafts verified
    num_accepted_tokens: int = 0  # drafts that matched their target and were emitted
    num_evaluated_tokens: int = 0  # drafts up to and including each verify's first rejection

    @property
    def acceptance_rate(self) -> float:
        """Accepted / verified drafts (0.0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def per_draft_acceptance(self) -> float:
        """Probability that a draft is accepted given the ones before it were (0.5 before any evidence)."""
        return self.num_accepted_tokens / self.num_evaluated_tokens if self.num_evaluated_tokens else 0.5


class StepCostModel:
    """Online least-squares fit of ``step_s = fixed_s + per_token_s * num_tokens`` over recent steps."""

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay  # older steps fade: the machine's load changes
        self.num_steps = 0
        self._w = self._n = self._t = self._nn = self._nt = 0.0

    def record(self, num_tokens: int, step_s: float) -> None:
        d = self.decay
        self._w = d * self._w + 1.0
        self._n = d * self._n + num_tokens
        self._t = d * self._t + step_s
        self._nn = d * self._nn + num_tokens * num_tokens
        self._nt = d * self._nt + num_tokens * step_s
        self.num_steps += 1

    def fit(self) -> tuple[float, float] | None:
        """``(fixed_s, per_token_s)``, or None while the steps seen do not pin down a slope."""
        if self.num_steps < _MIN_STEPS_FOR_MODEL:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var_n = self._nn / self._w - mean_n * mean_n
        if var_n < 1.0:  # every step had (nearly) the same size: no slope to read
            return None
        per_token_s = max(0.0, (self._nt / self._w - mean_n * mean_t) / var_n)
        return max(0.0, mean_t - per_token_s * mean_n), per_token_s


class Drafter:
    """Proposes drafts for the scheduler and keeps the acceptance statistics.

    Called by the scheduler (``propose``, ``record_verify``, ``record_idle``) and by the engine
    (``record_step``, after timing each step). Single-threaded, like the scheduler.
    """

    def __init__(self, num_speculative_tokens: int, ngram_max: int = 3, ngram_min: int = 1,
                 adaptive: bool = True) -> None:  # fmt: skip
        if num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be >= 1 for a drafter, got {num_speculative_tokens}"
            )
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(
                f"need 1 <= speculative_ngram_min <= speculative_ngram_max, got {ngram_min}, {ngram_max}"
            )
        self.num_speculative_tokens = num_speculative_tokens
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.adaptive = adaptive
        self.stats = SpecStats()
        self.cost = StepCostModel()

    def propose(self, request: Request, max_drafts: int, num_running: int) -> list[int]:
        """Drafts for ``request``'s next step: at most ``min(max_drafts, num_speculative_tokens)``, fewer when
        the adaptive gate expects the later ones not to pay for their compute on a batch of ``num_running``."""
        limit = min(max_drafts, self.num_speculative_tokens)
        if limit < 1:
            return []
        if self.adaptive:
            limit = min(limit, self._num_worth_drafting(request, num_running))
            if limit < 1:
                self.record_idle(request)
                return []
        return propose_ngram_drafts(request.all_token_ids, limit, self.ngram_max, self.ngram_min)

    def record_verify(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        """One verify step's outcome for ``request``: ``num_accepted`` of its ``num_drafts`` drafts emitted."""
        num_evaluated = num_accepted + (1 if num_accepted < num_drafts else 0)
        self.stats.num_draft_tokens += num_drafts
        self.stats.num_accepted_tokens += num_accepted
        self.stats.num_evaluated_tokens += num_evaluated
        request.num_draft_tokens += num_drafts
        request.num_accepted_draft_tokens += num_accepted
        request.spec_recent_accepted = _DECAY_ON_VERIFY * request.spec_recent_accepted + num_accepted
        request.spec_recent_evaluated = _DECAY_ON_VERIFY * request.spec_recent_evaluated + num_evaluated

    def record_idle(self, request: Request) -> None:
        """A decoding step without drafts: the request's evidence fades toward the engine-wide rate."""
        request.spec_recent_accepted *= _DECAY_IDLE
        request.spec_recent_evaluated *= _DECAY_IDLE

    def record_step(self, num_tokens: int, step_s: float) -> None:
        """The engine's measured time for a step that computed ``num_tokens`` positions."""
        self.cost.record(num_tokens, step_s)

    def _num_worth_drafting(self, request: Request, num_running: int) -> int:
        fit = self.cost.fit()
        if fit is None:
            return self.num_speculative_tokens
        fixed_s, per_token_s = fit
        if per_token_s <= 0.0:
            return self.num_speculative_tokens
        # What one emitted token costs now: a plain decode step of the running batch, shared by its requests.
        batch = max(1, num_running)
        s_per_emitted = (fixed_s + per_token_s * batch) / batch
        prior = max(_PRIOR_FLOOR, self.stats.per_draft_acceptance)
        accept = (request.spec_recent_accepted + _PRIOR_WEIGHT * prior) / (
            request.spec_recent_evaluated + _PRIOR_WEIGHT
        )
        num, gain = 0, 1.0
        while num < self.num_speculative_tokens:
            gain *= accept  # probability that draft num+1 is emitted
            if gain * s_per_emitted < per_token_s:
                break
            num += 1
        return num
