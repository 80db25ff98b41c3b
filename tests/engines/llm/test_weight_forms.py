"""``weights``: the packed CPU forms against the dequantised float32 model of the same file (the reference).

GGUF files: tiny random Llamas (tied and untied) written by llama.cpp's own converter, re-quantised to Q4_0,
Q4_1 and Q8_0 by the ``gguf`` package's quantisers (``tests/support/gguf_quantize.py``), including
SmolLM2's mix (Q4_1 projections, a Q8_0 tied embedding). The reference is the same file with
``weights: fp32``: every tensor dequantised by the ``gguf`` package's rules. The packed model differs from it
only by bf16 rounding (activations into the kernels, scales, outputs, KV pool): its next-token log-probs
must agree to that precision (a wrong nibble order, scale or row permutation moves them by whole units),
and where its greedy tokens first leave the reference's, the reference must have been near a tie there
(its log-prob of the packed model's token within ``TIE`` of its own choice).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from sluice.engines.llm import LLM, SamplingParams
from sluice.engines.llm.config import EngineConfig
from sluice.engines.llm.model.layers.quantized import QuantizedEmbedding, QuantizedLinear, RescoredHead
from sluice.engines.llm.quant.gguf_rows import GGUFRows
from sluice.engines.llm.quant.packed import DenseWeight, Int4Weight, Int8Weight
from tests.engines.llm.conftest import family_prompts
from tests.support.gguf_quantize import requantize

NEW_TOKENS = 20
KV = 1 << 22
TIE = 0.5  # log-prob units: bf16 rounding moved the tiny models' log-probs by up to 0.35


@pytest.fixture(scope="module")
def quantised_gguf(tiny_family_gguf: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
                   ) -> Callable[[str, str], Path]:  # fmt: skip
    """``quantised_gguf(family, kind)``: the tiny model as ``kind`` (``Q4_0``, ``Q4_1``, ``Q8_0`` or
    ``smollm2``: Q4_1 projections with a Q8_0 embedding table)."""
    out = tmp_path_factory.mktemp("quantised-gguf")
    made: dict[tuple[str, str], Path] = {}

    def get(family: str, kind: str) -> Path:
        if (family, kind) not in made:
            qtype, overrides = ("Q4_1", {"token_embd": "Q8_0"}) if kind == "smollm2" else (kind, None)
            made[family, kind] = requantize(tiny_family_gguf(family), out / f"{family}-{kind}.gguf", qtype, overrides)
        return made[family, kind]

    return get


def greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))]


def assert_agrees(packed: LLM, reference: LLM, prompts: list[list[int]], tie: float = TIE,
                  logprob_tolerance: float = TIE) -> int:  # fmt: skip
    """Next-token log-probs close after every prompt; greedy runs equal up to a divergence that the
    weights' rounding explains: a near-tie of the reference, or a token that the packed model's own full
    forward over the same context also picks (up to a near-tie of its own) -- the packed weights prefer it
    there, so the decode path (KV cache, decode attention) is not what diverged. The second case shows up
    late in a run, where the tiny models' quantised log-probs stray furthest (the tiny models' flat
    distributions have many near-ties: few runs stay equal for all 20 tokens, which is why the check is at
    the first divergence). Returns the number of runs equal throughout."""
    from tests.engines.llm.conftest import logprobs_after

    for prompt in prompts:
        got, want = logprobs_after(packed.runner.model, prompt), logprobs_after(reference.runner.model, prompt)
        top = want.topk(5).indices  # where the probability is
        assert float((got[top] - want[top]).abs().max()) < logprob_tolerance, prompt
    same = 0
    for prompt, mine, ref in zip(prompts, greedy(packed, prompts), greedy(reference, prompts), strict=True):
        i = next((k for k, (a, b) in enumerate(zip(mine, ref, strict=True)) if a != b), None)
        if i is None:
            same += 1
            continue
        lp = logprobs_after(reference.runner.model, prompt + ref[:i])
        if float(lp[ref[i]] - lp[mine[i]]) < tie:
            continue  # a near-tie of the reference
        own = logprobs_after(packed.runner.model, prompt + ref[:i])
        assert float(own.max() - own[mine[i]]) < tie, f"token {i}: neither the reference's nor the packed forward's"
    return same


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0", "smollm2"])
def test_auto_keeps_the_gguf_quantisation_and_matches_the_dequantised_model(
    kind: str, quantised_gguf: Callable[[str, str], Path]
) -> None:  # fmt: skip
    path = quantised_gguf("llama", kind)  # tiny-llama: tied embeddings
    packed, reference = LLM(path, kv_cache_memory_bytes=KV), LLM(path, weights="fp32", kv_cache_memory_bytes=KV)
    model = packed.runner.model
    layer = model.layers[0]
    want = Int8Weight if kind == "Q8_0" else Int4Weight
    assert isinstance(layer.self_attn.qkv_proj, QuantizedLinear) and isinstance(layer.self_attn.qkv_proj.packed, want)
    assert isinstance(layer.mlp.down_proj.packed, want)
    # the embedding table keeps the file's rows; the LM head's packed logits are rescored from them
    assert isinstance(model.embed_tokens, QuantizedEmbedding) and isinstance(model.embed_tokens.table, GGUFRows)
    assert isinstance(model.lm_head, RescoredHead) and model.lm_head.exact is model.embed_tokens.table
    # whatever the file's type, the ranking pass is int4 (the cheapest read); the rescoring keeps it exact
    assert isinstance(model.lm_head.fast, QuantizedLinear) and isinstance(model.lm_head.fast.packed, Int4Weight)
    assert packed.runner.kv_dtype == torch.bfloat16 and reference.runner.kv_dtype == torch.float32
    assert_agrees(packed, reference, family_prompts(packed.model_config.vocab_size))


@pytest.mark.slow
@pytest.mark.parametrize(("family", "kind"), [("qwen3_moe", "Q4_0"), ("mixtral", "Q8_0")])
def test_auto_keeps_a_quantised_gguf_s_experts_packed(family: str, kind: str, tmp_path: Path,
                                                      tiny_family_gguf: Callable[[str], Path]) -> None:  # fmt: skip
    """Stacked experts of a Q4 / Q8 GGUF stay packed per expert (int4 through the native grouped call where it
    runs), and the model agrees with the same file dequantised. Only the experts are quantised here: with
    packed attention too, bf16 rounding moves a router's near-ties to other experts and the log-probs by
    whole units (0.8-0.9 on these models) without any packing error; the experts alone move them by 0.08."""
    from sluice.engines.llm.model.layers.moe import PackedStacked, Router

    keep = {part: "F32" for part in ("attn", "token_embd", "output", "ffn_gate_inp")}
    path = requantize(tiny_family_gguf(family), tmp_path / f"{family}-{kind}.gguf", kind, keep)
    # each expert's rows read from the file are the gguf package's dequantisation of the whole stack
    from sluice.engines.llm.loading.gguf_file import GGUFFile
    from sluice.engines.llm.loading.weights import load_weights

    file = {t.name: torch.from_numpy(t.to_float32().copy()) for t in GGUFFile(path).tensors if t.name.startswith("blk.1.")}
    tensors = load_weights(path)[1]
    gate_up = tensors["layers.1.mlp.experts.gate_up_proj.weight"]
    down = tensors["layers.1.mlp.experts.down_proj.weight"]
    assert torch.equal(gate_up.to_float(), torch.cat([file["blk.1.ffn_gate_exps.weight"],  # type: ignore[union-attr]
                                                      file["blk.1.ffn_up_exps.weight"]], dim=1))  # fmt: skip
    assert torch.equal(down.to_float(), file["blk.1.ffn_down_exps.weight"])  # type: ignore[union-attr]
    packed, reference = LLM(path, kv_cache_memory_bytes=KV), LLM(path, weights="fp32", kv_cache_memory_bytes=KV)
    mlp = packed.runner.model.layers[0].mlp
    want = Int8Weight if kind == "Q8_0" else Int4Weight
    assert isinstance(mlp.experts.gate_up_proj, PackedStacked) and isinstance(mlp.experts.down_proj, PackedStacked)
    assert all(isinstance(w, want) for w in mlp.experts.gate_up_proj.experts + mlp.experts.down_proj.experts)
    assert isinstance(mlp.gate, Router) and mlp.gate.weight.dtype == torch.float32  # the router is never packed
    assert_agrees(packed, reference, family_prompts(packed.model_config.vocab_size))


@pytest.mark.slow
def test_auto_untied_head_keeps_its_own_rows(quantised_gguf: Callable[[str, str], Path]) -> None:
    path = quantised_gguf("qwen3", "Q4_0")  # tiny-qwen3: untied LM head
    packed, reference = LLM(path, kv_cache_memory_bytes=KV), LLM(path, weights="fp32", kv_cache_memory_bytes=KV)
    head = packed.runner.model.lm_head
    assert isinstance(head, RescoredHead) and head.exact is not packed.runner.model.embed_tokens.table
    assert_agrees(packed, reference, family_prompts(packed.model_config.vocab_size))


def fake_quantised(weight: torch.Tensor, form: str) -> torch.Tensor:
    """The float32 values a weight takes in ``form``, computed from the forms' documented layouts."""
    w = weight.float()
    if form == "bf16":
        return w.to(torch.bfloat16).float()
    if form == "int8":  # per row: q * scale, scale the bf16 just above absmax / 127
        scale = (w.abs().amax(dim=1, keepdim=True) * ((1 + 2**-8) / 127)).to(torch.bfloat16).float()
        return torch.round(w / scale).clamp(-127, 127) * scale
    g = w.view(w.shape[0], -1, 32)  # int4: each group's [min, max] onto 0..15, kept as (q - 8) * scale + zero
    lo = g.amin(-1, keepdim=True)
    step = (g.amax(-1, keepdim=True) - lo) / 15
    q = torch.round((g - lo) / step).clamp(0, 15)
    bf = torch.bfloat16
    return ((q - 8) * step.to(bf).float() + (lo + 8 * step).to(bf).float()).view(w.shape)


@pytest.mark.parametrize("weights", ["bf16", "int8", "int4"])
def test_hf_checkpoints_are_quantised_on_load_when_asked(weights: str, tiny_family_dir: Callable[..., Path],
                                                         tmp_path: Path) -> None:  # fmt: skip
    """The packed model against a float32 checkpoint holding exactly the values its form stores."""
    import shutil

    from safetensors.torch import load_file, save_file

    path = tiny_family_dir("llama")  # tied embeddings
    packed = LLM(path, weights=weights, kv_cache_memory_bytes=KV)
    model = packed.runner.model
    form = {"bf16": DenseWeight, "int8": Int8Weight, "int4": Int4Weight}[weights]
    assert isinstance(model.layers[1].mlp.gate_up_proj.packed, form)
    head = model.lm_head
    assert isinstance(head, QuantizedLinear) and isinstance(head.packed, DenseWeight if weights == "bf16" else Int8Weight)
    assert model.embed_tokens.table is head.packed  # tied: one matrix for both

    for f in path.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    tensors = {}
    for name, t in load_file(str(path / "model.safetensors")).items():
        if t.dim() == 2:  # projections in the mode's form; the table (the LM head) int8 under int4
            t = fake_quantised(t, "int8" if weights == "int4" and "embed" in name else weights)
        tensors[name] = t.contiguous()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    reference = LLM(tmp_path, kv_cache_memory_bytes=KV)
    assert not isinstance(reference.runner.model.lm_head, QuantizedLinear)  # auto leaves a float checkpoint as it is
    assert_agrees(packed, reference, family_prompts(packed.model_config.vocab_size))


def test_weights_option_is_checked() -> None:
    with pytest.raises(ValueError, match="weights must be one of auto, fp32, bf16, int8, int4"):
        EngineConfig(weights="int5")
    with pytest.raises(ValueError, match="kv_cache_dtype must be"):
        EngineConfig(kv_cache_dtype="int8")


def test_packed_weights_are_refused_off_the_cpu(tiny_llama_dir: Callable[[bool], Path]) -> None:
    from sluice.engines.llm.loading.weights import load_weights
    from sluice.engines.llm.model.causal_lm import CausalLM

    cfg, tensors = load_weights(tiny_llama_dir(False))
    with pytest.raises(ValueError, match="weights: int4 packs weights for the CPU"):
        CausalLM.from_weights(cfg, tensors, 64, device="meta", weights="int4")


_PEAK_SCRIPT = """
import json, sys, threading, time
def anon():  # anonymous memory only: file pages (libraries, the mapped GGUF) come and go with the page cache
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
import torch
from sluice.engines.llm import LLM
before = anon()
peak, done = [before], threading.Event()
def sample():  # a float32 copy of the weights would live for seconds; this looks every millisecond
    while not done.is_set():
        peak[0] = max(peak[0], anon())
        time.sleep(0.001)
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
llm = LLM(sys.argv[1], weights=sys.argv[2], kv_cache_memory_bytes=1 << 24)
done.set()
sampler.join()
params = sum(p.numel() for p in llm.runner.model.parameters())
print(json.dumps({"delta": max(peak[0], anon()) - before, "dense_params": params, "config": [
      llm.model_config.vocab_size, llm.model_config.hidden_size, llm.model_config.intermediate_size,
      llm.model_config.num_layers]}))
"""


@pytest.mark.slow
def test_loading_a_q4_gguf_never_holds_a_float32_copy(smollm2_gguf: Path) -> None:
    """Peak anonymous memory while SmolLM2 Q4_1 loads with ``weights: auto`` grows by less than its weights
    would take in float32 (what loading them dequantised costs): they are converted row chunk by row chunk,
    each packed straight into its final buffer. (Peak RSS, ``VmHWM``, also counts file pages -- the mapped
    GGUF, libraries paged in -- which varied by 200 MB between two virtual environments on one machine.)"""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(smollm2_gguf), "auto"], capture_output=True,
                         text=True, timeout=300, check=True)  # fmt: skip
    report = json.loads(out.stdout.strip().splitlines()[-1])
    vocab, hidden, inter, layers = report["config"]
    # embeddings (tied head) + per layer q/k/v/o (GQA: 576 + 2 * 192 + 576 rows) and gate/up/down
    float32_bytes = 4 * (vocab * hidden + layers * (hidden * (576 + 2 * 192 + 576) + 3 * hidden * inter))
    assert report["dense_params"] < 1_000_000  # only norms stay float parameters
    assert report["delta"] < float32_bytes, (report["delta"] >> 20, float32_bytes >> 20)  # 225 vs 513 MiB seen;
    # weights: fp32 grows by 629 MiB
