"""At-least-once: the ledger's watermark is stored as delivery reports come in, and committed by the consumer.

For every input record, step by step:

1. the ledger tracks it as soon as it is polled -- before anything can be produced for it;
2. its output (or dead-letter record) is produced with the rest of its batch, under one delivery callback
   whose count of outstanding reports is set before the first produce (sluice/operator/emitter.py);
3. the ledger acks it once every record of that batch has a successful delivery report;
4. here, every ``runtime.commit_interval_ms``, only the ledger's watermark is *stored*, and the consumer
   commits what was stored (librdkafka's auto-commit); on revoke and at shutdown it is committed at once.

A record that is never acked (no dead-letter topic, a delivery failure) holds the watermark before it, so
nothing past it is committed. A crash re-processes at most what was in flight.
"""

from __future__ import annotations

import logging

from sluice.operator.delivery.strategy import Delivery, Outcome
from sluice.operator.record import TopicPartition

log = logging.getLogger(__name__)


class AtLeastOnce(Delivery):
    in_order = False  # offsets commit by watermark, which never passes an unfinished record

    _last_store_s = 0.0

    def start(self, now_s: float) -> None:
        self._last_store_s = now_s

    def tick(self, now_s: float) -> Outcome:
        if now_s - self._last_store_s >= self.pipeline.runtime.commit_interval_ms / 1000:
            self.source.store(self._watermarks())
            self._last_store_s = now_s
        return Outcome.KEPT

    def revoke(self, tps: list[TopicPartition]) -> Outcome:
        """Finish the engine's current batch, wait for every delivery, commit the revoked partitions'
        watermarks: their next owner starts where this process stopped, so a scale-down repeats nothing."""
        with self.state.engine_held(self.sink.poll):
            self.sink.flush(self.pipeline.runtime.drain_timeout_s)
            revoked = set(tps)
            watermarks = {tp: off for tp, off in self._watermarks().items() if tp in revoked}
        self.source.commit(watermarks)
        return Outcome.KEPT

    def shutdown(self, deadline_s: float, forced: bool = False) -> None:
        # forced: the reports already in are served, nothing is waited for; the watermark covers only
        # records whose every output is acknowledged, so committing it is safe either way
        left = self.sink.flush(0 if forced else max(1.0, deadline_s - self.clock()))
        with self.state.cond:
            watermarks = self.state.ledger.watermarks()
            unfinished = self.state.ledger.num_in_flight
        if left or unfinished:
            log.warning("drain timeout: %d records unfinished, %d deliveries outstanding; "
                        "they stay uncommitted and will be processed again", unfinished, left)
        self.source.commit(watermarks)

    def _watermarks(self) -> dict[TopicPartition, int]:
        with self.state.cond:
            return self.state.ledger.watermarks()
