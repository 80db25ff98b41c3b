"""The file sink: outputs to a JSON-lines file or a directory of Parquet parts, dead letters to a JSON-lines
file beside them -- the operator's :class:`~sluice.operator.ports.Sink`, so the emitter, the ledger and the
delivery strategy work on files exactly as on Kafka.

``produce`` (either thread) only queues; the intake thread's ``poll`` writes what is queued, in order, and
then serves the delivery reports, as librdkafka would. When a report is served depends on who reads the
acknowledgements:

* fed by a file source (``durable_acks=False``): once written. The file source's checkpoint is what makes
  rows durable, and it is saved only once the sink says the outputs are (``sync``: fsync, closed Parquet
  parts; sluice/connectors/files/run_checkpoint.py);
* fed by a Kafka topic (``durable_acks=True``): once fsynced, because the consumer commits past a record as
  soon as it is acknowledged. Only JSON lines then (config/connectors.py).

A write that fails (a full disk, a result that does not fit the Parquet schema) fails the delivery of the
records it held: the operator stops without committing past them, with the reason.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sluice.connectors.files.dead_letters import DeadLetterLine
from sluice.connectors.files.writers import JsonLinesWriter, ParquetPartsWriter, SchemaMismatch
from sluice.operator.ports import ProduceFailed
from sluice.operator.record import Headers, TopicPartition

log = logging.getLogger(__name__)

_UNLIMITED_BYTES = 1 << 40  # a file takes a record of any size

Queued = tuple[bool, bytes | None, Headers, Callable[[Any, Any], None]]  # is an output, value, headers, callback


class _Written:
    """What a delivery callback is handed for a record (librdkafka's Message, as far as the emitter looks)."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def topic(self) -> str:
        return self._name


class WriteFailed:
    """A failed write, as a delivery callback's error (the emitter reads ``code`` and ``str``)."""

    def __init__(self, text: str) -> None:
        self._text = text

    def code(self) -> int:
        return -1

    def str(self) -> str:
        return self._text


class FileSink:
    """Writes outputs and dead letters. ``produce`` from either thread; everything else on the intake thread."""

    def __init__(self, out_name: str, output: JsonLinesWriter | ParquetPartsWriter, dead_letter_name: str,
                 dead_letters: JsonLinesWriter, dead_letter_line: DeadLetterLine, *, durable_acks: bool) -> None:
        self.out_name, self.dead_letter_name = out_name, dead_letter_name
        self.output, self.dead_letters, self.dead_letter_line = output, dead_letters, dead_letter_line
        self.durable_acks = durable_acks
        self._queue: list[Queued] = []
        self._cond = threading.Condition()
        self._num_written = 0  # outputs and dead letters written to the files
        self._durable = 0  # of those, how many are durable
        self._failed: str | None = None  # the first write that failed: every later delivery fails too
        self._written = {True: _Written(out_name), False: _Written(dead_letter_name)}

    # ------------------------------------------------------------------------------------- the port

    def produce(self, topic: str, value: bytes | None, key: bytes | None, headers: Headers,
                on_delivery: Callable[[Any, Any], None]) -> None:
        if topic not in (self.out_name, self.dead_letter_name):
            raise ProduceFailed(f"the file sink writes {self.out_name} and {self.dead_letter_name}, not {topic}")
        with self._cond:
            self._queue.append((topic == self.out_name, value, headers, on_delivery))
            self._cond.notify()

    def poll(self, timeout_s: float = 0) -> int:
        """Write what is queued, then serve its delivery reports; waits up to ``timeout_s`` for something."""
        with self._cond:
            if not self._queue and timeout_s > 0:
                self._cond.wait(timeout_s)
            queued, self._queue = self._queue, []
        if not queued:
            return 0
        error = self._failed or self._write(queued)
        if error is None and self.durable_acks:
            self.sync()
        report = None if error is None else WriteFailed(error)
        written = self._written
        for is_output, _, _, on_delivery in queued:
            on_delivery(report, written[is_output])
        return len(queued)

    def flush(self, timeout_s: float) -> int:
        """Write everything queued and make it durable (a Parquet part closed). Returns 0: nothing is left."""
        self.poll(0)
        if self._failed is None:
            try:
                if isinstance(self.output, ParquetPartsWriter):
                    self.output.roll()
                self.sync()
            except (SchemaMismatch, OSError) as err:
                self._fail(f"cannot finish {self.out_name}: {err}")
        return 0

    def num_pending(self) -> int:
        return len(self._queue)  # written and reported on the next poll

    def max_message_bytes(self, topic: str) -> int:
        return _UNLIMITED_BYTES

    def close(self) -> None:
        """After the last flush: close the files."""
        for writer in (self.output, self.dead_letters):
            try:
                if self._failed is None or writer is self.dead_letters:
                    writer.close()
            except (SchemaMismatch, OSError) as err:
                log.warning("closing %s: %s", self.out_name, err)

    # ------------------------------------------------------------------------- for the checkpoint

    @property
    def num_written(self) -> int:
        return self._num_written

    def sync(self) -> tuple[int, dict[str, Any]]:
        """Make durable what is due: the dead letters and JSON-lines output fsynced, a Parquet part closed once
        its roll interval has passed. Returns (how many written records are durable, the durable positions)."""
        if self._failed is not None:
            return self._durable, self._positions()
        written = self._num_written
        try:
            self.dead_letters.sync()
            if isinstance(self.output, JsonLinesWriter):
                self.output.sync()
                self._durable = written
            else:
                if self.output.roll_due():
                    self.output.roll()
                if not self.output.is_open:  # every row written is in a closed part
                    self._durable = written
        except (SchemaMismatch, OSError) as err:
            self._fail(f"cannot make {self.out_name} durable: {err}")
        return self._durable, self._positions()

    def _positions(self) -> dict[str, Any]:
        out = (self.output.positions() if isinstance(self.output, ParquetPartsWriter)
               else {"bytes": self.output.position})
        return {"output": out, "dead_letters": {"bytes": self.dead_letters.position}}

    # ---------------------------------------------------------------------------------- inner

    def _write(self, queued: list[Queued]) -> str | None:
        outputs = [value or b"null" for is_output, value, _, _ in queued if is_output]
        letters = [self._letter(value, headers) for is_output, value, headers, _ in queued if not is_output]
        try:
            if outputs:
                self.output.write(outputs)
            if letters:
                self.dead_letters.write(letters)
        except (SchemaMismatch, OSError) as err:
            return self._fail(f"cannot write {self.out_name}: {err}")
        self._num_written += len(queued)
        return None

    def _letter(self, value: bytes | None, headers: Headers) -> bytes:
        try:
            return self.dead_letter_line(value, headers)
        except Exception as err:  # a dead letter must never be lost to its own formatting
            log.warning("dead letter written without its record: %s", err)
            return self.dead_letter_line(None, headers)

    def _fail(self, reason: str) -> str:
        if self._failed is None:
            log.error("%s", reason)
            self._failed = reason
        return self._failed

    # ----------------------------------------------- transactions: never called (files are at-least-once)

    def init_transactions(self, timeout_s: float = 60) -> None:
        raise ProduceFailed("a file sink has no transactions (delivery: exactly_once needs a Kafka sink)")

    def begin_transaction(self) -> None:
        self.init_transactions()

    def commit_transaction(self, offsets: dict[TopicPartition, int], group_metadata: Any, timeout_s: float) -> None:
        self.init_transactions()

    def abort_transaction(self, timeout_s: float) -> None:
        self.init_transactions()

    def recreate(self) -> None:
        self.init_transactions()
