"""Backpressure's fairness and bounds against a source that always serves partitions in the same order.

The fake source stands for librdkafka's fetch queue at its most unhelpful: chunks of one partition each,
often far more records than a poll takes, refetched after a resume in one fixed partition order; pausing a
partition drops what was queued for it, as librdkafka does. The
engine finishes records first in, first out, a fixed number per step. Over a long run every partition
must keep moving, and the in-flight bounds must hold after every poll.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.operator.backpressure import Backpressure
from sluice.operator.ledger import InFlightLedger
from sluice.operator.record import TopicPartition


@dataclass(frozen=True, slots=True)
class _Record:
    tp: TopicPartition
    offset: int


class _FetchQueue:
    """Endless backlogs served like librdkafka's fetch queue: a queue of fetched chunks of ``chunk`` records,
    one partition each, taken front to back. A used-up chunk is fetched again at the back; pausing drops a
    partition's queued chunk; resuming fetches chunks for the resumed partitions in ``order``, the same
    order every time (the adversary: a fetch response lists its partitions in some fixed order)."""

    def __init__(self, order: list[TopicPartition], chunk: int) -> None:
        self.order, self.chunk = order, chunk
        self.assignment = set(order)
        self.paused_partitions: set[TopicPartition] = set()
        self.next_offset = dict.fromkeys(order, 0)
        self.queue: deque[list[Any]] = deque([tp, chunk] for tp in order)

    def poll(self, max_records: int) -> list[_Record]:
        out: list[_Record] = []
        while self.queue and len(out) < max_records:
            entry = self.queue[0]
            tp = entry[0]
            num = min(entry[1], max_records - len(out))
            first = self.next_offset[tp]
            out.extend(_Record(tp, o) for o in range(first, first + num))
            self.next_offset[tp] = first + num
            entry[1] -= num
            if entry[1] == 0:
                self.queue.popleft()
                self.queue.append([tp, self.chunk])
        return out

    def pause(self, tps: Any) -> None:
        self.paused_partitions.update(tps)
        self.queue = deque(e for e in self.queue if e[0] not in self.paused_partitions)

    def resume(self, tps: Any) -> None:
        resumed = set(tps) & self.paused_partitions
        self.paused_partitions -= resumed
        self.queue.extend([tp, self.chunk] for tp in self.order if tp in resumed)


def _run(num_partitions: int, max_in_flight: int, poll_batch: int, per_step: int, order: list[int],
         steps: int, chunk: int) -> tuple[Counter[int], int, int]:
    """Returns records done per partition in the second half of the run (the first fills the window), the
    most in flight at once, and the most of one partition. Each step is one pass of the runner's intake
    loop: apply, poll, track, apply, then delivery reports."""
    tps = [TopicPartition("in", p) for p in order[:num_partitions]]
    source = _FetchQueue(tps, chunk)
    ledger: InFlightLedger[_Record, None] = InFlightLedger()
    bp = Backpressure(max_in_flight, poll_batch, SimpleNamespace(ledger=ledger), source,  # type: ignore[arg-type]
                      lambda tp: False)
    queue: deque[_Record] = deque()
    done: Counter[int] = Counter()
    most_total = most_one = 0
    for step in range(steps):
        bp.apply()
        records = source.poll(bp.poll_limit(None))
        ledger.track_many(records)
        bp.apply()
        queue.extend(records)
        most_total = max(most_total, ledger.num_in_flight)
        most_one = max([most_one, *(ledger.num_in_flight_of(tp) for tp in tps)])
        finished = [queue.popleft() for _ in range(min(per_step, len(queue)))]
        ledger.ack_many(finished)
        if step >= steps // 2:
            done.update(r.tp.partition for r in finished)
    return done, most_total, most_one


def test_the_partition_served_first_does_not_take_the_window() -> None:
    """The case seen against a real broker under load: three partitions, a 500-record window, polls of up to
    500 -- one partition got no record at all while the other two shared every output."""
    done, most_total, _ = _run(3, 500, 500, 50, [0, 1, 2], steps=400, chunk=3000)
    assert most_total <= 500
    assert min(done[p] for p in range(3)) >= sum(done.values()) / 6, dict(done)


@settings(max_examples=150, deadline=None)
@given(num_partitions=st.integers(2, 8), max_in_flight=st.integers(16, 2000), per_step=st.integers(1, 200),
       poll_factor=st.integers(2, 20), order=st.permutations(list(range(8))), chunk=st.integers(1, 5000))
def test_every_partition_keeps_moving_and_the_bounds_hold(num_partitions: int, max_in_flight: int,
                                                          per_step: int, poll_factor: int, order: list[int],
                                                          chunk: int) -> None:
    """The engine is the bottleneck (polls take more per step than it finishes), so backpressure is on."""
    per_step = min(per_step, max_in_flight // 4)
    steps = 8 * max_in_flight // per_step + 50  # the window turns over four times in the half measured
    done, most_total, most_one = _run(num_partitions, max_in_flight, per_step * poll_factor, per_step, order,
                                      steps=steps, chunk=chunk)
    share = max_in_flight // num_partitions
    assert most_total <= max_in_flight
    assert most_one <= share + share // 4 + 1
    total = sum(done.values())
    assert total > 0
    assert min(done[p] for p in order[:num_partitions]) >= total / (4 * num_partitions), dict(done)
