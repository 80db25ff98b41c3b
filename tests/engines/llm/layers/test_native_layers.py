"""The native layer stack of decode-only steps (``cpu/native_layers.py``, ``engines/llm/cpu/native/decode_layers.cpp``).

Its promise is to be the module path, only sooner: the same greedy tokens and the same log-probabilities bit
for bit, with the stack on and off (``kernels.native_decode_layers``), on the real SmolLM2 and on tiny models of
the Llama-shaped families it takes (a sliding window, llama3 rope, partial rotary); and to step aside for
every model and step it does not compute exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from sluice.engines.llm import LLM, SamplingParams
from sluice.engines.llm.cpu import native_cpu

pytestmark = pytest.mark.usefixtures("needs_native_int4")
KV = 32 << 20
_STACKS: dict[int, object] = {}  # an engine's native stack, kept while a test turns it off


def _run(llm: LLM, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch, native: bool,
         tokens: int = 20) -> tuple[list[tuple[list[int], list[float] | None]], int]:  # fmt: skip
    """Greedy outputs with log-probs, and how many steps the native stack computed."""
    calls: list[int] = []
    real = native_cpu.decode_layers
    monkeypatch.setattr(native_cpu, "decode_layers", lambda *a: calls.append(1) or real(*a))
    stack = _STACKS.setdefault(id(llm), llm.runner.model.native_layers)  # built by the engine's plan
    assert stack is not None
    monkeypatch.setattr(llm.runner.model, "native_layers", stack if native else None)
    llm.kv.reset_prefix_cache()
    outs = llm.generate(prompts, SamplingParams(max_tokens=tokens, logprobs=True, ignore_eos=True))
    return [(o.token_ids, o.logprobs) for o in outs], len(calls)


def test_smollm2_decodes_bit_for_bit_as_the_modules_do(smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM(smollm2_gguf, kv_cache_memory_bytes=KV)
    assert llm.runner.model.native_layers is not None
    prompts = [llm.tokenizer.encode(t) for t in ("The sea is", "Label this review: great battery, bad screen.",
                                                 "1, 2, 3,")]  # fmt: skip
    native, steps = _run(llm, prompts, monkeypatch, native=True)
    modules, none = _run(llm, prompts, monkeypatch, native=False)
    assert steps >= 19 and none == 0  # every decode-only step, none with the switch off
    assert native == modules


@pytest.mark.parametrize("family", ["llama", "mistral", "phi3"])  # llama3 rope; sliding window; partial rotary
def test_tiny_families_decode_bit_for_bit_as_the_modules_do(family: str, tiny_family_dir: Callable[..., Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    llm = LLM(tiny_family_dir(family), weights="int4", kv_cache_memory_bytes=KV)
    assert llm.runner.model.native_layers is not None
    prompts = [[5, 9, 11, 40], list(range(4, 30)), [7] * 3]  # past mistral's window of 12 while decoding
    native, steps = _run(llm, prompts, monkeypatch, native=True, tokens=28)
    modules, _ = _run(llm, prompts, monkeypatch, native=False, tokens=28)
    assert steps > 0
    assert native == modules


@pytest.mark.parametrize(("family", "weights"), [("qwen2", "int4"), ("qwen3", "int4"), ("gemma2", "int4"),
                                                 ("llama", "int8"), ("llama", "fp32")])  # fmt: skip
def test_other_models_keep_the_modules(family: str, weights: str, tiny_family_dir: Callable[..., Path]) -> None:
    """q/k/v biases (Qwen2), q/k norms (Qwen3), Gemma's layers and norms, weights that are not int4."""
    llm = LLM(tiny_family_dir(family), weights=weights, kv_cache_memory_bytes=KV)
    assert llm.runner.model.native_layers is None


def test_prompt_and_verify_steps_keep_the_modules(smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps holding prompt rows (dense path) or speculative verifies are the modules' to compute; with
    speculation on, the outputs are still those of the module path."""
    llm = LLM(smollm2_gguf, kv_cache_memory_bytes=KV, num_speculative_tokens=3)
    prompt = llm.tokenizer.encode("Repeat: a b c d a b c d a b c d a b c d")
    native, _ = _run(llm, [prompt], monkeypatch, native=True, tokens=24)
    modules, _ = _run(llm, [prompt], monkeypatch, native=False, tokens=24)
    assert native == modules
    seen: list[torch.Tensor] = []
    real = native_cpu.decode_layers
    monkeypatch.setattr(native_cpu, "decode_layers", lambda h, *a: seen.append(h) or real(h, *a))
    llm.kv.reset_prefix_cache()
    llm.generate([prompt], SamplingParams(max_tokens=1))  # the prompt's step only: nothing decodes
    assert not seen


def test_the_plan_leaves_the_stack_out_when_told(smollm2_gguf: Path) -> None:
    llm = LLM(smollm2_gguf, kv_cache_memory_bytes=KV, kernels={"native_decode_layers": False})
    assert not llm.kernels.native_decode_layers and llm.runner.model.native_layers is None
    assert llm.kernels.int4_matmul  # the rest of the plan stands
