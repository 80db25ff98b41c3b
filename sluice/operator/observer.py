"""What the runner tells the outside world as records move: the hook points of tracing, metrics and status.

The runner calls an :class:`Observer` at fixed points, per poll, per batch and per delivery -- never per
record unless the observer asks for it (``injects_headers``), so an observer that is off costs nothing per
record. Calls come from two threads, the intake thread (the caller's: poll, delivery reports) and the engine
thread (see each method); an observer guards its own shared state.

Per-record state an observer needs later (a trace context, say) goes into ``InputRecord.trace``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.engines.identity import ModelIdentity
from sluice.operator.record import InputRecord, Pending, TopicPartition
from sluice.operator.reload.outcome import ReloadOutcome


class Observer:
    """Base observer: every hook does nothing. Subclasses override what they need."""

    injects_headers = False  # True: the runner calls ``output_headers`` once per produced record
    summarised = False  # True once ``stopped`` wrote the run's summary line (``sluice run`` then writes none)

    def engine_started(self, engine: Any, warmup_s: float) -> None:
        """Intake thread, once, before the runner is built: ``engine.start()`` (load, warm-up) took ``warmup_s``."""

    def model_serving(self, engine: Any, identity: ModelIdentity, warmup_s: float) -> None:
        """The model that runs the batches from now on: intake thread at the start of the run, engine thread
        at a reload's switch (between two batches: the batch hooks that follow are the new model's)."""

    def model_reloaded(self, outcome: ReloadOutcome) -> None:
        """Reloader thread: a reload attempt ended (ready to switch, unchanged, or failed and why)."""

    def bounded(self) -> None:
        """Intake thread, once, before ``started``: the source ends by itself (files, ``--until-end``), so the
        lag given to ``tick`` is what is left to do (progress and an ETA can be shown)."""

    def watching(self, watchdog: Any) -> None:
        """Intake thread, once, before ``started``: the run's progress
        :class:`~sluice.operator.watchdog.Watchdog`; its ``check()`` may be called from any thread."""

    def started(self) -> None:
        """Intake thread, once, before the first poll (the engine is started and warmed up by then)."""

    def assigned(self, tps: Sequence[TopicPartition]) -> None:
        """Intake thread: partitions were assigned."""

    def revoked(self, tps: Sequence[TopicPartition]) -> None:
        """Intake thread: partitions were revoked or lost (their in-flight work is finished or dropped)."""

    def polled(self, records: Sequence[InputRecord], now_s: float) -> None:
        """Intake thread: records just polled (before decoding). ``now_s`` is the runner's monotonic clock."""

    def rejected(self, failures: Sequence[tuple[InputRecord, str, BaseException | None]]) -> None:
        """Either thread: records that go to the dead-letter topic (or stop the operator): (record, stage, error)."""

    def stalled(self, tp: TopicPartition, reason: str, retry_in_s: float, first: bool) -> None:
        """Intake thread: ``tp`` is paused because its next record waits for the schema registry (``first``: it
        just stalled; else a retry failed). Its records are retried in ``retry_in_s``."""

    def unstalled(self, tp: TopicPartition, stalled_s: float) -> None:
        """Intake thread: ``tp``'s stall ended after ``stalled_s`` (its records went through, or it was revoked)."""

    def batch_started(self, batch: Sequence[Pending], now_s: float) -> Any:
        """Engine thread: a batch leaves the batcher for the engine. The return value comes back below."""
        return None

    def batch_finished(self, handle: Any, batch: Sequence[Pending], infer_s: float, num_failed: int) -> None:
        """Engine thread: the engine returned for ``batch`` after ``infer_s`` seconds (bisection included)."""

    def batching_decided(self, decision: Any) -> None:
        """Engine thread, with ``latency_target_ms`` only: the adaptive batcher's latest
        :class:`~sluice.operator.adaptive.Decision` (chosen size, predicted service, arrival rate)."""

    def output_headers(self, record: InputRecord, stage: str | None) -> list[tuple[str, bytes]]:
        """Either thread, per produced record when ``injects_headers``: extra headers for the output of
        ``record`` (``stage`` is None for an output, the failing stage for a dead-letter record)."""
        return []

    def delivered(self, records: Sequence[InputRecord], num_dead_lettered: int, now_s: float) -> None:
        """Intake thread: every output of ``records`` is acknowledged by the broker."""

    def tick(self, now_s: float, num_in_flight: int, lag: dict[TopicPartition, int]) -> None:
        """Intake thread, about once a second: a moment for status lines and gauges."""

    def stopping(self) -> None:
        """Intake thread, once: the run stops taking records and drains (readiness ends here)."""

    def stopped(self) -> None:
        """Intake thread, once, after the final commit (or when the operator fails to start after the observer
        was built: then it releases what the observer holds)."""
