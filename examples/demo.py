"""Demo helper: create the demo topics, produce sample reviews, and show what came out.

    python examples/demo.py topics   --bootstrap HOST:PORT
    python examples/demo.py produce  --bootstrap HOST:PORT [--count 200] [--registry URL]
    python examples/demo.py show     --bootstrap HOST:PORT [--topic reviews.embeddings] [--limit 5] [--registry URL]

With --registry, ``produce`` writes Avro records with confluent-kafka's AvroSerializer to 'reviews-avro'
(registering their schema under reviews-avro-value) and ``show`` reads Avro with its AvroDeserializer.

Used by ``./dev demo`` and ``./dev demo-avro``; plain confluent-kafka, so it also works against any broker
(and Schema Registry) you point it at.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

# Every topic the pipelines in examples/pipelines/ read or write (tests/test_config.py checks it): Sluice
# checks at start that they exist, and the demo broker does not create topics on its own.
TOPICS = {"reviews": 3, "reviews.embeddings": 3, "reviews.shouted": 3, "reviews.labelled": 3,
          "reviews.extracted": 3, "reviews.dlq": 1,
          "reviews.sentiment": 3, "events": 3, "events.entities": 3, "events.dlq": 1,
          "search.candidates": 3, "search.scored": 3, "search.dlq": 1,
          "reviews-avro": 3, "reviews-avro.embeddings": 3, "reviews-avro.dlq": 1,
          "uploads": 3, "uploads.labels": 3, "uploads.dlq": 1}

REVIEW_SCHEMA = {"type": "record", "name": "Review", "namespace": "shop.reviews",
                 "fields": [{"name": "review_id", "type": "long"}, {"name": "product", "type": "string"},
                            {"name": "text", "type": "string"}]}

REVIEWS = [
    "Arrived quickly and works exactly as described.",
    "The battery died after two days. Very disappointed.",
    "Great value for the price, would buy again!",
    "Meh. It does the job, nothing special.",
    "Terrible customer service; they never answered my emails.",
    "I love the colour and the fabric feels premium.",
    "Instructions were in Swedish only, but assembly was intuitive anyway.",
    "Das Produkt ist gut verarbeitet und sehr leise.",
    "Le son est excellent, mais l'application plante souvent.",
    "Perfect gift for my dad 🎁 he uses it every day",
    "Stopped working after the firmware update. Returned it.",
    "Smaller than it looks in the photos.",
    "This is the third one I have bought; reliable, sturdy, and the support team is friendly.",
    "Five stars.",
    "It's fine.",
    "The lid cracked in the dishwasher on the first wash, which the listing says is safe.",
]


def create_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=10).topics)
    new = [NewTopic(name, num_partitions=n, replication_factor=1) for name, n in TOPICS.items() if name not in existing]
    for name, future in (admin.create_topics(new).items() if new else []):
        try:
            future.result()
            print(f"created topic {name}")
        except KafkaException as err:
            print(f"topic {name}: {err.args[0].str()}", file=sys.stderr)


def produce(bootstrap: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        review = {"review_id": i, "product": f"sku-{i % 7}", "text": REVIEWS[i % len(REVIEWS)]}
        producer.produce("reviews", json.dumps(review).encode(), key=f"sku-{i % 7}".encode())
    producer.flush(30)
    # one malformed record, to show the dead-letter topic at work
    producer.produce("reviews", b"{this is not json", key=b"broken")
    producer.flush(30)
    print(f"produced {count} reviews and 1 malformed record to 'reviews'")


def produce_avro(bootstrap: str, registry: str, count: int) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry, "timeout": 10})
    serialize = AvroSerializer(client, json.dumps(REVIEW_SCHEMA), conf={"subject.name.strategy.type": "TOPIC"})
    ctx = SerializationContext("reviews-avro", MessageField.VALUE)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        review = {"review_id": i, "product": f"sku-{i % 7}", "text": REVIEWS[i % len(REVIEWS)]}
        producer.produce("reviews-avro", serialize(review, ctx), key=f"sku-{i % 7}".encode())
    # bytes that are not Avro at all, to show the dead-letter topic at work
    producer.produce("reviews-avro", b"{this is not avro", key=b"broken")
    producer.flush(30)
    print(f"produced {count} Avro reviews (schema under subject reviews-avro-value) and 1 malformed record "
          "to 'reviews-avro'")


def show(bootstrap: str, topic: str, limit: int, registry: str | None = None) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"sluice-demo-show-{time.time_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    shown, deadline = 0, time.monotonic() + 20
    while shown < limit and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None or msg.error():
            continue
        print(f"{topic}[{msg.partition()}]@{msg.offset()} key={msg.key()!r}")
        try:
            doc = read_value(msg.value(), registry) if not topic.endswith(".dlq") else json.loads(msg.value())
        except ValueError:
            print(f"  value: {msg.value()!r}")
        else:
            for k, v in doc.items():
                if isinstance(v, list) and len(v) > 6:
                    norm = sum(x * x for x in v) ** 0.5
                    v = f"[{', '.join(f'{x:.4f}' for x in v[:4])}, ...] ({len(v)} floats, norm {norm:.3f})"
                print(f"  {k}: {v}")
        for name, value in msg.headers() or []:
            if name.startswith("sluice.error."):
                print(f"  header {name}: {value.decode(errors='replace')}")
        shown += 1
    consumer.close()
    if shown == 0:
        print(f"nothing on {topic} yet", file=sys.stderr)


_readers: dict[str, object] = {}


def read_value(value: bytes, registry: str | None) -> dict:
    """JSON, or with ``registry`` Avro read by confluent-kafka's AvroDeserializer (its writer schema by id)."""
    if registry is None:
        return json.loads(value)
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    if registry not in _readers:
        _readers[registry] = AvroDeserializer(SchemaRegistryClient({"url": registry, "timeout": 10}))
    try:
        return _readers[registry](value, None)  # type: ignore[operator]
    except Exception as err:  # not Avro framing: shown as bytes
        raise ValueError(str(err)) from None


def main() -> None:
    parser = argparse.ArgumentParser(description="Sluice demo helper")
    parser.add_argument("command", choices=["topics", "produce", "show"])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--topic", default="reviews.embeddings")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--registry", default=None, help="Schema Registry URL: Avro records (reviews-avro)")
    args = parser.parse_args()
    if args.command == "topics":
        create_topics(args.bootstrap)
    elif args.command == "produce" and args.registry:
        produce_avro(args.bootstrap, args.registry, args.count)
    elif args.command == "produce":
        produce(args.bootstrap, args.count)
    else:
        show(args.bootstrap, args.topic, args.limit, args.registry)


if __name__ == "__main__":
    main()
