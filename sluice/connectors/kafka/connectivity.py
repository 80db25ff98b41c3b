"""Broker connectivity logged by state change: one line when lost, a summary while down, one line when back.

With the brokers down, librdkafka reports every failed connection attempt, to every broker, from every
client -- dozens of lines a second that bury everything else in an operator's log. A client's
:class:`ConnectivityLog` turns those reports into states:

* the first connectivity error: one WARNING line, ``<client>: lost the brokers: <error>``;
* while they stay unreachable: one WARNING summary every ``summary_every_s`` (how long, how many errors,
  the latest one); the reports in between go to DEBUG;
* the first sign they answer again (:meth:`reachable`: a broker up in the client's statistics,
  sluice/connectors/kafka/statistics.py): one INFO line, ``<client>: brokers reachable again after N s``.

Errors that are not about reaching the brokers pass through as they are. Pure: the clock and the logger are
passed in. Thread-safe (librdkafka calls back on whichever thread polls).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import KafkaError

# librdkafka's codes for "cannot reach a broker" (as opposed to a broker refusing something)
_UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
                          KafkaError._TIMED_OUT, KafkaError._SSL})


def is_connectivity(err: KafkaError) -> bool:
    return err.code() in _UNREACHABLE


class ConnectivityLog:
    """One client's view of whether the brokers answer, logged by change. ``summary_every_s``: how often a
    summary line comes while they stay down."""

    def __init__(self, client: str, logger: logging.Logger, clock: Callable[[], float],
                 summary_every_s: float = 30.0) -> None:
        self.client, self.log, self.clock, self.summary_every_s = client, logger, clock, summary_every_s
        self._lock = threading.Lock()
        self.down_since_s: float | None = None
        self._num_errors = 0
        self._last_summary_s = 0.0

    @property
    def is_down(self) -> bool:
        return self.down_since_s is not None

    def error(self, text: str) -> None:
        """A connectivity error from the client."""
        with self._lock:
            now = self.clock()
            if self.down_since_s is None:
                self.down_since_s, self._last_summary_s, self._num_errors = now, now, 1
                self.log.warning("%s: lost the brokers: %s (retrying; one line every %.0f s while down)",
                                 self.client, text, self.summary_every_s)
                return
            self._num_errors += 1
            if now - self._last_summary_s >= self.summary_every_s:
                self._last_summary_s = now
                self.log.warning("%s: brokers still unreachable after %.0f s (%d errors; latest: %s)", self.client,
                                 now - self.down_since_s, self._num_errors, text)
            else:
                self.log.debug("%s: %s", self.client, text)

    def reachable(self) -> None:
        """A sign the brokers answer. Cheap when they never went away (one attribute read)."""
        if self.down_since_s is None:
            return
        with self._lock:
            if self.down_since_s is None:
                return
            down_s, self.down_since_s = self.clock() - self.down_since_s, None
            self.log.info("%s: brokers reachable again after %.0f s", self.client, down_s)


class QuietConnectionLines(logging.Filter):
    """On a librdkafka logger: its lines about failed connections (``FAIL``, the same events the error
    callback reports to the :class:`ConnectivityLog`) are demoted to DEBUG; every other line passes as it is.
    confluent-kafka logs ``(facility, client name, message)`` as the record's arguments."""

    _FACILITIES = frozenset({"FAIL", "CONNECT", "ERROR"})

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args and args[0] in self._FACILITIES and record.levelno > logging.DEBUG:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


_QUIET = QuietConnectionLines()


def librdkafka_logger(client: str) -> logging.Logger:
    """The logger a librdkafka client of Sluice's logs through (``sluice.librdkafka.<client>``), its
    connection-failure lines demoted to DEBUG."""
    logger = logging.getLogger(f"sluice.librdkafka.{client}")
    logger.addFilter(_QUIET)  # once: a filter already there is not added again
    return logger
