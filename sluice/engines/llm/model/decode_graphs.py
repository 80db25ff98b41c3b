"""Decode steps replayed from graphs: the model's forward compiled whole per batch-size bucket, captured as a
CUDA graph on CUDA, so that a decode step costs one launch from Python instead of hundreds.

A step whose every request computes and samples one token (no prompt rows, no speculative verify) and whose
requests fit the largest bucket runs here; all others run eager. Buckets are ``kernels.decode_graph_sizes``,
by default the powers of two below ``max_num_seqs`` and ``max_num_seqs`` itself; a step of ``n`` requests takes the smallest bucket ``>= n``, its
rows past ``n`` padded (token 0 at position 0, KV slot -1 so nothing is stored, KV length 1: they attend to a
block they never write and their logits are dropped).

Each bucket owns static input tensors -- token ids, positions, KV slots, KV lengths, block tables (one row per
request, ``max_model_len / block_size`` wide) and, for LongRoPE models, the long-factor flags -- that a step
fills from pinned host buffers (three copies; of the block tables only the columns the step's requests
use) before it runs. ``torch.compile(fullgraph=True, dynamic=False)`` compiles
``CausalLM._forward`` once per bucket shape; the kernels are opaque custom ops (``kernels/graph_ops.py``).
On CUDA each bucket is then captured with ``torch.cuda.CUDAGraph`` over those static tensors, all buckets
sharing one memory pool (largest first, so the smaller ones reuse its blocks). Explicit capture rather than
``mode="reduce-overhead"``: the step writes the KV pool, a graph input, and inductor's own CUDA graphs skip
graphs that mutate inputs; explicit capture also lets the start-up log state what the graphs hold.

Guarantees: a graphed step computes what the eager step computes with the same kernel plan (the same
kernels; the compiler may fuse and reorder elementwise arithmetic, so logits agree to rounding, and greedy
tokens are checked equal for every family: ``tests/engines/llm/test_decode_graphs.py``); no graph breaks
(``fullgraph=True`` raises on one at start); on CUDA nothing is traced after start (the graphs replay).
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sluice.engines.engine_contract import first_line
from sluice.engines.llm.model.attention import AttentionMetadata
from sluice.engines.llm.model.causal_lm import CausalLM, KVCache
from sluice.engines.start_log import StartLog

log = logging.getLogger(__name__)
_PADDING = torch.tensor([[0], [0], [-1], [0]])  # a padded row's token, position, KV slot and LongRoPE flag


def _options() -> dict[str, str | int | bool | Callable[..., Any]]:
    """Inductor's options: every intermediate rounded to its dtype as the eager ops round it (inductor keeps
    fused bf16 intermediates in fp32), where this torch has the option."""
    import torch._inductor.config as inductor

    return {"emulate_precision_casts": True} if hasattr(inductor, "emulate_precision_casts") else {}


def _own_forward(model: CausalLM) -> Callable[..., torch.Tensor]:
    """``model._forward`` bound through a copy of its code object. The compiler keeps compiled code, and
    counts recompiles against its limit, per code object: with the method's own, every engine a process builds
    (tests, reloads) would add its buckets to one cache, past the limit, and keep the dropped ones' entries."""
    method = type(model)._forward
    code = method.__code__.replace()
    fresh = types.FunctionType(code, method.__globals__, method.__name__, method.__defaults__, method.__closure__)
    bound: Callable[..., torch.Tensor] = fresh.__get__(model)
    return bound


def decode_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes compiled: powers of two below ``max_num_seqs``, and ``max_num_seqs``."""
    sizes = [1 << i for i in range(max_num_seqs.bit_length()) if 1 << i < max_num_seqs]
    return (*sizes, max_num_seqs)


@dataclass
class _Bucket:
    """One bucket's static inputs on the model's device, their host staging (pinned on CUDA), and on CUDA its
    captured graph and output."""

    size: int
    ints: torch.Tensor  # (4, size) int64: token ids, positions, KV slots, LongRoPE flags
    lens: torch.Tensor  # (size,) int32 KV lengths
    table: torch.Tensor  # (size, width) int32 block tables; columns past a row's blocks are never read
    staged: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # the same three on the host
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # (size,) int64 0..size-1: every row is sampled
    graph: torch.cuda.CUDAGraph | None = None
    output: torch.Tensor | None = None  # (size, vocab) float32, the captured graph's


class DecodeGraphs:
    """The compiled decode step of one model over one KV pool; :meth:`capture` at start, then :meth:`run`."""

    def __init__(self, model: CausalLM, kv_caches: list[KVCache], *, block_size: int, max_model_len: int,
                 max_num_seqs: int, kernel_path: str, fixed_tiles: bool, sizes: tuple[int, ...] = ()) -> None:  # fmt: skip
        """``sizes``: the buckets (``kernels.decode_graph_sizes``, each up to ``max_num_seqs``); empty:
        :func:`decode_buckets`. ValueError for a size over ``max_num_seqs``."""
        too_big = [size for size in sizes if size > max_num_seqs]
        if too_big:
            raise ValueError(f"kernels.decode_graph_sizes {too_big} exceed max_num_seqs {max_num_seqs}, the most "
                             "requests a step decodes")  # fmt: skip
        self.kv_caches = kv_caches
        self.device = kv_caches[0][0].device
        self.width = -(-max_model_len // block_size)  # block-table columns: the longest request's blocks
        self.sizes = tuple(sorted(sizes)) or decode_buckets(max_num_seqs)
        self.long_rope = any(rope.scaling == "longrope" for rope in model.ropes)
        self._kernel_path, self._fixed_tiles, self._max_model_len = kernel_path, fixed_tiles, max_model_len
        self._buckets: dict[int, _Bucket] = {}
        dynamo = torch._dynamo.config
        limit = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"  # torch < 2.7
        setattr(dynamo, limit, max(getattr(dynamo, limit), len(self.sizes) + 1))  # one compile per bucket
        self._compiled: Callable[..., torch.Tensor] = torch.compile(_own_forward(model), fullgraph=True,
                                                                    dynamic=False, options=_options())  # fmt: skip
        self.num_steps = 0  # steps run through a graph

    @property
    def max_size(self) -> int:
        return self.sizes[-1]

    @torch.inference_mode()
    def capture(self) -> str:
        """Compile every bucket (and capture it on CUDA); the start-up log's line of what was built."""
        cuda = self.device.type == "cuda"
        reserved = torch.cuda.memory_reserved(self.device) if cuda else 0
        pool = torch.cuda.graph_pool_handle() if cuda else None
        times: list[str] = []
        for size in sorted(self.sizes, reverse=True):
            began = time.perf_counter()
            try:
                bucket = self._capture(size, pool)
            except torch._dynamo.exc.TorchDynamoException as exc:
                raise RuntimeError(f"the decode step of {size} requests did not compile whole ({first_line(exc)}); "
                                   "kernels.decode_graphs: off runs decode steps eager") from exc
            self._buckets[size] = bucket
            times.append(f"{size}: {time.perf_counter() - began:.1f} s")
        held = (torch.cuda.memory_reserved(self.device) - reserved) / 2**20 if cuda else 0.0
        how = f"captured as CUDA graphs holding {held:.0f} MiB" if cuda else "compiled (CPU: no CUDA graphs)"
        return f"buckets {', '.join(map(str, self.sizes))} {how}; compile per bucket {', '.join(reversed(times))}"

    def _capture(self, size: int, pool: Any) -> _Bucket:  # pool: a CUDA graph memory pool handle
        bucket = self._bucket(size)
        if self.device.type != "cuda":
            self._forward(bucket)  # compiles
            return bucket
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # compile and warm up off the capture stream, as CUDA asks
            for _ in range(2):
                self._forward(bucket)
        torch.cuda.current_stream(self.device).wait_stream(side)
        bucket.graph = torch.cuda.CUDAGraph()
        # thread-local: during a reload the serving engine's thread goes on launching and synchronising
        with torch.cuda.graph(bucket.graph, pool=pool, capture_error_mode="thread_local"):
            bucket.output = self._forward(bucket)
        return bucket

    def run(self, input_ids: list[int], positions: list[int], slots: list[int], seq_lens: list[int],
            tables: list[list[int]], long_rope: list[int]) -> torch.Tensor:  # fmt: skip
        """The logits ``(n, vocab)`` float32 of a decode step of ``n = len(input_ids) <= max_size`` requests (one
        row each; ``long_rope`` empty where no row is flagged). On CUDA the tensor is the graph's output,
        overwritten by the next step."""
        n = len(input_ids)
        bucket = self._buckets[next(s for s in self.sizes if s >= n)]
        ints, lens, table = bucket.staged  # the previous step's copies are done: its logits were read
        ints[:, :n] = torch.tensor([input_ids, positions, slots, long_rope or [0] * n], dtype=torch.int64)
        ints[:, n:] = _PADDING  # token 0 at position 0, slot -1 (nothing stored), no LongRoPE
        lens[:n] = torch.tensor(seq_lens, dtype=torch.int32)
        lens[n:] = 1
        width = 1
        for row, blocks in enumerate(tables):
            table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            width = max(width, len(blocks))
        bucket.ints.copy_(ints, non_blocking=True)
        bucket.lens.copy_(lens, non_blocking=True)
        bucket.table[:n, :width].copy_(table[:n, :width], non_blocking=True)  # padded rows: any block will do
        self.num_steps += 1
        if bucket.graph is not None and bucket.output is not None:
            bucket.graph.replay()
            return bucket.output[:n]
        return self._forward(bucket)[:n]

    def _forward(self, bucket: _Bucket) -> torch.Tensor:
        ids, positions = bucket.ints[0], bucket.ints[1]
        return self._compiled(ids, positions, self.kv_caches, bucket.meta, bucket.logits_indices)

    def _bucket(self, size: int) -> _Bucket:
        dev, pin = self.device, self.device.type == "cuda"
        staged = (torch.zeros(4, size, dtype=torch.int64, pin_memory=pin),
                  torch.ones(size, dtype=torch.int32, pin_memory=pin),
                  torch.zeros(size, self.width, dtype=torch.int32, pin_memory=pin))  # fmt: skip
        staged[0][:] = _PADDING
        ints, lens, table = (t.to(dev, copy=True) for t in staged)
        meta = AttentionMetadata(
            slot_mapping=ints[2],
            query_start_loc=torch.arange(size + 1, dtype=torch.int32, device=dev),
            seq_lens=lens,
            block_tables=table,
            max_seq_len=self._max_model_len,
            fixed_tiles=self._fixed_tiles,
            kernel_path=self._kernel_path,
            long_rope=ints[3] if self.long_rope else None,
        )
        return _Bucket(size, ints, lens, table, staged, meta, torch.arange(size, dtype=torch.int64, device=dev))


def capture_at_start(graphs: DecodeGraphs, start: StartLog, required: bool) -> bool:
    """Compile (and on CUDA capture) ``graphs`` as a phase of the engine's start; whether they are ready.
    ``required`` (``decode_graphs: on``): a failure stops the start; otherwise (``auto``) it is logged as a
    warning with its reason and the engine goes on with eager steps."""
    try:
        with start.phase("decode graphs ready",
                         announce=f"compiling the decode step for {len(graphs.sizes)} batch sizes") as phase:
            phase.detail = graphs.capture()
    except Exception as exc:  # whatever the compiler or the capture raised: eager steps still work
        if required:
            raise
        if graphs.device.type == "cuda":
            torch.cuda.empty_cache()
        log.warning("decode graphs off, decode steps run eager: %s (kernels.decode_graphs: off skips the attempt)",
                    first_line(exc))
        return False
    return True
