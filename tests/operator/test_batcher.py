"""The batcher's guarantees, driven by a fake clock (plain floats)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.operator.batcher import Batcher, BatchPolicy


def test_closes_by_size_before_the_delay() -> None:
    b: Batcher[int] = Batcher(BatchPolicy(max_batch_size=3, max_queue_delay_s=1.0))
    for i in range(4):
        b.add(i, now=0.0)
    assert b.next_batch(now=0.0) == [0, 1, 2]
    assert b.next_batch(now=0.5) is None  # one left, not due yet
    assert b.next_deadline() == 1.0
    assert b.next_batch(now=1.0) == [3]


def test_closes_by_time_from_the_oldest_record() -> None:
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=100, max_queue_delay_s=0.010))
    b.add("a", now=0.000)
    b.add("b", now=0.008)
    assert b.next_batch(now=0.009) is None
    assert b.next_batch(now=0.010) == ["a", "b"]  # 'b' leaves early with the oldest
    assert b.next_batch(now=1.0) is None


def test_keeps_filling_while_the_engine_is_busy() -> None:
    # The runner asks only when the engine is idle; by then the batch has grown past the first records.
    b: Batcher[int] = Batcher(BatchPolicy(max_batch_size=64, max_queue_delay_s=0.005))
    for i in range(40):
        b.add(i, now=i * 0.001)  # the engine is busy for 40 ms
    assert b.next_batch(now=0.040) == list(range(40))


def test_zero_delay_means_every_record_is_due_at_once() -> None:
    b: Batcher[int] = Batcher(BatchPolicy(max_batch_size=8, max_queue_delay_s=0.0))
    b.add(1, now=5.0)
    assert b.next_batch(now=5.0) == [1]


def test_length_buckets_group_similar_lengths() -> None:
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=2, max_queue_delay_s=1.0, bucket_by_length=True,
                                          bucket_width=16))
    b.add("short1", now=0.0, length=5)
    b.add("long1", now=0.0, length=200)
    b.add("short2", now=0.0, length=9)
    b.add("long2", now=0.0, length=195)
    assert b.next_batch(now=0.0) == ["short1", "short2"]
    assert b.next_batch(now=0.0) == ["long1", "long2"]


def test_token_budget_caps_padded_size_and_a_long_record_goes_alone() -> None:
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=100, max_queue_delay_s=0.0, max_batch_tokens=100))
    for i in range(10):
        b.add(f"s{i}", now=0.0, length=10)
    b.add("huge", now=0.0, length=500)
    assert b.next_batch(now=0.0) == [f"s{i}" for i in range(10)]  # 10 x 10 = 100 tokens
    assert b.next_batch(now=0.0) == ["huge"]  # over budget on its own: still served, alone


def test_expired_bucket_is_topped_up_with_neighbouring_lengths() -> None:
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=3, max_queue_delay_s=0.01, bucket_by_length=True,
                                          bucket_width=8))
    b.add("a", now=0.0, length=4)     # bucket 1
    b.add("far", now=0.0, length=100)  # bucket 13
    b.add("near", now=0.0, length=12)  # bucket 2
    assert b.next_batch(now=0.01) == ["a", "near", "far"]


def test_top_up_leaves_a_waiting_record_that_would_pad_the_batch() -> None:
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=4, max_queue_delay_s=0.01, bucket_by_length=True,
                                          bucket_width=8))
    b.add("a", now=0.0, length=4)
    b.add("b", now=0.0, length=5)
    b.add("near", now=0.005, length=12)  # not yet due
    b.add("far", now=0.005, length=100)  # not yet due; would pad two short records to 100 tokens
    assert b.next_batch(now=0.01) == ["a", "b"]  # 'near' adds 7 + 7 = 14 > 8 padded tokens: it waits too
    assert b.next_batch(now=0.014) is None
    assert b.next_batch(now=0.015) == ["near", "far"]  # due now: expired neighbours always come along


def test_top_up_takes_a_waiting_record_when_the_padding_is_small() -> None:
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=4, max_queue_delay_s=0.01, bucket_by_length=True,
                                          bucket_width=8))
    b.add("a", now=0.0, length=8)
    b.add("longer", now=0.005, length=20)  # bucket 3: pads "a" by 12 > 8 tokens, so it waits
    b.add("close", now=0.005, length=14)  # bucket 2: pads "a" by 6 <= 8 tokens, so it joins
    assert b.next_batch(now=0.01) == ["a", "close"]


def test_records_coming_due_while_the_engine_works_join_the_batch() -> None:
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=8, max_queue_delay_s=0.05, bucket_by_length=True,
                                          bucket_width=8))
    b.add("short", now=0.0, length=4)
    b.add("long-soon", now=0.04, length=120)  # due at 0.09: within the 50 ms the engine is expected to take
    b.add("longer-later", now=0.08, length=200)  # due at 0.13, after this batch: it waits its turn
    assert b.next_batch(now=0.05, horizon_s=0.05) == ["short", "long-soon"]
    assert b.next_batch(now=0.10) is None
    assert b.next_batch(now=0.13) == ["longer-later"]


def test_a_backlog_of_a_full_batch_over_several_buckets_goes_without_waiting() -> None:
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=32, max_queue_delay_s=0.05, bucket_by_length=True,
                                          max_batch_tokens=100, bucket_width=8))
    b.add("a", now=0.0, length=30)
    b.add("b", now=0.001, length=50)
    assert b.next_batch(now=0.002) is None  # 80 tokens queued: less than a batch, so it may still grow
    b.add("c", now=0.002, length=60)  # 140 tokens over three buckets: no bucket is full, the queue is
    assert b.next_batch(now=0.002) == ["a"]  # the oldest leaves now; 'b' would pad it by 20 tokens
    assert len(b) == 2


def test_a_token_cap_given_per_call_lowers_the_policy_budget() -> None:
    b: Batcher[int] = Batcher(BatchPolicy(max_batch_size=32, max_queue_delay_s=0.0, max_batch_tokens=1000))
    for i in range(10):
        b.add(i, now=0.0, length=50)
    assert b.next_batch(now=0.0, max_tokens=200) == [0, 1, 2, 3]  # 4 x 50 tokens
    assert b.next_batch(now=0.0, max_tokens=5000) == [4, 5, 6, 7, 8, 9]  # the policy's 1000 still holds


def test_remove_takes_out_only_matching_items() -> None:
    b: Batcher[int] = Batcher(BatchPolicy(max_batch_size=10, max_queue_delay_s=1.0))
    for i in range(6):
        b.add(i, now=0.0)
    assert b.remove(lambda i: i % 2 == 0) == [0, 2, 4]
    assert len(b) == 3
    assert b.drain() == [[1, 3, 5]]


def test_sealed_items_leave_first_at_once_and_alone() -> None:
    b: Batcher[int] = Batcher(BatchPolicy(max_batch_size=4, max_queue_delay_s=10.0))
    for i in range(6):
        b.add(i, now=0.0)
    b.seal()  # a model switch: 0..5 were prepared by the old engine
    b.add(6, now=0.0)
    assert len(b) == 7 and b.num_sealed == 6
    assert b.next_batch(now=0.0) == [0, 1, 2, 3]  # due at once: nothing can join them any more
    assert b.next_batch(now=0.0) == [4, 5]  # not topped up with 6, which came after the seal
    assert b.num_sealed == 0 and b.next_batch(now=0.0) is None  # 6 waits for its own window
    assert b.next_batch(now=10.0) == [6]
    b.seal()  # sealing an empty queue seals nothing
    assert b.num_sealed == 0


def test_sealing_twice_before_the_first_generation_has_left_is_refused() -> None:
    b: Batcher[int] = Batcher(BatchPolicy(max_batch_size=4, max_queue_delay_s=1.0))
    b.add(1, now=0.0)
    b.seal()
    with pytest.raises(RuntimeError, match="still sealed"):
        b.seal()


# ------------------------------------------------------------------------------------ properties


@settings(max_examples=200, deadline=None)
@given(before=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 200)), max_size=60),
       after=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 200)), max_size=60),
       max_batch_size=st.integers(min_value=1, max_value=16), bucketed=st.booleans(),
       max_batch_tokens=st.one_of(st.none(), st.integers(min_value=1, max_value=800)),
       removed=st.sets(st.integers(0, 3), max_size=2), drained=st.booleans())
def test_properties_of_a_seal(before: list[tuple[int, int]], after: list[tuple[int, int]], max_batch_size: int,
                              bucketed: bool, max_batch_tokens: int | None, removed: set[int],
                              drained: bool) -> None:
    """Items added before a seal and after it never share a batch, the sealed ones all leave first, the caps
    hold, and nothing is lost or duplicated -- with partitions revoked (``remove``) in between."""
    policy = BatchPolicy(max_batch_size=max_batch_size, max_queue_delay_s=0.01, bucket_by_length=bucketed,
                         max_batch_tokens=max_batch_tokens)
    b: Batcher[tuple[int, int, bool]] = Batcher(policy)  # (id, partition, added before the seal)
    for i, (partition, length) in enumerate(before):
        b.add((i, partition, True), now=0.0, length=length)
    b.seal()
    for i, (partition, length) in enumerate(after, start=len(before)):
        b.add((i, partition, False), now=0.0, length=length)
    gone = b.remove(lambda x: x[1] in removed)
    batches = b.drain() if drained else list(iter(lambda: b.next_batch(now=1.0), None))
    assert len(b) == 0
    assert all(len({x[2] for x in batch}) == 1 for batch in batches)  # never a mix
    generations = [batch[0][2] for batch in batches]
    assert generations == sorted(generations, reverse=True)  # every sealed batch before any later one
    assert all(1 <= len(batch) <= max_batch_size for batch in batches)
    out = sorted(x[0] for x in [*gone, *(x for batch in batches for x in batch)])
    assert out == list(range(len(before) + len(after)))

arrivals = st.lists(
    st.tuples(st.floats(min_value=0, max_value=0.02), st.integers(min_value=0, max_value=3),
              st.integers(min_value=1, max_value=300)),
    min_size=1, max_size=200)


@settings(max_examples=300, deadline=None)
@given(arrivals=arrivals,
       max_batch_size=st.integers(min_value=1, max_value=40),
       delay_s=st.sampled_from([0.0, 0.001, 0.005, 0.02]),
       bucketed=st.booleans(),
       max_batch_tokens=st.one_of(st.none(), st.integers(min_value=1, max_value=2000)),
       service_s=st.sampled_from([0.0, 0.0005, 0.003]),
       tick_s=st.sampled_from([0.0005, 0.001]))
def test_properties_of_a_simulated_run(arrivals: list[tuple[float, int, int]], max_batch_size: int,
                                       delay_s: float, bucketed: bool, max_batch_tokens: int | None,
                                       service_s: float, tick_s: float) -> None:
    """Simulate arrivals and an engine that takes ``service_s`` per batch, polled every ``tick_s``.

    Checks: batch size and token caps; nothing lost or duplicated; per-partition order without buckets;
    and while the engine is idle no record waits past its deadline by more than one tick.
    """
    policy = BatchPolicy(max_batch_size=max_batch_size, max_queue_delay_s=delay_s, bucket_by_length=bucketed,
                         max_batch_tokens=max_batch_tokens, bucket_width=16)
    b: Batcher[tuple[int, int, int, float]] = Batcher(policy)
    events, t = [], 0.0
    for i, (gap, partition, length) in enumerate(arrivals):
        t += gap
        events.append((t, (i, partition, length, t)))
    out: list[tuple[int, int, int, float]] = []
    now, engine_free_at, k = 0.0, 0.0, 0
    end = events[-1][0] + delay_s + 1.0
    while now <= end:
        while k < len(events) and events[k][0] <= now:
            item = events[k][1]
            b.add(item, now=item[3], length=item[2])
            k += 1
        if now >= engine_free_at:
            batch = b.next_batch(now)
            if batch is not None:
                assert 1 <= len(batch) <= max_batch_size
                if max_batch_tokens is not None and len(batch) > 1:
                    assert len(batch) * max(x[2] for x in batch) <= max_batch_tokens
                for x in batch:
                    # the engine was idle, so the record left within one tick of its deadline (or earlier)
                    if engine_free_at <= x[3] + delay_s:
                        assert now <= x[3] + delay_s + tick_s + 1e-9
                out.extend(batch)
                engine_free_at = now + service_s
        now += tick_s
    out.extend(x for batch in b.drain() for x in batch)
    assert sorted(x[0] for x in out) == list(range(len(events)))  # nothing lost, nothing twice
    if not bucketed:
        for p in range(4):
            ids = [x[0] for x in out if x[1] == p]
            assert ids == sorted(ids)
