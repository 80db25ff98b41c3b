"""The decoder-only model that runs over the paged KV cache, for every supported family.

Input is the flat batch of this step's new tokens of all sequences (no padding): ``input_ids`` and
``positions`` of shape ``(num_tokens,)``, plus :class:`AttentionMetadata` (slot mapping, block tables,
query start offsets, sequence lengths). Each layer writes its K/V into the cache and attends over it.
Logits are computed only for the rows in ``logits_indices`` (the last new token of each sequence that
samples this step), which on a prefill step saves a ``(num_tokens, vocab)`` matmul.

:class:`CausalLM` is the part every family shares: embeddings (scaled for Gemma), the rotary tables (one
per distinct rope of the layers: Gemma 3's local and global), the stack of the family's decoder layers
(``model/families/<family>.py``), the final norm, the LM head (tied or not) and the final-logit soft-cap. The
arithmetic follows HF transformers operation by operation, which is what makes greedy parity with it exact
in fp32. Q/K/V and gate/up projections are fused into one matmul each: fewer, larger matmuls on the CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from sluice.engines.llm.config import ModelConfig, RopeConfig
from sluice.engines.llm.cpu.native_layers import NativeDecodeLayers
from sluice.engines.llm.kernel_plan import KernelPlan
from sluice.engines.llm.model.attention import AttentionMetadata
from sluice.engines.llm.model.layers.decoder import DECODER_LAYERS
from sluice.engines.llm.model.layers.moe import Stacked, pack_experts
from sluice.engines.llm.model.layers.norm import make_norm
from sluice.engines.llm.model.layers.quantized import RescoredHead, RowSplit, StepRows
from sluice.engines.llm.model.layers.rotary import rope_tables
from sluice.engines.llm.model.layers.row_invariant import make_row_invariant
from sluice.engines.llm.model.layers.self_attention import KVCache
from sluice.engines.llm.model.packing import expert_forms, swap_in, tied_forms
from sluice.engines.llm.quant.gguf_rows import ExpertRows, GGUFRows, Loaded
from sluice.engines.llm.quant.heap import release_freed_memory
from sluice.engines.llm.quant.packed import PackedWeight
from sluice.engines.llm.quant.policy import (
    Materialized,
    Role,
    choose_form,
    materialize,
    rescores_head,
)

__all__ = ["CausalLM", "KVCache", "LlamaModel"]

log = logging.getLogger(__name__)


class CausalLM(nn.Module):
    """Decoder plus LM head. Build with :meth:`from_weights`; the KV caches are owned by the runner."""

    def __init__(self, cfg: ModelConfig, max_model_len: int, layer_cls: type[nn.Module]) -> None:
        super().__init__()
        self.config = cfg
        self.max_model_len = max_model_len
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layer_cls(cfg, i) for i in range(cfg.num_layers))
        self.norm = make_norm(cfg.hidden_size, cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        ropes: list[RopeConfig] = []
        for i in range(cfg.num_layers):
            if cfg.layer_rope(i) not in ropes:
                ropes.append(cfg.layer_rope(i))
        self.ropes = ropes
        self.layer_rope = [ropes.index(cfg.layer_rope(i)) for i in range(cfg.num_layers)]  # table of each layer
        # (rows, rotary_dim) cos/sin per rope, in the model's dtype; set by from_weights
        self.rope_cos: list[torch.Tensor] = []
        self.rope_sin: list[torch.Tensor] = []
        self.embed_scale: torch.Tensor | None = None  # () in the embeddings' dtype, as HF rounds it
        # the layer stack of decode-only steps in one native call, where it applies (set by the runner once
        # the KV pool exists: cpu/native_layers.py)
        self.native_layers: NativeDecodeLayers | None = None
        self.step_rows = StepRows()  # the prompt rows of the step in forward, for the int4 projections

    @classmethod
    def from_weights(
        cls,
        cfg: ModelConfig,
        tensors: dict[str, Loaded],
        max_model_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        weights: str = "fp32",
        progress: Callable[[int, int], None] | None = None,
        row_invariant: bool = True,
        kernels: KernelPlan | None = None,
    ) -> CausalLM:
        """Build the model from Sluice-named tensors (``model/families/`` maps and fuses a checkpoint's names).

        ``weights``: the form of the projections, LM head and embeddings (``quant/policy.py``; ``fp32``: dense
        in ``dtype``). Packed forms are CPU kernels: on another device ``auto`` means dense, and the packed
        modes are refused. ``progress(done, total)`` is called before each tensor is converted.
        ``row_invariant`` (CPU): dense matmuls compute each row as in any batch (``model/layers/row_invariant.py``;
        False: as the call's row count picks). Consumes
        ``tensors`` (the dict is emptied, one tensor at a time) so that no second
        copy of the weights stays alive. ``kernels``: the engine's plan, which the layers follow (None: each
        takes what this machine has).
        """
        from sluice.engines.llm.model.families.family_registry import family_named

        scales_only = None if kernels is None else kernels.int4_scales_only
        if torch.device(device).type != "cpu":
            if weights not in ("auto", "fp32"):
                raise ValueError(f"weights: {weights} packs weights for the CPU; on {device} use weights: auto "
                                 "(the weights then follow dtype)")  # fmt: skip
            weights = "fp32"

        with torch.device("meta"):
            model = cls(cfg, max_model_len, DECODER_LAYERS[family_named(cfg.architecture).decoder_layer])
        keep_fp32 = {
            f"{name}.{param}" if name else param
            for name, module in model.named_modules()
            for param in getattr(module, "FP32_PARAMS", ())
        }
        if cfg.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)
        elif "lm_head.weight" not in tensors:
            raise ValueError("the weights have no lm_head.weight and the config does not tie embeddings")
        state: dict[str, torch.Tensor] = {}
        packed: dict[str, Materialized] = {}  # module name -> its packed weight
        exact_head: GGUFRows | None = None  # the LM head's own rows, when its packed logits are rescored
        packed_experts: dict[str, list[PackedWeight]] = {}  # a Stacked module's name -> each expert packed
        dequantised_experts = 0  # values of a GGUF's quantised experts that are kept in float
        num_tensors = len(tensors)
        for done, name in enumerate(list(tensors)):
            if progress is not None:
                progress(done, num_tensors)
            release_freed_memory()  # the previous matrix's temporaries: see quant/heap.py
            source = tensors.pop(name)
            module_name, _, param = name.rpartition(".")
            role = _ROLES.get(module_name, "linear")
            if param == "weight" and isinstance(model.get_submodule(module_name), Stacked):  # experts
                experts = expert_forms(source, weights, scales_only)
                if experts is not None:
                    packed_experts[module_name] = experts
                    continue
                if isinstance(source, ExpertRows):  # kept float by `weights`: said once, below
                    source = source.to_float()
                    dequantised_experts += source.numel()
            assert not isinstance(source, ExpertRows), f"{name}: stacked experts for a module that is not"
            if param == "weight" and isinstance(model.get_submodule(module_name), (nn.Linear, nn.Embedding)):
                if cfg.tie_word_embeddings and module_name == "embed_tokens":
                    packed.update(tied_forms(source, weights, scales_only))
                    if rescores_head(source, weights):
                        table = packed["embed_tokens"]
                        exact_head = table if isinstance(table, GGUFRows) else None
                    continue
                form = choose_form(role, source, weights)
                if form != "float":
                    rescored = role == "lm_head" and rescores_head(source, weights)
                    packed[module_name] = materialize(source, form, ranks=rescored, scales_only=scales_only)
                    if rescored:
                        exact_head = materialize(source, "gguf")  # type: ignore[assignment]
                    continue
            tensor = source.to_float() if isinstance(source, (GGUFRows, ExpertRows)) else source
            state[name] = tensor.to(device=device, dtype=torch.float32 if name in keep_fp32 else dtype)
        for module_name, weight in packed.items():
            if isinstance(weight, torch.Tensor):  # a tied table kept dense
                state[f"{module_name}.weight"] = weight.to(device=device, dtype=dtype)
        release_freed_memory()
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        dense_tied = cfg.tie_word_embeddings and "embed_tokens.weight" in state
        missing = [m for m in missing if not (dense_tied and m == "lm_head.weight")
                   and m.removesuffix(".weight") not in packed and m.removesuffix(".weight") not in packed_experts]  # fmt: skip
        if missing or unexpected:
            raise ValueError(f"weights do not match the model: missing {missing}, unexpected {unexpected}")
        if dense_tied:
            model.lm_head.weight = model.embed_tokens.weight
        pack_experts(model, packed_experts)
        if dequantised_experts:
            log.warning("the quantised experts take %.1f GB dequantised in %s (weights: %s; auto or int4 keep them "
                        "packed on the CPU)", dequantised_experts * dtype.itemsize / 1e9, dtype, weights)  # fmt: skip
        for module in model.modules():
            finish = getattr(module, "finish_loading", None)
            if finish is not None:  # a layer keeping its weights in another layout than the checkpoint's
                finish()
        for module_name, weight in packed.items():
            if not isinstance(weight, torch.Tensor):
                swap_in(model, module_name, weight, dtype, model.step_rows)
        if exact_head is not None:
            model.lm_head = RescoredHead(model.lm_head, exact_head)  # type: ignore[assignment]
        if torch.device(device).type == "cpu":
            make_row_invariant(model, pad_rows=row_invariant)
        for rope in model.ropes:
            cos, sin = rope_tables(rope, cfg.head_dim, cfg.max_position_embeddings, max_model_len)
            model.rope_cos.append(cos.to(device, dtype))
            model.rope_sin.append(sin.to(device, dtype))
        if cfg.embed_scale is not None:
            model.embed_scale = torch.tensor(cfg.embed_scale).to(device=device, dtype=dtype)
        if kernels is not None:
            model.use_kernels(kernels)
        return model.eval().requires_grad_(False)

    def use_kernels(self, plan: KernelPlan) -> None:
        """Hand the engine's kernel plan to every layer that chooses a kernel (those with ``use_kernels``)."""
        for module in self.modules():
            use = getattr(module, "use_kernels", None) if module is not self else None
            if use is not None:
                use(plan)

    def set_rotary_dtype(self, dtype: torch.dtype) -> None:
        """Keep the cos/sin tables in ``dtype``: the KV pool's, when packed projections hand bf16 queries and
        keys to a bf16 pool (they are rotated in bf16 then, not converted to fp32 and back)."""
        self.rope_cos = [t.to(dtype) for t in self.rope_cos]
        self.rope_sin = [t.to(dtype) for t in self.rope_sin]

    @property
    def long_rope_offset(self) -> int:
        """Rows to add to a position to reach its LongRoPE long-factor row (the tables stack short, long)."""
        return self.max_model_len

    def forward(
        self,
        input_ids: torch.Tensor,  # (num_tokens,) int64
        positions: torch.Tensor,  # (num_tokens,) int64
        kv_caches: list[KVCache],  # one per layer
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,  # (num_samples,) int64 rows whose next-token logits are needed
        dense_rows: RowSplit | None = None,  # prompt rows through the int4 projections' dense path
    ) -> torch.Tensor:  # (num_samples, vocab) float32
        self.step_rows.split = dense_rows
        try:
            return self._forward(input_ids, positions, kv_caches, meta, logits_indices)
        finally:
            self.step_rows.split = None

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                 meta: AttentionMetadata, logits_indices: torch.Tensor) -> torch.Tensor:  # fmt: skip
        h = self.embed_tokens(input_ids)  # (num_tokens, hidden)
        if self.embed_scale is not None:
            h = h * self.embed_scale
        if self.config.embedding_multiplier is not None:
            h = h * self.config.embedding_multiplier
        rotary = []
        for rope, cos, sin in zip(self.ropes, self.rope_cos, self.rope_sin, strict=True):
            rows = positions
            if rope.scaling == "longrope" and meta.long_rope is not None:
                rows = positions + meta.long_rope * self.long_rope_offset
            rotary.append((cos[rows].unsqueeze(1), sin[rows].unsqueeze(1)))  # (num_tokens, 1, rotary_dim)
        native = self.native_layers
        if native is not None and self.step_rows.split is None and native.applies(h, meta, kv_caches, rotary[0][0]):
            h = native(h, *rotary[0], meta)  # the same arithmetic as the loop below, in one call
        else:
            for layer, kv_cache, table in zip(self.layers, kv_caches, self.layer_rope, strict=True):
                h = layer(h, *rotary[table], kv_cache, meta)
        if not logits_indices.numel():  # only partial prefill chunks this step: nothing is sampled
            return torch.empty(0, self.config.vocab_size, device=h.device)
        h = self.norm(h.index_select(0, logits_indices))  # (num_samples, hidden)
        if h.device.type == "cpu" and type(self.lm_head) is nn.Linear:  # not a RowInvariantLinear
            # (vocab, hidden) @ (hidden, num_samples): for a few rows (a decode batch, a speculative verify)
            # torch's CPU GEMM is several times faster this way round than F.linear's (rows, hidden) @
            # (hidden, vocab), and never slower for more rows.
            logits = torch.matmul(self.lm_head.weight, h.T).T.float()  # (num_samples, vocab)
        else:
            logits = self.lm_head(h).float()
        if self.config.logits_divisor is not None:
            logits = logits / self.config.logits_divisor
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


LlamaModel = CausalLM  # the name before other families were added

_ROLES: dict[str, Role] = {"lm_head": "lm_head", "embed_tokens": "embedding"}
