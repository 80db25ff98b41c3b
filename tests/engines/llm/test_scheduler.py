"""Token-budget scheduler: budgets, ordering, chunked prefill, preemption, watermark, finishing, aborts."""

from __future__ import annotations

import pytest

from sluice.engines.llm.core.kv_cache import KVCacheManager
from sluice.engines.llm.core.request import Request, RequestStatus, SamplingParams
from sluice.engines.llm.core.scheduler import Scheduler, SchedulerOutput

S = RequestStatus


def make(num_blocks: int = 64, block_size: int = 4, caching: bool = True, **kwargs: int | None) -> Scheduler:
    kwargs.setdefault("max_num_seqs", 8)
    kwargs.setdefault("max_num_batched_tokens", 32)
    return Scheduler(KVCacheManager(num_blocks, block_size, enable_prefix_caching=caching), **kwargs)


def req(name: str, num_prompt: int, max_tokens: int = 4, first: int = 1) -> Request:
    return Request(name, list(range(first, first + num_prompt)), SamplingParams(max_tokens=max_tokens))


def step(
    scheduler: Scheduler, finish: dict[str, RequestStatus] | None = None
) -> tuple[SchedulerOutput, list]:
    """One engine step with a model that always samples token 7."""
    out = scheduler.schedule()
    sampled = {item.request.request_id: [7] for item in out.scheduled if item.completes}
    return out, scheduler.update(out, sampled, finish or {})


def shares(out: SchedulerOutput) -> dict[str, int]:
    return {item.request.request_id: item.num_new_tokens for item in out.scheduled}


def run_to_end(scheduler: Scheduler, max_steps: int = 1000) -> list[SchedulerOutput]:
    outputs = []
    while scheduler.has_unfinished():
        assert len(outputs) < max_steps
        outputs.append(step(scheduler)[0])
    return outputs


def test_chunked_prefill_spreads_a_long_prompt_over_steps() -> None:
    scheduler = make(num_blocks=64, max_num_batched_tokens=32)
    long = req("long", 100, max_tokens=3)
    scheduler.add(long)
    chunks = [shares(step(scheduler)[0])["long"] for _ in range(4)]
    assert chunks == [32, 32, 32, 4]
    assert long.output_token_ids == [7]  # sampled only once the whole prompt was computed
    assert [shares(step(scheduler)[0])["long"] for _ in range(2)] == [1, 1]
    assert long.status == S.FINISHED_LENGTH and long.output_token_ids == [7, 7, 7]


def test_running_requests_go_first_and_the_budget_holds_every_step() -> None:
    scheduler = make(max_num_batched_tokens=10)
    scheduler.add(req("a", 3, max_tokens=20))
    step(scheduler)  # a computes its prompt and starts decoding
    scheduler.add(req("b", 30, max_tokens=2))
    out, _ = step(scheduler)
    assert [item.request.request_id for item in out.scheduled] == ["a", "b"]
    assert shares(out) == {"a": 1, "b": 9}
    for out in run_to_end(scheduler):
        assert out.num_batched_tokens == sum(shares(out).values()) <= 10


def test_long_prefill_threshold_caps_one_requests_chunk() -> None:
    scheduler = make(max_num_batched_tokens=32, long_prefill_token_threshold=8)
    scheduler.add(req("a", 20))
    scheduler.add(req("b", 20, first=50))
    assert shares(step(scheduler)[0]) == {"a": 8, "b": 8}


def test_max_num_seqs_limits_running_requests() -> None:
    scheduler = make(max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(5):
        scheduler.add(req(f"r{i}", 3, max_tokens=3, first=10 * i))
    out, _ = step(scheduler)
    assert sorted(shares(out)) == ["r0", "r1"] and scheduler.num_running == 2 and scheduler.num_waiting == 3
    for out in run_to_end(scheduler):
        assert len(out.scheduled) <= 2 and scheduler.num_running <= 2


def test_preemption_evicts_the_most_recently_admitted_which_later_completes() -> None:
    # 6 blocks of 4: three requests of 8 prompt tokens (2 blocks each) fill the pool; the first to need a
    # third block forces a preemption, and the victim must be the last admitted, c.
    scheduler = make(
        num_blocks=6, block_size=4, watermark_blocks=0, max_num_batched_tokens=64, max_num_seqs=3
    )
    a, b, c = (
        req("a", 8, max_tokens=6),
        req("b", 8, max_tokens=6, first=20),
        req("c", 8, max_tokens=6, first=40),
    )
    d = req("d", 3, first=60)  # waits for a free seat
    for request in (a, b, c, d):
        scheduler.add(request)
    step(scheduler)  # all three prefill: 6 blocks used, each now has 9 tokens and must compute position 8
    out, _ = step(scheduler)
    assert out.preempted == [c]
    assert c.status == S.PREEMPTED and c.num_computed_tokens == 0 and c.block_ids == []
    assert list(scheduler.waiting) == [c, d] and c.num_preemptions == 1  # c goes back to the front
    assert sorted(shares(out)) == ["a", "b"]
    num_generated = len(c.output_token_ids)
    run_to_end(scheduler)
    # Readmitted later, c recomputes prompt + output so far and finishes with all its tokens.
    assert c.status == S.FINISHED_LENGTH and len(c.output_token_ids) == 6 >= num_generated
    assert a.status == b.status == d.status == S.FINISHED_LENGTH
    assert scheduler.kv.num_free_blocks == 6


def test_nothing_is_admitted_in_a_step_that_preempted() -> None:
    scheduler = make(num_blocks=4, block_size=4, watermark_blocks=0, max_num_batched_tokens=64)
    scheduler.add(req("a", 8, max_tokens=6))
    scheduler.add(req("b", 8, max_tokens=6, first=20))
    step(scheduler)
    scheduler.add(req("new", 1, first=90))
    out, _ = step(scheduler)
    assert out.preempted and "new" not in shares(out)


def watermark_preemptions(watermark_blocks: int) -> int:
    # Requests keep arriving; each grows from 3 to 5 blocks. Admitting into the last free blocks means a
    # running request soon finds none and someone is evicted and recomputed.
    scheduler = make(num_blocks=16, block_size=4, max_num_seqs=64, max_num_batched_tokens=256,
                     watermark_blocks=watermark_blocks)  # fmt: skip
    requests = [req(f"r{i}", 12, max_tokens=8, first=20 * i) for i in range(16)]
    for index in range(200):
        if index % 2 == 0 and index // 2 < len(requests):
            scheduler.add(requests[index // 2])
        if not scheduler.has_unfinished() and index > 32:
            break
        step(scheduler)
    assert all(r.status == S.FINISHED_LENGTH and len(r.output_token_ids) == 8 for r in requests)
    return scheduler.num_preemptions


def test_admission_reserve_prevents_thrash() -> None:
    without, with_reserve = watermark_preemptions(0), watermark_preemptions(2)
    assert with_reserve * 3 <= without, (with_reserve, without)


def test_engine_stop_and_length_limits_finish_requests() -> None:
    scheduler = make(max_model_len=12)
    stopped, capped, limited = req("s", 3, max_tokens=10), req("c", 10, max_tokens=100, first=20), req("l", 3)
    for request in (stopped, capped, limited):
        scheduler.add(request)
    _, finished = step(scheduler, finish={"s": S.FINISHED_STOPPED})
    assert finished == [stopped] and stopped.status == S.FINISHED_STOPPED and stopped.block_ids == []
    while scheduler.has_unfinished():
        out = scheduler.schedule()
        for item in out.scheduled:  # never a position at or past the request's length
            assert item.request.num_computed_tokens + item.num_new_tokens < scheduler.max_len(item.request)
        scheduler.update(out, {item.request.request_id: [7] for item in out.scheduled if item.completes}, {})
    assert capped.status == S.FINISHED_LENGTH and capped.num_tokens == 12  # max_model_len
    assert limited.status == S.FINISHED_LENGTH and len(limited.output_token_ids) == 4  # max_tokens


def test_a_prompt_as_long_as_max_model_len_gets_one_token() -> None:
    scheduler = make(max_model_len=8)
    request = req("r", 8, max_tokens=5)
    scheduler.add(request)
    run_to_end(scheduler)
    assert request.output_token_ids == [7] and request.status == S.FINISHED_LENGTH


def test_a_shared_prompt_skips_the_cached_part() -> None:
    scheduler = make(block_size=4)
    scheduler.add(req("a", 10))
    step(scheduler)
    second = req("b", 10)
    scheduler.add(second)
    assert shares(step(scheduler)[0])["b"] == 10 - 8 and second.num_cached_tokens == 8
    assert scheduler.kv.stats.num_hit_tokens == 8


@pytest.mark.parametrize(
    ("max_model_len", "prompt", "max_tokens", "message"),
    [
        (16, 20, 1, "prompt has 20 tokens, more than max_model_len=16"),
        (None, 8, 200, "needs 52 KV blocks but the cache has only 32"),
        (None, 200, 1, "needs 50 KV blocks but the cache has only 32"),
    ],
)
def test_requests_that_can_never_run_are_rejected(
    max_model_len: int | None, prompt: int, max_tokens: int, message: str
) -> None:
    scheduler = make(num_blocks=32, block_size=4, max_model_len=max_model_len)
    with pytest.raises(ValueError, match=message):
        scheduler.add(req("r", prompt, max_tokens=max_tokens))
    assert not scheduler.has_unfinished()


def test_max_model_len_bounds_the_blocks_a_request_can_need() -> None:
    scheduler = make(num_blocks=4, block_size=4, max_model_len=16)
    request = req("r", 8, max_tokens=200)  # 207 positions, but never more than 16: fits in 4 blocks
    scheduler.add(request)
    run_to_end(scheduler)
    assert request.num_tokens == 16 and request.status == S.FINISHED_LENGTH


def test_duplicate_ids_are_rejected() -> None:
    scheduler = make()
    scheduler.add(req("r", 3))
    with pytest.raises(ValueError, match="already in use"):
        scheduler.add(req("r", 3))


def test_abort_frees_blocks_in_any_state_and_mid_step() -> None:
    scheduler = make(num_blocks=16, max_num_seqs=1)
    running, waiting, mid = req("run", 6, max_tokens=20), req("wait", 6), req("mid", 6, first=30)
    scheduler.add(running)
    scheduler.add(waiting)
    step(scheduler)
    assert scheduler.abort("wait") is waiting and waiting.status == S.FINISHED_ABORTED
    assert scheduler.abort("run") is running and running.block_ids == []
    assert scheduler.kv.num_free_blocks == 16 and scheduler.abort("run") is None
    scheduler.add(mid)
    out = scheduler.schedule()
    scheduler.abort("mid")  # while the model runs
    assert scheduler.update(out, {"mid": [7]}, {}) == []  # its sample is ignored
    assert mid.output_token_ids == [] and not scheduler.has_unfinished()


def test_update_rejects_samples_that_do_not_match_the_step() -> None:
    scheduler = make(max_num_batched_tokens=4)
    scheduler.add(req("long", 10))
    out = scheduler.schedule()  # a 4-token chunk: no token may be sampled yet
    with pytest.raises(ValueError, match="sampled"):
        scheduler.update(out, {"long": [7]}, {})
    assert scheduler.update(out, {}, {}) == []
    assert scheduler.requests["long"].num_computed_tokens == 4


def test_an_output_cannot_be_applied_twice() -> None:
    scheduler = make()
    scheduler.add(req("r", 5, max_tokens=3))
    out = scheduler.schedule()
    scheduler.update(out, {"r": [7]}, {})
    with pytest.raises(ValueError, match="stale"):
        scheduler.update(out, {"r": [7]}, {})
    assert scheduler.requests["r"].output_token_ids == [7]


def test_a_request_growing_past_recompute_past_len_is_recomputed_once_under_its_own_salt() -> None:
    """LongRoPE: K/V computed while a request was at most 8 tokens long is dropped when it grows past 8."""
    scheduler = make(block_size=4, recompute_past_len=8)
    short = req("short", 6, max_tokens=6)
    scheduler.add(short)
    shares_per_step = [shares(step(scheduler)[0]).get("short") for _ in range(6)]
    # prompt (6), decode to 7 and 8 tokens, then at 9 tokens all 8 computed positions are recomputed
    assert shares_per_step[:4] == [6, 1, 1, 9]
    assert scheduler.num_recomputes == 1 and scheduler.num_preemptions == 0
    assert short.cache_salt and short.num_preemptions == 0
    assert shares_per_step[4:] == [1, 1] and short.status == S.FINISHED_LENGTH


def test_long_prompts_are_salted_at_admission_and_share_only_with_each_other() -> None:
    scheduler = make(block_size=4, recompute_past_len=8)
    first, second, short = req("first", 12, max_tokens=1), req("second", 12, max_tokens=1), req("short", 8, 1)
    for r in (first, short):
        scheduler.add(r)
    run_to_end(scheduler)
    assert first.cache_salt and not short.cache_salt and short.num_cached_tokens == 0  # same 8 tokens, no hit
    scheduler.add(second)
    run_to_end(scheduler)
    assert second.num_cached_tokens == 8  # the long-context blocks of `first`


def test_drafts_never_cross_recompute_past_len() -> None:
    from sluice.engines.llm.core.speculation import Drafter

    scheduler = make(block_size=4, recompute_past_len=10, drafter=Drafter(4, adaptive=False))
    r = Request("r", [1, 7, 3, 4, 5, 6], SamplingParams(max_tokens=8))  # the model's 7 recurs: drafts 3, 4, 5, 6
    scheduler.add(r)
    step(scheduler)
    out = scheduler.schedule()
    [item] = out.scheduled
    assert item.draft_token_ids == [3, 4, 5]  # 7 tokens + 3 drafts reach the length, a 4th would pass it
