"""Benchmark: SmolLM2-135M Q4_1 under each ``weights`` mode -- quality against the dequantised model, speed of
a decode step, memory.

For each mode (``fp32`` is the reference: the file dequantised to float32), in a process of its own:

* greedy continuations (32 tokens, EOS ignored) of the 16 parity prompts of ``tests/engines/llm/test_parity.py``:
  how many equal the reference throughout, and where each first differs, the reference's log-prob gap there;
* a quality figure: 64 review-labelling chats (``bench/llm.py``'s reviews, gold labels known) answered under a
  ``choice`` constraint (positive / negative / neutral): accuracy, and agreement with the reference's labels;
* the time of a decode step at batch 1 and 8 (after the prompts are in), median of 30 steps;
* peak RSS of the process (loading included) and the packed weights' bytes.

    .venv/bin/python bench/llm_weights.py [--modes fp32,auto,bf16,int8,int4] [--threads 2]

Prints a table and writes ``bench/results/llm_weights.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

LABELS = ["positive", "negative", "neutral", "negative", "positive", "neutral", "negative", "positive"]  # OPINIONS'
SYSTEM = "You are a sentiment classifier. Answer with one word: positive, negative or neutral."


def run_mode(model: str, weights: str, threads: int) -> dict[str, Any]:
    import torch
    from llm import OPINIONS, PRODUCTS

    from sluice.engines.llm import LLM, SamplingParams
    from sluice.engines.llm.model.layers.quantized import packed_nbytes
    from sluice.engines.llm.structured.spec import StructuredOutput
    from tests.engines.llm.test_parity import SMOL_QUESTIONS

    torch.set_num_threads(threads)
    start = time.perf_counter()
    llm = LLM(model, weights=weights, kv_cache_memory_bytes=128 << 20)
    load_s = time.perf_counter() - start
    packed = packed_nbytes(llm.runner.model)
    tok = llm.tokenizer
    assert tok is not None
    parity = [tok.encode(llm.apply_chat_template([{"role": "user", "content": q}])) for q in SMOL_QUESTIONS]
    greedy = [o.token_ids for o in llm.generate(parity, SamplingParams(max_tokens=32, ignore_eos=True))]
    chats, gold = [], []
    for i in range(64):
        k = i % len(OPINIONS)
        review = OPINIONS[k].format(p=PRODUCTS[(i // 8) % len(PRODUCTS)])
        chats.append([{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Review: {review}\nSentiment:"}])
        gold.append(LABELS[k])
    choice = StructuredOutput(choice=["positive", "negative", "neutral"])
    labels = [o.text for o in llm.generate([tok.encode(llm.apply_chat_template(c)) for c in chats],
                                           SamplingParams(max_tokens=8, structured_output=choice))]  # fmt: skip
    steps = {b: _step_ms(llm, parity[:b]) for b in (1, 8)}
    llm.close()
    return {"weights": weights, "load_s": load_s, "packed_weight_bytes": packed, "greedy": greedy, "labels": labels,
            "label_accuracy": sum(a == b for a, b in zip(labels, gold, strict=True)) / len(gold),
            "decode_step_ms": steps, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # fmt: skip


def _step_ms(llm: Any, prompts: list[list[int]]) -> float:
    from sluice.engines.llm import SamplingParams

    for p in prompts:
        llm.add_request(p, SamplingParams(max_tokens=200, ignore_eos=True))
    for _ in range(6):  # prompts in, a few decode steps of warm-up
        llm.step()
    times = []
    for _ in range(30):
        start = time.perf_counter()
        llm.step()
        times.append(1000 * (time.perf_counter() - start))
    for rid in list(llm.scheduler.requests):
        llm.abort(rid)
    return statistics.median(times)


def divergence(reference: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    firsts = [next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), None)
              for x, y in zip(reference["greedy"], run["greedy"], strict=True)]  # fmt: skip
    return {"equal_sequences": sum(f is None for f in firsts), "first_divergence": firsts,
            "labels_equal_to_reference": sum(a == b for a, b in zip(reference["labels"], run["labels"], strict=True))}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: fetch smollm2-135m)")
    ap.add_argument("--modes", default="fp32,auto,bf16,int8,int4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "llm_weights.json"))
    args = ap.parse_args(argv)
    from llm_peers_models import smollm2

    model = args.model or smollm2()
    modes = args.modes.split(",")
    if modes[0] != "fp32":
        modes.insert(0, "fp32")
    runs = []
    for mode in modes:
        with mp.get_context("spawn").Pool(1) as pool:
            runs.append(pool.apply(run_mode, (model, mode, args.threads)))
    ref = runs[0]
    print(f"\nSmolLM2-135M Q4_1, {args.threads} threads, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
          f"load average {os.getloadavg()[0]:.2f}\n")  # fmt: skip
    print(f"{'weights':<8}{'equal/16':>9}{'labels ok':>10}{'= fp32':>8}{'step b1 ms':>11}{'step b8 ms':>11}"
          f"{'packed MB':>10}{'peak RSS MB':>12}")
    for run in runs:
        run.update(divergence(ref, run))
        print(f"{run['weights']:<8}{run['equal_sequences']:>9}{round(64 * run['label_accuracy']):>7}/64"
              f"{run['labels_equal_to_reference']:>5}/64{run['decode_step_ms'][1]:>11.1f}{run['decode_step_ms'][8]:>11.1f}"
              f"{run['packed_weight_bytes'] / 2**20:>10.0f}{run['peak_rss_mb']:>12.0f}")  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    facts = {"threads": args.threads, "omp_wait_policy": os.environ["OMP_WAIT_POLICY"], "load_avg": os.getloadavg()}
    out.write_text(json.dumps({"facts": facts, "runs": [{k: v for k, v in r.items() if k != "greedy"} for r in runs]},
                              indent=2) + "\n")  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
