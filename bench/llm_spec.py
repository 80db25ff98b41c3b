"""Benchmark: prompt-lookup speculative decoding on vs off, SmolLM2-135M on the CPU, in one run.

Two workloads, each run with ``num_speculative_tokens=0`` and ``=K`` (same engine options otherwise):

* ``extraction``: chat prompts that give a customer record as JSON and ask for some of its fields back as
  JSON -- the answer copies text out of the prompt, which is what prompt-lookup drafts are for. Greedy,
  the model stops at EOS (outputs are the same with and without speculation, so tokens/s compare directly).
* ``labelling``: the review-labelling workload of ``bench/llm.py`` (shared system prompt, max_tokens 1..48,
  EOS ignored): free text that mostly does not copy the prompt -- speculation must not slow it down.

Requests of a workload are all added at once; ``--max-num-seqs`` caps how many decode together, and each
value given is its own row (speculation pays most where a step's fixed cost dominates: few requests at a
time on a CPU). Timing excludes model loading; off and on alternate over ``--repeats`` and the best of each
is kept; the prefix cache is emptied before every run.

    .venv/bin/python bench/llm_spec.py [--threads 2] [--num-prompts 16] [--max-num-seqs 1 4 8] [-k 4]
    .venv/bin/python bench/llm.py --speculative            # the same

Prints a table and writes ``bench/results/llm_spec.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm import build_workload, model_path, run_facts, save_summary, timed_generate  # noqa: E402

FIRST = ["Maria", "Tomasz", "Aiko", "Liam", "Fatima", "Jonas", "Priya", "Mateo", "Chloe", "Kwame", "Elena",
         "Oskar", "Yuki", "Amara", "Lucas", "Ingrid"]  # fmt: skip
LAST = ["Gonzalez", "Nowak", "Tanaka", "O'Brien", "Haddad", "Lindqvist", "Raman", "Rossi", "Dubois", "Mensah",
        "Petrova", "Berg", "Sato", "Okafor", "Moreau", "Hansen"]  # fmt: skip
CITIES = ["Valencia", "Gdansk", "Sapporo", "Galway", "Marrakesh", "Uppsala", "Pune", "Bologna", "Lyon", "Accra",
          "Plovdiv", "Bergen", "Kyoto", "Lagos", "Nantes", "Aarhus"]  # fmt: skip
PRODUCTS = ["coffee grinder", "running shoes", "desk lamp", "laptop bag", "electric kettle", "yoga mat",
            "noise-cancelling headphones", "cast iron pan", "hiking backpack", "standing desk"]  # fmt: skip


def extraction_prompts(num: int) -> list[list[dict[str, str]]]:
    chats = []
    for i in range(num):
        record = {
            "order_id": f"{chr(65 + i % 26)}-{1000 + 37 * i}",
            "customer": {"name": f"{FIRST[i % 16]} {LAST[(i * 5) % 16]}", "city": CITIES[(i * 3) % 16],
                         "email": f"{FIRST[i % 16].lower()}.{LAST[(i * 5) % 16].lower()}@example.com"},
            "product": PRODUCTS[i % len(PRODUCTS)], "quantity": 1 + i % 4, "status": "shipped",
            "note": "Leave the parcel with the neighbour if nobody is home.",
        }  # fmt: skip
        chats.append([{"role": "user", "content": (
            f"Order record: {json.dumps(record)}\n"
            "Extract the customer's name, city and email and the product from this record. Answer only with "
            'JSON: {"name": ..., "city": ..., "email": ..., "product": ...}')}])  # fmt: skip
    return chats


def run_pair(model: str, prompts: list[list[int]], max_tokens: list[int], ignore_eos: bool, k: int,
             max_num_seqs: int, repeats: int, budget: int) -> dict[str, Any]:  # fmt: skip
    """Speculation off and on over the same prompts; best time of each over ``repeats`` alternations."""
    from sluice.engines.llm import LLM, SamplingParams

    engines = {
        "off": LLM(model, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget),
        "on": LLM(model, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, num_speculative_tokens=k),
    }
    params = [SamplingParams(max_tokens=n, ignore_eos=ignore_eos) for n in max_tokens]
    for llm in engines.values():
        llm.generate(prompts[:2], params[:2])  # warm-up (and a first fit of the on-engine's step costs)
    best: dict[str, float] = {}
    outputs: dict[str, list[list[int]]] = {}
    stats: dict[str, Any] = {}
    for _ in range(repeats):
        for name, llm in engines.items():
            elapsed, outs, before, after = timed_generate(llm, prompts, params)
            best[name] = min(best.get(name, elapsed), elapsed)
            outputs[name] = [o.token_ids for o in outs]
            drafts = after.num_draft_tokens - before.num_draft_tokens
            accepted = after.num_accepted_draft_tokens - before.num_accepted_draft_tokens
            stats[name] = {"num_steps": after.num_steps - before.num_steps, "num_draft_tokens": drafts,
                           "num_accepted_draft_tokens": accepted,
                           "acceptance_rate": accepted / drafts if drafts else 0.0,
                           "per_request_acceptance": [round(o.spec_acceptance_rate, 3) for o in outs]}  # fmt: skip
    num_tokens = sum(len(t) for t in outputs["off"])
    return {
        "output_tokens": num_tokens,
        "identical_outputs": sum(a == b for a, b in zip(outputs["off"], outputs["on"], strict=True)),
        "off": {"elapsed_s": best["off"], "output_tokens_per_s": num_tokens / best["off"], **stats["off"]},
        "on": {"elapsed_s": best["on"], "output_tokens_per_s": num_tokens / best["on"], **stats["on"]},
        "speedup": best["off"] / best["on"],
    }


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see bench/llm.py: sleeping OpenMP waiters
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file or directory (default: fetch smollm2-135m)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, nargs="+", default=[1, 4, 8], help="requests decoded together")
    ap.add_argument("-k", "--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "llm_spec.json"))
    args = ap.parse_args(argv)

    import torch

    from sluice.engines.llm.loading.chat_tokenizer import ChatTokenizer

    torch.set_num_threads(args.threads)
    model = model_path(args.model)
    tok = ChatTokenizer.from_path(model)
    ext = [tok.encode(tok.apply_chat_template(c)) for c in extraction_prompts(args.num_prompts)]
    chats, label_max = build_workload(args.num_prompts)
    lab = [tok.encode(tok.apply_chat_template(c)) for c in chats]
    results: list[dict[str, Any]] = []
    for max_num_seqs in args.max_num_seqs:
        common = (args.num_speculative_tokens, max_num_seqs, args.repeats, args.max_num_batched_tokens)
        results.append({"workload": "extraction", "max_num_seqs": max_num_seqs,
                        **run_pair(model, ext, [64] * len(ext), False, *common)})  # fmt: skip
        results.append({"workload": "labelling", "max_num_seqs": max_num_seqs,
                        **run_pair(model, lab, label_max, True, *common)})  # fmt: skip
        print(f"max_num_seqs {max_num_seqs} done", flush=True)
    print(f"\nSmolLM2-135M Q4_1 (default weights), {args.num_prompts} prompts per workload, k={args.num_speculative_tokens}, "
          f"{args.threads} torch threads, load average at the end {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    print(f"{'workload':<12}{'seqs':>5}{'out tokens':>11}{'off tok/s':>11}{'on tok/s':>10}{'speedup':>9}"
          f"{'accepted':>10}{'steps off/on':>14}{'identical':>11}")  # fmt: skip
    for r in results:
        print(f"{r['workload']:<12}{r['max_num_seqs']:>5}{r['output_tokens']:>11}"
              f"{r['off']['output_tokens_per_s']:>11.1f}{r['on']['output_tokens_per_s']:>10.1f}{r['speedup']:>8.2f}x"
              f"{r['on']['acceptance_rate']:>10.1%}{r['off']['num_steps']:>7}/{r['on']['num_steps']:<6}"
              f"{r['identical_outputs']:>6}/{args.num_prompts}")  # fmt: skip
    summary = {**run_facts(args.threads, args.repeats), "num_prompts": args.num_prompts,
               "num_speculative_tokens": args.num_speculative_tokens, "results": results}
    save_summary(Path(args.out), summary)


if __name__ == "__main__":
    main()
