"""Benchmark: constrained (JSON Schema) vs unconstrained decoding, SmolLM2-135M on the CPU, in one run.

The workload is chosen so that the constraint accepts the unconstrained answer: chat prompts that give an
order record as JSON and ask for four of its fields back as JSON (``bench/llm_spec.py``'s extraction
prompts). A first unconstrained greedy pass keeps the prompts whose answer the schema's grammar accepts
token for token (checked with the grammar backend itself, EOS included); on those, constrained greedy
decoding must produce the very same tokens, so output tokens/s compare directly and the difference is the
price of the grammar: compiling (once, off the engine thread), filling the token bitmasks every step, and
masking the logits.

Each ``--max-num-seqs`` value is a row; unconstrained and constrained runs alternate over ``--repeats``
(which one goes first alternates too) and the best of each is kept; the prefix cache is emptied before every run. Timing excludes model loading
and the grammar compile (warmed up before timing). Mask fill time per step is the engine's own counter.

    .venv/bin/python bench/llm_structured.py [--threads 2] [--num-prompts 32] [--max-num-seqs 1 8]
    .venv/bin/python bench/llm_structured.py --quick          # a smoke run: 4 prompts, one row

Prints a table and writes ``bench/results/llm_structured.json``. Target: constrained / unconstrained
output tokens/s >= 0.9 on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm import model_path, run_facts, save_summary, timed_generate  # noqa: E402
from llm_spec import extraction_prompts  # noqa: E402

FIELDS = ("name", "city", "email", "product")  # asked for; SmolLM2 often copies the next three too
SCHEMA = {"type": "object",
          "properties": {**{f: {"type": "string", "maxLength": 80} for f in FIELDS},
                         "quantity": {"type": "integer", "minimum": 1}, "status": {"type": "string"},
                         "note": {"type": "string", "maxLength": 200}},
          "required": list(FIELDS), "additionalProperties": False}


def accepted_prompts(llm: Any, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], int]:
    """The prompts whose unconstrained greedy answer the schema accepts exactly (EOS included)."""
    from sluice.engines.llm import SamplingParams, StructuredOutput
    from sluice.engines.llm.structured.llguidance_backend import LLGuidanceBackend
    from sluice.engines.llm.structured.token_table import token_table

    table = token_table(llm.tokenizer.tokenizer, llm.model_config.vocab_size, llm.model_config.eos_token_ids)
    backend = LLGuidanceBackend(table)
    grammar = backend.compile(StructuredOutput(json_schema=SCHEMA))
    kept = []
    for prompt, out in zip(prompts, llm.generate(prompts, SamplingParams(max_tokens=max_tokens)), strict=True):
        if out.finish_reason == "stop" and backend.matcher(grammar).validate(out.token_ids) == len(out.token_ids):
            kept.append(prompt)
    return kept, len(prompts)


def run_pair(model: str, prompts: list[list[int]], max_tokens: int, max_num_seqs: int, repeats: int,
             budget: int) -> dict[str, Any]:
    """Unconstrained and constrained runs of the same engine over the same prompts; best time of each."""
    from sluice.engines.llm import LLM, SamplingParams, StructuredOutput

    llm = LLM(model, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    params = {"unconstrained": SamplingParams(max_tokens=max_tokens),
              "constrained": SamplingParams(max_tokens=max_tokens,
                                            structured_output=StructuredOutput(json_schema=SCHEMA))}
    for p in params.values():
        llm.generate(prompts[:2], p)  # warm-up; compiles the grammar (cached from here on)
    best: dict[str, float] = {}
    outputs: dict[str, list[list[int]]] = {}
    steps: dict[str, int] = {}
    mask_s = mask_steps = masked_rows = 0.0
    for repeat in range(repeats):
        order = list(params.items())
        for name, p in order[::-1] if repeat % 2 else order:  # alternate which goes first
            elapsed, outs, before, after = timed_generate(llm, prompts, p)
            if elapsed < best.get(name, float("inf")):
                best[name] = elapsed
                steps[name] = after.num_steps - before.num_steps
                if name == "constrained" and after.structured and before.structured:
                    mask_s = after.structured.mask_fill_s - before.structured.mask_fill_s
                    mask_steps = after.structured.num_mask_steps - before.structured.num_mask_steps
                    masked_rows = after.structured.num_masked_rows - before.structured.num_masked_rows
            outputs[name] = [o.token_ids for o in outs]
    num_tokens = sum(len(t) for t in outputs["unconstrained"])
    rate = {name: num_tokens / best[name] for name in best}
    return {
        "output_tokens": num_tokens,
        "identical_outputs": sum(a == b for a, b in zip(outputs["unconstrained"], outputs["constrained"], strict=True)),
        "unconstrained": {"elapsed_s": best["unconstrained"], "output_tokens_per_s": rate["unconstrained"],
                          "num_steps": steps["unconstrained"]},
        "constrained": {"elapsed_s": best["constrained"], "output_tokens_per_s": rate["constrained"],
                        "num_steps": steps["constrained"], "mask_fill_s": mask_s, "num_mask_steps": int(mask_steps),
                        "mask_fill_ms_per_step": 1000 * mask_s / mask_steps if mask_steps else 0.0,
                        "masked_rows_per_step": masked_rows / mask_steps if mask_steps else 0.0,
                        "step_ms": 1000 * best["constrained"] / max(1, steps["constrained"])},
        "ratio": rate["constrained"] / rate["unconstrained"],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see bench/llm.py: sleeping OpenMP waiters
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file or directory (default: fetch smollm2-135m)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, nargs="+", default=[1, 8], help="requests decoded together")
    ap.add_argument("--max-tokens", type=int, default=72)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 prompts, max_num_seqs 4, one repeat")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "llm_structured.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.num_prompts, args.max_num_seqs, args.repeats = 4, [4], 1

    import torch

    from sluice.engines.llm import LLM

    torch.set_num_threads(args.threads)
    model = model_path(args.model)
    probe = LLM(model, max_num_seqs=8, max_num_batched_tokens=args.max_num_batched_tokens)
    tok = probe.tokenizer
    assert tok is not None
    candidates = [tok.encode(tok.apply_chat_template(c)) for c in extraction_prompts(args.num_prompts)]
    prompts, num_candidates = accepted_prompts(probe, candidates, args.max_tokens)
    del probe
    print(f"{len(prompts)}/{num_candidates} prompts have an unconstrained answer the schema accepts", flush=True)
    if len(prompts) < 2:
        raise SystemExit("too few prompts whose answer the schema accepts; raise --num-prompts")
    results = []
    for max_num_seqs in args.max_num_seqs:
        results.append({"max_num_seqs": max_num_seqs, **run_pair(model, prompts, args.max_tokens, max_num_seqs,
                                                                  args.repeats, args.max_num_batched_tokens)})
        print(f"max_num_seqs {max_num_seqs} done", flush=True)
    print(f"\nSmolLM2-135M Q4_1 (default weights), {len(prompts)} prompts, JSON Schema with {len(FIELDS)} required fields, "
          f"{args.threads} torch threads, load average at the end {os.getloadavg()[0]:.1f}\n")
    print(f"{'seqs':>5}{'out tokens':>11}{'free tok/s':>12}{'schema tok/s':>14}{'ratio':>7}{'mask ms/step':>14}"
          f"{'rows/step':>11}{'step ms':>9}{'identical':>11}")
    for r in results:
        c = r["constrained"]
        print(f"{r['max_num_seqs']:>5}{r['output_tokens']:>11}{r['unconstrained']['output_tokens_per_s']:>12.1f}"
              f"{c['output_tokens_per_s']:>14.1f}{r['ratio']:>7.3f}{c['mask_fill_ms_per_step']:>14.3f}"
              f"{c['masked_rows_per_step']:>11.1f}{c['step_ms']:>9.1f}{r['identical_outputs']:>6}/{len(prompts)}")
    summary = {**run_facts(args.threads, args.repeats), "schema": SCHEMA, "num_prompts": len(prompts),
               "num_candidates": num_candidates, "max_tokens": args.max_tokens, "results": results}
    save_summary(Path(args.out), summary)


if __name__ == "__main__":
    main()
