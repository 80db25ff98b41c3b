"""Embedding enrichment: raw engine throughput beside the whole topic-to-topic pipeline, same texts, one run.

    python bench/embed.py [--num-texts 2000] [--batch-sizes 8,32,64] [--bootstrap HOST:PORT]

Rows:

* raw engine, FIFO batches and length-aware batches (each window of 256 sorted by token count), no Kafka:
  only ``engine.infer`` is timed, tokenising is done beforehand (the operator overlaps it with inference);
* end to end: the same texts as JSON records on a 3-partition topic, ``sluice run`` with
  ``bucket_by: tokens`` and the same batch size, throughput measured on the output topic.

Targets (issue 3): end to end >= 0.9x the raw engine with the same batching; length-aware >= 1.2x FIFO at
batch 32. Prints a table; writes bench/results/embed.json and embed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, ROOT, broker, output_rate  # noqa: E402
from embed_engine import review_texts, time_batches  # noqa: E402

from sluice.config import parse_pipeline  # noqa: E402
from sluice.engines.engine_contract import EngineContext  # noqa: E402
from sluice.engines.onnx.onnx_engine import OnnxEngine, OnnxOptions  # noqa: E402
from sluice.model_store import fetch  # noqa: E402
from sluice.operator.build import build_runner  # noqa: E402
from tests.support.kafka import create_topic, produce, unique_topic  # noqa: E402


def end_to_end(bootstrap: str, topic_in: str, n: int, batch: int, threads: int) -> float:
    topic_out = unique_topic("bench-emb")
    create_topic(bootstrap, topic_out, 3)
    create_topic(bootstrap, topic_out + ".dlq", 1)
    text = f"""
source: {{kafka: {{bootstrap_servers: "{bootstrap}", topics: [{topic_in}], group_id: {unique_topic("g")}}}}}
batching: {{max_batch_size: {batch}, max_queue_delay_ms: 20, bucket_by: tokens}}
engine: {{type: onnx, model: minilm-l6, providers: [cpu], intra_op_num_threads: {threads}, inter_op_num_threads: 1}}
sink: {{kafka: {{topic: {topic_out}}}, output: {{field: embedding}}}}
dead_letter: {{topic: {topic_out}.dlq}}
runtime: {{drain_timeout_s: 600}}
"""
    runner, engine = build_runner(parse_pipeline(text, base_dir=ROOT), max_records=n)
    summary = runner.run()
    engine.close()
    if summary.error or summary.num_out != n:
        raise RuntimeError(f"pipeline run failed: {summary}")
    return output_rate(bootstrap, topic_out, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-texts", type=int, default=2000)
    parser.add_argument("--batch-sizes", default="8,32,64")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    parser.add_argument("--bootstrap", default=os.environ.get("SLUICE_KAFKA_BOOTSTRAP"))
    args = parser.parse_args()
    os.chdir(ROOT)
    model_dir = fetch("minilm-l6")
    texts = review_texts(args.num_texts)
    engine = OnnxEngine(OnnxOptions(model=str(model_dir), providers=["cpu"], intra_op_num_threads=args.threads,
                                    inter_op_num_threads=1), EngineContext(max_batch_size=64))
    engine.start()
    items = engine.prepare(texts)
    rows = []
    with broker(args.bootstrap) as bootstrap:
        topic_in = unique_topic("bench-reviews")
        create_topic(bootstrap, topic_in, 3)
        produce(bootstrap, topic_in, [(f"r{i}", json.dumps({"id": i, "text": t})) for i, t in enumerate(texts)])
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            print(f"batch {batch}: raw engine ...", file=sys.stderr)
            fifo = time_batches(engine, items, batch, "fifo").records_per_s
            aware = time_batches(engine, items, batch, "sorted").records_per_s
            print(f"batch {batch}: end to end ...", file=sys.stderr)
            started = time.monotonic()
            e2e = end_to_end(bootstrap, topic_in, len(texts), batch, args.threads)
            rows.append({"batch": batch, "raw_fifo": fifo, "raw_length_aware": aware, "end_to_end": e2e,
                         "aware_over_fifo": aware / fifo, "e2e_over_raw_aware": e2e / aware,
                         "e2e_wall_s": time.monotonic() - started})
    engine.close()
    lines = ["| batch | raw FIFO rec/s | raw length-aware rec/s | end-to-end rec/s | aware / FIFO | e2e / raw aware |",
             "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['batch']} | {r['raw_fifo']:.0f} | {r['raw_length_aware']:.0f} | {r['end_to_end']:.0f} "
              f"| {r['aware_over_fifo']:.2f} | {r['e2e_over_raw_aware']:.2f} |" for r in rows]
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "embed.json").write_text(json.dumps({"num_texts": len(texts), "rows": rows}, indent=2))
    (RESULTS / "embed.md").write_text(f"all-MiniLM-L6-v2, ONNX Runtime CPU ({args.threads} threads), "
                                      f"{len(texts)} review-like texts\n\n{table}\n")


if __name__ == "__main__":
    main()
