"""GPU check driver: runs each step in its own child process with its own timeout, inside one budget.

    bash bench/gpu_check.sh [--dry-run]          # the way to run it (wheels, sizes, environment); see there
    python bench/gpu_check.py --budget-s 460 --out DIR [--dry-run] [--only STEP,...] [--list]

Steps (``--list`` names them), each a script beside this one:

* ``env``: device, versions, device-copy bandwidth (``gpu_check_env.py``);
* ``kernels``: Triton paged attention and KV store against the reference (fp16, bf16), then timed against
  the torch path and SDPA / flash (``gpu_check_kernels.py``);
* ``llm-<model>``: the LLM engine on a random-weight Llama-3.2-1B- / Qwen3-0.6B-shaped decoder: greedy
  parity with HF ``generate``, decode-step time against the memory floor, tokens/s against HF static
  batches (``gpu_check_llm.py``);
* ``embed``: the torch embedding engine in fp16 / bf16 (``gpu_check_embed.py``);
* ``providers``: ONNX Runtime CUDA / TensorRT providers, native TensorRT (``gpu_check_providers.py``).

Each step has a timeout of twice its share of the budget, cut so that the steps after it keep their
floors (so a hung step cannot starve the rest, and time a step does not use flows on); at its timeout it
is killed; a step's rows are written as they
are measured, so a killed step still leaves every row measured or with a one-line reason. Writes
``gpu_check.json`` and ``gpu_check.md`` to ``--out``. Exit status: 0 when every row is measured or has a
reason, 1 otherwise, 2 without a CUDA GPU (unless ``--dry-run``: CPU, tiny shapes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import gpu_check_report as report_md  # noqa: E402
from gpu_check_common import NOT_REACHED, Clock  # noqa: E402
from gpu_check_models import DECODERS  # noqa: E402

NO_GPU = ("gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False); run this on a machine with an "
          "NVIDIA GPU, or use --dry-run")
LOG_TAIL_LINES = 30
CAP_FACTOR = 2.0  # a step may take this many times its share, as long as the later steps keep their floors


@dataclass(frozen=True)
class Step:
    name: str
    script: str
    args: tuple[str, ...] = ()
    share: float = 0.1  # of the whole budget it should need (the timeout allows CAP_FACTOR times that)
    min_share: float = 0.03  # of the budget, kept free for it by the steps before it


def plan(profile: str) -> list[Step]:
    decoders = DECODERS[profile]
    llm = [Step(f"llm-{d.name}", "gpu_check_llm.py", ("--model", d.name), 0.54 / len(decoders),
                0.3 / len(decoders)) for d in decoders]
    return [Step("env", "gpu_check_env.py", share=0.04), Step("kernels", "gpu_check_kernels.py", share=0.14),
            *llm, Step("embed", "gpu_check_embed.py", share=0.17, min_share=0.06),
            Step("providers", "gpu_check_providers.py", share=0.08)]


def timeouts(steps: list[Step], budget_s: float) -> list[tuple[float, float]]:
    """(cap, floor) seconds per step: a step runs at most ``cap`` and never into the floors of those after it
    (a hung step cannot starve the rest); one granted less than its floor is skipped."""
    return [(max(10.0, CAP_FACTOR * s.share * budget_s), max(10.0, s.min_share * budget_s)) for s in steps]


def step_timeout(limits: list[tuple[float, float]], index: int, left_s: float) -> float:
    """Step ``index``'s timeout with ``left_s`` of the budget left: its cap, less what would cut into the
    floors of the later steps."""
    later_floors = sum(floor for _, floor in limits[index + 1:])
    return max(0.0, min(limits[index][0], left_s - later_floors))


def _child_env(profile: str) -> dict[str, str]:
    env = dict(os.environ)
    if profile == "tiny":
        # The dry run shares a few CPU cores with other work: OpenMP threads that spin at every barrier
        # wait on each other's preempted peers and made a step several times slower; sleeping ones do not.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(PYTHONUNBUFFERED="1", TQDM_DISABLE="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
               TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def run_step(step: Step, timeout_s: float, device: str, profile: str, workdir: Path) -> dict[str, Any]:
    """Run one step's child; its rows, with what stopped it given as the reason of rows it did not reach."""
    out, log = workdir / f"{step.name}.json", workdir / f"{step.name}.log"
    margin_s = min(15.0, timeout_s * 0.1)  # the child wraps up before it is killed
    cmd = [sys.executable, str(BENCH / step.script), "--out", str(out), "--device", device, "--profile", profile,
           "--budget-s", f"{max(1.0, timeout_s - margin_s):.0f}", *step.args]
    start = time.perf_counter()
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=_child_env(profile),
                                start_new_session=True)  # its own group: a timeout kills its children too
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    seconds = round(time.perf_counter() - start, 1)
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    for line in lines[-LOG_TAIL_LINES:]:
        print(f"[{step.name}] {line}", file=sys.stderr)
    rows = json.loads(out.read_text()) if out.is_file() else []
    if code == 0:
        return {"name": step.name, "seconds": seconds, "status": "ok", "rows": rows}
    last = lines[-1][:200] if lines else "no output"
    status = f"timed out after {timeout_s:.0f} s" if code is None else f"exit {code}: {last}"
    for row in rows:
        if row.get("reason") == NOT_REACHED:
            row["reason"] = f"not reached: the step {status}"
    if not rows:
        rows = [{"name": step.name, "kind": "step", "reason": f"the step {status}"}]
    return {"name": step.name, "seconds": seconds, "status": status, "rows": rows}


def run(steps: list[Step], budget_s: float, device: str, profile: str) -> list[dict[str, Any]]:
    clock = Clock(budget_s)
    limits = timeouts(steps, budget_s)
    results = []
    with tempfile.TemporaryDirectory(prefix="sluice-gpu-check-") as tmp:
        for i, step in enumerate(steps):
            timeout_s = step_timeout(limits, i, clock.left())
            if timeout_s < min(limits[i][1], 10.0):
                results.append({"name": step.name, "seconds": 0.0, "status": "skipped", "rows": [
                    {"name": step.name, "kind": "step", "reason": "skipped: the check's budget was spent"}]})
                continue
            print(f"gpu_check: {step.name} (at most {timeout_s:.0f} s) ...", file=sys.stderr, flush=True)
            results.append(run_step(step, timeout_s, device, profile, Path(tmp)))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=460.0, help="all steps together (default 460)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="folder for gpu_check.*")
    parser.add_argument("--dry-run", action="store_true", help="the CPU, tiny shapes (Triton interpreted)")
    parser.add_argument("--only", help="comma-separated step names (see --list)")
    parser.add_argument("--list", action="store_true", help="print the step names and stop")
    args = parser.parse_args()
    profile, device = ("tiny", "cpu") if args.dry_run else ("full", "cuda")
    steps = plan(profile)
    if args.list:
        print("\n".join(s.name for s in steps))
        return 0
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {s.name for s in steps})
        if unknown:
            print(f"gpu_check: no step {unknown}; steps: {', '.join(s.name for s in steps)}", file=sys.stderr)
            return 1
        steps = [s for s in steps if s.name in wanted]
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print(NO_GPU, file=sys.stderr)
            return 2
    started = time.perf_counter()
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "dry_run": args.dry_run,
            "profile": profile, "device": device, "budget_s": args.budget_s, "python": sys.version.split()[0],
            "machine": platform.platform(), "steps": [s.name for s in steps]}
    report: dict[str, Any] = {"meta": meta, "steps": run(steps, args.budget_s, device, profile)}
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["counts"] = report_md.counts(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (args.out / "gpu_check.md").write_text(report_md.markdown(report), encoding="utf-8")
    print("\n".join(report_md.summary(report)))
    print(f"gpu_check: wrote {args.out / 'gpu_check.json'} and gpu_check.md", file=sys.stderr)
    return 0 if not report_md.incomplete(report) else 1


if __name__ == "__main__":
    sys.exit(main())
