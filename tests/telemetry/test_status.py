"""The status line's numbers and wording, and when it is written (terminal vs. log)."""

from __future__ import annotations

import io
import logging
import math

import numpy as np
import pytest

from sluice.operator.record import TopicPartition
from sluice.telemetry.stats import OperatorStats
from sluice.telemetry.status import StatusReporter, StatusWindow, format_status, window


def test_format_status_reads_like_the_docs() -> None:
    line = format_status(StatusWindow(records_per_s=12345.6, mean_batch_size=57.25, p99_queue_delay_s=0.012,
                                      lag=1024, num_in_flight=300, num_dead_lettered=3))
    assert line == "12,346 rec/s | batch 57.2 | p99 queue 12.0 ms | lag 1,024 | in flight 300 | dead-lettered 3"
    idle = format_status(StatusWindow(0.0, math.nan, math.nan, None, 0, 0))
    assert idle == "0 rec/s | batch - | p99 queue - | lag - | in flight 0 | dead-lettered 0"


def test_window_covers_only_what_happened_since_the_last_report() -> None:
    stats = OperatorStats()
    stats.record_batch(np.full(10, 0.001))
    stats.record_delivered(10, np.zeros(10))
    earlier = stats.snapshot()
    stats.record_batch(np.full(30, 0.2))
    stats.record_batch(np.full(10, 0.2))
    stats.record_delivered(38, np.zeros(40))
    stats.record_rejected(["decode", "decode"])
    stats.record_tick(7, {TopicPartition("t", 0): 5, TopicPartition("t", 1): 6})
    w = window(earlier, stats.snapshot(), elapsed_s=2.0)
    assert w.records_per_s == 20.0  # 38 outputs + 2 dead-lettered in 2 s
    assert w.mean_batch_size == 20.0
    assert 0.1 < w.p99_queue_delay_s <= 0.25  # the 0.2 s delays' bucket; the early 1 ms ones are gone
    assert w.lag == 11 and w.num_in_flight == 7 and w.num_dead_lettered == 2


@pytest.mark.parametrize("tty", [True, False])
def test_terminal_gets_one_rewritten_line_and_a_log_gets_periodic_lines(tty: bool,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    reporter = StatusReporter(OperatorStats(), stream, is_tty=tty, log_interval_s=10)
    with caplog.at_level(logging.INFO, logger="sluice.status"):
        for second in range(25):
            reporter.tick(float(second))
        reporter.close()
    if tty:
        assert stream.getvalue().count("\r") == 24 and stream.getvalue().endswith("\n")
        assert caplog.records == []
    else:
        assert stream.getvalue() == ""
        assert len(caplog.records) == 2  # at 10 s and 20 s


def test_a_bounded_run_reads_its_progress_and_eta_in_front_of_the_line() -> None:
    from sluice.telemetry.status import Progress, format_bar, format_duration, progress

    p = progress(done=4200, left=5800, rate_per_s=100.0)
    assert p == Progress(4200, 5800, 58.0) and p.fraction == 0.42
    line = format_status(StatusWindow(100.0, 32.0, 0.01, 5800, 300, 2, progress=p))
    assert line.startswith("42% 4,200/10,000 | ETA 58s | 100 rec/s | batch 32.0")
    assert format_bar(p, width=10) == "[####------]"
    assert progress(0, 10, 0.0).eta_s is None and "ETA -" in format_status(
        StatusWindow(0.0, math.nan, math.nan, 10, 0, 0, progress=progress(0, 10, 0.0)))
    assert progress(0, 0, 0.0).fraction == 1.0
    assert [format_duration(s) for s in (0.4, 59, 61, 3599, 3600 * 3 + 7 * 60 + 9)] == [
        "0s", "59s", "1m01s", "59m59s", "3h07m"]


@pytest.mark.parametrize("tty", [True, False])
def test_a_bounded_run_shows_a_bar_on_a_terminal_a_percentage_in_the_log_and_a_summary_at_the_end(
        tty: bool, caplog: pytest.LogCaptureFixture) -> None:
    stats = OperatorStats()
    stream = io.StringIO()
    reporter = StatusReporter(stats, stream, is_tty=tty, log_interval_s=10)
    reporter.bounded = True
    tp = TopicPartition("corpus.parquet", 0)
    with caplog.at_level(logging.INFO, logger="sluice.status"):
        for second in range(21):
            done = 100 * second  # 100 records/s of 2,000: 50 in flight, the rest not read yet
            if second < 20:
                stats.record_polled(100, float(second))
            stats.record_delivered(100 if second else 0, np.zeros(100 if second else 0), float(second))
            stats.record_tick(50 if second < 20 else 0, {tp: max(0, 1950 - done)})
            reporter.tick(float(second))
        reporter.finish(20.0, tokens=(4000, 1000))
    shown = stream.getvalue() if tty else "\n".join(r.getMessage() for r in caplog.records)
    assert "50% 1,000/2,000 | ETA 10s" in shown  # at 10 s: 1,000 done, 50 in flight + 950 to read
    if tty:
        assert "[############------------] 50%" in shown
    summary = ("done: 2,000 records in 20.0 s of work (100 rec/s): 2,000 outputs, 0 dead-lettered | 2,000 in, "
               "0 batches | 20.0 s wall | tokens: 4,000 prompt, 1,000 output (50 output tok/s)")
    assert summary in shown


def test_the_p99_is_of_the_delays_since_the_last_line_not_a_bucket_bound_or_the_whole_run(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue: "p99 queue 29800.0 ms" 15 s into a run -- delays of about 11 s all fell in the 10..30 s
    bucket, whose interpolation put the 99th percentile near its upper bound."""
    stats = OperatorStats()
    reporter = StatusReporter(stats, io.StringIO(), is_tty=False, log_interval_s=10)
    clock = 100.0  # the runner's monotonic clock, injected through the ticks
    with caplog.at_level(logging.INFO, logger="sluice.status"):
        reporter.tick(clock)
        backlog = np.linspace(10.5, 11.5, 128)  # a backlog at start: every record waited about 11 s
        stats.record_batch(backlog[:64])
        stats.record_batch(backlog[64:])
        reporter.tick(clock + 10)
        stats.record_batch(np.full(200, 0.005))  # then records flow: 5 ms
        reporter.tick(clock + 15)  # between lines: nothing taken
        stats.record_batch(np.full(200, 0.004))
        reporter.tick(clock + 20)
        reporter.tick(clock + 30)  # an idle window
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert f"p99 queue {np.quantile(backlog, 0.99) * 1000:.1f} ms" in lines[0], lines[0]  # 11490.0 ms, not 29800
    assert "p99 queue 5.0 ms" in lines[1], lines[1]  # the backlog's 11 s are not in this window
    assert "p99 queue - " in lines[2], lines[2]


def test_the_summary_rate_is_over_the_working_time_and_says_the_wall_time_apart(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue: the rate at the end counted the --idle-exit wait (and the wait for the first record)."""
    stats = OperatorStats()
    reporter = StatusReporter(stats, io.StringIO(), is_tty=False)
    stats.record_polled(0, 1.0)  # an empty poll does not start the work
    stats.record_polled(400, 3.0)  # the first records come 3 s into the run
    stats.record_batch(np.full(400, 0.01))
    stats.record_delivered(398, np.zeros(400), 7.0)  # 2 dead-lettered (counted when rejected)
    stats.record_rejected(["decode", "decode"])
    with caplog.at_level(logging.INFO, logger="sluice.status"):
        reporter.finish(elapsed_s=17.0)  # then 10 s of --idle-exit
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == ("done: 400 records in 4.0 s of work (100 rec/s): 398 outputs, 2 dead-lettered | 400 in, "
                    "1 batches (mean size 400.0) | 17.0 s wall")


def test_a_run_that_did_nothing_says_so_without_a_rate() -> None:
    from sluice.telemetry.status import RunTotals, format_summary

    line = format_summary(RunTotals(num_in=0, num_out=0, num_dead_lettered=0, num_batches=0, num_batched=0,
                                    wall_s=3.2, work_s=None, tokens=(0, 0)))
    assert line == "0 records: 0 outputs, 0 dead-lettered | 0 in, 0 batches | 3.2 s wall | tokens: 0 prompt, 0 output"
    quick = format_summary(RunTotals(2000, 2000, 0, 32, 2000, wall_s=0.2, work_s=0.031))
    assert quick.startswith("2,000 records in 31 ms of work (64,516 rec/s)") and quick.endswith("| 200 ms wall")


def test_the_runners_own_counts_read_the_same_as_the_status_lines() -> None:
    """``sluice run`` writes one summary line: the status line's, or with the status line off, the same
    wording from the runner's own counts."""
    from sluice.operator.state import RunSummary
    from sluice.telemetry.status import format_summary, totals_of_snapshot, totals_of_summary

    stats = OperatorStats()
    stats.record_polled(100, 2.0)
    stats.record_batch(np.zeros(60))
    stats.record_batch(np.zeros(40))
    stats.record_delivered(100, np.zeros(100), 4.5)
    summary = RunSummary(num_in=100, num_out=100, num_batches=2, num_batched_records=100, elapsed_s=9.0,
                         first_in_s=2.0, last_out_s=4.5)
    assert summary.work_s == 2.5
    assert format_summary(totals_of_summary(summary)) == format_summary(totals_of_snapshot(stats.snapshot(), 9.0))
