"""The live status of ``sluice run``: one line rewritten in place on a terminal, a log line otherwise.

Driven by the observer's tick (about once a second, on the intake thread). Each report covers the window since the
previous one: records/s (outputs and dead-letter records acknowledged), mean batch size, p99 queue delay
(from the queue-delay histogram's buckets, so an estimate within one bucket), consumer lag, records in
flight, and dead-lettered records since start.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass
from typing import TextIO

from sluice.telemetry.stats import OperatorStats, StatsSnapshot

log = logging.getLogger("sluice.status")

LOG_INTERVAL_S = 10.0  # between log lines when the output is not a terminal


@dataclass(frozen=True)
class StatusWindow:
    """What one status report says."""

    records_per_s: float  # outputs + dead-letter records acknowledged per second in the window
    mean_batch_size: float  # NaN when no batch ran in the window
    p99_queue_delay_s: float  # NaN when no batch ran in the window
    lag: int | None  # total consumer lag over assigned partitions; None before the first statistics
    num_in_flight: int
    num_dead_lettered: int  # since start
    num_stalled: int = 0  # partitions waiting for the schema registry now


def window(earlier: StatsSnapshot, now: StatsSnapshot, elapsed_s: float) -> StatusWindow:
    """The status between two snapshots taken ``elapsed_s`` apart."""
    done = (now.num_out + now.total_dead_lettered) - (earlier.num_out + earlier.total_dead_lettered)
    num_batches = now.num_batches - earlier.num_batches
    sizes = now.batch_size.minus(earlier.batch_size)
    delays = now.queue_delay_s.minus(earlier.queue_delay_s)
    return StatusWindow(
        records_per_s=done / elapsed_s if elapsed_s > 0 else 0.0,
        mean_batch_size=sizes.total / num_batches if num_batches else math.nan,
        p99_queue_delay_s=delays.quantile(0.99),
        lag=sum(now.lag.values()) if now.lag else None,
        num_in_flight=now.num_in_flight,
        num_dead_lettered=now.total_dead_lettered,
        num_stalled=now.num_stalled,
    )


def format_status(w: StatusWindow) -> str:
    """One line, e.g. ``1,234 rec/s | batch 57.3 | p99 queue 12.0 ms | lag 1,024 | in flight 300 | dead 3``."""
    batch = "-" if math.isnan(w.mean_batch_size) else f"{w.mean_batch_size:.1f}"
    delay = "-" if math.isnan(w.p99_queue_delay_s) else f"{w.p99_queue_delay_s * 1000:.1f} ms"
    lag = "-" if w.lag is None else f"{w.lag:,}"
    return (f"{w.records_per_s:,.0f} rec/s | batch {batch} | p99 queue {delay} | lag {lag} | "
            f"in flight {w.num_in_flight:,} | dead-lettered {w.num_dead_lettered:,}"
            + (f" | {w.num_stalled} partitions wait for the schema registry" if w.num_stalled else ""))


class StatusReporter:
    """Prints the status line from ticks. On a TTY, rewrites one line each tick; else logs every 10 s."""

    def __init__(self, stats: OperatorStats, stream: TextIO | None = None, is_tty: bool | None = None,
                 log_interval_s: float = LOG_INTERVAL_S) -> None:
        self.stats = stats
        self.stream = stream if stream is not None else sys.stderr
        self.is_tty = self.stream.isatty() if is_tty is None else is_tty
        self.interval_s = 0.0 if self.is_tty else log_interval_s
        self._last: tuple[float, StatsSnapshot] | None = None
        self._width = 0  # length of the line now on the terminal
        self._handlers: list[logging.Handler] = []
        if self.is_tty:  # log lines to the same terminal first wipe the status line, which the next tick redraws
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is self.stream:
                    handler.addFilter(self._clear_line)
                    self._handlers.append(handler)

    def _clear_line(self, record: logging.LogRecord) -> bool:
        if self._width:
            self.stream.write("\r\x1b[K")
            self._width = 0
        return True

    def tick(self, now_s: float) -> None:
        if self._last is None:
            self._last = (now_s, self.stats.snapshot())
            return
        then_s, earlier = self._last
        if now_s - then_s < self.interval_s:
            return
        snap = self.stats.snapshot()
        line = format_status(window(earlier, snap, now_s - then_s))
        self._last = (now_s, snap)
        if self.is_tty:
            self.stream.write("\r" + line.ljust(self._width))
            self.stream.flush()
            self._width = len(line)
        else:
            log.info("%s", line)

    def close(self) -> None:
        """Leave the terminal on a fresh line."""
        for handler in self._handlers:
            handler.removeFilter(self._clear_line)
        self._handlers.clear()
        if self.is_tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0
