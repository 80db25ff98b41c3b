"""Benchmark: Sluice's LLM engine against llama.cpp's ``llama-server`` and HF ``generate`` on the CPU.

Models: SmolLM2-135M-Instruct Q4_1 (as fetched) and a random-weight Llama-3.2-1B-shaped model as Q4_0 and
Q8_0 GGUF files written by llama.cpp's own converter and quantiser (``llm_peers_models.py``), so both
engines read the same file. Workloads (``llm_peers_workloads.py``): labelling (prefill-heavy, one shared
system prompt; ``labelling-1``: a quarter of those chats one at a time), decode-heavy at 1, 8 and 32
requests at once, and extraction (long distinct prompts).

* Sluice: ``LLM(model, weights=...)`` (default ``auto``: the GGUF's quantisation kept), continuous batching
  and prefix caching, requests added as the workload's concurrency allows; its KV pool holds as many tokens
  as the largest llama-server setting's context for that workload.
* llama-server: built once from the sources vendored in the ``llama-cpp-python`` 0.3.36 sdist
  (``llama_cpp_build.py``: 5-8 minutes on two cores, cached in ``<cache>/tools/``), continuous batching with
  1, 8, 16 and 32 slots, each slot with room for the workload's longest request, greedy, EOS ignored,
  requests streamed over HTTP (TTFT from the first streamed token).
* HF ``generate``: static padded batches (SmolLM2 only unless ``--hf-1b``: the 1B model in float32 takes
  5 GB).

Every engine uses ``--threads`` threads and one ``OMP_WAIT_POLICY`` (``--omp-wait-policy``). Reported per run:
output tok/s, TTFT p50 / p99, peak RSS (for Sluice also the part held before the model is loaded); per
workload Sluice's ratio to the best llama-server setting of the same round (``--repeats N``: N rounds back to
back, each running every engine, and a table of the per-round ratios with their median). Writes ``bench/results/llm_peers.json``,
``llm_peers.md`` and ``llm_peers.png``.

    .venv/bin/python bench/llm_peers.py                 # everything (about 40 minutes on 2 quiet cores)
    .venv/bin/python bench/llm_peers.py --quick         # SmolLM2, small workloads: checks the plumbing
    .venv/bin/python bench/llm_peers.py --models smollm2 --workloads decode-8,decode-1
    .venv/bin/python bench/llm_peers.py --models llama1b-q4_0 --workloads decode-1 --slots 1 --repeats 3
    .venv/bin/python bench/llm_peers.py --models smollm2 --no-peers --baseline-ref HEAD~1 --repeats 3

``--baseline-ref REF`` also runs Sluice as of commit ``REF`` (a ``git worktree`` in the Sluice cache),
in the same rounds: with ``--no-peers`` (no llama-server, no HF) the ratios are against that run, the cost
or gain of a change measured side by side on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from baseline import baseline_checkout  # noqa: E402
from llm_peers_run import (  # noqa: E402
    RunResult,
    environment_note,
    in_child,
    run_hf,
    run_llama_server,
    run_sluice,
    run_sluice_at,
)
from llm_peers_workloads import Workload, build_workloads  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {"smollm2": "SmolLM2-135M Q4_1", "llama1b-q4_0": "Llama-3.2-1B-shaped Q4_0",
          "llama1b-q8_0": "Llama-3.2-1B-shaped Q8_0"}  # fmt: skip


def model_file(name: str) -> str:
    from llm_peers_models import llama_1b, smollm2

    return smollm2() if name == "smollm2" else llama_1b(name.split("-")[1].upper())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_workload(model: str, workload: Workload, args: argparse.Namespace, with_hf: bool) -> list[RunResult]:
    from llama_cpp_build import ensure_built

    results = []
    slots = [s for s in args.slots if s <= max(workload.concurrency, 1) or s == 1]
    if not args.no_peers:
        server = ensure_built() / "bin" / "llama-server"
        for s in slots:
            results.append(run_llama_server(server, model, workload, args.threads, s, RESULTS / "llm_peers_logs"))
            print(f"  {results[-1].engine:<18}{results[-1].tokens_per_s:8.1f} tok/s", flush=True)
    ctx_per_slot = -(-(workload.max_request_tokens + 16) // 256) * 256
    kv_tokens = max(slots) * ctx_per_slot
    # (weights, engine name, the engine's kernel choices: engine.kernels, kernel_plan.py)
    runs: list[tuple[str, str, dict[str, str | bool]]] = [
        (w, "sluice" if w == "auto" else f"sluice-{w}", {}) for w in args.weights]
    if args.dense_prompt_baseline:  # the same engine with prompt rows through the dense bf16 GEMM
        runs.append(("auto", "sluice-dense-prompts", {"int4_dense_prompts": "on"}))
    if args.native_layers_baseline:  # the same engine with decode steps through the Python modules
        runs.append(("auto", "sluice-modules", {"native_decode_layers": False}))
    if args.int4_kernel_baseline:  # torch's int4 kernel (and so the modules): the engine before both
        runs.append(("auto", "sluice-torch-int4", {"int4_matmul": "torch"}))
    if args.zero_points_baseline:  # Sluice's kernel reading zero points of 0 (Q4_0) and an asymmetric head
        runs.append(("auto", "sluice-zero-points", {"int4_scales_only": False}))
    if args.baseline_root:  # the same engine as of another commit, in the same round
        runs += [(w, f"sluice@{args.baseline_ref}" + ("" if w == "auto" else f"-{w}"), {}) for w in args.weights]
    for weights, engine, kernels in runs:
        fn, root = (run_sluice_at, (args.baseline_root,)) if "@" in engine else (run_sluice, ())
        options: dict[str, object] = {"max_num_batched_tokens": args.max_num_batched_tokens}
        if kernels:
            options["kernels"] = kernels
        results.append(in_child(engine, workload.name, fn, *root, model, workload, args.threads, weights,
                                kv_tokens, options))  # fmt: skip
        print(f"  {engine:<18}{results[-1].tokens_per_s:8.1f} tok/s", flush=True)
    if with_hf and not args.no_peers:
        for bs in sorted({min(workload.concurrency, 8), min(workload.concurrency, 32)}):
            results.append(in_child(f"hf-static-{bs}", workload.name, run_hf, model, workload, args.threads, bs))
            print(f"  {results[-1].engine:<18}{results[-1].tokens_per_s:8.1f} tok/s", flush=True)
    return results


def summarise(model: str, results: list[RunResult], round_: int = 1) -> list[dict[str, Any]]:
    """One row per run; ratios against the best llama-server setting of the same round of the workload (without
    peers: against the ``--baseline-ref`` run)."""
    rows = []
    for workload in dict.fromkeys(r.workload for r in results):
        runs = [r for r in results if r.workload == workload]
        peers = [r for r in runs if r.engine.startswith("llama-server")]
        if not peers:  # a run against another commit: each engine against its own weights' baseline
            base = {_weights_of(r.engine): r for r in runs if "@" in r.engine}
        for r in runs:
            best = max(peers, key=lambda p: p.tokens_per_s) if peers else base.get(_weights_of(r.engine), r)
            rows.append({"model": model, "workload": workload, "engine": r.engine, "round": round_, "elapsed_s": r.elapsed_s,
                         "output_tokens": r.output_tokens, "tokens_per_s": r.tokens_per_s,
                         "ttft_p50_ms": 1000 * statistics.median(r.ttft_s), "ttft_p99_ms": 1000 * percentile(r.ttft_s, 0.99),
                         "peak_rss_mb": r.peak_rss_mb, "vs_best_llama_server": r.tokens_per_s / best.tokens_per_s,
                         "rss_vs_best_llama_server": r.peak_rss_mb / best.peak_rss_mb, "best_llama_server": best.engine,
                         **r.extra})  # fmt: skip
    return rows


def _weights_of(engine: str) -> str:
    """``""`` for the default weights, else the mode an engine name ends with (``sluice-fp32``, ``sluice@x-fp32``)."""
    name = engine.split("@")[1] if "@" in engine else engine
    return name.partition("-")[2] if name.partition("-")[2] in ("fp32", "bf16", "int8", "int4") else ""


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [header, "", "| model | workload | engine | out tok/s | TTFT p50 ms | TTFT p99 ms | peak RSS MB | "
             "of it before loading | tok/s vs reference | RSS vs it |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    rounds = max((r.get("round", 1) for r in rows), default=1)
    for r in rows:
        runtime = f"{r['runtime_rss_mb']:.0f}" if "runtime_rss_mb" in r else ""
        engine = r["engine"] + (f" #{r['round']}" if rounds > 1 else "")
        lines.append(f"| {r['model']} | {r['workload']} | {engine} | {r['tokens_per_s']:.1f} | "
                     f"{r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['peak_rss_mb']:.0f} | {runtime} | "
                     f"{r['vs_best_llama_server']:.2f}x | {r['rss_vs_best_llama_server']:.2f}x |")  # fmt: skip
    lines += ["", "*of it before loading*: the engine process's resident size once torch and Sluice are imported, "
              "before the model is read -- the runtime's floor, which no weight format changes."]  # fmt: skip
    if rounds > 1:
        lines += ["", f"Ratio to the reference run of the same round (the best llama-server setting; with "
                  f"`--no-peers`, the `--baseline-ref` run of the same weights), {rounds} rounds back to back "
                  "(`--repeats`: this VM's memory bandwidth moves by the minute):", "",
                  "| model | workload | engine | " + " | ".join(f"#{i}" for i in range(1, rounds + 1)) + " | median |",
                  "|---|---|---|" + "---:|" * (rounds + 1)]  # fmt: skip
        for key in dict.fromkeys((r["model"], r["workload"], r["engine"]) for r in rows):
            ratios = [r["vs_best_llama_server"] for r in rows if (r["model"], r["workload"], r["engine"]) == key]
            cells = " | ".join(f"{x:.2f}x" for x in ratios)
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {cells} | {statistics.median(ratios):.2f}x |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(len(models), 1, figsize=(10, 3.2 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models, strict=True):
        mine = [r for r in rows if r["model"] == model]
        workloads = list(dict.fromkeys(r["workload"] for r in mine))
        kinds = {"sluice": lambda e: e == "sluice", "best llama-server": lambda e: e.startswith("llama-server"),
                 "best HF generate": lambda e: e.startswith("hf-")}  # fmt: skip
        for k, (label, match) in enumerate(kinds.items()):
            values = [max((r["tokens_per_s"] for r in mine if r["workload"] == w and match(r["engine"])), default=0.0)
                      for w in workloads]  # fmt: skip
            ax.bar([i + 0.27 * (k - 1) for i in range(len(workloads))], values, width=0.27, label=label)
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_ylabel("output tok/s")
        ax.set_title(model)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,llama1b-q4_0,llama1b-q8_0")
    ap.add_argument("--workloads", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", default="1,8,16,32", help="llama-server slot counts (those above a workload's "
                    "concurrency are skipped)")  # fmt: skip
    ap.add_argument("--weights", default="auto", help="Sluice weight modes to run, comma-separated")
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--dense-prompt-baseline", action="store_true",
                    help="also run Sluice with engine.kernels.int4_dense_prompts: on (prompt rows through the dense bf16 "
                    "GEMM, the default only where Sluice's int4 kernel is not built)")
    ap.add_argument("--native-layers-baseline", action="store_true",
                    help="also run Sluice with engine.kernels.native_decode_layers: false (decode steps through the Python modules)")
    ap.add_argument("--int4-kernel-baseline", action="store_true",
                    help="also run Sluice with engine.kernels.int4_matmul: torch (torch's int4 kernel, not Sluice's own; "
                    "the native layer stack needs the latter, so it is off too)")
    ap.add_argument("--zero-points-baseline", action="store_true",
                    help="also run Sluice with engine.kernels.int4_scales_only: false (int4 weights keep zero points of 0, "
                    "the LM head is quantised asymmetric: the bytes read before scales-only weights)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds of each workload (every engine each round), with a table of the per-round ratios "
                    "and their median")
    ap.add_argument("--scale-1b", type=float, default=0.25, help="workload size for the 1B model (1 = SmolLM2's)")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-peers", action="store_true", help="Sluice only: no llama-server (nothing to build), no HF")
    ap.add_argument("--baseline-ref", default=None, help="also run Sluice as of this git commit, side by side")
    ap.add_argument("--hf-1b", action="store_true", help="also HF generate on the 1B model (fp32: 5 GB)")
    ap.add_argument("--quick", action="store_true", help="small workloads on SmolLM2: checks the plumbing")
    ap.add_argument("--out", default=str(RESULTS / "llm_peers"), help="path prefix of the .json/.md/.png")
    ap.add_argument("--omp-wait-policy", choices=["passive", "active"], default=None,
                    help="OpenMP waiters for every engine (default: $OMP_WAIT_POLICY, else passive). Passive "
                    "suits a loaded host, where spinning waiters steal the core they wait for; on a quiet "
                    "one active is faster for both engines (1B Q4_0, one request: Sluice's step 40 -> 27 ms)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.omp_wait_policy:
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args.slots = [int(s) for s in args.slots.split(",")]
    args.baseline_root = baseline_checkout(args.baseline_ref) if args.baseline_ref else None
    args.weights = args.weights.split(",")
    names = ["smollm2"] if args.quick else args.models.split(",")
    from sluice.engines.llm.loading.chat_tokenizer import ChatTokenizer

    rows: list[dict[str, Any]] = []
    for name in names:
        model = model_file(name)
        scale = 0.1 if args.quick else (1.0 if name == "smollm2" else args.scale_1b)
        workloads = build_workloads(ChatTokenizer.from_path(model), scale,
                                    decode_concurrency=(1, 8) if args.quick else (1, 8, 32))  # fmt: skip
        if args.workloads:
            workloads = [w for w in workloads if w.name in args.workloads.split(",")]
        for w in workloads:
            print(f"{MODELS[name]} / {w.name}: {len(w.prompts)} requests, {w.concurrency} at once, "
                  f"{sum(map(len, w.prompts))} prompt tokens, {w.num_output_tokens} output tokens "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)  # fmt: skip
            with_hf = not args.no_hf and (name == "smollm2" or args.hf_1b)
            for round_ in range(1, args.repeats + 1):  # whole rounds back to back: each ratio is same-round
                rows += summarise(MODELS[name], run_workload(model, w, args, with_hf), round_)
    facts = {"threads": args.threads, "machine": platform.platform(), "cpus": os.cpu_count(), **environment_note()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"facts": facts, "rows": rows}, indent=2) + "\n")
    against = f"Sluice as of {args.baseline_ref}" if args.no_peers else "llama-server vs HF generate"
    header = (f"Sluice vs {against}, {time.strftime('%Y-%m-%d')}, {facts['cpu']}, {args.threads} threads, "
              f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, load average at the end "
              f"{facts['load_avg'][0]:.2f} / {facts['load_avg'][1]:.2f} / {facts['load_avg'][2]:.2f}\n\n"
              f"`python bench/llm_peers.py {' '.join(argv if argv is not None else sys.argv[1:])}`")  # fmt: skip
    text = markdown(rows, header)
    out.with_suffix(".md").write_text(text)
    plot(rows, out.with_suffix(".png"))
    print("\n" + text + f"\nwrote {out}.json, .md, .png")


if __name__ == "__main__":
    main()
