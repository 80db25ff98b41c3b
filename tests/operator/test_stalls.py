"""Stalled partitions: the pure core with an injected clock, and the decoder that holds records back."""

from __future__ import annotations

from typing import Any

from sluice.codecs.record_codec import CodecError
from sluice.codecs.schema_registry import RegistryUnavailable
from sluice.operator.observer import Observer
from sluice.operator.record import InputRecord, TopicPartition
from sluice.operator.stalls import StallingDecoder, Stalls

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def rec(tp: TopicPartition, offset: int, value: bytes = b"ok") -> InputRecord:
    return InputRecord(value, None, [], tp, offset, None, 0.0)


def test_backoff_doubles_per_failed_retry_up_to_the_cap_and_records_keep_their_order() -> None:
    stalls = Stalls(initial_backoff_s=0.1, max_backoff_s=1.0, max_stall_s=10)
    stalls.hold(A, [rec(A, 5)], now_s=0.0, reason="down")
    stalls.append(A, rec(A, 6))
    assert stalls.due(0.05) == [] and stalls.due(0.1) == [A]
    waits = []
    now = 0.1
    for _ in range(6):
        held = stalls.take(A)
        assert [r.offset for r in held] == [5, 6]
        stall = stalls.hold(A, held, now, "still down")  # the retry failed on the first record
        waits.append(round(stall.next_retry_s - now, 3))
        now = stall.next_retry_s
    assert waits == [0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert stalls[A].reason == "still down" and stalls[A].since_s == 0.0


def test_a_failed_retry_part_way_holds_the_rest_before_later_records() -> None:
    stalls = Stalls()
    stalls.hold(A, [rec(A, 1), rec(A, 2)], 0.0, "down")
    held = stalls.take(A)
    stalls.append(A, rec(A, 3))  # polled meanwhile
    stalls.hold(A, held[1:], 1.0, "down")  # offset 1 went through, 2 did not
    assert [r.offset for r in stalls.take(A)] == [2, 3]


def test_expiry_release_and_forget() -> None:
    stalls = Stalls(max_stall_s=30)
    stalls.hold(A, [rec(A, 1)], 0.0, "down")
    stalls.hold(B, [rec(B, 1)], 20.0, "down")
    assert stalls.expired(30.0) is None
    tp, stall = stalls.expired(30.5) or (None, None)
    assert tp == A and stall is not None and stall.since_s == 0.0
    assert stalls.release(A, 31.0) == 31.0 and A not in stalls
    assert stalls.forget([A, B]) == [B] and len(stalls) == 0


class _Codec:
    """Decodes b'ok'; raises RegistryUnavailable while ``down``; b'bad' is the record's fault."""

    def __init__(self) -> None:
        self.down = False

    def decode(self, value: bytes) -> tuple[Any, Any]:
        if value == b"bad":
            raise CodecError("decode", "bad bytes")
        if self.down:
            raise RegistryUnavailable("the schema registry did not answer")
        return value, value


class _Calls(Observer):
    def __init__(self) -> None:
        self.calls: list[tuple[str, TopicPartition]] = []

    def stalled(self, tp: TopicPartition, reason: str, retry_in_s: float, first: bool) -> None:
        self.calls.append(("stalled" if first else "retry failed", tp))

    def unstalled(self, tp: TopicPartition, stalled_s: float) -> None:
        self.calls.append(("unstalled", tp))


def test_decoder_holds_a_partition_from_its_first_unavailable_record_and_lets_others_through() -> None:
    codec, observer = _Codec(), _Calls()
    paused: list[TopicPartition] = []
    resumed: list[TopicPartition] = []
    decoder = StallingDecoder(codec, Stalls(initial_backoff_s=1.0), paused.extend, resumed.extend,  # type: ignore[arg-type]
                              observer)
    decoded, rejected = decoder.decode([rec(A, 0), rec(B, 0)], 0.0)
    assert [r.offset for r, _, _ in decoded] == [0, 0] and not rejected

    codec.down = True
    decoded, rejected = decoder.decode([rec(A, 1), rec(A, 2, b"bad")], 1.0)
    assert decoded == [] and rejected == []  # the bad record waits behind the held one: order is kept
    assert paused == [A] and observer.calls == [("stalled", A)]
    codec.down = False
    decoded, rejected = decoder.decode([rec(B, 1), rec(A, 3)], 1.5)
    assert [(r.tp, r.offset) for r, _, _ in decoded] == [(B, 1)]  # B flows; A's later record is held

    assert decoder.retry(1.9) == ([], [], [])  # not due yet
    codec.down = True
    assert decoder.retry(2.0) == ([], [], [])
    assert observer.calls[-1] == ("retry failed", A)
    codec.down = False
    decoded, rejected, now_resumed = decoder.retry(5.0)
    assert [r.offset for r, _, _ in decoded] == [1, 3] and [r.offset for r, _, _ in rejected] == [2]
    assert now_resumed == [A] and resumed == [A] and observer.calls[-1] == ("unstalled", A)
    assert decoder.expired(1000.0) is None


def test_decoder_reports_a_stall_past_the_outage_limit() -> None:
    codec = _Codec()
    codec.down = True
    decoder = StallingDecoder(codec, Stalls(max_stall_s=60), lambda tps: None, lambda tps: None,  # type: ignore[arg-type]
                              Observer())
    decoder.decode([rec(A, 7)], 0.0)
    assert decoder.expired(59.0) is None
    message = decoder.expired(61.0)
    assert message is not None and "t[0]" in message and "without committing past t[0]@7" in message
    assert "max_outage_s" in message
