"""The whole pipeline file: its sections, and the rules that tie one section to another."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from sluice.config.batching import Batching
from sluice.config.codec import REGISTRY_FORMATS, Codec
from sluice.config.delivery import ExactlyOnce, Runtime
from sluice.config.engine import EngineSection
from sluice.config.files import default_dead_letter_path
from sluice.config.kafka import KafkaSecurity
from sluice.config.section import Section, check_import_path
from sluice.config.sink import DeadLetter, Sink
from sluice.config.source import Source
from sluice.config.telemetry import Telemetry


class Pipeline(Section):
    name: str = "pipeline"
    """The pipeline's name, in logs, metrics and `sluice reload`."""
    source: Source
    """Where records come from: `kafka` (a consumer group) or `file` (a bounded run)."""
    codec: Codec = Field(default_factory=Codec)
    """How a record's bytes become the model's input."""
    batching: Batching = Field(default_factory=Batching)
    """How records are gathered into the batches a batch engine runs."""
    engine: EngineSection
    """The model and the engine that runs it; `type` picks the engine, the other keys are its options."""
    sink: Sink
    """Where results go: `kafka` (a topic) or `file`, and how output records are shaped."""
    dead_letter: DeadLetter | None = None
    """Where records that cannot be handled go, with the reason in their headers."""
    delivery: Literal["at_least_once", "exactly_once"] = "at_least_once"
    """`at_least_once`: offsets are committed once outputs are on the broker. `exactly_once`: outputs, dead
    letters and offsets in one Kafka transaction."""
    exactly_once: ExactlyOnce = Field(default_factory=ExactlyOnce)
    """The transactions of `delivery: exactly_once`."""
    runtime: Runtime = Field(default_factory=Runtime)
    """Back-pressure, commits and shutdown."""
    telemetry: Telemetry = Field(default_factory=Telemetry)
    """Tracing, metrics and health endpoints, the status line."""

    @property
    def dead_letter_destination(self) -> str | None:
        """Where dead letters go: the topic (Kafka sink), the file (a file sink always has one), or None."""
        if self.dead_letter is None:
            return None
        if self.sink.file is not None:
            return self.dead_letter.path or default_dead_letter_path(self.sink.file.path)
        return self.dead_letter.topic

    def output_format(self) -> str:
        """The output records' format: ``sink.output.format``, else the input's (json for raw input)."""
        given = self.sink.output.format
        return given if given is not None else ("json" if self.codec.format == "raw" else self.codec.format)

    @model_validator(mode="after")
    def _output_format_fits(self) -> Pipeline:
        out, given = self.output_format(), self.sink.output
        if out in REGISTRY_FORMATS and out != self.codec.format:
            raise ValueError(f"sink.output.format {out} needs codec.format {out} (its schema registry and "
                             f"schemas); with codec.format {self.codec.format}, write json")
        if given.message_type is not None and out != "protobuf":
            raise ValueError("sink.output.message_type is for the protobuf output format only")
        if out == "protobuf" and given.message_type is None:
            raise ValueError("sink.output.format protobuf needs sink.output.message_type: "
                             "'package.module_pb2:Message' (the output's class)")
        if given.message_type is not None:
            check_import_path(given.message_type)
        if given.schema_file is not None and out not in ("avro", "json_schema"):
            raise ValueError("sink.output.schema_file is for the avro and json_schema output formats")
        return self

    @model_validator(mode="before")
    @classmethod
    def _file_sinks_dead_letter(cls, data: Any) -> Any:
        """A file sink always writes its dead letters to a file beside the output (dead_letter.path)."""
        sink = data.get("sink") if isinstance(data, dict) else None
        if isinstance(sink, dict) and sink.get("file") is not None and data.get("dead_letter") is None:
            return {**data, "dead_letter": {}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _sink_inherits_security(cls, data: Any) -> Any:
        """The sink writes to the source's cluster unless it names its own: then it uses the source's
        security too. Copied only when valid, so a mistake there is reported once, at the source."""
        try:
            source_kafka, sink_kafka = data["source"]["kafka"], data["sink"]["kafka"]
            security = source_kafka["security"]
        except (KeyError, TypeError):
            return data
        if not isinstance(sink_kafka, dict) or "security" in sink_kafka or "bootstrap_servers" in sink_kafka:
            return data
        try:
            KafkaSecurity.model_validate(security)
        except ValidationError:
            return data
        return {**data, "sink": {**data["sink"], "kafka": {**sink_kafka, "security": security}}}


@dataclass(frozen=True)
class LoadedPipeline:
    """A validated pipeline plus its validated engine options and where it came from."""

    pipeline: Pipeline
    engine_options: Any  # instance of the engine type's options model
    base_dir: Path  # directory of the pipeline file; relative paths in it resolve against this
    # options that do nothing here, one line each with its YAML path (sluice/config/applies.py)
    warnings: tuple[str, ...] = ()
