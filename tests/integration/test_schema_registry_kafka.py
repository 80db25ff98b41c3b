"""Avro, Protobuf and JSON Schema records through a real Schema Registry and the real broker.

Inputs are written by confluent-kafka's own serializers; outputs are read back by its own deserializers
(not Sluice's code) and checked record by record against the inputs and an independent expected result.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from sluice.config import parse_pipeline
from sluice.operator.build import build_runner
from sluice.operator.observer import Observer
from sluice.operator.record import TopicPartition
from sluice.operator.runner import RunSummary
from tests.codecs.funcs import EMBED_SCHEMA, expected_embedding
from tests.codecs.reviews_pb2 import EnrichedReview, Review
from tests.integration.pipelines import ROOT
from tests.support.kafka import (
    ConsumedRecord,
    committed_offsets,
    consume_all,
    create_topic,
    produce,
    unique_topic,
)
from tests.support.registry import RegistryServer

pytestmark = pytest.mark.kafka

REVIEW_V1 = {"type": "record", "name": "Review", "namespace": "sluice.tests",
             "fields": [{"name": "id", "type": "long"}, {"name": "text", "type": "string"}]}
# v2: a new optional field, as a producer team would evolve it (BACKWARD compatible)
REVIEW_V2 = {**REVIEW_V1, "fields": [*REVIEW_V1["fields"], {"name": "lang", "type": ["null", "string"],
                                                             "default": None}]}
REVIEW_JSON = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Review", "type": "object",
               "properties": {"id": {"type": "integer"}, "text": {"type": "string"}}, "required": ["id", "text"]}


def _text(i: int) -> str:
    return f"review {i} " + "good " * (i % 5)


def _topics(bootstrap: str, partitions: int = 3) -> tuple[str, str, str]:
    names = unique_topic("sr-in"), unique_topic("sr-out"), unique_topic("sr-dlq")
    for name, n in zip(names, (partitions, partitions, 1), strict=True):
        create_topic(bootstrap, name, n)
    return names


def _pipeline(bootstrap: str, registry_url: str, topic_in: str, topic_out: str, dlq: str, fmt: str,
              **extra_codec: Any) -> Any:
    doc = {
        "source": {"kafka": {"bootstrap_servers": bootstrap, "topics": [topic_in], "group_id": unique_topic("g"),
                             "config": {"session.timeout.ms": 10000}}},
        "codec": {"format": fmt, "input_field": "text",
                  "schema_registry": {"url": registry_url, "request_timeout_s": 5, "max_outage_s": 120},
                  **extra_codec},
        "batching": {"max_batch_size": 256, "max_queue_delay_ms": 5},
        "engine": {"type": "python", "function": "tests.codecs.funcs:embed", "result_schema": EMBED_SCHEMA},
        "sink": {"kafka": {"topic": topic_out}, "output": {"field": "embedding"}},
        "dead_letter": {"topic": dlq},
        "runtime": {"commit_interval_ms": 200, "drain_timeout_s": 20},
    }
    if fmt == "protobuf":
        doc["sink"]["output"]["message_type"] = "tests.codecs.reviews_pb2:EnrichedReview"  # type: ignore[index]
    return parse_pipeline(json.dumps(doc), base_dir=ROOT)


def _run(loaded: Any, num_records: int, observer: Observer | None = None) -> RunSummary:
    runner, engine = build_runner(loaded, max_records=num_records, idle_exit_s=30, observer=observer)
    try:
        return runner.run()
    finally:
        engine.close()


def _serialize_all(serializer: Callable[[Any, Any], bytes], topic: str, values: list[Any]) -> list[bytes]:
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [serializer(v, ctx) for v in values]


def _schema_id(value: bytes) -> int:
    assert value[0] == 0, "not Schema Registry framing"
    return int.from_bytes(value[1:5], "big")


def _registered_ids(client: SchemaRegistryClient, subject: str) -> set[int]:
    return {client.get_version(subject, v).schema_id for v in client.get_versions(subject)}


def _decoded_outputs(outputs: list[ConsumedRecord], deserialize: Callable[[bytes], Any]) -> dict[bytes, Any]:
    by_key: dict[bytes, Any] = {}
    for record in outputs:
        assert record.key is not None and record.value is not None
        by_key[record.key] = deserialize(record.value)
    return by_key


# ------------------------------------------------------------------------------------------------ avro


@pytest.mark.slow
def test_avro_2000_records_with_a_schema_change_mid_stream(kafka_bootstrap: str, schema_registry_url: str) -> None:
    topic_in, topic_out, dlq = _topics(kafka_bootstrap)
    client = SchemaRegistryClient({"url": schema_registry_url, "timeout": 10})
    strategy = {"auto.register.schemas": True, "subject.name.strategy.type": "TOPIC"}
    v1 = AvroSerializer(client, json.dumps(REVIEW_V1), conf=strategy)
    v2 = AvroSerializer(client, json.dumps(REVIEW_V2), conf=strategy)
    inputs = [{"id": i, "text": _text(i)} for i in range(1000)]
    inputs += [{"id": i, "text": _text(i), "lang": "en" if i % 2 else None} for i in range(1000, 2000)]
    values = _serialize_all(v1, topic_in, inputs[:1000]) + _serialize_all(v2, topic_in, inputs[1000:])
    produce(kafka_bootstrap, topic_in, [(str(r["id"]).encode(), v) for r, v in zip(inputs, values, strict=True)])

    summary = _run(_pipeline(kafka_bootstrap, schema_registry_url, topic_in, topic_out, dlq, "avro"), 2000)

    assert summary.error is None and (summary.num_out, summary.num_dead_lettered) == (2000, 0)
    outputs = consume_all(kafka_bootstrap, topic_out, expected_count=2000)
    assert consume_all(kafka_bootstrap, dlq) == []
    # each input schema version became an output schema version under the output topic's subject
    out_ids = {_schema_id(r.value or b"") for r in outputs}
    assert out_ids == _registered_ids(client, f"{topic_out}-value") and len(out_ids) == 2
    latest = client.get_latest_version(f"{topic_out}-value").schema
    assert [f["name"] for f in json.loads(latest.schema_str)["fields"]] == ["id", "text", "lang", "embedding"]
    reader = AvroDeserializer(client)  # a standard consumer, reading each record with its writer schema
    got = _decoded_outputs(outputs, lambda v: reader(v, None))
    assert len(got) == 2000
    for record in inputs:
        out = got[str(record["id"]).encode()]
        assert out == {**record, "embedding": expected_embedding(record["text"])}


def test_bad_avro_records_are_dead_lettered_with_their_reasons(kafka_bootstrap: str,
                                                               schema_registry_url: str) -> None:
    topic_in, topic_out, dlq = _topics(kafka_bootstrap, partitions=1)
    client = SchemaRegistryClient({"url": schema_registry_url, "timeout": 10})
    good = AvroSerializer(client, json.dumps(REVIEW_V1), conf={"subject.name.strategy.type": "TOPIC"})
    # a record written with a schema (under another subject) that has no `text`
    no_text = {"type": "record", "name": "Rating", "namespace": "sluice.tests",
               "fields": [{"name": "id", "type": "long"}, {"name": "stars", "type": "int"}]}
    other = AvroSerializer(client, json.dumps(no_text), conf={"subject.name.strategy.type": "TOPIC_RECORD"})
    ctx = SerializationContext(topic_in, MessageField.VALUE)
    ok = good({"id": 1, "text": "fine"}, ctx)
    unknown_id = b"\x00" + (2_000_000_000).to_bytes(4, "big") + ok[5:]
    records = [
        (b"ok-1", ok),
        (b"not-avro", b"{\"id\": 1, \"text\": \"plain json\"}"),
        (b"unknown-id", unknown_id),
        (b"truncated", ok[:7]),  # the header of a known schema, then too few bytes
        (b"no-text", other({"id": 7, "stars": 4}, ctx)),
        (b"ok-2", good({"id": 2, "text": "also fine"}, ctx)),
    ]
    produce(kafka_bootstrap, topic_in, records)

    summary = _run(_pipeline(kafka_bootstrap, schema_registry_url, topic_in, topic_out, dlq, "avro"), len(records))

    assert summary.error is None and (summary.num_out, summary.num_dead_lettered) == (2, 4)
    reader = AvroDeserializer(client)
    outputs = _decoded_outputs(consume_all(kafka_bootstrap, topic_out, expected_count=2), lambda v: reader(v, None))
    assert outputs == {b"ok-1": {"id": 1, "text": "fine", "embedding": expected_embedding("fine")},
                       b"ok-2": {"id": 2, "text": "also fine", "embedding": expected_embedding("also fine")}}
    dead = {r.key: ({k: (v or b"").decode() for k, v in r.headers}, r.value)
            for r in consume_all(kafka_bootstrap, dlq, expected_count=4)}
    reasons = {key: headers["sluice.error.message"] for key, (headers, _) in dead.items()}
    assert "does not start with a schema registry header" in reasons[b"not-avro"]
    assert "unknown schema id 2000000000" in reasons[b"unknown-id"]
    assert "does not decode" in reasons[b"truncated"]
    assert "has no field 'text'" in reasons[b"no-text"]
    assert all(headers["sluice.error.stage"] == "decode" for headers, _ in dead.values())
    assert {key: value for key, (_, value) in dead.items()} == {k: v for k, v in records if k in dead}  # original bytes


# -------------------------------------------------------------------------------------- protobuf, json


@pytest.mark.slow
def test_protobuf_2000_records(kafka_bootstrap: str, schema_registry_url: str) -> None:
    topic_in, topic_out, dlq = _topics(kafka_bootstrap)
    client = SchemaRegistryClient({"url": schema_registry_url, "timeout": 10})
    serializer = ProtobufSerializer(Review, client, {"use.deprecated.format": False,
                                                     "subject.name.strategy.type": "TOPIC"})
    inputs = [Review(id=i, text=_text(i), **({"lang": "de"} if i % 3 == 0 else {})) for i in range(2000)]
    values = _serialize_all(serializer, topic_in, inputs)
    produce(kafka_bootstrap, topic_in, [(str(m.id).encode(), v) for m, v in zip(inputs, values, strict=True)])

    loaded = _pipeline(kafka_bootstrap, schema_registry_url, topic_in, topic_out, dlq, "protobuf",
                       message_type="tests.codecs.reviews_pb2:Review")
    summary = _run(loaded, 2000)

    assert summary.error is None and (summary.num_out, summary.num_dead_lettered) == (2000, 0)
    outputs = consume_all(kafka_bootstrap, topic_out, expected_count=2000)
    assert {_schema_id(r.value or b"") for r in outputs} == _registered_ids(client, f"{topic_out}-value")
    # No registry client: Apicurio's ccompat API returns serialized descriptors unencoded (see
    # sluice/codecs/protobuf.py); the generated class reads the bytes, the framing is confluent-kafka's.
    reader = ProtobufDeserializer(EnrichedReview, {"use.deprecated.format": False})
    got = _decoded_outputs(outputs, lambda v: reader(v, None))
    for message in inputs:
        out = got[str(message.id).encode()]
        assert (out.id, out.text, out.HasField("lang"), out.lang) == (
            message.id, message.text, message.HasField("lang"), message.lang)
        assert list(out.embedding) == expected_embedding(message.text)


@pytest.mark.slow
def test_json_schema_2000_records(kafka_bootstrap: str, schema_registry_url: str) -> None:
    topic_in, topic_out, dlq = _topics(kafka_bootstrap)
    client = SchemaRegistryClient({"url": schema_registry_url, "timeout": 10})
    serializer = JSONSerializer(json.dumps(REVIEW_JSON), client, conf={"subject.name.strategy.type": "TOPIC"})
    inputs = [{"id": i, "text": _text(i)} for i in range(2000)]
    values = _serialize_all(serializer, topic_in, inputs)
    produce(kafka_bootstrap, topic_in, [(str(r["id"]).encode(), v) for r, v in zip(inputs, values, strict=True)])

    summary = _run(_pipeline(kafka_bootstrap, schema_registry_url, topic_in, topic_out, dlq, "json_schema"), 2000)

    assert summary.error is None and (summary.num_out, summary.num_dead_lettered) == (2000, 0)
    outputs = consume_all(kafka_bootstrap, topic_out, expected_count=2000)
    out_ids = {_schema_id(r.value or b"") for r in outputs}
    assert out_ids == _registered_ids(client, f"{topic_out}-value") and len(out_ids) == 1
    out_schema = json.loads(client.get_schema(out_ids.pop()).schema_str)
    assert out_schema["properties"]["embedding"] == EMBED_SCHEMA
    reader = JSONDeserializer(None, schema_registry_client=client)  # validates each record against its schema
    got = _decoded_outputs(outputs, lambda v: reader(v, SerializationContext(topic_out, MessageField.VALUE)))
    for record in inputs:
        assert got[str(record["id"]).encode()] == {**record, "embedding": expected_embedding(record["text"])}


# ---------------------------------------------------------------------------------- registry outage


class _StallLog(Observer):
    def __init__(self) -> None:
        self.stalls: list[tuple[TopicPartition, str, bool]] = []
        self.unstalls: list[tuple[TopicPartition, float]] = []

    def stalled(self, tp: TopicPartition, reason: str, retry_in_s: float, first: bool) -> None:
        self.stalls.append((tp, reason, first))

    def unstalled(self, tp: TopicPartition, stalled_s: float) -> None:
        self.unstalls.append((tp, stalled_s))


@pytest.mark.slow
def test_registry_killed_mid_run_and_restarted_loses_nothing(kafka_bootstrap: str, own_registry: RegistryServer,
                                                             tmp_path: Path) -> None:
    topic_in, topic_out, dlq = _topics(kafka_bootstrap, partitions=1)
    client = SchemaRegistryClient({"url": own_registry.url, "timeout": 10})
    strategy = {"subject.name.strategy.type": "TOPIC"}
    before = [{"id": i, "text": _text(i)} for i in range(300)]
    after = [{"id": i, "text": _text(i), "lang": "fr"} for i in range(300, 600)]
    v1_values = _serialize_all(AvroSerializer(client, json.dumps(REVIEW_V1), conf=strategy), topic_in, before)
    produce(kafka_bootstrap, topic_in, [(str(r["id"]).encode(), v) for r, v in zip(before, v1_values, strict=True)])

    observer = _StallLog()
    loaded = _pipeline(kafka_bootstrap, own_registry.url, topic_in, topic_out, dlq, "avro")
    # no max_records: the run must not end while the last records wait for the registry
    runner, engine = build_runner(loaded, idle_exit_s=5, observer=observer)
    result: list[RunSummary] = []
    thread = threading.Thread(target=lambda: result.append(runner.run()), daemon=True)
    thread.start()
    try:
        consume_all(kafka_bootstrap, topic_out, expected_count=300, timeout_s=60)
        # A producer evolves the schema (registering v2) after Sluice started, then the registry crashes:
        # the v2 records reach Sluice while it is down, so their new schema id cannot be looked up.
        v2_values = _serialize_all(AvroSerializer(client, json.dumps(REVIEW_V2), conf=strategy), topic_in, after)
        own_registry.kill()
        produce(kafka_bootstrap, topic_in, [(str(r["id"]).encode(), v)
                                            for r, v in zip(after, v2_values, strict=True)])
        deadline = time.monotonic() + 30
        while not observer.stalls and time.monotonic() < deadline:
            time.sleep(0.1)
        assert observer.stalls, "Sluice never noticed that the registry was down"
        time.sleep(2)  # several retries while it is down
        assert thread.is_alive()
        group = loaded.pipeline.source.kafka.group_id
        assert committed_offsets(kafka_bootstrap, group, topic_in).get(0, 0) <= 300  # nothing past the stall
        assert consume_all(kafka_bootstrap, dlq) == []
        own_registry.restart()
        thread.join(timeout=120)
    finally:
        runner.stop()
        thread.join(timeout=60)
        engine.close()

    summary = result[0]
    assert summary.error is None and (summary.num_out, summary.num_dead_lettered) == (600, 0)
    assert consume_all(kafka_bootstrap, dlq) == []
    tp = TopicPartition(topic_in, 0)
    assert observer.stalls[0][0] == tp and observer.stalls[0][2]  # first stall...
    assert "schema registry" in observer.stalls[0][1]
    assert [u[0] for u in observer.unstalls] == [tp]  # ...and it ended once
    assert len(observer.stalls) > 3  # retried with backoff while the registry was down
    reader = AvroDeserializer(client)
    got = _decoded_outputs(consume_all(kafka_bootstrap, topic_out, expected_count=600), lambda v: reader(v, None))
    for record in before + after:
        assert got[str(record["id"]).encode()] == {**record, "embedding": expected_embedding(record["text"])}
    assert committed_offsets(kafka_bootstrap, group, topic_in) == {0: 600}


def test_avro_in_json_out_with_keys_from_a_field(kafka_bootstrap: str, schema_registry_url: str) -> None:
    topic_in, topic_out, dlq = _topics(kafka_bootstrap, partitions=1)
    client = SchemaRegistryClient({"url": schema_registry_url, "timeout": 10})
    serializer = AvroSerializer(client, json.dumps(REVIEW_V2), conf={"subject.name.strategy.type": "TOPIC"})
    inputs = [{"id": i, "text": _text(i), "lang": None if i % 2 else "en"} for i in range(50)]
    produce(kafka_bootstrap, topic_in, [(None, v) for v in _serialize_all(serializer, topic_in, inputs)])
    loaded = _pipeline(kafka_bootstrap, schema_registry_url, topic_in, topic_out, dlq, "avro")
    doc = loaded.pipeline.model_dump(mode="json")
    doc["sink"]["output"].update({"format": "json", "key": "field:id"})
    doc["engine"] = {"type": "python", "function": "tests.codecs.funcs:embed"}  # no result schema needed
    summary = _run(parse_pipeline(json.dumps(doc), base_dir=ROOT), 50)

    assert summary.error is None and (summary.num_out, summary.num_dead_lettered) == (50, 0)
    outputs = consume_all(kafka_bootstrap, topic_out, expected_count=50)
    assert [(r.key, json.loads(r.value or b"")) for r in outputs] == [
        (str(r["id"]).encode(), {**r, "embedding": expected_embedding(r["text"])}) for r in inputs]
    assert f"{topic_out}-value" not in client.get_subjects()  # plain JSON: nothing registered


def test_a_user_given_output_schema_under_the_record_name_strategy(kafka_bootstrap: str, schema_registry_url: str,
                                                                   tmp_path: Path) -> None:
    topic_in, topic_out, dlq = _topics(kafka_bootstrap, partitions=1)
    client = SchemaRegistryClient({"url": schema_registry_url, "timeout": 10})
    serializer = AvroSerializer(client, json.dumps(REVIEW_V1), conf={"subject.name.strategy.type": "TOPIC"})
    inputs = [{"id": i, "text": _text(i)} for i in range(40)]
    produce(kafka_bootstrap, topic_in, [(None, v) for v in _serialize_all(serializer, topic_in, inputs)])
    name = f"Enriched{unique_topic('r').replace('-', '_')}"  # a subject of this test's own
    schema_file = tmp_path / "enriched.avsc"
    schema_file.write_text(json.dumps({"type": "record", "name": name, "namespace": "sluice.tests", "fields": [
        {"name": "id", "type": "long"}, {"name": "text", "type": "string"},
        {"name": "embedding", "type": {"type": "array", "items": "double"}},
        {"name": "note", "type": "string", "default": "none"}]}))
    loaded = _pipeline(kafka_bootstrap, schema_registry_url, topic_in, topic_out, dlq, "avro")
    doc = loaded.pipeline.model_dump(mode="json")
    doc["sink"]["output"].update({"schema_file": str(schema_file), "subject_name_strategy": "record"})
    summary = _run(parse_pipeline(json.dumps(doc), base_dir=ROOT), 40)

    assert summary.error is None and (summary.num_out, summary.num_dead_lettered) == (40, 0)
    registered = client.get_latest_version(f"sluice.tests.{name}")
    outputs = consume_all(kafka_bootstrap, topic_out, expected_count=40)
    assert {_schema_id(r.value or b"") for r in outputs} == {registered.schema_id}
    reader = AvroDeserializer(client)
    assert [reader(r.value, None) for r in outputs] == [
        {**r, "embedding": expected_embedding(r["text"]), "note": "none"} for r in inputs]
