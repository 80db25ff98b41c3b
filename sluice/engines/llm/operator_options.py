"""The options of engine type ``llm`` (everything under ``engine:``), validated when the pipeline is loaded.

Three groups: which model and how to prompt it (``model``, ``system_prompt``, ``user_template``), how to
generate and read the answer (the sampling settings, ``overrides``, ``parse``, ``json_schema``,
``structured_output``), and the engine's own settings (``ENGINE_SETTINGS``: batch sizes, context, device,
weights, speculation). The last group is :class:`~sluice.engines.llm.config.EngineConfig`'s fields under the
same names, defaults and allowed values, taken from it, so a pipeline and the standalone ``LLM`` behave
alike unless told otherwise. ``seed`` is the exception by design: here it seeds each record's sampling
(``SamplingParams.seed``), in ``EngineConfig`` the requests that have no seed of their own.
"""

from __future__ import annotations

import string
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sluice.engines.llm.config import DTypeName, EngineConfig, WeightMode
from sluice.engines.llm.structured.options import OVERRIDE_KINDS, StructuredOutputOptions

_ENGINE = EngineConfig()  # the engine's defaults

# LLMOptions fields passed to the engine under the same name (kv_cache_memory_mb is converted to bytes)
ENGINE_SETTINGS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_threads", "device", "dtype",
                   "weights", "num_speculative_tokens", "speculative_ngram_max", "speculative_ngram_min")

_OVERRIDABLE = Literal["max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "json_schema", "choice",
                       "regex"]


class LLMOptions(BaseModel):
    """Everything under ``engine:`` for ``type: llm``. The engine's own settings (``ENGINE_SETTINGS``) take
    :class:`EngineConfig`'s defaults and allowed values."""

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
    # none: the answer text; json: a JSON value (default with a JSON Schema in structured_output)
    parse: Literal["none", "json"] | None = None
    json_schema: dict[str, Any] | None = None  # with parse: json, answers must validate against it
    structured_output: StructuredOutputOptions | None = None  # constrain answers while they are generated
    # ---- the engine's settings (ENGINE_SETTINGS): EngineConfig's defaults, so the two cannot drift
    max_num_seqs: int = Field(default=_ENGINE.max_num_seqs, ge=1)
    max_num_batched_tokens: int = Field(default=_ENGINE.max_num_batched_tokens, ge=16)
    max_model_len: int | None = Field(default=_ENGINE.max_model_len, ge=16)
    kv_cache_memory_mb: int | None = Field(default=None, ge=1)  # EngineConfig.kv_cache_memory_bytes, in MiB
    num_threads: int | None = Field(default=_ENGINE.num_threads, ge=1)
    device: str = _ENGINE.device  # auto, cpu, cuda, cuda:N (checked with its YAML path: config/applies.py)
    dtype: DTypeName = _ENGINE.dtype
    # CPU weight form: auto keeps a GGUF's quantisation (Q4 -> int4, Q8_0 & co. -> int8), fp32 dequantises
    weights: WeightMode = _ENGINE.weights
    # Prompt-lookup speculative decoding (0 = off): drafts copied from the prompt, verified in the batch.
    num_speculative_tokens: int = Field(default=_ENGINE.num_speculative_tokens, ge=0, le=16)
    speculative_ngram_max: int = Field(default=_ENGINE.speculative_ngram_max, ge=1)
    speculative_ngram_min: int = Field(default=_ENGINE.speculative_ngram_min, ge=1)

    @model_validator(mode="after")
    def _ngram_range(self) -> LLMOptions:
        if self.speculative_ngram_min > self.speculative_ngram_max:
            raise ValueError(f"speculative_ngram_min ({self.speculative_ngram_min}) must be <= "
                             f"speculative_ngram_max ({self.speculative_ngram_max})")  # fmt: skip
        constrained = self.structured_output is not None or any(k in OVERRIDE_KINDS for k in self.overrides)
        if constrained and self.ignore_eos:
            raise ValueError("ignore_eos cannot be combined with structured_output (or a json_schema, choice or "
                             "regex override): a constrained answer ends when it is complete")
        if self.json_schema is not None and self.structured_output is not None:
            raise ValueError("json_schema and structured_output are both set: give the schema once, as "
                             "structured_output.json_schema (answers are then also checked against it)")
        return self

    @property
    def parse_mode(self) -> Literal["none", "json"]:
        """``parse`` as given, else ``json`` when the pipeline's answers follow a JSON Schema, else ``none``."""
        if self.parse is not None:
            return self.parse
        schema = (self.structured_output is not None and self.structured_output.has_schema) or (
            "json_schema" in self.overrides
        )
        return "json" if schema else "none"

    def parse_for(self, spec: Any) -> Literal["none", "json"]:
        """How to read one answer: ``parse`` as given, else ``json`` exactly when its constraint is a schema
        (a record's own choice or regex answer stays text)."""
        if self.parse is not None:
            return self.parse
        if spec is not None:
            return "json" if spec.kind == "json_schema" else "none"
        return self.parse_mode

    def engine_settings(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~sluice.engines.llm.LLM` these options set."""
        settings: dict[str, Any] = {name: getattr(self, name) for name in ENGINE_SETTINGS}
        if self.kv_cache_memory_mb is not None:
            settings["kv_cache_memory_bytes"] = self.kv_cache_memory_mb * 1024 * 1024
        return settings

    @property
    def backend(self) -> str:
        return self.structured_output.backend if self.structured_output is not None else "llguidance"

    @field_validator("user_template")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            [name for _, name, _, _ in string.Formatter().parse(value)]
        except ValueError as err:
            raise ValueError(f"not a valid template: {err}") from None
        return value
