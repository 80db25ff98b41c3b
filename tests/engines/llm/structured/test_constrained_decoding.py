"""Constrained decoding through the whole engine, on the tiny random Llama (one character per token, no EOS).

The parity rule: a constraint that accepts a request's own greedy answer must reproduce it token for token
(masking never changes an allowed argmax) -- with requests of other grammars and unconstrained ones in the
same batch, with speculative decoding, and through the kernel attention path.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from sluice.engines.llm import LLM, RequestOutput, SamplingParams, StructuredOutput
from sluice.engines.llm.structured.backend import BitmaskRow, GrammarMatcher, TokenTable
from sluice.engines.llm.structured.llguidance_backend import LLGuidanceBackend
from tests.support.grammar import excluding_regex, literal_regex

MAX_TOKENS = 20
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tag": {"enum": ["red", "green"]}},
          "required": ["id", "tag"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir: Callable[[bool], Path]) -> Path:
    return tiny_llama_dir(False)


def prompts(num: int, seed: int) -> list[list[int]]:
    """Random prompts, some with a repeated phrase (so that speculation finds n-gram drafts)."""
    rng = random.Random(seed)
    out = []
    for i in range(num):
        noise = [rng.randrange(256) for _ in range(rng.randint(3, 30))]
        phrase = [rng.randrange(256) for _ in range(rng.randint(2, 6))]
        out.append(noise + phrase * 3 + noise[:4] if i % 2 else noise)
    return out


def accepting(plain: Sequence[RequestOutput], seed: int) -> list[SamplingParams]:
    """For each plain greedy answer, a constraint that accepts it: its literal text, or a character class
    that excludes 60 other characters at every position."""
    rng = random.Random(seed)
    alphabet = [chr(c) for c in range(32, 127)] + [chr(0x100 + i) for i in range(161)]
    params = []
    for i, out in enumerate(plain):
        if i % 2:
            regex = literal_regex(out.text)
        else:
            others = [c for c in alphabet if c not in out.text]
            regex = excluding_regex(out.text, rng.sample(others, 60))
        params.append(SamplingParams(max_tokens=MAX_TOKENS, structured_output=StructuredOutput(regex=regex)))
    return params


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_constraints_that_accept_the_greedy_answer_reproduce_it_in_a_mixed_batch(tiny: Path, backend: str) -> None:
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24, structured_output_backend=backend)
    batch = prompts(12, seed=1)
    plain = llm.generate(batch, SamplingParams(max_tokens=MAX_TOKENS))
    params = accepting(plain, seed=2)
    kinds = ["regex"] * 12
    for i in range(0, 12, 4):  # every fourth request: another grammar, or none at all
        kinds[i] = ["choice", "json", "none"][i // 4]
        # (the JSON answer needs room: one character per token, at least 22 of them)
        params[i] = SamplingParams(max_tokens=MAX_TOKENS if kinds[i] != "json" else 120, structured_output={
            "choice": StructuredOutput(choice=["yes", "no", "maybe so"]),
            "json": StructuredOutput(json_schema=SCHEMA), "none": None}[kinds[i]])  # type: ignore[arg-type]
    got = llm.generate(batch, params)
    for kind, g, p in zip(kinds, got, plain, strict=True):
        if kind in ("regex", "none"):
            assert g.token_ids == p.token_ids
        elif kind == "choice":
            assert g.text in ("yes", "no", "maybe so") and g.finish_reason == "stop"
        else:
            assert g.finish_reason == "stop"
            jsonschema.validate(json.loads(g.text), SCHEMA)
    s = llm.stats
    assert s.structured is not None and s.structured.num_mask_steps > 0
    assert s.structured_share == pytest.approx(11 / 24)  # 11 of the 24 requests added were constrained
    assert llm.kv.num_free_blocks == llm.kv.num_blocks


def test_the_mask_is_applied_where_the_greedy_token_is_not_allowed(tiny: Path) -> None:
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24)
    [plain] = llm.generate([prompts(1, seed=3)[0]], SamplingParams(max_tokens=8))
    banned = plain.text[0]
    regex = excluding_regex("x" * 8, [banned]) if banned != "x" else excluding_regex("y" * 8, [banned])
    [got] = llm.generate([prompts(1, seed=3)[0]], SamplingParams(max_tokens=8, structured_output={"regex": regex}))  # type: ignore[arg-type]
    assert banned not in got.text and len(got.token_ids) == 8 and got.finish_reason == "stop"


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_speculative_decoding_keeps_constrained_outputs(tiny: Path, backend: str) -> None:
    batch = prompts(10, seed=4)
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24, num_speculative_tokens=4, speculative_adaptive=False,
              structured_output_backend=backend)
    drafter, llm.scheduler.drafter = llm.scheduler.drafter, None  # one model: a plain run first
    plain = llm.generate(batch, SamplingParams(max_tokens=MAX_TOKENS))
    params = accepting(plain, seed=5)
    llm.scheduler.drafter = drafter
    got = llm.generate(batch, params)
    assert [g.token_ids for g in got] == [p.token_ids for p in plain]
    assert llm.stats.num_accepted_draft_tokens > 0  # literal regexes force their text: forced drafts
    assert llm.kv.num_free_blocks == llm.kv.num_blocks


def test_kernel_attention_path_keeps_constrained_outputs(tiny: Path) -> None:
    batch = prompts(6, seed=6)
    plain = LLM(tiny, kv_cache_memory_bytes=1 << 24).generate(batch, SamplingParams(max_tokens=MAX_TOKENS))
    # padded block tables -> kernels.paged_attention (CUDA's path)
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24, kernels={"cpu_attention": "paged"})
    got = llm.generate(batch, accepting(plain, seed=7))
    assert [g.token_ids for g in got] == [p.token_ids for p in plain]


class _Gated:
    """llguidance, with compiles held until ``gate`` opens."""

    name = "gated"

    def __init__(self, table: TokenTable, gate: threading.Event) -> None:
        self.inner = LLGuidanceBackend(table)
        self.bitmask_words = self.inner.bitmask_words
        self.check = self.inner.check
        self.gate = gate

    def compile(self, spec: StructuredOutput) -> Any:
        self.gate.wait(30)
        return self.inner.compile(spec)

    def matcher(self, compiled: Any) -> GrammarMatcher:
        return self.inner.matcher(compiled)

    def fill_bitmask(self, rows: Sequence[BitmaskRow], bitmask: Any) -> None:
        self.inner.fill_bitmask(rows, bitmask)


def test_a_request_waits_for_its_grammar_while_the_others_step_on(tiny: Path) -> None:
    gate = threading.Event()
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24, structured_output_backend=lambda t: _Gated(t, gate))  # type: ignore[arg-type, return-value]
    waiting = llm.add_request(prompts(1, seed=8)[0], SamplingParams(max_tokens=6, structured_output={"regex": "[a-c]{6}"}))  # type: ignore[arg-type]
    free = llm.add_request(prompts(1, seed=9)[0], SamplingParams(max_tokens=6))
    done: dict[str, RequestOutput] = {}
    for _ in range(20):
        done.update((o.request_id, o) for o in llm.step())
        if free in done:
            break
    assert free in done and waiting not in done  # the unconstrained request finished meanwhile
    assert waiting not in llm.scheduler.requests and llm.has_unfinished()
    gate.set()
    while llm.has_unfinished():
        done.update((o.request_id, o) for o in llm.step())
    assert len(done[waiting].text) == 6 and set(done[waiting].text) <= set("abc")


def test_abort_while_waiting_for_the_grammar(tiny: Path) -> None:
    gate = threading.Event()
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24, structured_output_backend=lambda t: _Gated(t, gate))  # type: ignore[arg-type, return-value]
    rid = llm.add_request([1, 2, 3], SamplingParams(structured_output={"regex": "a+"}))  # type: ignore[arg-type]
    assert llm.abort(rid) and not llm.has_unfinished() and not llm.abort(rid)
    gate.set()
    assert llm.step() == []


def test_unusable_grammars_finish_with_an_error_and_the_batch_goes_on(tiny: Path) -> None:
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24)
    bad, good, cut = llm.generate(
        [[5, 6, 7], [8, 9], [10, 11, 12]],
        [SamplingParams(structured_output={"regex": "[a-z"}),  # type: ignore[arg-type]
         SamplingParams(max_tokens=5, structured_output={"choice": ["hello"]}),  # type: ignore[arg-type]
         SamplingParams(max_tokens=3, structured_output={"regex": "[0-9]{10}"})],  # type: ignore[arg-type]
    )  # fmt: skip
    assert bad.finish_reason == "error" and bad.token_ids == []
    assert bad.error is not None and "regex cannot be used" in bad.error and "unclosed" in bad.error
    assert good.text == "hello" and good.finish_reason == "stop"
    assert cut.finish_reason == "length" and len(cut.text) == 3 and cut.text.isdigit()
    assert llm.stats.structured is not None and llm.stats.structured.num_grammar_errors == 1


def test_one_compile_serves_every_request_with_the_same_constraint(tiny: Path) -> None:
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24)
    outs = llm.generate(prompts(8, seed=10), SamplingParams(max_tokens=4, structured_output={"choice": ["ab", "cd"]}))  # type: ignore[arg-type]
    assert {o.text for o in outs} <= {"ab", "cd"}
    stats = llm.stats.structured
    assert stats is not None and (stats.num_grammars_compiled, stats.num_grammar_cache_hits) == (1, 7)


def test_preemption_and_aborts_keep_constrained_outputs_and_free_every_block(tiny: Path) -> None:
    batch = prompts(8, seed=13)
    big = LLM(tiny, kv_cache_memory_bytes=1 << 24)
    params = accepting(big.generate(batch, SamplingParams(max_tokens=40)), seed=14)
    for p in params:
        p.max_tokens = 40
    expected = [o.token_ids for o in big.generate(batch, params)]
    # 3 layers * 2 * 16 tokens * 2 heads * 16 dims * 4 bytes = 12 KiB per block; 8 blocks hold ~2 requests.
    small = LLM(tiny, kv_cache_memory_bytes=8 * 12 * 1024)
    ids = [small.add_request(p, sp) for p, sp in zip(batch, params, strict=True)]
    done: dict[str, list[int]] = {}
    num_steps = 0
    while small.has_unfinished():
        done.update((o.request_id, o.token_ids) for o in small.step())
        num_steps += 1
        if num_steps == 5:
            assert small.abort(ids[-1])  # aborted while it runs or waits for room
    assert small.stats.num_preemptions > 0
    assert [done[i] for i in ids[:-1]] == expected[:-1]
    assert small.kv.num_free_blocks == small.kv.num_blocks


def test_sampled_answers_stay_inside_the_grammar(tiny: Path) -> None:
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24)
    labels = ["alpha", "beta", "gamma delta"]
    params = [SamplingParams(max_tokens=12, temperature=2.0, top_p=0.95, seed=i,
                             structured_output=StructuredOutput(choice=labels)) for i in range(16)]
    outs = llm.generate(prompts(16, seed=15), params)
    assert all(o.text in labels and o.finish_reason == "stop" for o in outs)
    assert len({o.text for o in outs}) > 1  # sampling picks among the allowed answers
    again = llm.generate(prompts(16, seed=15), params)
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]  # seeded: reproducible


class _FailingMatcher:
    """Wraps a real matcher; fails (as a grammar too complex for one step would) after ``budget`` tokens."""

    def __init__(self, inner: GrammarMatcher, budget: int) -> None:
        self.inner, self.budget, self.failed = inner, budget, False

    def accept(self, token_ids: Sequence[int]) -> bool:
        self.budget -= len(token_ids)
        self.failed = self.failed or self.budget < 0
        return not self.failed and self.inner.accept(token_ids)

    def error(self) -> str | None:
        return "step limit exceeded" if self.failed else self.inner.error()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _Failing(_Gated):
    def matcher(self, compiled: Any) -> GrammarMatcher:
        return _FailingMatcher(self.inner.matcher(compiled), budget=3)  # type: ignore[return-value]

    def fill_bitmask(self, rows: Sequence[BitmaskRow], bitmask: Any) -> None:
        self.inner.fill_bitmask([(m.inner, r, d) for m, r, d in rows], bitmask)  # type: ignore[attr-defined]


def test_a_matcher_failing_mid_answer_finishes_that_request_with_an_error(tiny: Path) -> None:
    gate = threading.Event()
    gate.set()
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24, structured_output_backend=lambda t: _Failing(t, gate))  # type: ignore[arg-type, return-value]
    failing, plain = llm.generate([[1, 2, 3], [4, 5, 6]], [
        SamplingParams(max_tokens=10, structured_output={"regex": "[a-z]{10}"}),  # type: ignore[arg-type]
        SamplingParams(max_tokens=10)])
    assert failing.finish_reason == "error" and failing.error == "structured output failed: step limit exceeded"
    assert len(failing.token_ids) == 4 and plain.finish_reason == "length" and len(plain.token_ids) == 10
    assert llm.kv.num_free_blocks == llm.kv.num_blocks


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_constrained_outputs_on_cuda_in_fp32(tiny: Path) -> None:
    """CUDA: pinned bitmasks copied to the device, the Triton mask kernel, Triton attention."""
    batch = prompts(8, seed=16)
    llm = LLM(tiny, kv_cache_memory_bytes=1 << 24, device="cuda", dtype="float32", num_speculative_tokens=3,
              speculative_adaptive=False)
    drafter, llm.scheduler.drafter = llm.scheduler.drafter, None
    plain = llm.generate(batch, SamplingParams(max_tokens=MAX_TOKENS))
    llm.scheduler.drafter = drafter
    got = llm.generate(batch, accepting(plain, seed=17))
    assert [g.token_ids for g in got] == [p.token_ids for p in plain]
