"""bench/gpu_check.sh: the CPU dry run end to end (what CI runs of the GPU check), and its parts.

The dry run goes through the same wheel install (bench/gpu_wheels/ filled from the package index by
bench/gpu_wheels.sh, installed into a temporary target), the same driver and the same steps as on the GPU
machine, on tiny shapes with Triton interpreted, and with every import refused that the GPU machine could
not satisfy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402
import gpu_check_report  # noqa: E402
from gpu_check_common import NOT_REACHED, Rows  # noqa: E402

SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    return {**env, "SLUICE_PYTHON": sys.executable, **extra}


def _gpu_listed() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return listing.returncode == 0 and listing.stdout.startswith("GPU")


# ----------------------------------------------------------------------------------------- the dry run


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], float, dict]:
    wheels = subprocess.run(["bash", str(ROOT / "bench" / "gpu_wheels.sh")], capture_output=True, text=True,
                            env=_env(), timeout=300)
    assert wheels.returncode == 0, wheels.stderr[-3000:]
    out = tmp_path_factory.mktemp("gpu-check")
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True, text=True,
                          env=_env(), timeout=400)
    took_s = time.perf_counter() - start
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert (out / "gpu_check.md").is_file() and (out / "gpu_check.log").is_file()
    return proc, took_s, json.loads((out / "gpu_check.json").read_text())


def _rows(report: dict, step: str) -> dict[str, dict]:
    [found] = [s for s in report["steps"] if s["name"] == step]
    return {row["name"]: row for row in found["rows"]}


def _mib(text: str, what: str) -> float:
    match = re.search(rf"{what}: ([\d.]+) MiB", text)
    assert match, f"no '{what}' size in the output:\n{text[-3000:]}"
    return float(match.group(1))


@pytest.mark.slow
def test_the_dry_run_fits_its_budget_and_the_sizes_fit_the_limits(dry_run: tuple) -> None:
    proc, took_s, report = dry_run
    assert took_s < 200, f"the dry run took {took_s:.0f} s"  # its budget is 170 s, plus the install
    assert 0.5 < _mib(proc.stderr, "wheel folder bench/gpu_wheels") < 20 * 1e6 / 2**20
    assert _mib(proc.stderr, "sent to the GPU machine") < 64
    # pydantic came from the wheel folder's temporary target, not from this environment
    assert re.search(r"installed 5 wheels into a temporary target: pydantic [\d.]+ from \S*sluice-gpu-site",
                     proc.stderr), proc.stderr[-2000:]
    assert gpu_check_report.incomplete(report) == [] and gpu_check_report.failed_checks(report) == []
    assert report["meta"]["dry_run"] and [s["status"] for s in report["steps"]] == ["ok"] * len(report["steps"])


@pytest.mark.slow
def test_the_dry_run_checks_the_kernels_and_the_plain_llama_for_real(dry_run: tuple) -> None:
    _, _, report = dry_run
    kernels = _rows(report, "kernels")
    fp16 = [r for name, r in kernels.items() if name.startswith("attention fp16")]
    assert len(fp16) == 6 and all(r["reason"] is None and r["ok"] for r in fp16)
    assert kernels["store_kv fp16"]["bit_exact"] and kernels["store_kv bf16"]["bit_exact"]
    assert kernels["moe grouped matmul fp16"]["ok"]  # the experts' kernel
    assert [r["ok"] for n, r in kernels.items() if n.startswith("attention sinks fp16")] == [True]  # gpt-oss
    assert all(r["reason"] is None and r["triton_ms"] > 0 for n, r in kernels.items() if n.startswith("time "))
    llama = _rows(report, "llm-tiny-llama")
    assert llama["parity fp32"]["exact"] == llama["parity fp32"]["prompts"] == 8
    assert all(llama[f"decode bs={b}"]["step_ms"] > 0 for b in (1, 8, 64, 256))
    assert llama["throughput sluice"]["tok_s"] > 0 and llama["throughput sluice"]["vs_best_hf"] > 0
    # decode graphs: compiled (no CUDA graphs on the CPU), both timings in one row, and the tokens compared. In
    # bf16 the compiled step's fused arithmetic rounds differently here and there, so a near tie may flip
    # (the fp32 tests in tests/engines/llm/test_decode_graphs.py require equal tokens); a broken step would
    # differ on every prompt
    graphs = llama["decode graphs"]
    assert graphs["graph_steps"] > 0 and "buckets 1, 8 compiled" in graphs["start"]
    assert graphs["exact"] >= graphs["prompts"] // 2 == 4, graphs
    for b in (1, 8):
        row = llama[f"decode graphs bs={b}"]
        assert row["reason"] is None and row["step_ms"] > 0 and row["eager_step_ms"] > 0 and row["speedup"] > 0


@pytest.mark.slow
def test_the_other_families_are_measured_or_say_the_engine_refuses_them(dry_run: tuple) -> None:
    _, _, report = dry_run
    for step in ("llm-tiny-llama-3.2", "llm-tiny-qwen3"):
        rows = _rows(report, step)
        if rows["model"]["reason"] is None:  # this build loads the family: then it must match HF exactly
            assert rows["parity fp32"]["exact"] == rows["parity fp32"]["prompts"], rows["parity fp32"]
        else:
            assert all("engine refuses" in r["reason"] for r in rows.values()), rows


@pytest.mark.slow
def test_the_dry_run_embeds_through_the_torch_engine_and_explains_the_missing_runtimes(dry_run: tuple) -> None:
    _, _, report = dry_run
    embed = _rows(report, "embed")
    assert all(embed[f"tiny-bert {dt} cosine"]["min_cosine"] > 0.999 for dt in ("float16", "bfloat16"))
    assert all(r["records_per_s"] > 0 for n, r in embed.items() if "bs=" in n)
    providers = _rows(report, "providers")
    assert providers["onnx cpu cosine"]["ok"] and providers["onnx cpu bs=8"]["records_per_s"] > 0
    assert "255.6 MB" in providers["onnx cuda cosine"]["reason"]
    assert "pypi.nvidia.com" in providers["tensorrt native cosine"]["reason"]


# ------------------------------------------------------------------------------ stopping without a GPU


@pytest.mark.skipif(_gpu_listed(), reason="this machine has a GPU")
def test_without_a_gpu_the_script_stops_at_once_before_installing(tmp_path: Path) -> None:
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                          env=_env(), timeout=60)
    assert proc.returncode == 2 and time.perf_counter() - start < 20
    assert "no NVIDIA GPU on this machine" in proc.stderr and "installed" not in proc.stderr


def test_an_nvidia_smi_that_lists_no_gpu_counts_as_no_gpu(tmp_path: Path) -> None:
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    proc = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          env=_env(PATH=f"{tmp_path}:{os.environ['PATH']}"), timeout=60)
    assert proc.returncode == 2 and "lists no GPU" in proc.stderr


def test_a_python_without_torch_is_refused_not_repaired(tmp_path: Path) -> None:
    bare = tmp_path / "python3"
    bare.write_text("#!/bin/sh\nexec /usr/bin/env python3 -I -S \"$@\"\n")
    bare.chmod(0o755)
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(tmp_path / "out")], capture_output=True,
                          text=True, env=_env(SLUICE_PYTHON=str(bare)), timeout=60)
    assert proc.returncode == 1 and "cannot import torch and triton" in proc.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CUDA is visible here")
def test_the_driver_stops_at_once_without_cuda(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == gpu_check.NO_GPU
    assert not (tmp_path / "gpu_check.json").exists()


# ------------------------------------------------------------------------------------------ the driver


@pytest.mark.parametrize(("profile", "budget_s"), [("full", 460), ("tiny", 156)])
def test_every_step_keeps_its_floor_even_when_each_one_before_it_hangs(profile: str, budget_s: float) -> None:
    steps = gpu_check.plan(profile)
    limits = gpu_check.timeouts(steps, budget_s)
    left_s = budget_s
    for i, (cap_s, floor_s) in enumerate(limits):
        timeout_s = gpu_check.step_timeout(limits, i, left_s)
        assert floor_s - 1e-6 <= timeout_s <= cap_s, steps[i].name
        left_s -= timeout_s  # the worst case: the step runs into its timeout
    assert left_s >= 0
    # and a step that finishes early leaves its time to the next ones, up to their caps
    assert gpu_check.step_timeout(limits, 1, budget_s - 5) == limits[1][0]


@pytest.mark.slow  # ./dev test fast leaves it out
def test_a_step_killed_at_its_timeout_leaves_every_row_measured_or_with_a_reason(tmp_path: Path) -> None:
    child = tmp_path / "slow_step.py"
    child.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT / 'bench')!r})
        from gpu_check_common import Rows, child_args
        args = child_args("a step that hangs after its first row")
        rows = Rows(args.out, {{"first": "t", "second": "t", "third": "t"}})
        rows.measured("first", "t", value=1.5)
        with rows.attempt("second"):
            raise RuntimeError("the device said no\\nand more lines")
        print("measuring the third row", flush=True)
        time.sleep(60)
    """))
    result = gpu_check.run_step(gpu_check.Step("slow", str(child)), timeout_s=4, device="cpu", profile="tiny",
                                workdir=tmp_path)
    rows = {row["name"]: row for row in result["rows"]}
    assert result["status"] == "timed out after 4 s"
    assert rows["first"]["reason"] is None and rows["first"]["value"] == 1.5
    assert rows["second"]["reason"] == "RuntimeError: the device said no"
    assert rows["third"]["reason"] == "not reached: the step timed out after 4 s"
    assert gpu_check_report.incomplete({"steps": [result]}) == []


def test_a_step_that_dies_before_any_row_is_one_row_with_its_last_line(tmp_path: Path) -> None:
    child = tmp_path / "broken.py"
    child.write_text("import sys\nprint('ImportError: no module named pydantic', file=sys.stderr)\nsys.exit(3)\n")
    result = gpu_check.run_step(gpu_check.Step("broken", str(child)), 20, "cpu", "tiny", tmp_path)
    assert result["rows"] == [{"name": "broken", "kind": "step",
                               "reason": "the step exit 3: ImportError: no module named pydantic"}]


# ------------------------------------------------------------------------------------------ the report


def test_the_report_flags_rows_with_neither_a_measurement_nor_a_one_line_reason() -> None:
    steps = [{"name": "s", "seconds": 1, "status": "ok", "rows": [
        {"name": "fine", "kind": "k", "reason": None, "x": 1.0},
        {"name": "explained", "kind": "k", "reason": "no GPU"},
        {"name": "empty", "kind": "k", "reason": None},
        {"name": "two lines", "kind": "k", "reason": "a\nb"},
        {"name": "wrong", "kind": "k", "reason": None, "ok": False},
    ]}]
    report = {"meta": {"dry_run": True}, "steps": steps}
    assert gpu_check_report.incomplete(report) == ["s / empty", "s / two lines"]
    assert gpu_check_report.failed_checks(report) == ["s / wrong"]
    text = gpu_check_report.markdown(report)
    assert "| fine | 1 | - |  |" in text and "| explained |  |  | no GPU |" in text
    assert "## Failed checks" in text and "- s / wrong" in text


def test_rows_are_saved_after_every_change_and_pending_ones_get_the_stop_reason(tmp_path: Path) -> None:
    rows = Rows(tmp_path / "rows.json", {"a": "k", "b": "k"})
    assert [r["reason"] for r in json.loads((tmp_path / "rows.json").read_text())] == [NOT_REACHED] * 2
    rows.measured("a", "k", value=2)
    rows.reason_for_pending("the GPU fell off")
    saved = json.loads((tmp_path / "rows.json").read_text())
    assert saved == [{"name": "a", "kind": "k", "reason": None, "value": 2},
                     {"name": "b", "kind": "k", "reason": "the GPU fell off"}]


# ------------------------------------------------------------------------------- imports on the GPU box


def test_the_engine_modules_import_without_what_the_gpu_machine_lacks() -> None:
    code = textwrap.dedent("""
        import importlib.util, sys
        sys.path.insert(0, "bench")
        import gpu_check_common  # installs the guard (SLUICE_GPU_CHECK_GUARD=1)
        import sluice.engines.llm, sluice.engines.torch.torch_engine, sluice.engines.engine_types, sluice.model_store
        import sluice.engines.llm.kernels.torch_ops, sluice.model_store.export
        for name in ("confluent_kafka", "opentelemetry", "platformdirs", "msgspec", "gguf", "jsonschema"):
            assert importlib.util.find_spec(name) is None, name
            try:
                __import__(name)
            except ImportError:
                continue
            raise SystemExit(f"{name} imported")
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=_env(SLUICE_GPU_CHECK_GUARD="1", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
