"""What a model reload costs in latency: per-record latency around the switch against the steady state.

A paced producer offers a steady load to a running pipeline whose model is a symlink, ``current``; after
``--steady-s`` the symlink is swapped to a second version (``engine.reload.watch``) and the run goes on for
``--after-s``. Each record's latency is its output's produce time less its input's. Windows, by when the
record was sent:

* **steady** -- before the swap;
* **build** -- from the swap to the switch (the new engine loads and warms up beside the serving one: on a
  CPU they share the cores);
* **switch** -- within ``--switch-window-s`` of the switch (the first output of the new model);
* **after** -- the rest.

The claim checked (issue 24): the switch costs at most one batch's worth of latency, i.e. the switch
window's p99 exceeds the steady p99 by no more than the mean engine time of one batch. The build window
is reported beside it (on a GPU, or with cores to spare, it is the steady state too).

    python bench/reload.py --quick                         # python engine, 20 ms batches: ~40 s
    python bench/reload.py --engine onnx --rate 60         # MiniLM (ONNX, CPU), two versions: ~1.5 min
    python bench/reload.py --engine onnx --rate 60 --threads 4

``--engine python`` isolates the operator's own switch (a model that sleeps per batch, no CPU contention);
``--engine onnx`` is a real model (the second version is MiniLM re-saved with other metadata: other bytes,
the same compute). Pick ``--rate`` at about half of what the pipeline sustains. Writes
bench/results/reload.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, ROOT, broker  # noqa: E402
from confluent_kafka import Consumer, Producer  # noqa: E402
from embed_engine import review_texts  # noqa: E402

from sluice.config import parse_pipeline  # noqa: E402
from sluice.engines.identity import MODEL_HEADER  # noqa: E402
from sluice.operator.build import build_runner  # noqa: E402
from sluice.telemetry import build_observer  # noqa: E402
from tests.support.kafka import create_topic, unique_topic  # noqa: E402


def versions(engine: str, root: Path, pause_s: float) -> tuple[Path, Path]:
    """Two model versions under ``root`` (v1, v2), for the python or the onnx engine."""
    v1, v2 = root / "v1", root / "v2"
    if engine == "python":
        v1.mkdir()
        v2.mkdir()
        (v1 / "model.json").write_text(json.dumps({"tag": "v1", "pause_s": pause_s}))
        (v2 / "model.json").write_text(json.dumps({"tag": "v2", "pause_s": pause_s}))
        return v1 / "model.json", v2 / "model.json"
    import onnx

    from sluice.model_store import fetch

    minilm = fetch("minilm-l6")
    for target in (v1, v2):
        target.mkdir()
        for item in minilm.iterdir():  # the tokenizer and configs; the weights only as ONNX
            if not item.name.startswith(".") and item.suffix not in (".safetensors", ".onnx"):
                (target / item.name).symlink_to(item)
    (v1 / "model.onnx").symlink_to(minilm / "model.onnx")
    model = onnx.load(str(minilm / "model.onnx"))
    onnx.helper.set_model_props(model, {"version": "v2"})  # other bytes, other digest, the same graph
    onnx.save(model, str(v2 / "model.onnx"))
    return v1, v2


def pipeline(engine: str, bootstrap: str, topic_in: str, topic_out: str, model: Path, threads: int,
             max_batch_size: int) -> str:
    if engine == "python":
        spec = f'type: python, factory: "tests.integration.funcs:load_tagger", model: "{model}"'
        output = "{field: tagged, mode: result}"
    else:
        spec = (f'type: onnx, model: "{model}", providers: [cpu], intra_op_num_threads: {threads}, '
                "inter_op_num_threads: 1")
        output = "{field: embedding, mode: result}"
    return f"""
source: {{kafka: {{bootstrap_servers: "{bootstrap}", topics: [{topic_in}], group_id: {unique_topic("g")}}}}}
codec: {{format: json, input_field: text}}
batching: {{max_batch_size: {max_batch_size}, max_queue_delay_ms: 20{", bucket_by: tokens" if engine == "onnx" else ""}}}
engine: {{{spec}, model_name: bench, reload: {{watch: true, poll_interval_s: 0.5, settle_s: 0}}}}
sink: {{kafka: {{topic: {topic_out}}}, output: {output}}}
dead_letter: {{topic: {topic_out}.dlq}}
runtime: {{drain_timeout_s: 60}}
telemetry: {{status: "off", metrics: {{enabled: true, port: 0}}}}
"""


def swap(current: Path, target: Path) -> None:
    tmp = current.with_name("current.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, current)


def paced(producer: Producer, topic: str, texts: list[str], rate: float, seconds: float, start_id: int,
          sent_s: dict[int, float]) -> int:
    """Produce ``rate`` records/s for ``seconds``, ids from ``start_id``; one producer for every phase (a new
    one's connection set-up would show as latency at the phase boundary)."""
    started, i = time.monotonic(), start_id
    while (elapsed := time.monotonic() - started) < seconds:
        while i - start_id < int(elapsed * rate):
            producer.produce(topic, json.dumps({"id": i, "text": texts[i % len(texts)]}).encode())
            sent_s[i] = time.time()
            i += 1
        producer.poll(0)
        time.sleep(0.002)
    return i


def read_outputs(bootstrap: str, topic: str, n: int, timeout_s: float) -> dict[int, tuple[float, str]]:
    """Input offset -> (output produce time in s, the model header) for the first ``n`` outputs."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("r"), "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    done: dict[int, tuple[float, str]] = {}
    deadline = time.monotonic() + timeout_s
    while len(done) < n and time.monotonic() < deadline:
        for m in consumer.consume(1000, 0.5):
            if m.error() is None:
                headers = dict(m.headers() or [])
                done[int(headers["sluice.source.offset"])] = (m.timestamp()[1] / 1000, headers[MODEL_HEADER].decode())
    consumer.close()
    return done


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"num": 0}
    s = sorted(values)
    return {"num": len(s), "p50_ms": 1000 * s[len(s) // 2], "p99_ms": 1000 * s[int(0.99 * (len(s) - 1))],
            "max_ms": 1000 * s[-1]}


def run(args: argparse.Namespace, bootstrap: str, scratch: Path) -> dict[str, Any]:
    v1, v2 = versions(args.engine, scratch, args.pause_ms / 1000)
    current = scratch / "current"
    current.symlink_to(v1)
    topic_in, topic_out = unique_topic("rl-in"), unique_topic("rl-out")
    for topic in (topic_in, topic_out, topic_out + ".dlq"):
        create_topic(bootstrap, topic, 1)  # one partition: input offset == send order
    loaded = parse_pipeline(pipeline(args.engine, bootstrap, topic_in, topic_out, current, args.threads,
                                     args.max_batch_size), base_dir=ROOT)
    observer = build_observer(loaded.pipeline)
    runner, _ = build_runner(loaded, observer=observer)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while observer.readiness() is not None:  # type: ignore[attr-defined]  # warmed up, partition assigned
        if time.monotonic() > deadline:
            raise SystemExit(f"the pipeline never became ready: {observer.readiness()}")  # type: ignore[attr-defined]
        time.sleep(0.1)
    texts = review_texts(2000)
    sent_s: dict[int, float] = {}
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    paced(producer, topic_in, texts, args.rate, args.warmup_s, 0, sent_s)  # caches, connections: not measured
    first = len(sent_s)
    n = paced(producer, topic_in, texts, args.rate, args.steady_s, first, sent_s)
    swapped_s = time.time()
    swap(current, v2)
    n = paced(producer, topic_in, texts, args.rate, args.after_s, n, sent_s)
    producer.flush(30)
    done = read_outputs(bootstrap, topic_out, n, timeout_s=120)
    runner.stop()
    thread.join(120)
    runner.engine.close()
    models = observer.stats.models.snapshot()  # type: ignore[attr-defined]
    labels = list(models.models)
    if len(labels) != 2:
        raise SystemExit(f"the reload did not happen: models served {labels}; reloads {models.reloads}")
    old, new = labels
    batch_ms = {label: 1000 * m.infer_s.total / max(1, m.infer_s.count) for label, m in models.models.items()}
    switch_s = min(t for t, model in done.values() if model == new)
    latency = {i: done[i][0] - sent_s[i] for i in range(first, n) if i in done}
    window = args.switch_window_s
    windows = {
        "steady": [v for i, v in latency.items() if sent_s[i] < swapped_s],
        "build": [v for i, v in latency.items() if swapped_s <= sent_s[i] < switch_s - window],
        "switch": [v for i, v in latency.items() if abs(sent_s[i] - switch_s) <= window],
        "after": [v for i, v in latency.items() if sent_s[i] > switch_s + window],
    }
    stats = {name: percentiles(values) for name, values in windows.items()}
    extra_ms = stats["switch"].get("p99_ms", 0.0) - stats["steady"].get("p99_ms", 0.0)
    return {"engine": args.engine, "rate_per_s": args.rate, "threads": args.threads, "old": old, "new": new,
            "num_sent": n - first, "num_lost": sum(1 for i in range(n) if i not in done),
            "swap_to_switch_s": switch_s - swapped_s, "batch_ms": batch_ms, "windows": stats,
            "switch_extra_p99_ms": extra_ms, "one_batch_ms": batch_ms[old],
            "within_one_batch": extra_ms <= batch_ms[old]}


def report(r: dict[str, Any]) -> str:
    lines = [f"engine {r['engine']}, {r['rate_per_s']:.0f} records/s offered, {r['num_sent']} measured, "
             f"{r['num_lost']} without output; swap -> switch {r['swap_to_switch_s']:.2f} s "
             f"({r['old']} -> {r['new']})", "",
             "| window | records | p50 ms | p99 ms | max ms |", "|---|---:|---:|---:|---:|"]
    for name, w in r["windows"].items():
        if w["num"]:
            lines.append(f"| {name} | {w['num']} | {w['p50_ms']:.1f} | {w['p99_ms']:.1f} | {w['max_ms']:.1f} |")
        else:
            lines.append(f"| {name} | 0 | - | - | - |")
    steady = r["windows"]["steady"]
    if steady["num"] and steady["p50_ms"] > 5 * r["one_batch_ms"]:
        lines += ["", f"WARNING: the steady p50 ({steady['p50_ms']:.0f} ms) is over 5 batches: the pipeline was "
                  "behind its input, and the windows compare backlogs; run again with a lower --rate"]
    lines += ["", f"mean engine time per batch: {r['one_batch_ms']:.1f} ms (old model), "
              f"{r['batch_ms'][r['new']]:.1f} ms (new); the switch window's p99 is "
              f"{r['switch_extra_p99_ms']:+.1f} ms from the steady p99: "
              + ("within one batch" if r["within_one_batch"] else "MORE than one batch")]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["python", "onnx"], default="python")
    parser.add_argument("--rate", type=float, default=None, help="records/s offered (python 400, onnx 60)")
    parser.add_argument("--pause-ms", type=float, default=20, help="python engine: its time per batch")
    parser.add_argument("--threads", type=int, default=2, help="onnx engine: intra-op threads")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--warmup-s", type=float, default=5)
    parser.add_argument("--steady-s", type=float, default=15)
    parser.add_argument("--after-s", type=float, default=20)
    parser.add_argument("--switch-window-s", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="python engine, short phases")
    parser.add_argument("--bootstrap", default=os.environ.get("SLUICE_KAFKA_BOOTSTRAP"))
    args = parser.parse_args()
    if args.quick:
        args.warmup_s, args.steady_s, args.after_s = 3, 8, 8
    args.rate = args.rate or (400 if args.engine == "python" else 60)
    os.chdir(ROOT)
    scratch = Path(tempfile.mkdtemp(prefix="sluice-bench-reload-"))
    try:
        with broker(args.bootstrap) as bootstrap:
            result = run(args, bootstrap, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = report(result)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.engine == "python" else f"_{args.engine}"
    (RESULTS / f"reload{suffix}.json").write_text(json.dumps(result, indent=2))
    (RESULTS / f"reload{suffix}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
