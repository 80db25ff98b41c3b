"""Engine type ``llm``: Sluice's LLM engine behind the operator, with continuous admission.

```yaml
codec: {format: json, input_field: "."}     # the whole record fills the template
engine:
  type: llm
  model: smollm2-135m
  system_prompt: "Label the review as positive, negative or neutral. Answer with JSON: {\"label\": ...}"
  user_template: "Review: {text}"           # {field} placeholders, filled from the record
  max_tokens: 16
  overrides: {max_tokens: max_len}          # a record's own max_len field overrides max_tokens
  parse: json                               # answers that are not JSON (or fail json_schema) are dead-lettered
```

The prompt is rendered and tokenised on the intake thread (``prepare``), so a prompt that cannot fit the
context is dead-lettered before it reaches the engine. Every record shares the system prompt, whose KV
blocks the prefix cache computes once.
"""

from __future__ import annotations

import json
import logging
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sluice.engines.base import ContinuousEngine, EngineContext, EngineStartError, RecordError
from sluice.engines.registry import EngineType

log = logging.getLogger(__name__)

_OVERRIDABLE = Literal["max_tokens", "temperature", "top_p", "top_k", "seed", "stop"]


class LLMOptions(BaseModel):
    """Everything under ``engine:`` for ``type: llm``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(default="smollm2-135m", min_length=1)  # known name, .gguf file or HF directory
    system_prompt: str | None = None
    user_template: str = "{text}"  # {field} placeholders; a non-object input fills {text}
    max_tokens: int = Field(default=64, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    ignore_eos: bool = False  # generate exactly max_tokens (benchmarks)
    overrides: dict[_OVERRIDABLE, str] = Field(default_factory=dict)  # generation setting -> record field
    parse: Literal["none", "json"] = "none"
    json_schema: dict[str, Any] | None = None  # with parse: json, answers must validate against it
    max_num_seqs: int = Field(default=32, ge=1)
    max_num_batched_tokens: int = Field(default=1024, ge=16)
    max_model_len: int | None = Field(default=None, ge=16)
    kv_cache_memory_mb: int | None = Field(default=None, ge=1)
    num_threads: int | None = Field(default=None, ge=1)
    device: str = "auto"
    dtype: str = "auto"
    # Prompt-lookup speculative decoding (0 = off): drafts copied from the prompt, verified in the batch.
    num_speculative_tokens: int = Field(default=0, ge=0, le=16)
    speculative_ngram_max: int = Field(default=3, ge=1)
    speculative_ngram_min: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _ngram_range(self) -> LLMOptions:
        if self.speculative_ngram_min > self.speculative_ngram_max:
            raise ValueError(f"speculative_ngram_min ({self.speculative_ngram_min}) must be <= "
                             f"speculative_ngram_max ({self.speculative_ngram_max})")  # fmt: skip
        return self

    @field_validator("user_template")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            [name for _, name, _, _ in string.Formatter().parse(value)]
        except ValueError as err:
            raise ValueError(f"not a valid template: {err}") from None
        return value


class AnswerError(RecordError):
    """The model's answer is not what ``parse`` asks for. The message carries the answer."""


@dataclass(frozen=True, slots=True)
class Prompt:
    token_ids: list[int]
    params: Any  # SamplingParams


@dataclass(frozen=True, slots=True)
class LLMStats:
    num_running: int  # requests being prefilled or decoded
    num_waiting: int  # requests waiting for room in the running batch
    kv_usage: float  # fraction of KV blocks in use
    prefix_cache_hit_rate: float  # 0..1, prompt tokens served from the prefix cache
    num_preemptions: int
    num_prompt_tokens: int
    num_output_tokens: int
    spec_acceptance_rate: float = 0.0  # 0..1, speculative drafts accepted / verified (0 when off)
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0


class LLMEngine(ContinuousEngine):
    def __init__(self, options: LLMOptions, context: EngineContext) -> None:
        self.options = options
        self.context = context
        self._fields = [name for _, name, _, _ in string.Formatter().parse(options.user_template) if name]
        self._num_unfinished = 0
        self._validator: Any = None

    def start(self) -> None:
        from sluice.engines.llm import LLM

        o = self.options
        if o.json_schema is not None:
            import jsonschema

            try:
                jsonschema.Draft202012Validator.check_schema(o.json_schema)
            except jsonschema.SchemaError as err:
                raise EngineStartError(f"engine.json_schema is not a valid JSON Schema: {err.message}") from None
            self._validator = jsonschema.Draft202012Validator(o.json_schema)
        extra: dict[str, Any] = {}
        if o.kv_cache_memory_mb is not None:
            extra["kv_cache_memory_bytes"] = o.kv_cache_memory_mb * 1024 * 1024
        try:
            self.llm = LLM(o.model, max_num_seqs=o.max_num_seqs, max_num_batched_tokens=o.max_num_batched_tokens,
                           max_model_len=o.max_model_len, num_threads=o.num_threads, device=o.device,
                           dtype=o.dtype, num_speculative_tokens=o.num_speculative_tokens,
                           speculative_ngram_max=o.speculative_ngram_max,
                           speculative_ngram_min=o.speculative_ngram_min, **extra)
        except (OSError, ValueError, TypeError) as err:
            raise EngineStartError(f"cannot load model {o.model!r}: {err}") from None
        if self.llm.tokenizer is None:
            raise EngineStartError(f"model {o.model!r} has no tokenizer; the llm engine needs one for its prompts")
        self.tokenizer = self.llm.tokenizer

    # ---- intake thread -----------------------------------------------------------------------------

    def prepare(self, values: Sequence[Any]) -> list[Prompt]:
        return [self._prompt(v) for v in values]

    def item_length(self, item: Prompt) -> int:
        return len(item.token_ids)

    def _prompt(self, value: Any) -> Prompt:
        from sluice.engines.llm import SamplingParams

        o = self.options
        fields = value if isinstance(value, dict) else {"text": value}
        try:
            user = o.user_template.format_map({name: _text(fields[name]) for name in self._fields})
        except KeyError as err:
            raise RecordError(f"the record has no field {err.args[0]!r} for the prompt template") from None
        messages = ([{"role": "system", "content": o.system_prompt}] if o.system_prompt else [])
        messages.append({"role": "user", "content": user})
        token_ids = self.tokenizer.encode(self.llm.apply_chat_template(messages), add_special_tokens=False)
        if len(token_ids) >= self.llm.max_model_len:
            raise RecordError(f"the prompt has {len(token_ids)} tokens; the model's context holds "
                              f"{self.llm.max_model_len} (prompt and answer together)")
        settings: dict[str, Any] = {"max_tokens": o.max_tokens, "temperature": o.temperature, "top_p": o.top_p,
                                    "top_k": o.top_k, "seed": o.seed, "stop": tuple(o.stop), "ignore_eos": o.ignore_eos}
        for name, field in o.overrides.items():
            if isinstance(fields, dict) and field in fields and fields[field] is not None:
                settings[name] = tuple(fields[field]) if name == "stop" else fields[field]
        try:
            params = SamplingParams(**settings)
        except (ValueError, TypeError) as err:
            raise RecordError(f"generation settings from the record are invalid: {err}") from None
        return Prompt(token_ids, params)

    # ---- engine thread -----------------------------------------------------------------------------

    def room(self) -> int:
        # Keep a short queue inside the engine so every step can fill its token budget.
        return max(0, 2 * self.options.max_num_seqs - self._num_unfinished)

    def add(self, key: Any, item: Prompt) -> None:
        self.llm.add_request(item.token_ids, item.params, request_id=str(key))
        self._num_unfinished += 1

    def step(self) -> list[tuple[Any, Any]]:
        finished = []
        for out in self.llm.step():
            self._num_unfinished -= 1
            finished.append((int(out.request_id), self._answer(out.text)))
        return finished

    def has_unfinished(self) -> bool:
        return self._num_unfinished > 0

    def abort(self, key: Any) -> None:
        if self.llm.abort(str(key)):
            self._num_unfinished -= 1

    @property
    def stats(self) -> LLMStats | None:
        """What the metrics endpoint shows for the LLM engine (read from another thread: a snapshot)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return None
        s = llm.stats
        return LLMStats(num_running=llm.scheduler.num_running, num_waiting=llm.scheduler.num_waiting,
                        kv_usage=s.kv_usage, prefix_cache_hit_rate=s.prefix_cache_hit_rate,
                        num_preemptions=s.num_preemptions, num_prompt_tokens=s.num_prompt_tokens,
                        num_output_tokens=s.num_output_tokens, spec_acceptance_rate=s.spec_acceptance_rate,
                        num_draft_tokens=s.num_draft_tokens, num_accepted_draft_tokens=s.num_accepted_draft_tokens)

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            s = llm.stats
            spec = ""
            if s.num_draft_tokens:
                spec = (f", speculative drafts accepted {100 * s.spec_acceptance_rate:.1f}% "
                        f"({s.num_accepted_draft_tokens}/{s.num_draft_tokens})")  # fmt: skip
            log.info("llm engine: %d prompt tokens, %d output tokens, prefix-cache hit rate %.1f%%, "
                     "%d preemptions%s", s.num_prompt_tokens, s.num_output_tokens, 100 * s.prefix_cache_hit_rate,
                     s.num_preemptions, spec)

    def _answer(self, text: str) -> Any:
        if self.options.parse == "none":
            return text
        try:
            answer = json.loads(_strip_fence(text))
        except ValueError as err:
            return AnswerError(f"the answer is not valid JSON ({err}); answer: {text[:500]!r}")
        if self._validator is not None:
            problem = next(iter(self._validator.iter_errors(answer)), None)
            if problem is not None:
                return AnswerError(f"the answer does not match json_schema ({problem.message}); "
                                   f"answer: {text[:500]!r}")
        return answer


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _strip_fence(text: str) -> str:
    """Small models like to wrap JSON in a Markdown code fence."""
    t = text.strip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1] if "\n" in t else ""
        t = t.rsplit("```", 1)[0]
    return t.strip()


ENGINE_TYPE = EngineType(name="llm", options=LLMOptions, factory=LLMEngine, continuous=True)
