"""The ``security`` section as librdkafka settings (SASL, TLS), for the source, the sink and the admin
lookups; and the TLS file settings the Schema Registry client shares."""

from __future__ import annotations

from sluice.config import KafkaSecurity, RegistryTls, Tls


def security_config(security: KafkaSecurity | None) -> dict[str, str]:
    """librdkafka settings for ``security``: SASL_SSL with both parts, SASL_PLAINTEXT or SSL with one,
    nothing for a plaintext cluster. Secrets are revealed here only, into the client's configuration;
    librdkafka itself prints sensitive properties as "[redacted]" in its debug logs."""
    if security is None:
        return {}
    sasl, tls = security.sasl, security.tls
    conf: dict[str, str] = {
        "security.protocol": ("SASL_" if sasl else "") + ("SSL" if tls else "PLAINTEXT"),
    }
    if sasl is not None:
        conf.update({"sasl.mechanism": sasl.mechanism, "sasl.username": sasl.username,
                     "sasl.password": sasl.password.get_secret_value()})
    if tls is not None:
        # "https": the broker's certificate must name the host it was reached at (librdkafka's default).
        conf["ssl.endpoint.identification.algorithm"] = "https" if tls.verify_hostname else "none"
        conf.update(tls_files(tls))
    return conf


def tls_files(tls: Tls | RegistryTls) -> dict[str, str]:
    """The ``ssl.*`` file settings (and key password, revealed here) that librdkafka and confluent-kafka's
    Schema Registry client both take under the same names."""
    conf = {key: value for key, value in (("ssl.ca.location", tls.ca_location),
                                          ("ssl.certificate.location", tls.certificate_location),
                                          ("ssl.key.location", tls.key_location)) if value is not None}
    if tls.key_password is not None:
        conf["ssl.key.password"] = tls.key_password.get_secret_value()
    return conf
