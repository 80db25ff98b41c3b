"""Benchmark of the LLM engine's attention kernels: torch_ops vs reference (CPU), Triton vs torch_ops (CUDA).

Shapes are SmolLM2-135M's (9 query heads, 3 KV heads, head_dim 64, block size 16, 30 layers), fp32 on the
CPU as the engine runs it. Every row times one layer's call (median of repeats) and also shows the cost of
a whole forward step's attention (x 30 layers). ``per-seq loop`` is the obvious alternative to the
vectorised torch path: one ``scaled_dot_product_attention`` per sequence, each over its own gathered blocks.

Timing: the minimum over repeats of both wall time and process CPU time, on ``--threads`` torch threads
(default 1). On a shared, loaded machine wall time mostly measures the neighbours; single-threaded CPU time
of the minimum repeat is the steadiest estimate of the work itself (memory-bandwidth contention still
inflates it). CUDA rows time wall clock with a device synchronise.

Run: ``.venv/bin/python bench/attention_kernels.py [--quick] [--threads N]``; prints a table and writes
bench/results/attention_kernels.json. (Not ``kernels.py``: a script's folder is first on ``sys.path``, and that name
shadowed the ``kernels`` package transformers imports, breaking every bench script that loads it.)
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from sluice.engines.llm.kernels import reference, torch_ops
from sluice.engines.llm.kernels.synthetic import Layout, PagedBatch, make_batch

NUM_LAYERS = 30
HEADS = dict(num_heads=9, num_kv_heads=3, head_dim=64)
RESULTS = Path(__file__).parent / "results" / "attention_kernels.json"


@dataclass
class Row:
    case: str  # what the batch holds
    impl: str  # which implementation ran
    device: str
    ms_per_layer: float | None  # min wall ms of one call; None when the row was skipped
    cpu_ms_per_layer: float | None  # min process CPU ms of one call (CPU rows)
    ms_per_step: float | None  # cpu_ms_per_layer (CPU rows) or ms_per_layer (CUDA rows) x NUM_LAYERS
    note: str = ""


def _time_ms(
    fn: Callable[[], object], sync: Callable[[], None], min_time_s: float, max_reps: int
) -> tuple[float, float]:
    """(min wall ms, min process CPU ms) of one call, after a warm-up call."""
    fn()
    sync()
    wall: list[float] = []
    cpu: list[float] = []
    start = time.perf_counter()
    while len(wall) < max_reps and (time.perf_counter() - start < min_time_s or len(wall) < 3):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        sync()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return min(wall), min(cpu)


def _per_seq_loop(b: PagedBatch) -> torch.Tensor:
    """One SDPA per sequence over its own gathered blocks (the loop the vectorised path replaces)."""
    out = torch.empty_like(b.query)
    starts, lens = b.query_start_loc.tolist(), b.seq_lens.tolist()
    block_size, num_kv_heads, head_dim = b.k_cache.shape[1:]
    for s, kv_len in enumerate(lens):
        q_len = starts[s + 1] - starts[s]
        blocks = b.block_tables[s, : -(-kv_len // block_size)].long()
        k = b.k_cache.index_select(0, blocks).view(-1, num_kv_heads, head_dim)[:kv_len].transpose(0, 1)
        v = b.v_cache.index_select(0, blocks).view(-1, num_kv_heads, head_dim)[:kv_len].transpose(0, 1)
        q = b.query[starts[s]:starts[s + 1]].transpose(0, 1)  # (num_heads, q_len, head_dim)
        mask = torch.arange(kv_len)[None, :] <= torch.arange(kv_len - q_len, kv_len)[:, None]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=b.scale, enable_gqa=True)
        out[starts[s]:starts[s + 1]] = o.transpose(0, 1)
    return out


def _cases(quick: bool) -> list[tuple[str, Layout]]:
    cases = []
    for num_seqs in (8, 32, 64):
        for ctx in (128, 512):
            if quick and (num_seqs, ctx) not in ((8, 128), (64, 512)):
                continue
            kv = tuple(ctx - (s * 7) % 16 for s in range(num_seqs))  # slightly ragged around ctx
            cases.append((f"decode {num_seqs} seqs, ctx {ctx}", Layout((1,) * num_seqs, kv, **HEADS)))
    cases.append(("prefill 4 x 128 new", Layout((128,) * 4, (128,) * 4, **HEADS)))
    cases.append(("mixed: 256-chunk @512 + 32 decodes @512",
                  Layout((256,) + (1,) * 32, (512,) + (512,) * 32, **HEADS)))
    return cases


def _store_row(dtype: torch.dtype, quick: bool) -> Row:
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.zeros(4096, 16, 3, 64, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    key, value = torch.randn(64, 3, 64, generator=gen), torch.randn(64, 3, 64, generator=gen)
    slots = torch.randperm(4096 * 16, generator=gen)[:64]
    wall, cpu = _time_ms(lambda: torch_ops.store_kv(key, value, k_cache, v_cache, slots), lambda: None,
                         0.1 if quick else 0.3, 200)
    return Row("store_kv 64 tokens", "torch_ops", "cpu", wall, cpu, cpu * NUM_LAYERS)


def run(quick: bool) -> list[Row]:
    torch.manual_seed(0)
    rows: list[Row] = []
    min_s = 0.1 if quick else 0.4
    has_cuda = torch.cuda.is_available()
    for name, layout in _cases(quick):
        batch = make_batch(layout, num_blocks=8192)
        impls: list[tuple[str, Callable[[], object]]] = [
            ("torch_ops", partial(torch_ops.paged_attention, *batch.args())),
            ("per-seq loop", partial(_per_seq_loop, batch)),
            ("reference", partial(reference.paged_attention, *batch.args())),
        ]
        for impl, fn in impls:
            wall, cpu = _time_ms(fn, lambda: None, min_s, 50 if impl != "reference" else 5)
            rows.append(Row(name, impl, "cpu", wall, cpu, cpu * NUM_LAYERS))
        if not has_cuda:
            for impl in ("triton", "torch_ops"):
                rows.append(Row(name, impl, "cuda", None, None, None, "skipped: no CUDA device"))
            continue
        from sluice.engines.llm.kernels import triton_paged_attention

        gpu = make_batch(layout, dtype=torch.bfloat16, num_blocks=8192, device="cuda")
        for impl, gfn in (("triton", partial(triton_paged_attention.paged_attention, *gpu.args())),
                          ("torch_ops", partial(torch_ops.paged_attention, *gpu.args()))):
            wall, _ = _time_ms(gfn, torch.cuda.synchronize, min_s, 200)
            rows.append(Row(name, impl, "cuda bf16", wall, None, wall * NUM_LAYERS))
    rows.append(_store_row(torch.float32, quick))
    return rows


def _fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:9.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases and repeats (a smoke run)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = run(args.quick)
    print(f"{'case':42} {'impl':13} {'device':10} {'wall ms':>9} {'cpu ms':>9} {'ms/step':>9}  note")
    for r in rows:
        print(f"{r.case:42} {r.impl:13} {r.device:10} {_fmt(r.ms_per_layer)} {_fmt(r.cpu_ms_per_layer)} "
              f"{_fmt(r.ms_per_step)}  {r.note}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "num_layers": NUM_LAYERS, "heads": HEADS, "dtype_cpu": "float32", "quick": args.quick}
    RESULTS.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    print(f"saved {RESULTS}")


if __name__ == "__main__":
    main()
