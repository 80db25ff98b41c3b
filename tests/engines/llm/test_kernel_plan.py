"""The kernel plan: the engine's kernel choices resolved once for the machine (kernel_plan.py), and the
engine following it -- the plan it logs is the plan its layers use."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.engines.llm import LLM, SamplingParams
from sluice.engines.llm.kernel_plan import KernelOptions, Machine, resolve
from sluice.engines.llm.model.layers.norm import RMSNorm

CPU = Machine("cpu", native_built=True, int4_kernel_built=True)


def test_the_defaults_take_everything_the_cpu_has() -> None:
    plan = resolve(KernelOptions(), CPU)
    assert (plan.attention, plan.cpu_attention_plan, plan.native_cpu, plan.native_decode_layers,
            plan.int4_matmul, plan.int4_scales_only, plan.dense_prompts) == ("torch", True, True, True, True, True,
                                                                           False)  # fmt: skip


def test_without_the_int4_kernel_prompts_go_dense_and_scales_keep_their_zero_points() -> None:
    plan = resolve(KernelOptions(), Machine("cpu", native_built=True))
    assert (plan.int4_matmul, plan.native_decode_layers, plan.int4_scales_only, plan.dense_prompts) == (
        False, False, False, True)
    unbuilt = resolve(KernelOptions(), Machine("cpu"))  # the dense path unpacks rows with a native kernel
    assert not unbuilt.native_cpu and not unbuilt.dense_prompts
    assert not resolve(KernelOptions(native_cpu=False, int4_dense_prompts="on"), CPU).dense_prompts


@pytest.mark.parametrize(("options", "field", "expected"), [
    (KernelOptions(native_cpu=False), "int4_matmul", False),  # Sluice's int4 matmul is a native kernel
    (KernelOptions(int4_matmul="torch"), "native_decode_layers", False),  # the stack calls Sluice's int4 kernel
    (KernelOptions(int4_dense_prompts="on"), "dense_prompts", True),
    (KernelOptions(int4_dense_prompts="off", int4_matmul="torch"), "dense_prompts", False),
    (KernelOptions(cpu_attention="paged"), "cpu_attention_plan", False),
    (KernelOptions(attention="reference"), "attention", "reference"),
])
def test_each_choice_turns_off_what_depends_on_it(options: KernelOptions, field: str, expected: object) -> None:
    assert getattr(resolve(options, CPU), field) == expected


def test_cuda_takes_triton_where_it_imports_and_no_cpu_path() -> None:
    plan = resolve(KernelOptions(), Machine("cuda", triton=True, native_built=True, int4_kernel_built=True))
    assert (plan.attention, plan.cpu_attention_plan, plan.native_cpu, plan.dense_prompts) == ("triton", False,
                                                                                             False, False)
    assert resolve(KernelOptions(), Machine("cuda")).attention == "torch"


def test_a_choice_the_machine_cannot_run_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match="triton needs a CUDA device"):
        resolve(KernelOptions(attention="triton"), Machine("cpu", triton=True))
    with pytest.raises(ValueError, match="pip install"):
        resolve(KernelOptions(attention="triton"), Machine("cuda"))
    assert resolve(KernelOptions(attention="triton"), Machine("cpu", triton=True, triton_interpreted=True)
                   ).attention == "triton"  # fmt: skip
    with pytest.raises(ValueError, match="kernels.attention must be one of auto, triton, torch, reference"):
        KernelOptions(attention="cuda")


def test_the_plan_reads_as_one_line() -> None:
    line = resolve(KernelOptions(int4_matmul="torch"), CPU).describe()
    assert line == ("attention torch (planned per step), native CPU kernels on, native decode layers off, "
                    "int4 matmul torch, int4 scales-only off, dense prompt rows on, decode graphs off")


def test_the_engine_logs_its_plan_and_its_layers_follow_it(tiny_llama_dir: Callable[[bool], Path],
                                                           caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    with caplog.at_level(logging.INFO, logger="sluice.engines.llm.llm_engine"):
        off = LLM(tiny_llama_dir(False), kv_cache_memory_bytes=1 << 22, kernels={"native_cpu": False})
    assert not off.kernels.native_cpu and "native CPU kernels off" in caplog.text
    norms = [m for m in off.runner.model.modules() if isinstance(m, RMSNorm)]
    assert norms and not any(m.native for m in norms)
    on = LLM(tiny_llama_dir(False), kv_cache_memory_bytes=1 << 22)
    assert all(m.native == on.kernels.native_cpu for m in on.runner.model.modules() if isinstance(m, RMSNorm))
    prompts = [[1, 5, 9, 13, 2], [3, 4]]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    assert [o.token_ids for o in off.generate(prompts, params)] == [o.token_ids for o in on.generate(prompts, params)]


def test_a_pipeline_names_its_kernels_and_validate_shows_them(tmp_path: Path) -> None:
    import subprocess
    import sys

    from sluice.config import parse_pipeline

    root = Path(__file__).resolve().parents[3]
    text = (root / "examples" / "pipelines" / "label-reviews.yaml").read_text()
    assert "  type: llm\n" in text
    text = text.replace("  type: llm\n", "  type: llm\n  kernels: {native_cpu: false, int4_dense_prompts: on}\n", 1)
    loaded = parse_pipeline(text, environ={})
    assert loaded.engine_options.engine_settings()["kernels"] == KernelOptions(native_cpu=False,
                                                                                int4_dense_prompts="on")
    (tmp_path / "p.yaml").write_text(text)
    done = subprocess.run([sys.executable, "-m", "sluice.cli", "validate", str(tmp_path / "p.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "kernels: native_cpu off, int4_dense_prompts on, resolved for the machine at start" in done.stdout
    bad = text.replace("native_cpu: false", "native_cpu: maybe")
    (tmp_path / "bad.yaml").write_text(bad)
    done = subprocess.run([sys.executable, "-m", "sluice.cli", "validate", str(tmp_path / "bad.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "engine.kernels.native_cpu" in done.stderr and "Traceback" not in done.stderr


def test_packed_experts_follow_the_plan(tiny_family_dir: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.engines.llm.cpu import native_cpu
    from sluice.engines.llm.model.layers.moe import PackedStacked
    from sluice.engines.llm.quant.packed import Int4Weight

    def experts(llm: LLM) -> list[Int4Weight]:
        return [e for m in llm.runner.model.modules() if isinstance(m, PackedStacked)
                for e in m.experts if isinstance(e, Int4Weight)]  # fmt: skip

    torch_int4 = LLM(tiny_family_dir("qwen3_moe"), weights="int4", kv_cache_memory_bytes=1 << 22,
                     kernels={"int4_matmul": "torch"})
    assert experts(torch_int4) and not any(e.native for e in experts(torch_int4))
    default = LLM(tiny_family_dir("qwen3_moe"), weights="int4", kv_cache_memory_bytes=1 << 22)
    assert all(e.native == default.kernels.int4_matmul for e in experts(default))
    calls: list[str] = []
    for name in ("int4_matmul", "int4_grouped_matmul"):
        real = getattr(native_cpu, name)
        monkeypatch.setattr(native_cpu, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    torch_int4.generate([[3, 9, 27, 81]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert calls == []  # no int4 product of the model, experts included, took Sluice's kernel
    default.generate([[3, 9, 27, 81]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert bool(calls) == default.kernels.int4_matmul


def test_without_the_native_kernels_nothing_asks_for_them(tiny_family_dir: Callable[..., Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``native_cpu: false`` is the way around a machine where the build hangs or fails: an int4 model loads
    and answers without ever asking for the build (which ``native_cpu.load`` does)."""
    from sluice.engines.llm.cpu import native_cpu

    def no_build() -> None:
        raise AssertionError("the native kernels were asked for")

    monkeypatch.setattr(native_cpu, "load", no_build)
    for family in ("llama", "qwen3_moe"):
        llm = LLM(tiny_family_dir(family), weights="int4", kv_cache_memory_bytes=1 << 22, kernels={"native_cpu": False})
        assert not llm.kernels.native_cpu and not llm.kernels.int4_matmul
        [out] = llm.generate([[3, 9, 27, 81]], SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(out.token_ids) == 4
