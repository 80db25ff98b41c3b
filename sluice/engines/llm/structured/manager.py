"""The grammar state of one engine's constrained requests: the engine thread's only door to grammars.

Life of a request with ``structured_output``::

    manager.add(request)                 # compile submitted (or a cache hit); it waits here, not scheduled
    ready, failed = manager.poll()       # each step: compiled ones go to the scheduler, failed ones finish
    mask = manager.fill_bitmask(batch)   # each step: masks for every constrained row, one backend call
    error = manager.accept(rid, tokens)  # each step: advance over the emitted tokens
    manager.remove(rid)                  # finished or aborted

While one request waits for its grammar the others keep stepping: nothing here blocks except
:meth:`wait`, which the engine calls only when there is nothing else to compute.

Drafts (speculative decoding): the manager is the Drafter's :class:`~sluice.engines.llm.core.speculation.
DraftConstraint`. Drafts are checked against the grammar when proposed, so a step only verifies drafts the
grammar allows; the mask of the row after draft ``j`` is filled from the matcher advanced over drafts
``0..j-1`` and rolled back (inside the backend's batch call). A matcher only ever consumes the tokens a
step finally emits, so rejected drafts leave no trace in it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures

import torch

from sluice.engines.engine_contract import first_line
from sluice.engines.llm.core.output import StructuredStats
from sluice.engines.llm.core.request import Request
from sluice.engines.llm.core.scheduler_output import ScheduledRequest
from sluice.engines.llm.structured.backend import BitmaskRow, GrammarBackend, GrammarError, GrammarMatcher
from sluice.engines.llm.structured.bitmask import TokenBitmask
from sluice.engines.llm.structured.compiler import Compiled, GrammarCompiler


class StructuredOutputManager:
    """See the module docstring. Engine thread only."""

    def __init__(self, compiler: GrammarCompiler, pin_memory: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._compiler = compiler
        self._pin_memory = pin_memory  # CUDA: masks copy to the device asynchronously from pinned memory
        self._clock = clock
        self._waiting: dict[str, tuple[Request, Future[Compiled]]] = {}
        self._matchers: dict[str, GrammarMatcher] = {}
        self._backend: GrammarBackend | None = None  # the compiler's, known from the first compiled grammar
        self._buffer: torch.Tensor | None = None  # (max rows so far, words) int32, reused every step
        self._num_requests = 0
        self._mask_fill_s = 0.0
        self._num_mask_steps = 0
        self._num_masked_rows = 0

    # ---- requests in and out -------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        """Start compiling the grammar of a constrained request; it waits here until :meth:`poll`."""
        spec = request.params.structured_output
        if spec is None:
            raise ValueError(f"request {request.request_id!r} has no structured_output")
        self._waiting[request.request_id] = (request, self._compiler.submit(spec))
        self._num_requests += 1

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def poll(self) -> tuple[list[Request], list[tuple[Request, str]]]:
        """Requests whose grammar is ready (in the order added) and those whose grammar failed, with why."""
        if not self._waiting:
            return [], []
        ready: list[Request] = []
        failed: list[tuple[Request, str]] = []
        for request_id, (request, future) in list(self._waiting.items()):
            if not future.done():
                continue
            del self._waiting[request_id]
            try:
                compiled = future.result()
            except GrammarError as err:
                failed.append((request, f"the {request.params.structured_output.kind} cannot be "  # type: ignore[union-attr]
                                        f"used: {err}"))
                continue
            except Exception as err:  # the backend could not be built (library missing, odd tokenizer)
                failed.append((request, f"structured output is unavailable: {first_line(err)}"))
                continue
            self._backend = compiled.backend
            matcher = compiled.backend.matcher(compiled.grammar)
            problem = matcher.error()
            if problem is not None:
                failed.append((request, f"the grammar cannot start: {problem}"))
                continue
            self._matchers[request_id] = matcher
            ready.append(request)
        return ready, failed

    def wait(self, timeout_s: float) -> None:
        """Block until some waiting request's grammar is done, at most ``timeout_s`` (nothing else to do)."""
        if self._waiting:
            wait_futures([f for _, f in self._waiting.values()], timeout=timeout_s, return_when=FIRST_COMPLETED)

    def remove(self, request_id: str) -> Request | None:
        """Forget a request; returns it if it was still waiting for its grammar (never scheduled)."""
        self._matchers.pop(request_id, None)
        waiting = self._waiting.pop(request_id, None)
        return waiting[0] if waiting is not None else None

    # ---- each step -----------------------------------------------------------------------------------

    def fill_bitmask(self, scheduled: Sequence[ScheduledRequest]) -> TokenBitmask | None:
        """Masks for every sampled row of a constrained request in this step's batch; None if there is none.

        Rows follow the model runner's sampling order: each completing request has ``1 + len(drafts)``
        rows, the first for the token after its last one, then one after each draft.
        """
        if not self._matchers:
            return None
        entries: list[BitmaskRow] = []
        logits_rows: list[int] = []
        row = 0
        for item in scheduled:
            if not item.completes:
                continue
            num_rows = 1 + len(item.draft_token_ids)
            matcher = self._matchers.get(item.request.request_id)
            if matcher is not None:
                entries.append((matcher, len(logits_rows), item.draft_token_ids))
                logits_rows.extend(range(row, row + num_rows))
            row += num_rows
        if not entries or self._backend is None:
            return None
        start_s = self._clock()
        bitmask = self._bitmask(len(logits_rows), self._backend.bitmask_words)
        self._backend.fill_bitmask(entries, bitmask)
        self._mask_fill_s += self._clock() - start_s
        self._num_mask_steps += 1
        self._num_masked_rows += len(logits_rows)
        return TokenBitmask(bitmask, torch.tensor(logits_rows, dtype=torch.int64))

    def accept(self, request_id: str, token_ids: Sequence[int]) -> str | None:
        """Advance a request's matcher over the tokens it emitted; why it failed, or None (also when the
        request is not constrained)."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return None
        problem = matcher.error()  # a mask fill can fail too (a grammar too complex for one step, say)
        if problem is None and not matcher.accept(token_ids):
            problem = matcher.error() or f"the grammar does not allow the tokens {list(token_ids)}"
        return None if problem is None else f"structured output failed: {problem}"

    def is_terminated(self, request_id: str) -> bool:
        """True when the request is constrained and its grammar is complete."""
        matcher = self._matchers.get(request_id)
        return matcher is not None and matcher.is_terminated()

    # ---- DraftConstraint (called by the Drafter while scheduling) --------------------------------------

    def constrains(self, request: Request) -> bool:
        return request.request_id in self._matchers

    def forced_tokens(self, request: Request, limit: int) -> list[int]:
        matcher = self._matchers.get(request.request_id)
        return matcher.forced_tokens()[:limit] if matcher is not None and limit > 0 else []

    def num_valid(self, request: Request, token_ids: Sequence[int]) -> int:
        matcher = self._matchers.get(request.request_id)
        return len(token_ids) if matcher is None else matcher.validate(token_ids)

    # ---- numbers -------------------------------------------------------------------------------------

    @property
    def stats(self) -> StructuredStats:
        c = self._compiler.stats
        return StructuredStats(
            num_requests=self._num_requests, num_waiting=len(self._waiting),
            num_grammars_compiled=c.num_compiled, num_grammar_cache_hits=c.num_cache_hits,
            num_grammar_errors=c.num_errors, grammar_compile_s=c.compile_s, mask_fill_s=self._mask_fill_s,
            num_mask_steps=self._num_mask_steps, num_masked_rows=self._num_masked_rows,
        )  # fmt: skip

    def close(self) -> None:
        self._compiler.close()

    def _bitmask(self, num_rows: int, num_words: int) -> torch.Tensor:
        buf = self._buffer
        if buf is None or buf.shape[0] < num_rows or buf.shape[1] != num_words:
            rows = max(num_rows, 2 * buf.shape[0] if buf is not None else 16)
            buf = torch.zeros(rows, num_words, dtype=torch.int32, pin_memory=self._pin_memory)
            self._buffer = buf
        return buf[:num_rows]
