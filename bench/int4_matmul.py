"""The int4 matmuls of the LLM engine side by side: Sluice's native kernel (``cpu/native/int4_matmul.cpp``)
on a Q4_0-shaped weight's scales only and on its (scale, zero point) pairs, torch's
``_weight_int4pack_mm_for_cpu`` and the dense path (weight unpacked to bf16, oneDNN GEMM:
``quant/int4_dense.py``), on the projection shapes of SmolLM2-135M and Llama-3.2-1B, from one row (a decode
step) to a prompt chunk's hundreds.

    .venv/bin/python bench/int4_matmul.py [--rows 1,8,32,128,512] [--threads 2] [--quick]

Each case cycles through copies of the weight that together exceed the CPU's last-level cache, so every call
reads its weight from memory as a decode step does (a matrix used once per step). Times are the minimum over
repeats, the implementations interleaved. ``GB/s``: the packed weight's bytes (4.5 bits a weight with its bf16
scale) per second of Sluice's kernel on the scales only. Prints a table, writes
``bench/results/int4_matmul.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sluice.engines.llm.quant.packed import Int4Weight  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "int4_matmul.json"
SHAPES = {  # (out_features, in_features) of each model's projections and LM head
    "smollm2 qkv": (960, 576), "smollm2 gate_up": (3072, 576), "smollm2 down": (576, 1536),
    "smollm2 head": (49152, 576), "1b qkv": (3072, 2048), "1b gate_up": (16384, 2048), "1b down": (2048, 8192),
    "1b head": (128256, 2048),
}  # fmt: skip
CACHE_BYTES = 96 << 20  # more than any last-level cache of the machines seen (32 MB)


def _weights(n: int, k: int) -> list[tuple[Int4Weight, torch.Tensor]]:
    """Copies of a Q4_0-shaped weight (zero points 0: kept as scales only), each with its (scale, 0) pairs."""
    copies = max(1, -(-CACHE_BYTES // (n * k // 2)))
    out = []
    for seed in range(copies):
        gen = torch.Generator().manual_seed(seed)
        q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        scale = torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3
        w = Int4Weight.from_affine(q, scale, -8 * scale)
        out.append((w, w.pairs()))
    return out


def _implementations(weights: list[tuple[Int4Weight, torch.Tensor]], x: torch.Tensor
                     ) -> dict[str, Callable[[], object]]:  # fmt: skip
    """The ways to compute ``x @ W.T``, each call on the next copy of the weight: Sluice's kernel on the
    scales only and on (scale, zero point) pairs, torch's kernel (pairs), the dense path."""
    from sluice.engines.llm.cpu import native_cpu
    from sluice.engines.llm.quant import int4_dense

    turn = iter(range(1 << 62))

    def pick() -> tuple[Int4Weight, torch.Tensor]:
        return weights[next(turn) % len(weights)]

    def sluice() -> object:
        w, _ = pick()
        return native_cpu.int4_matmul(x, w.packed, w.scale_zero)

    def sluice_pairs() -> object:
        w, pairs = pick()
        return native_cpu.int4_matmul(x, w.packed, pairs)

    def torch_kernel() -> object:
        w, pairs = pick()
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, w.packed, 32, pairs)

    def dense() -> object:
        return int4_dense.dense_matmul(pick()[0], x)

    return {"sluice": sluice, "sluice_pairs": sluice_pairs, "torch": torch_kernel, "dense": dense}


def _min_ms(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    best = {name: float("inf") for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for name, fn in fns.items():  # interleaved: the machine's noise hits all alike
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], (time.perf_counter() - start) * 1e3)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,8,32,128,512")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--quick", action="store_true", help="two shapes, rows 1 and 32: checks the plumbing")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    from sluice.engines.llm.cpu import native_cpu

    if not native_cpu.int4_matmul_available():
        print("the native int4 kernel is not available here (needs AVX512-BF16 and VBMI, and a C++ compiler)")
        return 1
    torch.set_num_threads(args.threads)
    shapes = dict(list(SHAPES.items())[:2]) if args.quick else SHAPES
    rows_list = [1, 32] if args.quick else [int(r) for r in args.rows.split(",")]
    results = []
    print(f"{'matrix':<16}{'rows':>6}{'sluice ms':>11}{'pairs ms':>10}{'torch ms':>10}{'dense ms':>10}"
          f"{'pairs/sluice':>14}{'torch/sluice':>14}{'dense/sluice':>14}{'GB/s':>7}")  # fmt: skip
    for name, (n, k) in shapes.items():
        weights = _weights(n, k)
        for m in rows_list:
            x = torch.randn(m, k).to(torch.bfloat16)
            fns = _implementations(weights, x)
            ms = _min_ms(fns, max(3, args.reps if m <= 32 else args.reps // 3))
            gbs = n * k * (0.5 + 2 / 32) / (ms["sluice"] / 1e3) / 1e9  # packed weight and scales read
            row = {"matrix": name, "shape": [n, k], "rows": m, **{f"{key}_ms": v for key, v in ms.items()},
                   "pairs_over_sluice": ms["sluice_pairs"] / ms["sluice"],
                   "torch_over_sluice": ms["torch"] / ms["sluice"], "dense_over_sluice": ms["dense"] / ms["sluice"],
                   "sluice_weight_gb_s": gbs}  # fmt: skip
            results.append(row)
            print(f"{name:<16}{m:>6}{ms['sluice']:>11.3f}{ms['sluice_pairs']:>10.3f}{ms['torch']:>10.3f}"
                  f"{ms['dense']:>10.3f}{row['pairs_over_sluice']:>13.2f}x{row['torch_over_sluice']:>13.2f}x"
                  f"{row['dense_over_sluice']:>13.2f}x{gbs:>7.1f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    facts = {"threads": args.threads, "machine": platform.platform(), "cpus": os.cpu_count(),
             "load_avg_end": os.getloadavg(), "torch": torch.__version__}  # fmt: skip
    out.write_text(json.dumps({"facts": facts, "rows": results}, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
