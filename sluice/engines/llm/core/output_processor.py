"""What the engine keeps per request between ``add_request`` and its finish, and the output it ends with.

For each unfinished request: its detokenised text (only when it has stop strings to look for), its
log-probs (when asked for), and why it failed (a structured-output error). Each step,
:meth:`OutputProcessor.check_stops` reads the sampled tokens, records their log-probs and text, and cuts
each request's run of tokens after its first stop (a stop token, an EOS unless ``ignore_eos``, a stop
string, a grammar that cannot go on or is complete); :meth:`OutputProcessor.output` turns a finished
request into its :class:`~sluice.engines.llm.core.output.RequestOutput`.

Output contract: ``token_ids`` are all generated tokens, including a final stop token (an EOS or one of
``stop_token_ids``); ``text`` is their detokenised text without special tokens and, when a stop string ended
the request, cut just before that stop string (the stop string is excluded).

Pure Python (never imports torch); called from the engine thread only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from sluice.engines.llm.core.output import RequestOutput, SampledToken
from sluice.engines.llm.core.request import Request, RequestStatus, SamplingParams
from sluice.engines.llm.core.scheduler import Scheduler
from sluice.engines.llm.loading.chat_tokenizer import ChatTokenizer, IncrementalDetokenizer

if TYPE_CHECKING:
    from sluice.engines.llm.structured.manager import StructuredOutputManager


class _Tracker:
    """Engine-side state of one request: stop strings, log-probs, a structured-output failure."""

    __slots__ = ("detok", "error", "logprobs", "stop_at")

    def __init__(self, detok: IncrementalDetokenizer | None, want_logprobs: bool) -> None:
        self.detok = detok
        self.logprobs: list[float] | None = [] if want_logprobs else None
        self.stop_at: int | None = None  # text offset of a matched stop string
        self.error: str | None = None  # why the request finished FINISHED_ERROR


class OutputProcessor:
    """Per-request stop checks and output assembly. ``tokenizer`` None: token-id prompts only (no stop
    strings, empty ``text``)."""

    def __init__(self, tokenizer: ChatTokenizer | None, eos_token_ids: Iterable[int],
                 structured: StructuredOutputManager) -> None:
        self.tokenizer = tokenizer
        self.structured = structured
        self.eos_token_ids = frozenset(eos_token_ids)  # the model's; a request stops at one unless ignore_eos
        self._trackers: dict[str, _Tracker] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._trackers

    def add(self, request_id: str, params: SamplingParams) -> None:
        """Start tracking a request just added to the engine."""
        detok = IncrementalDetokenizer(self.tokenizer) if params.stop and self.tokenizer else None
        self._trackers[request_id] = _Tracker(detok, params.logprobs)

    def discard(self, request_id: str) -> None:
        """Forget an aborted request (unknown ids are ignored)."""
        self._trackers.pop(request_id, None)

    def fail(self, request_id: str, reason: str) -> None:
        """Record why a request finishes FINISHED_ERROR (its grammar could not be compiled)."""
        self._trackers[request_id].error = reason

    def check_stops(
        self, sampled: dict[str, list[SampledToken]], scheduler: Scheduler
    ) -> tuple[dict[str, list[int]], dict[str, RequestStatus]]:
        """Record log-probs and detokenised text; cut each token run after its first stop.

        Returns the tokens to append per request and which requests stop (on their last token). A run never
        goes past the request's max length (the scheduler drafts within it; cut here too, to be sure).
        A constrained request's grammar advances over the kept tokens: if it cannot, the request finishes
        FINISHED_ERROR (unless it stops anyway); a model without an EOS token stops once the grammar is
        complete.
        """
        tokens: dict[str, list[int]] = {}
        stops: dict[str, RequestStatus] = {}
        for rid, run in sampled.items():
            tracker = self._trackers[rid]
            request = scheduler.requests[rid]
            params = request.params
            kept = tokens[rid] = []
            for s in run[: max(1, scheduler.max_len(request) - request.num_tokens)]:
                kept.append(s.token_id)
                if tracker.logprobs is not None and s.logprob is not None:
                    tracker.logprobs.append(s.logprob)
                if s.token_id in params.stop_token_ids or (s.token_id in self.eos_token_ids and not params.ignore_eos):
                    stops[rid] = RequestStatus.FINISHED_STOPPED
                    break
                if tracker.detok is not None:
                    delta = tracker.detok.add(s.token_id)
                    if delta and _find_stop(tracker, params.stop, len(delta)):
                        stops[rid] = RequestStatus.FINISHED_STOPPED
                        break
            if params.structured_output is not None:
                problem = self.structured.accept(rid, kept)
                if problem is not None and rid not in stops:
                    stops[rid] = RequestStatus.FINISHED_ERROR
                    tracker.error = problem
                elif not self.eos_token_ids and self.structured.is_terminated(rid):
                    stops[rid] = RequestStatus.FINISHED_STOPPED
        return tokens, stops

    def output(self, request: Request) -> RequestOutput:
        """The finished request's output; stops tracking it."""
        tracker = self._trackers.pop(request.request_id)
        if tracker.detok is not None:
            text = tracker.detok.text if tracker.stop_at is None else tracker.detok.text[: tracker.stop_at]
        elif self.tokenizer is not None:
            text = self.tokenizer.decode(request.output_token_ids)
        else:
            text = ""
        return RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=list(request.output_token_ids),
            text=text,
            status=request.status,
            logprobs=tracker.logprobs,
            num_cached_tokens=request.num_cached_tokens,
            num_draft_tokens=request.num_draft_tokens,
            num_accepted_draft_tokens=request.num_accepted_draft_tokens,
            error=tracker.error,
        )


def _find_stop(tracker: _Tracker, stops: tuple[str, ...], delta_len: int) -> bool:
    """Look for a stop string overlapping the newest text; record where the earliest one starts."""
    text = tracker.detok.text if tracker.detok is not None else ""
    window_start = max(0, len(text) - delta_len - max(len(s) for s in stops) + 1)
    found = [i for i in (text.find(s, window_start) for s in stops) if i >= 0]
    if not found:
        return False
    tracker.stop_at = min(found)
    return True
