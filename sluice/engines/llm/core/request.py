"""One generation request: its tokens, its sampling parameters and its place in the request state machine.

A :class:`Request` is plain data shared by the scheduler (which owns its ``status``, ``num_computed_tokens``
and ``block_ids``), the KV-cache manager (which owns ``block_ids`` contents and ``block_hashes``) and the
engine (which reads everything and decides when a request stops).

State machine (only :class:`~sluice.engines.llm.core.scheduler.Scheduler` moves a request, through
:meth:`Request.move_to`, which raises :class:`InvalidTransitionError` on any edge not listed here)::

    WAITING ----> RUNNING ----> FINISHED_STOPPED | FINISHED_LENGTH
       |           |   ^
       |           v   |
       |         PREEMPTED   (blocks freed, recomputed from prompt + output so far)
       |           |
       +-----------+-------> FINISHED_ABORTED   (from any unfinished state)
       |           |
       +-----------+-------> FINISHED_ERROR     (its structured output cannot go on: see below)

A request with ``structured_output`` waits for its grammar outside the scheduler (status WAITING); if the
grammar cannot be compiled the engine finishes it WAITING -> FINISHED_ERROR itself, the one move not made
by the scheduler (the request never reached it). A running request whose grammar matcher fails is finished
FINISHED_ERROR by the scheduler's ``update``.

Pure Python: never imports torch.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from sluice.engines.llm.structured.spec import StructuredOutput


class RequestStatus(enum.IntEnum):
    """Where a request is in its life. Every value greater than PREEMPTED means finished."""

    WAITING = 0  # queued, holds no KV blocks (or a new request never admitted)
    RUNNING = 1  # admitted: holds KV blocks, scheduled every step while the budget allows
    PREEMPTED = 2  # evicted by recompute: holds no blocks, waits at the front of the queue
    FINISHED_STOPPED = 3  # the engine saw a stop token or stop string
    FINISHED_LENGTH = 4  # max_tokens or max_model_len reached
    FINISHED_ABORTED = 5  # the caller gave up on it (or it was dropped on shutdown)
    FINISHED_ERROR = 6  # its structured output failed: the grammar did not compile, or the matcher failed

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        """True for the terminal states."""
        return status > RequestStatus.PREEMPTED


_ALLOWED_TRANSITIONS: dict[RequestStatus, frozenset[RequestStatus]] = {
    RequestStatus.WAITING: frozenset(
        {RequestStatus.RUNNING, RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR}
    ),
    RequestStatus.RUNNING: frozenset(
        {
            RequestStatus.PREEMPTED,
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH,
            RequestStatus.FINISHED_ABORTED,
            RequestStatus.FINISHED_ERROR,
        }
    ),
    RequestStatus.PREEMPTED: frozenset({RequestStatus.RUNNING, RequestStatus.FINISHED_ABORTED}),
    RequestStatus.FINISHED_STOPPED: frozenset(),
    RequestStatus.FINISHED_LENGTH: frozenset(),
    RequestStatus.FINISHED_ABORTED: frozenset(),
    RequestStatus.FINISHED_ERROR: frozenset(),
}


class InvalidTransitionError(RuntimeError):
    """A request was asked to move along an edge its state machine does not have (a scheduler bug)."""


@dataclass(slots=True)
class SamplingParams:
    """How to pick tokens for one request. Validated on construction (ValueError naming the field)."""

    max_tokens: int = 16  # most tokens to generate (>= 1)
    temperature: float = 0.0  # 0 -> greedy (argmax)
    top_k: int = 0  # 0 -> off
    top_p: float = 1.0  # 1.0 -> off; in (0, 1]
    seed: int | None = None  # same seed -> same tokens regardless of the rest of the batch
    stop_token_ids: tuple[int, ...] = ()  # generation ends after emitting one of these
    stop: tuple[str, ...] = ()  # stop strings, checked by the engine on detokenised text
    ignore_eos: bool = False  # keep going past the model's end-of-sequence token
    logprobs: bool = False  # return the log-prob of each chosen token
    # Only text matching this may be generated; the request ends (EOS) when it is complete. A mapping is
    # taken as StructuredOutput's fields.
    structured_output: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool):
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if (
            isinstance(self.top_p, bool)
            or not isinstance(self.top_p, (int, float))
            or not (0.0 < self.top_p <= 1.0)
        ):
            raise ValueError(f"top_p must be a number in (0, 1] (1 = off), got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer or null, got {self.seed!r}")
        # Accept any iterable (a YAML/JSON list) but store tuples so params are hashable-ish and immutable.
        self.stop_token_ids = tuple(self.stop_token_ids)
        for token_id in self.stop_token_ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                raise ValueError(f"stop_token_ids must be integers >= 0, got {token_id!r}")
        if isinstance(self.stop, str):
            raise ValueError(f"stop must be a list of strings, got the single string {self.stop!r}")
        self.stop = tuple(self.stop)
        for text in self.stop:
            if not isinstance(text, str) or not text:
                raise ValueError(f"stop strings must be non-empty strings, got {text!r}")
        self.structured_output = _structured(self.structured_output)
        if self.structured_output is not None and self.ignore_eos:
            raise ValueError("ignore_eos cannot be combined with structured_output: a constrained request ends "
                             "when its grammar is complete")


def _structured(value: Any) -> StructuredOutput | None:
    if value is None or isinstance(value, StructuredOutput):
        return value
    if isinstance(value, dict):
        try:
            return StructuredOutput(**value)
        except TypeError:
            raise ValueError(f"structured_output takes json_schema, regex, choice or grammar, got keys "
                             f"{sorted(value)}") from None
    raise ValueError(f"structured_output must be a StructuredOutput or a mapping, got {type(value).__name__}")


@dataclass(slots=True, eq=False)
class Request:
    """One prompt and the tokens generated for it so far.

    Token positions: position ``p`` holds ``all_token_ids[p]``; block ``i`` of ``block_ids`` holds the K/V
    of positions ``[i * block_size, (i + 1) * block_size)``. The request still needs
    ``num_tokens - num_computed_tokens`` positions computed; after a step that computes up to
    ``num_tokens`` the engine samples one new token, which the scheduler appends to ``output_token_ids``.

    Append output tokens only through the scheduler's ``update`` (it keeps the KV cache's hashes in step).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0  # positions whose K/V are in the cache (prefix-cache hits included)
    block_ids: list[int] = field(default_factory=list)  # block table, owned by the KV-cache manager
    arrival_seq: int = -1  # order of arrival, set by Scheduler.add (FCFS tie-breaker)
    num_cached_tokens: int = 0  # prompt positions served by the prefix cache at the last admission
    num_preemptions: int = 0  # times this request was preempted (recomputed)
    num_draft_tokens: int = 0  # speculative drafts verified for this request
    num_accepted_draft_tokens: int = 0  # of those, drafts accepted (emitted as output)
    # Chained hashes of this request's full blocks, filled lazily by the KV-cache manager; valid while the
    # salt stays the same, because tokens are only ever appended.
    block_hashes: list[bytes] = field(default_factory=list)
    # Root of the hash chain: requests share cached blocks only under the same salt. Set by the scheduler
    # when the request's K/V depends on more than its tokens (LongRoPE past its switch length).
    cache_salt: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty string, got {self.request_id!r}")
        self.prompt_token_ids = list(self.prompt_token_ids)
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r}: the prompt is empty; give at least one token")
        for token_id in self.prompt_token_ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                raise ValueError(
                    f"request {self.request_id!r}: prompt token ids must be integers >= 0, got {token_id!r}"
                )

    # ---- derived sizes -------------------------------------------------------------------------------

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + output so far."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt + output so far, as a new list (use :meth:`token_ids_in` on hot paths)."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def max_num_tokens(self) -> int:
        """Prompt + max_tokens: the length at which the request finishes with FINISHED_LENGTH."""
        return len(self.prompt_token_ids) + self.params.max_tokens

    @property
    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def token_ids_in(self, start: int, end: int) -> list[int]:
        """Token ids of positions ``[start, end)`` without building ``all_token_ids``."""
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - num_prompt]

    # ---- state machine -------------------------------------------------------------------------------

    def move_to(self, new_status: RequestStatus) -> None:
        """Change ``status`` along an allowed edge; raise InvalidTransitionError otherwise.

        Called only by the scheduler's named transitions (admit, preempt, finish, abort).
        """
        if new_status not in _ALLOWED_TRANSITIONS[self.status]:
            raise InvalidTransitionError(
                f"request {self.request_id!r}: illegal transition {self.status.name} -> {new_status.name}"
            )
        self.status = new_status
