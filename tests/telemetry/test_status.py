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
            stats.record_delivered(100 if second else 0, np.zeros(100 if second else 0))
            stats.record_tick(50 if second < 20 else 0, {tp: max(0, 1950 - done)})
            reporter.tick(float(second))
        reporter.finish(20.0, tokens=(4000, 1000))
    shown = stream.getvalue() if tty else "\n".join(r.getMessage() for r in caplog.records)
    assert "50% 1,000/2,000 | ETA 10s" in shown  # at 10 s: 1,000 done, 50 in flight + 950 to read
    if tty:
        assert "[############------------] 50%" in shown
    summary = "done: 2,000 records in 20.0 s (100 rec/s): 2,000 outputs, 0 dead-lettered | tokens: 4,000 prompt, " \
              "1,000 output (50 output tok/s)"
    assert summary in shown
