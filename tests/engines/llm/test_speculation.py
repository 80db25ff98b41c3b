"""Prompt-lookup speculative decoding: the drafter, the acceptance rule, and the engine with speculation on.

The n-gram lookup is checked against a brute-force reference; the acceptance rule (sample a target at every
draft position, keep the matching run plus one) against the rejection-sampling distribution it must equal;
the engine against itself with speculation off -- greedy outputs token for token, seeded samples too -- on
the tiny random Llama and on SmolLM2, with stops, max_tokens, aborts and a pool small enough to preempt.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.engines.llm import LLM, RequestOutput, SamplingParams
from sluice.engines.llm.core.request import Request
from sluice.engines.llm.core.speculation import (
    Draft,
    Drafter,
    StepCostModel,
    accept_drafts,
    propose_ngram_drafts,
)
from sluice.engines.llm.model.sampling import Sampler, SamplingRow

# ---- the n-gram drafter --------------------------------------------------------------------------------


def reference_drafts(tokens: list[int], k: int, ngram_max: int, ngram_min: int) -> list[int]:
    """Brute force: longest suffix first, most recent earlier occurrence with a token after it."""
    for n in range(min(ngram_max, len(tokens) - 1), ngram_min - 1, -1):
        suffix = tokens[len(tokens) - n :]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.sampled_from([0, 1, 2, 255, 256, 65536, 2**31 + 1]), max_size=40),
    k=st.integers(0, 6),
    ngram=st.tuples(st.integers(1, 4), st.integers(0, 3)),
)
def test_ngram_drafts_match_a_brute_force_lookup(tokens: list[int], k: int, ngram: tuple[int, int]) -> None:
    # Token ids whose bytes overlap (256, 65536, ...) would fool a byte search that ignores alignment.
    ngram_min, ngram_max = ngram[0], ngram[0] + ngram[1]
    expected = reference_drafts(tokens, k, ngram_max, ngram_min) if k > 0 else []
    assert propose_ngram_drafts(tokens, k, ngram_max, ngram_min) == expected


def test_ngram_drafts_copy_what_followed_the_longest_match() -> None:
    # "name: Ada Lovelace city: Paris" ... the output has just written "name:" again.
    prompt = [10, 11, 20, 21, 12, 30, 99, 10]
    assert propose_ngram_drafts(prompt + [11], 3, 3, 1) == [20, 21, 12]
    assert propose_ngram_drafts([5, 6, 7], 3, 3, 1) == []  # nothing recurs
    assert propose_ngram_drafts([1, 2, 9, 1, 2, 8, 2], 2, 2, 2) == []  # only a 1-gram recurs


def test_accept_drafts_keeps_the_matching_run_plus_one() -> None:
    assert accept_drafts([4, 5, 6], [4, 5, 6, 7]) == [4, 5, 6, 7]  # all accepted + bonus token
    assert accept_drafts([4, 5, 6], [4, 9, 6, 7]) == [4, 9]  # first mismatch replaces the draft
    assert accept_drafts([4], [1, 2]) == [1]
    assert accept_drafts([], [3]) == [3]
    with pytest.raises(ValueError, match="target tokens"):
        accept_drafts([1, 2], [1, 2])


# ---- the acceptance rule preserves the target distribution --------------------------------------------


def _chi_square(counts: Counter[int], probs: list[float], total: int) -> float:
    return sum((counts[i] - total * p) ** 2 / (total * p) for i, p in enumerate(probs) if p > 0)


def test_sampled_verification_preserves_the_target_distribution() -> None:
    """Two drafts on a 5-token vocab: the first emitted token must follow p0, the second (after an accepted
    first draft) p1; a rejected draft is replaced by a draw from p0 without the draft, renormalised."""
    n = 40_000
    p0 = [0.1, 0.4, 0.2, 0.25, 0.05]
    p1 = [0.3, 0.1, 0.1, 0.2, 0.3]
    draft = [1, 4]
    logits = torch.log(torch.tensor([p0, p1, [0.2] * 5])).repeat(n, 1)  # (3n, 5): rows of n samples
    sampler = Sampler(seed=11)
    params = SamplingParams(temperature=1.0)
    targets = sampler.sample(logits, [SamplingRow(params, j % 3) for j in range(3 * n)]).token_ids
    runs = [accept_drafts(draft, targets[3 * i : 3 * i + 3]) for i in range(n)]

    first = Counter(run[0] for run in runs)
    second = Counter(run[1] for run in runs if run[0] == draft[0])
    rejected = Counter(run[0] for run in runs if run[0] != draft[0])
    residual = [0.0 if i == draft[0] else p / (1 - p0[draft[0]]) for i, p in enumerate(p0)]
    # 99.9% quantiles of chi-square with 4 and 3 degrees of freedom: 18.47 and 16.27.
    assert _chi_square(first, p0, n) < 18.47
    assert _chi_square(second, p1, first[draft[0]]) < 18.47
    assert _chi_square(rejected, residual, sum(rejected.values())) < 16.27
    # Draft 1 accepted with probability p0(d): 0.4 +- 4 sigma.
    assert abs(first[draft[0]] / n - 0.4) < 4 * (0.4 * 0.6 / n) ** 0.5


# ---- the adaptive gate ----------------------------------------------------------------------------------


def test_cost_model_recovers_fixed_and_per_token_cost() -> None:
    model = StepCostModel()
    for i in range(40):
        n = 1 + (i * 7) % 64
        model.record(n, 0.040 + 0.002 * n)
    fit = model.fit()
    assert fit is not None
    assert fit[0] == pytest.approx(0.040, rel=1e-6) and fit[1] == pytest.approx(0.002, rel=1e-6)


def test_gate_drafts_on_small_batches_and_holds_back_poor_drafts_on_large_ones() -> None:
    drafter = Drafter(4)
    for i in range(40):
        n = 1 + (i * 7) % 64
        drafter.record_step(n, 0.040 + 0.002 * n)  # this CPU: a 40 ms step plus 2 ms per token
    three = Request("three", [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3])  # its last 3 tokens recur
    one = Request("one", [5, 1, 2, 3, 4, 6, 7, 8, 9, 5])  # only its last token recurs
    assert drafter.propose(three, 4, num_running=1) == Draft([4, 1, 2, 3], 3)
    assert drafter.propose(one, 4, num_running=1) == Draft([1, 2, 3, 4], 1)  # alone, even a guess pays
    for _ in range(10):
        drafter.record_verify(one, 1, 4, 0)  # 1-gram drafts: always wrong (1 in 12 with the prior)
        drafter.record_verify(three, 3, 4, 4)  # 3-gram drafts: always right
    single = drafter.propose(one, 4, num_running=1)
    assert single is not None and len(single.token_ids) == 1  # when alone, still worth one try
    assert drafter.propose(one, 4, num_running=64) is None  # compute-bound: poor drafts cost throughput
    assert drafter.propose(three, 4, num_running=64) == Draft([4, 1, 2, 3], 3)  # right ones pay even there
    assert drafter.stats.acceptance_rate == pytest.approx(0.5)
    assert (one.num_draft_tokens, one.num_accepted_draft_tokens) == (40, 0)
    assert Drafter(4, adaptive=False).propose(one, 4, num_running=64) == Draft([1, 2, 3, 4], 1)


# ---- the engine with speculation on --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir: Callable[[bool], Path]) -> Path:
    return tiny_llama_dir(False)


def _repetitive_prompts(num: int, seed: int) -> list[list[int]]:
    """Random prompts, most with a repeated phrase in them, so that the drafter finds matches."""
    rng = random.Random(seed)
    prompts = []
    for i in range(num):
        phrase = [rng.randrange(256) for _ in range(rng.randint(2, 8))]
        noise = [rng.randrange(256) for _ in range(rng.randint(1, 30))]
        prompts.append(noise + phrase * rng.randint(2, 4) + noise[:3] if i % 4 else noise)
    return prompts


def _params(outputs: list[RequestOutput], seed: int) -> list[SamplingParams]:
    """Varied max_tokens, and stop tokens taken from the plain outputs so that stops land inside runs."""
    rng = random.Random(seed)
    params = []
    for o in outputs:
        stop = (o.token_ids[rng.randrange(len(o.token_ids))],) if rng.random() < 0.5 else ()
        params.append(SamplingParams(max_tokens=rng.randint(1, 40), stop_token_ids=stop, logprobs=True))
    return params


def test_greedy_outputs_are_identical_with_speculation_tiny_model(tiny: Path) -> None:
    prompts = _repetitive_prompts(24, seed=5)
    plain = LLM(tiny, kv_cache_memory_bytes=1 << 24)
    first = plain.generate(prompts, SamplingParams(max_tokens=40))
    params = _params(first, seed=6)
    expected = plain.generate(prompts, params)
    spec = LLM(tiny, kv_cache_memory_bytes=1 << 24, num_speculative_tokens=4, speculative_adaptive=False)
    got = spec.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert [o.finish_reason for o in got] == [o.finish_reason for o in expected]
    for g, e in zip(got, expected, strict=True):
        assert g.logprobs is not None and e.logprobs is not None and len(g.logprobs) == len(e.logprobs)
        assert g.logprobs == pytest.approx(e.logprobs, abs=1e-4)
    stats = spec.stats
    assert stats.num_accepted_draft_tokens > 0, "no draft was accepted: this test would prove nothing"
    assert 0 < stats.spec_acceptance_rate <= 1
    assert sum(o.num_accepted_draft_tokens for o in got) == stats.num_accepted_draft_tokens
    assert spec.kv.num_free_blocks == spec.kv.num_blocks


def test_kernel_attention_path_verifies_drafts_too(tiny: Path) -> None:
    """The path CUDA takes (padded block tables -> kernels.paged_attention with 1 + k query rows), on the CPU."""
    prompts = _repetitive_prompts(6, seed=13)
    params = SamplingParams(max_tokens=24)
    expected = [o.token_ids for o in LLM(tiny, kv_cache_memory_bytes=1 << 24).generate(prompts, params)]
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24, num_speculative_tokens=4, speculative_adaptive=False,
              kernels={"cpu_attention": "paged"})
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    assert llm.stats.num_draft_tokens > 0


def test_seeded_samples_are_identical_with_speculation(tiny: Path) -> None:
    prompts = _repetitive_prompts(12, seed=8)
    params = [SamplingParams(max_tokens=30, temperature=0.8, top_k=20, seed=100 + i) for i in range(12)]
    plain = LLM(tiny, kv_cache_memory_bytes=1 << 24).generate(prompts, params)
    spec_llm = LLM(tiny, kv_cache_memory_bytes=1 << 24, num_speculative_tokens=3, speculative_adaptive=False)
    spec = spec_llm.generate(prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert spec_llm.stats.num_accepted_draft_tokens > 0


def test_stop_strings_inside_an_accepted_run(tiny: Path) -> None:
    prompts = _repetitive_prompts(8, seed=9)
    plain = LLM(tiny, kv_cache_memory_bytes=1 << 24)
    texts = [o.text for o in plain.generate(prompts, SamplingParams(max_tokens=30))]
    params = [SamplingParams(max_tokens=30, stop=(t[10:12],)) for t in texts]
    expected = plain.generate(prompts, params)
    spec = LLM(tiny, kv_cache_memory_bytes=1 << 24, num_speculative_tokens=4, speculative_adaptive=False)
    got = spec.generate(prompts, params)
    assert [(o.text, o.token_ids) for o in got] == [(o.text, o.token_ids) for o in expected]
    assert any(o.finish_reason == "stop" for o in got)


def test_tiny_pool_with_speculation_preempts_aborts_and_frees_every_block(tiny: Path) -> None:
    prompts = _repetitive_prompts(10, seed=12)
    params = SamplingParams(max_tokens=48)
    expected = [o.token_ids for o in LLM(tiny, kv_cache_memory_bytes=1 << 24).generate(prompts, params)]
    # 3 layers * 2 * 16 tokens * 2 heads * 16 dims * 4 bytes = 12 KiB per block; 10 blocks hold ~2 requests.
    llm = LLM(tiny, kv_cache_memory_bytes=10 * 12 * 1024, num_speculative_tokens=4, speculative_adaptive=False)
    ids = [llm.add_request(p, params) for p in prompts]
    done: dict[str, list[int]] = {}
    num_steps = 0
    while llm.has_unfinished():
        for o in llm.step():
            done[o.request_id] = o.token_ids
        num_steps += 1
        if num_steps == 6:
            assert llm.abort(ids[-1])  # one aborted while it runs or waits
    assert llm.stats.num_preemptions > 0 and llm.stats.num_accepted_draft_tokens > 0
    assert [done[i] for i in ids[:-1]] == expected[:-1]
    assert llm.kv.num_free_blocks == llm.kv.num_blocks


# ---- SmolLM2 -------------------------------------------------------------------------------------------

EXTRACTION_RECORDS = [
    {"name": "Maria Gonzalez", "city": "Valencia", "product": "coffee grinder", "order": "A-1042"},
    {"name": "Tomasz Nowak", "city": "Gdansk", "product": "running shoes", "order": "B-7781"},
    {"name": "Aiko Tanaka", "city": "Sapporo", "product": "desk lamp", "order": "C-3310"},
    {"name": "Liam O'Brien", "city": "Galway", "product": "laptop bag", "order": "D-0097"},
]


def test_greedy_outputs_are_identical_with_speculation_smollm2(smollm2_gguf: Path) -> None:
    import json

    llm = LLM(smollm2_gguf, kv_cache_memory_bytes=64 << 20, num_speculative_tokens=4, speculative_adaptive=False)
    prompts = [
        llm.apply_chat_template([{"role": "user", "content": (
            f"Record: {json.dumps(r)}\nCopy the name, city and product of this record as JSON with the "
            "keys name, city, product.")}])
        for r in EXTRACTION_RECORDS
    ]  # fmt: skip
    params = SamplingParams(max_tokens=28)
    drafter, llm.scheduler.drafter = llm.scheduler.drafter, None  # one model load: plain run first
    expected = llm.generate(prompts, params)
    plain_steps = llm.stats.num_steps
    llm.scheduler.drafter = drafter
    got = llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert llm.stats.spec_acceptance_rate > 0.2  # the answers copy the record
    assert llm.stats.num_steps - plain_steps < plain_steps


# ---- pipeline options -----------------------------------------------------------------------------------


def test_pipeline_options_turn_speculation_on_and_report_acceptance(tiny: Path) -> None:
    from pydantic import ValidationError

    from sluice.engines.engine_contract import EngineContext
    from sluice.engines.llm.operator_engine import LLMEngine, LLMOptions, Prompt

    with pytest.raises(ValidationError, match="speculative_ngram_min"):
        LLMOptions(model=str(tiny), speculative_ngram_min=4, speculative_ngram_max=2)
    options = LLMOptions(model=str(tiny), num_speculative_tokens=3, speculative_ngram_max=4, kv_cache_memory_mb=4)
    engine = LLMEngine(options, EngineContext(max_batch_size=8))
    engine.start()
    assert (engine.llm.config.num_speculative_tokens, engine.llm.config.speculative_ngram_max) == (3, 4)
    for key, prompt in enumerate(_repetitive_prompts(6, seed=3)):  # the tiny model has no chat template
        engine.add(key, Prompt(prompt, SamplingParams(max_tokens=32)))
    while engine.llm.has_unfinished():
        engine.step()
    stats = engine.stats
    assert stats is not None and stats.num_draft_tokens > 0
    assert stats.spec_acceptance_rate == stats.num_accepted_draft_tokens / stats.num_draft_tokens
    engine.close()
