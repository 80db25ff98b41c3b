"""OpenAI's batch file format on SmolLM2, as a user runs it: a batch input file in, OpenAI's output lines out
(checked against the ``openai`` package's own types), failed lines in the error file as OpenAI reports them,
and the answers the ones the engine gives the same chat directly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.model_store import fetch
from tests.integration.pipelines import run_sluice

pytestmark = pytest.mark.slow

SYSTEM = "You are a helpful assistant. Answer in one short sentence."
SCHEMA = {"type": "object", "properties": {"sentiment": {"type": "string", "enum": ["positive", "negative"]}},
          "required": ["sentiment"], "additionalProperties": False}


def request(custom_id: str, messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": messages, **body}}


LINES: list[Any] = [
    request("greedy", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is Kafka?"}],
            max_tokens=12, temperature=0),
    request("schema", [{"role": "developer", "content": "Classify the review."},
                       {"role": "user", "content": [{"type": "text", "text": "I love it, five stars!"}]}],
            max_completion_tokens=24, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}}),
    request("cut", [{"role": "user", "content": "Count from one to twenty in words."}], max_tokens=2, seed=7),
    request("stopped", [{"role": "user", "content": "List three colours, comma separated."}], max_tokens=16,
            temperature=0, stop=[","]),
    {"custom_id": "embed", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
    request("too-long", [{"role": "user", "content": "word " * 400}], max_tokens=4),
    "this line is not JSON",
]


def test_a_batch_file_round_trips_on_smollm2(tmp_path: Path) -> None:
    from openai.types.chat import ChatCompletion

    from sluice.engines.llm import LLM, SamplingParams

    fetch("smollm2-135m")  # into the model cache, once
    (tmp_path / "batch.jsonl").write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                                                  for line in LINES))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({
        "source": {"file": {"path": "batch.jsonl"}}, "codec": {"format": "openai-batch"},
        "engine": {"type": "llm", "model": "smollm2-135m", "num_threads": 2, "max_model_len": 256},
        "sink": {"file": {"path": "results.jsonl"}}}))
    proc = run_sluice("run", str(tmp_path / "p.yaml"), timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| tokens: " in proc.stderr  # the summary counts the LLM's tokens

    out = {o["custom_id"]: o for o in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())}
    errors = [json.loads(x) for x in (tmp_path / "results.dead-letters.jsonl").read_text().splitlines()]
    assert set(out) == {"greedy", "schema", "cut", "stopped"}
    assert sorted(str(e["custom_id"]) for e in errors) == ["None", "embed", "too-long"]  # one line each, in all

    completions = {}
    for custom_id, line in out.items():
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200 and line["response"]["request_id"].startswith("req_")
        completion = ChatCompletion.model_validate(line["response"]["body"])  # OpenAI's own type
        assert completion.object == "chat.completion" and completion.model == "smollm2-135m"
        usage = completion.usage
        assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > 0
        completions[custom_id] = completion
    assert completions["cut"].choices[0].finish_reason == "length"
    assert completions["cut"].usage is not None and completions["cut"].usage.completion_tokens == 2
    assert json.loads(completions["schema"].choices[0].message.content or "") == {"sentiment": "positive"}
    assert "," not in (completions["stopped"].choices[0].message.content or "")

    # the same chat, asked of the engine directly, greedily: the batch line got exactly that answer
    llm = LLM(fetch("smollm2-135m"), num_threads=2, max_model_len=256)
    try:
        prompt = llm.apply_chat_template([{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": "What is Kafka?"}])
        ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
        (direct,) = llm.generate([ids], SamplingParams(max_tokens=12, temperature=0.0))
    finally:
        llm.close()
    greedy = completions["greedy"]
    assert greedy.choices[0].message.content == direct.text
    assert greedy.usage is not None and greedy.usage.prompt_tokens == len(ids)

    by_id = {e["custom_id"]: e["response"] for e in errors}
    assert by_id["embed"]["status_code"] == 400 and "/v1/embeddings" in by_id["embed"]["body"]["error"]["message"]
    assert by_id["too-long"]["body"]["error"]["code"] == "context_length_exceeded"
    assert by_id[None]["body"]["error"]["type"] == "invalid_request_error"
