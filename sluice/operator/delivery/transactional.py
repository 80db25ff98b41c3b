"""Exactly-once: outputs, dead-letter records and input offsets committed in one Kafka transaction.

One transaction spans a group of batches; it closes when ``transaction_max_batches`` batches went into it or
``transaction_interval_ms`` passed (``tick``), on partition revoke, and at shutdown. An interval in which
nothing was consumed, produced or dead-lettered and no offset moved commits nothing: the open transaction
stays open (librdkafka begins one locally; the broker hears of it at its first record) and the interval
starts again, so an idle pipeline sends the broker no empty transactions. Committing, step by step:

1. hold the engine thread (it finishes its current batch; no produce may run during a commit);
2. flush the producer: every record of the transaction is acknowledged, so the ledger's watermark now
   covers exactly the inputs whose outputs are in the transaction (the ledger releases outputs in input
   order per partition: ``in_order``, sluice/operator/ledger.py);
3. ``send_offsets_to_transaction(watermarks, group metadata)`` then ``commit_transaction``;
4. begin the next transaction and release the engine thread.

Failures, sorted here and each handled in one place: an *abortable* error aborts the transaction; a
timed-out commit or abort is *ambiguous* (the transaction may or may not have committed; librdkafka lacks
KIP-890), so the producer is recreated, whose ``init_transactions`` settles it. Either way every record in
flight is dropped and the consumer rewound to the committed offsets (:data:`Outcome.REWOUND`): everything
since is processed again, and its earlier outputs were aborted, so a ``read_committed`` reader sees each
once. A *fatal* error (fenced by a newer instance) stops the operator; so does stopping on any other error,
which aborts the open transaction at once rather than leave readers waiting for its timeout. Offsets are
never committed outside a transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

from sluice.config import Pipeline
from sluice.operator.delivery.strategy import Delivery, Outcome
from sluice.operator.ports import Sink, Source
from sluice.operator.record import TopicPartition, names
from sluice.operator.state import SharedState

log = logging.getLogger(__name__)

_COMMIT_TIMEOUT_S = 30.0
_MAX_RETRIES = 3


class TransactionFailed(Exception):
    """The transaction could not be committed and the operator must stop (fenced, or fatal error)."""


class Transactional(Delivery):
    """Groups batches into transactions (see the module doc)."""

    in_order = True  # a transaction must never hold an output its offsets do not cover

    def __init__(self, pipeline: Pipeline, state: SharedState, source: Source, sink: Sink,
                 clock: Callable[[], float]) -> None:
        super().__init__(pipeline, state, source, sink, clock)
        self.cfg = pipeline.exactly_once
        self._opened_s = 0.0
        self._num_batches_at_open = 0
        self._activity_at_open = (0, 0, 0, 0)
        self._committed: dict[TopicPartition, int] = {}
        self.num_committed = 0
        self.num_aborted = 0
        self.is_open = False  # a transaction is open (between begin and the final commit)

    # -------------------------------------------------------------------------- the runner's calls

    def start(self, now_s: float) -> None:
        """Register the transactional id (aborting what a predecessor left open), begin the first one."""
        try:
            try:
                self.sink.init_transactions()
            except KafkaException as err:
                raise TransactionFailed(f"cannot initialise transactions: {err.args[0].str()}") from None
            self._begin(now_s)
        except TransactionFailed as err:
            self.state.stop(str(err))

    def tick(self, now_s: float) -> Outcome:
        if self.state.summary.num_batches - self._num_batches_at_open >= self.cfg.transaction_max_batches:
            return self._guarded(self._commit, now_s, True)
        if now_s - self._opened_s >= self.cfg.transaction_interval_ms / 1000:
            if self.is_open and self._activity() == self._activity_at_open and not self._offsets_to_commit():
                self._opened_s = now_s  # nothing in it: no commit, the interval starts again
                return Outcome.KEPT
            return self._guarded(self._commit, now_s, True)
        return Outcome.KEPT

    def revoke(self, tps: list[TopicPartition]) -> Outcome:
        """Commit first: the open transaction holds the outputs of these partitions' in-flight records. After
        a fatal error (a fenced producer) nothing is committed: the outputs of the acknowledged records
        belong to an aborted transaction, and committing their offsets would lose them."""
        if self.state.stop_reason is not None:
            return Outcome.KEPT
        return self._guarded(self._commit, self.clock(), True)

    def lost(self, tps: list[TopicPartition]) -> Outcome:
        """The open transaction holds outputs of the lost partitions, which their new owner redoes: abort
        it, and rewind the partitions still ours (its other outputs go with it)."""
        if self.state.stop_reason is not None:
            return Outcome.KEPT
        return self._guarded(self._abort_and_reopen, self.clock(), f"lost {names(tps)}")

    def shutdown(self, deadline_s: float, forced: bool = False) -> None:
        """The last commit; or, stopping on an error or forced, abort the open transaction now, so that
        ``read_committed`` readers of the output topics do not wait for the broker's transaction timeout."""
        if self.state.stop_reason is None and not forced:
            self._guarded(self._commit, self.clock(), False)
        else:
            self._abort_open()

    # ------------------------------------------------------------------------------------------ inner

    def _guarded(self, step: Callable[..., Outcome], *args: object) -> Outcome:
        try:
            return step(*args)
        except TransactionFailed as err:
            self.state.stop(str(err))
            return Outcome.KEPT

    def _commit(self, now_s: float, reopen: bool) -> Outcome:
        if not self.is_open:
            return Outcome.KEPT  # already closed by the final commit (a revoke during close, say)
        with self.state.engine_held(self.sink.poll):
            self.is_open = False
            try:
                return self._commit_held()
            finally:
                if reopen:
                    self._begin(now_s)

    def _abort_and_reopen(self, now_s: float, why: str) -> Outcome:
        if not self.is_open:
            return Outcome.KEPT
        with self.state.engine_held(self.sink.poll):
            self.is_open = False
            try:
                return self._abort(why)
            finally:
                self._begin(now_s)

    def _abort_open(self) -> None:
        """Never raises: a fenced producer cannot abort, and needs not (the process that fenced it did)."""
        if not self.is_open:
            return
        self.is_open = False
        try:
            self.sink.abort_transaction(_COMMIT_TIMEOUT_S)
            self.num_aborted += 1
            log.info("aborted the open transaction: its records will be processed again")
        except KafkaException as exc:
            log.warning("could not abort the open transaction (%s); the broker aborts it after "
                        "transaction_timeout_ms", exc.args[0].str())

    def _begin(self, now_s: float) -> None:
        try:
            self.sink.begin_transaction()
        except KafkaException as exc:  # a fatal error (fenced) surfaces here when it came between commits
            raise _fatal("beginning a transaction", exc.args[0]) from None
        self.is_open = True
        self._opened_s, self._num_batches_at_open = now_s, self.state.summary.num_batches
        self._activity_at_open = self._activity()

    def _activity(self) -> tuple[int, int, int, int]:
        """What the run has consumed, produced, dead-lettered and batched so far: unchanged, nothing new."""
        with self.state.cond:
            s = self.state.summary
            return s.num_in, s.num_out, s.num_dead_lettered, s.num_batches

    def _offsets_to_commit(self) -> dict[TopicPartition, int]:
        """The assigned partitions' watermarks that moved since the last commit."""
        with self.state.cond:
            marks = self.state.ledger.watermarks()
        return {tp: off for tp, off in marks.items()
                if tp in self.source.assignment and self._committed.get(tp) != off}

    def _commit_held(self) -> Outcome:
        for attempt in range(_MAX_RETRIES):
            left = self.sink.flush(_COMMIT_TIMEOUT_S)
            if left:
                return self._abort(f"{left} records still undelivered after {_COMMIT_TIMEOUT_S:.0f} s")
            offsets = self._offsets_to_commit()
            try:
                self.sink.commit_transaction(offsets, self.source.group_metadata(), _COMMIT_TIMEOUT_S)
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.fatal():
                    raise _fatal("transaction commit", err) from None
                if err.txn_requires_abort():
                    return self._abort(err.str())
                if err.code() == KafkaError._TIMED_OUT:
                    return self._ambiguous(f"commit timed out: {err.str()}")
                if err.retriable() and attempt + 1 < _MAX_RETRIES:
                    log.info("transaction commit failed (%s); retrying", err.str())
                    continue
                return self._ambiguous(f"commit failed: {err.str()}")
            self._committed.update(offsets)
            self.num_committed += 1
            return Outcome.KEPT
        raise AssertionError("unreachable: the loop returns on its last attempt")

    def _abort(self, why: str) -> Outcome:
        log.warning("aborting the transaction (%s); rewinding to the committed offsets", why)
        try:
            self.sink.abort_transaction(_COMMIT_TIMEOUT_S)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.fatal():
                raise _fatal("transaction abort", err) from None
            return self._ambiguous(f"abort failed: {err.str()}")
        return self._rewind()

    def _ambiguous(self, why: str) -> Outcome:
        """The outcome is unknown: recreate the producer (its init_transactions settles the old transaction)
        and reprocess from whatever offsets the group has committed."""
        log.warning("transaction outcome unknown (%s); recreating the producer and rewinding", why)
        self.sink.recreate()
        try:
            self.sink.init_transactions()
        except KafkaException as exc:
            raise TransactionFailed(f"cannot re-initialise transactions: {exc.args[0].str()}") from None
        self._committed.clear()
        return self._rewind()

    def _rewind(self) -> Outcome:
        """With the engine held: drop everything in flight, seek back to the committed offsets."""
        self.num_aborted += 1
        self.state.drop_all()
        try:
            self.source.rewind(self.source.assignment)
        except KafkaException as exc:
            raise TransactionFailed(f"cannot rewind to the committed offsets: {exc.args[0].str()}") from None
        return Outcome.REWOUND


def _fatal(what: str, err: KafkaError) -> TransactionFailed:
    hint = ""
    if err.code() == KafkaError._FENCED or "fenced" in err.str():
        hint = (" (another running process registered the same transactional id. Each needs its own: the "
                "default, sluice-<group>-<hostname>-<slot>, is unique on one host; set "
                "exactly_once.transactional_id per process only where hostnames repeat)")
    return TransactionFailed(f"{what} failed fatally: {err.str()}{hint}")
