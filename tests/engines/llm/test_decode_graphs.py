"""Decode steps through compiled graphs (``kernels.decode_graphs``, model/decode_graphs.py), checked on the CPU.

On CUDA the graphs are also captured as CUDA graphs (the GPU check times them); what can be checked here is
what the capture rests on: the decode step of every family compiles whole (``fullgraph=True``: a graph
break fails the start) through the kernels as custom ops, and its greedy tokens equal HF transformers'
and the eager step's. ``max_num_seqs=4`` gives buckets 1, 2 and 4, so steps of three requests run padded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from sluice.engines.llm import LLM, SamplingParams
from sluice.engines.llm.kernel_plan import KernelOptions, Machine, resolve
from sluice.engines.llm.model.decode_graphs import decode_buckets
from tests.engines.llm.conftest import FAMILY_NEW_TOKENS, family_prompts
from tests.support.tiny_llms import FAMILIES

PARAMS = SamplingParams(max_tokens=FAMILY_NEW_TOKENS, ignore_eos=True)
PAGED = {"cpu_attention": "paged", "native_cpu": False}  # the kernels' ops, as CUDA calls them
GRAPHS = {**PAGED, "decode_graphs": "on"}


def _engine(path: Path, kernels: dict[str, object]) -> LLM:
    return LLM(path, kernels=kernels, enable_prefix_caching=False, max_num_seqs=4)


@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f == "llama" else pytest.mark.slow)
                                    for f in FAMILIES])  # fmt: skip
def test_the_graphed_decode_step_gives_hf_and_eager_tokens(
    family: str, tiny_family_dir: Callable[..., Path], hf_greedy: Callable[..., list[list[int]]],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    path = tiny_family_dir(family)
    with caplog.at_level(logging.INFO, logger="sluice.start"):
        graphed = _engine(path, GRAPHS)
    prompts = family_prompts(graphed.model_config.vocab_size)
    tokens = [o.token_ids for o in graphed.generate(prompts, PARAMS)]
    assert tokens == hf_greedy(family)
    eager = _engine(path, PAGED)
    assert [o.token_ids for o in eager.generate(prompts, PARAMS)] == tokens
    stats = graphed.stats
    # every step after the prompts is a decode step: all but the prompts' steps went through a graph
    assert stats.num_graph_steps >= stats.num_steps - len(prompts) > 0
    assert eager.stats.num_graph_steps == 0
    ready = [r.getMessage() for r in caplog.records if "decode graphs ready" in r.getMessage()]
    assert len(ready) == 1 and "buckets 1, 2, 4 compiled" in ready[0], ready


def test_requests_finishing_at_different_steps_shrink_the_batch_through_every_bucket(
    tiny_family_dir: Callable[..., Path], hf_greedy: Callable[..., list[list[int]]],
) -> None:  # fmt: skip
    """Answers of different lengths: steps of 4, 3, 2 and 1 requests (3 padded into the 4 bucket), the freed
    slots refilled; each answer is HF's greedy continuation cut at its own length."""
    llm = _engine(tiny_family_dir("llama"), GRAPHS)
    prompts = family_prompts(llm.model_config.vocab_size)
    lengths = [FAMILY_NEW_TOKENS - 4 * i for i in range(len(prompts))]  # 28, 24, ..., 4
    outputs = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths])
    assert [o.token_ids for o in outputs] == [want[:n] for want, n in zip(hf_greedy("llama"), lengths, strict=True)]
    assert llm.stats.num_graph_steps >= llm.stats.num_steps - len(prompts) > 0


def test_a_graph_break_stops_the_start_with_what_to_do(tiny_family_dir: Callable[..., Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The compile is whole or not at all: a layer that breaks the graph fails the start, naming the way out."""
    from sluice.engines.llm.model.layers import mlp

    forward = mlp.GatedMLP.forward

    def breaking(self: mlp.GatedMLP, x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return forward(self, x)

    monkeypatch.setattr(mlp.GatedMLP, "forward", breaking)
    torch._dynamo.reset()  # not the compiled code of another test
    with pytest.raises(RuntimeError, match="did not compile whole.*kernels.decode_graphs: off"):
        _engine(tiny_family_dir("llama"), GRAPHS)
    torch._dynamo.reset()


def test_prompts_and_speculative_verifies_stay_eager(tiny_family_dir: Callable[..., Path],
                                                    hf_greedy: Callable[..., list[list[int]]]) -> None:  # fmt: skip
    """Only decode-only steps are graphed: with drafts verified every step, none is, and the tokens hold."""
    llm = LLM(tiny_family_dir("llama"), kernels=GRAPHS, enable_prefix_caching=False, max_num_seqs=4,
              num_speculative_tokens=2, speculative_adaptive=False)  # fmt: skip
    prompts = family_prompts(llm.model_config.vocab_size)
    assert [o.token_ids for o in llm.generate(prompts, PARAMS)] == hf_greedy("llama")
    stats = llm.stats
    assert stats.num_draft_tokens > 0 and stats.num_graph_steps < stats.num_steps


@pytest.mark.parametrize(("max_num_seqs", "buckets"), [(1, (1,)), (4, (1, 2, 4)), (32, (1, 2, 4, 8, 16, 32)),
                                                       (48, (1, 2, 4, 8, 16, 32, 48))])  # fmt: skip
def test_buckets_are_powers_of_two_and_the_largest_batch(max_num_seqs: int, buckets: tuple[int, ...]) -> None:
    assert decode_buckets(max_num_seqs) == buckets


def test_graphs_are_on_by_default_on_cuda_only() -> None:
    assert resolve(KernelOptions(), Machine("cuda", triton=True)).decode_graphs
    assert not resolve(KernelOptions(), Machine("cpu", native_built=True)).decode_graphs
    assert not resolve(KernelOptions(decode_graphs="off"), Machine("cuda", triton=True)).decode_graphs
    assert resolve(KernelOptions(**GRAPHS), Machine("cpu", native_built=True)).decode_graphs  # type: ignore[arg-type]


@pytest.mark.parametrize("options", [{"decode_graphs": "on"}, {"decode_graphs": "on", "cpu_attention": "paged"}])
def test_graphs_on_the_cpu_need_the_kernels_ops(options: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="cpu_attention: paged and kernels.native_cpu: false"):
        resolve(KernelOptions(**options), Machine("cpu", native_built=True))  # type: ignore[arg-type]


def test_packed_weights_are_refused_with_the_way_out(tiny_family_dir: Callable[..., Path]) -> None:
    with pytest.raises(ValueError, match="decode_graphs: on compiles dense models; weights: int8"):
        LLM(tiny_family_dir("llama"), kernels=GRAPHS, weights="int8")


def test_the_sizes_asked_for_are_the_buckets(tiny_family_dir: Callable[..., Path],
                                             hf_greedy: Callable[..., list[list[int]]]) -> None:  # fmt: skip
    """One bucket of 3: steps of up to three requests replay it, steps of four run eager; the tokens hold."""
    llm = _engine(tiny_family_dir("llama"), {**GRAPHS, "decode_graph_sizes": [3]})
    assert llm.runner.graphs is not None and llm.runner.graphs.sizes == (3,)
    prompts = family_prompts(llm.model_config.vocab_size)
    assert [o.token_ids for o in llm.generate(prompts, PARAMS)] == hf_greedy("llama")
    assert 0 < llm.stats.num_graph_steps < llm.stats.num_steps - len(prompts)


def test_a_size_over_max_num_seqs_is_refused(tiny_family_dir: Callable[..., Path]) -> None:
    with pytest.raises(ValueError, match=r"decode_graph_sizes \[8\] exceed max_num_seqs 4"):
        _engine(tiny_family_dir("llama"), {**GRAPHS, "decode_graph_sizes": [2, 8]})


def test_the_pipeline_file_reads_on_and_off_and_sizes() -> None:
    from sluice.engines.llm.operator_options import KernelSettings

    options = KernelSettings.model_validate({"decode_graphs": True, "decode_graph_sizes": [8, 1, 8]}).options()
    assert options.decode_graphs == "on" and options.decode_graph_sizes == (1, 8)
    assert options.describe() == "decode_graphs on, decode_graph_sizes [1, 8]"  # what sluice validate shows
    assert KernelSettings.model_validate({"decode_graphs": False}).options().decode_graphs == "off"


class _FailingGraphs:
    """Stands in for DecodeGraphs whose compile or capture raises (no GPU here to fail a real capture)."""

    sizes = (1, 2)
    device = torch.device("cpu")

    def capture(self) -> str:
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")


def test_by_default_a_failed_capture_leaves_the_engine_eager_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    from sluice.engines.llm.model.decode_graphs import capture_at_start
    from sluice.engines.start_log import StartLog

    with caplog.at_level(logging.WARNING):
        assert not capture_at_start(_FailingGraphs(), StartLog("llm test"), required=False)  # type: ignore[arg-type]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "decode steps run eager: CUDA error: operation not permitted" in warning
    assert "kernels.decode_graphs: off" in warning
    with pytest.raises(RuntimeError, match="stream is capturing"):  # asked for with `on`: the start stops
        capture_at_start(_FailingGraphs(), StartLog("llm test"), required=True)  # type: ignore[arg-type]
