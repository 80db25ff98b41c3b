"""``codec.format: openai-batch``: OpenAI's batch file format, so a batch job moves to a local model unchanged.

Each input line is a request, as OpenAI's batch API takes it::

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}}

and each answer a line as OpenAI's batch output file has it::

    {"id": "batch_req_...", "custom_id": "r1", "error": null,
     "response": {"status_code": 200, "request_id": "req_...",
                  "body": {"id": "chatcmpl-...", "object": "chat.completion", "created": 1733000000,
                           "model": "smollm2-135m", "choices": [{"index": 0, "finish_reason": "stop",
                           "message": {"role": "assistant", "content": "Hello!", "refusal": null},
                           "logprobs": null}],
                           "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}}}

A line that fails is answered in the dead-letter file, as OpenAI answers it in its error file: the same
shape with ``status_code`` 400 (``invalid_request_error``: the line itself is wrong, or its prompt does not
fit the model's context) or 500 (``server_error``: the engine failed on it), and the error in the body.

The body's fields, mapped onto the llm engine (sluice/engines/llm/chat_requests.py): ``messages`` (roles system,
developer -- read as system --, user, assistant; text content, or a list of text parts), ``max_completion_tokens``
or ``max_tokens``, ``temperature`` (0..2), ``top_p``, ``seed``, ``stop`` (a string or up to 4), and
``response_format`` (``json_schema``: the answer is constrained to the schema while generated; ``json_object``:
to a JSON object; ``text``). ``n`` must be 1, ``stream`` false, the penalties 0 and ``logprobs`` false;
``model``, ``user``, ``metadata``, ``store`` and ``service_tier`` label a request and are not acted on.
Anything else (tools, images...) is refused for that line, as OpenAI refuses an argument it does not know.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec

from sluice.codecs.codec_error import CodecError
from sluice.engines.chat import ChatRequest, ChatResult
from sluice.operator.failures.dead_letter import error_headers
from sluice.operator.record import Headers

URL = "/v1/chat/completions"
_LINE_KEYS = {"custom_id", "method", "url", "body"}
_LABELS = {"model", "user", "metadata", "store", "service_tier"}  # accepted, not acted on
_ONLY = {"n": (1,), "stream": (False,), "logprobs": (False,), "frequency_penalty": (0, 0.0),
         "presence_penalty": (0, 0.0)}  # accepted with these values only (or null)
_SETTINGS = {"messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
             "response_format", "stream_options"}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def read_request(line: Any) -> ChatRequest:
    """The chat request of one decoded input line. Raises CodecError('decode', ...) saying what is wrong, in
    the words OpenAI's API would use."""
    if not isinstance(line, dict):
        raise _invalid("a batch line is a JSON object with custom_id, method, url and body")
    unknown = sorted(set(line) - _LINE_KEYS)
    if unknown:
        raise _invalid(f"unrecognized field in the batch line: {unknown[0]!r} (expected custom_id, method, url, body)")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _invalid("custom_id is required: a non-empty string naming the request")
    if line.get("method") != "POST":
        raise _invalid(f"method must be POST, got {line.get('method')!r}")
    if line.get("url") != URL:
        raise _invalid(f"url {line.get('url')!r} is not supported: this engine answers {URL}")
    body = line.get("body")
    if not isinstance(body, dict):
        raise _invalid("body is required: the chat completion request, a JSON object")
    for key in sorted(body):
        if key in _ONLY and body[key] is not None and body[key] not in _ONLY[key]:
            raise _invalid(f"{key}={body[key]!r} is not supported here (only {_ONLY[key][0]!r})")
        if key not in _SETTINGS and key not in _LABELS and key not in _ONLY:
            raise _invalid(f"Unrecognized request argument supplied: {key}")
    tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ChatRequest(messages=_messages(body.get("messages")),
                       max_tokens=_number(tokens, "max_completion_tokens", int, 1, None),
                       temperature=_number(body.get("temperature"), "temperature", float, 0, 2),
                       top_p=_number(body.get("top_p"), "top_p", float, 0, 1),
                       seed=_number(body.get("seed"), "seed", int, None, None),
                       stop=_stop(body.get("stop")), json_schema=_schema(body.get("response_format")))


def write_response(line: dict[str, Any], result: ChatResult) -> bytes:
    """The output line answering ``line`` (its request) with ``result``."""
    completion = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
        "model": result.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": result.content, "refusal": None},
                     "logprobs": None, "finish_reason": result.finish_reason}],
        "usage": {"prompt_tokens": result.num_prompt_tokens, "completion_tokens": result.num_completion_tokens,
                  "total_tokens": result.num_prompt_tokens + result.num_completion_tokens},
        "system_fingerprint": None,
    }
    return _line(line.get("custom_id"), 200, completion)


def error_line(value: bytes | None, headers: Headers) -> bytes:
    """The error-file line for a failed input line (the dead letter's bytes and ``sluice.error.*`` headers)."""
    e = error_headers(headers)
    custom_id = None
    try:
        doc = _decoder.decode(value) if value is not None else None
        custom_id = doc.get("custom_id") if isinstance(doc, dict) else None
    except (msgspec.DecodeError, RecursionError, ValueError):
        pass
    stage, message = e.get("stage", ""), e.get("message", "unknown error")
    client_side = stage in ("decode", "prepare")
    code = "context_length_exceeded" if client_side and "context" in message and "tokens" in message else None
    error = {"message": message, "type": "invalid_request_error" if client_side else "server_error",
             "param": None, "code": code}
    return _line(custom_id if isinstance(custom_id, str) else None, 400 if client_side else 500, {"error": error})


def _line(custom_id: Any, status: int, body: dict[str, Any]) -> bytes:
    return _encoder.encode({"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": custom_id,
                            "response": {"status_code": status, "request_id": f"req_{uuid.uuid4().hex}",
                                         "body": body}, "error": None})


def _invalid(message: str) -> CodecError:
    return CodecError("decode", message)


def _messages(value: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise _invalid("messages is required: a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise _invalid(f"messages[{i}].role must be one of system, developer, user, assistant")
        if m.get("tool_calls") or m.get("function_call"):
            raise _invalid(f"messages[{i}]: tool calls are not supported")
        content = m.get("content")
        if isinstance(content, list):
            texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                raise _invalid(f"messages[{i}].content: only text parts are supported")
            content = "\n".join(str(t) for t in texts)
        if not isinstance(content, str):
            raise _invalid(f"messages[{i}].content must be a string or a list of text parts")
        out.append({"role": _ROLES[m["role"]], "content": content})
    return tuple(out)


def _number(value: Any, name: str, kind: type, low: float | None, high: float | None) -> Any:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (kind is float or isinstance(value, int))
    if not ok or (low is not None and value < low) or (high is not None and value > high):
        bounds = f" in [{low}, {high}]" if high is not None else (f" >= {low}" if low is not None else "")
        raise _invalid(f"{name} must be {'an integer' if kind is int else 'a number'}{bounds}, got {value!r}")
    return kind(value)


def _stop(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not 1 <= len(stops) <= 4 or not all(isinstance(s, str) and s for s in stops):
        raise _invalid("stop must be a non-empty string or a list of up to 4 of them")
    return tuple(stops)


def _schema(value: Any) -> Any:
    """The JSON Schema answers are constrained to, or None for free text."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise _invalid("response_format.json_schema.schema is required: the JSON Schema of the answer")
        return schema
    raise _invalid("response_format.type must be text, json_object or json_schema")
