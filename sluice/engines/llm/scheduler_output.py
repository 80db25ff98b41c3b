"""What the scheduler hands the model runner for one step: plain data, fixed when scheduled.

Pure Python: never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.engines.llm.request import Request


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step. ``num_computed_tokens`` and ``completes`` are fixed when scheduled,
    so they stay right after ``update`` has advanced the request."""

    request: Request
    num_new_tokens: int  # positions [num_computed_tokens, num_computed_tokens + num_new_tokens) this step
    num_computed_tokens: int = -1  # first position computed this step; -1 -> taken from the request
    # Speculative drafts; they fill the last len(draft_token_ids) of the num_new_tokens positions.
    draft_token_ids: list[int] = field(default_factory=list)
    draft_ngram_len: int = 0  # length of the n-gram match the drafts were copied after
    # True when this step computes the request's last known token, so tokens must be sampled: one, or
    # 1..len(draft_token_ids)+1 when it verifies drafts.
    completes: bool = field(init=False)

    def __post_init__(self) -> None:
        if self.num_computed_tokens < 0:
            self.num_computed_tokens = self.request.num_computed_tokens
        end = self.num_computed_tokens + self.num_new_tokens - len(self.draft_token_ids)
        self.completes = end == self.request.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    """What one step computes."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)  # running first, then newly admitted
    preempted: list[Request] = field(default_factory=list)  # preempted during this schedule() call
    num_batched_tokens: int = 0  # sum of num_new_tokens, <= max_num_batched_tokens
