"""The Triton kernels compile ahead of time for an H100/H200 (sm_90) on a machine without a GPU.

The interpreter (test_triton_interpret.py) checks what the kernels compute, but not that the real compiler
accepts them (types of loop-carried values, dot shapes and precisions, shared memory). This compiles them
for sm_90 down to a cubin with the ptxas bundled in the triton wheel, for the tile shapes the wrapper picks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("kernels are interpreted in this process; nothing to compile", allow_module_level=True)
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # the ahead-of-time API moved: the CUDA tests still cover compilation on a GPU
    pytest.skip("this triton has no ASTSource/GPUTarget", allow_module_level=True)

from sluice.engines.llm.kernels.triton_moe import _grouped_matmul_kernel  # noqa: E402
from sluice.engines.llm.kernels.triton_paged_attention import _paged_attention_kernel  # noqa: E402
from sluice.engines.llm.kernels.triton_store_kv import _store_kv_kernel  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)
MAX_SHARED_BYTES = 227 * 1024  # per block on sm_90


def _signature(kernel: object, ptr_types: Mapping[str, str], constexprs: Mapping[str, object]) -> dict[str, str]:
    sig = {}
    for name in kernel.arg_names:  # type: ignore[attr-defined]
        if name in ptr_types:
            sig[name] = ptr_types[name]
        elif name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = "fp32" if name in ("qk_scale", "softcap") else "i32"
    return sig


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "group", "block_m", "precision", "window", "softcap"),
    [("bf16", 3, 16, None, False, False), ("fp16", 8, 64, None, True, False), ("fp32", 1, 64, "ieee", False, False),
     ("bf16", 2, 64, None, True, True)],
    ids=["bf16-decode-gqa3", "fp16-prefill-gqa8-window", "fp32-ieee-mha", "bf16-window-softcap-sinks"],
)
def test_paged_attention_compiles_for_sm90(
    dtype: str, group: int, block_m: int, precision: str | None, window: bool, softcap: bool
) -> None:
    data = {name: f"*{dtype}" for name in ("out_ptr", "q_ptr", "k_cache_ptr", "v_cache_ptr")}
    ints = {name: "*i32" for name in ("block_tables_ptr", "qsl_ptr", "seq_lens_ptr")}
    constexprs = dict(GROUP=group, BLOCK_Q=block_m // group, BLOCK_M=block_m, BLOCK_N=64, BLOCK_D=64,
                      DOT_PRECISION=precision, HAS_WINDOW=window, HAS_SOFTCAP=softcap, HAS_SINKS=softcap)
    sig = _signature(_paged_attention_kernel, data | ints | {"sinks_ptr": "*fp32"}, constexprs)
    compiled = triton.compile(ASTSource(_paged_attention_kernel, sig, constexprs=constexprs), target=SM90)
    assert compiled.asm.get("cubin")
    assert 0 < compiled.metadata.shared <= MAX_SHARED_BYTES


@pytest.mark.slow
def test_store_kv_compiles_for_sm90() -> None:
    ptrs = {name: "*bf16" for name in ("key_ptr", "value_ptr", "k_cache_ptr", "v_cache_ptr")}
    constexprs = dict(BLOCK_H=4, BLOCK_D=64)
    sig = _signature(_store_kv_kernel, ptrs | {"slot_ptr": "*i64"}, constexprs)
    compiled = triton.compile(ASTSource(_store_kv_kernel, sig, constexprs=constexprs), target=SM90)
    assert compiled.asm.get("cubin")


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "block_m", "precision"), [("bf16", 16, None), ("fp16", 64, None), ("fp32", 16, "ieee")])
def test_moe_grouped_matmul_compiles_for_sm90(dtype: str, block_m: int, precision: str | None) -> None:
    ptrs = {name: f"*{dtype}" for name in ("a_ptr", "w_ptr", "out_ptr")} | {"rows_ptr": "*i32", "block_expert_ptr": "*i32"}
    constexprs = dict(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=32, DOT_PRECISION=precision)
    sig = _signature(_grouped_matmul_kernel, ptrs, constexprs)
    compiled = triton.compile(ASTSource(_grouped_matmul_kernel, sig, constexprs=constexprs), target=SM90)
    assert compiled.asm.get("cubin")
    assert 0 < compiled.metadata.shared <= MAX_SHARED_BYTES
