"""GPU check: the GPU-only tests, embedding throughput of every GPU engine, the Triton kernels, the LLM engine.

    bash bench/gpu_check.sh                 # installs onnxruntime-gpu + tensorrt, then runs this
    .venv/bin/python bench/gpu_check.py [--budget-s 420] [--out bench/results/gpu_check.json]

Without a CUDA GPU it exits at once (status 2) with one line saying so. Otherwise, within ``--budget-s``
(every step has its own timeout; a step that does not fit in what is left is reported as skipped):

1. ``pytest -m gpu tests`` plus the test files named ``*cuda*`` / ``*gpu*`` (GPU-only by their name).
2. For each engine configuration (ONNX CUDA EP, ONNX TensorRT EP, native TensorRT fp32/fp16, torch CUDA
   fp32/fp16), in its own child process: start time, parity with the CPU reference (minimum cosine over 200
   varied texts against the ONNX engine on the CPU) and records/s of ``engine.infer`` at batch sizes 1, 8,
   32, 128 on review-like texts in length-sorted windows (what ``bucket_by: tokens`` does).
3. ``bench/kernels.py --quick``: Triton kernels vs the torch path on CUDA (its committed CPU results are
   restored afterwards).
4. ``bench/llm.py`` with 16 prompts, when the script exists.

Prints one table and writes ``bench/results/gpu_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BATCH_SIZES = (1, 8, 32, 128)
MIN_COSINE = 0.999
ENGINES: dict[str, tuple[str, dict[str, Any]]] = {  # row name -> (engine.type, options besides model)
    # Cheapest start first: the TensorRT builds come last, so a slow build cannot starve the others.
    "torch-cuda-fp32": ("torch", {"device": "cuda"}),
    "torch-cuda-fp16": ("torch", {"device": "cuda", "dtype": "float16"}),
    "onnx-cuda": ("onnx", {"providers": ["cuda"]}),
    "tensorrt": ("tensorrt", {}),
    "tensorrt-fp16": ("tensorrt", {"fp16": True}),  # TensorRT 10 only; 11 reports a one-line error
    "onnx-tensorrt-ep": ("onnx", {"providers": ["tensorrt", "cuda"]}),  # nodes TensorRT lacks run on CUDA
}
NO_GPU = "gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False); run this on a machine with an NVIDIA GPU"


class Clock:
    """The overall deadline; each step asks for at most ``cap_s`` and leaves ``reserve_s`` for later steps."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s

    def grant(self, cap_s: float, reserve_s: float = 0.0) -> float:
        return max(0.0, min(cap_s, self.deadline - time.monotonic() - reserve_s))


def _run(cmd: list[str], timeout_s: float) -> tuple[int | None, str, float]:
    """(exit status or None on timeout, last 4000 chars of output, seconds)."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        return proc.returncode, (proc.stdout + proc.stderr)[-4000:], time.perf_counter() - start
    except subprocess.TimeoutExpired as err:
        parts = [p.decode(errors="replace") if isinstance(p, bytes) else p for p in (err.stdout, err.stderr) if p]
        return None, "".join(parts)[-4000:], time.perf_counter() - start


# ----------------------------------------------------------------------------------------------- steps


def run_tests(clock: Clock) -> dict[str, Any]:
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    named = sorted({str(p.relative_to(ROOT)) for pattern in ("test_*cuda*.py", "test_*gpu*.py")
                    for p in (ROOT / "tests").rglob(pattern)})
    runs = [["-m", "gpu", "tests"]] + ([named] if named else [])
    notes, total_s = [], 0.0
    for args in runs:
        timeout_s = clock.grant(120, reserve_s=300)
        if timeout_s < 10:
            notes.append(f"skipped {' '.join(args)[:40]}: out of time")
            continue
        code, out, took_s = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], timeout_s)
        total_s += took_s
        for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", out.splitlines()[-1] if out else ""):
            counts["errors" if word.startswith("error") else word] += int(number)
        if code is None:
            notes.append(f"timed out after {timeout_s:.0f} s")
        elif code not in (0, 5):  # 5: nothing collected
            notes.append("failures: " + "; ".join(line for line in out.splitlines() if line.startswith("FAILED"))[:600])
    return {**counts, "seconds": round(total_s, 1), "files": named, "note": " | ".join(notes)}


def run_engines(clock: Clock, workdir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    ref = workdir / "reference.npy"
    code, out, _ = _run([sys.executable, __file__, "--child", "reference", "--ref", str(ref)], clock.grant(60, 170))
    if code != 0:
        last = (out.strip().splitlines() or ["no output"])[-1]
        return [{"engine": "reference", "error": f"CPU reference failed: {last[:200]}"}]
    for name in ENGINES:
        timeout_s = clock.grant(70, reserve_s=170)  # kernels and the LLM keep their share
        if timeout_s < 15:
            rows.append({"engine": name, "error": "skipped: out of time"})
            continue
        result = workdir / f"{name}.json"
        code, out, took_s = _run([sys.executable, __file__, "--child", name, "--ref", str(ref), "--out", str(result),
                                  "--budget-s", str(max(1.0, (timeout_s - 40) / len(BATCH_SIZES)))], timeout_s)
        if code == 0 and result.is_file():
            rows.append(json.loads(result.read_text()))
        else:
            last = [line for line in out.strip().splitlines() if line.strip()][-1:] or ["no output"]
            rows.append({"engine": name, "error": ("timed out: " if code is None else "") + last[0][:200],
                         "seconds": round(took_s, 1)})
    return rows


def run_kernels(clock: Clock) -> dict[str, Any]:
    results = ROOT / "bench" / "results" / "kernels.json"
    saved = results.read_bytes() if results.is_file() else None
    timeout_s = clock.grant(90, reserve_s=60)
    if timeout_s < 15:
        return {"error": "skipped: out of time"}
    try:
        code, out, _ = _run([sys.executable, "bench/kernels.py", "--quick"], timeout_s)
        if code != 0 or not results.is_file():
            return {"error": ("timed out" if code is None else f"exit {code}") + ": " + out.strip()[-200:]}
        rows = json.loads(results.read_text())["rows"]
    finally:
        if saved is not None:
            results.write_bytes(saved)  # keep the committed CPU results
    cuda = [r for r in rows if str(r["device"]).startswith("cuda") and r["ms_per_layer"] is not None]
    pairs = []
    for case in dict.fromkeys(r["case"] for r in cuda):
        by_impl = {r["impl"]: r["ms_per_layer"] for r in cuda if r["case"] == case}
        if "triton" in by_impl and "torch_ops" in by_impl:
            pairs.append({"case": case, "triton_ms": by_impl["triton"], "torch_ms": by_impl["torch_ops"],
                          "speedup": by_impl["torch_ops"] / by_impl["triton"]})
    return {"rows": pairs}


def run_llm(clock: Clock, workdir: Path) -> dict[str, Any]:
    script = ROOT / "bench" / "llm.py"
    if not script.is_file():
        return {"error": "skipped: bench/llm.py is not there"}
    timeout_s = clock.grant(150)
    if timeout_s < 20:
        return {"error": "skipped: out of time"}
    _, help_text, _ = _run([sys.executable, str(script), "--help"], 30)
    out_file = workdir / "llm.json"
    cmd = [sys.executable, str(script), "--num-prompts", "16", "--out", str(out_file)]
    if "--device" in help_text:
        cmd += ["--device", "cuda"]
    code, out, took_s = _run(cmd, timeout_s)
    if code != 0 or not out_file.is_file():
        return {"error": ("timed out" if code is None else f"exit {code}") + ": " + out.strip()[-200:]}
    summary = json.loads(out_file.read_text())
    rows = [{"engine": r.get("engine"), "output_tokens_per_s": r.get("output_tokens_per_s"),
             "elapsed_s": r.get("elapsed_s")} for r in summary.get("results", [])]
    return {"rows": rows, "device_flag": "--device" in help_text, "seconds": round(took_s, 1)}


# ----------------------------------------------------------------------------------------- child modes


def child_reference(ref: Path) -> None:
    """The CPU reference: ONNX engine, CPU provider, 200 varied texts -> (200, 384) float32."""
    import numpy as np

    from tests.support.texts import varied_texts

    engine = _start("onnx", {"providers": ["cpu"]}, max_batch_size=32)
    items = engine.prepare(varied_texts(200))
    vectors = [v for s in range(0, len(items), 32) for v in engine.infer(items[s : s + 32])]
    np.save(ref, np.asarray(vectors, dtype=np.float32))


def child_engine(name: str, ref: Path, out: Path, budget_per_size_s: float) -> None:
    import numpy as np

    from bench.embed_engine import review_texts, time_batches
    from tests.support.texts import varied_texts

    engine_type, options = ENGINES[name]
    start = time.perf_counter()
    engine = _start(engine_type, options, max_batch_size=max(BATCH_SIZES))
    row: dict[str, Any] = {"engine": name, "start_s": round(time.perf_counter() - start, 1)}
    used = getattr(engine, "providers_used", None)
    if used is not None and used[0] == "CPUExecutionProvider":
        raise SystemExit(f"{name}: onnxruntime fell back to the CPU provider ({used})")
    items = engine.prepare(varied_texts(200))
    got = np.asarray([v for s in range(0, 200, 32) for v in engine.infer(items[s : s + 32])], dtype=np.float32)
    want = np.load(ref)
    cosines = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    row["min_cosine"] = float(cosines.min())
    reviews = engine.prepare(review_texts(1024))
    row["records_per_s"] = {}
    for size in BATCH_SIZES:
        measured = time_batches(engine, reviews, size, "sorted", budget_s=budget_per_size_s)
        row["records_per_s"][str(size)] = round(measured.records_per_s, 1)
    out.write_text(json.dumps(row))


def _start(engine_type: str, options: dict[str, Any], max_batch_size: int) -> Any:
    from sluice.engines import registry
    from sluice.engines.base import EngineContext

    if engine_type == "onnx":
        import onnxruntime

        if hasattr(onnxruntime, "preload_dlls"):  # CUDA/cuDNN from the nvidia-* wheels torch brought along
            onnxruntime.preload_dlls()
    kind = registry.lookup(engine_type)
    engine = kind.factory(kind.options(model="minilm-l6", **options), EngineContext(max_batch_size=max_batch_size))
    engine.start()
    return engine


# ------------------------------------------------------------------------------------------------ main


def print_table(report: dict[str, Any]) -> None:
    print(f"\n== Sluice GPU check: {report['gpu']} | torch {report['versions'].get('torch')} | "
          f"tensorrt {report['versions'].get('tensorrt')} | onnxruntime {report['versions'].get('onnxruntime')} ==")
    tests = report["tests"]
    print(f"GPU tests: {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped, "
          f"{tests['errors']} errors ({tests['seconds']} s) {tests['note']}")
    sizes = "".join(f"{'bs=' + str(s):>9}" for s in BATCH_SIZES)
    print(f"\n{'embedding engine (records/s)':<28}{'start s':>8}{'min cos':>9}{sizes}  note")
    for row in report["engines"]:
        if "error" in row:
            print(f"{row['engine']:<28}{'-':>8}{'-':>9}{'':>{9 * len(BATCH_SIZES)}}  {row['error']}")
            continue
        rates = "".join(f"{row['records_per_s'].get(str(s), 0):>9.0f}" for s in BATCH_SIZES)
        verdict = "ok" if row["min_cosine"] >= MIN_COSINE else f"PARITY BELOW {MIN_COSINE}"
        print(f"{row['engine']:<28}{row['start_s']:>8.1f}{row['min_cosine']:>9.5f}{rates}  {verdict}")
    print(f"\n{'Triton kernel (CUDA, per layer)':<40}{'triton ms':>10}{'torch ms':>10}{'speedup':>9}")
    for row in report["kernels"].get("rows", []):
        print(f"{row['case']:<40}{row['triton_ms']:>10.4f}{row['torch_ms']:>10.4f}{row['speedup']:>8.2f}x")
    if "error" in report["kernels"]:
        print(f"  {report['kernels']['error']}")
    print(f"\n{'LLM engine (bench/llm.py, 16 prompts)':<40}{'out tok/s':>10}")
    for row in report["llm"].get("rows", []):
        print(f"{row['engine']!s:<40}{row['output_tokens_per_s'] or 0:>10.1f}")
    if "error" in report["llm"]:
        print(f"  {report['llm']['error']}")
    print(f"\ntotal {report['seconds']:.0f} s; saved {report['out']}")


def _versions() -> dict[str, str | None]:
    import importlib.metadata as md

    found: dict[str, str | None] = {}
    for dist in ("torch", "tensorrt", "onnxruntime-gpu", "onnxruntime", "triton"):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            found[dist] = None
    found["onnxruntime"] = found.pop("onnxruntime-gpu") or found["onnxruntime"]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=420.0, help="whole run, all steps (default 420)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu_check.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--ref", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "reference":
        child_reference(args.ref)
        return 0
    if args.child:
        child_engine(args.child, args.ref, args.out, args.budget_s)
        return 0

    import torch

    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    started = time.perf_counter()
    clock = Clock(args.budget_s)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "versions": _versions(),
                              "machine": platform.platform()}
    with tempfile.TemporaryDirectory(prefix="sluice-gpu-check-") as tmp:
        for key, step in (("tests", lambda: run_tests(clock)), ("engines", lambda: run_engines(clock, Path(tmp))),
                          ("kernels", lambda: run_kernels(clock)), ("llm", lambda: run_llm(clock, Path(tmp)))):
            print(f"gpu_check: {key} ...", file=sys.stderr, flush=True)
            report[key] = step()
    report["seconds"] = time.perf_counter() - started
    report["out"] = str(args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    # Failing: a test, or an engine that ran with vectors off the reference. Engines that could not start
    # (a package not installable here, fp16 on TensorRT 11) are reported in the table, not failed on.
    parity_ok = all(r["min_cosine"] >= MIN_COSINE for r in report["engines"] if "min_cosine" in r)
    return 0 if parity_ok and report["tests"]["failed"] == 0 and report["tests"]["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
