"""Partitions held back while a service their records need is unavailable (the schema registry).

A record that cannot be decoded because the registry is down, slow or refuses the credentials is not a bad
record: it must not go to the dead-letter topic, and nothing after it in its partition may overtake it.
So its partition *stalls*: the record and every later record of that partition already polled are held, in
offset order, the consumer pauses the partition (and keeps polling, so the group keeps it), and the held
records are decoded again with exponential backoff. They were tracked when polled and are not
acknowledged, so the offset watermark -- and every commit -- stays before the first of them. Other
partitions go on. Once a retry decodes them all, the partition resumes. A stall longer than
``max_stall_s`` stops the operator, still without committing past the held records.

:class:`Stalls` is the pure core (no I/O, the clock passed in); :class:`StallingDecoder` puts it between
the codec and the runner's intake.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sluice.codecs.record_codec import CodecError, RecordCodec
from sluice.codecs.schema_registry import RegistryUnavailable
from sluice.operator.observer import Observer
from sluice.operator.record import InputRecord, TopicPartition

log = logging.getLogger(__name__)

Decoded = tuple[InputRecord, Any, Any]  # record, document, model input
Rejected = tuple[InputRecord, str, BaseException | None]  # record, stage, error


@dataclass
class Stall:
    """One stalled partition."""

    since_s: float  # when its first record was held
    next_retry_s: float
    reason: str  # the latest failure, for logs, metrics and the final error
    records: list[InputRecord] = field(default_factory=list)  # held, in offset order
    num_retries: int = 0


class Stalls:
    """The stalled partitions and their held records. Backoff: ``initial_backoff_s`` doubling per failed
    retry up to ``max_backoff_s``. Not thread-safe: the intake thread owns it."""

    def __init__(self, initial_backoff_s: float = 0.1, max_backoff_s: float = 5.0, max_stall_s: float = 300.0) -> None:
        self.initial_backoff_s, self.max_backoff_s, self.max_stall_s = initial_backoff_s, max_backoff_s, max_stall_s
        self._stalls: dict[TopicPartition, Stall] = {}

    def __contains__(self, tp: object) -> bool:
        return tp in self._stalls

    def __len__(self) -> int:
        return len(self._stalls)

    def __getitem__(self, tp: TopicPartition) -> Stall:
        return self._stalls[tp]

    def hold(self, tp: TopicPartition, records: list[InputRecord], now_s: float, reason: str) -> Stall:
        """Hold ``records`` (the partition's earliest undecoded ones, in order) before anything held already.
        A new stall retries after the initial backoff; a failed retry backs off twice as long as the last."""
        stall = self._stalls.get(tp)
        if stall is None:
            stall = self._stalls[tp] = Stall(since_s=now_s, next_retry_s=now_s + self.initial_backoff_s,
                                             reason=reason)
        else:
            stall.num_retries += 1
            backoff = min(self.max_backoff_s, self.initial_backoff_s * 2 ** stall.num_retries)
            stall.next_retry_s, stall.reason = now_s + backoff, reason
        stall.records[:0] = records
        return stall

    def append(self, tp: TopicPartition, record: InputRecord) -> None:
        """A later record of a stalled partition (polled before the pause took effect)."""
        self._stalls[tp].records.append(record)

    def due(self, now_s: float) -> list[TopicPartition]:
        return [tp for tp, s in self._stalls.items() if s.next_retry_s <= now_s]

    def take(self, tp: TopicPartition) -> list[InputRecord]:
        """The held records, for a retry; the partition stays stalled until :meth:`release`."""
        stall = self._stalls[tp]
        records, stall.records = stall.records, []
        return records

    def release(self, tp: TopicPartition, now_s: float) -> float:
        """The retry decoded everything: the stall ends. Returns how long it lasted."""
        return now_s - self._stalls.pop(tp).since_s

    def expired(self, now_s: float) -> tuple[TopicPartition, Stall] | None:
        """A partition stalled longer than ``max_stall_s``, if any."""
        for tp, stall in self._stalls.items():
            if now_s - stall.since_s > self.max_stall_s:
                return tp, stall
        return None

    def forget(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Drop the stalls of ``tps`` (revoked, lost, rewound); returns those that were stalled."""
        return [tp for tp in tps if self._stalls.pop(tp, None) is not None]

    def partitions(self) -> list[TopicPartition]:
        return list(self._stalls)

    def num_held(self) -> int:
        return sum(len(s.records) for s in self._stalls.values())


class StallingDecoder:
    """Decodes polled records, holding back the partitions whose records wait for the registry.

    Intake thread only. ``pause`` / ``resume`` are the source's; the observer hears of each stall and its end.
    """

    def __init__(self, codec: RecordCodec, stalls: Stalls, pause: Callable[[list[TopicPartition]], None],
                 resume: Callable[[list[TopicPartition]], None], observer: Observer) -> None:
        self.codec, self.stalls, self.pause, self.resume, self.observer = codec, stalls, pause, resume, observer

    def decode(self, records: list[InputRecord], now_s: float) -> tuple[list[Decoded], list[Rejected]]:
        """Decoded and rejected records; those of stalled partitions are held (in neither list)."""
        decoded: list[Decoded] = []
        rejected: list[Rejected] = []
        stalls = self.stalls
        if not stalls:  # the common case, kept to one tight loop (it runs once per record)
            decode = self.codec.decode
            for i, r in enumerate(records):
                try:
                    document, value = decode(r.value)
                except CodecError as err:
                    rejected.append((r, err.stage, err))
                    continue
                except RegistryUnavailable as err:  # from here on, partitions may be stalled: the general path
                    self._stall(r.tp, [r], now_s, str(err))
                    more_decoded, more_rejected = self.decode(records[i + 1:], now_s)
                    decoded += more_decoded
                    rejected += more_rejected
                    break
                except Exception as err:  # whatever else one record makes a decoder raise (containment.py)
                    rejected.append((r, "decode", err))
                    continue
                decoded.append((r, document, value))
            return decoded, rejected
        for r in records:
            if r.tp in stalls:
                stalls.append(r.tp, r)
                continue
            unavailable = self._decode_one(r, decoded, rejected)
            if unavailable is not None:
                self._stall(r.tp, [r], now_s, unavailable)
        return decoded, rejected

    def _decode_one(self, r: InputRecord, decoded: list[Decoded], rejected: list[Rejected]) -> str | None:
        """Decode ``r`` into ``decoded`` or ``rejected``; or return why the registry could not help."""
        try:
            document, value = self.codec.decode(r.value)
            decoded.append((r, document, value))
        except CodecError as err:
            rejected.append((r, err.stage, err))
        except RegistryUnavailable as err:  # not the record's fault: its partition waits
            return str(err)
        except Exception as err:  # whatever else one record makes a decoder raise (containment.py)
            rejected.append((r, "decode", err))
        return None

    def retry(self, now_s: float) -> tuple[list[Decoded], list[Rejected], list[TopicPartition]]:
        """Decode the held records of the partitions due for a retry; resume those that went through.
        Returns the decoded and rejected records, and the partitions resumed."""
        decoded: list[Decoded] = []
        rejected: list[Rejected] = []
        resumed: list[TopicPartition] = []
        stalls = self.stalls
        for tp in stalls.due(now_s):
            held = stalls.take(tp)
            for i, r in enumerate(held):
                unavailable = self._decode_one(r, decoded, rejected)
                if unavailable is not None:
                    self._stall(tp, held[i:], now_s, unavailable)
                    break
            else:
                stalled_s = stalls.release(tp, now_s)
                self.resume([tp])
                resumed.append(tp)
                log.info("%s[%d] resumes: the schema registry answered again after %.1f s", tp.topic, tp.partition,
                         stalled_s)
                self.observer.unstalled(tp, stalled_s)
        return decoded, rejected, resumed

    def expired(self, now_s: float) -> str | None:
        """Why the operator must stop (a stall past its limit), or None."""
        found = self.stalls.expired(now_s)
        if found is None:
            return None
        tp, stall = found
        return (f"{tp.topic}[{tp.partition}] waited {now_s - stall.since_s:.0f} s for the schema registry "
                f"(codec.schema_registry.max_outage_s is {self.stalls.max_stall_s:g}): {stall.reason}; stopping "
                f"without committing past {tp.topic}[{tp.partition}]@{stall.records[0].offset if stall.records else '?'}"
                " (its records are processed when the operator runs again)")

    def forget(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        forgotten = self.stalls.forget(tps)
        for tp in forgotten:
            self.observer.unstalled(tp, 0.0)
        return forgotten

    def _stall(self, tp: TopicPartition, records: list[InputRecord], now_s: float, reason: str) -> None:
        first = tp not in self.stalls
        stall = self.stalls.hold(tp, records, now_s, reason)
        retry_in_s = stall.next_retry_s - now_s
        if first:
            self.pause([tp])
            log.warning("%s[%d] paused at offset %d: %s; retrying in %.1f s, nothing past it is committed",
                        tp.topic, tp.partition, records[0].offset, reason, retry_in_s)
        elif stall.num_retries % 10 == 0:
            log.warning("%s[%d] still waits for the schema registry (%.0f s, %d retries): %s", tp.topic, tp.partition,
                        now_s - stall.since_s, stall.num_retries, reason)
        self.observer.stalled(tp, reason, retry_in_s, first)
