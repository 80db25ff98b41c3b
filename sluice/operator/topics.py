"""Start-time check of the topics a pipeline reads and writes, before the engine loads.

A missing output or dead-letter topic otherwise shows only when the first result is delivered -- after
the model has loaded and worked through a batch or a minute of records, all of which are then processed
again. Metadata answers in milliseconds, so ``sluice run`` asks first and stops with a message naming
each missing topic and how to create it.

What metadata can tell, and what is done with it:

* the topic does not exist (``UNKNOWN_TOPIC_OR_PART``): stop;
* this client may not describe it (``TOPIC_AUTHORIZATION_FAILED``): stop -- it could not write it either;
* a partition has no leader right now: a warning (a leader election is over in seconds);
* the brokers refuse the client's credentials or TLS: stop;
* no broker answers in time: a warning, and the run goes on to wait for them, as it always has (a broker
  that is restarting must not turn into a crash loop).

Write permission itself is not in metadata; a topic this client may describe but not write still fails
at its first delivery, with the broker's message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from sluice.config import Pipeline
from sluice.connectors.kafka.connectivity import librdkafka_logger

log = logging.getLogger(__name__)

_TIMEOUT_S = 5.0  # how long the brokers have to answer before the run goes on without the check
_REFUSED = (KafkaError._AUTHENTICATION, KafkaError._SSL)  # the brokers answered: no, to this client


class TopicProblem(Exception):
    """A topic the pipeline needs is missing or out of reach; one line for the user."""


@dataclass(frozen=True)
class TopicUse:
    name: str
    setting: str  # where the pipeline names it, for the message
    writes: bool  # the operator produces to it


def needed_topics(p: Pipeline) -> list[TopicUse]:
    """Every topic the pipeline reads or writes, once each (named twice: its first setting, and written
    if either use writes it)."""
    uses = [TopicUse(t, "source.kafka.topics", False) for t in (p.source.kafka.topics if p.source.kafka else [])]
    if p.sink.kafka is not None:
        uses.append(TopicUse(p.sink.kafka.topic, "sink.kafka.topic", True))
        if p.dead_letter is not None and p.dead_letter.topic is not None:
            uses.append(TopicUse(p.dead_letter.topic, "dead_letter.topic", True))
    first: dict[str, TopicUse] = {}
    for use in uses:
        seen = first.setdefault(use.name, use)
        if use.writes and not seen.writes:
            first[use.name] = replace(seen, writes=True)
    return list(first.values())


def check_topics(p: Pipeline, timeout_s: float = _TIMEOUT_S) -> None:
    """Raise :class:`TopicProblem` when a topic is missing or refused; warn and return when the brokers
    cannot be reached within ``timeout_s``. Input topics are asked of the source's cluster, output and
    dead-letter topics of the sink's (the same one unless the sink names its own brokers), each with the
    settings its real client gets. A side that is a file has no topics to check."""
    from sluice.connectors.kafka.security import security_config

    uses = needed_topics(p)
    src, sink = p.source.kafka, p.sink.kafka
    if src is not None:
        source_conf = {"bootstrap.servers": src.bootstrap_servers, "group.id": src.group_id,
                       **security_config(src.security), **src.config}
        if sink is not None and sink.bootstrap_servers is None:  # one cluster: one client asks for every topic
            _check_cluster(Consumer, source_conf, uses, timeout_s)
            return
        _check_cluster(Consumer, source_conf, [u for u in uses if not u.writes], timeout_s)
    if sink is not None:
        sink_conf = {"bootstrap.servers": sink.bootstrap_servers or (src.bootstrap_servers if src else ""),
                     **security_config(sink.security), **sink.config}
        _check_cluster(Producer, sink_conf, [u for u in uses if u.writes], timeout_s)


def _check_cluster(client_type: Callable[[dict[str, Any]], Any], conf: dict[str, Any], uses: list[TopicUse],
                   timeout_s: float) -> None:
    if not uses:
        return
    bootstrap = conf["bootstrap.servers"]
    refused: list[KafkaError] = []
    client = client_type({**conf, "allow.auto.create.topics": False,  # asking must never create a topic
                          "error_cb": refused.append, "logger": librdkafka_logger("topics")})
    try:
        problems = []
        for use in uses:
            found, metadata = _metadata(client, use.name, timeout_s, refused)
            if not found:
                if refused:
                    raise TopicProblem(f"the Kafka brokers at {bootstrap} refused this client: {refused[0].str()}; "
                                       "check the pipeline's security settings and credentials")
                log.warning("cannot check the topics on %s (no answer within %.0f s); starting anyway: the "
                            "operator waits for the brokers", bootstrap, timeout_s)
                return
            problem = _problem(use, metadata, bootstrap)
            if problem is not None:
                problems.append(problem)
        if problems:
            raise TopicProblem(_describe(problems, bootstrap))
    finally:
        client.poll(0)  # hands librdkafka's queued lines to the logger (they wait for a poll)
        if isinstance(client, Consumer):
            client.close()


def _metadata(client: Any, topic: str, timeout_s: float, refused: list[KafkaError]) -> tuple[bool, Any]:
    """(True, the topic's metadata or None) once a broker answered; (False, None) when none did within
    ``timeout_s`` -- ``refused`` then holds the error if one turned the client away."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return True, client.list_topics(topic=topic, timeout=min(0.5, timeout_s)).topics.get(topic)
        except KafkaException:
            pass
        client.poll(0)  # serves error_cb: an authentication failure arrives there
        if any(err.code() in _REFUSED for err in refused):
            refused[:] = [err for err in refused if err.code() in _REFUSED]
            return False, None
        if time.monotonic() >= deadline:
            refused.clear()
            return False, None


@dataclass(frozen=True)
class _Problem:
    use: TopicUse
    missing: bool  # False: not authorized
    detail: str


def _problem(use: TopicUse, metadata: Any, bootstrap: str) -> _Problem | None:
    err = metadata.error if metadata is not None else None
    if metadata is None or (err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        return _Problem(use, True, "does not exist")
    if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        need = "Describe and Write" if use.writes else "Describe and Read"
        return _Problem(use, False, f"is not visible to this client (grant its principal {need} on it)")
    if err is not None:
        log.warning("topic %s (%s) on %s: %s", use.name, use.setting, bootstrap, err.str())
        return None
    leaderless = [p for p, part in metadata.partitions.items() if part.leader < 0]
    if leaderless:
        log.warning("topic %s: partitions %s have no leader right now on %s", use.name, sorted(leaderless), bootstrap)
    return None


def _describe(problems: list[_Problem], bootstrap: str) -> str:
    """One line: each topic with its setting and what is wrong; then how to create the missing ones."""
    text = f"on the Kafka brokers at {bootstrap}: " + "; ".join(
        f"topic {p.use.name} ({p.use.setting}) {p.detail}" for p in problems)
    missing = [p.use.name for p in problems if p.missing]
    if missing:
        text += (f". Create {'it' if len(missing) == 1 else 'them'} before starting Sluice (the brokers do not "
                 f"create topics for it), e.g. `kafka-topics.sh --bootstrap-server {bootstrap} --create --topic "
                 f"{missing[0]} --partitions 3`")
    return text
