"""Token scores -> entities, with the semantics of transformers' token-classification pipeline.

Pure functions over plain data (numpy for the scores), so they are unit-tested without a model.

Strategies (``aggregation_strategy``):

* ``none`` -- one entity per token: ``{"entity", "score", "index", "word", "start", "end"}``.
* ``simple`` -- adjacent tokens with the same tag merge (``B-X I-X`` -> one ``X``; a new ``B-`` starts a new
  entity): ``{"entity_group", "score" (mean of the tokens'), "word", "start", "end"}``.
* ``first`` / ``average`` / ``max`` -- first the tokens of one word agree on a label (the first token's,
  the best of the averaged scores, the token with the highest score), then words merge as in ``simple``.

Labels in ``ignore_labels`` (default ``["O"]``) are dropped from the result. ``start`` / ``end`` are
character offsets into the record's text; ``word`` is the tokens decoded back to text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Strategy = Literal["none", "simple", "first", "average", "max"]
Decode = Callable[[list[str]], str]  # token strings -> text (the tokenizer's decoder)


@dataclass(frozen=True, slots=True)
class TokenSpan:
    """One non-special token of a text: where it is, and whether it continues the previous word."""

    index: int  # position in the tokenised sequence (special tokens counted)
    word: str  # the token string (the text span itself for the unknown token)
    start: int  # character offsets into the text
    end: int
    is_subword: bool


def token_spans(text: str, tokens: Sequence[str], ids: Sequence[int], offsets: Sequence[tuple[int, int]],
                special: Sequence[int], *, unk_id: int | None, subword_prefix: str) -> list[TokenSpan]:
    """The non-special tokens of one encoded text.

    A token continues a word when the tokenizer marks continuations (``subword_prefix``, e.g. ``##``) and
    the token string is longer or shorter than its text span; otherwise when it does not follow a space.
    The unknown token takes its text span as its word and always starts a word.
    """
    spans = []
    for index, (token, token_id, (start, end), is_special) in enumerate(zip(tokens, ids, offsets, special,
                                                                             strict=True)):
        if is_special:
            continue
        reference = text[start:end]
        if subword_prefix:
            is_subword = len(token) != len(reference)
        else:
            is_subword = start > 0 and " " not in text[start - 1 : start + 1]
        if unk_id is not None and token_id == unk_id:
            token, is_subword = reference, False
        spans.append(TokenSpan(index=index, word=token, start=start, end=end, is_subword=is_subword))
    return spans


def aggregate(spans: Sequence[TokenSpan], scores: np.ndarray, labels: Mapping[int, str], strategy: Strategy,
              decode: Decode, ignore_labels: Sequence[str] = ("O",)) -> list[dict[str, Any]]:
    """Entities of one text. ``scores``: (num_tokens, num_labels) probabilities, rows by ``TokenSpan.index``."""
    if strategy in ("none", "simple"):
        entities = []
        for span in spans:
            row = scores[span.index]
            best = int(row.argmax())
            entities.append({"entity": labels[best], "score": float(row[best]), "index": span.index,
                             "word": span.word, "start": span.start, "end": span.end})
    else:
        entities = [_word_entity(group, scores, labels, strategy, decode) for group in _words(spans)]
    if strategy != "none":
        entities = _group(entities, decode)
    return [e for e in entities if e.get("entity", e.get("entity_group")) not in ignore_labels]


def _words(spans: Sequence[TokenSpan]) -> list[list[TokenSpan]]:
    """Tokens grouped into words: a word starts at every token that is not a subword."""
    words: list[list[TokenSpan]] = []
    for span in spans:
        if words and span.is_subword:
            words[-1].append(span)
        else:
            words.append([span])
    return words


def _word_entity(word: list[TokenSpan], scores: np.ndarray, labels: Mapping[int, str], strategy: Strategy,
                 decode: Decode) -> dict[str, Any]:
    rows = scores[[span.index for span in word]]  # (tokens_in_word, labels)
    if strategy == "first":
        row = rows[0]
    elif strategy == "max":
        row = rows[int(rows.max(axis=1).argmax())]  # the token with the highest score (the first of equals)
    elif strategy == "average":
        row = np.nanmean(rows, axis=0)
    else:
        raise ValueError(f"unknown aggregation strategy {strategy!r}")
    best = int(row.argmax())
    return {"entity": labels[best], "score": float(row[best]), "word": decode([s.word for s in word]),
            "start": word[0].start, "end": word[-1].end}


def _tag(label: str) -> tuple[str, str]:
    """``B-PER`` -> (B, PER); ``I-PER`` -> (I, PER); anything else continues: (I, label)."""
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label


def _group(entities: list[dict[str, Any]], decode: Decode) -> list[dict[str, Any]]:
    """Merge runs of adjacent entities with the same tag; a ``B-`` always starts a new group."""
    groups: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []
    for entity in entities:
        if run:
            bi, tag = _tag(entity["entity"])
            if tag == _tag(run[-1]["entity"])[1] and bi != "B":
                run.append(entity)
                continue
            groups.append(_group_of(run, decode))
        run = [entity]
    if run:
        groups.append(_group_of(run, decode))
    return groups


def _group_of(run: list[dict[str, Any]], decode: Decode) -> dict[str, Any]:
    return {"entity_group": run[0]["entity"].split("-", 1)[-1],
            "score": float(np.nanmean(np.asarray([e["score"] for e in run], dtype=np.float32))),
            "word": decode([e["word"] for e in run]), "start": run[0]["start"], "end": run[-1]["end"]}
