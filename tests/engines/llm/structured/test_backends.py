"""The grammar backends behind Sluice's contract: checks, masks for a batch with drafts, validate, rollback.

llguidance (the default) in full, xgrammar on the same contract cases."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import torch

from sluice.engines.llm.structured.backend import GrammarError, TokenTable
from sluice.engines.llm.structured.bitmask import unpack_bitmask
from sluice.engines.llm.structured.llguidance_backend import LLGuidanceBackend
from sluice.engines.llm.structured.spec import StructuredOutput
from sluice.engines.llm.structured.xgrammar_backend import XGrammarBackend


def ids(table: TokenTable, text: str) -> list[int]:
    return table.encode(text)


def allowed(bitmask: torch.Tensor, row: int, vocab: int) -> set[int]:
    return set(unpack_bitmask(bitmask[row : row + 1], vocab)[0].nonzero().flatten().tolist())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (StructuredOutput(regex="[a-z]+("), "unclosed group"),
        (StructuredOutput(json_schema={"type": "strin"}), "strin"),
        (StructuredOutput(grammar="start: missing_rule"), "missing_rule"),
    ],
)
def test_check_rejects_what_cannot_compile(spec: StructuredOutput, message: str) -> None:
    with pytest.raises(GrammarError, match=message):
        LLGuidanceBackend.check(spec)
    with pytest.raises(GrammarError):
        XGrammarBackend.check(spec)


def test_check_accepts_the_kinds() -> None:
    for spec in (StructuredOutput(regex="[A-Z]{2}-[0-9]{4}"), StructuredOutput(choice=["a", 'quote " and \\']),
                 StructuredOutput(json_schema={"type": "object", "properties": {"x": {"type": "number"}}}),
                 StructuredOutput(grammar='start: "yes" | "no"')):
        assert LLGuidanceBackend.check(spec) == [] and XGrammarBackend.check(spec) == []
    assert LLGuidanceBackend.check(StructuredOutput(json_schema={"type": "array", "uniqueItems": True})) == [
        'Unimplemented keys: ["uniqueItems"]']  # not enforced while generating: the pipeline checks answers


@pytest.mark.parametrize("backend_class", [LLGuidanceBackend, XGrammarBackend], ids=["llguidance", "xgrammar"])
def test_masks_for_a_batch_with_drafts_follow_the_grammar(tiny_table: TokenTable, backend_class: Any) -> None:
    backend = backend_class(tiny_table)
    assert backend.bitmask_words == 9  # 256 tokens + a virtual EOS the tiny model lacks
    abc = backend.matcher(backend.compile(StructuredOutput(regex="ab(c|d)e")))
    digits = backend.matcher(backend.compile(StructuredOutput(regex="[0-9]{2}")))
    bitmask = torch.zeros(5, backend.bitmask_words, dtype=torch.int32)
    backend.fill_bitmask([(abc, 0, ids(tiny_table, "ab")), (digits, 3, [])], bitmask)
    assert allowed(bitmask, 0, 256) == set(ids(tiny_table, "a"))
    assert allowed(bitmask, 1, 256) == set(ids(tiny_table, "b"))  # after draft "a"
    assert allowed(bitmask, 2, 256) == set(ids(tiny_table, "cd"))  # after drafts "ab"
    assert allowed(bitmask, 3, 256) == set(ids(tiny_table, "0123456789"))
    assert abc.validate(ids(tiny_table, "abxe")) == 2  # the state did not move, and stops at "x"
    assert abc.forced_tokens() == ids(tiny_table, "ab")
    assert abc.accept(ids(tiny_table, "abd")) and not abc.is_terminated()
    abc.rollback(1)
    assert abc.accept(ids(tiny_table, "ce")) and abc.is_terminated() and abc.error() is None
    assert not digits.accept(ids(tiny_table, "x"))
    assert digits.error() is not None


def test_json_schema_masks_on_smollm2_allow_a_valid_answer_and_eos_only_at_the_end(smollm2_table: TokenTable) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer", "maximum": 9}},
              "required": ["name", "n"], "additionalProperties": False}
    backend = LLGuidanceBackend(smollm2_table)
    matcher = backend.matcher(backend.compile(StructuredOutput(json_schema=schema)))
    answer = ids(smollm2_table, json.dumps({"name": "Zoë", "n": 7}, ensure_ascii=False))
    bitmask = torch.zeros(len(answer) + 1, backend.bitmask_words, dtype=torch.int32)
    backend.fill_bitmask([(matcher, 0, answer)], bitmask)
    for j, token in enumerate(answer):
        masked = allowed(bitmask, j, 49152)
        assert token in masked and 2 not in masked  # the next token allowed, EOS not before the end
    assert allowed(bitmask, len(answer), 49152) == {2}  # complete: only EOS
    assert matcher.validate([*answer, 2]) == len(answer) + 1
    too_big = ids(smollm2_table, '{"name": "x", "n": 12}')
    assert matcher.validate(too_big) < len(too_big)
    jsonschema.validate({"name": "Zoë", "n": 7}, schema)
