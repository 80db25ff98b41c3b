"""The Schema Registry connection, and the line between a registry's failure and a record's.

:func:`connect` builds confluent-kafka's own :class:`SchemaRegistryClient` from the pipeline's
``codec.schema_registry`` section. :func:`registry_call` runs one client call and sorts what can go wrong:

* the registry is down, slow, overloaded or refuses the credentials -- not the record's fault: raises
  :class:`RegistryUnavailable`, and the operator waits for it (the partition pauses, nothing is committed
  past the record, sluice/operator/stalls.py);
* the registry answers that the schema id does not exist -- the record's fault: raises :class:`UnknownSchema`,
  and the record goes to the dead-letter topic;
* the registry rejects a schema Sluice derived (incompatible, invalid) -- raises :class:`SchemaRejected`.

Secrets (the basic-auth password, the TLS key's password) are revealed only into the client's configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from sluice.config import SchemaRegistry

T = TypeVar("T")

# The client's own retries sleep on the calling thread (up to 20 s by default): keep them short, and leave
# long outages to the operator's backoff, which keeps polling the consumer meanwhile.
_CLIENT_RETRIES = 1
_CLIENT_RETRY_WAIT_MS = 100
_CLIENT_RETRY_MAX_WAIT_MS = 500

# HTTP statuses that say nothing about the record: authentication, rate limits, timeouts, server errors.
_NOT_THE_RECORDS_FAULT = {401, 403, 408, 425, 429}


class RegistryUnavailable(Exception):
    """The registry cannot answer now (down, slow, overloaded, or refusing the credentials). Retry later."""


class UnknownSchema(Exception):
    """The registry has no schema with the id a record names."""


class SchemaRejected(Exception):
    """The registry refused to register a schema (incompatible with the subject's versions, or invalid)."""


def client_config(cfg: SchemaRegistry) -> dict[str, Any]:
    """confluent-kafka SchemaRegistryClient settings for ``cfg`` (secrets revealed here only)."""
    conf: dict[str, Any] = {
        "url": cfg.url,
        # A client call without a timeout was seen to hang right after the registry started.
        "timeout": cfg.request_timeout_s,
        "max.retries": _CLIENT_RETRIES,
        "retries.wait.ms": _CLIENT_RETRY_WAIT_MS,
        "retries.max.wait.ms": _CLIENT_RETRY_MAX_WAIT_MS,
    }
    if cfg.basic_auth is not None:
        conf["basic.auth.user.info"] = f"{cfg.basic_auth.username}:{cfg.basic_auth.password.get_secret_value()}"
    if cfg.tls is not None:
        from sluice.connectors.kafka.security import tls_files

        conf.update(tls_files(cfg.tls))
    return conf


def connect(cfg: SchemaRegistry) -> Any:
    """A SchemaRegistryClient for ``cfg``. Raises ValueError (with the client's reason) for bad settings."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    # httpx logs every request at INFO; Sluice makes a few per schema and logs what matters itself
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return SchemaRegistryClient(client_config(cfg))


def registry_call(call: Callable[[], T], what: str) -> T:
    """Run one registry call; ``what`` says what it was for (in messages). See the module docstring."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return call()
    except _transport_error() as err:  # refused, reset, DNS, TLS, timeouts
        raise RegistryUnavailable(f"{what}: the schema registry did not answer ({type(err).__name__}: "
                                  f"{err or 'no detail'})") from None
    except SchemaRegistryError as err:
        status = err.http_status_code
        if status in _NOT_THE_RECORDS_FAULT or status >= 500:
            hint = " (check codec.schema_registry.basic_auth)" if status in (401, 403) else ""
            raise RegistryUnavailable(f"{what}: the schema registry answered HTTP {status}: "
                                      f"{err.error_message}{hint}") from None
        if status == 404:
            raise UnknownSchema(f"{what}: the schema registry has no such schema ({err.error_message})") from None
        raise SchemaRejected(f"{what}: the schema registry refused it (HTTP {status}): {err.error_message}") from None


def unavailable_reason(err: BaseException) -> str | None:
    """The message of a registry outage hidden in ``err`` (as raised by a serializer), or None."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, _transport_error()):
            return f"the schema registry did not answer ({type(seen).__name__})"
        if isinstance(seen, SchemaRegistryError) and (
                seen.http_status_code in _NOT_THE_RECORDS_FAULT or seen.http_status_code >= 500):
            return f"the schema registry answered HTTP {seen.http_status_code}"
        seen = seen.__cause__ or seen.__context__
    return None


def _transport_error() -> type[Exception]:
    """httpx's TransportError, from whichever of httpx2 / httpx the registry client runs on (it prefers
    httpx2, the maintained successor)."""
    try:
        import httpx2 as httpx
    except ImportError:
        import httpx  # type: ignore[no-redef]
    error: type[Exception] = httpx.TransportError
    return error
