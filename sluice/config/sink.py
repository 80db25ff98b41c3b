"""``sink`` and ``dead_letter``: where outputs and failed records go, and what an output record holds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from sluice.config.base import Section, exactly_one_of
from sluice.config.files import FileSink
from sluice.config.kafka import KafkaSink


class Output(Section):
    # merge: the input JSON object plus the result under `field`; result: {field: result} only.
    mode: Literal["merge", "result"] = "merge"
    field: str = Field(default="result", min_length=1)
    # Key of the output record: "input" keeps the input key, "none" drops it, "field:a.b" takes it from
    # the input record.
    key: str = "input"
    # Continuous engines (llm) produce each result the moment it is ready, so records of a partition may
    # leave out of input order; true holds results back to leave in input order per partition.
    preserve_order: bool = False
    # Output format; default: the input's (json for raw input). avro / json_schema / protobuf outputs are
    # registered in the codec's schema registry and need that same input format.
    format: Literal["json", "avro", "protobuf", "json_schema"] | None = None
    # avro / json_schema: the output schema, instead of the input's record schema plus the result field
    # (relative to the pipeline file)
    schema_file: str | None = None
    # protobuf: the generated class of the output messages, "package.module_pb2:Message"
    message_type: str | None = None
    # Subject the output schema is registered under: topic (<topic>-value, Confluent's TopicNameStrategy),
    # record (the record's full name) or topic_record (<topic>-<record full name>)
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if value in ("input", "none") or (value.startswith("field:") and len(value) > 6):
            return value
        raise ValueError("expected 'input', 'none' or 'field:<dotted.path>'")


class Sink(Section):
    kafka: KafkaSink | None = None  # a topic
    file: FileSink | None = None  # a JSON-lines file or a directory of Parquet files
    output: Output = Field(default_factory=Output)

    @model_validator(mode="after")
    def _exactly_one(self) -> Sink:
        exactly_one_of(self, "kafka", "file")
        return self

    @property
    def destination(self) -> str:
        """Where outputs go: the topic, or the output file's path (what the operator produces to)."""
        if self.kafka is not None:
            return self.kafka.topic
        assert self.file is not None
        return self.file.path


class DeadLetter(Section):
    # The dead-letter topic, with a Kafka sink (required there).
    topic: str | None = Field(default=None, min_length=1)
    # The dead-letter file (JSON lines), with sink.file; default: beside the output, <name>.dead-letters.jsonl.
    # A file sink always has one.
    path: str | None = Field(default=None, min_length=1)
    # Stop once this many records in a row have failed (none reached the output topic in between): that
    # points at a broken engine, codec or producer rather than at bad records. null: never stop.
    max_consecutive_failures: int | None = Field(default=1000, ge=1)
