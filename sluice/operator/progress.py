"""What the runner's watchdog watches: the probes of the poll loop, the engine and the deliveries, and the
log of its verdicts (sluice/operator/watchdog.py judges them).

Each probe reads counters the owning thread writes -- the loop's turns, the engine thread's finished steps,
the acknowledged outputs -- without a lock, so a wedged thread holding one cannot stop the health check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sluice.operator.ports import Sink
from sluice.operator.state import SharedState
from sluice.operator.watchdog import Probe, Watchdog

log = logging.getLogger(__name__)


class LoopProgress:
    """The poll loop's part: ``running`` while it should turn, ``turns`` counted by the intake thread."""

    __slots__ = ("running", "turns")

    def __init__(self) -> None:
        self.running = False
        self.turns = 0


def run_watchdog(state: SharedState, sink: Sink, loop: LoopProgress, stall_after_s: float,
                 clock: Callable[[], float]) -> Watchdog:
    """The watchdog over one run's poll loop, engine and deliveries."""

    def loop_probe() -> Probe:
        return Probe(loop.running, loop.turns)

    def engine_probe() -> Probe:
        queued = len(state.batcher)  # braked, queued records wait for deliveries (the delivery probe's stall)
        return Probe((queued > 0 and not state.braked) or state.busy, state.num_steps,
                     f"{queued} records queued" + (", a batch running" if state.busy else ""))

    def delivery_probe() -> Probe:
        pending = sink.num_pending()
        summary = state.summary
        return Probe(pending > 0, summary.num_out + summary.num_dead_lettered,
                     f"{pending} outputs waiting for acknowledgement")

    return Watchdog({"poll loop": loop_probe, "engine": engine_probe, "delivery": delivery_probe}, stall_after_s,
                    clock)


def log_changes(watchdog: Watchdog) -> None:
    """One line per part that stalled or moved again since the last call (the poll loop's tick)."""
    stalled, recovered = watchdog.changes()
    for stall in stalled:
        log.warning("stalled: %s (/healthz answers 503 until it moves; runtime.stall_timeout_s is %g)",
                    stall.reason, watchdog.stall_after_s)
    for stall in recovered:
        log.info("%s moves again", stall.part)
