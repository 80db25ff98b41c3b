"""The Drafter with a grammar: forced tokens become drafts, n-gram drafts stop at the first disallowed token."""

from __future__ import annotations

from collections.abc import Sequence

from sluice.engines.llm.core.request import Request
from sluice.engines.llm.core.speculation import FORCED_NGRAM_LEN, Drafter


class Grammar:
    """A fake DraftConstraint: tokens below ``limit`` are allowed; ``forced`` is what it forces next."""

    def __init__(self, limit: int, forced: list[int]) -> None:
        self.limit = limit
        self.forced = forced

    def constrains(self, request: Request) -> bool:
        return request.request_id != "free"

    def forced_tokens(self, request: Request, limit: int) -> list[int]:
        return self.forced[:limit]

    def num_valid(self, request: Request, token_ids: Sequence[int]) -> int:
        for i, token in enumerate(token_ids):
            if token >= self.limit:
                return i
        return len(token_ids)


def request(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, tokens)


REPEATING = [1, 2, 3, 50, 4, 5, 1, 2, 3]  # the n-gram [1, 2, 3] recurs: drafts 50, 4, 5


def test_ngram_drafts_are_cut_at_the_first_token_the_grammar_rejects() -> None:
    drafter = Drafter(4, adaptive=False, constraint=Grammar(limit=10, forced=[]))
    assert drafter.propose(request("free", REPEATING), 4, 1).token_ids == [50, 4, 5, 1]  # type: ignore[union-attr]
    assert drafter.propose(request("r", REPEATING), 4, 1) is None  # 50 is not allowed: nothing to verify
    drafter = Drafter(4, adaptive=False, constraint=Grammar(limit=60, forced=[]))
    assert drafter.propose(request("r", REPEATING), 4, 1).token_ids == [50, 4, 5, 1]  # type: ignore[union-attr]


def test_forced_tokens_are_the_drafts_where_the_grammar_forces_some() -> None:
    drafter = Drafter(3, adaptive=False, constraint=Grammar(limit=100, forced=[7, 8, 9, 10]))
    draft = drafter.propose(request("r", [1, 2, 3]), 5, 1)  # no n-gram match at all
    assert draft is not None and draft.token_ids == [7, 8, 9] and draft.ngram_len == FORCED_NGRAM_LEN
    assert drafter.propose(request("r", [1, 2, 3]), 2, 1).token_ids == [7, 8]  # type: ignore[union-attr]
    drafter.record_verify(request("r", [1]), FORCED_NGRAM_LEN, 3, 3)
    assert drafter.acceptance_estimate(FORCED_NGRAM_LEN) > drafter.acceptance_estimate(1)
