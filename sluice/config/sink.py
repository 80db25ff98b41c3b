"""``sink`` and ``dead_letter``: where outputs and failed records go, and what an output record holds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from sluice.config.files import FileSink
from sluice.config.kafka import KafkaSink
from sluice.config.section import Section, exactly_one_of


class Output(Section):
    # merge: the input JSON object plus the result under `field`; result: {field: result} only.
    mode: Literal["merge", "result"] = "merge"
    """`merge`: the input record with the result added under `field`; `result`: only `{field: result}`."""
    field: str = Field(default="result", min_length=1)
    """The field that holds the result."""
    key: str = "input"
    """The output record's key: `input` (the input's key), `none`, or `field:<dotted.path>` of the input."""
    preserve_order: bool = False
    """Continuous engines (`llm`): hold results back so each partition's outputs leave in input order."""
    format: Literal["json", "avro", "protobuf", "json_schema"] | None = None
    """`json`, or the input's Schema Registry format (default: the input's; `json` for `raw`)."""
    schema_file: str | None = None
    """`avro` / `json_schema`: the output schema, instead of the input's record schema plus the result field
    (relative to the pipeline file)."""
    message_type: str | None = None
    """`protobuf`: the generated class of the output messages, `package.module_pb2:Message`."""
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"
    """The subject the output schema is registered under: `topic` (`<topic>-value`), `record` (the record's
    full name) or `topic_record`."""

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if value in ("input", "none") or (value.startswith("field:") and len(value) > 6):
            return value
        raise ValueError("expected 'input', 'none' or 'field:<dotted.path>'")


class Sink(Section):
    kafka: KafkaSink | None = None
    """Write results to a Kafka topic."""
    file: FileSink | None = None
    """Write results to a JSON-lines file or a directory of Parquet part files."""
    output: Output = Field(default_factory=Output)
    """How an output record is shaped: its value, key and format."""

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
    """The dead-letter topic; without a dead-letter destination, a record that cannot be handled stops the
    pipeline, uncommitted."""
    path: str | None = Field(default=None, min_length=1)
    """With `sink.file`: the dead-letter file (default: `<output>.dead-letters.jsonl`)."""
    max_consecutive_failures: int | None = Field(default=1000, ge=1)
    """Stop once this many records in a row have failed (`null`: never): a broken model or codec does not
    dead-letter a whole topic."""
