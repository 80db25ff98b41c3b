"""Configuration of the LLM engine: the model's architecture and the engine's options, as typed data.

``ModelConfig`` is read from the weights (a HF ``config.json`` or GGUF metadata) by the model family's
parser (``model/families/``); ``EngineConfig`` is what a user sets. Both are validated once, at construction, with
one-line errors.

One ``ModelConfig`` describes every supported decoder: a Llama is the all-defaults case, and each family
sets the few fields where it differs (biases, q/k norms, Gemma's (1 + w) norms and sandwich norms, sliding
windows, soft-capping, rope scaling, partial rotary, Granite's multipliers, SmolLM3's layers without rotary,
OLMo 2's post-norms with q/k norms across heads).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from sluice.engines.llm.kernel_plan import KernelOptions

# The allowed values of EngineConfig's string settings, as types: the pipeline options (operator_options.py)
# take the same ones, so `sluice validate` refuses what the engine would refuse at start.
WeightMode = Literal["auto", "fp32", "bf16", "int8", "int4"]  # see quant/policy.py
DTypeName = Literal["auto", "float32", "float16", "bfloat16"]
WEIGHT_MODES: tuple[str, ...] = get_args(WeightMode)
DTYPE_NAMES: tuple[str, ...] = get_args(DTypeName)
ROPE_SCALINGS = ("default", "linear", "dynamic", "llama3", "longrope", "yarn")
ACTIVATIONS = ("silu", "gelu_tanh", "gelu", "relu")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary position embedding of one group of layers, with HF transformers' scaling variants.

    ``scaling`` follows HF's ``rope_type``: ``linear`` (positions / factor), ``dynamic`` (NTK base growing
    past ``max_position_embeddings``), ``llama3`` (per-frequency smoothing), ``longrope`` (Phi-3's per-dim
    short/long factors, switched at ``original_max_position_embeddings``), ``yarn``.
    """

    theta: float = 10000.0
    scaling: str = "default"
    factor: float = 1.0  # linear, dynamic, llama3, yarn (longrope: max / original context when unset)
    original_max_position_embeddings: int | None = None  # llama3, longrope, yarn
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    short_factor: tuple[float, ...] = ()  # longrope, one per rotary frequency
    long_factor: tuple[float, ...] = ()  # longrope
    attention_factor: float | None = None  # longrope / yarn: multiplies cos and sin (None: from factor)
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn
    partial_rotary_factor: float = 1.0  # rotate only the first int(head_dim * this) dims (Phi-4-mini 0.75)
    # divisors of the inverse frequencies, one per frequency: llama.cpp's rope_freqs tensor (how its
    # converter stores llama3 scaling); () = none
    freq_factors: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.scaling not in ROPE_SCALINGS:
            raise ValueError(f"rope scaling {self.scaling!r} is not supported (supported: {', '.join(ROPE_SCALINGS)})")
        if not self.theta > 0:
            raise ValueError(f"rope theta must be > 0, got {self.theta}")
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}")
        needs_original = self.scaling in ("llama3", "longrope", "yarn")
        if needs_original and not self.original_max_position_embeddings:
            raise ValueError(f"rope scaling {self.scaling!r} needs original_max_position_embeddings")
        if self.scaling == "longrope" and (not self.short_factor or len(self.short_factor) != len(self.long_factor)):
            raise ValueError("longrope rope scaling needs short_factor and long_factor lists of equal length")

    def rotary_dim(self, head_dim: int) -> int:
        """Leading dims of each head that are rotated (HF: ``int(head_dim * partial_rotary_factor)``)."""
        return int(head_dim * self.partial_rotary_factor)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A decoder-only transformer: pre-norm residual blocks, RoPE, grouped-query attention, gated MLP."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    architecture: str = "llama"  # the model family (registry key) that parsed this config
    rms_norm_eps: float = 1e-5
    rope: RopeConfig = RopeConfig()
    local_rope: RopeConfig | None = None  # sliding-window layers' rope when it differs (Gemma 3)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    hidden_act: str = "silu"  # gate activation of the MLP: silu, gelu_tanh, gelu, relu
    qkv_bias: bool = False  # biases on the q/k/v projections (Qwen2)
    o_bias: bool = False  # bias on the output projection
    mlp_bias: bool = False  # biases on gate/up/down
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before rotary (Qwen3, Gemma 3)
    qk_norm_across_heads: bool = False  # OLMo 2: the q and k norms span all heads (q_proj's whole output)
    gemma_norms: bool = False  # every norm is Gemma's: (1 + w) * x in fp32, then cast
    norms_cast_after: bool = False  # OLMo 2: every norm is w * x in fp32, then cast (Llama's casts first)
    sandwich_norms: bool = False  # Gemma 2/3: post-attention and pre/post-feedforward norms
    embed_scale: float | None = None  # multiply embeddings by this (Gemma: sqrt(hidden_size))
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (None: head_dim)
    attn_logit_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_logit_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)
    sliding_windows: tuple[int | None, ...] = ()  # per layer: keys within this many positions; () = none
    rotary_layers: tuple[bool, ...] = ()  # per layer: whether q and k are rotated (SmolLM3's NoPE); () = all
    attention_multiplier: float | None = None  # attention scale itself (Granite), overriding the above
    embedding_multiplier: float | None = None  # embeddings times this float (Granite; unlike embed_scale,
    # not rounded to the weights' dtype first)
    residual_multiplier: float | None = None  # each block's output times this before the residual add (Granite)
    logits_divisor: float | None = None  # logits / this (Granite's logits_scaling)
    attention_sinks: bool = False  # gpt-oss: a learned logit per head joins each softmax (self_attn.sinks)
    # sparse mixture of experts (Qwen3-MoE, Mixtral): each token's MLP is the weighted sum of the top
    # num_experts_per_tok of num_experts gated MLPs of width moe_intermediate_size, weighted by the softmax of
    # the router's logits over all experts (renormalised over the chosen ones when norm_topk_prob)
    num_experts: int = 0  # 0 = a dense model
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    sparse_layers: tuple[bool, ...] = ()  # per layer: experts (True) or the dense MLP; () = experts everywhere
    # gpt-oss's experts: the router has a bias and takes the softmax of the top-k logits only; the experts
    # have biases and a clamped SwiGLU, (up + 1) * g * sigmoid(alpha * g) with g, up clamped at swiglu_limit
    router_softmax_after_topk: bool = False
    moe_bias: bool = False  # biases on the router and on every expert's projections
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        for rope in (self.rope, self.local_rope):
            if rope is not None and rope.rotary_dim(self.head_dim) % 2 != 0:
                raise ValueError(f"the rotary dim must be even, got {rope.rotary_dim(self.head_dim)}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"activation {self.hidden_act!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
        if self.sliding_windows and len(self.sliding_windows) != self.num_layers:
            raise ValueError(f"sliding_windows has {len(self.sliding_windows)} entries for {self.num_layers} layers")
        if any(w is not None and w < 1 for w in self.sliding_windows):
            raise ValueError(f"sliding windows must be >= 1, got {self.sliding_windows}")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, {self.num_experts}], got {self.num_experts_per_tok}")
        if self.num_experts and self.moe_intermediate_size < 1:
            raise ValueError(f"moe_intermediate_size must be >= 1, got {self.moe_intermediate_size}")
        if self.sparse_layers and len(self.sparse_layers) != self.num_layers:
            raise ValueError(f"sparse_layers has {len(self.sparse_layers)} entries for {self.num_layers} layers")
        if self.rotary_layers and len(self.rotary_layers) != self.num_layers:
            raise ValueError(f"rotary_layers has {len(self.rotary_layers)} entries for {self.num_layers} layers")
        for name in ("attn_logit_softcap", "final_logit_softcap", "attention_multiplier", "embedding_multiplier",
                     "residual_multiplier", "logits_divisor"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 or null, got {value}")

    @property
    def attn_scale(self) -> float:
        """Softmax scale of the attention scores."""
        if self.attention_multiplier is not None:
            return self.attention_multiplier
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def has_experts(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is the sparse mixture of experts (else the dense gated MLP)."""
        return self.num_experts > 0 and (self.sparse_layers[layer] if self.sparse_layers else True)

    def rotates(self, layer: int) -> bool:
        """Whether ``layer`` applies the rotary embedding to q and k (False: SmolLM3's NoPE layers)."""
        return self.rotary_layers[layer] if self.rotary_layers else True

    def sliding_window(self, layer: int) -> int | None:
        """Keys a query of ``layer`` sees (its own position and ``window - 1`` before it); None = all."""
        return self.sliding_windows[layer] if self.sliding_windows else None

    def layer_rope(self, layer: int) -> RopeConfig:
        """The rope of ``layer``: ``local_rope`` for sliding-window layers when set, else ``rope``."""
        if self.local_rope is not None and self.sliding_window(layer) is not None:
            return self.local_rope
        return self.rope

    @property
    def max_context_len(self) -> int:
        """Longest sequence the model is meant to run: ``max_position_embeddings``, times the factor for
        dynamic-NTK rope (which exists to stretch the context past the trained length)."""
        if self.rope.scaling == "dynamic" and self.rope.factor > 1:
            return int(self.max_position_embeddings * self.rope.factor)
        return self.max_position_embeddings

    @property
    def long_rope_switch_len(self) -> int | None:
        """LongRoPE: a sequence longer than this is rotated with the long factors, all of its positions (as
        HF transformers does, recomputing the KV when a sequence grows past it); None for other ropes."""
        if self.rope.scaling == "longrope" and self.rope.short_factor != self.rope.long_factor:
            return self.rope.original_max_position_embeddings
        return None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Options of :class:`sluice.engines.llm.LLM`.

    The KV pool is sized once at start: ``kv_cache_memory_bytes`` if given, else on CUDA
    ``gpu_memory_utilization`` of the free device memory after the weights are loaded, else (CPU)
    ``DEFAULT_CPU_KV_BYTES``.
    """

    # The pipeline defaults too (operator_options.py). Kept where a stream's latency wants them: a step of
    # 1024 tokens already saturates a CPU's matmuls (bench/llm.py uses 512), and every running request waits
    # for the whole step, so a larger budget only lengthens the worst step; raise both on a GPU.
    max_num_seqs: int = 32  # requests decoded together in one step
    max_num_batched_tokens: int = 1024  # tokens (prefill chunks + decodes) computed in one step
    block_size: int = 16  # tokens per KV block
    enable_prefix_caching: bool = True
    kv_cache_memory_bytes: int | None = None  # explicit KV pool size; overrides the fraction below
    gpu_memory_utilization: float = 0.9  # CUDA only: fraction of free memory the KV pool may take
    dtype: DTypeName = "auto"  # "auto" (fp32 on CPU, bf16/fp16 on CUDA), "float32", "float16", "bfloat16"
    # form of the projections, LM head and embeddings on the CPU (quant/policy.py): "auto" keeps a GGUF's
    # quantisation where a kernel exists, "fp32" dequantises all, "bf16", "int8", "int4" convert all
    weights: WeightMode = "auto"
    # dtype of the KV pool: "auto" = bf16 on the CPU when weights are packed (their matmuls take bf16 inputs
    # anyway, and it halves the pool), else the model's dtype; or "float32", "bfloat16", "float16"
    kv_cache_dtype: DTypeName = "auto"
    device: str = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:N"
    max_model_len: int | None = None  # prompt + output cap; default: the model's context length
    num_threads: int | None = None  # CPU only: torch intra-op threads (None leaves torch's setting)
    seed: int = 0  # seeds requests that sample without their own seed
    # True: a request's tokens and log-probs never depend on the requests it shares a step with, on prompt
    # chunking, prefix-cache hits, speculation or the thread count (docs/llm.md: what is reproduced). False
    # lets each CPU matmul call's row count pick its kernel (model/layers/row_invariant.py) and the Triton attention
    # pick its tile from the batch: no faster on the CPUs measured (bench/results/llm_batch_invariance.md),
    # kept for GPUs, where the tile choice has not been timed yet.
    deterministic: bool = True
    # Prompt-lookup speculative decoding: drafts per decoding request and step (0 = off); n-gram sizes
    # matched against the request's own tokens; adaptive: draft only where the measured step cost says the
    # request's recent acceptance pays for the extra positions (off: always draft when a match exists).
    num_speculative_tokens: int = 0
    speculative_ngram_max: int = 3
    speculative_ngram_min: int = 1
    speculative_adaptive: bool = True
    # Which kernels and weight forms compute (kernel_plan.py): resolved once at start into a KernelPlan.
    kernels: KernelOptions = field(default_factory=KernelOptions)

    DEFAULT_CPU_KV_BYTES = 512 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be > 0, got {self.kv_cache_memory_bytes}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be auto, float32, float16 or bfloat16, got {self.dtype!r}")
        if self.kv_cache_dtype not in DTYPE_NAMES:
            raise ValueError(f"kv_cache_dtype must be auto, float32, float16 or bfloat16, got {self.kv_cache_dtype!r}")
        if self.weights not in WEIGHT_MODES:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_MODES)}, got {self.weights!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0 (0 = off), got {self.num_speculative_tokens}")
        if not 1 <= self.speculative_ngram_min <= self.speculative_ngram_max:
            raise ValueError(
                "need 1 <= speculative_ngram_min <= speculative_ngram_max, got "
                f"{self.speculative_ngram_min} and {self.speculative_ngram_max}"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
