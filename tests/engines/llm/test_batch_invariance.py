"""Same prompt, same answer: a request's tokens and log-probabilities do not depend on what it is batched with.

Each prompt is first answered alone (one request at a time, no prefix cache, whole-prompt steps): that is the
reference. Then the same prompts run all together, shuffled among other prompts with chunked prefill, again
on a warm prefix cache, with speculation, on two threads, and over random compositions (hypothesis) -- every
answer must equal its reference exactly: the same token ids and bit-identical log-probabilities, greedy and
seeded sampling alike. Models: SmolLM2-135M with its default weights (Q4_1 as int4, the LM head rescored from
the file's rows), and a random Llama-3.2-1B-shaped decoder (two layers, the published widths) with its
default float32 weights and as int4. The engine's guarantee is stated in ``docs/guide/llm.md``.
"""

from __future__ import annotations

import random
import shutil
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.engines.llm import LLM, SamplingParams
from sluice.engines.llm.random_models import save_random_model

Answer = tuple[list[int], list[float]]
Prompt = str | list[int]

TOPICS = ["a broken phone", "the sea at night", "taxes in Lyon", "a cat that hates rain", "quantum physics",
          "sourdough bread", "a late train to Porto", "the moon landing", "cold brew coffee", "a noisy hotel"]  # fmt: skip
SMOLLM_PROMPTS = [f"Write two sentences about {t}." for t in TOPICS[:6]] + [
    "Label the sentiment of this review as positive or negative: the battery died after two days, and support "
    "never answered my three emails. Label:",
    "Extract the city from: 'Shipped from Lyon to a customer in Porto on Monday.' City:",
]
SMOLLM_OTHERS = [f"Describe {t} in detail, then list three facts about it." for t in TOPICS[::-1]]
NEW_TOKENS = 64


def _params(prompt: Prompt, seeded: bool) -> SamplingParams:
    if seeded:  # the seed follows the prompt, as seed_from follows the record
        return SamplingParams(max_tokens=NEW_TOKENS, temperature=0.9, top_p=0.95, ignore_eos=True, logprobs=True,
                              seed=zlib.crc32(repr(prompt).encode()))  # fmt: skip
    return SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=True)


def _requests(prompts: list[Prompt]) -> tuple[list[Prompt], list[SamplingParams]]:
    """Each prompt twice: greedy and seeded sampling (its own seed), in one batch."""
    return [*prompts, *prompts], [_params(p, False) for p in prompts] + [_params(p, True) for p in prompts]


def _answers(llm: LLM, prompts: list[Prompt], params: list[SamplingParams]) -> list[Answer]:
    return [(list(o.token_ids), list(o.logprobs or [])) for o in llm.generate(prompts, params)]


def _alone(llm: LLM, prompts: list[Prompt]) -> dict[tuple[int, bool], Answer]:
    return {(i, seeded): _answers(llm, [p], [_params(p, seeded)])[0]
            for i, p in enumerate(prompts) for seeded in (False, True)}  # fmt: skip


def _check(reference: dict[tuple[int, bool], Answer], prompts: list[Prompt], got: list[Answer], how: str) -> None:
    """``got``: the answers of ``_requests(prompts)``, compared with the reference by prompt index."""
    n = len(prompts)
    for j, answer in enumerate(got):
        key = (j % n, j >= n)
        expected = reference[key]
        assert answer[0] == expected[0], f"{how}: prompt {key[0]} ({'seeded' if key[1] else 'greedy'}) " \
            f"first differs at token {_first_difference(answer[0], expected[0])}"  # fmt: skip
        assert answer[1] == expected[1], f"{how}: prompt {key[0]} same tokens, other log-probabilities"


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _shuffled_among(prompts: list[Prompt], others: list[Prompt], seed: int) -> tuple[list[Prompt], list[SamplingParams], list[int]]:
    """The requests of ``prompts`` interleaved at random with greedy ``others``; returns the requests, their
    params and where each of ``_requests(prompts)`` went."""
    mine, mine_params = _requests(prompts)
    items = [(p, sp, j) for j, (p, sp) in enumerate(zip(mine, mine_params, strict=True))]
    items += [(p, SamplingParams(max_tokens=16, ignore_eos=True), -1) for p in others]  # they share steps
    random.Random(seed).shuffle(items)
    where = {j: k for k, (_, _, j) in enumerate(items) if j >= 0}
    return [p for p, _, _ in items], [sp for _, sp, _ in items], [where[j] for j in range(len(mine))]


class Case:
    """One model and its prompts: the reference answers computed once, engines built on demand."""

    def __init__(self, model: Path, prompts: list[Prompt], others: list[Prompt], **options: object) -> None:
        self.model, self.prompts, self.others, self.options = model, prompts, others, options
        self.reference = _alone(self.engine(enable_prefix_caching=False, max_num_batched_tokens=2048), prompts)

    def engine(self, **options: object) -> LLM:
        return LLM(self.model, **{"kv_cache_memory_bytes": 96 << 20, **self.options, **options})

    def run(self, how: str, llm: LLM, seed: int = 0, others: bool = False) -> None:
        if others:
            requests, params, where = _shuffled_among(self.prompts, self.others, seed)
            got = _answers(llm, requests, params)
            _check(self.reference, self.prompts, [got[k] for k in where], how)
        else:
            _check(self.reference, self.prompts, _answers(llm, *_requests(self.prompts)), how)


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> Case:
    torch.set_num_threads(1)
    return Case(smollm2_gguf, list(SMOLLM_PROMPTS), list(SMOLLM_OTHERS))


SCENARIOS: dict[str, Callable[[Case], None]] = {
    "all together": lambda c: c.run("all together", c.engine()),
    "shuffled among others, chunked prefill": lambda c: c.run(
        "shuffled, chunks of 16", c.engine(max_num_batched_tokens=16), seed=1, others=True),
    "a warm prefix cache": lambda c: [c.run(f"pass {k}", llm) for llm in [c.engine()] for k in (1, 2)],  # type: ignore[func-returns-value]
    "speculation": lambda c: c.run("4 speculative tokens", c.engine(num_speculative_tokens=4), seed=2, others=True),
    "two threads": lambda c: c.run("two threads", c.engine(num_threads=2), seed=3, others=True),
    "few sequences at a time": lambda c: c.run("max_num_seqs 3", c.engine(max_num_seqs=3), seed=4, others=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_smollm2_default_weights_answer_each_prompt_as_alone(smollm2: Case, scenario: str) -> None:
    SCENARIOS[scenario](smollm2)


@pytest.mark.slow
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**16),
    chunk=st.sampled_from([16, 48, 512]),
    seqs=st.sampled_from([2, 5, 64]),
    speculate=st.sampled_from([0, 3]),
    subset=st.sets(st.integers(0, len(SMOLLM_PROMPTS) - 1), min_size=1),
)
def test_smollm2_random_compositions(smollm2: Case, seed: int, chunk: int, seqs: int, speculate: int,
                                     subset: set[int]) -> None:  # fmt: skip
    """A random subset of the prompts, interleaved at random with others, under a random step budget, batch
    width and speculation: every answer is its reference."""
    idx = sorted(subset)
    case = Case.__new__(Case)
    case.model, case.options = smollm2.model, smollm2.options
    case.prompts = [smollm2.prompts[i] for i in idx]
    case.others = random.Random(seed).sample(smollm2.others, k=seed % len(smollm2.others))
    case.reference = {(k, s): smollm2.reference[(i, s)] for k, i in enumerate(idx) for s in (False, True)}
    llm = case.engine(max_num_batched_tokens=chunk, max_num_seqs=seqs, num_speculative_tokens=speculate)
    case.run(f"chunk {chunk}, {seqs} seqs, {speculate} drafts", llm, seed=seed, others=True)


@pytest.mark.slow
def test_smollm2_without_the_native_int4_kernel(smollm2_gguf: Path) -> None:
    """Prompt rows and decode rows take different matmuls there; each prompt is still answered as alone,
    including a prompt that continues an earlier answer (its generated blocks in the prefix cache were computed
    as decode rows: they must not stand in for prompt rows)."""
    prompts: list[Prompt] = list(SMOLLM_PROMPTS[:4])
    # the engine as on a CPU without AVX512-BF16: torch's int4 kernel, prompt rows through the dense GEMM
    case = Case(smollm2_gguf, prompts, list(SMOLLM_OTHERS[:4]), kernels={"int4_matmul": "torch"})
    assert case.engine().runner.routes_prompt_rows
    case.run("all together", case.engine(max_num_batched_tokens=32), seed=5, others=True)
    llm = case.engine()
    first = _answers(llm, [prompts[0]], [_params(prompts[0], False)])[0]
    continued = llm.tokenizer.encode(str(prompts[0]), add_special_tokens=False) + first[0]  # type: ignore[union-attr]
    after_cache = _answers(llm, [continued], [_params(continued, False)])[0]
    fresh = _answers(case.engine(enable_prefix_caching=False), [continued], [_params(continued, False)])[0]
    assert after_cache == fresh


def _random_prompts(vocab: int, seed: int, count: int) -> list[Prompt]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(5, 90))] for _ in range(count)]


@pytest.fixture(scope="module")
def llama_1b_shaped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("llama-1b")
    yield save_random_model(folder, "llama-3.2-1b", num_hidden_layers=2, weight_std=0.04)
    shutil.rmtree(folder, ignore_errors=True)  # 1.5 GB


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["auto", "int4"])  # auto: the checkpoint's float32
def test_llama_1b_shaped_answers_each_prompt_as_alone(llama_1b_shaped: Path, weights: str) -> None:
    torch.set_num_threads(1)
    vocab = 128256
    case = Case(llama_1b_shaped, _random_prompts(vocab, 1, 4), _random_prompts(vocab, 2, 3), weights=weights)
    case.run("all together", case.engine())
    case.run("shuffled, chunks of 16, 3 drafts", case.engine(max_num_batched_tokens=16, num_speculative_tokens=3),
             seed=6, others=True)  # fmt: skip
    case.run("two threads", case.engine(num_threads=2), seed=7, others=True)
