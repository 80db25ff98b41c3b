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
the engine's measured steps; the drafter keeps, per n-gram match length, a decayed estimate ``a`` of the
probability that a draft is accepted. Draft ``j`` (1-based) is proposed while
``a**j * seconds_per_emitted_token >= per_token_s``:
on a small batch (a step's fixed cost dominates) even poor drafts pay, on a large compute-bound CPU batch
only drafts that are nearly always right do.

Structured output (a :class:`DraftConstraint`): a constrained request's drafts must be allowed by its
grammar, so n-gram drafts are cut at the first token the grammar rejects; and where the grammar *forces*
the next tokens (the keys of a JSON object, say), those are the drafts instead. Forced drafts have their own
acceptance estimate (n-gram length 0): the model may still prefer another tokenisation of the same text,
which verification keeps, so the output is what constrained decoding without drafts gives.

Pure Python: never imports torch.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sluice.engines.llm.core.request import Request

_DECAY = 0.995  # weight of older acceptance evidence at each verify (about the last 200 verifies count)
_MIN_STEPS_FOR_MODEL = 8  # steps the cost model sees before it gates anything
FORCED_NGRAM_LEN = 0  # the acceptance bucket of drafts a grammar forces (n-gram matches have n >= 1)


def find_ngram_match(token_ids: Sequence[int], ngram_max: int, ngram_min: int) -> tuple[int, int] | None:
    """The longest suffix that recurs, and where the tokens after its most recent earlier occurrence start.

    Tries suffix lengths ``n = ngram_max .. ngram_min``; the first ``n`` whose last ``n`` tokens occur earlier
    (an occurrence ending before the last token, so that at least one token follows it) wins. Returns
    ``(n, start)`` with ``token_ids[start]`` the first token after that occurrence, or None. Token ids must
    be in ``[0, 2**32)``.
    """
    length = len(token_ids)
    if length < 2:
        return None
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
                return n, index // width + n
            end = index + len(pattern) - 1  # misaligned byte match: look further left
    return None


def propose_ngram_drafts(
    token_ids: Sequence[int], num_drafts: int, ngram_max: int, ngram_min: int
) -> list[int]:
    """Up to ``num_drafts`` tokens that followed the most recent earlier occurrence of the longest recurring
    suffix (see :func:`find_ngram_match`); ``[]`` when none recurs or ``num_drafts < 1``."""
    match = find_ngram_match(token_ids, ngram_max, ngram_min) if num_drafts > 0 else None
    if match is None:
        return []
    return list(token_ids[match[1] : match[1] + num_drafts])


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


class DraftConstraint(Protocol):
    """Keeps a request's drafts inside its grammar. Called by the Drafter while the scheduler plans a step
    (engine thread); never changes a request's grammar state."""

    def constrains(self, request: Request) -> bool:
        """True when ``request`` has a grammar."""
        ...

    def forced_tokens(self, request: Request, limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar forces next, possibly none."""
        ...

    def num_valid(self, request: Request, token_ids: Sequence[int]) -> int:
        """How many leading ``token_ids`` the grammar allows next."""
        ...


@dataclass(frozen=True, slots=True)
class Draft:
    """Draft tokens for one request's next step, and the length of the n-gram match they came from."""

    token_ids: list[int]
    ngram_len: int


@dataclass(slots=True)
class SpecStats:
    """Engine-wide speculation counters."""

    num_draft_tokens: int = 0  # drafts verified
    num_accepted_tokens: int = 0  # drafts that matched their target and were emitted

    @property
    def acceptance_rate(self) -> float:
        """Accepted / verified drafts (0.0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


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

    Called by the scheduler (``propose``, ``record_verify``) and by the engine (``record_step``, after timing
    each step). Single-threaded, like the scheduler.

    The gate's acceptance estimate is per n-gram length (a draft copied after a 3-token match is right far
    more often than one after a 1-token match): ``a_n = (accepted_n + 1) / (evaluated_n + 2)`` over decayed
    counts of drafts up to and including each verify's first rejection.
    """

    def __init__(self, num_speculative_tokens: int, ngram_max: int = 3, ngram_min: int = 1,
                 adaptive: bool = True, constraint: DraftConstraint | None = None) -> None:  # fmt: skip
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
        self.constraint = constraint  # structured output: drafts stay inside each request's grammar
        self.stats = SpecStats()
        self.cost = StepCostModel()
        self._accepted_by_n = [0.0] * (ngram_max + 1)  # decayed counts, index = n-gram length
        self._evaluated_by_n = [0.0] * (ngram_max + 1)

    def acceptance_estimate(self, ngram_len: int) -> float:
        """Probability that a draft after an ``ngram_len`` match is accepted, given the ones before it were."""
        return (self._accepted_by_n[ngram_len] + 1.0) / (self._evaluated_by_n[ngram_len] + 2.0)

    def propose(self, request: Request, max_drafts: int, num_running: int) -> Draft | None:
        """Drafts for ``request``'s next step: at most ``min(max_drafts, num_speculative_tokens)``, fewer when
        the adaptive gate expects the later ones not to pay for their compute on a batch of ``num_running``."""
        limit = min(max_drafts, self.num_speculative_tokens)
        if limit < 1:
            return None
        constraint = self.constraint if self.constraint is not None and self.constraint.constrains(request) else None
        if constraint is not None:
            forced = self._forced(constraint, request, limit, num_running)
            if forced is not None:
                return forced
        tokens = request.all_token_ids
        match = find_ngram_match(tokens, self.ngram_max, self.ngram_min)
        if match is None:
            return None
        ngram_len, start = match
        if self.adaptive:
            limit = min(limit, self._num_worth_drafting(ngram_len, num_running))
        drafts = tokens[start : start + limit]
        if constraint is not None and drafts:
            drafts = drafts[: constraint.num_valid(request, drafts)]
        return Draft(drafts, ngram_len) if drafts else None

    def _forced(self, constraint: DraftConstraint, request: Request, limit: int, num_running: int) -> Draft | None:
        """The tokens the request's grammar forces next, as drafts (None when it forces none)."""
        forced = constraint.forced_tokens(request, limit)
        if not forced:
            return None
        if self.adaptive:
            forced = forced[: self._num_worth_drafting(FORCED_NGRAM_LEN, num_running)]
        return Draft(forced, FORCED_NGRAM_LEN) if forced else None

    def record_verify(self, request: Request, ngram_len: int, num_drafts: int, num_accepted: int) -> None:
        """One verify step's outcome for ``request``: ``num_accepted`` of its ``num_drafts`` drafts emitted."""
        num_evaluated = num_accepted + (1 if num_accepted < num_drafts else 0)
        self.stats.num_draft_tokens += num_drafts
        self.stats.num_accepted_tokens += num_accepted
        request.num_draft_tokens += num_drafts
        request.num_accepted_draft_tokens += num_accepted
        self._accepted_by_n[ngram_len] = _DECAY * self._accepted_by_n[ngram_len] + num_accepted
        self._evaluated_by_n[ngram_len] = _DECAY * self._evaluated_by_n[ngram_len] + num_evaluated

    def record_step(self, num_tokens: int, step_s: float) -> None:
        """The engine's measured time for a step that computed ``num_tokens`` positions."""
        self.cost.record(num_tokens, step_s)

    def _num_worth_drafting(self, ngram_len: int, num_running: int) -> int:
        fit = self.cost.fit()
        if fit is None:
            return self.num_speculative_tokens
        fixed_s, per_token_s = fit
        if per_token_s <= 0.0:
            return self.num_speculative_tokens
        # What one emitted token costs now: a plain decode step of the running batch, shared by its requests.
        batch = max(1, num_running)
        s_per_emitted = (fixed_s + per_token_s * batch) / batch
        accept = self.acceptance_estimate(ngram_len)
        num, gain = 0, 1.0
        while num < self.num_speculative_tokens:
            gain *= accept  # probability that draft num+1 is emitted
            if gain * s_per_emitted < per_token_s:
                break
            num += 1
        return num
