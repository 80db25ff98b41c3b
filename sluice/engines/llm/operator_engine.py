"""Engine type ``llm``: Sluice's LLM engine behind the operator, with continuous admission. Its options
(everything under ``engine:``) are :class:`~sluice.engines.llm.operator_options.LLMOptions`.

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

With ``structured_output`` (see ``structured/options.py``) the answer is constrained while it is generated:
a JSON Schema (``parse: json`` is then the default and results are JSON values), a choice of labels or a
regex. A record whose constraint cannot be used, or whose answer ``max_tokens`` cut before the constraint
was complete, is dead-lettered with the reason.

The prompt is rendered and tokenised on the intake thread (``prepare``), so a prompt that cannot fit the
context is dead-lettered before it reaches the engine. Every record shares the system prompt, whose KV
blocks the prefix cache computes once.
"""

from __future__ import annotations

import json
import logging
import string
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sluice.engines.chat import ChatRequest
from sluice.engines.engine_contract import (
    ContinuousEngine,
    EngineContext,
    EngineStartError,
    RecordError,
    RecordOrigin,
)
from sluice.engines.engine_types import EngineType
from sluice.engines.identity import ModelSource
from sluice.engines.llm.chat_requests import chat_result, chat_settings
from sluice.engines.llm.operator_options import LLMOptions
from sluice.engines.llm.structured.options import OVERRIDE_KINDS, AnswerChecker, record_spec
from sluice.engines.model_source import disk_source

log = logging.getLogger(__name__)

class AnswerError(RecordError):
    """The model's answer is not what ``parse`` asks for. The message carries the answer."""


@dataclass(frozen=True, slots=True)
class Prompt:
    token_ids: list[int]
    params: Any  # SamplingParams (its structured_output: the record's constraint, if any)
    chat: bool = False  # a chat request (codec.format openai-batch): answered as a ChatResult (chat.py)


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
    num_requests: int = 0  # requests added
    num_prefix_query_tokens: int = 0  # prompt tokens looked up in the prefix cache
    num_prefix_hit_tokens: int = 0  # of those, served from it
    num_structured_requests: int = 0
    num_grammars_compiled: int = 0
    num_grammar_cache_hits: int = 0
    num_grammar_errors: int = 0
    grammar_compile_seconds: float = 0.0
    grammar_mask_fill_seconds: float = 0.0  # engine-thread time spent filling token bitmasks
    num_grammar_mask_steps: int = 0  # steps that filled at least one bitmask


class LLMEngine(ContinuousEngine):
    def __init__(self, options: LLMOptions, context: EngineContext) -> None:
        self.options = options
        self.context = context
        self._fields = [name for _, name, _, _ in string.Formatter().parse(options.user_template) if name]
        self._num_unfinished = 0
        self._validator: Any = None
        self._structured: Any = None  # StructuredOutput of the pipeline, if any
        self._checked: OrderedDict[str, None] = OrderedDict()  # per-record constraints already checked
        self._answers = AnswerChecker()
        self._running: dict[Any, Prompt] = {}  # key -> its prompt, until it finishes

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
        if o.structured_output is not None:
            try:
                self._structured = o.structured_output.spec()
            except ValueError as err:
                raise EngineStartError(f"engine.structured_output: {err}") from None
        try:
            self.llm = LLM(o.model, structured_output_backend=o.backend, base_dir=self.context.pipeline_dir,
                           **o.engine_settings())
        except (OSError, ValueError, TypeError) as err:
            raise EngineStartError(f"cannot load model {o.model!r}: {err}") from None
        if self.llm.tokenizer is None:
            raise EngineStartError(f"model {o.model!r} has no tokenizer; the llm engine needs one for its prompts")
        self.tokenizer = self.llm.tokenizer

    def check_model(self) -> None:
        """The checkpoint read as ``start`` reads it before its weights (``checkpoint.py``), refused alike."""
        from sluice.engines.llm.loading.checkpoint import read_model_checkpoint

        try:
            read_model_checkpoint(self.options.model, self.context.pipeline_dir)
        except (OSError, ValueError, TypeError) as err:
            raise EngineStartError(f"cannot load model {self.options.model!r}: {err}") from None

    def model_source(self) -> ModelSource:
        # a known name's cached directory, else a path relative to the pipeline file (as LLM() resolves it)
        return disk_source(self.options.model, self.context.pipeline_dir)

    def memory_device(self) -> str:
        llm = getattr(self, "llm", None)
        return "cpu" if llm is None else str(llm.runner.device)

    # ---- intake thread -----------------------------------------------------------------------------

    def prepare(self, values: Sequence[Any]) -> list[Prompt]:
        return [self._prompt(v, None) for v in values]

    def prepare_records(self, values: Sequence[Any], origins: Sequence[RecordOrigin]) -> list[Prompt]:
        return [self._prompt(v, o) for v, o in zip(values, origins, strict=True)]

    def item_length(self, item: Prompt) -> int:
        return len(item.token_ids)

    def _prompt(self, value: Any, origin: RecordOrigin | None) -> Prompt:
        from sluice.engines.llm import SamplingParams

        o = self.options
        chat = isinstance(value, ChatRequest)  # its own messages and settings, not the template's
        fields = value if isinstance(value, dict) else {"text": value}
        if chat:
            messages = list(value.messages)
        else:
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
                                    "top_k": o.top_k, "seed": o.seed_source.seed(o.seed, value, origin),
                                    "stop": tuple(o.stop), "ignore_eos": o.ignore_eos,
                                    "structured_output": self._structured}
        if chat:
            settings = chat_settings(value, settings, o.model_fields_set, o.backend, self._checked)
        for name, field in ({} if chat else o.overrides).items():
            if not (isinstance(fields, dict) and field in fields and fields[field] is not None):
                continue
            if name in OVERRIDE_KINDS:
                try:
                    settings["structured_output"] = record_spec(name, fields[field], o.backend, self._checked)
                except ValueError as err:
                    raise RecordError(f"the record's {name} (field {field!r}) cannot constrain the answer: "
                                      f"{err}") from None
            else:
                settings[name] = tuple(fields[field]) if name == "stop" else fields[field]
        try:
            params = SamplingParams(**settings)
        except (ValueError, TypeError) as err:
            raise RecordError(f"generation settings from the record are invalid: {err}") from None
        return Prompt(token_ids, params, chat)

    # ---- engine thread -----------------------------------------------------------------------------

    def room(self) -> int:
        # Keep a short queue inside the engine so every step can fill its token budget.
        return max(0, 2 * self.options.max_num_seqs - self._num_unfinished)

    def add(self, key: Any, item: Prompt) -> None:
        self.llm.add_request(item.token_ids, item.params, request_id=str(key))
        self._num_unfinished += 1
        self._running[int(key)] = item

    def step(self) -> list[tuple[Any, Any]]:
        finished = []
        for out in self.llm.step():
            self._num_unfinished -= 1
            key = int(out.request_id)
            finished.append((key, self._result(out, self._running.pop(key))))
        return finished

    def abort(self, key: Any) -> None:
        self._running.pop(int(key), None)
        if self.llm.abort(str(key)):
            self._num_unfinished -= 1

    @property
    def stats(self) -> LLMStats | None:
        """What the metrics endpoint shows for the LLM engine (read from another thread: a snapshot)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return None
        s = llm.stats
        g = s.structured
        grammar: dict[str, Any] = {} if g is None else dict(
            num_structured_requests=g.num_requests,
            num_grammars_compiled=g.num_grammars_compiled, num_grammar_cache_hits=g.num_grammar_cache_hits,
            num_grammar_errors=g.num_grammar_errors, grammar_compile_seconds=g.grammar_compile_s,
            grammar_mask_fill_seconds=g.mask_fill_s, num_grammar_mask_steps=g.num_mask_steps)
        return LLMStats(num_running=llm.scheduler.num_running, num_waiting=llm.scheduler.num_waiting,
                        kv_usage=s.kv_usage, prefix_cache_hit_rate=s.prefix_cache_hit_rate,
                        num_preemptions=s.num_preemptions, num_prompt_tokens=s.num_prompt_tokens,
                        num_output_tokens=s.num_output_tokens, spec_acceptance_rate=s.spec_acceptance_rate,
                        num_draft_tokens=s.num_draft_tokens, num_accepted_draft_tokens=s.num_accepted_draft_tokens,
                        num_requests=s.num_requests, num_prefix_query_tokens=s.num_prefix_query_tokens,
                        num_prefix_hit_tokens=s.num_prefix_hit_tokens, **grammar)

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            s = llm.stats
            spec = ""
            if s.num_draft_tokens:
                spec = (f", speculative drafts accepted {100 * s.spec_acceptance_rate:.1f}% "
                        f"({s.num_accepted_draft_tokens}/{s.num_draft_tokens})")  # fmt: skip
            g = s.structured
            if g is not None and g.num_requests:
                spec += (f", structured output {100 * s.structured_share:.0f}% of requests ({g.num_grammars_compiled} "
                         f"grammars compiled in {1000 * g.grammar_compile_s:.1f} ms, {g.num_grammar_cache_hits} cache "
                         f"hits, {g.num_grammar_errors} errors; masks {g.mask_fill_ms_per_step:.3f} ms/step)")
            log.info("llm engine: %d prompt tokens, %d output tokens, prefix-cache hit rate %.1f%%, "
                     "%d preemptions%s", s.num_prompt_tokens, s.num_output_tokens, 100 * s.prefix_cache_hit_rate,
                     s.num_preemptions, spec)
            llm.close()

    def _result(self, out: Any, item: Prompt) -> Any:
        """The record's result, or the RecordError that dead-letters it."""
        if item.chat:
            return chat_result(out, len(item.token_ids), self.options.model)
        text = out.text
        spec = item.params.structured_output
        if out.finish_reason == "error":
            return RecordError(f"structured output: {out.error}")
        if spec is not None and out.finish_reason == "length":
            return AnswerError(f"the answer reached max_tokens ({item.params.max_tokens}) before its {spec.kind} "
                               f"was complete; raise max_tokens; answer: {text[:500]!r}")
        if self.options.parse_for(spec) == "none":
            return text
        try:
            answer = json.loads(text if spec is not None else _strip_fence(text))
        except ValueError as err:
            return AnswerError(f"the answer is not valid JSON ({err}); answer: {text[:500]!r}")
        problem = None
        if self._validator is not None:
            error = next(iter(self._validator.iter_errors(answer)), None)
            problem = None if error is None else error.message
        if problem is None and spec is not None:
            problem = self._answers.problem(answer, spec)
        if problem is not None:
            return AnswerError(f"the answer does not match json_schema ({problem}); answer: {text[:500]!r}")
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
