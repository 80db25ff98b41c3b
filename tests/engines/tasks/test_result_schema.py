"""Every task declares the JSON Schema of its results (schema-registry outputs derive their Avro / JSON
Schema from it), and every result it gives validates against that schema -- and maps to Avro."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from sluice.codecs.result_types import avro_type

TEXTS = ["Arrived quickly and works exactly as described.", "Paul Smith flew from Berlin to Lisbon.", "",
         "Le colis est arrivé cassé 😞"]

CASES = [
    ("classifier", {"task": "text-classification"}),
    ("classifier", {"task": "text-classification", "top_k": 2}),
    ("ner", {"task": "token-classification"}),
    ("ner", {"task": "token-classification", "aggregation_strategy": "simple"}),
    ("embedder-cls", {"task": "text-embedding"}),
    ("embedder-cls", {"task": "text-embedding", "output_format": "base64"}),
]


@pytest.mark.parametrize(("model", "options"), CASES, ids=lambda v: v if isinstance(v, str) else "-".join(
    str(x) for x in v.values()))
def test_results_validate_against_the_declared_schema(model: str, options: dict[str, Any], tiny: dict[str, Path],
                                                      make_engine: Callable[..., Any]) -> None:
    engine = make_engine("torch", model=str(tiny[model]), **options)
    schema = engine.result_schema()
    assert schema is not None
    jsonschema.Draft202012Validator.check_schema(schema)
    results = engine.infer(engine.prepare(TEXTS))
    for result in results:
        jsonschema.validate(result, schema)
    assert avro_type(schema, "Result")  # the registry formats can derive an output type from it


def test_cross_encoder_scores_validate_against_the_declared_schema(tiny: dict[str, Path],
                                                                   make_engine: Callable[..., Any]) -> None:
    engine = make_engine("torch", model=str(tiny["cross-encoder"]), task="cross-encoder",
                         inputs={"text": "query", "text_pair": "passage"})
    schema = engine.result_schema()
    assert schema is not None
    pairs = [{"query": "is it waterproof?", "passage": text} for text in TEXTS]
    for result in engine.infer(engine.prepare(pairs)):
        jsonschema.validate(result, schema)
