"""A Llama-family decoder that runs over the paged KV cache.

Input is the flat batch of this step's new tokens of all sequences (no padding): ``input_ids`` and
``positions`` of shape ``(num_tokens,)``, plus :class:`AttentionMetadata` (slot mapping, block tables,
query start offsets, sequence lengths). Each layer writes its K/V into the cache and attends over it.
Logits are computed only for the rows in ``logits_indices`` (the last new token of each sequence that
samples this step), which on a prefill step saves a ``(num_tokens, vocab)`` matmul.

The arithmetic follows HF transformers' ``LlamaForCausalLM`` operation by operation (RMSNorm in fp32,
rotate-half RoPE, residual order), which is what makes greedy parity with it exact in fp32. Q/K/V and
gate/up projections are fused into one matmul each: fewer, larger matmuls on the CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sluice.engines.llm.attention import AttentionMetadata, store_and_attend
from sluice.engines.llm.config import ModelConfig

KVCache = tuple[torch.Tensor, torch.Tensor]  # (k, v), each (num_blocks, block_size, num_kv_heads, head_dim)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (num_tokens, hidden) -> same
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_cos_sin(head_dim: int, theta: float, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``(max_len, head_dim)`` in fp32, halves repeated (rotate-half convention)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.arange(max_len, dtype=torch.float32).unsqueeze(1) * inv_freq.unsqueeze(0)
    emb = torch.cat((freqs, freqs), dim=-1)  # (max_len, head_dim)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (num_tokens, num_heads, head_dim); cos/sin: (num_tokens, 1, head_dim)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,  # (num_tokens, hidden)
        cos: torch.Tensor,  # (num_tokens, 1, head_dim)
        sin: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # (num_tokens, hidden)
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(n, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(k.view(n, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        o = store_and_attend(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(o.reshape(n, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (num_tokens, hidden) -> same
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """Decoder plus LM head. Build with :meth:`from_weights`; the KV caches are owned by the runner."""

    def __init__(self, cfg: ModelConfig, max_model_len: int) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_cos_sin(cfg.head_dim, cfg.rope_theta, max_model_len)
        self.rope_cos: torch.Tensor
        self.rope_sin: torch.Tensor
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_model_len, head_dim)
        self.register_buffer("rope_sin", sin, persistent=False)

    @classmethod
    def from_weights(
        cls,
        cfg: ModelConfig,
        tensors: dict[str, torch.Tensor],
        max_model_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> LlamaModel:
        """Build the model from HF-named tensors (see ``weights.py``), fusing Q/K/V and gate/up.

        Consumes ``tensors`` (the dict is emptied) so that no second copy of the weights stays alive.
        """
        with torch.device("meta"):
            model = cls(cfg, max_model_len)
        state: dict[str, torch.Tensor] = {}
        for name in list(tensors):
            state[name.removeprefix("model.")] = tensors.pop(name)
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            attn, mlp = p + "self_attn.", p + "mlp."
            state[attn + "qkv_proj.weight"] = torch.cat(
                [state.pop(attn + f"{x}_proj.weight") for x in ("q", "k", "v")], dim=0
            )
            state[mlp + "gate_up_proj.weight"] = torch.cat(
                [state.pop(mlp + f"{x}_proj.weight") for x in ("gate", "up")], dim=0
            )
        if cfg.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        elif "lm_head.weight" not in state:
            raise ValueError("the weights have no lm_head.weight and the config does not tie embeddings")
        state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"weights do not match the model: missing {missing}, unexpected {unexpected}")
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        cos, sin = rope_cos_sin(cfg.head_dim, cfg.rope_theta, max_model_len)
        model.rope_cos, model.rope_sin = cos.to(device, dtype), sin.to(device, dtype)
        return model.eval().requires_grad_(False)

    def forward(
        self,
        input_ids: torch.Tensor,  # (num_tokens,) int64
        positions: torch.Tensor,  # (num_tokens,) int64
        kv_caches: list[KVCache],  # one per layer
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,  # (num_samples,) int64 rows whose next-token logits are needed
    ) -> torch.Tensor:  # (num_samples, vocab) float32
        h = self.embed_tokens(input_ids)  # (num_tokens, hidden)
        cos = self.rope_cos[positions].unsqueeze(1)  # (num_tokens, 1, head_dim)
        sin = self.rope_sin[positions].unsqueeze(1)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, cos, sin, kv_cache, meta)
        h = self.norm(h.index_select(0, logits_indices))  # (num_samples, hidden)
        if h.device.type == "cpu":
            # (vocab, hidden) @ (hidden, num_samples): for a few rows (a decode batch, a speculative verify)
            # torch's CPU GEMM is 2-4x faster this way round than F.linear's (rows, hidden) @ (hidden, vocab)
            # (SmolLM2, 5 rows: 4 ms vs 13 ms), and never slower for more rows.
            return torch.matmul(self.lm_head.weight, h.T).T.float()  # (num_samples, vocab)
        return self.lm_head(h).float()
