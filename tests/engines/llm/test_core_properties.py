"""Property tests of the LLM engine's pure core: scheduler + KV-cache manager under random workloads.

A fake "model" stands in for the network. It really uses the paged cache: computing position ``p`` writes
``(p, value_p)`` into slot ``block_ids[p // block_size] * block_size + p % block_size``, where
``value_p = mix(value_{p-1}, token_p)`` and ``value_{p-1}`` is *read back from the cache* through the block
table. The sampled token is derived from the value of the last position. So a wrong block table, a stale
prefix-cache hit, a lost block after preemption or a block shared by mistake changes the tokens, while a
correct core gives every request exactly the tokens of its own history, whatever the batch, the budget, the
pool size or the prefix cache.

With speculation on, the fake model also computes the draft positions (writing their values into the cache,
as the real model writes their K/V), samples a target at each, and the accepted run is what the real runner
would emit. Rejected drafts leave wrong values in their slots: a core that does not roll back the request's
computed length, or reuses those slots before recomputing them, changes the tokens.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import event, given, settings
from hypothesis import strategies as st

from sluice.engines.llm.core.kv_cache import KVCacheManager
from sluice.engines.llm.core.request import Request, RequestStatus, SamplingParams
from sluice.engines.llm.core.scheduler import Scheduler, SchedulerOutput
from sluice.engines.llm.core.speculation import Drafter, accept_drafts

VOCAB = 7  # small, so that prompts share prefixes and generated text repeats
STOP_TOKEN = 0
MAX_STEPS = 20_000  # far above any workload here: reaching it means the core stopped making progress


def mix(previous: int, token_id: int) -> int:
    """Deterministic 'attention': the state after one more token (Python's hash of int tuples is stable)."""
    return hash((previous, token_id, 0x5EED)) & 0xFFFF_FFFF


def sample_from(value: int) -> int:
    return (value >> 7) % VOCAB


class FakeModel:
    """Writes and reads K/V 'values' through the block tables, as a real model runner would."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.slots: dict[int, tuple[int, int]] = {}  # slot -> (position, value)

    def _slot(self, request: Request, position: int) -> int:
        return request.block_ids[position // self.block_size] * self.block_size + position % self.block_size

    def _read(self, request: Request, position: int) -> int:
        stored_position, value = self.slots[self._slot(request, position)]
        assert stored_position == position, f"{request.request_id}: slot of position {position} holds another"
        return value

    def execute(self, out: SchedulerOutput) -> dict[str, list[int]]:
        sampled: dict[str, list[int]] = {}
        for item in out.scheduled:
            request, drafts = item.request, item.draft_token_ids
            start = request.num_computed_tokens
            for position in range(start, start + item.num_new_tokens):
                previous = self._read(request, position - 1) if position else 0
                if position < request.num_tokens:
                    token_id = request.token_ids_in(position, position + 1)[0]
                else:
                    token_id = drafts[position - request.num_tokens]
                self.slots[self._slot(request, position)] = (position, mix(previous, token_id))
            if item.completes:
                last = request.num_tokens - 1
                targets = [sample_from(self._read(request, last + j)) for j in range(len(drafts) + 1)]
                sampled[request.request_id] = accept_drafts(drafts, targets)
        return sampled


def reference_output(prompt: list[int], max_tokens: int, stop: bool) -> list[int]:
    """What the fake model yields for a request computed alone, with no cache at all."""
    tokens = list(prompt)
    value = 0
    for token_id in tokens:
        value = mix(value, token_id)
    output: list[int] = []
    while True:
        new = sample_from(value)
        output.append(new)
        if len(output) == max_tokens or (stop and new == STOP_TOKEN):
            return output
        value = mix(value, new)


@dataclass
class Spec:
    prompt: list[int]
    max_tokens: int
    stop: bool
    arrival_step: int


@dataclass
class Config:
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int
    prefix_caching: bool
    watermark_blocks: int | None
    num_speculative_tokens: int = 0


def check_invariants(scheduler: Scheduler, out: SchedulerOutput | None) -> None:
    kv = scheduler.kv
    holders: Counter[int] = Counter()
    for request in scheduler.requests.values():
        assert not request.is_finished
        if request.status != RequestStatus.RUNNING:
            assert not request.block_ids and request.num_computed_tokens == 0
        assert len(set(request.block_ids)) == len(request.block_ids), "a block twice in one table"
        holders.update(request.block_ids)
    assert len(scheduler.running) <= scheduler.max_num_seqs
    assert {r.request_id for r in scheduler.running} | {r.request_id for r in scheduler.waiting} == set(
        scheduler.requests
    )
    # Ref count == number of tables holding the block; every block nobody holds is free (O(held) check:
    # the free queue holds only ref-0 blocks, so its size pins down the rest).
    for block_id, num_holders in holders.items():
        assert kv.ref_count(block_id) == num_holders, f"block {block_id}: ref count != holders"
    assert kv.num_free_blocks == kv.num_blocks - len(holders)
    # A block held twice must be a cached full block whose hash matches each holder's chain at that index.
    for request in scheduler.running:
        for index, block_id in enumerate(request.block_ids):
            if holders[block_id] > 1:
                assert kv.cached_hash(block_id) is not None, "uncached block shared between requests"
                assert kv.request_block_hashes(request, index + 1)[index] == kv.cached_hash(block_id)
    if out is not None:
        total = sum(item.num_new_tokens for item in out.scheduled)
        assert total == out.num_batched_tokens <= scheduler.max_num_batched_tokens
        assert len(out.scheduled) <= scheduler.max_num_seqs
        for item in out.scheduled:
            request = item.request
            num_drafts = len(item.draft_token_ids)
            assert item.num_new_tokens >= 1
            assert request.num_computed_tokens + item.num_new_tokens <= request.num_tokens + num_drafts
            # Drafts only for a decoding request, and never enough to emit past its max length.
            assert not num_drafts or request.num_computed_tokens == request.num_tokens - 1
            assert request.num_tokens + num_drafts < scheduler.max_len(request)
            assert len(request.block_ids) * kv.block_size >= request.num_computed_tokens + item.num_new_tokens
            assert request.num_tokens < request.max_num_tokens, "scheduled past its max length"
            assert request.num_cached_tokens < request.num_tokens, "a prefix hit covered the whole prompt"
    else:
        # Between steps a running request holds exactly the blocks of its computed positions: the blocks
        # of rejected drafts were given back.
        for request in scheduler.running:
            assert len(request.block_ids) == kv.num_blocks_for(request.num_computed_tokens)


def run_workload(
    specs: list[Spec], config: Config, aborts: dict[int, list[tuple[int, bool]]] | None = None
) -> tuple[dict[str, list[int]], Scheduler]:
    """Drive the core to completion; return each request's output and the scheduler."""
    kv = KVCacheManager(config.num_blocks, config.block_size, enable_prefix_caching=config.prefix_caching)
    scheduler = Scheduler(
        kv,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        watermark_blocks=config.watermark_blocks,
        drafter=Drafter(config.num_speculative_tokens, 3, 1, adaptive=False) if config.num_speculative_tokens else None,
    )
    model = FakeModel(config.block_size)
    requests = [
        Request(f"r{i}", spec.prompt, SamplingParams(max_tokens=spec.max_tokens))
        for i, spec in enumerate(specs)
    ]
    aborts = aborts or {}
    stops = {r.request_id for r, s in zip(requests, specs, strict=True) if s.stop}
    step = 0
    while step <= max(s.arrival_step for s in specs) or scheduler.has_unfinished():
        assert step < MAX_STEPS, "no progress"
        for request, spec in zip(requests, specs, strict=True):
            if spec.arrival_step == step:
                scheduler.add(request)
        mid_step_aborts = []
        for index, mid_step in aborts.get(step, []):
            if mid_step:
                mid_step_aborts.append(requests[index].request_id)
            elif scheduler.abort(requests[index].request_id) is not None:
                assert requests[index].status == RequestStatus.FINISHED_ABORTED
        out = scheduler.schedule()
        check_invariants(scheduler, out)
        sampled = model.execute(out)
        for request_id in mid_step_aborts:  # aborted while the model runs: update must skip them
            scheduler.abort(request_id)
        finish: dict[str, RequestStatus] = {}
        for rid, run in sampled.items():
            if rid in stops and STOP_TOKEN in run:  # the engine cuts a run after its first stop token
                sampled[rid] = run[: run.index(STOP_TOKEN) + 1]
                finish[rid] = RequestStatus.FINISHED_STOPPED
        finished = scheduler.update(out, sampled, finish)
        for request in finished:
            assert request.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)
            assert not request.block_ids
        check_invariants(scheduler, None)
        step += 1
    # Nothing leaks: every block is free again, no reference is left, no request is left unfinished.
    assert kv.num_free_blocks == kv.num_blocks and kv.usage == 0.0
    assert all(kv.ref_count(b) == 0 for b in range(kv.num_blocks))
    assert all(r.is_finished for r in requests)
    assert not scheduler.running and not scheduler.waiting and not scheduler.requests
    return {r.request_id: r.output_token_ids for r in requests}, scheduler


# ---- strategies --------------------------------------------------------------------------------------

tokens = st.integers(0, VOCAB - 1)


@st.composite
def workloads(draw: st.DrawFn, max_requests: int = 10) -> list[Spec]:
    # Prefix lengths around block boundaries (block sizes 1..16) so that shared full blocks are common.
    prefix_lengths = st.sampled_from([0, 3, 8, 16, 17, 33, 48])
    prefixes = draw(st.lists(prefix_lengths.flatmap(lambda n: st.lists(tokens, min_size=n, max_size=n)),
                             min_size=1, max_size=3))  # fmt: skip
    specs = []
    for _ in range(draw(st.sampled_from([1, 2, 4, max_requests // 2, max_requests]))):
        prompt = draw(st.sampled_from(prefixes)) + draw(st.lists(tokens, max_size=30))
        if not prompt:
            prompt = [draw(tokens)]
        specs.append(
            Spec(
                prompt,
                draw(st.integers(1, 40)),
                stop=draw(st.booleans()),
                arrival_step=draw(st.integers(0, 8)),
            )
        )
    return specs


def blocks_needed(spec: Spec, block_size: int) -> int:
    return -(-(len(spec.prompt) + spec.max_tokens - 1) // block_size)


@st.composite
def configs(draw: st.DrawFn, specs: list[Spec], speculative: bool = False) -> Config:
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    largest = max(blocks_needed(s, block_size) for s in specs)
    if draw(st.sampled_from([True, True, False])):  # tiny: the largest request barely fits alone
        num_blocks = largest + draw(st.integers(0, 3))
    else:
        num_blocks = sum(blocks_needed(s, block_size) for s in specs) + draw(st.integers(0, 20))
    return Config(
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(1, 64)),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 5, 16])),
        prefix_caching=draw(st.sampled_from([True, True, False])),  # on by default in the engine
        watermark_blocks=draw(st.sampled_from([None, 0, min(2, num_blocks - 1)])),
        num_speculative_tokens=draw(st.integers(1, 5)) if speculative else 0,
    )


# ---- properties --------------------------------------------------------------------------------------


def _check_no_leak_under_random_workloads(data: st.DataObject, speculative: bool) -> None:
    specs = data.draw(workloads())
    config = data.draw(configs(specs, speculative))
    aborts: dict[int, list[tuple[int, bool]]] = {}
    for _ in range(data.draw(st.integers(0, 4))):
        step = data.draw(st.integers(0, 60))
        aborts.setdefault(step, []).append(
            (data.draw(st.integers(0, len(specs) - 1)), data.draw(st.booleans()))
        )
    outputs, scheduler = run_workload(specs, config, aborts)
    event(f"preempted={scheduler.num_preemptions > 0} hits={scheduler.kv.stats.num_hit_tokens > 0}")
    if scheduler.drafter is not None:
        event(f"drafts accepted={scheduler.drafter.stats.num_accepted_tokens > 0}")
    for (request_id, output), spec in zip(outputs.items(), specs, strict=True):
        # Aborted requests stop early; every other one gets exactly its own reference tokens.
        expected = reference_output(spec.prompt, spec.max_tokens, spec.stop)
        assert output == expected[: len(output)], request_id
        assert len(output) <= spec.max_tokens


@settings(max_examples=500, deadline=None)
@given(data=st.data())
def test_no_leak_and_invariants_under_random_workloads(data: st.DataObject) -> None:
    _check_no_leak_under_random_workloads(data, speculative=False)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_no_leak_and_invariants_with_speculation(data: st.DataObject) -> None:
    """Drafts verified and rolled back under tiny pools (preemption), aborts mid-step, chunking, caching."""
    _check_no_leak_under_random_workloads(data, speculative=True)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_tokens_do_not_depend_on_chunking_caching_or_preemption(data: st.DataObject) -> None:
    specs = data.draw(workloads(max_requests=8))
    block_size = data.draw(st.sampled_from([2, 4, 16]))
    largest = max(blocks_needed(s, block_size) for s in specs)
    huge = Config(4096, block_size, 64, 100_000, 0, prefix_caching=False, watermark_blocks=None)
    variants = [
        huge,  # unchunked, no cache, no pressure
        Config(
            4096, block_size, 64, data.draw(st.integers(1, 12)), data.draw(st.sampled_from([0, 3])), False, 0
        ),
        Config(4096, block_size, 64, 100_000, 0, prefix_caching=True, watermark_blocks=None),
        Config(largest + data.draw(st.integers(0, 2)), block_size, 8, 64, 0, True, 0),  # tiny: preempts
    ]
    results = []
    for name, config in zip(["unchunked", "chunked", "cached", "tiny"], variants, strict=True):
        outputs, scheduler = run_workload(specs, config)
        results.append(outputs)
        event(
            f"{name}: preempted={scheduler.num_preemptions > 0} hits={scheduler.kv.stats.num_hit_tokens > 0}"
        )
    expected = {f"r{i}": reference_output(s.prompt, s.max_tokens, s.stop) for i, s in enumerate(specs)}
    for outputs in results:
        assert outputs == expected


def test_tiny_pool_really_preempts_and_still_matches() -> None:
    # Four long generations in a pool that holds about two: preemption must happen, tokens must not change.
    specs = [Spec([1, 2, 3, 4, 5, 6, 7 % VOCAB, i], 40, stop=False, arrival_step=0) for i in range(4)]
    tiny = Config(num_blocks=12, block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
                  long_prefill_token_threshold=0, prefix_caching=True, watermark_blocks=0)  # fmt: skip
    huge = Config(1000, 4, 4, 64, 0, prefix_caching=False, watermark_blocks=0)
    tiny_outputs, scheduler = run_workload(specs, tiny)
    huge_outputs, _ = run_workload(specs, huge)
    assert scheduler.num_preemptions > 0
    assert tiny_outputs == huge_outputs


def test_speculation_accepts_drafts_and_keeps_tokens_under_preemption() -> None:
    # Repetitive prompts: the n-gram drafter proposes, some drafts are accepted, others rolled back, while a
    # pool of about two requests' worth preempts. Tokens must be those of the plain run.
    specs = [Spec([1, 2, 3, 1, 2, 3, 1, 2, i % VOCAB], 40, stop=False, arrival_step=i % 3) for i in range(6)]
    tiny = Config(num_blocks=28, block_size=4, max_num_seqs=6, max_num_batched_tokens=64,
                  long_prefill_token_threshold=0, prefix_caching=True, watermark_blocks=0,
                  num_speculative_tokens=4)  # fmt: skip
    huge = Config(1000, 4, 6, 64, 0, prefix_caching=False, watermark_blocks=0)
    spec_outputs, scheduler = run_workload(specs, tiny)
    plain_outputs, _ = run_workload(specs, huge)
    assert scheduler.drafter is not None
    stats = scheduler.drafter.stats
    assert scheduler.num_preemptions > 0
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert spec_outputs == plain_outputs
