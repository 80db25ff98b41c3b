"""The native CPU kernels of the LLM engine (``engines/llm/cpu/native/cpu_ops.cpp``): compiled once per machine.

At a small decode batch a CPU decode step spends as much time in torch's per-operation cost as in the
weights' matmuls: a layer's attention is some ten ops of a few microseconds each (two ``index_copy``
stores, two block gathers into a padded copy, views, a mask, SDPA), its RMSNorm six, its rotary seven,
thirty layers a step. These kernels do each of those in one call:

* ``decode_attention``: the store and the attention of every one-token row, reading K and V in place
  through the block table (prefetched: the rows are scattered over blocks), in float32 arithmetic
  (bfloat16 queries and caches widened as they are read);
* ``rms_norm`` (float32 rows), ``rotary`` (bit for bit the torch path's, float32 and bfloat16) and
  ``silu_mul`` (the gated MLP's bfloat16 ``silu(gate) * up``, rounded as torch rounds it).

Beside them, ``int4_matmul`` (``engines/llm/cpu/native/int4_matmul.cpp``, CPUs with AVX512-BF16) multiplies by an
int4 weight in torch's packed layout without dequantising it, faster than torch's kernel at every row count
(``bench/int4_matmul.py``); ``decode_layers`` (``engines/llm/cpu/native/decode_layers.cpp``) runs every layer of a Llama-shaped int4 model for
a decode-only step in one call (``cpu/native_layers.py``); ``int4_unpack`` (``engines/llm/cpu/native/int4_unpack.cpp``)
dequantises an int4 weight's rows to bfloat16 for the dense GEMM of prompt rows where ``int4_matmul`` is not
built (``quant/int4_dense.py``); ``top_k_rows`` (``engines/llm/cpu/native/top_k.cpp``) finds the candidates a rescored LM head
recomputes, in a fraction of ``torch.topk``'s time over a large vocabulary.

Built with ``torch.utils.cpp_extension`` (a C++ compiler and ninja, ``-march=native``) at the first model load
that needs it, once per machine and torch version, into the Sluice cache (``native_build.py``: the key, the
lock other processes wait on, what is logged). Where it cannot be built (no compiler, no ninja, a build
error) the engine logs why, once, and keeps the torch path: same results to float rounding, slower at small
batches. ``engine.kernels.native_cpu: false`` (``kernel_plan.py``) turns it off.
"""

from __future__ import annotations

import functools
import logging
import threading
from types import ModuleType

import torch

from sluice.engines.llm.cpu import native_build
from sluice.engines.llm.cpu.int4_layout import AVX512, Int4Layout, torch_layout

log = logging.getLogger(__name__)

DTYPES = (torch.float32, torch.bfloat16)  # what the kernels read and write


def usable() -> bool:
    """Built (the first call builds it: blocks while compiling). Whether the engine uses the kernels is its
    plan's ``native_cpu``, asked before this."""
    return load() is not None


def takes(x: torch.Tensor) -> bool:
    """Whether ``x`` may go through a kernel: a CPU tensor outside autograd, the kernels usable (the
    callers check dtypes and shapes)."""
    return x.device.type == "cpu" and not x.requires_grad and usable()


def _ops() -> ModuleType:
    module = load()
    assert module is not None, "a native kernel called where usable() is False"
    return module


_LOCK = threading.Lock()  # one build per process, whichever thread (engine, reload) asks first


@functools.cache
def load() -> ModuleType | None:
    """The compiled module, or None (logged once) where it cannot be built. Blocks while compiling, or while
    another process compiles it (``native_build.py``)."""
    from sluice.model_store import default_cache_dir

    with _LOCK:
        module, how = native_build.load_or_build(default_cache_dir())
    if module is None:
        log.warning("native CPU kernels unavailable (%s); the LLM engine uses the torch path: slower at small "
                    "batches, and an answer may then depend on what it is batched with (needs a C++ compiler and "
                    "ninja; set engine.kernels.native_cpu: false to skip the attempt)", how)  # fmt: skip
    return module


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm of float32 rows on the CPU; call only where :func:`usable`."""
    out: torch.Tensor = _ops().rms_norm(x, weight, eps)
    return out


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of (n, heads, head_dim) rows, float32 or bfloat16 (cos / sin in x's dtype); call
    only where :func:`usable`. Bit for bit torch's ``x * cos + rotated * sin`` in either dtype."""
    out: torch.Tensor = _ops().rotary(x, cos, sin)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of bfloat16 ``[gate | up]`` rows, rounded as torch's bf16 ops round (silu, then
    the product); call only where :func:`usable`."""
    out: torch.Tensor = _ops().silu_mul(gate_up)
    return out


def decode_attention(
    query: torch.Tensor,  # (n, num_heads, head_dim) float32 or bfloat16
    key: torch.Tensor,  # (n, num_kv_heads, head_dim) in query's dtype
    value: torch.Tensor,
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim) float32 or bfloat16
    v_cache: torch.Tensor,
    slots: torch.Tensor,  # (n,) int64 where key/value go; an empty tensor = stored already
    blocks: torch.Tensor,  # (n, max_blocks) int64 block table rows, padded
    lens: torch.Tensor,  # (n,) int64 KV length after this step
    scale: float,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:  # (n, num_heads, head_dim) in query's dtype; call only where usable()
    out: torch.Tensor = _ops().decode_attention(query, key, value, k_cache, v_cache, slots, blocks, lens, scale,
                                                window or 0, softcap or 0.0)  # fmt: skip
    return out


def int4_unpack(packed: torch.Tensor, scale_zero: torch.Tensor, row0: int, out: torch.Tensor,
                layout: Int4Layout | None = None) -> None:
    """Rows ``row0 .. row0 + out.shape[1]`` of an int4 weight in torch's packed CPU layout (``Int4Weight``),
    dequantised and transposed into ``out`` (``(K, rows)`` bfloat16, contiguous): ``W[row0:row0 + rows].T``.
    ``row0`` starts a block of the layout (a multiple of 64 always does); the rows end on one or at the last
    (padded) row. ``layout``: the one torch packs in here (:func:`~.int4_layout.torch_layout`) unless given
    (tests). Call only where :func:`usable`."""
    layout = layout or torch_layout()
    _ops().int4_unpack(packed, scale_zero, row0, out, layout.block, layout.halves)


def int4_matmul_available() -> bool:
    """Whether :func:`int4_matmul` can run here: the kernels built with its vector path (a CPU with
    AVX512-BF16 and BW) and torch packing in the AVX512 layout the kernel reads. Elsewhere ``Int4Weight``
    keeps torch's int4 kernel; the engine's plan (``kernels.int4_matmul``) may choose torch's anyway."""
    return usable() and _int4_vector_path() and torch_layout() == AVX512


@functools.cache
def _int4_vector_path() -> bool:
    return bool(_ops().int4_matmul_available())


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scale_zero: torch.Tensor, portable: bool = False
                ) -> torch.Tensor:  # fmt: skip
    """``x @ W.T`` for ``x`` ``(M, K)`` contiguous bfloat16 and an int4 weight in torch's packed CPU layout
    (``Int4Weight``): ``(M, Np)`` bfloat16, Np the padded rows. Each row's result is independent of the
    others in the call; call only where :func:`int4_matmul_available`. ``portable``: the form for CPUs without
    AVX512-VBMI even where this one has it (the same results; tests compare them)."""
    out: torch.Tensor = _ops().int4_matmul(x, packed, scale_zero, portable)
    return out


def int4_grouped_matmul(x: torch.Tensor, ends: torch.Tensor, packed: list[torch.Tensor],
                        scale_zero: list[torch.Tensor]) -> torch.Tensor:  # fmt: skip
    """Rows of ``x`` ``(R, K)`` contiguous bfloat16 sorted by expert, expert ``e``'s at ``ends[e-1]:ends[e]``
    (``ends`` int64), each run through expert ``e``'s int4 weight: ``(R, Np)`` bfloat16, one call. Call only
    where :func:`int4_matmul_available`."""
    out: torch.Tensor = _ops().int4_grouped_matmul(x, ends, packed, scale_zero)
    return out


def decode_layers(h: torch.Tensor, layers: list[list[torch.Tensor]], sizes: list[list[int]], cos: torch.Tensor,
                  sin: torch.Tensor, slots: torch.Tensor, blocks: torch.Tensor, lens: torch.Tensor, eps: float,
                  scale: float) -> torch.Tensor:  # fmt: skip
    """Every Llama-shaped int4 decoder layer of a decode-only step (``cpu/native_layers.py`` builds the
    arguments); call only where :func:`int4_matmul_available`."""
    out: torch.Tensor = _ops().decode_layers(h, layers, sizes, cos, sin, slots, blocks, lens, eps, scale)
    return out


def top_k_rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``(M, k)`` int64 of the ``k`` largest values of each row of ``x`` ``(M, V)`` float32 or bfloat16:
    ``torch.topk``'s set, ties at the k-th place to the lower index, in ranking order; a NaN ranks as -inf.
    Call only where :func:`usable`."""
    out: torch.Tensor = _ops().top_k_rows(x, k)
    return out
