"""The end of a bounded read: when partitions are done, what is left, and that a rewind un-does them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.connectors.kafka.end_offsets import EndOffsets
from sluice.operator.record import TopicPartition

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def test_nothing_is_done_before_the_first_assignment_and_an_empty_one_is_done() -> None:
    ends = EndOffsets()
    assert not ends.all_done()
    ends.assign({})  # more members than partitions: this one got none
    assert ends.all_done()


def test_a_partition_is_done_once_its_position_reaches_the_end_taken_at_assignment() -> None:
    ends = EndOffsets()
    ends.assign({A: (10, 20), B: (5, 5)})  # B: committed at its end already
    assert ends.is_done(B) and not ends.is_done(A) and not ends.all_done()
    assert ends.remaining() == {A: 10, B: 0} and ends.total() == 10
    assert not ends.advance(A, 19)
    assert ends.advance(A, 21)  # a transaction marker at 20: the consumer's position moved past it
    assert not ends.advance(A, 22)  # reported once
    assert ends.all_done() and ends.remaining() == {A: 0, B: 0}
    assert ends.end_of(A) == 20 and ends.end_of(TopicPartition("other", 0)) is None


def test_a_rewind_makes_partitions_undone_until_read_to_their_ends_again() -> None:
    ends = EndOffsets()
    ends.assign({A: (0, 100)})
    ends.advance(A, 100)
    assert ends.all_done()
    ends.rewound([A])  # an aborted transaction: back to the committed offsets
    assert not ends.all_done() and ends.undone() == [A] and ends.remaining() == {A: 100}
    assert ends.advance(A, 100) and ends.all_done()


def test_revoked_partitions_are_forgotten_and_a_new_assignment_takes_new_ends() -> None:
    ends = EndOffsets()
    ends.assign({A: (0, 10), B: (0, 10)})
    ends.advance(A, 10)
    ends.forget([B])
    assert ends.all_done() and ends.remaining() == {A: 0}
    ends.assign({B: (10, 30)})  # it came back later: records produced meanwhile are part of this run
    assert not ends.all_done() and ends.remaining() == {A: 0, B: 20}


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=5),
       st.lists(st.tuples(st.integers(0, 4), st.integers(0, 60)), max_size=40))
def test_done_exactly_when_every_position_reached_its_end(ranges: list[tuple[int, int]],
                                                          moves: list[tuple[int, int]]) -> None:
    tps = [TopicPartition("t", i) for i in range(len(ranges))]
    ends = EndOffsets()
    ends.assign({tp: (s, e) for tp, (s, e) in zip(tps, ranges, strict=True)})
    position = {tp: s for tp, (s, _) in zip(tps, ranges, strict=True)}
    for i, pos in moves:
        if i < len(tps):
            ends.advance(tps[i], pos)
            position[tps[i]] = max(position[tps[i]], pos)
    expected = all(position[tp] >= e for tp, (_, e) in zip(tps, ranges, strict=True))
    assert ends.all_done() == expected
    assert sum(ends.remaining().values()) == sum(max(0, e - position[tp])
                                                 for tp, (_, e) in zip(tps, ranges, strict=True))
