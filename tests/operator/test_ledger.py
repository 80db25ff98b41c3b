"""The in-flight ledger: only offsets whose every output is delivered, contiguously, may be committed; in
order, an output leaves only after every earlier record of its partition."""

from __future__ import annotations

import random
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.operator.ledger import InFlightLedger
from sluice.operator.record import TopicPartition

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


class Rec(NamedTuple):
    tp: TopicPartition
    offset: int


def recs(tp: TopicPartition, *offsets: int) -> list[Rec]:
    return [Rec(tp, o) for o in offsets]


def test_watermark_waits_for_the_earliest_unfinished_record() -> None:
    ledger: InFlightLedger[Rec, str] = InFlightLedger()
    ledger.track_many(recs(A, 10, 11, 12))
    ledger.ack_many(recs(A, 11, 12))
    assert ledger.watermarks() == {}  # 10 not delivered yet
    assert ledger.num_in_flight == 1 and ledger.num_in_flight_of(A) == 1
    ledger.ack_many(recs(A, 10))
    assert ledger.watermarks() == {A: 13}
    assert ledger.is_idle()


def test_gaps_in_offsets_are_fine_and_forget_drops_late_acks() -> None:
    ledger: InFlightLedger[Rec, str] = InFlightLedger()
    ledger.track_many(recs(A, 5, 9))  # compacted topic or transaction markers: offsets need not be contiguous
    ledger.ack_many(recs(A, 5, 9))
    assert ledger.watermarks() == {A: 10}
    ledger.track_many(recs(A, 20) + recs(B, 0))
    ledger.forget([A])
    ledger.ack_many(recs(A, 20))
    assert ledger.watermarks() == {} and ledger.num_in_flight == 1
    ledger.forget_all()
    assert ledger.is_idle() and ledger.num_in_flight_of(B) == 0


def test_tracking_an_offset_twice_or_backwards_is_a_bug_that_is_reported() -> None:
    ledger: InFlightLedger[Rec, str] = InFlightLedger()
    ledger.track_many(recs(A, 5))
    with pytest.raises(ValueError, match="out of order"):
        ledger.track_many(recs(A, 5))
    ledger.ack_many(recs(A, 5))
    with pytest.raises(ValueError, match="out of order"):
        ledger.track_many(recs(A, 3))  # below the watermark


def test_without_in_order_everything_is_released_at_once() -> None:
    ledger: InFlightLedger[Rec, str] = InFlightLedger()
    ledger.track_many(recs(A, 0, 1))
    records = recs(A, 1, 0)
    assert ledger.release(list(records), ["r1", "d0"], num_results=1) == (records, ["r1", "d0"], 1)


def test_in_order_an_output_waits_for_every_earlier_record_of_its_partition_only() -> None:
    ledger: InFlightLedger[Rec, str] = InFlightLedger(in_order=True)
    ledger.track_many(recs(A, 10, 11, 12) + recs(B, 5))
    assert ledger.release(recs(A, 12), ["a12"], 1) == ([], [], 0)  # 10 and 11 unfinished
    assert ledger.release(recs(B, 5), ["b5"], 1) == (recs(B, 5), ["b5"], 0)  # another partition is not held
    assert ledger.release(recs(A, 10), ["a10"], 0) == (recs(A, 10), ["a10"], 1)  # a dead letter
    assert ledger.release(recs(A, 11), ["a11"], 1) == (recs(A, 11, 12), ["a11", "a12"], 0)


def test_in_order_forgotten_partitions_release_nothing_and_drop_what_they_held() -> None:
    ledger: InFlightLedger[Rec, str] = InFlightLedger(in_order=True)
    ledger.track_many(recs(A, 0, 1) + recs(B, 0))
    assert ledger.release(recs(A, 1), ["late"], 1)[1] == []
    ledger.forget([A])
    assert ledger.release(recs(A, 0), ["a0"], 1)[1] == []  # revoked: its next owner produces it
    ledger.forget_all()
    assert ledger.release(recs(B, 0), ["b0"], 1)[1] == []


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=1, max_value=60), seed=st.integers(0, 2**32 - 1))
def test_watermark_is_exactly_the_first_unfinished_offset_and_never_moves_back(n: int, seed: int) -> None:
    rng = random.Random(seed)
    ledger: InFlightLedger[Rec, str] = InFlightLedger()
    ledger.track_many(recs(A, *range(n)))
    finish = list(range(n))
    rng.shuffle(finish)
    done: set[int] = set()
    last = None
    for offset in finish:
        ledger.ack_many(recs(A, offset))
        done.add(offset)
        first_unfinished = next((o for o in range(n) if o not in done), n)
        wm = ledger.watermarks().get(A)
        assert wm == (first_unfinished if first_unfinished > 0 else None)
        assert last is None or (wm is not None and wm >= last)
        last = wm
    assert ledger.is_idle()


@given(st.lists(st.tuples(st.sampled_from([A, B]), st.integers(1, 3)), min_size=1, max_size=40),
       st.randoms(use_true_random=False))
def test_in_order_any_finish_order_releases_each_output_once_in_offset_order(
        records: list[tuple[TopicPartition, int]], rng: random.Random) -> None:
    ledger: InFlightLedger[Rec, Rec] = InFlightLedger(in_order=True)
    next_offset = {A: 0, B: 0}
    tracked = []
    for tp, gap in records:  # offsets ascend per partition, with gaps (compacted topics, transaction markers)
        next_offset[tp] += gap
        tracked.append(Rec(tp, next_offset[tp]))
    ledger.track_many(tracked)
    finish = list(tracked)
    rng.shuffle(finish)
    released: list[Rec] = []
    finished: set[Rec] = set()
    for r in finish:
        finished.add(r)
        out_records, outputs, _ = ledger.release([r], [r], 1)
        assert out_records == outputs
        for item in outputs:  # released only once every earlier record of its partition has finished
            assert all(f in finished for f in tracked if f.tp == item.tp and f.offset <= item.offset)
        released += outputs
        ledger.ack_many(out_records)
        # the watermark never passes a record whose output has not left
        for tp, wm in ledger.watermarks().items():
            assert all(t in released for t in tracked if t.tp == tp and t.offset < wm)
    for tp in (A, B):
        assert [r for r in released if r.tp == tp] == [t for t in tracked if t.tp == tp]
    assert ledger.is_idle()
