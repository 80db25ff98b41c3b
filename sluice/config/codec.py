"""``codec``: how input records are read (JSON, raw text, or a Schema Registry format) and their bounds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from sluice.config.base import Section, check_import_path

REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")


class BasicAuth(Section):
    """HTTP basic authentication to a Schema Registry (an API key and secret on Confluent Cloud)."""

    username: str = Field(min_length=1)
    password: SecretStr  # write ${SCHEMA_REGISTRY_PASSWORD}: from the environment, not the file


class RegistryTls(Section):
    """TLS to the Schema Registry (an https URL). Leave out ``ca_location`` to trust the system's CAs."""

    ca_location: str | None = None  # PEM file of the CA that signed the registry's certificate
    certificate_location: str | None = None  # client certificate (mutual TLS), PEM
    key_location: str | None = None  # its private key, PEM
    key_password: SecretStr | None = None  # if that key is encrypted

    @model_validator(mode="after")
    def _pair(self) -> RegistryTls:
        if self.key_location is not None and self.certificate_location is None:
            raise ValueError("key_location needs certificate_location (mutual TLS needs both)")
        return self


class SchemaRegistry(Section):
    """A Confluent-compatible Schema Registry, for the avro, protobuf and json_schema formats."""

    url: str = Field(min_length=1)  # http(s)://host:port[/path]; several, comma-separated, are tried in turn
    basic_auth: BasicAuth | None = None
    tls: RegistryTls | None = None
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)  # one HTTP request; a hung call never blocks
    # How long Sluice keeps retrying (with backoff) while the registry is down, slow or refuses the
    # credentials; the partitions waiting on it stay paused and uncommitted. Past this the operator stops.
    max_outage_s: float = Field(default=300.0, gt=0)

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        for url in value.split(","):
            if not url.strip().startswith(("http://", "https://")):
                raise ValueError(f"expected http://host:port or https://host:port, got {url.strip()!r}")
        return value


class Codec(Section):
    # openai-batch: lines of OpenAI's batch API ({"custom_id", "method", "url", "body"}) for the llm engine,
    # answered with lines as OpenAI's batch output file has them (sluice/schemas/openai_batch.py)
    format: Literal["json", "raw", "avro", "protobuf", "json_schema", "openai-batch"] = "json"
    # Dotted path of the model input inside a JSON record (e.g. "review.text"), or "." for the whole
    # record (an LLM prompt template filling several fields, say). Ignored for raw records, whose whole
    # value (UTF-8) is the input. For avro, protobuf and json_schema: a path into the decoded record.
    input_field: str = Field(default="text", min_length=1)
    # Bounds on one record, checked before decoding: a record over either is dead-lettered with the reason.
    # 4 MiB is four times Kafka's default message size; the depth bound keeps every recursive step after
    # decoding (encoding the output, the engine's own code) far from Python's recursion limit.
    max_record_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    max_depth: int = Field(default=128, ge=1, le=512)
    schema_registry: SchemaRegistry | None = None  # required by avro, protobuf and json_schema
    # protobuf: the generated message class of the input records, "package.module_pb2:Message"
    message_type: str | None = None

    @model_validator(mode="after")
    def _registry_formats(self) -> Codec:
        if self.format in REGISTRY_FORMATS and self.schema_registry is None:
            raise ValueError(f"format {self.format} needs schema_registry: {{url: ...}}")
        if self.format == "protobuf" and self.message_type is None:
            raise ValueError("format protobuf needs message_type: 'package.module_pb2:Message' (the input's class)")
        if self.message_type is not None and self.format != "protobuf":
            raise ValueError("message_type is for format protobuf only")
        if self.message_type is not None:
            check_import_path(self.message_type)
        return self
