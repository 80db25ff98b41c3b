"""Chat requests in the llm engine: the request's settings over the pipeline's, OpenAI's defaults where neither
says, a response_format schema as structured output, and answers as chat results (a cut one kept)."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import pytest

from sluice.engines.chat import ChatRequest, ChatResult
from sluice.engines.engine_contract import RecordError
from sluice.engines.llm.chat_requests import chat_result, chat_settings

PIPELINE = {"max_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, "stop": ("###",),
            "ignore_eos": False, "structured_output": None}
HI = ({"role": "user", "content": "hi"},)


def test_the_request_wins_and_what_it_leaves_out_is_the_pipelines_or_openais_default() -> None:
    checked: OrderedDict[str, None] = OrderedDict()
    plain = chat_settings(ChatRequest(HI), PIPELINE, set(), "llguidance", checked)
    assert plain["temperature"] == 1.0 and plain["top_p"] == 1.0  # OpenAI's defaults: the job samples as it did
    assert plain["max_tokens"] == 64 and plain["stop"] == ("###",)  # the pipeline's (never unbounded)
    pinned = chat_settings(ChatRequest(HI), PIPELINE, {"temperature"}, "llguidance", checked)
    assert pinned["temperature"] == 0.0  # the pipeline set it: its own value
    asked = chat_settings(ChatRequest(HI, max_tokens=5, temperature=0.7, top_p=0.5, seed=3, stop=("\n",)),
                          PIPELINE, {"temperature"}, "llguidance", checked)
    assert {k: asked[k] for k in ("max_tokens", "temperature", "top_p", "seed", "stop")} == {
        "max_tokens": 5, "temperature": 0.7, "top_p": 0.5, "seed": 3, "stop": ("\n",)}
    assert PIPELINE["temperature"] == 0.0  # not changed in place


def test_a_response_format_schema_constrains_the_answer_and_a_broken_one_fails_that_line() -> None:
    checked: OrderedDict[str, None] = OrderedDict()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    settings = chat_settings(ChatRequest(HI, json_schema=schema), PIPELINE, set(), "llguidance", checked)
    spec = settings["structured_output"]
    assert spec.kind == "json_schema" and spec.schema() == schema
    with pytest.raises(RecordError, match="response_format.json_schema cannot constrain"):
        chat_settings(ChatRequest(HI, json_schema={"type": "no-such-type"}), PIPELINE, set(), "llguidance", checked)


def test_answers_become_chat_results_and_a_cut_one_is_returned_not_dead_lettered() -> None:
    def out(reason: str, text: str = "ok", tokens: int = 2, error: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(finish_reason=reason, text=text, token_ids=list(range(tokens)), error=error)

    assert chat_result(out("stop"), 9, "m") == ChatResult("ok", "stop", 9, 2, "m")
    assert chat_result(out("length", '{"a": '), 9, "m") == ChatResult('{"a": ', "length", 9, 2, "m")
    failed = chat_result(out("error", error="the grammar rejected every token"), 9, "m")
    assert isinstance(failed, RecordError) and "grammar rejected" in str(failed)
