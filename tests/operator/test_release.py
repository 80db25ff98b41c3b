"""ReleaseGate: outputs leave in their records' offset order per partition, whatever order they finish in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.operator.record import TopicPartition
from sluice.operator.release import ReleaseGate

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def test_an_output_waits_for_every_earlier_record_of_its_partition_only() -> None:
    gate: ReleaseGate[str] = ReleaseGate()
    gate.track_many([(A, 10), (A, 11), (A, 12), (B, 5)])
    assert gate.offer(A, 12, "a12") == []  # 10 and 11 unfinished
    assert gate.offer(B, 5, "b5") == ["b5"]  # another partition is not held back
    assert gate.offer(A, 10, "a10") == ["a10"]
    assert gate.num_held() == 1
    assert gate.offer(A, 11, "a11") == ["a11", "a12"]
    assert gate.num_held() == 0


def test_forgotten_partitions_release_nothing_and_drop_what_they_held() -> None:
    gate: ReleaseGate[str] = ReleaseGate()
    gate.track_many([(A, 0), (A, 1), (B, 0)])
    assert gate.offer(A, 1, "late") == []
    gate.forget(A)
    assert gate.num_held() == 0
    assert gate.offer(A, 0, "a0") == []  # revoked: its next owner produces it
    gate.forget_all()
    assert gate.offer(B, 0, "b0") == []


def test_tracking_out_of_order_is_a_bug_that_is_reported() -> None:
    gate: ReleaseGate[int] = ReleaseGate()
    gate.track(A, 5)
    try:
        gate.track(A, 5)
    except ValueError as err:
        assert "out of order" in str(err)
    else:
        raise AssertionError("tracking an offset twice must fail")


@given(st.lists(st.tuples(st.sampled_from([A, B]), st.integers(1, 3)), min_size=1, max_size=40),
       st.randoms(use_true_random=False))
def test_any_finish_order_releases_each_item_once_in_offset_order(records: list[tuple[TopicPartition, int]],
                                                                  rng: object) -> None:
    gate: ReleaseGate[tuple[TopicPartition, int]] = ReleaseGate()
    next_offset = {A: 0, B: 0}
    tracked = []
    for tp, gap in records:  # offsets ascend per partition, with gaps (compacted topics, transaction markers)
        next_offset[tp] += gap
        tracked.append((tp, next_offset[tp]))
    gate.track_many(tracked)
    finish = list(tracked)
    rng.shuffle(finish)  # type: ignore[attr-defined]
    released: list[tuple[TopicPartition, int]] = []
    finished: set[tuple[TopicPartition, int]] = set()
    for tp, offset in finish:
        finished.add((tp, offset))
        out = gate.offer(tp, offset, (tp, offset))
        for item in out:  # released only once every earlier record of its partition has finished
            assert all(f in finished for f in tracked if f[0] == item[0] and f[1] <= item[1])
        released += out
    for tp in (A, B):
        assert [r for r in released if r[0] == tp] == [t for t in tracked if t[0] == tp]
    assert gate.num_held() == 0
