"""The offset tracker: only offsets whose every output is delivered, contiguously, may be committed."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.operator.offsets import OffsetTracker
from sluice.operator.record import TopicPartition

TP = TopicPartition("in", 0)


def test_watermark_waits_for_the_earliest_unfinished_record() -> None:
    t = OffsetTracker()
    for off in (10, 11, 12):
        t.track(TP, off)
        t.expect(TP, off)  # one output each
    for off in (10, 11, 12):
        t.ack(TP, off)  # processing done; deliveries pending
    assert t.committable(TP) is None
    t.ack(TP, 11)
    t.ack(TP, 12)
    assert t.committable(TP) is None  # 10 not delivered yet
    t.ack(TP, 10)
    assert t.committable(TP) == 13
    assert t.num_in_flight == 0


def test_a_record_with_two_outputs_needs_both() -> None:
    t = OffsetTracker()
    t.track(TP, 0)
    t.expect(TP, 0, 2)
    t.ack(TP, 0)
    t.ack(TP, 0)
    assert t.committable(TP) is None
    t.ack(TP, 0)
    assert t.committable(TP) == 1


def test_gaps_in_offsets_are_fine_and_forget_drops_late_acks() -> None:
    t = OffsetTracker()
    t.track(TP, 5)
    t.track(TP, 9)  # compacted topic or transaction markers: offsets need not be contiguous
    t.ack(TP, 5)
    t.ack(TP, 9)
    assert t.committable(TP) == 10
    t.track(TP, 20)
    t.forget(TP)
    t.ack(TP, 20)
    assert t.committable(TP) is None and t.num_in_flight == 0


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=1, max_value=60), outputs=st.lists(st.integers(0, 3), min_size=60, max_size=60),
       seed=st.integers(0, 2**32 - 1))
def test_watermark_is_exactly_the_first_unfinished_offset(n: int, outputs: list[int], seed: int) -> None:
    rng = random.Random(seed)
    t = OffsetTracker()
    refs: list[tuple[int, int]] = []
    for off in range(n):
        t.track(TP, off)
        t.expect(TP, off, outputs[off])
        refs += [(off, 1)] * (outputs[off] + 1)
    rng.shuffle(refs)
    left = {off: outputs[off] + 1 for off in range(n)}
    last = None
    for off, _ in refs:
        t.ack(TP, off)
        left[off] -= 1
        first_unfinished = next((o for o in range(n) if left[o] > 0), n)
        expected = first_unfinished if first_unfinished > 0 else None
        assert t.committable(TP) == expected
        wm = t.committable(TP)
        assert last is None or (wm is not None and wm >= last)  # never moves backwards
        last = wm
    assert t.is_idle()
