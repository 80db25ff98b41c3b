"""The operator's threads end to end in memory (tests/operator/memory.py): the real runner, intake, engine
thread, emitter, ledger and delivery strategies, over an in-memory source and sink and a manual clock.

What a user would notice if the order of steps were wrong: an offset committed before its output was
delivered (lost on a crash), an output produced twice or never after a revoke, a run that goes on after a
delivery failed, a drain that drops what was queued. Each test runs in well under a second."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from sluice.engines.engine_contract import BatchEngine, ContinuousEngine
from sluice.operator.runner import Runner, RunSummary
from tests.operator.memory import EventLog, ManualClock, MemorySink, MemorySource, abortable, pipeline

BATCHING = "batching: {max_batch_size: 10, max_queue_delay_ms: 5}\n"
EXACTLY_ONCE = "delivery: exactly_once\nexactly_once: {transaction_interval_ms: 10}\n"


def records(n: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    return [(json.dumps({"text": f"t{i}"}).encode(), f"k{i}".encode(), []) for i in range(n)]


class Upper(BatchEngine):
    """Upper-cases; ``gate`` (when given) holds batch number ``block_at`` until it is set."""

    def __init__(self, block_at: int | None = None) -> None:
        self.block_at = block_at
        self.entered = threading.Event()  # the held batch is running
        self.gate = threading.Event()
        self.batches: list[list[str]] = []

    def infer(self, items: Sequence[Any]) -> list[Any]:
        self.batches.append(list(items))
        if len(self.batches) == self.block_at:
            self.entered.set()
            assert self.gate.wait(10), "the test never released the engine"
        return [str(i).upper() for i in items]


def start(source: MemorySource, sink: MemorySink, engine: Any, extra: str = "", **kwargs: Any) -> Runner:
    engine.start()
    return Runner(pipeline(extra=BATCHING + extra), source, sink, engine, clock=source.clock or ManualClock(),
                  **kwargs)


def offsets(sink: MemorySink, outputs: Sequence[Any] | None = None) -> list[int]:
    return sorted(p.input_offset for p in (sink.on("out") if outputs is None else outputs))


def delivered_before(log: EventLog, kind: str) -> list[tuple[dict[Any, int], set[int]]]:
    """For each ``kind`` event (store, commit, transaction): its offsets, and the inputs delivered by then."""
    seen: set[int] = set()
    found = []
    for k, detail in list(log.events):
        if k == "delivered":
            seen.add(detail[1])
        elif k == kind:
            found.append((detail, set(seen)))
    return found


@pytest.mark.parametrize("reverse", [False, True], ids=["reports-in-order", "reports-reversed"])
def test_at_least_once_stores_and_commits_only_offsets_whose_outputs_were_delivered(reverse: bool) -> None:
    log, clock = EventLog(), ManualClock()
    source = MemorySource(records(300), per_poll=7, clock=clock, log=log)
    sink = MemorySink(log=log, reverse=reverse, group_offsets=source.committed)
    summary = start(source, sink, Upper(), idle_exit_s=1).run()
    assert summary.error is None and offsets(sink) == list(range(300))
    stores = delivered_before(log, "store") + delivered_before(log, "commit")
    assert len(log.of("store")) >= 2  # stored as it went, not only at the end
    for marks, delivered in stores:
        watermark = marks[source.tp]
        assert set(range(watermark)) <= delivered, f"offset {watermark} stored before its outputs were delivered"
    assert source.committed[source.tp] == 300 and log.of("commit")[-1] == {source.tp: 300}


@pytest.mark.parametrize("extra", ["", EXACTLY_ONCE], ids=["at-least-once", "exactly-once"])
def test_a_revoke_during_a_batch_finishes_and_commits_it_and_leaves_the_queued_records_to_the_next_owner(
        extra: str) -> None:
    engine = Upper(block_at=3)
    revoked = threading.Event()

    def script(source: MemorySource) -> None:
        if engine.entered.is_set() and not revoked.is_set():
            revoked.set()
            threading.Timer(0.2, engine.gate.set).start()  # the revoke must wait for the running batch
            source.revoke()
        elif revoked.is_set():
            runner.stop()  # the revoke is over: nothing of the partition is left to this process

    log, clock = EventLog(), ManualClock()
    source = MemorySource(records(100), per_poll=10, clock=clock, log=log, script=script)
    sink = MemorySink(log=log, group_offsets=source.committed)
    runner = start(source, sink, engine, extra)
    summary = runner.run()
    assert summary.error is None
    # the batch in the engine at the revoke (its third) and everything before it: produced once, committed
    done = sum(len(b) for b in engine.batches[:3])
    assert done >= 21 and source.committed[source.tp] == done
    outputs = sink.committed_outputs if extra else sink.on("out")
    assert offsets(sink, outputs) == list(range(done))
    assert len(engine.batches) == 3  # what was queued behind it was dropped, not run: the next owner's
    revoke_at = log.events.index(("revoke", source.tp))
    commit = "transaction" if extra else "commit"
    assert [k for k, _ in log.events[revoke_at:]].index(commit) > 0  # committed after the revoke began


def test_after_the_revoke_the_next_owner_starts_where_the_commit_left_off() -> None:
    engine = Upper(block_at=2)
    state = {"revoked": False, "reassigned": False}

    def script(source: MemorySource) -> None:
        if engine.entered.is_set() and not state["revoked"]:
            state["revoked"] = True
            threading.Timer(0.1, engine.gate.set).start()
            source.revoke()
        elif state["revoked"] and not state["reassigned"]:
            state["reassigned"] = True
            source.assign()  # the same process gets it back, as a new owner would: from the committed offset

    source = MemorySource(records(60), per_poll=10, clock=ManualClock(), script=script)
    sink = MemorySink(group_offsets=source.committed)
    summary = start(source, sink, engine, idle_exit_s=1).run()
    assert summary.error is None
    assert offsets(sink) == list(range(60))  # nothing lost, nothing twice
    assert source.committed[source.tp] == 60


def test_a_delivery_failure_stops_the_run_without_committing_past_the_failed_record() -> None:
    log, clock = EventLog(), ManualClock()
    source = MemorySource(records(200), per_poll=10, clock=clock, log=log)
    sink = MemorySink(log=log, fails=lambda p: p.input_offset == 42)
    summary = start(source, sink, Upper(), max_records=200).run()
    assert summary.error is not None and summary.error.startswith("could not deliver a record to out")
    assert "without committing past its input" in summary.error
    assert 0 < source.committed[source.tp] <= 42
    for marks, delivered in delivered_before(log, "store") + delivered_before(log, "commit"):
        assert set(range(marks[source.tp])) <= delivered


class Crashing(ContinuousEngine):
    """A continuous engine whose ``step`` raises on its ``crash_at``-th step (an engine bug, not a record's)."""

    def __init__(self, crash_at: int) -> None:
        self.crash_at, self.num_steps = crash_at, 0
        self.waiting: list[tuple[Any, Any]] = []
        self.aborted: list[Any] = []

    def room(self) -> int:
        return 4 - len(self.waiting)

    def add(self, key: Any, item: Any) -> None:
        self.waiting.append((key, item))

    def step(self) -> list[tuple[Any, Any]]:
        self.num_steps += 1
        if self.num_steps == self.crash_at:
            raise RuntimeError("kernel panic")
        done, self.waiting = self.waiting[:1], self.waiting[1:]  # one request finishes per step
        return [(key, str(item).upper()) for key, item in done]

    def abort(self, key: Any) -> None:
        self.aborted.append(key)


def test_an_engine_that_fails_as_a_whole_stops_the_run_and_commits_only_what_finished() -> None:
    source = MemorySource(records(50), per_poll=5, clock=ManualClock())
    sink = MemorySink()
    engine = Crashing(crash_at=12)
    runner = start(source, sink, engine, max_records=50)
    summary = runner.run()
    assert summary.error == "RuntimeError('kernel panic')"
    finished = offsets(sink)
    assert finished == list(range(len(finished))) and 0 < len(finished) < 50
    assert source.committed[source.tp] == len(finished)  # what finished is committed; nothing after it
    assert engine.aborted  # the requests still running at the crash were aborted, not left to the engine
    assert not runner.worker.is_alive()


def test_a_stop_drains_every_queued_record_at_once_rather_than_waiting_for_its_batch_to_fill() -> None:
    clock = ManualClock()

    def script(source: MemorySource) -> None:
        if source.num_handed_out == 45:
            runner.stop()

    source = MemorySource(records(45), per_poll=9, clock=clock, script=script)
    sink = MemorySink(group_offsets=source.committed)
    engine = Upper()
    runner = Runner(pipeline(extra="batching: {max_batch_size: 20, max_queue_delay_ms: 600000}\n"), source, sink,
                    engine, clock=clock)
    started = clock()
    summary = runner.run()
    assert summary.error is None and offsets(sink) == list(range(45))
    assert source.committed[source.tp] == 45
    assert [len(b) for b in engine.batches] == [20, 20, 5]  # drained in batches, not waiting out the delay
    assert clock() - started < 60


def test_exactly_once_an_aborted_commit_rewinds_and_every_input_is_committed_once() -> None:
    log, clock = EventLog(), ManualClock()
    source = MemorySource(records(120), per_poll=5, clock=clock, log=log)
    sink = MemorySink(log=log, group_offsets=source.committed, commit_errors=[None, abortable()])
    engine = Upper()
    summary = start(source, sink, engine, EXACTLY_ONCE, idle_exit_s=1).run()
    assert summary.error is None
    first, *_ = log.of("transaction")
    assert log.of("abort")[0] > 0  # the second transaction failed with outputs in it...
    assert log.of("rewind") == [first[source.tp]] and first[source.tp] > 0  # ...back to the first's offsets
    assert offsets(sink, sink.committed_outputs) == list(range(120))  # each once, among committed outputs
    assert len(sink.on("out")) > 120  # the aborted transaction's outputs were produced, then aborted
    assert source.committed[source.tp] == 120 and source.stored == {}  # offsets only inside transactions
    for marks, delivered in delivered_before(log, "transaction"):
        assert set(range(marks.get(source.tp, 0))) <= delivered


def test_exactly_once_an_idle_pipeline_commits_no_empty_transactions() -> None:
    log, clock = EventLog(), ManualClock()
    source = MemorySource(records(30), per_poll=10, clock=clock, log=log)
    sink = MemorySink(log=log, group_offsets=source.committed)
    started = clock()
    summary = start(source, sink, Upper(), EXACTLY_ONCE, idle_exit_s=2).run()  # 10 ms interval, 2 s idle
    assert summary.error is None and clock() - started >= 2  # ~200 intervals went by with nothing to do
    transactions = log.of("transaction")
    # While records flow a transaction may close before the engine produced anything (a slow or loaded
    # machine): it carries no offsets then. Once the work is done, the ~200 idle intervals commit nothing:
    # after the transaction carrying offset 30 only shutdown's follows.
    last_work = max(i for i, offsets in enumerate(transactions) if offsets)
    assert transactions[last_work] == {source.tp: 30} and len(transactions) - last_work <= 2
    assert len(transactions) <= 8  # not one per interval
    assert source.committed[source.tp] == 30 and offsets(sink, sink.committed_outputs) == list(range(30))


def test_exactly_once_a_lost_partition_aborts_the_open_transaction_and_commits_nothing_of_it() -> None:
    engine = Upper(block_at=2)
    lost = threading.Event()

    def script(source: MemorySource) -> None:
        if engine.entered.is_set() and not lost.is_set():
            lost.set()
            engine.gate.set()
            source.lose()
        elif lost.is_set():
            runner.stop()

    log = EventLog()
    source = MemorySource(records(40), per_poll=10, clock=ManualClock(), log=log, script=script)
    sink = MemorySink(log=log, group_offsets=source.committed)
    runner = start(source, sink, engine, "delivery: exactly_once\nexactly_once: {transaction_interval_ms: 30000}\n")
    summary: RunSummary = runner.run()
    assert summary.error is None
    assert log.of("abort") and sink.committed_outputs == [] and source.committed == {}


def test_empty_rebalance_callbacks_are_no_events(caplog: pytest.LogCaptureFixture) -> None:
    """The cooperative-sticky protocol calls back with empty lists when a rebalance of the group leaves this
    member's partitions as they are: no log line, and no abort or rewind of the open exactly-once transaction
    (every output is produced once)."""
    calls = {"n": 0}

    def script(source: MemorySource) -> None:
        calls["n"] += 1
        if calls["n"] in (3, 6, 9, 12) and source._callbacks is not None:
            for callback in source._callbacks:  # assign, revoke, lost: each with nothing in it
                callback([])

    log = EventLog()
    source = MemorySource(records(60), per_poll=5, clock=ManualClock(), log=log, script=script)
    sink = MemorySink(log=log, group_offsets=source.committed)
    caplog.set_level(logging.INFO, logger="sluice")
    summary = start(source, sink, Upper(), EXACTLY_ONCE, idle_exit_s=1).run()
    assert summary.error is None and calls["n"] > 12
    assert log.of("abort") == [] and log.of("rewind") == []
    assert offsets(sink) == list(range(60)) == offsets(sink, sink.committed_outputs)
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if m.startswith(("assigned", "revoking", "lost"))] == ["assigned in[0]"], messages
