"""Avro records read and written by fastavro directly after each schema id's first record (avro.py) are the
records confluent-kafka's own deserializer and serializer give, on a schema with every kind of Avro type;
schemas that do not stand alone stay with confluent-kafka's serde. Real Schema Registry."""

from __future__ import annotations

import datetime
import decimal
import json
import random
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from sluice.codecs.registry_formats import build_schema_format
from sluice.codecs.subjects import no_subject
from sluice.config import parse_pipeline
from tests.support.kafka import unique_topic

ITEM = {"type": "record", "name": "Item", "fields": [{"name": "sku", "type": "string"},
                                                      {"name": "qty", "type": "int"}]}
ORDER = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "text", "type": "string"},
        {"name": "id", "type": "long"}, {"name": "score", "type": "double"}, {"name": "ratio", "type": "float"},
        {"name": "ok", "type": "boolean"}, {"name": "blob", "type": "bytes"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B", "C"]}},
        {"name": "tag", "type": {"type": "fixed", "name": "Tag", "size": 4}},
        {"name": "items", "type": {"type": "array", "items": ITEM}},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {"name": "when", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "either", "type": ["int", "string", "null"]},
    ],
}


def _order(rng: random.Random, i: int) -> dict[str, Any]:
    return {
        "text": "".join(rng.choice("abcé漢 ") for _ in range(rng.randint(0, 40))),
        "id": rng.randint(-2**62, 2**62), "score": rng.uniform(-1e9, 1e9), "ratio": float(rng.randint(-100, 100)) / 4,
        "ok": rng.random() < 0.5, "blob": rng.randbytes(rng.randint(0, 20)),
        "note": None if i % 3 == 0 else f"note {i}", "kind": rng.choice("ABC"), "tag": rng.randbytes(4),
        "items": [{"sku": f"s{j}", "qty": rng.randint(0, 9)} for j in range(rng.randint(0, 3))],
        "counts": {f"k{j}": rng.randint(0, 10**12) for j in range(rng.randint(0, 3))},
        "when": datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(
            milliseconds=rng.randint(0, 10**10)),
        "day": datetime.date(2000, 1, 1) + datetime.timedelta(days=rng.randint(0, 20000)),
        "price": decimal.Decimal(rng.randint(-10**8, 10**8)).scaleb(-2),
        "ref": str(uuid.UUID(int=rng.getrandbits(128))), "either": rng.choice([None, rng.randint(0, 9), "x"]),
    }


def _format(registry_url: str, topic_in: str, topic_out: str, tmp_path: Path) -> Any:
    text = f"""
source: {{kafka: {{bootstrap_servers: "127.0.0.1:1", topics: [{topic_in}], group_id: g}}}}
codec: {{format: avro, input_field: text, schema_registry: {{url: "{registry_url}"}}}}
engine: {{type: python, function: "examples.functions.text:noop", result_schema: {{type: string}}}}
sink: {{kafka: {{topic: {topic_out}}}, output: {{field: result}}}}
"""
    pipeline = parse_pipeline(text, base_dir=tmp_path).pipeline
    return build_schema_format(pipeline, {"type": "string"}, tmp_path)


def test_direct_reads_and_writes_equal_confluent_kafkas_serde(schema_registry_url: str, tmp_path: Path) -> None:
    topic_in, topic_out = unique_topic("avro-direct-in"), unique_topic("avro-direct-out")
    client = SchemaRegistryClient({"url": schema_registry_url})
    serialize = AvroSerializer(client, json.dumps(ORDER), conf={"subject.name.strategy.type": "TOPIC"})
    rng = random.Random(7)
    records = [_order(rng, i) for i in range(300)]
    values = [serialize(r, SerializationContext(topic_in, MessageField.VALUE)) for r in records]
    reference = AvroDeserializer(client, conf={"subject.name.strategy": no_subject})

    fmt = _format(schema_registry_url, topic_in, topic_out, tmp_path)
    outputs = []
    for value in values:
        document, model_input = fmt.decode(value)
        assert document.record == reference(value, None)  # the first through confluent-kafka, the rest direct
        assert model_input == document.record["text"]
        outputs.append(fmt.encode(document, model_input.upper()))
    assert [r is not None for r in fmt._readers.values()] == [True]  # direct for the standalone schema

    read_back = AvroDeserializer(client, conf={"subject.name.strategy": no_subject})
    for out, value in zip(outputs, values, strict=True):
        expected = {**reference(value, None)}
        expected["result"] = expected["text"].upper()
        assert read_back(out, None) == expected
    assert len({out[:5] for out in outputs}) == 1  # every output under the one registered output schema id
    client.close()


def test_a_schema_with_references_stays_with_confluent_kafkas_deserializer(schema_registry_url: str,
                                                                           tmp_path: Path) -> None:
    topic_in, topic_out = unique_topic("avro-ref-in"), unique_topic("avro-ref-out")
    client = SchemaRegistryClient({"url": schema_registry_url})
    item_subject = unique_topic("item")
    client.register_schema(item_subject, Schema(json.dumps(ITEM), "AVRO"))
    version = client.get_latest_version(item_subject).version
    outer = {"type": "record", "name": "Basket", "fields": [{"name": "text", "type": "string"},
                                                             {"name": "item", "type": "Item"}]}
    schema = Schema(json.dumps(outer), "AVRO", [SchemaReference("Item", item_subject, version)])
    serialize = AvroSerializer(client, schema, conf={"subject.name.strategy.type": "TOPIC"})
    values = [serialize({"text": f"t{i}", "item": {"sku": "a", "qty": i}},
                        SerializationContext(topic_in, MessageField.VALUE)) for i in range(5)]

    fmt = _format(schema_registry_url, topic_in, topic_out, tmp_path)
    decoded = [fmt.decode(v)[0].record for v in values]
    assert decoded == [{"text": f"t{i}", "item": {"sku": "a", "qty": i}} for i in range(5)]
    assert list(fmt._readers.values()) == [None]  # named types from another subject: confluent-kafka's
    client.close()
