"""Configuration of the LLM engine: the model's architecture and the engine's options, as typed data.

``ModelConfig`` is read from the weights (a HF ``config.json`` or GGUF metadata) by ``weights.py``;
``EngineConfig`` is what a user sets. Both are validated once, at construction, with one-line errors.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A Llama-family decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Options of :class:`sluice.engines.llm.LLM`.

    The KV pool is sized once at start: ``kv_cache_memory_bytes`` if given, else on CUDA
    ``gpu_memory_utilization`` of the free device memory after the weights are loaded, else (CPU)
    ``DEFAULT_CPU_KV_BYTES``.
    """

    max_num_seqs: int = 64  # requests decoded together in one step
    max_num_batched_tokens: int = 2048  # tokens (prefill chunks + decodes) computed in one step
    block_size: int = 16  # tokens per KV block
    enable_prefix_caching: bool = True
    kv_cache_memory_bytes: int | None = None  # explicit KV pool size; overrides the fraction below
    gpu_memory_utilization: float = 0.9  # CUDA only: fraction of free memory the KV pool may take
    dtype: str = "auto"  # "auto" (fp32 on CPU, bf16/fp16 on CUDA), "float32", "float16", "bfloat16"
    device: str = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:N"
    max_model_len: int | None = None  # prompt + output cap; default: the model's context length
    num_threads: int | None = None  # CPU only: torch intra-op threads (None leaves torch's setting)
    seed: int = 0  # seeds requests that sample without their own seed
    # Prompt-lookup speculative decoding: drafts per decoding request and step (0 = off); n-gram sizes
    # matched against the request's own tokens; adaptive: draft only where the measured step cost says the
    # request's recent acceptance pays for the extra positions (off: always draft when a match exists).
    num_speculative_tokens: int = 0
    speculative_ngram_max: int = 3
    speculative_ngram_min: int = 1
    speculative_adaptive: bool = True

    DEFAULT_CPU_KV_BYTES = 512 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be > 0, got {self.kv_cache_memory_bytes}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be auto, float32, float16 or bfloat16, got {self.dtype!r}")
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
