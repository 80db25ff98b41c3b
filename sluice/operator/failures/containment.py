"""Per-record containment: the rule every stage follows, and the breaker that bounds it.

**The rule.** Work done for one record -- decoding it, looking up its input field, checking its size and
depth, reading its headers and trace context, the engine's ``prepare`` (tokenising, rendering a prompt),
``item_length``, inference of that record alone, encoding its result, shaping its output key and headers --
may raise *any* ``Exception``. Such an exception is about that record: the record goes to the dead-letter
topic with the exception's real class and message (``sluice.error.class`` / ``message``) and the stage it
failed at, and the operator goes on with the next record. No list of "expected" exception types decides
this: a ``RecursionError`` from a decoder, a ``KeyError`` from a user's ``prepare`` and a ``UnicodeError``
from a tokenizer are treated alike.

Where one call covers many records (``prepare`` of a poll, an observer hook, an engine batch), a failure
of the call is first taken to be about *one* of them: the call is repeated record by record (bisected,
for inference) so that only the records that fail alone are dead-lettered.

What stops the operator instead -- failures that are not about one record:

* the broker or a delivery (a record that cannot be delivered, a fenced producer, a fatal consumer error);
* the engine itself (``step`` of a continuous engine raising, an engine thread bug);
* ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``);
* a failure that is about *every* record: :class:`ConsecutiveFailures` below stops the operator once
  ``dead_letter.max_consecutive_failures`` records in a row have failed, so that a broken engine, codec or
  upstream producer does not quietly move a whole topic to the dead-letter topic.

Each stage says where records enter it: ``Intake.take`` (sluice/operator/intake.py: decode, headers, prepare), the engine workers
(infer), ``Emitter.settle`` (encode, output key and headers, size) and ``Emitter.emit`` (dead letters).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


def error_text(err: BaseException | str) -> tuple[str, str]:
    """(class name, message) of ``err`` for a dead-letter header or a log line. Never raises: a message
    whose ``__str__`` itself fails is described as such instead of taking the record down with it."""
    if isinstance(err, str):
        return "Error", err
    cls = type(err).__name__
    try:
        message = str(err)
    except Exception as inner:  # an exception type with a broken __str__ (a user's, say)
        message = f"<the message could not be read: {type(inner).__name__}>"
    return cls, message or cls


@dataclass
class ConsecutiveFailures:
    """Counts the records that failed since the last record that reached the output topic, and trips when
    that run reaches ``threshold`` (``None``: never).

    Pure bookkeeping; the caller serialises calls (the emitter holds the runner's lock) and reports
    outcomes in the order they were settled.
    """

    threshold: int | None
    run: int = 0  # failures since the last success
    tripped: bool = False

    def observe(self, outcomes: Iterable[bool]) -> int:
        """Report outcomes in order (True: the record made it). Returns how many of the failures among
        them come before the trip -- all of them unless this call trips it; none once it has tripped."""
        allowed = 0
        for succeeded in outcomes:
            if succeeded:
                self.run = 0
                continue
            if self.tripped:
                continue
            self.run += 1
            if self.threshold is not None and self.run >= self.threshold:
                self.tripped = True
            else:
                allowed += 1
        return allowed
