"""What the engine hands back: a finished request (:class:`RequestOutput`) and its numbers (:class:`EngineStats`).

Plain, frozen data, made by ``llm_engine.py``; ``LLM.generate`` / ``step`` return the first, ``LLM.stats`` the
second.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.engines.llm.core.request import RequestStatus

_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """A finished request."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens, a final stop token included
    text: str  # detokenised output (special tokens skipped; a matched stop string excluded)
    status: RequestStatus  # FINISHED_STOPPED, FINISHED_LENGTH or FINISHED_ERROR
    logprobs: list[float] | None  # log-prob of each generated token, when requested
    num_cached_tokens: int  # prompt tokens served by the prefix cache (at the last admission)
    num_draft_tokens: int = 0  # speculative drafts verified for this request
    num_accepted_draft_tokens: int = 0  # drafts emitted as output (each saved one decode step)
    error: str | None = None  # FINISHED_ERROR: why its structured output could not go on

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted / verified drafts of this request (0.0 when none were proposed)."""
        return self.num_accepted_draft_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def finish_reason(self) -> str:
        return _FINISH_REASONS.get(self.status, self.status.name.lower())


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_prompt_tokens: int  # prompt tokens of all added requests
    num_output_tokens: int  # tokens generated so far
    num_preemptions: int
    prefix_cache_hit_rate: float  # hit tokens / queried tokens, 0..1
    kv_usage: float  # fraction of KV blocks in use now
    num_kv_blocks: int
    num_steps: int
    num_draft_tokens: int = 0  # speculative drafts verified
    num_accepted_draft_tokens: int = 0  # drafts emitted as output
    spec_acceptance_rate: float = 0.0  # accepted / verified drafts, 0..1
    num_requests: int = 0  # requests added
    num_prefix_query_tokens: int = 0  # prompt tokens looked up in the prefix cache
    num_prefix_hit_tokens: int = 0  # of those, served from it
    structured: StructuredStats | None = None  # structured output: grammars, cache hits, mask time
    num_graph_steps: int = 0  # decode steps replayed from a compiled graph (kernels.decode_graphs)

    @property
    def structured_share(self) -> float:
        """Share of added requests that were constrained by structured output, 0..1."""
        if self.structured is None or not self.num_requests:
            return 0.0
        return self.structured.num_requests / self.num_requests

@dataclass(frozen=True, slots=True)
class SampledToken:
    """One token the model runner sampled for a request in a step (with its log-prob when asked for)."""

    token_id: int
    logprob: float | None  # only when the request asked for log-probs


@dataclass(frozen=True, slots=True)
class StructuredStats:
    """Structured output's counters, as :meth:`StructuredOutputManager.stats` reports them."""

    num_requests: int  # constrained requests added
    num_waiting: int  # of those, waiting for their grammar now
    num_grammars_compiled: int  # distinct constraints compiled (failures included)
    num_grammar_cache_hits: int  # requests whose grammar was already compiled or compiling
    num_grammar_errors: int  # constraints that failed to compile
    grammar_compile_s: float  # seconds spent compiling, on the compile thread
    mask_fill_s: float  # seconds the engine thread spent filling bitmasks
    num_mask_steps: int  # steps that filled at least one mask
    num_masked_rows: int  # bitmask rows filled (a request verifying k drafts fills k + 1)

    @property
    def mask_fill_ms_per_step(self) -> float:
        return 1000.0 * self.mask_fill_s / self.num_mask_steps if self.num_mask_steps else 0.0
