"""The bitmask kernel compiles ahead of time for an H100/H200 (sm_90), on a machine without a GPU.

The interpreter (structured_interpret_cases.py) checks what it computes; this checks that the real
compiler accepts it, for fp32, bf16 and fp16 logits.
"""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("kernels are interpreted in this process; nothing to compile", allow_module_level=True)
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # the ahead-of-time API moved: a GPU run still covers compilation
    pytest.skip("this triton has no ASTSource/GPUTarget", allow_module_level=True)

from sluice.engines.llm.structured.triton_bitmask import _BLOCK, _apply_bitmask_kernel  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_bitmask_kernel_compiles_for_sm90(dtype: str) -> None:
    sig = {"logits_ptr": f"*{dtype}", "bitmask_ptr": "*i32", "rows_ptr": "*i64", "vocab": "i32",
           "num_words": "i32", "logits_row_stride": "i32", "logits_col_stride": "i32", "BLOCK": "constexpr"}
    compiled = triton.compile(ASTSource(_apply_bitmask_kernel, sig, constexprs={"BLOCK": _BLOCK}),
                              target=GPUTarget("cuda", 90, 32))
    assert compiled.asm.get("cubin")
