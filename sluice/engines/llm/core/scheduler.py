"""Token-budget scheduler: decides, each step, which requests compute how many tokens. Over 300 lines: it
is one state machine (the waiting and running queues and every request status change), with its rules
written out below; the step's data and the checks of its results are in ``scheduler_output.py``.

One scheduling rule for prompts and generation alike (no prefill/decode phases): every request's
``num_computed_tokens`` catches up with its ``num_tokens``, at most ``max_num_batched_tokens`` positions per
step over the whole batch.

Each ``schedule()`` call:

1. Running requests, oldest admission first, each get ``min(tokens it still needs, remaining budget)``
   (and at most ``long_prefill_token_threshold`` when set). If the pool has no block for one, the most
   recently admitted running request is *preempted by recompute* (blocks freed, ``num_computed_tokens = 0``,
   status PREEMPTED, put at the front of the waiting queue) until it fits or it was itself the victim.
2. If nothing was preempted, waiting requests, in order, are admitted while ``max_num_seqs`` and the budget
   allow: prefix-cache lookup, then allocation of blocks for the chunk they compute this step. A request
   is admitted only if ``watermark_blocks`` free blocks remain afterwards (unless nothing is running), so
   a request is not admitted only to be preempted a step later. The queue is FCFS: the first request that
   does not fit stops admission for this step.

A prompt longer than the remaining budget is computed over several steps (chunked prefill).

Speculation (with a :class:`~sluice.engines.llm.core.speculation.Drafter`): a running request that is decoding
(one position left) may get ``k`` draft tokens; it then computes ``1 + k`` positions, counted against the
budget and covered by its KV blocks (if the pool cannot hold them, it decodes plainly instead of preempting
anyone). ``update`` takes the emitted tokens (1..k+1), moves ``num_computed_tokens`` to just before the last
one and frees the blocks that held only rejected drafts.

Recompute past a length (``recompute_past_len``, LongRoPE models): a request's K/V computed while it was at
most that long is invalid once it is longer (the whole sequence is then rotated with other factors, as HF
transformers does). When a running request grows past it, it is recomputed from scratch once (blocks freed,
back to the front of the queue, not counted as a preemption) under a prefix-cache salt of its own, so it
shares blocks only with other long requests; drafts never cross the length.

Progress: the oldest running request is never preempted while another request runs, and ``add`` rejects a
request whose whole lifetime would not fit in the pool alone, so every request finishes.

Callers: the engine thread only (not thread-safe). Order per step::

    out = scheduler.schedule()
    sampled = model_runner.execute(out.scheduled, ...)     # engine; may call scheduler.abort() meanwhile
    tokens, finish = outputs.check_stops(sampled, scheduler)  # request_id -> emitted tokens / stop decision
    finished = scheduler.update(out, tokens, finish)

Pure Python: never imports torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from sluice.engines.llm.core.kv_cache import KVCacheManager
from sluice.engines.llm.core.request import Request, RequestStatus
from sluice.engines.llm.core.scheduler_output import ScheduledRequest, SchedulerOutput
from sluice.engines.llm.core.speculation import Draft, Drafter

__all__ = ["ScheduledRequest", "Scheduler", "SchedulerOutput"]

LONG_CONTEXT_SALT = b"long-context"  # prefix-cache salt of requests past recompute_past_len


class Scheduler:
    """Owns the waiting and running queues and every request status change."""

    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        long_prefill_token_threshold: int = 0,
        watermark_blocks: int | None = None,
        max_model_len: int | None = None,
        drafter: Drafter | None = None,
        recompute_past_len: int | None = None,
    ) -> None:
        """``watermark_blocks`` defaults to 1% of the pool (at least 1); ``max_model_len`` (positions the
        model supports) defaults to no limit other than the pool; ``drafter`` (None = no speculation);
        ``recompute_past_len``: see the module docstring (None = never)."""
        for name, value in (
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if long_prefill_token_threshold < 0:
            raise ValueError(
                f"long_prefill_token_threshold must be >= 0 (0 = off), got {long_prefill_token_threshold}"
            )
        if watermark_blocks is None:
            watermark_blocks = max(1, kv.num_blocks // 100)
        if watermark_blocks < 0 or watermark_blocks > kv.num_blocks:
            raise ValueError(f"watermark_blocks must be in [0, {kv.num_blocks}], got {watermark_blocks}")
        if max_model_len is not None and max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.watermark_blocks = watermark_blocks
        self.max_model_len = max_model_len
        self.drafter = drafter
        self.recompute_past_len = recompute_past_len
        self.num_recomputes = 0  # requests recomputed for growing past recompute_past_len
        self.waiting: deque[Request] = deque()  # WAITING and PREEMPTED, front = next to admit
        self.running: list[Request] = []  # RUNNING, in admission order (last = first preemption victim)
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.num_preemptions = 0  # total since construction
        self._next_arrival_seq = 0

    # ---- queries -------------------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def max_len(self, request: Request) -> int:
        """Length (prompt + output) at which the request finishes with FINISHED_LENGTH."""
        limit = request.max_num_tokens
        return limit if self.max_model_len is None else min(limit, self.max_model_len)

    # ---- requests in and out -------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a new request (WAITING). ValueError, one line, if it could never run."""
        self.check(request)
        request.arrival_seq = self._next_arrival_seq
        self._next_arrival_seq += 1
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def check(self, request: Request) -> None:
        """Raise what :meth:`add` would for ``request``, without queueing it (the engine checks a request
        that first waits for its grammar, so the caller hears at once that it can never run)."""
        if request.status != RequestStatus.WAITING or request.block_ids or request.num_computed_tokens:
            raise ValueError(f"request {request.request_id!r} is not new (status {request.status.name})")
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use by an unfinished request")
        if self.max_model_len is not None and request.num_tokens > self.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: prompt has {request.num_tokens} tokens, more than "
                f"max_model_len={self.max_model_len}; shorten the prompt"
            )
        # The most positions whose K/V must be held: every token but the last sampled one.
        max_kv_tokens = max(request.num_tokens, self.max_len(request) - 1)
        num_blocks_needed = self.kv.num_blocks_for(max_kv_tokens)
        if num_blocks_needed > self.kv.num_blocks:
            raise ValueError(
                f"request {request.request_id!r}: prompt ({request.num_tokens} tokens) plus max_tokens "
                f"({request.params.max_tokens}) needs {num_blocks_needed} KV blocks but the cache has only "
                f"{self.kv.num_blocks}; lower max_tokens, shorten the prompt or give the KV cache more memory"
            )

    def abort(self, request_id: str) -> Request | None:
        """Finish an unfinished request as FINISHED_ABORTED and free its blocks; None if unknown/finished.

        Safe between ``schedule`` and ``update``: ``update`` skips requests that finished meanwhile.
        """
        request = self.requests.get(request_id)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._finish(request, RequestStatus.FINISHED_ABORTED)
        return request

    # ---- one step ------------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Pick this step's batch. See the module docstring for the rules."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            if self._past_recompute_len(request):
                self.running.pop(index)
                self._recompute(request)
                continue
            num_new = self._num_new_tokens(request, request.num_computed_tokens, budget)
            if num_new == 0:
                index += 1
                continue
            decoding = num_new == request.num_tokens - request.num_computed_tokens == 1
            draft = self._draft(request, budget) if decoding else None
            if draft is not None and self.kv.allocate_slots(request, 1 + len(draft.token_ids)):
                num_new = 1 + len(draft.token_ids)
                out.scheduled.append(ScheduledRequest(request, num_new, -1, draft.token_ids, draft.ngram_len))
                budget -= num_new
                index += 1
                continue
            while not self.kv.allocate_slots(request, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                out.scheduled.append(ScheduledRequest(request, num_new))
                budget -= num_new
                index += 1

        # Admitting while preempting would hand the freed blocks to newcomers and thrash.
        while not out.preempted and self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            request = self.waiting[0]
            if self._past_recompute_len(request):  # holds no blocks: only its hashes change
                request.cache_salt = LONG_CONTEXT_SALT
                request.block_hashes.clear()
            hits, num_hit_tokens = self.kv.get_computed_blocks(request)
            num_new = self._num_new_tokens(request, num_hit_tokens, budget)
            reserve = self.watermark_blocks if self.running else 0
            if not self.kv.allocate_slots(request, num_new, hits, num_reserved_blocks=reserve):
                break
            self.waiting.popleft()
            self._admit(request, num_hit_tokens)
            out.scheduled.append(ScheduledRequest(request, num_new))
            budget -= num_new

        out.num_batched_tokens = self.max_num_batched_tokens - budget
        return out

    def update(
        self,
        output: SchedulerOutput,
        sampled: Mapping[str, Sequence[int]],
        finish: Mapping[str, RequestStatus],
    ) -> list[Request]:
        """Apply one step's results; return the requests that finished in it (aborted ones excluded).

        ``sampled``: request_id -> emitted tokens, for exactly the scheduled requests whose step
        ``completes`` (entries for requests aborted meanwhile are ignored): one token, or for a request that
        verified ``k`` drafts its accepted drafts plus one (1..k+1 tokens; the engine may cut the list after
        a stop token). ``finish``: request_id -> FINISHED_STOPPED, FINISHED_LENGTH or FINISHED_ERROR (its
        grammar failed), the engine's stop decisions (on the last token of the list), only for requests in
        ``sampled``. Requests reaching max_tokens or max_model_len are finished with FINISHED_LENGTH even if
        ``finish`` omits them (tokens past that length are dropped).

        Raises ValueError (changing nothing) if ``sampled``/``finish`` do not match the output
        (:meth:`SchedulerOutput.live_results`).
        """
        live, sampled, finish = output.live_results(sampled, finish)
        finished: list[Request] = []
        for item in live:
            request = item.request
            emitted = sampled.get(request.request_id)
            if emitted is None:
                request.num_computed_tokens += item.num_new_tokens
                self.kv.cache_blocks(request, request.num_computed_tokens)
                continue
            tokens = emitted[: max(1, self.max_len(request) - request.num_tokens)]
            if item.draft_token_ids and self.drafter is not None:
                self.drafter.record_verify(
                    request, item.draft_ngram_len, len(item.draft_token_ids), len(tokens) - 1
                )
            # The last token and every accepted draft now have K/V; the newest token does not yet.
            request.num_computed_tokens = request.num_tokens + len(tokens) - 1
            request.output_token_ids.extend(tokens)
            self.kv.cache_blocks(request, request.num_computed_tokens)
            if item.draft_token_ids:
                self.kv.trim(request, request.num_computed_tokens)
            status: RequestStatus | None = finish.get(request.request_id)
            if status is None and request.num_tokens >= self.max_len(request):
                status = RequestStatus.FINISHED_LENGTH
            if status is not None:
                self.running.remove(request)
                self._finish(request, status)
                finished.append(request)
        return finished

    # ---- helpers and named transitions ---------------------------------------------------------------

    def _num_new_tokens(self, request: Request, num_computed_tokens: int, budget: int) -> int:
        """Positions to compute this step: what is left, capped by the long-prefill threshold and budget.

        Never past ``num_tokens``; since ``update`` finishes a request once it reaches ``max_len``, no
        position at or past a request's max length is ever computed.
        """
        num_new = request.num_tokens - num_computed_tokens
        if self.long_prefill_token_threshold:
            num_new = min(num_new, self.long_prefill_token_threshold)
        return min(num_new, budget)

    def _draft(self, request: Request, budget: int) -> Draft | None:
        """Draft tokens for a decoding request: within the budget, never past its max length."""
        if self.drafter is None:
            return None
        # k drafts emit up to k + 1 tokens; the request may emit max_len - num_tokens more.
        max_drafts = min(budget - 1, self.max_len(request) - request.num_tokens - 1)
        if self.recompute_past_len is not None and request.num_tokens <= self.recompute_past_len:
            # a target sampled past the length would need the long-context K/V
            max_drafts = min(max_drafts, self.recompute_past_len - request.num_tokens)
        return self.drafter.propose(request, max_drafts, len(self.running)) if max_drafts > 0 else None

    def _admit(self, request: Request, num_hit_tokens: int) -> None:
        """WAITING/PREEMPTED -> RUNNING, with prefix hits counted as computed."""
        request.move_to(RequestStatus.RUNNING)
        request.num_computed_tokens = num_hit_tokens
        request.num_cached_tokens = num_hit_tokens
        self.running.append(request)

    def _preempt(self, request: Request) -> None:
        """RUNNING -> PREEMPTED: free its blocks; it recomputes prompt + output when readmitted."""
        request.move_to(RequestStatus.PREEMPTED)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _past_recompute_len(self, request: Request) -> bool:
        """True for a request longer than ``recompute_past_len`` whose K/V is still from before it."""
        limit = self.recompute_past_len
        return limit is not None and not request.cache_salt and request.num_tokens > limit

    def _recompute(self, request: Request) -> None:
        """RUNNING -> PREEMPTED under the long-context salt: its K/V is recomputed when readmitted."""
        request.move_to(RequestStatus.PREEMPTED)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.cache_salt = LONG_CONTEXT_SALT
        request.block_hashes.clear()
        self.num_recomputes += 1
        self.waiting.appendleft(request)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        """Any unfinished -> a finished state; frees blocks (full cached ones stay evictable)."""
        request.move_to(status)
        self.kv.free(request)
        del self.requests[request.request_id]
