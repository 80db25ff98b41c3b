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
