"""Chat completions as plain data: what an engine that takes chat messages is asked, and what it answers.

The contract between ``codec.format: openai-batch`` (sluice/codecs/openai_batch.py, which reads OpenAI's
batch lines into a :class:`ChatRequest` and writes a :class:`ChatResult` as OpenAI's response line) and the
``llm`` engine (sluice/engines/llm/chat_requests.py). Settings left ``None`` are the engine's to choose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat completion to generate."""

    messages: tuple[dict[str, str], ...]  # {"role": system | user | assistant, "content": text}, in order
    max_tokens: int | None = None  # most tokens to generate
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None  # stop strings (not part of the answer)
    json_schema: Any = None  # the answer is constrained to JSON valid against this schema


@dataclass(frozen=True, slots=True)
class ChatResult:
    """The answer to a :class:`ChatRequest`."""

    content: str  # the assistant message's text
    finish_reason: str  # "stop" (end of answer or a stop string) or "length" (max_tokens reached)
    num_prompt_tokens: int
    num_completion_tokens: int
    model: str  # the model that answered, as the pipeline names it
