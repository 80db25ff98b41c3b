"""One contender of ``bench/compare.py``, in a process of its own, so CPU use is read the same way for all.

    python bench/compare_child.py PEER SPEC_JSON

PEER is ``sluice``, ``plain``, ``faust`` or ``bytewax``. SPEC_JSON holds ``bootstrap``, ``topic_in``,
``topic_out``, ``group``, ``workload`` (``embed`` or ``noop``), ``batch``, ``delay_ms``, ``threads``, and
``scratch_dir`` (Faust's data dir; the parent removes it), and optionally ``bucket_by`` (Sluice's batching
order for embed; default ``tokens``).

Every contender reads ``topic_in`` from the earliest offset, calls the same model (:func:`make_model`: the
ONNX MiniLM engine with the same thread counts -- the peers with onnxruntime's default spinning threads,
Sluice with its own default, sleeping ones -- or the no-op function) and writes the input JSON object plus the
result (``embedding`` or ``result``) to ``topic_out``. It runs until SIGTERM. Sluice then drains and prints
one JSON line, ``{"queue_wait_ms": {phase: [...]}}``: per record, batch start minus the moment it was
polled, grouped by the record's ``phase`` field (the load level of bench/compare_harness.py).
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

Model = Callable[[list[Any]], list[Any]]


def make_model(workload: str, threads: int) -> tuple[Model, str]:
    """(model, output field): a function from a list of texts to one JSON-ready result per text."""
    from examples.functions.text import noop

    if workload == "noop":
        return noop, "result"
    from sluice.engines.engine_contract import EngineContext
    from sluice.engines.onnx.onnx_engine import OnnxEngine, OnnxOptions
    from sluice.model_store import fetch

    # onnxruntime's own default, spinning worker threads, as a hand-written app gets it: faster for a loop that
    # does nothing else while the model runs (Sluice turns it off: its intake and emitter threads need the cores)
    engine = OnnxEngine(OnnxOptions(model=str(fetch("minilm-l6")), providers=["cpu"], intra_op_num_threads=threads,
                                    inter_op_num_threads=1, intra_op_spinning=True), EngineContext(max_batch_size=64))
    engine.start()

    def embed(texts: list[str]) -> list[Any]:
        vectors = engine.infer(engine.prepare(texts))  # one (384,) vector per text
        return [v.tolist() if hasattr(v, "tolist") else v for v in vectors]

    return embed, "embedding"


def run_sluice(spec: dict[str, Any]) -> None:
    from sluice.config import parse_pipeline
    from sluice.operator.build import build_runner
    from sluice.operator.observer import Observer
    from sluice.operator.record import Pending

    class QueueWait(Observer):
        """Batch start minus record receipt, both on the runner's monotonic clock."""

        def __init__(self) -> None:
            self.waits_ms: dict[str, list[float]] = {}  # by the record's "phase" (load level)
            self.batches: dict[str, list[tuple[int, float]]] = {}  # phase -> (batch size, engine ms)

        def batch_started(self, batch: Sequence[Pending], now_s: float) -> Any:
            phase = "None"
            for p in batch:
                phase = str(p.document.get("phase")) if isinstance(p.document, dict) else "None"
                self.waits_ms.setdefault(phase, []).append((now_s - p.record.received_s) * 1000)
            return phase

        def batch_finished(self, handle: Any, batch: Sequence[Pending], infer_s: float, num_failed: int) -> None:
            self.batches.setdefault(handle, []).append((len(batch), infer_s * 1000))

    if spec["workload"] == "noop":
        engine = 'engine: {type: python, function: "examples.functions.text:noop"}'
        field, bucket = "result", ""
    else:
        extra = "".join(f", {k}: {json.dumps(v)}" for k, v in spec.get("engine_options", {}).items())
        engine = (f"engine: {{type: onnx, model: minilm-l6, providers: [cpu], intra_op_num_threads: "
                  f"{spec['threads']}, inter_op_num_threads: 1{extra}}}")
        field, bucket = "embedding", f", bucket_by: {spec.get('bucket_by', 'tokens')}"
    bucket += "".join(f", {k}: {json.dumps(v)}" for k, v in spec.get("batching_options", {}).items())
    text = f"""
source: {{kafka: {{bootstrap_servers: "{spec['bootstrap']}", topics: [{spec['topic_in']}], group_id: {spec['group']}}}}}
codec: {{format: json, input_field: text}}
batching: {{max_batch_size: {spec['batch']}, max_queue_delay_ms: {spec['delay_ms']}{bucket}}}
{engine}
sink: {{kafka: {{topic: {spec['topic_out']}}}, output: {{field: {field}}}}}
dead_letter: {{topic: {spec['topic_out']}.dlq}}
runtime: {{max_in_flight: 20000, drain_timeout_s: 60}}
"""
    observer = QueueWait()
    runner, model = build_runner(parse_pipeline(text, base_dir=ROOT), observer=observer)
    signal.signal(signal.SIGTERM, lambda *_: runner.stop())
    runner.run()
    model.close()
    print(json.dumps({"queue_wait_ms": observer.waits_ms, "batches": observer.batches}), flush=True)


def run_plain(spec: dict[str, Any]) -> None:
    """What most teams write first: poll, decode, call the model once per record, encode, produce."""
    from confluent_kafka import Consumer, Producer

    model, field = make_model(spec["workload"], spec["threads"])
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    consumer = Consumer({"bootstrap.servers": spec["bootstrap"], "group.id": spec["group"],
                         "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": spec["bootstrap"], "linger.ms": 5,
                         "queue.buffering.max.messages": 500_000})
    consumer.subscribe([spec["topic_in"]])
    while not stop[0]:
        for m in consumer.consume(500, 0.05):
            if m.error() is not None:
                continue
            doc = json.loads(m.value() or b"{}")
            doc[field] = model([doc["text"]])[0]
            while True:
                try:
                    producer.produce(spec["topic_out"], json.dumps(doc).encode(), key=m.key())
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        producer.poll(0)
    producer.flush(10)
    consumer.close()


def run_faust(spec: dict[str, Any]) -> None:
    """A Faust agent batching with ``stream.take(max_batch_size, within=max_queue_delay)``; the model runs in
    the default executor, as the Faust docs advise for blocking work."""
    import asyncio
    import logging

    import faust

    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    model, field = make_model(spec["workload"], spec["threads"])
    app = faust.App(spec["group"], broker=f"kafka://{spec['bootstrap']}", value_serializer="raw",
                    web_enabled=False, datadir=spec["scratch_dir"], topic_partitions=3,
                    topic_replication_factor=1, consumer_auto_offset_reset="earliest")
    source = app.topic(spec["topic_in"], value_serializer="raw")
    sink = app.topic(spec["topic_out"], value_serializer="raw")
    within_s = spec["delay_ms"] / 1000

    @app.agent(source)
    async def infer(stream: Any) -> None:
        loop = asyncio.get_running_loop()
        async for values in stream.take(spec["batch"], within=within_s):
            docs = [json.loads(v) for v in values]
            results = await loop.run_in_executor(None, model, [d["text"] for d in docs])
            for doc, result in zip(docs, results, strict=True):
                doc[field] = result
                await sink.send(value=json.dumps(doc).encode())

    faust.Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


def run_bytewax(spec: dict[str, Any]) -> None:
    """A Bytewax dataflow: one key, ``collect(max_size=max_batch_size, timeout=max_queue_delay)``, the model
    per collected list, a Kafka sink. The source polls ``max_batch_size`` records at a time (its default, 1000,
    makes outputs leave in bursts of a whole poll)."""
    import bytewax.operators as op
    from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
    from bytewax.dataflow import Dataflow
    from bytewax.testing import run_main

    model, field = make_model(spec["workload"], spec["threads"])
    flow = Dataflow("compare")
    messages = op.input("in", flow, KafkaSource([spec["bootstrap"]], [spec["topic_in"]], tail=True,
                                                          batch_size=spec["batch"]))  # poll one batch at a time
    keyed = op.key_on("one_key", messages, lambda _m: "all")
    batches = op.collect("batch", keyed, timedelta(milliseconds=spec["delay_ms"]), max_size=spec["batch"])

    def infer(key_batch: tuple[str, list[Any]]) -> list[Any]:
        docs = [json.loads(m.value) for m in key_batch[1]]
        results = model([d["text"] for d in docs])
        out = []
        for message, doc, result in zip(key_batch[1], docs, results, strict=True):
            doc[field] = result
            out.append(KafkaSinkMessage(message.key, json.dumps(doc).encode()))
        return out

    op.output("out", op.flat_map("infer", batches, infer), KafkaSink([spec["bootstrap"]], spec["topic_out"]))
    run_main(flow)


PEERS = {"sluice": run_sluice, "plain": run_plain, "faust": run_faust, "bytewax": run_bytewax}

def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the bench that started it dies (no orphaned contenders)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    _die_with_parent()
    PEERS[sys.argv[1]](json.loads(sys.argv[2]))
