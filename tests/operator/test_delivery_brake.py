"""The delivery brake: while the brokers acknowledge nothing, an at-least-once run takes and processes no new
records past about one commit interval's worth, and resumes once deliveries flow (sluice/operator/backpressure.py).

A partition leader cut off from its followers takes produce requests and never answers them; without the
brake the run fills its whole in-flight window with outputs that are delivered late, and a rebalance
meanwhile makes the next owner redo every one of them (tests/reliability/test_network_faults.py).
"""

from __future__ import annotations

import json
import threading

import pytest

from sluice.operator.backpressure import DeliveryBrake, delivery_brake
from sluice.operator.runner import Runner
from tests.operator.memory import ManualClock, MemorySink, MemorySource, pipeline
from tests.operator.test_runner import Upper

NUM_RECORDS = 5000
PER_POLL, POLL_S = 10, 0.002  # 5,000 records/s arrive
BRAKE_AFTER_S = 0.1  # the brake engages once an output has waited this long: some 500 records in


class StuckSink(MemorySink):
    """Holds every delivery report while ``stuck`` (a leader that never acknowledges)."""

    stuck = True

    def poll(self, timeout_s: float = 0) -> int:
        return 0 if self.stuck else super().poll(timeout_s)

    def flush(self, timeout_s: float) -> int:
        return self.num_pending() if self.stuck else super().flush(timeout_s)


def _records() -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    return [(json.dumps({"text": f"t{i}"}).encode(), f"k{i}".encode(), []) for i in range(NUM_RECORDS)]


def test_stalled_deliveries_stop_the_intake_and_the_engine_until_they_flow_again(
        caplog: pytest.LogCaptureFixture) -> None:
    clock, sink = ManualClock(), StuckSink()
    seen: dict[str, int] = {}

    def release_after_a_while(source: MemorySource) -> None:  # runs at each poll, as librdkafka's callbacks do
        seen["polls"] = seen.get("polls", 0) + 1
        if seen["polls"] == 3000 and sink.stuck:  # 6 s of stalled deliveries on the clock
            seen["taken"], seen["produced"] = source.num_handed_out, len(sink.produced)
            sink.stuck = False

    source = MemorySource(_records(), per_poll=PER_POLL, poll_s=POLL_S, clock=clock, script=release_after_a_while)
    engine = Upper()
    engine.start()
    extra = (f"runtime: {{max_in_flight: {NUM_RECORDS}, brake_after_ms: {int(BRAKE_AFTER_S * 1000)}, "
             "drain_timeout_s: 30}\nbatching: {max_batch_size: 10, max_queue_delay_ms: 5}\n")
    runner = Runner(pipeline(extra=extra), source, sink, engine, clock=clock, max_records=NUM_RECORDS)
    result = []
    thread = threading.Thread(target=lambda: result.append(runner.run()), daemon=True)
    with caplog.at_level("INFO", logger="sluice.operator.backpressure"):
        thread.start()
        thread.join(120)
    assert result, "the run never finished"
    # without the brake the whole window (every record) is taken and produced within the stall
    assert "taken" in seen, "the run took every record without polling on: the intake never stopped"
    assert seen["taken"] < 1000 and seen["produced"] < 1000, seen
    summary = result[0]
    assert summary.error is None and summary.num_out == NUM_RECORDS  # nothing lost once deliveries flow
    messages = [r.getMessage() for r in caplog.records]
    assert sum("waited" in m and "taking and processing no new records" in m for m in messages) == 1, messages
    assert sum(m.startswith("deliveries and commits flow again") for m in messages) == 1, messages
    assert not any("stalled: engine" in m for m in messages), "the braked engine is not stuck"


@pytest.mark.parametrize("waiting", ["delivery", "commit"])
def test_the_brake_engages_only_past_its_time_and_says_what_waits(waiting: str) -> None:
    clock = ManualClock(0.0)
    since: list[float | None] = [None]
    stalled = lambda: since[0]  # noqa: E731
    brake = DeliveryBrake(stalled if waiting == "delivery" else lambda: None,
                          stalled if waiting == "commit" else lambda: None, 0.5, clock)
    assert brake.stalled() is None  # nothing waits
    since[0] = 0.0
    clock.advance(0.5)
    assert brake.stalled() is None  # waited exactly the limit: not yet
    clock.advance(0.25)
    expected = ("an output has waited 0.8 s for the brokers to acknowledge it" if waiting == "delivery"
                else "stored offsets have waited 0.8 s for the group to commit them")
    assert brake.stalled() == expected


@pytest.mark.parametrize(("extra", "in_order", "after_s"), [
    ("", False, 3.0),  # three commit intervals by default
    ("runtime: {brake_after_ms: 250}\n", False, 0.25),
    ("runtime: {brake_after_ms: 0}\n", False, None),  # turned off
    ("", True, None),  # exactly-once: transactions wait for every delivery themselves
])
def test_which_runs_brake_and_after_how_long(extra: str, in_order: bool, after_s: float | None) -> None:
    class Parts:
        def oldest_undelivered_s(self) -> float | None:
            return None

        def uncommitted_since(self) -> float | None:
            return None

    runtime = pipeline(extra="runtime: {commit_interval_ms: 1000}\n" + extra).pipeline.runtime
    brake = delivery_brake(runtime, in_order, Parts(), Parts(), ManualClock())
    assert (None if brake is None else brake.after_s) == after_s
