"""Exactly-once: outputs, dead-letter records and input offsets committed in one Kafka transaction.

Owned and driven by the runner's main thread. One transaction spans a group of batches; it closes when
``transaction_max_batches`` batches went into it or ``transaction_interval_ms`` passed, on partition
revoke, and at shutdown. Committing, step by step:

1. hold the engine thread (it finishes its current batch; no produce may run during a commit);
2. flush the producer: every record of the transaction is acknowledged, so the offset tracker's
   watermark now covers exactly the inputs whose outputs are in the transaction;
3. ``send_offsets_to_transaction(watermarks, group metadata)`` then ``commit_transaction``;
4. begin the next transaction and release the engine thread.

Failures: an abortable error aborts the transaction; a timed-out commit or abort is *ambiguous* (the
transaction may or may not have committed; librdkafka lacks KIP-890), so the producer is recreated, whose
``init_transactions`` settles it. Either way the consumer is rewound to the committed offsets and every
record since is processed again -- its earlier outputs were aborted, so a ``read_committed`` reader sees
each once. A fatal error (fenced by a newer instance) stops the operator.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException

from sluice.config import ExactlyOnce
from sluice.operator.record import TopicPartition

log = logging.getLogger(__name__)

_COMMIT_TIMEOUT_S = 30.0
_MAX_RETRIES = 3


class TransactionalSink(Protocol):
    def init_transactions(self, timeout_s: float = 60) -> None: ...
    def begin_transaction(self) -> None: ...
    def commit_transaction(self, offsets: dict[TopicPartition, int], group_metadata: Any, timeout_s: float) -> None: ...
    def abort_transaction(self, timeout_s: float) -> None: ...
    def recreate(self) -> None: ...
    def flush(self, timeout_s: float) -> int: ...


class TransactionalSource(Protocol):
    assignment: set[TopicPartition]

    def group_metadata(self) -> Any: ...
    def rewind(self, tps: Any) -> None: ...


class TransactionFailed(Exception):
    """The transaction could not be committed and the operator must stop (fenced, or fatal error)."""


class Transactions:
    """Groups batches into transactions. ``hold`` / ``release`` stop and restart the engine thread;
    ``watermarks`` reads the offset tracker; ``forget_all`` drops every queued and in-flight record."""

    def __init__(self, cfg: ExactlyOnce, sink: TransactionalSink, source: TransactionalSource, *,
                 hold: Callable[[], None], release: Callable[[], None],
                 watermarks: Callable[[], dict[TopicPartition, int]], forget_all: Callable[[], None]) -> None:
        self.cfg = cfg
        self.sink, self.source = sink, source
        self._hold, self._release, self._watermarks, self._forget_all = hold, release, watermarks, forget_all
        self._opened_s = 0.0
        self._num_batches_at_open = 0
        self._committed: dict[TopicPartition, int] = {}
        self.num_committed = 0
        self.num_aborted = 0
        self.is_open = False  # a transaction is open (between begin and the final commit)

    def start(self, now_s: float, num_batches: int) -> None:
        """Before the first poll: register the transactional id (aborting what a predecessor left open)."""
        try:
            self.sink.init_transactions()
        except KafkaException as err:
            raise TransactionFailed(f"cannot initialise transactions: {err.args[0].str()}") from None
        self._begin(now_s, num_batches)

    def due(self, now_s: float, num_batches: int) -> bool:
        return (num_batches - self._num_batches_at_open >= self.cfg.transaction_max_batches
                or now_s - self._opened_s >= self.cfg.transaction_interval_ms / 1000)

    def commit(self, now_s: float, num_batches: int, reopen: bool = True) -> bool:
        """Commit the open transaction (see the module doc). Returns False when it was aborted and the
        consumer rewound. Raises TransactionFailed when the operator must stop."""
        if not self.is_open:
            return True  # already closed by the final commit (a revoke during close, say)
        self._hold()
        try:
            self.is_open = False
            return self._commit_held()
        finally:
            if reopen:
                self._begin(now_s, num_batches)
            self._release()

    def abort(self, now_s: float, num_batches: int, why: str) -> None:
        """Abort the open transaction and rewind every assigned partition to its committed offsets, then begin
        the next one (a partition was lost: its outputs in this transaction must not commit, and nothing
        else in it can commit without them). Raises TransactionFailed when the operator must stop."""
        if not self.is_open:
            return
        self._hold()
        try:
            self.is_open = False
            self._abort(why)
        finally:
            self._begin(now_s, num_batches)
            self._release()

    def abort_open(self) -> None:
        """Stopping on an error: abort the open transaction now, so that ``read_committed`` readers of the
        output topics do not wait for the broker's transaction timeout. Never raises: a fenced producer
        cannot abort, and needs not (the process that fenced it did)."""
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

    # ------------------------------------------------------------------------------------------ inner

    def _begin(self, now_s: float, num_batches: int) -> None:
        try:
            self.sink.begin_transaction()
        except KafkaException as exc:  # a fatal error (fenced) surfaces here when it came between commits
            raise _fatal("beginning a transaction", exc.args[0]) from None
        self.is_open = True
        self._opened_s, self._num_batches_at_open = now_s, num_batches

    def _commit_held(self) -> bool:
        for attempt in range(_MAX_RETRIES):
            left = self.sink.flush(_COMMIT_TIMEOUT_S)
            if left:
                return self._abort(f"{left} records still undelivered after {_COMMIT_TIMEOUT_S:.0f} s")
            marks = self._watermarks()
            offsets = {tp: off for tp, off in marks.items()
                       if tp in self.source.assignment and self._committed.get(tp) != off}
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
            return True
        return False  # unreachable: the loop returns on its last attempt

    def _abort(self, why: str) -> bool:
        log.warning("aborting the transaction (%s); rewinding to the committed offsets", why)
        try:
            self.sink.abort_transaction(_COMMIT_TIMEOUT_S)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.fatal():
                raise _fatal("transaction abort", err) from None
            return self._ambiguous(f"abort failed: {err.str()}")
        self._rewind()
        return False

    def _ambiguous(self, why: str) -> bool:
        """The outcome is unknown: recreate the producer (its init_transactions settles the old transaction)
        and reprocess from whatever offsets the group has committed."""
        log.warning("transaction outcome unknown (%s); recreating the producer and rewinding", why)
        self.sink.recreate()
        try:
            self.sink.init_transactions()
        except KafkaException as exc:
            raise TransactionFailed(f"cannot re-initialise transactions: {exc.args[0].str()}") from None
        self._committed.clear()
        self._rewind()
        return False

    def _rewind(self) -> None:
        self.num_aborted += 1
        self._forget_all()
        try:
            self.source.rewind(self.source.assignment)
        except KafkaException as exc:
            raise TransactionFailed(f"cannot rewind to the committed offsets: {exc.args[0].str()}") from None


def _fatal(what: str, err: KafkaError) -> TransactionFailed:
    hint = ""
    if err.code() == KafkaError._FENCED or "fenced" in err.str():
        hint = (" (another running process registered the same transactional id. Each needs its own: the "
                "default, sluice-<group>-<hostname>-<slot>, is unique on one host; set "
                "exactly_once.transactional_id per process only where hostnames repeat)")
    return TransactionFailed(f"{what} failed fatally: {err.str()}{hint}")
