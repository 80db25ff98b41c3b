"""The live status of ``sluice run``: one line rewritten in place on a terminal, a log line otherwise.

Driven by the observer's tick (about once a second, on the intake thread). Each report covers the window since the
previous one: records/s (outputs and dead-letter records acknowledged), mean batch size, p99 queue delay
(of the window's own delays, sluice/telemetry/recent.py -- not a bucket bound of the run's histogram),
consumer lag, records in flight, and dead-lettered records since start.

A bounded run (files, ``--until-end``) also shows its progress: records done of the total (done + in flight
+ not yet read: the source's lag), and an ETA at the run's average rate so far -- on a terminal as a bar in
front of the line, in the log lines as a percentage. At the end, :meth:`StatusReporter.finish` writes the
run's one summary line (:func:`format_summary`; ``sluice run`` writes no other): records done, the rate over
the time spent working -- first record polled to last output acknowledged, so an ``--idle-exit`` wait or a
wait for the first record does not dilute it -- the wall time beside it, and for an LLM engine its tokens.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

import numpy as np

from sluice.telemetry.stats import OperatorStats, StatsSnapshot

if TYPE_CHECKING:
    from sluice.operator.state import RunSummary

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
    progress: Progress | None = None  # a bounded run's


@dataclass(frozen=True)
class Progress:
    """How far a bounded run is."""

    num_done: int  # records with every output delivered (dead letters included), since the run began
    num_left: int  # in flight, plus not read yet (JSON-lines files: estimated from their bytes)
    eta_s: float | None  # at the average rate so far; None before any record is done

    @property
    def fraction(self) -> float:
        total = self.num_done + self.num_left
        return self.num_done / total if total else 1.0


def progress(done: int, left: int, rate_per_s: float) -> Progress:
    """A bounded run's progress, its ETA from ``rate_per_s`` (records done per second so far)."""
    return Progress(done, left, left / rate_per_s if rate_per_s > 0 else None)


def window(earlier: StatsSnapshot, now: StatsSnapshot, elapsed_s: float,
           progress: Progress | None = None, queue_delays_s: np.ndarray | None = None) -> StatusWindow:
    """The status between two snapshots taken ``elapsed_s`` apart. ``queue_delays_s``: the window's own
    delays (or a uniform sample of them), whose p99 is exact; without them, the histogram's estimate."""
    done = (now.num_out + now.total_dead_lettered) - (earlier.num_out + earlier.total_dead_lettered)
    num_batches = now.num_batches - earlier.num_batches
    sizes = now.batch_size.minus(earlier.batch_size)
    delays = now.queue_delay_s.minus(earlier.queue_delay_s)
    return StatusWindow(
        records_per_s=done / elapsed_s if elapsed_s > 0 else 0.0,
        mean_batch_size=sizes.total / num_batches if num_batches else math.nan,
        p99_queue_delay_s=delays.quantile(0.99) if queue_delays_s is None else percentile(queue_delays_s, 0.99),
        lag=sum(now.lag.values()) if now.lag else None,
        num_in_flight=now.num_in_flight,
        num_dead_lettered=now.total_dead_lettered,
        num_stalled=now.num_stalled,
        progress=progress,
    )


def percentile(values: np.ndarray, q: float) -> float:
    """Quantile ``q`` (0..1) of ``values``, interpolated between the two nearest; NaN when there are none."""
    return float(np.quantile(values, q)) if values.size else math.nan


def format_status(w: StatusWindow) -> str:
    """One line, e.g. ``1,234 rec/s | batch 57.3 | p99 queue 12.0 ms | lag 1,024 | in flight 300 | dead 3``;
    a bounded run's begins ``42% 4,200/10,000 | ETA 1m05s | ``."""
    batch = "-" if math.isnan(w.mean_batch_size) else f"{w.mean_batch_size:.1f}"
    delay = "-" if math.isnan(w.p99_queue_delay_s) else f"{w.p99_queue_delay_s * 1000:.1f} ms"
    lag = "-" if w.lag is None else f"{w.lag:,}"
    done = ""
    if w.progress is not None:
        p = w.progress
        done = (f"{100 * p.fraction:.0f}% {p.num_done:,}/{p.num_done + p.num_left:,} | "
                f"ETA {'-' if p.eta_s is None else format_duration(p.eta_s)} | ")
    return (f"{done}{w.records_per_s:,.0f} rec/s | batch {batch} | p99 queue {delay} | lag {lag} | "
            f"in flight {w.num_in_flight:,} | dead-lettered {w.num_dead_lettered:,}"
            + (f" | {w.num_stalled} partitions wait for the schema registry" if w.num_stalled else ""))


def format_bar(p: Progress, width: int = 24) -> str:
    """``[#########---------------]``: the done share of ``width`` cells."""
    filled = min(width, int(p.fraction * width))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def format_duration(seconds: float) -> str:
    """``45s``, ``12m05s``, ``3h07m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass(frozen=True)
class RunTotals:
    """What a whole run did, for its summary line."""

    num_in: int  # records polled
    num_out: int  # outputs acknowledged
    num_dead_lettered: int
    num_batches: int
    num_batched: int  # records in those batches
    wall_s: float  # the run, start to stop
    work_s: float | None  # first record polled to last output acknowledged; None before any was
    tokens: tuple[int, int] | None = None  # an LLM engine's (prompt, output) tokens

    @property
    def num_done(self) -> int:
        return self.num_out + self.num_dead_lettered


def totals_of_snapshot(snap: StatsSnapshot, wall_s: float, tokens: tuple[int, int] | None = None) -> RunTotals:
    """The observer's counts (what the status line's summary says)."""
    work_s = (snap.last_out_s - snap.first_in_s
              if snap.first_in_s is not None and snap.last_out_s is not None else None)
    return RunTotals(snap.num_in, snap.num_out, snap.total_dead_lettered, snap.num_batches,
                     int(snap.batch_size.total), wall_s, work_s, tokens)


def totals_of_summary(summary: RunSummary) -> RunTotals:
    """The runner's own counts (what ``sluice run`` says when the status line is off)."""
    return RunTotals(summary.num_in, summary.num_out, summary.num_dead_lettered, summary.num_batches,
                     summary.num_batched_records, summary.elapsed_s, summary.work_s)


def format_summary(t: RunTotals) -> str:
    """The run in one line: ``10,000 records in 12.3 s of work (813 rec/s): 9,998 outputs, 2 dead-lettered |
    10,000 in, 320 batches (mean size 31.2) | 20.1 s wall``, and for an LLM engine ``| tokens: 41,000
    prompt, 9,600 output (780 output tok/s)``. The rates are over the working time, never the wall time."""
    work_s = t.work_s if t.work_s is not None and t.work_s > 0 else None
    rate = f" in {_seconds(work_s)} of work ({t.num_done / work_s:,.0f} rec/s)" if work_s is not None else ""
    mean = f" (mean size {t.num_batched / t.num_batches:.1f})" if t.num_batches else ""
    line = (f"{t.num_done:,} records{rate}: {t.num_out:,} outputs, {t.num_dead_lettered:,} dead-lettered | "
            f"{t.num_in:,} in, {t.num_batches:,} batches{mean} | {_seconds(t.wall_s)} wall")
    if t.tokens is not None:
        prompt, output = t.tokens
        speed = f" ({output / work_s:,.0f} output tok/s)" if work_s is not None else ""
        line += f" | tokens: {prompt:,} prompt, {output:,} output{speed}"
    return line


def _seconds(s: float) -> str:
    """``12.3 s``; under a second ``45 ms``."""
    return f"{s:.1f} s" if s >= 1 else f"{s * 1000:.0f} ms"


class StatusReporter:
    """Prints the status line from ticks. On a TTY, rewrites one line each tick; else logs every 10 s."""

    def __init__(self, stats: OperatorStats, stream: TextIO | None = None, is_tty: bool | None = None,
                 log_interval_s: float = LOG_INTERVAL_S) -> None:
        self.stats = stats
        self.stream = stream if stream is not None else sys.stderr
        self.is_tty = self.stream.isatty() if is_tty is None else is_tty
        self.interval_s = 0.0 if self.is_tty else log_interval_s
        self._last: tuple[float, StatsSnapshot] | None = None
        self.bounded = False  # set once by the observer: show progress and an ETA
        self._first: tuple[float, int] | None = None  # (time, records done) at the first tick, for the ETA
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
            snap = self.stats.snapshot()
            self._last = (now_s, snap)
            self._first = (now_s, snap.num_out + snap.total_dead_lettered)
            self.stats.recent_queue_delay_s.take()  # the first window begins now
            return
        then_s, earlier = self._last
        if now_s - then_s < self.interval_s:
            return
        snap = self.stats.snapshot()
        done = self._progress(now_s, snap) if self.bounded else None
        line = format_status(window(earlier, snap, now_s - then_s, done, self.stats.recent_queue_delay_s.take()))
        self._last = (now_s, snap)
        if self.is_tty:
            if done is not None:
                line = f"{format_bar(done)} {line}"
            self.stream.write("\r" + line.ljust(self._width))
            self.stream.flush()
            self._width = len(line)
        else:
            log.info("%s", line)

    def _progress(self, now_s: float, snap: StatsSnapshot) -> Progress:
        done = snap.num_out + snap.total_dead_lettered
        left = snap.num_in_flight + sum(snap.lag.values())
        first_s, first_done = self._first or (now_s, 0)
        rate = (done - first_done) / (now_s - first_s) if now_s > first_s else 0.0
        return progress(done, left, rate)

    def finish(self, elapsed_s: float, tokens: tuple[int, int] | None = None) -> None:
        """The summary line, once the run is over (``elapsed_s``: its wall time); then :meth:`close`."""
        line = format_summary(totals_of_snapshot(self.stats.snapshot(), elapsed_s, tokens))
        if self.is_tty:
            self.stream.write("\r" + f"done: {line}".ljust(self._width) + "\n")
            self.stream.flush()
            self._width = 0
        else:
            log.info("done: %s", line)
        self.close()

    def close(self) -> None:
        """Leave the terminal on a fresh line."""
        for handler in self._handlers:
            handler.removeFilter(self._clear_line)
        self._handlers.clear()
        if self.is_tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0
