"""Structured output with the real SmolLM2-135M-Instruct: what a user extracting fields or labels would see.

* Extraction with a JSON Schema: every constrained answer parses and validates; the same prompts without
  the constraint mostly do not (the rate is printed and must be lower).
* ``choice``: every answer is one of the labels.
* A regex that is exactly a request's own unconstrained greedy answer reproduces it token for token, in a
  batch with other grammars and unconstrained requests; the same with speculative decoding on.
* Schemas and prompts not tuned for: nested objects, arrays, enums, bounded numbers, optional fields,
  unicode.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from sluice.engines.llm import LLM, SamplingParams, StructuredOutput
from tests.support.grammar import literal_regex

pytestmark = pytest.mark.slow

REVIEWS = [
    "I bought the Aeropress coffee maker last month and it makes a great cup every morning. Five stars.",
    "The Sony WH-1000XM4 headphones stopped charging after two weeks. Very disappointed, one star.",
    "This yoga mat is fine. Nothing special, does its job. Three stars I guess.",
    "Absolutely love my new Kindle Paperwhite! The screen is so easy on the eyes.",
    "The blender is loud and the lid leaks. Would not buy again.",
    "Decent running shoes for the price, but they wear out fast. 3/5.",
    "My daughter adores the Lego castle set, we built it together in an afternoon.",
    "The phone case cracked the first time I dropped it. Useless.",
    "Great little desk lamp, bright and adjustable, 4 stars.",
    "The electric kettle boils water quickly and looks nice on the counter.",
    "Terrible vacuum cleaner: it loses suction after five minutes.",
    "The café's almond croissant was okay, a bit dry. Crème brûlée was better!",
]
SYSTEM = ("Extract the product, the sentiment (positive, negative or neutral) and the star rating (1 to 5) from "
          "the review. Answer with one JSON object with the keys product, sentiment and stars.")
SCHEMA = {
    "type": "object",
    "properties": {
        "product": {"type": "string", "minLength": 1, "maxLength": 60},
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["product", "sentiment", "stars"],
    "additionalProperties": False,
}
LABELS = ["positive", "negative", "neutral"]


@pytest.fixture(scope="module")
def llm(smollm2_gguf: Path) -> LLM:
    engine = LLM(smollm2_gguf, kv_cache_memory_bytes=96 << 20, max_model_len=512, num_speculative_tokens=4,
                 speculative_adaptive=False)
    engine.scheduler.drafter = None  # speculation only where a test turns it on
    return engine


def chat(llm: LLM, system: str, user: str) -> str:
    return llm.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": user}])


def valid(text: str, schema: dict[str, object]) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def test_every_constrained_extraction_validates(llm: LLM) -> None:
    prompts = [chat(llm, SYSTEM, review) for review in REVIEWS]
    free = llm.generate(prompts, SamplingParams(max_tokens=64))
    constrained = llm.generate(prompts, SamplingParams(max_tokens=64, structured_output=StructuredOutput(json_schema=SCHEMA)))
    num_free = sum(valid(o.text, SCHEMA) for o in free)
    num_constrained = sum(valid(o.text, SCHEMA) for o in constrained)
    print(f"valid answers: unconstrained {num_free}/{len(REVIEWS)}, constrained {num_constrained}/{len(REVIEWS)}")
    assert num_constrained == len(REVIEWS), [o.text for o in constrained if not valid(o.text, SCHEMA)]
    assert all(o.finish_reason == "stop" and o.token_ids[-1] == 2 for o in constrained)  # ended by EOS
    assert num_free < len(REVIEWS)


def test_choice_answers_are_always_a_label(llm: LLM) -> None:
    system = "Classify the sentiment of the review. Answer positive, negative or neutral."
    outs = llm.generate([chat(llm, system, r) for r in REVIEWS],
                        SamplingParams(max_tokens=8, structured_output=StructuredOutput(choice=LABELS)))
    assert [o.text for o in outs if o.text not in LABELS] == []
    assert len({o.text for o in outs}) > 1  # the label follows the review, not one constant answer


def test_regex_of_the_greedy_answer_reproduces_it_with_other_grammars_and_with_speculation(llm: LLM) -> None:
    questions = ["Copy the city from: 'Ship to Valencia by Friday'.", "What is the capital of France?",
                 "Name three colours.", "Extract the order number from: order A-1042 was late.",
                 "Translate 'thank you' into German.", "Write a short greeting for Zoë."]
    prompts = [chat(llm, "Answer briefly.", q) for q in questions]
    plain = llm.generate(prompts, SamplingParams(max_tokens=24))
    params = [SamplingParams(max_tokens=24, structured_output=StructuredOutput(regex=literal_regex(o.text)))
              for o in plain]
    others = [chat(llm, SYSTEM, REVIEWS[0]), chat(llm, "Answer yes or no.", "Is water wet?")]
    other_params = [SamplingParams(max_tokens=64, structured_output=StructuredOutput(json_schema=SCHEMA)),
                    SamplingParams(max_tokens=4, structured_output=StructuredOutput(choice=["yes", "no"]))]
    mixed = llm.generate([*prompts, *others, prompts[0]], [*params, *other_params, SamplingParams(max_tokens=24)])
    expected = [o.token_ids for o in plain]
    assert [o.token_ids for o in mixed[: len(prompts)]] == expected
    assert mixed[-1].token_ids == expected[0]  # the unconstrained request in the batch is untouched too
    assert valid(mixed[len(prompts)].text, SCHEMA) and mixed[len(prompts) + 1].text in ("yes", "no")

    drafter = llm.drafter
    llm.scheduler.drafter = drafter
    try:
        before = llm.stats.num_accepted_draft_tokens
        spec = llm.generate([*prompts, *others], [*params, *other_params])
    finally:
        llm.scheduler.drafter = None
    assert [o.token_ids for o in spec[: len(prompts)]] == expected
    assert valid(spec[len(prompts)].text, SCHEMA)
    assert llm.stats.num_accepted_draft_tokens > before  # forced tokens and copies were drafted and kept


UNSEEN = [
    ("Describe the order: 2 blue mugs for Jürgen Groß, shipped to Köln, paid.", {
        "type": "object",
        "properties": {
            "customer": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                                          "city": {"type": "string", "maxLength": 30}},
                         "required": ["name", "city"], "additionalProperties": False},
            "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                                 "quantity": {"type": "integer", "minimum": 1, "maximum": 99}},
                "required": ["name", "quantity"], "additionalProperties": False}},
            "paid": {"type": "boolean"},
        },
        "required": ["customer", "items", "paid"], "additionalProperties": False}),
    ("Rate the weather today in Oslo: cold, -3.5 degrees, light snow.", {
        "type": "object",
        "properties": {"temperature_c": {"type": "number", "minimum": -60, "maximum": 60},
                       "conditions": {"type": "array", "items": {"enum": ["sun", "rain", "snow", "wind", "fog"]},
                                      "maxItems": 3},
                       "comment": {"type": "string", "maxLength": 50}},
        "required": ["temperature_c", "conditions"], "additionalProperties": False}),
    ("List two tags for a blog post about sourdough bread, with a score between 0 and 1.", {
        "type": "array", "minItems": 2, "maxItems": 2,
        "items": {"type": "object", "properties": {"tag": {"type": "string", "pattern": "^[a-z]{2,15}$"},
                                                   "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
                  "required": ["tag", "score"], "additionalProperties": False}}),
    ("東京タワーの高さは何メートルですか？ Answer in JSON.", {
        "type": "object", "properties": {"answer_ja": {"type": "string", "maxLength": 20},
                                         "metres": {"type": "integer", "minimum": 1, "maximum": 1000}},
        "required": ["metres"], "additionalProperties": False}),
]


def test_unseen_prompts_and_schemas_validate(llm: LLM) -> None:
    prompts = [chat(llm, "Answer with JSON that fits the user's request.", q) for q, _ in UNSEEN]
    params = [SamplingParams(max_tokens=160, structured_output=StructuredOutput(json_schema=s)) for _, s in UNSEEN]
    for out, (_, schema) in zip(llm.generate(prompts, params), UNSEEN, strict=True):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)
