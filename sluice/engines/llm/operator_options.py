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
from sluice.engines.llm.core.record_seed import SeedFrom
from sluice.engines.llm.kernel_plan import KernelOptions
from sluice.engines.llm.structured.options import OVERRIDE_KINDS, StructuredOutputOptions

_ENGINE = EngineConfig()  # the engine's defaults

# LLMOptions fields passed to the engine under the same name (kv_cache_memory_mb is converted to bytes)
ENGINE_SETTINGS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_threads", "device", "dtype",
                   "weights", "num_speculative_tokens", "speculative_ngram_max", "speculative_ngram_min",
                   "deterministic")

_OVERRIDABLE = Literal["max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "json_schema", "choice",
                       "regex"]


_KERNELS = KernelOptions()


class KernelSettings(BaseModel):
    """Which kernels and weight forms compute (``engine.kernels``): every choice defaults to what serving
    wants; turning one off compares paths or works around a kernel. Shown by ``sluice validate`` and logged
    at start, as resolved for the machine."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    attention: Literal["auto", "triton", "torch", "reference"] = _KERNELS.attention  # type: ignore[assignment]
    """The KV store and paged attention: `auto` (Triton on CUDA, torch elsewhere), `triton`, `torch`, or
    `reference` (slow per-sequence loops)."""
    cpu_attention: Literal["planned", "paged"] = _KERNELS.cpu_attention  # type: ignore[assignment]
    """On the CPU: `planned` (attention planned once per step, the native kernel where built) or `paged`
    (padded block tables per layer, as on CUDA)."""
    native_cpu: bool = _KERNELS.native_cpu
    """Sluice's C++ CPU kernels, compiled once per machine at the first start (`false`: torch's ops)."""
    native_decode_layers: bool = _KERNELS.native_decode_layers
    """A decode step's layers in one native call, for Llama-shaped int4 models."""
    int4_matmul: Literal["sluice", "torch"] = _KERNELS.int4_matmul  # type: ignore[assignment]
    """Int4 weights on the CPU: Sluice's matmul where built (AVX512-BF16), or torch's."""
    int4_scales_only: bool = _KERNELS.int4_scales_only
    """Symmetric int4 weights keep their scales only (a tenth fewer bytes read per step)."""
    int4_dense_prompts: Literal["auto", "on", "off"] = _KERNELS.int4_dense_prompts  # type: ignore[assignment]
    """Prompt rows of int4 projections through a dense bf16 GEMM: `auto` where Sluice's int4 matmul is not
    used, `on`, `off`."""

    decode_graphs: Literal["auto", "on", "off"] = _KERNELS.decode_graphs  # type: ignore[assignment]
    """Decode-only steps through a compiled graph per batch-size bucket, replayed as CUDA graphs: `auto` (on
    CUDA), `on`, `off`. The buckets and the memory they hold are logged at start; on the CPU `on` compiles
    without CUDA graphs (with `cpu_attention: paged` and `native_cpu: false`), to check the graph path."""

    decode_graph_sizes: tuple[int, ...] = ()
    """The batch sizes `decode_graphs` compiles, each up to `max_num_seqs` (a step of n requests takes the
    smallest one >= n); empty: the powers of two below `max_num_seqs`, and `max_num_seqs`."""

    @field_validator("int4_dense_prompts", "decode_graphs", mode="before")
    @classmethod
    def _on_off(cls, value: object) -> object:
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value  # YAML's on / off

    def options(self) -> KernelOptions:
        return KernelOptions(**self.model_dump())


class LLMOptions(BaseModel):
    """Everything under ``engine:`` for ``type: llm``. The engine's own settings (``ENGINE_SETTINGS``) take
    :class:`EngineConfig`'s defaults and allowed values."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    model: str = Field(default="smollm2-135m", min_length=1)
    """A known model name (`sluice models list`), a `.gguf` file, or a Hugging Face directory of a supported
    family."""
    system_prompt: str | None = None
    """The system message shared by every record; its KV blocks are computed once (prefix cache)."""
    user_template: str = "{text}"
    """The user message: `{field}` placeholders filled from the record (use `codec.input_field: "."`); a
    non-object input fills `{text}`."""
    max_tokens: int = Field(default=64, ge=1)
    """The most tokens an answer may have."""
    temperature: float = Field(default=0.0, ge=0)
    """Sampling temperature; `0` is greedy."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling: the smallest set of tokens whose probability reaches this."""
    top_k: int = Field(default=0, ge=0)
    """Sample among the `k` most likely tokens (`0`: all)."""
    seed: int | None = None
    """Salts each record's sampling seed (see `seed_from`): another value, another reproducible draw."""
    seed_from: str = "offset"
    """What seeds a record's sampling, so a replay samples the same answer: `offset` (source topic, partition
    and offset), `key`, `field:NAME` (a field of the record) or `none` (`seed` alone, every record alike)."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end an answer (not included in it)."""
    ignore_eos: bool = False
    """Generate exactly `max_tokens`, past the end-of-sequence token (benchmarks)."""
    overrides: dict[_OVERRIDABLE, str] = Field(default_factory=dict)
    """A generation setting taken from a record field, e.g. `{max_tokens: max_len}`."""
    parse: Literal["none", "json"] | None = None
    """`none`: the answer is text; `json`: a JSON value, and an answer that is not JSON is dead-lettered
    (default: `json` with a JSON Schema in `structured_output`)."""
    json_schema: dict[str, Any] | None = None
    """With `parse: json`, answers must validate against this JSON Schema (checked after generation;
    `structured_output` constrains it during)."""
    structured_output: StructuredOutputOptions | None = None
    """Constrain answers while they are generated: a JSON Schema, a choice of labels, a regex or a grammar."""
    # ---- the engine's settings (ENGINE_SETTINGS): EngineConfig's defaults, so the two cannot drift
    max_num_seqs: int = Field(default=_ENGINE.max_num_seqs, ge=1)
    """The most records in the running batch."""
    max_num_batched_tokens: int = Field(default=_ENGINE.max_num_batched_tokens, ge=16)
    """The most tokens computed in one step (prompt chunks and decodes together)."""
    max_model_len: int | None = Field(default=_ENGINE.max_model_len, ge=16)
    """The longest prompt plus answer (default: the model's context); longer prompts are dead-lettered."""
    kv_cache_memory_mb: int | None = Field(default=None, ge=1)
    """Memory for the paged KV cache, in MiB (default: 512 on the CPU; on a GPU, what is free after the
    weights and activations)."""
    num_threads: int | None = Field(default=_ENGINE.num_threads, ge=1)
    """CPU threads for the model (default: torch's)."""
    device: str = _ENGINE.device
    """`auto` (CUDA when present), `cpu`, `cuda` or `cuda:N`."""
    dtype: DTypeName = _ENGINE.dtype
    """The compute dtype: `auto` (float32 on the CPU, bfloat16 or float16 on CUDA), `float32`, `float16`,
    `bfloat16`."""
    weights: WeightMode = _ENGINE.weights
    """The form of the weights on the CPU: `auto` keeps a GGUF's quantisation (Q4 as int4, Q8_0 and others as
    int8; float files stay float32), `fp32` dequantises everything, `bf16`, `int8` and `int4` convert every
    projection."""
    num_speculative_tokens: int = Field(default=_ENGINE.num_speculative_tokens, ge=0, le=16)
    """Prompt-lookup speculative decoding: up to this many draft tokens copied from the prompt, verified in
    the batch (`0`: off)."""
    speculative_ngram_max: int = Field(default=_ENGINE.speculative_ngram_max, ge=1)
    """The longest n-gram matched in the prompt to find a draft."""
    speculative_ngram_min: int = Field(default=_ENGINE.speculative_ngram_min, ge=1)
    """The shortest n-gram matched in the prompt to find a draft."""
    deterministic: bool = _ENGINE.deterministic
    """A record's answer never depends on the records it is batched with, on chunking, caching, speculation or
    threads (see the LLM guide for what is reproduced); `false` lets each step's shape pick the kernels."""
    kernels: KernelSettings = Field(default_factory=KernelSettings)
    """Which kernels and weight forms compute."""

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

    @field_validator("seed_from")
    @classmethod
    def _seed_from(cls, value: str) -> str:
        SeedFrom.parse(value)
        return value

    @property
    def seed_source(self) -> SeedFrom:
        """``seed_from`` parsed."""
        return SeedFrom.parse(self.seed_from)

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
        settings["kernels"] = self.kernels.options()
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
