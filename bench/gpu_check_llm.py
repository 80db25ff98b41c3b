"""GPU check step: Sluice's LLM engine on one random-weight decoder, against HF ``generate`` on the same GPU.

    python bench/gpu_check_llm.py --model llama-3.2-1b --out rows.json [--device cuda] [--profile full]

The model is loaded the way a user's is, ``LLM(model=dir)`` on a HF safetensors directory. A one-layer
probe of the same architecture asks first whether this build's engine loads it; where it does not, every
row says why (or, for Llama-3.2, the shape is measured with the rope scaling dropped, and the model row
says so). Rows, each measured or with a one-line reason:

* ``model``: parameters, weight bytes, build seconds, the variant that ran.
* ``parity fp32`` / ``parity bf16``: Sluice's greedy tokens (all prompts batched together) against HF's
  (one prompt at a time); fp32 should be exact, bf16 gives first-divergence statistics.
* ``decode bs=N``: median wall time of a step decoding N requests, against the memory floors: weight bytes
  (``weight_floor_ms``) and weight plus the KV bytes the step reads (``floor_ms``, ``x_floor``), over the
  device-copy bandwidth measured in this process;
  ``kernel_ms`` is the CUDA kernels' own time per step from the profiler, and ``busy`` = kernel_ms /
  step_ms: far below 1 means the step is bound by the host launching kernels, which CUDA graphs remove.
* ``decode graphs ...``: the same decode steps with ``kernels.decode_graphs`` on and off in one engine, and
  whether their greedy tokens are equal (``bench/gpu_check_graphs.py``); the rows above run eager.
* ``throughput ...``: the labelling workload, Sluice with every request at once (continuous batching,
  prefix cache) against HF static batches; output tokens/s and the ratio to the best HF row.
"""

from __future__ import annotations

import gc
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_check_common import Clock, Rows, child_args, copy_bandwidth_bytes_per_s, one_line
from gpu_check_graphs import graph_rows
from gpu_check_graphs import planned as graphs_planned
from gpu_check_llm_reference import hf_greedy, hf_static, labelling_workload, parity_prompts, parity_summary
from gpu_check_models import DecoderSpec, build_decoder, decoder, probe_dir, save_decoder, scratch_dir


@dataclass(frozen=True)
class Settings:
    parity_prompts: int
    parity_new: int  # greedy tokens per parity prompt
    decode_batches: tuple[int, ...]
    decode_prompt: int  # prompt tokens of each decoding request
    warm_steps: int
    timed_steps: int
    profiled_steps: int  # CUDA only
    workload: tuple[int, int, tuple[int, int], int]  # prompts, system tokens, review tokens, max new tokens
    hf_batches: tuple[int, ...]
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_memory_bytes: int
    max_model_len: int
    copy_bytes: int  # size of the bandwidth probe's buffer (well past the L2 cache)
    graph_batches: tuple[int, ...] = (1, 8)  # decode steps timed with decode graphs on and off


PROFILES = {
    "full": Settings(16, 32, (1, 8, 64, 256), 32, 4, 16, 4, (256, 256, (24, 96), 64), (32, 128), 256, 16384,
                     16 << 30, 1024, 2 << 30),
    "tiny": Settings(8, 16, (1, 8, 64, 256), 8, 2, 6, 2, (32, 24, (4, 12), 8), (4, 16), 256, 4096,
                     64 << 20, 256, 64 << 20),
}

# The native CPU kernels are the CPU path's: building them would spend a step's budget compiling (the GPU
# machine has no ninja anyway); on CUDA the plan never uses them.
NO_NATIVE_BUILD = {"native_cpu": False}


def planned(s: Settings) -> dict[str, str]:
    names = {"model": "model", "parity fp32": "parity", "parity bf16": "parity"}
    names.update({f"decode bs={b}": "decode" for b in s.decode_batches})
    names.update({f"throughput hf-static-{b}": "throughput" for b in s.hf_batches})
    names["throughput sluice"] = "throughput"
    names.update(graphs_planned(s.graph_batches))
    return names


def choose_variant(spec: DecoderSpec, tmp: Path) -> tuple[dict[str, Any], str | None, str | None]:
    """(config fields to override, note, reason): what this build's engine loads of ``spec``'s architecture.

    ``reason`` is set when it loads neither the exact config nor the fallback.
    """
    from sluice.engines.llm import LLM

    def refusal(override: dict[str, Any]) -> str | None:
        try:
            LLM(str(probe_dir(spec, tmp / "probe", override)), device="cpu", kv_cache_memory_bytes=1 << 20,
                kernels=NO_NATIVE_BUILD)
        except Exception as err:  # the engine's refusal, whatever its type, is the row's reason
            return one_line(err)
        return None

    exact = refusal({})
    if exact is None:
        return {}, "exact config", None
    if spec.fallback and refusal(spec.fallback) is None:
        return spec.fallback, f"{spec.fallback_note}; the exact config is refused: {exact}", None
    return {}, None, f"this build's engine refuses {spec.name}'s config: {exact}"


def _params(max_tokens: int) -> Any:
    """Greedy, exactly ``max_tokens`` tokens (the random models have no EOS; ignored all the same)."""
    from sluice.engines.llm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def sluice_greedy(llm: Any, prompts: list[list[int]], num_new: int) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, _params(num_new))]


def kernel_ms_per_step(llm: Any, steps: int) -> float:
    """The CUDA kernels' total time per engine step, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            llm.step()
    total_us = sum(getattr(e, "self_device_time_total", 0) for e in prof.key_averages())
    return total_us / 1e3 / steps


def decode_row(llm: Any, batch: int, s: Settings, vocab_size: int, cuda: bool) -> dict[str, Any]:
    """Prefill ``batch`` requests in one step, then time decode-only steps (each adds ``batch`` tokens)."""
    import torch

    gen = torch.Generator().manual_seed(batch)
    params = _params(s.warm_steps + s.timed_steps + s.profiled_steps + 3)  # none finishes while timed
    ids = [llm.add_request(torch.randint(0, vocab_size, (s.decode_prompt,), generator=gen).tolist(), params)
           for _ in range(batch)]
    try:
        before = llm.stats.num_output_tokens
        llm.step()
        if llm.stats.num_output_tokens - before != batch:
            raise RuntimeError(f"the prefill of {batch} requests took more than one step")
        times = []
        for j in range(s.warm_steps + s.timed_steps):
            before = llm.stats.num_output_tokens
            start = time.perf_counter()
            llm.step()
            took_ms = (time.perf_counter() - start) * 1e3
            if llm.stats.num_output_tokens - before != batch:
                raise RuntimeError(f"a decode step emitted {llm.stats.num_output_tokens - before} tokens, not {batch}")
            if j >= s.warm_steps:
                times.append(took_ms)
        kernel_ms: float | None = None
        kernel_note: str | None = "CPU: no CUDA kernels to profile"
        if cuda and s.profiled_steps:
            try:
                kernel_ms, kernel_note = kernel_ms_per_step(llm, s.profiled_steps), None
            except Exception as err:  # the profiler is a nicety: the step time stands without it
                kernel_note = f"profiler: {one_line(err)}"
    finally:
        for request_id in ids:
            llm.abort(request_id)
    times.sort()
    return {"batch": batch, "kv_len": s.decode_prompt + 1 + s.warm_steps + (s.timed_steps - 1) / 2,
            "step_ms": round(times[len(times) // 2], 3), "kernel_ms": None if kernel_ms is None else round(kernel_ms, 3),
            "kernel_note": kernel_note}


def _model_argument(parser: Any) -> None:
    parser.add_argument("--model", required=True, help="a decoder of bench/gpu_check_models.py's profile")


def main() -> None:
    args = child_args(__doc__.splitlines()[0], _model_argument)
    import torch

    from sluice.engines.llm import LLM

    spec, s, clock = decoder(args.profile, args.model), PROFILES[args.profile], Clock(args.budget_s)
    rows = Rows(args.out, planned(s))
    cuda = args.device.startswith("cuda")
    cfg = spec.config
    with tempfile.TemporaryDirectory(prefix="sluice-gpu-llm-", dir=scratch_dir(12 << 30)) as tmp_name:
        tmp = Path(tmp_name)
        override, note, refused = choose_variant(spec, tmp)
        if refused is not None:
            rows.reason_for_pending(refused)
            return
        start = time.perf_counter()
        hf = build_decoder(spec, args.device, torch.bfloat16, override)
        model_dir = save_decoder(hf, tmp / "model")
        weight_bytes = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))  # bf16, tied once
        if not cfg["tie_word_embeddings"]:
            weight_bytes -= cfg["vocab_size"] * cfg["hidden_size"] * 2  # a decode step gathers a few rows only
        rows.measured("model", "model", params=sum(p.numel() for p in hf.parameters()), weight_bytes=weight_bytes,
                      build_s=round(time.perf_counter() - start, 1), variant=note)

        prompts = parity_prompts(cfg["vocab_size"], s.parity_prompts)
        want: dict[str, list[list[int]]] = {}
        best_hf = 0.0
        num, system, review, max_new = s.workload
        work, max_tokens = labelling_workload(cfg["vocab_size"], num, system, review, max_new)
        with rows.attempt("parity bf16"):
            want["bf16"] = hf_greedy(hf, prompts, s.parity_new, args.device)
        for b in s.hf_batches:
            with rows.attempt(f"throughput hf-static-{b}"):
                measured = hf_static(hf, work, max_tokens, b, args.device)
                best_hf = max(best_hf, measured["tok_s"])
                rows.measured(f"throughput hf-static-{b}", "throughput", engine=f"hf-static-{b}", **measured)
        with rows.attempt("parity fp32"):
            want["fp32"] = hf_greedy(hf.float(), prompts, s.parity_new, args.device)
        del hf
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()

        options = dict(device=args.device, max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                       kv_cache_memory_bytes=s.kv_cache_memory_bytes, max_model_len=s.max_model_len,
                       kernels={**NO_NATIVE_BUILD, "decode_graphs": "off"})  # graphed: the rows below
        for dtype in ("fp32", "bf16"):
            llm = None
            with rows.attempt(f"parity {dtype}"):
                llm = LLM(str(model_dir), dtype={"fp32": "float32", "bf16": "bfloat16"}[dtype], **options)
                if dtype in want:
                    rows.measured(f"parity {dtype}", "parity", new_tokens=s.parity_new,
                                  **parity_summary(sluice_greedy(llm, prompts, s.parity_new), want[dtype]))
            if dtype == "fp32" or llm is None:
                del llm
                gc.collect()
                continue
            bandwidth = copy_bandwidth_bytes_per_s(torch, args.device, s.copy_bytes)
            kv_bytes_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
            for b in s.decode_batches:
                name = f"decode bs={b}"
                if clock.left() < 3:
                    rows.reason(name, f"skipped: {clock.left():.0f} s left in the step")
                    continue
                with rows.attempt(name):
                    row = decode_row(llm, b, s, cfg["vocab_size"], cuda)
                    kernel_note = row.pop("kernel_note")
                    floor_ms = (weight_bytes + b * row["kv_len"] * kv_bytes_per_token) / bandwidth * 1e3
                    kernel = row["kernel_ms"]
                    rows.measured(name, "decode", **row, weight_floor_ms=round(weight_bytes / bandwidth * 1e3, 4),
                                  floor_ms=round(floor_ms, 4),
                                  x_floor=round(row["step_ms"] / floor_ms, 1),
                                  busy=None if kernel is None else round(kernel / row["step_ms"], 3),
                                  copy_gb_s=round(bandwidth / 1e9, 1), kernel_note=kernel_note)
            with rows.attempt("throughput sluice"):
                sluice_greedy(llm, work[:2], 4)  # warm-up: every kernel variant compiled
                llm.kv.reset_prefix_cache()  # only sharing within the workload counts
                start = time.perf_counter()
                outs = llm.generate(work, [_params(n) for n in max_tokens])
                seconds = time.perf_counter() - start
                if [len(o.token_ids) for o in outs] != max_tokens:
                    raise RuntimeError("an output's length differs from its max_tokens")
                tok_s = sum(max_tokens) / seconds
                rows.measured("throughput sluice", "throughput", engine="sluice", seconds=round(seconds, 3),
                              output_tokens=sum(max_tokens), tok_s=round(tok_s, 1),
                              vs_best_hf=round(tok_s / best_hf, 2) if best_hf else None,
                              prefix_cache_hit_rate=round(llm.stats.prefix_cache_hit_rate, 3))
            del llm
            gc.collect()
            if clock.left() < 10:
                rows.reason("decode graphs", f"skipped: {clock.left():.0f} s left in the step")
                continue
            with rows.attempt("decode graphs"):
                graph_rows(rows, lambda **more: LLM(str(model_dir), dtype="bfloat16", **{**options, **more}),
                           s.graph_batches, prompts, lambda llm: sluice_greedy(llm, prompts, s.parity_new),
                           lambda llm, b: decode_row(llm, b, s, cfg["vocab_size"], cuda),
                           lambda b, kv_len, per_token=kv_bytes_per_token, bw=bandwidth:
                               (weight_bytes + b * kv_len * per_token) / bw * 1e3)
    rows.reason_for_pending("not measured: an earlier part of this step failed (see its row)")


if __name__ == "__main__":
    main()
