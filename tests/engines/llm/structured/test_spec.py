"""StructuredOutput: exactly one kind, clear errors for malformed input, one cache key per constraint."""

from __future__ import annotations

import pytest

from sluice.engines.llm import SamplingParams, StructuredOutput


def test_exactly_one_kind_is_required() -> None:
    with pytest.raises(ValueError, match="exactly one of json_schema, regex, choice or grammar .got none"):
        StructuredOutput()
    with pytest.raises(ValueError, match="got regex, choice"):
        StructuredOutput(regex="a+", choice=["a"])
    assert StructuredOutput(regex="a+").kind == "regex"
    assert StructuredOutput(grammar='start: "x"').kind == "grammar"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"choice": []}, "at least one string"),
        ({"choice": "positive"}, "list of strings"),
        ({"choice": ["a", ""]}, "non-empty strings"),
        ({"choice": ["a", "b", "a"]}, "twice: \\['a'\\]"),
        ({"regex": ""}, "non-empty string"),
        ({"json_schema": [1, 2]}, "must be a mapping"),
        ({"json_schema": "{not json"}, "not valid JSON text"),
        ({"json_schema": {"const": float("nan")}}, "only JSON values"),
    ],
)
def test_malformed_constraints_name_the_problem(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StructuredOutput(**kwargs)  # type: ignore[arg-type]


def test_equal_constraints_share_a_key_whatever_their_spelling() -> None:
    a = StructuredOutput(json_schema={"type": "object", "properties": {"x": {"type": "integer"}}})
    b = StructuredOutput(json_schema='{"type":"object",\n "properties": {"x": {"type": "integer"}}}')
    assert a.key == b.key
    assert a.schema() == b.schema() == {"type": "object", "properties": {"x": {"type": "integer"}}}
    # property order is meaningful (answers list the properties in it), so it is part of the key
    ab = StructuredOutput(json_schema={"properties": {"a": {}, "b": {}}})
    assert ab.key != StructuredOutput(json_schema={"properties": {"b": {}, "a": {}}}).key
    assert StructuredOutput(choice=["a", "b"]).key == StructuredOutput(choice=("a", "b")).key
    assert StructuredOutput(choice=["a", "b"]).key != StructuredOutput(choice=["b", "a"]).key
    assert StructuredOutput(regex="a").key != StructuredOutput(grammar="a").key


def test_sampling_params_take_a_mapping_and_refuse_ignore_eos() -> None:
    params = SamplingParams(structured_output={"choice": ["yes", "no"]})  # type: ignore[arg-type]
    assert params.structured_output == StructuredOutput(choice=("yes", "no"))
    with pytest.raises(ValueError, match="takes json_schema, regex, choice or grammar"):
        SamplingParams(structured_output={"schema": {}})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ignore_eos cannot be combined"):
        SamplingParams(structured_output=StructuredOutput(regex="x"), ignore_eos=True)
