"""Turn one scheduled batch into tensors, run the model over the paged KV cache, sample the next tokens.

The runner owns the device: the model's weights and the KV pool, preallocated once at start from a memory
budget (``num_blocks`` is fixed for the engine's life). Per step it builds, in plain Python from the
scheduler's bookkeeping, the flat token batch (every request's not-yet-computed tokens, no padding), their
positions, the cache slot of every new token, and -- for requests whose tokens are all computed after this
step -- the row whose logits are sampled. A request verifying ``k`` speculative drafts computes its last token
and the drafts; all ``k + 1`` of its rows are sampled, each with its own step index (so a seeded request
draws the token at each position exactly as it would without speculation), and
:func:`~sluice.engines.llm.core.speculation.accept_drafts` keeps the accepted run plus one token.

Per-model extras of the step: the CPU attention plan gets masks for each sliding window of the model's
layers; for LongRoPE models the rows of requests longer than ``ModelConfig.long_rope_switch_len`` are
marked for the long-factor rotary table (the scheduler recomputes a request's KV once when it grows past it).
With int4 projections the rows that are prompt positions are named for their dense bf16 path
(``CausalLM.forward``'s ``dense_rows``), decided per row, so a prompt's numbers do not depend on its batch.
Which kernels compute is the engine's :class:`~sluice.engines.llm.kernel_plan.KernelPlan`, fixed at start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from sluice.engines.llm.config import EngineConfig, ModelConfig
from sluice.engines.llm.core.output import SampledToken
from sluice.engines.llm.core.request import Request
from sluice.engines.llm.core.scheduler_output import ScheduledRequest
from sluice.engines.llm.core.speculation import accept_drafts
from sluice.engines.llm.cpu import native_cpu
from sluice.engines.llm.cpu.native_layers import NativeDecodeLayers
from sluice.engines.llm.kernel_plan import KernelPlan
from sluice.engines.llm.model.attention import AttentionMetadata, plan_cpu_attention
from sluice.engines.llm.model.causal_lm import CausalLM, KVCache
from sluice.engines.llm.model.decode_graphs import DecodeGraphs, capture_at_start
from sluice.engines.llm.model.layers.quantized import (
    PACKED_MODULES,
    QuantizedLinear,
    RowSplit,
    describe_forms,
)
from sluice.engines.llm.model.sampling import Sampler, SamplingRow
from sluice.engines.llm.quant.gguf_rows import Loaded
from sluice.engines.llm.structured.bitmask import TokenBitmask
from sluice.engines.start_log import StartLog

log = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}




def resolve_device_dtype(cfg: EngineConfig) -> tuple[torch.device, torch.dtype]:
    """``auto`` picks CUDA when present; fp32 on the CPU, bf16 (or fp16 without bf16 support) on CUDA."""
    if cfg.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but no CUDA device is available; use device='cpu'")
    if cfg.dtype != "auto":
        return device, _DTYPES[cfg.dtype]
    if device.type == "cpu":
        return device, torch.float32
    return device, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def kv_cache_dtype(cfg: EngineConfig, model_dtype: torch.dtype, packed: bool, device: torch.device) -> torch.dtype:
    """The KV pool's dtype: as set, else bf16 for packed CPU weights, else the model's dtype. Only the CPU
    attention path converts between the two."""
    if cfg.kv_cache_dtype != "auto":
        dtype = _DTYPES[cfg.kv_cache_dtype]
        if dtype != model_dtype and device.type != "cpu":
            raise ValueError(f"kv_cache_dtype {cfg.kv_cache_dtype} differs from the model's dtype; on {device} "
                             "leave it auto")  # fmt: skip
        return dtype
    return torch.bfloat16 if packed and device.type == "cpu" else model_dtype


class ModelRunner:
    """Model + KV pool on one device; ``execute`` runs one step."""

    def __init__(
        self,
        model_config: ModelConfig,
        tensors: dict[str, Loaded],
        engine_config: EngineConfig,
        max_model_len: int,
        kernels: KernelPlan,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """``kernels``: the engine's plan. ``progress(done, total)``: called after each tensor converted (the
        start log's progress lines)."""
        self.device, self.dtype = resolve_device_dtype(engine_config)
        self.kernels = kernels
        self.block_size = engine_config.block_size
        self.model = CausalLM.from_weights(model_config, tensors, max_model_len, self.dtype, self.device,
                                           engine_config.weights, progress=progress,
                                           row_invariant=engine_config.deterministic, kernels=kernels)  # fmt: skip
        self.has_packed_weights = any(isinstance(m, PACKED_MODULES) for m in self.model.modules())
        self.kv_dtype = kv_cache_dtype(engine_config, self.dtype, self.has_packed_weights, self.device)
        if self.has_packed_weights and self.kv_dtype == torch.bfloat16:
            self.model.set_rotary_dtype(self.kv_dtype)
        if self.has_packed_weights:
            log.info("llm weights %s: %s; KV pool %s", engine_config.weights, describe_forms(self.model),
                     str(self.kv_dtype).removeprefix("torch."))  # fmt: skip
        # int4 projections take prompt rows through a dense bf16 GEMM (model/layers/quantized.py) where
        # Sluice's own int4 kernel is not used: torch's costs more than the GEMM at a prompt's rows, Sluice's
        # is as fast as the GEMM at hundreds of rows and far faster below (bench/int4_matmul.py), so with it
        # every row takes the kernel (kernels.int4_dense_prompts: on / off force either).
        self.routes_prompt_rows = kernels.dense_prompts and any(
            isinstance(m, QuantizedLinear) and m.routes_rows for m in self.model.modules())
        self.sampler = Sampler(engine_config.seed, kernels.attention)
        self.deterministic = engine_config.deterministic
        # CPU: attention planned once per step (attention.py); otherwise the kernels' ops, fed padded
        # block tables (kernels.cpu_attention: paged runs that plumbing on the CPU)
        self.cpu_attention_plan = kernels.cpu_attention_plan
        cfg = model_config
        self.group = cfg.num_heads // cfg.num_kv_heads  # query heads per KV head
        self.windows = tuple(sorted({w for w in cfg.sliding_windows if w is not None}))  # for the CPU plan
        switch = cfg.long_rope_switch_len
        self.long_rope_switch_len = switch if switch is not None and switch < max_model_len else None
        elem = self.kv_dtype.itemsize
        # K and V of every layer for block_size tokens.
        self.bytes_per_block = 2 * cfg.num_layers * self.block_size * cfg.num_kv_heads * cfg.head_dim * elem
        budget = self._kv_budget_bytes(engine_config, model_config)
        self.num_blocks = budget // self.bytes_per_block
        if self.num_blocks < 1:
            raise ValueError(
                f"the KV memory budget ({budget} bytes) is smaller than one block ({self.bytes_per_block} bytes)"
            )
        # Zero-filled, not empty: padded gathers read unused slots with zero weight, and NaN * 0 is NaN.
        self.kv_pool = torch.zeros(
            cfg.num_layers, 2, self.num_blocks, self.block_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=self.kv_dtype, device=self.device,
        )  # fmt: skip
        self.kv_caches: list[KVCache] = [(self.kv_pool[i, 0], self.kv_pool[i, 1]) for i in range(cfg.num_layers)]
        if kernels.native_decode_layers and self.has_packed_weights:
            self.model.native_layers = NativeDecodeLayers.of(list(self.model.layers), self.model.layer_rope,
                                                             self.kv_caches)  # fmt: skip
        self.graphs: DecodeGraphs | None = None  # decode-only steps through compiled graphs; capture() at start
        if kernels.decode_graphs:
            if self.has_packed_weights:
                raise ValueError(f"kernels.decode_graphs: on compiles dense models; weights: {engine_config.weights} "
                                 "packs them for the CPU's own kernels (use weights: fp32, or decode_graphs: auto)")
            self.graphs = DecodeGraphs(self.model, self.kv_caches, block_size=self.block_size,
                                       max_model_len=max_model_len, max_num_seqs=engine_config.max_num_seqs,
                                       kernel_path=kernels.attention, fixed_tiles=self.deterministic,
                                       sizes=kernels.decode_graph_sizes)  # fmt: skip

    def capture_graphs(self, start: StartLog, required: bool) -> None:
        """Compile the decode graphs, if any, as a phase of the start (:func:`capture_at_start`); where that
        fails and they are not ``required`` (``auto``), decode steps run eager."""
        if self.graphs is not None and not capture_at_start(self.graphs, start, required):
            self.graphs = None

    def _kv_budget_bytes(self, ecfg: EngineConfig, mcfg: ModelConfig) -> int:
        if ecfg.kv_cache_memory_bytes is not None:
            return ecfg.kv_cache_memory_bytes
        if self.device.type != "cuda":
            return EngineConfig.DEFAULT_CPU_KV_BYTES
        free_bytes, _ = torch.cuda.mem_get_info(self.device)
        elem = torch.tensor([], dtype=self.dtype).element_size()
        # Activations of the largest step: a few (tokens, intermediate) tensors plus fp32 logits.
        activations = ecfg.max_num_batched_tokens * (4 * mcfg.intermediate_size + 8 * mcfg.hidden_size) * elem
        activations += ecfg.max_num_seqs * mcfg.vocab_size * 4 * 3
        return max(0, int(free_bytes * ecfg.gpu_memory_utilization) - activations)

    @torch.inference_mode()
    def execute(
        self, scheduled: list[ScheduledRequest], token_bitmask: TokenBitmask | None = None
    ) -> dict[str, list[SampledToken]]:
        """Compute ``num_new_tokens`` positions of each scheduled request; sample where complete.

        ``token_bitmask``: grammar masks for the sampled rows of constrained requests (structured output),
        rows numbered in the order this method samples them.

        Returns the emitted tokens (one, or 1..k+1 after verifying k drafts) of every request whose computed
        tokens reach ``num_tokens`` this step. Block tables must already cover the new positions (the
        scheduler allocated them).
        """
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        logits_rows: list[int] = []
        sampling: list[SamplingRow] = []
        sampled_requests: list[tuple[Request, list[int]]] = []
        switch = self.long_rope_switch_len
        long_rope: list[int] = []  # LongRoPE only: 1 per row of a request past the switch length
        prompt_row: list[bool] = []  # int4 routing only: per row, whether it is a prompt position
        for item in scheduled:
            req, num_new, drafts = item.request, item.num_new_tokens, item.draft_token_ids
            start, end = req.num_computed_tokens, req.num_computed_tokens + num_new
            blocks = req.block_ids
            if drafts:
                input_ids.extend(req.token_ids_in(start, end - len(drafts)))
                input_ids.extend(drafts)
            else:
                input_ids.extend(req.token_ids_in(start, end))
            if num_new == 1:
                positions.append(start)
                slots.append(blocks[start // bs] * bs + start % bs)
            else:
                span = range(start, end)
                positions.extend(span)
                slots.extend(blocks[p // bs] * bs + p % bs for p in span)
            query_lens.append(num_new)
            seq_lens.append(end)
            if switch is not None:
                long_rope.extend([int(req.num_tokens > switch)] * num_new)
            if self.routes_prompt_rows:
                in_prompt = max(0, min(end, req.num_prompt_tokens) - start)
                prompt_row.extend([True] * in_prompt + [False] * (num_new - in_prompt))
            tables.append(blocks)
            if item.completes:
                for j in range(len(drafts), -1, -1):  # the last token's row, then one per draft
                    logits_rows.append(len(input_ids) - 1 - j)
                    sampling.append(SamplingRow(req.params, req.num_output_tokens + len(drafts) - j))
                sampled_requests.append((req, drafts))

        graphs = self.graphs
        if graphs is not None and len(logits_rows) == len(input_ids) == len(scheduled) <= graphs.max_size:
            # a decode-only step: every request one row, sampled
            logits = graphs.run(input_ids, positions, slots, seq_lens, tables, long_rope if any(long_rope) else [])
        else:
            logits = self._eager_logits(input_ids, positions, slots, query_lens, seq_lens, tables, logits_rows,
                                        long_rope, prompt_row)  # fmt: skip
        if not sampled_requests:
            return {}
        out = self.sampler.sample(logits, sampling, token_bitmask)
        result: dict[str, list[SampledToken]] = {}
        row = 0
        for req, drafts in sampled_requests:
            targets = out.token_ids[row : row + len(drafts) + 1]
            tokens = accept_drafts(drafts, targets) if drafts else targets
            want = out.logprobs is not None and req.params.logprobs
            result[req.request_id] = [
                SampledToken(tok, out.logprobs[row + j] if want and out.logprobs is not None else None)
                for j, tok in enumerate(tokens)
            ]
            row += len(drafts) + 1
        return result

    def _eager_logits(self, input_ids: list[int], positions: list[int], slots: list[int], query_lens: list[int],
                      seq_lens: list[int], tables: list[list[int]], logits_rows: list[int], long_rope: list[int],
                      prompt_row: list[bool]) -> torch.Tensor:  # fmt: skip
        """The model run eagerly over the step's rows: ``(len(logits_rows), vocab)`` float32."""
        bs = self.block_size
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor([0, *_cumsum(query_lens)], dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.empty(0) if self.cpu_attention_plan else self._block_table_tensor(tables),
            max_seq_len=max(seq_lens),
            fixed_tiles=self.deterministic,
            kernel_path=self.kernels.attention,
        )
        if any(long_rope):
            meta.long_rope = torch.tensor(long_rope, dtype=torch.int64, device=dev)
        if self.cpu_attention_plan:
            # batch-invariant attention, where the native kernel computes every layer's (not sinks: gpt-oss)
            native = self.kernels.native_cpu and self.kv_dtype in native_cpu.DTYPES
            per_row = native and not self.model.config.attention_sinks
            meta.cpu_plan = plan_cpu_attention(query_lens, seq_lens, tables, bs, self.group, self.windows, per_row,
                                               native)  # fmt: skip
        return self.model(
            torch.tensor(input_ids, dtype=torch.int64, device=dev),
            torch.tensor(positions, dtype=torch.int64, device=dev),
            self.kv_caches,
            meta,
            torch.tensor(logits_rows, dtype=torch.int64, device=dev),
            RowSplit.of(prompt_row),
        )  # (num_sampled, vocab) float32

    def _block_table_tensor(self, tables: list[list[int]]) -> torch.Tensor:
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(padded, dtype=torch.int32, device=self.device)  # (num_seqs, max_blocks)


def _cumsum(values: list[int]) -> list[int]:
    total, out = 0, []
    for v in values:
        total += v
        out.append(total)
    return out
