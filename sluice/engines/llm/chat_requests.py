"""Chat requests (``codec.format: openai-batch``) in the llm engine: their settings over the pipeline's, and
their answers as chat results.

A request's own settings win; one it leaves out takes the pipeline's ``engine`` option when the pipeline
sets it, else OpenAI's default (temperature and top_p 1.0) -- so a batch job written for OpenAI samples as
it did there -- except ``max_tokens``, which falls back to ``engine.max_tokens`` (an answer is never
unbounded). A ``response_format`` schema constrains the answer while it is generated (structured output);
unlike a template record's answer, a chat answer is never dead-lettered for what it says: one that
``max_tokens`` cut comes back with ``finish_reason: length``, as OpenAI returns it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from sluice.engines.chat import ChatRequest, ChatResult
from sluice.engines.engine_contract import RecordError
from sluice.engines.llm.structured.options import record_spec

_OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}


def chat_settings(request: ChatRequest, settings: dict[str, Any], given: set[str], backend: str,
                  checked: OrderedDict[str, None]) -> dict[str, Any]:
    """SamplingParams keywords for ``request``: ``settings`` (the pipeline's) with the request's on top.
    ``given``: the engine options the pipeline set itself. Raises RecordError for an unusable schema."""
    out = dict(settings)
    for name, default in _OPENAI_DEFAULTS.items():
        if name not in given:
            out[name] = default
    for name in ("max_tokens", "temperature", "top_p", "seed"):
        value = getattr(request, name)
        if value is not None:
            out[name] = value
    if request.stop is not None:
        out["stop"] = request.stop
    if request.json_schema is not None:
        try:
            out["structured_output"] = record_spec("json_schema", request.json_schema, backend, checked)
        except ValueError as err:
            raise RecordError(f"response_format.json_schema cannot constrain the answer: {err}") from None
    return out


def chat_result(out: Any, num_prompt_tokens: int, model: str) -> ChatResult | RecordError:
    """The chat result of a finished request (a RecordError when generation itself failed)."""
    if out.finish_reason == "error":
        return RecordError(f"structured output: {out.error}")
    return ChatResult(content=out.text, finish_reason="length" if out.finish_reason == "length" else "stop",
                      num_prompt_tokens=num_prompt_tokens, num_completion_tokens=len(out.token_ids), model=model)
