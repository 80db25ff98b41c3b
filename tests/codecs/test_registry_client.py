"""What the registry answers, sorted: its failures are not the record's (RegistryUnavailable), an unknown id
is (UnknownSchema). Real SchemaRegistryClient calls against a closed port, the real registry, and a tiny
HTTP server that refuses credentials, fails, or answers too slowly."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from sluice.codecs.schema_registry import (
    RegistryUnavailable,
    UnknownSchema,
    client_config,
    connect,
    registry_call,
)
from sluice.config import SchemaRegistry


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Answers(http.server.BaseHTTPRequestHandler):
    status = 200
    delay_s = 0.0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        time.sleep(self.delay_s)
        body = json.dumps({"error_code": self.status, "message": "no"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_registry() -> Iterator[tuple[str, type[_Answers]]]:
    handler = type("Handler", (_Answers,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _client(url: str, timeout_s: float = 2.0) -> SchemaRegistryClient:
    return connect(SchemaRegistry(url=url, request_timeout_s=timeout_s))


def test_a_registry_that_is_down_is_unavailable_not_the_records_fault() -> None:
    client = _client(f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(RegistryUnavailable, match="schema id 1: the schema registry did not answer"):
        registry_call(lambda: client.get_schema(1), "schema id 1")


@pytest.mark.parametrize("status, hint", [(401, "basic_auth"), (403, "basic_auth"), (503, "HTTP 503"),
                                          (429, "HTTP 429")])
def test_refused_credentials_and_server_errors_are_unavailable(fake_registry: tuple[str, type[_Answers]],
                                                               status: int, hint: str) -> None:
    url, handler = fake_registry
    handler.status = status
    with pytest.raises(RegistryUnavailable, match=hint):
        registry_call(lambda: _client(url).get_schema(1), "schema id 1")


def test_a_slow_registry_times_out_instead_of_hanging(fake_registry: tuple[str, type[_Answers]]) -> None:
    url, handler = fake_registry
    handler.delay_s = 5.0
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="ReadTimeout"):
        registry_call(lambda: _client(url, timeout_s=0.3).get_schema(1), "schema id 1")
    assert time.monotonic() - started < 3  # two tries of 0.3 s and a short wait, not the 5 s answer


@pytest.mark.kafka
def test_an_unknown_schema_id_is_the_records_fault(schema_registry_url: str) -> None:
    with pytest.raises(UnknownSchema, match="no such schema"):
        registry_call(lambda: _client(schema_registry_url).get_schema(1_999_999_999), "schema id 1999999999")


def test_secrets_reach_the_client_config_only() -> None:
    cfg = SchemaRegistry.model_validate({"url": "https://sr:8081", "basic_auth": {"username": "key", "password": "s3cr3t"},
                                         "tls": {"ca_location": "ca.pem"}})
    assert "s3cr3t" not in repr(cfg) and "s3cr3t" not in str(cfg.model_dump())
    conf = client_config(cfg)
    assert conf["basic.auth.user.info"] == "key:s3cr3t" and conf["ssl.ca.location"] == "ca.pem"
    assert conf["timeout"] == 10.0
