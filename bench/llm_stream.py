"""LLM enrichment topic to topic: continuous admission vs window-then-generate vs HF generate per window.

Same records, same broker, one run. The records (review-labelling prompts sharing one system prompt, each
with its own max_tokens 1..48, EOS ignored so every contender produces the same tokens) are all on the
input topic before each contender starts, so each runs at saturation:

* (a) ``continuous``: ``engine: {type: llm}`` -- each record joins the running batch as soon as there is
  room and leaves the moment its answer is complete;
* (b) ``window``: the same Sluice LLM engine behind the batcher: a window closed by max_batch_size /
  max_queue_delay_ms is generated to completion before the next window starts;
* (c) ``hf-window``: HF transformers ``generate`` per window (static padded batch, runs to the longest).

Throughput: output tokens / (last output - first record polled). Latency of a record: its output's
produce time - first record polled (all records were waiting at that moment).

    python bench/llm_stream.py [--records 64] [--window 8] [--threads 2]

Writes bench/results/llm_stream.json and .md. Target (issue 5): (a) >= 1.5x (b) with a lower p99.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, ROOT, broker, output_stamps  # noqa: E402
from llm import SYSTEM_PROMPT, build_workload  # noqa: E402

from sluice.config import parse_pipeline  # noqa: E402
from sluice.connectors.kafka import KafkaSink, KafkaSource  # noqa: E402
from sluice.engines.engine_contract import BatchEngine  # noqa: E402
from sluice.model_store import fetch  # noqa: E402
from sluice.operator.build import build_runner  # noqa: E402
from sluice.operator.observer import Observer  # noqa: E402
from sluice.operator.runner import Runner  # noqa: E402
from tests.support.kafka import create_topic, produce, unique_topic  # noqa: E402


class FirstPoll(Observer):
    """Remembers the wall-clock time the first records were polled."""

    def __init__(self) -> None:
        self.first_poll_ms: float | None = None

    def polled(self, records: Sequence[Any], now_s: float) -> None:
        if self.first_poll_ms is None and records:
            self.first_poll_ms = time.time() * 1000


class WindowLLM(BatchEngine):
    """(b): Sluice's LLM engine, one closed window at a time."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        from sluice.engines.llm import SamplingParams

        return [(self.llm.tokenizer.encode(_chat(self.llm, v["text"])),
                 SamplingParams(max_tokens=v["max_len"], ignore_eos=True)) for v in values]

    def infer(self, items: Sequence[Any]) -> list[Any]:
        outs = self.llm.generate([ids for ids, _ in items], [p for _, p in items])
        return [{"text": o.text, "num_tokens": len(o.token_ids)} for o in outs]


class HFWindow(BatchEngine):
    """(c): HF transformers ``generate`` per window: left-padded, runs until the longest max_tokens."""

    def __init__(self, gguf: Path, tokenizer_llm: Any, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                          dtype=torch.float32).eval()
        self.tok = tokenizer_llm

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        return [(self.tok.tokenizer.encode(_chat(self.tok, v["text"])), v["max_len"]) for v in values]

    def infer(self, items: Sequence[Any]) -> list[Any]:
        torch, pad = self.torch, 2
        width = max(len(ids) for ids, _ in items)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in items])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in items])
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(n for _, n in items),
                                      do_sample=False, eos_token_id=None, pad_token_id=pad)
        rows = out[:, width:].tolist()
        return [{"text": self.tok.tokenizer.decode(row[:n]), "num_tokens": n}
                for row, (_, n) in zip(rows, items, strict=True)]


def _chat(llm: Any, text: str) -> str:
    return str(llm.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]))


def pipeline_text(bootstrap: str, topic_in: str, topic_out: str, engine: str, window: int) -> str:
    return f"""
source: {{kafka: {{bootstrap_servers: "{bootstrap}", topics: [{topic_in}], group_id: {unique_topic("g")}}}}}
codec: {{format: json, input_field: "."}}
batching: {{max_batch_size: {window}, max_queue_delay_ms: 50}}
engine: {engine}
sink: {{kafka: {{topic: {topic_out}}}, output: {{field: answer}}}}
dead_letter: {{topic: {topic_out}.dlq}}
runtime: {{drain_timeout_s: 900}}
"""


def measure(bootstrap: str, runner: Runner, observer: FirstPoll, topic_out: str, n: int,
            num_tokens: int) -> dict[str, float]:
    summary = runner.run()
    if summary.error or summary.num_out != n:
        raise RuntimeError(f"run failed: {summary}")
    assert observer.first_poll_ms is not None
    lat_ms = sorted(s - observer.first_poll_ms for s in output_stamps(bootstrap, topic_out, n))
    span_s = max(lat_ms) / 1000
    return {"output_tokens_per_s": num_tokens / span_s, "p50_latency_s": lat_ms[len(lat_ms) // 2] / 1000,
            "p99_latency_s": lat_ms[min(len(lat_ms) - 1, int(len(lat_ms) * 0.99))] / 1000, "makespan_s": span_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=64)
    parser.add_argument("--window", type=int, default=8, help="max_batch_size of the windowed contenders")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--bootstrap", default=os.environ.get("SLUICE_KAFKA_BOOTSTRAP"))
    args = parser.parse_args()
    os.chdir(ROOT)
    model_dir = fetch("smollm2-135m")
    chats, max_tokens = build_workload(args.records)
    num_tokens = sum(max_tokens)
    rows: dict[str, dict[str, float]] = {}
    with broker(args.bootstrap) as bootstrap:
        topic_in = unique_topic("bench-llm-in")
        create_topic(bootstrap, topic_in, 2)
        produce(bootstrap, topic_in, [(str(i), json.dumps({"id": i, "text": chat[1]["content"], "max_len": m}))
                                      for i, (chat, m) in enumerate(zip(chats, max_tokens, strict=True))])
        from sluice.engines.llm import LLM

        llm = LLM(str(model_dir), max_num_seqs=64, max_num_batched_tokens=1024, num_threads=args.threads)
        contenders = ["continuous", "window"] + ([] if args.skip_hf else ["hf-window"])
        for name in contenders:
            topic_out = unique_topic("bench-llm-out")
            create_topic(bootstrap, topic_out, 2)
            create_topic(bootstrap, topic_out + ".dlq", 1)
            observer = FirstPoll()
            print(f"running {name} ...", file=sys.stderr)
            if name == "continuous":
                engine_yaml = (f"{{type: llm, model: '{model_dir}', system_prompt: {json.dumps(SYSTEM_PROMPT)}, "
                               "max_num_seqs: 64, max_num_batched_tokens: 1024, "
                               f"num_threads: {args.threads}, ignore_eos: true, overrides: {{max_tokens: max_len}}}}")
                loaded = parse_pipeline(pipeline_text(bootstrap, topic_in, topic_out, engine_yaml, args.window),
                                        base_dir=ROOT)
                runner, engine = build_runner(loaded, observer=observer, max_records=args.records)
            else:
                loaded = parse_pipeline(pipeline_text(bootstrap, topic_in, topic_out,
                                                      "{type: python, function: 'x:y'}", args.window), base_dir=ROOT)
                p = loaded.pipeline
                engine = WindowLLM(llm) if name == "window" else HFWindow(
                    next(iter(sorted(Path(model_dir).glob("*.gguf")))), llm, args.threads)
                runner = Runner(loaded, KafkaSource(p.source.kafka, 1000), KafkaSink(bootstrap, p.sink.kafka),
                                engine, observer=observer, max_records=args.records)
            rows[name] = measure(bootstrap, runner, observer, topic_out, args.records, num_tokens)
            engine.close()
    base = rows["window"]["output_tokens_per_s"]
    lines = ["| contender | output tokens/s | vs window | p50 latency s | p99 latency s |", "|---|---:|---:|---:|---:|"]
    for name, r in rows.items():
        r["ratio_vs_window"] = r["output_tokens_per_s"] / base
        lines.append(f"| {name} | {r['output_tokens_per_s']:.1f} | {r['ratio_vs_window']:.2f} "
                     f"| {r['p50_latency_s']:.1f} | {r['p99_latency_s']:.1f} |")
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "llm_stream.json").write_text(json.dumps({"records": args.records, "window": args.window,
                                                         "output_tokens": num_tokens, "rows": rows}, indent=2))
    (RESULTS / "llm_stream.md").write_text(
        f"SmolLM2-135M on CPU ({args.threads} threads), {args.records} records, max_tokens 1..48 "
        f"({num_tokens} output tokens), window {args.window}\n\n{table}\n")


if __name__ == "__main__":
    main()
