"""Operator overhead: topic-to-topic records/s with a no-op engine, beside a plain confluent-kafka loop.

Same broker, same input topic, same records, one run. Throughput is measured on the output topic, from the
first to the last output record's produce timestamp, so group-join time does not count for anyone. CPU time
per record (this process, librdkafka's threads included) is printed too: on a busy machine it is the
steadier measure.

    python bench/operator_overhead.py [--records 200000] [--bootstrap HOST:PORT] [--tracing] [--exactly-once]
                                      [--avro [--registry URL]]

--tracing adds two rows at the largest batch size, tracing off and tracing on (default sampling, spans
handed to an exporter that drops them), to measure what tracing costs in the same run. --exactly-once adds
``delivery: exactly_once`` rows at the largest batch size (default transaction settings; outputs read with
``read_committed``) beside an at-least-once row. --avro adds the same comparison for Avro records with
Schema Registry framing at the largest batch size: Sluice (``codec.format: avro``, output schema derived
and registered) against a plain consume -> AvroDeserializer -> AvroSerializer -> produce loop, both with
confluent-kafka's serializers configured alike; its ratio is against that Avro loop.

Without --bootstrap (or SLUICE_KAFKA_BOOTSTRAP) a single-node broker is started in a temp dir; without
--registry (or SLUICE_SCHEMA_REGISTRY_URL), --avro starts a Schema Registry (deploy/registry) in one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

from common import RESULTS, ROOT, broker, output_rate, registry  # noqa: E402
from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402

from sluice.codecs.subjects import no_subject  # noqa: E402
from sluice.config import Tracing, parse_pipeline  # noqa: E402
from sluice.operator.build import build_runner  # noqa: E402
from sluice.telemetry import build_observer  # noqa: E402
from tests.support.kafka import create_topic, produce, unique_topic  # noqa: E402


def plain_loop(bootstrap: str, topic_in: str, topic_out: str, n: int,
               decode: Callable[[bytes], dict[str, Any]] = json.loads,
               encode: Callable[[dict[str, Any]], bytes] = lambda doc: json.dumps(doc).encode()) -> None:
    """What most teams write first: poll, decode, call the model per record, encode, produce."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("plain"),
                         "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "queue.buffering.max.messages": 500_000})
    consumer.subscribe([topic_in])
    done = 0
    while done < n:
        for m in consumer.consume(500, 0.05):
            if m.error() is not None:
                continue
            doc = decode(m.value())
            doc["result"] = doc["text"]  # the no-op model
            value = encode(doc)
            while True:
                try:
                    producer.produce(topic_out, value, key=m.key())
                    break
                except BufferError:  # local queue full: serve delivery reports, then try again
                    producer.poll(0.05)
            done += 1
        producer.poll(0)
    producer.flush(60)
    consumer.close()


REVIEW = {"type": "record", "name": "Review", "namespace": "bench",
          "fields": [{"name": "seq", "type": "long"}, {"name": "text", "type": "string"}]}
# what Sluice derives for the no-op engine's result (a string): the input record plus the result field
REVIEW_OUT = {**REVIEW, "fields": [*REVIEW["fields"], {"name": "result", "type": "string"}]}


def plain_avro_loop(bootstrap: str, registry_url: str, topic_in: str, topic_out: str, n: int) -> None:
    """The same loop for Avro: confluent-kafka's deserializer and serializer per record, configured as
    Sluice configures them (read by schema id with no subject lookups; TopicNameStrategy for the output)."""
    client = SchemaRegistryClient({"url": registry_url, "timeout": 10})
    deserialize = AvroDeserializer(client, conf={"subject.name.strategy": no_subject})
    serialize = AvroSerializer(client, json.dumps(REVIEW_OUT), conf={"subject.name.strategy.type": "TOPIC"})
    ctx = SerializationContext(topic_out, MessageField.VALUE)
    plain_loop(bootstrap, topic_in, topic_out, n, decode=lambda value: deserialize(value, None),
               encode=lambda doc: serialize(doc, ctx))
    client.close()


def produce_avro(bootstrap: str, registry_url: str, topic: str, n: int) -> None:
    client = SchemaRegistryClient({"url": registry_url, "timeout": 10})
    serialize = AvroSerializer(client, json.dumps(REVIEW), conf={"subject.name.strategy.type": "TOPIC"})
    ctx = SerializationContext(topic, MessageField.VALUE)
    produce(bootstrap, topic, ((f"k{i % 1000}", serialize({"seq": i, "text": f"review text {i}"}, ctx))
                               for i in range(n)), timeout_s=120)
    client.close()


class _DropSpans(SpanExporter):
    """A no-op exporter: the SDK does all its work, nothing leaves the process."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def sluice_run(bootstrap: str, topic_in: str, topic_out: str, n: int, batch: int,
               sample_ratio: float | None = None, exactly_once: bool = False, registry_url: str | None = None) -> None:
    """``sample_ratio`` set: tracing on, spans dropped by a no-op exporter. ``registry_url``: Avro records."""
    codec = "{format: json, input_field: text}"
    if registry_url is not None:
        codec = f'{{format: avro, input_field: text, schema_registry: {{url: "{registry_url}"}}}}'
    text = f"""
source: {{kafka: {{bootstrap_servers: "{bootstrap}", topics: [{topic_in}], group_id: {unique_topic("sluice")}}}}}
codec: {codec}
batching: {{max_batch_size: {batch}, max_queue_delay_ms: 5}}
engine: {{type: python, function: "examples.functions.text:noop", result_schema: {{type: string}}}}
sink: {{kafka: {{topic: {topic_out}}}, output: {{field: result}}}}
dead_letter: {{topic: {topic_out}.dlq}}
runtime: {{max_in_flight: 20000, drain_timeout_s: 600}}
"""
    if sample_ratio is not None:
        text += f"telemetry: {{tracing: {{sample_ratio: {sample_ratio}}}}}\n"
    if exactly_once:
        text += f"delivery: exactly_once\nexactly_once: {{transactional_id: {unique_topic('bench-tx')}}}\n"
    loaded = parse_pipeline(text, base_dir=ROOT)
    observer = None
    if sample_ratio is not None:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(_DropSpans()))
        observer = build_observer(loaded.pipeline, tracer_provider=provider)
    runner, engine = build_runner(loaded, max_records=n, observer=observer)
    summary = runner.run()
    engine.close()
    if summary.error or summary.num_out != n:
        raise RuntimeError(f"sluice run failed: {summary}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--bootstrap", default=os.environ.get("SLUICE_KAFKA_BOOTSTRAP"))
    parser.add_argument("--batch-sizes", default="1,64,512")
    parser.add_argument("--tracing", action="store_true", help="add tracing off / on rows at the largest batch")
    parser.add_argument("--exactly-once", action="store_true",
                        help="add at-least-once / exactly-once rows at the largest batch")
    parser.add_argument("--sample-ratio", type=float, default=Tracing().sample_ratio,
                        help="tracing.sample_ratio of the tracing-on row (default: the config's default)")
    parser.add_argument("--avro", action="store_true",
                        help="add a plain Avro loop and a Sluice Avro row at the largest batch")
    parser.add_argument("--registry", default=os.environ.get("SLUICE_SCHEMA_REGISTRY_URL"),
                        help="Schema Registry URL for --avro (default: start one)")
    args = parser.parse_args()
    os.chdir(ROOT)
    with broker(args.bootstrap) as bootstrap, contextlib.ExitStack() as stack:
        registry_url = stack.enter_context(registry(args.registry)) if args.avro else None
        n = args.records
        topic_in = unique_topic("bench-in")
        create_topic(bootstrap, topic_in, 3)
        print(f"producing {n} records to {topic_in} ...", file=sys.stderr)
        produce(bootstrap, topic_in, ((f"k{i % 1000}", json.dumps({"seq": i, "text": f"review text {i}"}))
                                      for i in range(n)), timeout_s=120)
        avro_in = None
        if registry_url is not None:
            avro_in = unique_topic("bench-avro-in")
            create_topic(bootstrap, avro_in, 3)
            print(f"producing {n} Avro records to {avro_in} ...", file=sys.stderr)
            produce_avro(bootstrap, registry_url, avro_in, n)
        rows = []
        # (name, batch size or None for a plain loop, sample ratio or None for tracing off, exactly-once, avro)
        contenders: list[tuple[str, int | None, float | None, bool, bool]] = [
            ("plain confluent-kafka loop", None, None, False, False)]
        contenders += [(f"sluice batch {b}", int(b), None, False, False) for b in args.batch_sizes.split(",")]
        largest = max(int(b) for b in args.batch_sizes.split(","))
        if args.tracing:
            contenders += [(f"sluice batch {largest}, tracing off", largest, None, False, False),
                           (f"sluice batch {largest}, tracing on (no-op exporter, sample_ratio "
                            f"{args.sample_ratio:g})", largest, args.sample_ratio, False, False)]
        if args.exactly_once:
            contenders += [(f"sluice batch {largest}, at-least-once", largest, None, False, False),
                           (f"sluice batch {largest}, exactly-once", largest, None, True, False)]
        if args.avro:
            contenders += [("plain confluent-kafka Avro loop", None, None, False, True),
                           (f"sluice batch {largest}, Avro", largest, None, False, True)]
        for name, batch, sample_ratio, exactly_once, avro in contenders:
            topic_out = unique_topic("bench-out")
            create_topic(bootstrap, topic_out, 3)
            create_topic(bootstrap, topic_out + ".dlq", 1)
            print(f"running {name} ...", file=sys.stderr)
            source = avro_in if avro else topic_in
            assert source is not None
            cpu_s = time.process_time()  # this process, librdkafka's threads included
            if batch is None and avro:
                assert registry_url is not None
                plain_avro_loop(bootstrap, registry_url, source, topic_out, n)
            elif batch is None:
                plain_loop(bootstrap, source, topic_out, n)
            else:
                sluice_run(bootstrap, source, topic_out, n, batch, sample_ratio, exactly_once,
                           registry_url if avro else None)
            cpu_us = (time.process_time() - cpu_s) / n * 1e6
            rows.append({"contender": name, "batch": batch, "avro": avro,
                         "records_per_s": output_rate(bootstrap, topic_out, n), "cpu_us_per_record": cpu_us})
        for row in rows:  # each against the plain loop of its own format
            base = next(r for r in rows if r["batch"] is None and r["avro"] == row["avro"])
            row["ratio_vs_plain"] = row["records_per_s"] / base["records_per_s"]
        lines = ["| contender | records/s | ratio vs plain loop (same format) | CPU µs / record |",
                 "|---|---:|---:|---:|"]
        lines += [f"| {r['contender']} | {r['records_per_s']:,.0f} | {r['ratio_vs_plain']:.2f} "
                  f"| {r['cpu_us_per_record']:.1f} |" for r in rows]
        table = "\n".join(lines)
        print(table)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "operator_overhead.json").write_text(json.dumps({"records": n, "rows": rows}, indent=2))
        (RESULTS / "operator_overhead.md").write_text(f"{n:,} JSON records, 3 partitions, no-op engine\n\n{table}\n")


if __name__ == "__main__":
    main()
