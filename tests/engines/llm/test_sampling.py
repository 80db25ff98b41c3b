"""Sampling as a user sees it: seeds, top-k / top-p support, stop tokens and strings, max_tokens, log-probs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from sluice.engines.llm import LLM, RequestStatus, SamplingParams
from sluice.engines.llm.model.causal_lm import LlamaModel
from sluice.engines.llm.model.sampling import Sampler, SamplingRow, argmax_rows


@pytest.fixture(scope="module")
def llm(tiny_llama_dir: Callable[[bool], Path]) -> LLM:
    return LLM(tiny_llama_dir(False), kv_cache_memory_bytes=1 << 23)


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


HOT = SamplingParams(max_tokens=24, temperature=3.0, seed=42)  # flat distribution: seeds matter


def test_seeded_tokens_do_not_depend_on_the_rest_of_the_batch(llm: LLM) -> None:
    target = _prompt(12, seed=1)
    [alone] = llm.generate([target], HOT)
    others = [_prompt(n, seed=10 + n) for n in (5, 30, 60)]
    mixed = llm.generate(
        [others[0], others[1], target, others[2]],
        [SamplingParams(max_tokens=30, temperature=1.5), SamplingParams(max_tokens=5), HOT,
         SamplingParams(max_tokens=40, temperature=2.0, seed=7)],
    )  # fmt: skip
    assert mixed[2].token_ids == alone.token_ids
    [other_seed] = llm.generate([target], SamplingParams(max_tokens=24, temperature=3.0, seed=43))
    assert other_seed.token_ids != alone.token_ids


def _support(logits: list[float], params: SamplingParams, draws: int = 300) -> set[int]:
    sampler = Sampler()
    row = torch.tensor([logits])
    return {
        sampler.sample(row, [SamplingRow(params, step_index=i)]).token_ids[0] for i in range(draws)
    }


def test_top_k_restricts_the_support() -> None:
    logits = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]  # nearly flat: every token is likely without top-k
    assert _support(logits, SamplingParams(temperature=1.0, seed=1)) == set(range(8))
    assert _support(logits, SamplingParams(temperature=1.0, top_k=3, seed=1)) == {5, 6, 7}


def test_top_p_restricts_the_support() -> None:
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().tolist()
    assert _support(logits, SamplingParams(temperature=1.0, top_p=0.75, seed=1)) == {0, 1}
    assert _support(logits, SamplingParams(temperature=1.0, top_p=0.85, seed=1)) == {0, 1, 2}
    assert _support(logits, SamplingParams(temperature=1.0, top_p=0.3, seed=1)) == {0}


def test_greedy_and_sampled_rows_in_one_batch() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
    rows = [SamplingRow(SamplingParams(), 0), SamplingRow(SamplingParams(temperature=1.0, top_k=1), 0),
            SamplingRow(SamplingParams(), 0)]  # fmt: skip
    tokens = Sampler().sample(logits, rows).token_ids
    assert tokens[0] == 1 and tokens[2] == 0 and tokens[1] in (0, 1, 2)


@pytest.fixture(scope="module")
def free_run(llm: LLM) -> tuple[list[int], list[int], str]:
    prompt = llm.tokenizer.encode("The quick brown fox")  # type: ignore[union-attr]
    [out] = llm.generate([prompt], SamplingParams(max_tokens=24))
    assert len(out.text) == 24  # the tiny tokenizer has one character per token
    return prompt, out.token_ids, out.text


def test_stop_string_ends_generation_and_is_excluded(llm: LLM, free_run: tuple[list[int], list[int], str]) -> None:
    prompt, tokens, text = free_run
    stop = text[6:8]
    cut = text.find(stop)
    [out] = llm.generate([prompt], SamplingParams(max_tokens=24, stop=(stop, "never-seen")))
    assert out.status == RequestStatus.FINISHED_STOPPED and out.finish_reason == "stop"
    assert out.text == text[:cut]
    assert out.token_ids == tokens[: cut + len(stop)]  # tokens up to the one completing the stop string


def test_stop_token_ends_generation_and_is_kept(llm: LLM, free_run: tuple[list[int], list[int], str]) -> None:
    prompt, tokens, text = free_run
    stop_id = tokens[5]
    first = tokens.index(stop_id)
    [out] = llm.generate([prompt], SamplingParams(max_tokens=24, stop_token_ids=(stop_id,)))
    assert out.status == RequestStatus.FINISHED_STOPPED
    assert out.token_ids == tokens[: first + 1]
    assert out.text == text[: first + 1]


def test_eos_stops_unless_ignored(llm: LLM, free_run: tuple[list[int], list[int], str]) -> None:
    prompt, tokens, _ = free_run
    llm.outputs.eos_token_ids = frozenset({tokens[3]})  # pretend the tiny model has this EOS
    try:
        [stopped] = llm.generate([prompt], SamplingParams(max_tokens=24))
        [ignored] = llm.generate([prompt], SamplingParams(max_tokens=24, ignore_eos=True))
    finally:
        llm.outputs.eos_token_ids = frozenset()
    assert stopped.finish_reason == "stop" and stopped.token_ids == tokens[: tokens.index(tokens[3]) + 1]
    assert ignored.finish_reason == "length" and ignored.token_ids == tokens


def test_max_tokens_finishes_with_length(llm: LLM) -> None:
    outs = llm.generate([_prompt(9, 2), _prompt(3, 3)], [SamplingParams(max_tokens=1), SamplingParams(max_tokens=7)])
    assert [len(o.token_ids) for o in outs] == [1, 7]
    assert all(o.status == RequestStatus.FINISHED_LENGTH for o in outs)


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=8, logprobs=True),
                                    SamplingParams(max_tokens=8, logprobs=True, temperature=2.0, seed=3)],
                         ids=["greedy", "sampled"])  # fmt: skip
def test_logprobs_match_log_softmax_of_the_logits(
    llm: LLM, next_logprobs: Callable[[LlamaModel, list[int]], torch.Tensor], params: SamplingParams
) -> None:
    prompt = _prompt(20, seed=5)
    [out] = llm.generate([prompt], params)
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == 8
    for i, (token, logprob) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        expected = next_logprobs(llm.runner.model, prompt + out.token_ids[:i])[token].item()
        assert logprob == pytest.approx(expected, abs=1e-4)
    [plain] = llm.generate([prompt], SamplingParams(max_tokens=2))
    assert plain.logprobs is None


def test_argmax_rows_is_torchs_argmax() -> None:
    """First index of the largest value; NaN counts as largest; -inf rows (all masked) give index 0."""
    gen = torch.Generator().manual_seed(0)
    x = torch.round(torch.randn(6, 1000, generator=gen) * 2)  # ties
    x[1, 10] = float("nan")
    x[1, 500] = float("nan")
    x[2] = float("-inf")
    x[3, 999] = float("inf")
    got = argmax_rows(x)
    assert got.dtype == torch.int64 and torch.equal(got, x.argmax(dim=-1))
    assert got[1] == 10 and got[2] == 0 and got[3] == 999
    assert torch.equal(argmax_rows(x[:, :500]), x[:, :500].argmax(dim=-1))  # a strided view
    assert torch.equal(argmax_rows(x.double()), x.double().argmax(dim=-1))  # other dtypes: torch's own
