"""When a fenced static member may join its group again: a pure policy, with the clock passed in.

librdkafka reports FENCED_INSTANCE_ID as a fatal error even where the fencing registration is the member's
*own*: seen when the broker coordinating the group died and the member's rejoin replaced its older
registration (librdkafka #3437, confluent-kafka-go #494). Sluice's derived ``group.instance.id`` is held
through its host's instance slot lock (sluice/operator/instance.py), so no other process on the host can
have it; such a member may replace its consumer and join again -- a few times. Fenced more often than
that, another process (on a host sharing the hostname) really holds the id, and the operator must stop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import KafkaError


def is_fenced_instance(err: KafkaError) -> bool:
    """A static member fenced by a registration under its ``group.instance.id`` (the error event reports a
    fatal error as ``_FATAL`` with the cause in its text)."""
    return err.code() == KafkaError.FENCED_INSTANCE_ID or "static consumer fenced" in err.str().lower()


def fatal_hint(err: KafkaError, group_instance_id: str | None) -> str:
    """What to do about a consumer's fatal error, where static membership may explain it ("" otherwise)."""
    if group_instance_id is None and "fenced" not in err.str().lower():
        return ""
    return (f" (another running consumer uses this group.instance.id, {group_instance_id}: each process of a "
            "group needs its own. The default, sluice-<group>-<hostname>-<slot>, is unique on one host; where "
            "two hosts share a hostname, set source.kafka.static_membership: false or a group.instance.id of "
            "your own per process)")


@dataclass
class RejoinBudget:
    """At most ``max_rejoins`` rejoins within any ``window_s``."""

    max_rejoins: int = 3
    window_s: float = 300.0
    times_s: list[float] = field(default_factory=list)  # clock times of the rejoins still in the window

    def take(self, now_s: float) -> bool:
        """Spend one rejoin at ``now_s`` if the budget allows it; False when it is spent."""
        self.times_s = [t for t in self.times_s if now_s - t < self.window_s]
        if len(self.times_s) >= self.max_rejoins:
            return False
        self.times_s.append(now_s)
        return True
