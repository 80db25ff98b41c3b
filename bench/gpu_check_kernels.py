"""GPU check step: the LLM engine's Triton kernels on the device, against the reference, then timed.

    python bench/gpu_check_kernels.py --out rows.json [--device cuda] [--profile full] [--budget-s 80]

* ``parity`` rows: paged attention on every ragged layout of ``kernels.synthetic.LAYOUTS`` (decode at
  block edges, long prefills, continued chunks, zero-row sequences, GQA groups 3/1/8; unused cache slots
  NaN, so a stray read shows) in fp16 and bf16, against the reference loop in fp32 on the same rounded
  inputs; the same with gpt-oss's attention sinks on one layout; the mixture-of-experts grouped matmul
  (``kernels/triton_moe.py``) against its reference; ``store_kv`` in fp16 and bf16, bit-exact. Tolerances as
  in tests/engines/llm/kernels.
* ``timing`` rows: one layer's attention call at the real models' head layouts (Llama-3.2-1B 32/8 heads
  of 64, Qwen3-0.6B 16/8 of 128) in bf16: the Triton kernel, the vectorised torch path over the same
  paged cache, and torch's ``scaled_dot_product_attention`` on dense, unpaged K/V padded to the longest
  sequence (the flash backend when it takes the call; the backend that ran is in the row).

In the dry run (CPU, ``TRITON_INTERPRET=1``) the same code runs on tiny layouts in fp32; bf16 attention
rows say why not (the interpreter computes bf16 wrongly).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from gpu_check_common import Clock, Rows, child_args, median_ms, synchronize

TOLERANCES = {"fp16": 4e-3, "bf16": 3e-2}
HEAD_LAYOUTS = {"full": {"llama-3.2-1b": (32, 8, 64), "qwen3-0.6b": (16, 8, 128)}, "tiny": {"tiny": (4, 2, 16)}}
# (name, q_lens, kv_lens) per profile: decode batches, a long decode, a prefill, a mixed step.
TIMING_CASES = {
    "full": [("decode 1 @512", (1,), (512,)), ("decode 8 @512", (1,) * 8, (512,) * 8),
             ("decode 64 @512", (1,) * 64, (512,) * 64), ("decode 256 @512", (1,) * 256, (512,) * 256),
             ("decode 64 @2048", (1,) * 64, (2048,) * 64), ("prefill 4 x 512", (512,) * 4, (512,) * 4),
             ("mixed 256-chunk @512 + 32 decodes", (256,) + (1,) * 32, (512,) * 33)],
    "tiny": [("decode 8 @64", (1,) * 8, (64,) * 8), ("prefill 2 x 32", (32,) * 2, (32,) * 2),
             ("mixed 16-chunk @32 + 4 decodes", (16,) + (1,) * 4, (32,) * 5)],
}


def _dtype(torch: Any, name: str) -> Any:
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


def attention_parity(layout: Any, dtype: Any, tolerance: float, device: str, sinks: bool = False) -> dict[str, Any]:
    """Max abs error against the reference, and whether every element is within ``tolerance`` (absolute
    plus relative, as ``torch.testing.assert_close`` with atol = rtol = tolerance; NaN fails). ``sinks``:
    with gpt-oss's per-head sink logits."""
    import torch

    from sluice.engines.llm.kernels import reference
    from sluice.engines.llm.kernels.synthetic import make_batch
    from sluice.engines.llm.kernels.triton_paged_attention import paged_attention

    cpu = make_batch(layout, dtype=dtype, poison_unused=True)
    query, k_cache, v_cache, tables, starts, lens, scale = cpu.args()
    sink = torch.randn(query.shape[1], generator=torch.Generator().manual_seed(2)) * 2 if sinks else None
    # fp32 over the same rounded inputs: the error measured is the kernel's, not the inputs' rounding
    want = reference.paged_attention(query.float(), k_cache.float(), v_cache.float(), tables, starts, lens, scale,
                                     sinks=sink)  # fmt: skip
    dev = make_batch(layout, dtype=dtype, poison_unused=True, device=device)
    got = paged_attention(*dev.args(), out=torch.full_like(dev.query, float("nan")),
                          sinks=None if sink is None else sink.to(device)).float().cpu()  # fmt: skip
    err = (got - want).abs().nan_to_num(float("inf"))
    return {"max_abs_err": float(err.max()) if got.numel() else 0.0, "tolerance": tolerance,
            "ok": bool(torch.allclose(got, want, atol=tolerance, rtol=tolerance))}


def moe_parity(dtype: Any, tolerance: float, device: str, tokens: int, d_in: int, d_out: int) -> dict[str, Any]:
    """The experts' grouped-matmul kernel (gate/up: each token read by its 8 experts) against its reference."""
    import torch

    from sluice.engines.llm.kernels.triton_moe import grouped_matmul, reference_grouped_matmul

    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 15, (tokens * 8,), generator=gen)  # 8 of 16 experts a token; one never chosen
    a = torch.randn(tokens, d_in, generator=gen).to(dtype)
    w = (torch.randn(16, d_in, d_out, generator=gen) / d_in**0.5).to(dtype)
    want = reference_grouped_matmul(a.float(), w.float(), ids, 8)
    got = grouped_matmul(a.to(device), w.to(device), ids.to(device), 8).float().cpu()
    err = (got - want).abs().nan_to_num(float("inf"))
    return {"max_abs_err": float(err.max()), "tolerance": tolerance,
            "ok": bool(torch.allclose(got, want, atol=tolerance, rtol=tolerance))}


def store_parity(dtype: Any, device: str) -> dict[str, Any]:
    import torch

    from sluice.engines.llm.kernels import reference
    from sluice.engines.llm.kernels.triton_store_kv import store_kv

    gen = torch.Generator().manual_seed(1)
    key, value = (torch.randn(64, 8, 128, generator=gen).to(dtype) for _ in range(2))
    slots = torch.randperm(4000 * 16, generator=gen)[:64]
    slots[::9] = -1  # skipped tokens
    k_ref, v_ref = (torch.zeros(4000, 16, 8, 128, dtype=dtype) for _ in range(2))
    reference.store_kv(key, value, k_ref, v_ref, slots)
    k_dev, v_dev = (torch.zeros(4000, 16, 8, 128, dtype=dtype, device=device) for _ in range(2))
    store_kv(key.to(device), value.to(device), k_dev, v_dev, slots.to(device, torch.int32))
    return {"bit_exact": bool(torch.equal(k_dev.cpu(), k_ref) and torch.equal(v_dev.cpu(), v_ref))}


def _sdpa(torch: Any, q_lens: tuple[int, ...], kv_lens: tuple[int, ...], heads: tuple[int, int, int],
          dtype: Any, device: str) -> tuple[Any, str] | tuple[None, str]:
    """A dense SDPA call for a batch of equal query lengths, and the backend that takes it."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if len(set(q_lens)) != 1:
        return None, "n/a: no single dense call computes a mixed prefill + decode batch"
    num_heads, num_kv_heads, head_dim = heads
    q_len, kv_len, num_seqs = q_lens[0], max(kv_lens), len(q_lens)
    q = torch.randn(num_seqs, num_heads, q_len, head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(num_seqs, num_kv_heads, kv_len, head_dim, dtype=dtype, device=device) for _ in range(2))
    k_full, v_full = (t.repeat_interleave(num_heads // num_kv_heads, dim=1) for t in (k, v))
    causal = q_len == kv_len  # a decode row sees every position
    tries = [("flash, gqa", SDPBackend.FLASH_ATTENTION, k, v, True),
             ("flash, kv heads repeated", SDPBackend.FLASH_ATTENTION, k_full, v_full, False),
             ("default", None, k, v, True)]
    for label, backend, kk, vv, gqa in tries:
        def call(kk: Any = kk, vv: Any = vv, gqa: bool = gqa, backend: Any = backend) -> Any:
            if backend is None:
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, enable_gqa=gqa)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, enable_gqa=gqa)
        try:
            call()
        except RuntimeError:
            continue
        return call, label
    return None, "n/a: no SDPA backend took the call"


def timing_row(case: tuple[str, tuple[int, ...], tuple[int, ...]], heads: tuple[int, int, int], dtype: Any,
               device: str, min_time_s: float, max_reps: int) -> dict[str, Any]:
    import torch

    from sluice.engines.llm.kernels import torch_ops
    from sluice.engines.llm.kernels.synthetic import Layout, make_batch
    from sluice.engines.llm.kernels.triton_paged_attention import paged_attention

    _, q_lens, kv_lens = case
    layout = Layout(q_lens, kv_lens, *heads)
    batch = make_batch(layout, dtype=dtype, num_blocks=sum(-(-n // 16) for n in kv_lens) + 64, device=device)
    sync = synchronize(torch, device)
    ms = partial(median_ms, sync=sync, min_time_s=min_time_s, max_reps=max_reps)
    triton_ms = ms(partial(paged_attention, *batch.args()))
    torch_ms = ms(partial(torch_ops.paged_attention, *batch.args()))
    sdpa, backend = _sdpa(torch, q_lens, kv_lens, heads, dtype, device)
    sdpa_ms = ms(sdpa) if sdpa is not None else None
    return {"triton_ms": round(triton_ms, 4), "torch_ops_ms": round(torch_ms, 4),
            "sdpa_ms": None if sdpa_ms is None else round(sdpa_ms, 4), "sdpa_backend": backend,
            "sdpa_over_triton": None if sdpa_ms is None else round(sdpa_ms / triton_ms, 3)}


def main() -> None:
    args = child_args(__doc__.splitlines()[0])
    import torch

    from sluice.engines.llm.kernels.synthetic import LAYOUTS

    dry = args.profile == "tiny"
    clock = Clock(args.budget_s)
    parity = {f"attention {dt} {layout.name}": (dt, layout) for dt in TOLERANCES for layout in LAYOUTS}
    stores = {f"store_kv {dt}": dt for dt in TOLERANCES}
    sinks = {f"attention sinks {dt} {LAYOUTS[1].name}": dt for dt in TOLERANCES}  # gpt-oss
    experts = {f"moe grouped matmul {dt}": dt for dt in TOLERANCES}
    cases = {f"time {case[0]} [{model}]": (case, heads) for model, heads in HEAD_LAYOUTS[args.profile].items()
             for case in TIMING_CASES[args.profile]}
    rows = Rows(args.out, {**dict.fromkeys(parity, "parity"), **dict.fromkeys(stores, "parity"),
                           **dict.fromkeys(sinks, "parity"), **dict.fromkeys(experts, "parity"),
                           **dict.fromkeys(cases, "timing")})
    for name, (dt, layout) in parity.items():
        if dry and dt == "bf16":
            rows.reason(name, "CUDA only: the Triton interpreter has no bf16 (it runs, and computes wrongly)")
            continue
        with rows.attempt(name):
            rows.measured(name, "parity", dtype=dt,
                          **attention_parity(layout, _dtype(torch, dt), TOLERANCES[dt], args.device))
    for name, dt in {**sinks, **experts}.items():
        if dry and dt == "bf16":
            rows.reason(name, "CUDA only: the Triton interpreter has no bf16 (it runs, and computes wrongly)")
            continue
        with rows.attempt(name):
            found = (attention_parity(LAYOUTS[1], _dtype(torch, dt), TOLERANCES[dt], args.device, sinks=True)
                     if name in sinks else moe_parity(_dtype(torch, dt), TOLERANCES[dt], args.device,
                                                      *((4, 64, 48) if dry else (96, 512, 384))))  # fmt: skip
            rows.measured(name, "parity", dtype=dt, **found)
    for name, dt in stores.items():
        with rows.attempt(name):
            found = store_parity(_dtype(torch, dt), args.device)
            rows.measured(name, "parity", dtype=dt, **found, ok=found["bit_exact"])
    timing_dtype = "fp32" if dry else "bf16"  # CPU matmuls and the interpreter: fp32
    for name, (case, heads) in cases.items():
        if clock.left() < 2:
            rows.reason(name, f"skipped: {clock.left():.0f} s left in the step")
            continue
        with rows.attempt(name):
            rows.measured(name, "timing", dtype=timing_dtype, heads="{}/{} x {}".format(*heads),
                          **timing_row(case, heads, _dtype(torch, timing_dtype), args.device,
                                       0.02 if dry else 0.1, 3 if dry else 200))


if __name__ == "__main__":
    main()
