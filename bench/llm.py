"""Benchmark: Sluice's LLM engine vs HF transformers ``generate`` with static padded batches (CPU).

Workload: SmolLM2-135M-Instruct (GGUF Q4_1; Sluice keeps its weights as the engine's ``weights`` default
says -- ``auto``: repacked int4 -- or as ``--weights`` asks; HF dequantises to fp32), 64 review-labelling chat prompts that share one
system prompt, each with its own ``max_tokens`` between 1 and 48 (deterministic), greedy, EOS ignored so
both engines produce exactly the same number of useful tokens: ``sum(max_tokens)``.

* Sluice: all 64 requests added at once; continuous batching, chunked prefill, prefix caching.
* HF: static batches of 8 and of 32 in arrival order, left padding; a batch runs until its longest member's
  ``max_tokens`` (that is what static batching costs); each request's tokens past its own ``max_tokens``
  are discarded and not counted.

Each engine runs in its own child process (so peak RSS is its own), one after the other, with the same
torch thread count. Timing excludes model loading; a warm-up runs outside the timed region, and each engine
runs the workload ``--repeats`` times and reports its best time (the machine is shared and noisy). Sluice's
prefix cache is emptied before every repeat, so only sharing *within* the workload is counted.

    .venv/bin/python bench/llm.py [--model PATH] [--threads 2] [--num-prompts 64]
    .venv/bin/python bench/llm.py --speculative [...]   # speculative decoding on vs off: bench/llm_spec.py

Prints a table and writes ``bench/results/llm.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

SYSTEM_PROMPT = (
    "You label customer reviews for an online shop. Read the review and reply with exactly one label - "
    "positive, negative or mixed - followed by one short sentence that explains the label. Use positive "
    "when the customer is satisfied overall, negative when they are dissatisfied or returned the item, and "
    "mixed when the review clearly praises some aspects and criticises others. Do not repeat the review, "
    "do not add greetings, and never invent details that are not in the text.\n"
    "Example: 'Fast delivery, works great.' -> positive: the customer is happy with speed and quality.\n"
    "Example: 'Cheap plastic, broke in a week.' -> negative: the product failed quickly."
)
PRODUCTS = ["phone", "blender", "running shoes", "laptop bag", "coffee grinder", "desk lamp", "headphones",
            "tent"]  # fmt: skip
OPINIONS = [
    "Arrived quickly and works exactly as described, very happy with the {p}.",
    "The {p} broke after two days and support never answered my emails.",
    "Good value for the price, although the {p} is louder than I expected.",
    "I returned the {p}; the colour was nothing like the photos.",
    "Best {p} I have owned, my whole family uses it every day.",
    "The {p} is fine, but the instructions were confusing and a part was missing.",
    "Stopped working after a week. Would not buy this {p} again.",
    "Solid build, nice design, and the {p} was well packaged.",
]


def build_workload(num_prompts: int) -> tuple[list[list[dict[str, str]]], list[int]]:
    chats, max_tokens = [], []
    for i in range(num_prompts):
        review = OPINIONS[(i * 3) % len(OPINIONS)].format(p=PRODUCTS[i % len(PRODUCTS)])
        chats.append([{"role": "system", "content": SYSTEM_PROMPT},
                      {"role": "user", "content": f"Review #{i + 1}: {review}"}])  # fmt: skip
        max_tokens.append(1 + (i * 37) % 48)  # deterministic spread over 1..48
    return chats, max_tokens


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def run_sluice(model: str, prompts: list[list[int]], max_tokens: list[int], threads: int, repeats: int,
               budget: int, weights: str | None = None) -> dict[str, Any]:  # fmt: skip
    import torch

    from sluice.engines.llm import LLM, SamplingParams

    torch.set_num_threads(threads)
    # weights only when asked: older revisions (compared against with PYTHONPATH) have no such option
    extra = {} if weights is None else {"weights": weights}
    llm = LLM(model, max_num_seqs=64, max_num_batched_tokens=budget, **extra)
    llm.generate([prompts[0]], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
    times = []
    for _ in range(repeats):
        llm.kv.reset_prefix_cache()  # every repeat starts cold: only hits within the workload count
        hits_before = (llm.kv.stats.num_query_tokens, llm.kv.stats.num_hit_tokens)
        steps_before = llm.stats.num_steps
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        times.append(time.perf_counter() - start)
    queried = llm.kv.stats.num_query_tokens - hits_before[0]
    hit = llm.kv.stats.num_hit_tokens - hits_before[1]
    assert [len(o.token_ids) for o in outs] == max_tokens
    return {
        "engine": "sluice", "elapsed_s": min(times), "all_elapsed_s": times, "output_tokens": sum(max_tokens),
        "prefix_cache_hit_rate": hit / queried if queried else 0.0,
        "num_preemptions": llm.stats.num_preemptions, "num_steps": llm.stats.num_steps - steps_before,
        "peak_rss_mb": _peak_rss_mb(), "sample_text": outs[0].text,
        "outputs": [o.token_ids for o in outs],
    }  # fmt: skip


def run_hf(model: str, prompts: list[list[int]], max_tokens: list[int], threads: int, repeats: int,
           batch_size: int) -> dict[str, Any]:  # fmt: skip
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    path = Path(model)
    gguf = path if path.suffix == ".gguf" else next(iter(sorted(path.glob("*.gguf"))))
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    pad_id = 2

    def generate(batch: list[list[int]], new_tokens: int) -> list[list[int]]:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=None, pad_token_id=pad_id)  # fmt: skip
        return out[:, width:].tolist()

    generate(prompts[:2], 4)  # warm-up
    times = []
    for _ in range(repeats):
        outputs: list[list[int]] = []
        generated = 0
        start = time.perf_counter()
        for b in range(0, len(prompts), batch_size):
            batch_max = max_tokens[b : b + batch_size]
            rows = generate(prompts[b : b + batch_size], max(batch_max))
            generated += len(rows) * max(batch_max)
            outputs += [row[:n] for row, n in zip(rows, batch_max, strict=True)]  # honour each max_tokens
        times.append(time.perf_counter() - start)
    return {
        "engine": f"hf-static-{batch_size}", "elapsed_s": min(times), "all_elapsed_s": times, "output_tokens": sum(max_tokens),
        "tokens_computed": generated, "peak_rss_mb": _peak_rss_mb(), "outputs": outputs,
    }  # fmt: skip


def _in_child(fn: Any, *args: Any) -> dict[str, Any]:
    pool = mp.get_context("spawn").Pool(1)
    try:
        return dict(pool.apply(fn, args))
    finally:
        pool.close()
        pool.join()


def main() -> None:
    # On a shared CPU host, OpenMP threads that spin at every barrier steal the core from the thread they
    # wait for; sleeping waiters made both engines several times faster under load. Same for both engines.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "--speculative" in sys.argv[1:]:  # its own workloads and options: see bench/llm_spec.py
        from llm_spec import main as speculative_main

        speculative_main([a for a in sys.argv[1:] if a != "--speculative"])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file or directory (default: fetch smollm2-135m)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per engine; the best one is reported")
    ap.add_argument("--max-num-batched-tokens", type=int, default=512,
                    help="Sluice's token budget per step (512 saturates a CPU's matmuls)")
    ap.add_argument("--weights", default=None, help="Sluice's weights mode (default: the engine's, auto)")
    ap.add_argument("--no-hf", action="store_true", help="Sluice only (no HF generate rows)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "llm.json"))
    args = ap.parse_args()

    from sluice.engines.llm.loading.chat_tokenizer import ChatTokenizer

    model = model_path(args.model)
    tok = ChatTokenizer.from_path(model)
    chats, max_tokens = build_workload(args.num_prompts)
    prompts = [tok.encode(tok.apply_chat_template(c)) for c in chats]

    results = [_in_child(run_sluice, model, prompts, max_tokens, args.threads, args.repeats,
                         args.max_num_batched_tokens, args.weights)]  # fmt: skip
    for bs in () if args.no_hf else (8, 32):
        results.append(_in_child(run_hf, model, prompts, max_tokens, args.threads, args.repeats, bs))

    ours = results[0]
    best_hf = max(results[1:] or results, key=lambda r: r["output_tokens"] / r["elapsed_s"])
    agree = sum(a == b for a, b in zip(ours["outputs"], best_hf["outputs"], strict=True))
    print(f"\nSmolLM2-135M Q4_1, Sluice weights {args.weights or 'default'}, {len(prompts)} prompts ({sum(len(p) for p in prompts)} prompt tokens), "
          f"max_tokens 1..48 (sum {sum(max_tokens)}), {args.threads} torch threads, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}\n")  # fmt: skip
    print(f"{'engine':<16}{'time s':>9}{'out tok/s':>11}{'vs best HF':>12}{'peak RSS MB':>13}")
    for r in results:
        r["output_tokens_per_s"] = r["output_tokens"] / r["elapsed_s"]
        r["ratio_vs_best_hf"] = r["output_tokens_per_s"] / (best_hf["output_tokens"] / best_hf["elapsed_s"])
        print(f"{r['engine']:<16}{r['elapsed_s']:>9.1f}{r['output_tokens_per_s']:>11.1f}"
              f"{r['ratio_vs_best_hf']:>11.2f}x{r['peak_rss_mb']:>13.0f}")  # fmt: skip
    print(f"\nprefix-cache hit rate (sluice): {ours['prefix_cache_hit_rate']:.1%}; preemptions: "
          f"{ours['num_preemptions']}; steps: {ours['num_steps']}")  # fmt: skip
    print(f"greedy outputs identical to {best_hf['engine']}: {agree}/{len(prompts)}")
    summary = {
        "model": "SmolLM2-135M-Instruct Q4_1", "weights": args.weights or "default", "num_prompts": len(prompts),
        "threads": args.threads, "repeats": args.repeats, "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
        "max_num_batched_tokens": args.max_num_batched_tokens, "sum_max_tokens": sum(max_tokens), "machine": platform.platform(),
        "identical_outputs_vs_best_hf": agree,
        "results": [{k: v for k, v in r.items() if k not in ("outputs",)} for r in results],
    }  # fmt: skip
    save_summary(Path(args.out), summary)


def model_path(model: str | None) -> str:
    """The model a benchmark runs: the one given, or SmolLM2-135M fetched into the model cache."""
    if model is not None:
        return model
    from sluice.model_store import fetch

    return str(fetch("smollm2-135m"))


def timed_generate(llm: Any, prompts: list[list[int]], params: Any) -> tuple[float, list[Any], Any, Any]:
    """One timed ``generate`` from an empty prefix cache: (seconds, outputs, engine stats before, after)."""
    llm.kv.reset_prefix_cache()
    before = llm.stats
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return time.perf_counter() - start, outs, before, llm.stats


def run_facts(threads: int, repeats: int) -> dict[str, Any]:
    """What every SmolLM2 benchmark summary records about how it ran (call it at the end of the run)."""
    return {"model": "SmolLM2-135M-Instruct Q4_1 (the engine's default weights)", "threads": threads, "repeats": repeats,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "machine": platform.platform(),
            "load_avg_at_end": os.getloadavg()}


def save_summary(out: Path, summary: dict[str, Any]) -> None:
    """Write a benchmark's JSON summary (creating its folder) and say where."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
