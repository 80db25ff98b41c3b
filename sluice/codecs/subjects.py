"""Subjects: where a Schema Registry format registers output schemas, and how its readers look schemas up.

Outputs are registered under a subject named by confluent-kafka's subject strategy (``topic``, ``record``
or ``topic_record``, from ``sink.output.subject_name_strategy``); inputs are read by schema id alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class OutputSubject:
    """Where output schemas are registered: the output topic and confluent-kafka's subject strategy."""

    topic: str
    strategy: str  # topic | record | topic_record

    @property
    def serializer_conf(self) -> dict[str, Any]:
        return {"subject.name.strategy.type": {"topic": "TOPIC", "record": "RECORD",
                                               "topic_record": "TOPIC_RECORD"}[self.strategy]}

    def subject(self, record_name: str | None) -> str:
        """The subject a serializer of this topic and strategy registers ``record_name``'s schema under."""
        from confluent_kafka.schema_registry import (
            record_subject_name_strategy,
            topic_record_subject_name_strategy,
            topic_subject_name_strategy,
        )
        strategy = {"topic": topic_subject_name_strategy, "record": record_subject_name_strategy,
                    "topic_record": topic_record_subject_name_strategy}[self.strategy]
        subject = strategy(self.context(), record_name)
        if subject is None:  # the record strategies need a record name
            raise ValueError(f"subject_name_strategy {self.strategy} needs a named output schema")
        return str(subject)

    def context(self) -> Any:
        from confluent_kafka.serialization import MessageField, SerializationContext

        return SerializationContext(self.topic, MessageField.VALUE)


def no_subject(ctx: Any, record_name: Any) -> None:
    """Deserializers' subject strategy: records are read by their schema id alone, with no per-record subject
    (which would look up the subject's latest version and run its rules)."""
    return None
