"""What the scheduler hands the model runner for one step: plain data, fixed when scheduled; and what the
step's results must be to be applied (:meth:`SchedulerOutput.live_results`).

Pure Python: never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sluice.engines.llm.core.request import Request, RequestStatus

# What the engine may decide for a request that sampled this step.
_ENGINE_DECISIONS = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ERROR)


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

    def live_results(
        self, sampled: Mapping[str, Sequence[int]], finish: Mapping[str, RequestStatus]
    ) -> tuple[list[ScheduledRequest], dict[str, Sequence[int]], dict[str, RequestStatus]]:
        """The scheduled requests still unfinished, and their entries of ``sampled`` and ``finish`` (those of
        requests aborted since ``schedule`` are dropped), checked against what this step computed.

        Raises ValueError where they do not match: an output applied twice, tokens for a request that did
        not complete its tokens (or none for one that did), more tokens than drafts verified plus one, a
        finish decision for a request that sampled nothing or that is not STOPPED, LENGTH or ERROR.
        """
        live = [s for s in self.scheduled if not s.request.is_finished]
        gone = {s.request.request_id for s in self.scheduled if s.request.is_finished}
        sampled = {rid: tok for rid, tok in sampled.items() if rid not in gone}  # aborted meanwhile
        finish = {rid: st for rid, st in finish.items() if rid not in gone}
        for item in live:
            if item.request.num_computed_tokens != item.num_computed_tokens:
                raise ValueError(f"stale scheduler output for {item.request.request_id!r}: update applied twice?")
        expected = {s.request.request_id: len(s.draft_token_ids) for s in live if s.completes}
        if set(sampled) != set(expected):
            raise ValueError(f"sampled tokens for {sorted(sampled)} but these requests completed their tokens: "
                             f"{sorted(expected)}")
        for request_id, tokens in sampled.items():
            if not 1 <= len(tokens) <= expected[request_id] + 1:
                raise ValueError(f"{len(tokens)} tokens for {request_id!r}, which verified "
                                 f"{expected[request_id]} drafts: give 1..{expected[request_id] + 1}")  # fmt: skip
        for request_id, decision in finish.items():
            if request_id not in expected:
                raise ValueError(f"finish decision for {request_id!r}, which sampled no token this step")
            if decision not in _ENGINE_DECISIONS:
                raise ValueError(f"finish decision for {request_id!r} must be STOPPED, LENGTH or ERROR, got "
                                 f"{decision!r}")
        return live, dict(sampled), dict(finish)
