"""``source.kafka``, ``sink.kafka`` and the ``security`` section both of them take."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from sluice.config import client_settings
from sluice.config.section import Section


class Sasl(Section):
    """SASL authentication. The password is a SecretStr: it prints as '**********' everywhere."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    """`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`."""
    username: str = Field(min_length=1)
    """The SASL user name."""
    password: SecretStr
    """The SASL password; write `${KAFKA_PASSWORD}` to take it from the environment (a Kubernetes Secret),
    never the file."""


class Tls(Section):
    """TLS to the brokers. ``tls: {}`` trusts the system's CAs. Paths are relative to the working directory."""

    ca_location: str | None = None  # PEM file of the CA that signed the brokers' certificates
    """PEM file of the CA that signed the brokers' certificates (default: the system's CAs)."""
    certificate_location: str | None = None
    """The client certificate, PEM (mutual TLS)."""
    key_location: str | None = None
    """The client certificate's private key, PEM."""
    key_password: SecretStr | None = None
    """The private key's password, if it is encrypted (`${VAR}` from the environment)."""
    verify_hostname: bool = True  # check the broker's certificate names the host connected to
    """Check that the broker's certificate names the host connected to."""

    @model_validator(mode="after")
    def _pair(self) -> Tls:
        if (self.certificate_location is None) != (self.key_location is None):
            raise ValueError("certificate_location and key_location go together (mutual TLS needs both)")
        return self


class KafkaSecurity(Section):
    """How a client proves who it is and protects the connection: SASL, TLS, or both (SASL_SSL)."""

    sasl: Sasl | None = None
    """SASL authentication: `mechanism`, `username`, `password`."""
    tls: Tls | None = None
    """TLS: `{}` for the system's CAs, or a CA file, a client certificate and key (mutual TLS)."""

    @model_validator(mode="after")
    def _something(self) -> KafkaSecurity:
        if self.sasl is None and self.tls is None:
            raise ValueError("give 'sasl', 'tls' or both (or leave 'security' out for a plaintext cluster)")
        return self


class KafkaSource(Section):
    bootstrap_servers: str = Field(min_length=1)
    """The brokers to connect to, `host:port[,host:port...]`."""
    topics: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    """The input topics (at least one)."""
    group_id: str = Field(min_length=1)
    """The consumer group; processes in one group share the partitions."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    """Where a group with no committed offset starts: `earliest` or `latest`."""
    security: KafkaSecurity | None = None
    """SASL and TLS for the brokers."""
    static_membership: bool = True
    """Join with a `group.instance.id` of `sluice-<group_id>-<hostname>-<slot>`, so a process restarted after
    a crash gets its partitions back at once, without a rebalance. A `group.instance.id` in `config`
    replaces it."""
    config: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """librdkafka consumer settings passed through as they are (they override `security`); those the
    delivery guarantees rest on, or that have an option above, are refused."""

    @field_validator("config")
    @classmethod
    def _not_guarded(cls, config: dict[str, str | int | float | bool]) -> dict[str, str | int | float | bool]:
        client_settings.refuse_guarded(config, client_settings.CONSUMER)
        return config


class KafkaSink(Section):
    topic: str = Field(min_length=1)
    """The output topic."""
    bootstrap_servers: str | None = None  # defaults to the source's
    """The output cluster's brokers (default: the source's)."""
    security: KafkaSecurity | None = None
    """SASL and TLS of the output cluster; on the source's cluster (no `bootstrap_servers` of its own) the
    source's."""
    config: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """librdkafka producer settings passed through as they are; those the delivery guarantees rest on, or
    that have an option above, are refused."""

    @field_validator("config")
    @classmethod
    def _not_guarded(cls, config: dict[str, str | int | float | bool]) -> dict[str, str | int | float | bool]:
        client_settings.refuse_guarded(config, client_settings.PRODUCER)
        return config
