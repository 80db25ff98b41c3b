"""``codec``: how input records are read (JSON, raw text, or a Schema Registry format) and their bounds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from sluice.config.section import Section, check_import_path

REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")


class BasicAuth(Section):
    """HTTP basic authentication to a Schema Registry (an API key and secret on Confluent Cloud)."""

    username: str = Field(min_length=1)
    """The registry user name (or API key)."""
    password: SecretStr
    """The registry password (or API secret); write `${SCHEMA_REGISTRY_PASSWORD}` to take it from the
    environment."""


class RegistryTls(Section):
    """TLS to the Schema Registry (an https URL). Leave out ``ca_location`` to trust the system's CAs."""

    ca_location: str | None = None  # PEM file of the CA that signed the registry's certificate
    """PEM file of the CA that signed the registry's certificate."""
    certificate_location: str | None = None
    """The client certificate, PEM (mutual TLS)."""
    key_location: str | None = None
    """The client certificate's private key, PEM."""
    key_password: SecretStr | None = None
    """The private key's password, if it is encrypted."""

    @model_validator(mode="after")
    def _pair(self) -> RegistryTls:
        if self.key_location is not None and self.certificate_location is None:
            raise ValueError("key_location needs certificate_location (mutual TLS needs both)")
        return self


class SchemaRegistry(Section):
    """A Confluent-compatible Schema Registry, for the avro, protobuf and json_schema formats."""

    url: str = Field(min_length=1)
    """`http(s)://host:port[/path]`; several, comma-separated, are tried in turn."""
    basic_auth: BasicAuth | None = None
    """HTTP basic authentication: `username`, `password`."""
    tls: RegistryTls | None = None
    """TLS for the registry: a CA file, a client certificate and key."""
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """The longest one HTTP request to the registry may take."""
    max_outage_s: float = Field(default=300.0, gt=0)
    """How long Sluice keeps retrying (with backoff) while the registry is down, slow or refuses the
    credentials; the partitions waiting on it stay paused and nothing past them is committed. Past it the
    pipeline stops."""

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        for url in value.split(","):
            if not url.strip().startswith(("http://", "https://")):
                raise ValueError(f"expected http://host:port or https://host:port, got {url.strip()!r}")
        return value


class Codec(Section):
    # openai-batch: lines of OpenAI's batch API ({"custom_id", "method", "url", "body"}) for the llm engine,
    # answered with lines as OpenAI's batch output file has them (sluice/codecs/openai_batch.py)
    format: Literal["json", "raw", "avro", "protobuf", "json_schema", "openai-batch"] = "json"
    """`json`: a JSON object per record; `raw`: the UTF-8 value is the input (for an image task with
    `engine.image.source: bytes`, the value's bytes: an image file); `avro`, `protobuf`,
    `json_schema`: Schema Registry framing; `openai-batch`: OpenAI's batch request lines (the `llm`
    engine)."""
    input_field: str = Field(default="text", min_length=1)
    """Dotted path of the model's input in a JSON record; `.` for the whole record."""
    max_record_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    """A larger record is dead-lettered unread."""
    max_depth: int = Field(default=128, ge=1, le=512)
    """A JSON record nested deeper is dead-lettered before it is decoded."""
    schema_registry: SchemaRegistry | None = None
    """The Schema Registry the `avro`, `protobuf` and `json_schema` formats need."""
    message_type: str | None = None
    """`protobuf`: the input's generated class, `package.module_pb2:Message`."""

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
