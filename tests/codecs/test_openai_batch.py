"""OpenAI's batch lines: requests read into chat requests (or refused, line by line, as OpenAI words it),
responses and errors written in the shapes OpenAI's batch output and error files have (checked against the
``openai`` package's own types)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletion

from sluice.codecs.openai_batch import error_line, read_request, write_response
from sluice.codecs.record_codec import CodecError
from sluice.engines.chat import ChatRequest, ChatResult
from sluice.operator.failures.dead_letter import dead_letter
from sluice.operator.record import InputRecord, TopicPartition


def line(**body: Any) -> dict[str, Any]:
    return {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}], **body}}


def test_a_request_becomes_the_chat_request_its_body_asks_for() -> None:
    req = read_request(line(messages=[{"role": "developer", "content": "Be brief."},
                                      {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                   {"type": "text", "text": "b"}]},
                                      {"role": "assistant", "content": "ok"}],
                            max_tokens=10, max_completion_tokens=20, temperature=0.5, top_p=0.9, seed=3, stop="\n",
                            n=1, stream=False, user="u", metadata={"k": "v"}, store=False))
    assert req == ChatRequest(messages=({"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "a\nb"}, {"role": "assistant", "content": "ok"}),
                              max_tokens=20, temperature=0.5, top_p=0.9, seed=3, stop=("\n",))
    assert read_request(line()).temperature is None  # left to the engine (which then takes OpenAI's default)
    assert read_request(line(response_format={"type": "json_object"})).json_schema == {"type": "object"}
    assert read_request(line(response_format={"type": "text"})).json_schema is None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    assert read_request(line(response_format=fmt)).json_schema == schema


@pytest.mark.parametrize(("bad", "fragment"), [
    ([], "a JSON object with custom_id"),
    ({**line(), "extra": 1}, "unrecognized field in the batch line: 'extra'"),
    ({**line(), "custom_id": ""}, "custom_id is required"),
    ({**line(), "method": "GET"}, "method must be POST"),
    ({**line(), "url": "/v1/embeddings"}, "url '/v1/embeddings' is not supported"),
    ({**line(), "body": "text"}, "body is required"),
    (line(messages=[]), "messages is required"),
    (line(messages=[{"role": "tool", "content": "x"}]), "messages[0].role must be one of"),
    (line(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), "only text parts"),
    (line(messages=[{"role": "assistant", "content": None, "tool_calls": [{}]}]), "tool calls are not supported"),
    (line(tools=[]), "Unrecognized request argument supplied: tools"),
    (line(n=2), "n=2 is not supported"),
    (line(stream=True), "stream=True is not supported"),
    (line(max_tokens=0), "max_completion_tokens must be an integer >= 1"),
    (line(temperature=3), "temperature must be a number in [0, 2]"),
    (line(seed=1.5), "seed must be an integer"),
    (line(stop=["a", "b", "c", "d", "e"]), "up to 4"),
    (line(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "json_schema.schema is required"),
    (line(response_format={"type": "yaml"}), "response_format.type must be"),
])
def test_a_bad_line_is_refused_alone_saying_what_is_wrong(bad: Any, fragment: str) -> None:
    with pytest.raises(CodecError) as info:
        read_request(bad)
    assert info.value.stage == "decode" and fragment in str(info.value)


def test_a_response_line_is_openais_batch_output_line_with_a_chat_completion() -> None:
    out = json.loads(write_response(line(), ChatResult("Hello!", "stop", 9, 3, "smollm2-135m")))
    assert set(out) == {"id", "custom_id", "response", "error"} and out["error"] is None
    assert out["custom_id"] == "r1" and out["id"].startswith("batch_req_")
    assert out["response"]["status_code"] == 200 and out["response"]["request_id"].startswith("req_")
    completion = ChatCompletion.model_validate(out["response"]["body"])
    assert completion.choices[0].message.content == "Hello!" and completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.total_tokens == 12
    again = json.loads(write_response(line(), ChatResult("Hello!", "stop", 9, 3, "smollm2-135m")))
    assert again["id"] != out["id"]  # every line its own id, as OpenAI's


def dead(value: bytes | None, stage: str, error: str) -> dict[str, Any]:
    record = InputRecord(value, None, [], TopicPartition("batch.jsonl", 0), 4, None, 0.0)
    letter = dead_letter(record, "errors", stage, error)
    return json.loads(error_line(letter.value, letter.headers))


def test_failed_lines_are_written_as_openais_error_file_has_them() -> None:
    bad_request = dead(json.dumps({"custom_id": "r9", "url": "/x"}).encode(), "decode", "url '/x' is not supported")
    assert bad_request["custom_id"] == "r9" and bad_request["error"] is None
    assert bad_request["response"]["status_code"] == 400
    assert bad_request["response"]["body"]["error"] == {"message": "url '/x' is not supported",
                                                        "type": "invalid_request_error", "param": None, "code": None}
    too_long = dead(json.dumps(line()).encode(), "prepare",
                    "RecordError: the prompt has 300 tokens; the model's context holds 256 (prompt and answer together)")
    assert too_long["response"]["body"]["error"]["code"] == "context_length_exceeded"
    engine = dead(json.dumps(line()).encode(), "infer", "RuntimeError: out of memory")
    assert engine["response"]["status_code"] == 500 and engine["response"]["body"]["error"]["type"] == "server_error"
    assert dead(b"{not json", "decode", "not valid JSON")["custom_id"] is None
    assert dead(None, "decode", "no value")["custom_id"] is None
