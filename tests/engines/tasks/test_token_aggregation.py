"""Entity aggregation: hand-made cases, and random token scores against transformers' own aggregation code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.engines.tasks.token_aggregation import TokenSpan, aggregate, token_spans
from tests.support.tiny_models import NER_LABELS

LABELS = dict(enumerate(NER_LABELS))  # O, B-PER, I-PER, B-ORG, I-ORG, B-LOC, I-LOC


def _decode(tokens: list[str]) -> str:  # WordPiece-like: "##" continues the previous token
    return " ".join(tokens).replace(" ##", "")


def _one_hot(*labels: str, confidence: float = 0.9) -> np.ndarray:
    """Scores (tokens, labels) with ``confidence`` on each token's label; row 0 is a special token."""
    scores = np.full((len(labels) + 1, len(NER_LABELS)), (1 - confidence) / (len(NER_LABELS) - 1), np.float32)
    for row, label in enumerate(labels, start=1):
        scores[row, NER_LABELS.index(label)] = confidence
    return scores


def _spans(*words: tuple[str, bool]) -> list[TokenSpan]:
    spans, offset = [], 0
    for index, (word, is_subword) in enumerate(words, start=1):
        start = offset if is_subword else offset + (1 if index > 1 else 0)
        text = word.removeprefix("##")
        spans.append(TokenSpan(index=index, word=word, start=start, end=start + len(text), is_subword=is_subword))
        offset = start + len(text)
    return spans


def test_offsets_mark_subwords_by_the_prefix_or_by_the_space_before() -> None:
    text = "Merkel's visit"
    tokens, ids = ["[CLS]", "merkel", "'", "s", "visit", "[SEP]"], [101, 1, 2, 3, 4, 102]
    offsets = [(0, 0), (0, 6), (6, 7), (7, 8), (9, 14), (0, 0)]
    special = [1, 0, 0, 0, 0, 1]
    heuristic = token_spans(text, tokens, ids, offsets, special, unk_id=None, subword_prefix="")
    assert [(s.word, s.is_subword) for s in heuristic] == [("merkel", False), ("'", True), ("s", True),
                                                            ("visit", False)]
    wordpiece = token_spans("visiting", ["vis", "##iting"], [5, 6], [(0, 3), (3, 8)], [0, 0], unk_id=None,
                            subword_prefix="##")
    assert [s.is_subword for s in wordpiece] == [False, True]
    unknown = token_spans("a ☃b", ["a", "[UNK]"], [7, 100], [(0, 1), (2, 4)], [0, 0], unk_id=100,
                          subword_prefix="##")
    assert (unknown[1].word, unknown[1].is_subword) == ("☃b", False)  # the text itself, a new word


def test_simple_merges_b_i_runs_and_a_new_b_starts_a_new_entity() -> None:
    spans = _spans(("angela", False), ("merkel", False), ("met", False), ("tim", False), ("cook", False))
    scores = _one_hot("B-PER", "I-PER", "O", "B-PER", "B-PER")
    got = aggregate(spans, scores, LABELS, "simple", _decode)
    assert [(e["entity_group"], e["word"]) for e in got] == [("PER", "angela merkel"), ("PER", "tim"),
                                                             ("PER", "cook")]
    assert got[0]["start"] == 0 and got[0]["end"] == len("angela merkel")
    assert got[0]["score"] == pytest.approx(0.9)
    none = aggregate(spans, scores, LABELS, "none", _decode)
    assert [e["entity"] for e in none] == ["B-PER", "I-PER", "B-PER", "B-PER"]  # "O" ignored
    assert [e["index"] for e in none] == [1, 2, 4, 5]
    assert len(aggregate(spans, scores, LABELS, "simple", _decode, ignore_labels=())) == 4  # O kept as a group


def test_word_strategies_make_the_tokens_of_a_word_agree() -> None:
    spans = _spans(("micro", False), ("##soft", True))
    scores = _one_hot("B-ORG", "I-LOC")
    scores[2, NER_LABELS.index("I-LOC")] = 0.95  # the subword is surer
    first = aggregate(spans, scores, LABELS, "first", _decode)
    best = aggregate(spans, scores, LABELS, "max", _decode)
    assert [(e["entity_group"], e["word"]) for e in first] == [("ORG", "microsoft")]
    assert [(e["entity_group"], e["word"]) for e in best] == [("LOC", "microsoft")]
    simple = aggregate(spans, scores, LABELS, "simple", _decode)
    assert [e["entity_group"] for e in simple] == ["ORG", "LOC"]  # simple may split a word


@pytest.fixture(scope="module")
def hf_pipeline(tiny: dict[str, Path]) -> Any:
    from transformers import pipeline

    return pipeline("token-classification", model=str(tiny["ner"]), device="cpu")


_TOKENS = st.lists(st.tuples(st.sampled_from(["new", "york", "##er", "ber", "##lin", "an", "##gela", "'", "s"]),
                             st.booleans(), st.lists(st.floats(0.01, 1.0), min_size=7, max_size=7)),
                   min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=_TOKENS, strategy=st.sampled_from(["none", "simple", "first", "average", "max"]))
def test_random_scores_aggregate_as_transformers_does(hf_pipeline: Any, tokens: list[Any], strategy: str) -> None:
    from transformers.pipelines.token_classification import AggregationStrategy

    spans, rows, pre_entities, offset = [], [np.zeros(7, np.float32)], [], 0
    for index, (word, is_subword, weights) in enumerate(tokens, start=1):
        scores = np.asarray(weights, np.float32) / np.float32(sum(weights))
        start = offset + (0 if is_subword or index == 1 else 1)
        end = start + len(word.removeprefix("##"))
        offset = end
        spans.append(TokenSpan(index=index, word=word, start=start, end=end, is_subword=is_subword))
        rows.append(scores)
        pre_entities.append({"word": word, "scores": scores, "start": start, "end": end, "index": index,
                             "is_subword": is_subword})
    want = hf_pipeline.aggregate(pre_entities, AggregationStrategy[strategy.upper()])
    want = [e for e in want if e.get("entity", e.get("entity_group")) != "O"]
    decode = hf_pipeline.tokenizer.convert_tokens_to_string
    got = aggregate(spans, np.stack(rows), LABELS, strategy, decode)  # type: ignore[arg-type]
    key = "entity" if strategy == "none" else "entity_group"
    assert [(e[key], e["word"], e["start"], e["end"]) for e in got] == \
           [(e[key], e["word"], e["start"], e["end"]) for e in want]
    np.testing.assert_allclose([e["score"] for e in got], [float(e["score"]) for e in want], rtol=1e-6)
