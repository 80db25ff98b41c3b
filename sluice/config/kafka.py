"""``source.kafka``, ``sink.kafka`` and the ``security`` section both of them take."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, model_validator

from sluice.config.base import Section


class Sasl(Section):
    """SASL authentication. The password is a SecretStr: it prints as '**********' everywhere."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    username: str = Field(min_length=1)
    password: SecretStr  # write ${KAFKA_PASSWORD}: from the environment (a Kubernetes Secret), not the file


class Tls(Section):
    """TLS to the brokers. ``tls: {}`` trusts the system's CAs. Paths are relative to the working directory."""

    ca_location: str | None = None  # PEM file of the CA that signed the brokers' certificates
    certificate_location: str | None = None  # client certificate (mutual TLS), PEM
    key_location: str | None = None  # its private key, PEM
    key_password: SecretStr | None = None  # if that key is encrypted
    verify_hostname: bool = True  # check the broker's certificate names the host connected to

    @model_validator(mode="after")
    def _pair(self) -> Tls:
        if (self.certificate_location is None) != (self.key_location is None):
            raise ValueError("certificate_location and key_location go together (mutual TLS needs both)")
        return self


class KafkaSecurity(Section):
    """How a client proves who it is and protects the connection: SASL, TLS, or both (SASL_SSL)."""

    sasl: Sasl | None = None
    tls: Tls | None = None

    @model_validator(mode="after")
    def _something(self) -> KafkaSecurity:
        if self.sasl is None and self.tls is None:
            raise ValueError("give 'sasl', 'tls' or both (or leave 'security' out for a plaintext cluster)")
        return self


class KafkaSource(Section):
    bootstrap_servers: str = Field(min_length=1)
    topics: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    group_id: str = Field(min_length=1)
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    security: KafkaSecurity | None = None
    # Static group membership: a group.instance.id of sluice-<group_id>-<hostname>-<slot> (the slot as for
    # the transactional id, sluice/operator/instance.py), so a process restarted after a crash gets its
    # partitions back at once instead of after session.timeout.ms. A group.instance.id in `config` wins.
    static_membership: bool = True
    # librdkafka settings passed through unchanged (timeouts...; they override `security`). Values may come
    # from ${ENV}.
    config: dict[str, str | int | float | bool] = Field(default_factory=dict)


class KafkaSink(Section):
    topic: str = Field(min_length=1)
    bootstrap_servers: str | None = None  # defaults to the source's
    # Defaults to the source's when the sink uses the source's cluster (no bootstrap_servers of its own);
    # a sink on another cluster never gets the source's credentials.
    security: KafkaSecurity | None = None
    config: dict[str, str | int | float | bool] = Field(default_factory=dict)
