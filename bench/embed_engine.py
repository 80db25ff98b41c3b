"""Raw throughput of the ONNX embedding engine (no Kafka): FIFO batches vs length-sorted batches, float32
and ``quantize: int8`` side by side.

    .venv/bin/python bench/embed_engine.py [--num-texts 2000] [--budget-s 14] [--threads 2] [--quantize none,int8]

For each batch size (1, 8, 32, 64) the same pre-tokenised review-like texts run through ``engine.infer``
in two orders:

* **fifo** -- arrival order, cut into batches: each batch is padded to its longest text.
* **sorted** -- each window of ``--window`` (256) arrivals sorted by token count, then cut into batches:
  what ``bucket_by: tokens`` does in the operator, so batches pad little.

Only ``infer`` is timed (tokenising runs on the operator's intake thread, overlapped). Each configuration
runs whole windows until its time budget is spent, so the script stays under ~3 minutes on 2 cores per
``--quantize`` mode; the modes take turns window by window (:func:`time_interleaved`), so they run the same
records in the same seconds and their ratio comes from one run and one workload. With
both modes, the int8 engine's cosine to the float32 vectors on 200 varied texts (``tests/support/texts.py``,
batches of 32 in arrival order) is reported too.
Prints a table and writes ``bench/results/embed_engine.json``.

Importable pieces for the end-to-end bench: :func:`review_texts`, :func:`cut_batches`,
:func:`time_batches`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

Policy = Literal["fifo", "sorted"]

_OPENERS = ["I bought this", "Got this for my son", "Ordered two of these", "This is my second one",
            "Picked this up on sale", "We have used it daily", "Replaced my old one with this"]
_PHRASES = ["it works exactly as described", "the battery lasts all day", "shipping took far too long",
            "the screen is bright and sharp", "it stopped working after a week", "customer service was helpful",
            "the build quality feels cheap", "setup took five minutes", "the price is hard to beat",
            "it is heavier than it looks", "the instructions were confusing", "my kids love it",
            "the colour is not what the photo shows", "it arrived scratched", "the sound is surprisingly good",
            "I would buy it again", "the app keeps crashing", "it fits perfectly", "returned it for a refund",
            "très bon produit", "the strap broke 😡", "five stars 👍", "charging is slow over USB-C"]
_CLOSERS = ["Recommended.", "Disappointing.", "Happy.", "Avoid.", "Great!", "Meh.", "5/5", "2/5"]


def review_texts(num_texts: int = 2000, seed: int = 0, min_words: int = 5, max_words: int = 300) -> list[str]:
    """Deterministic review-like texts, ``min_words``..``max_words`` words, skewed short (log-normal lengths).

    Median ~25 words, a long tail up to ``max_words``, like product reviews.
    """
    rng = random.Random(seed)
    texts = []
    for _ in range(num_texts):
        target_words = int(min(max_words, max(min_words, round(rng.lognormvariate(math.log(25), 0.9)))))
        words = rng.choice(_OPENERS).split()
        while len(words) < target_words:
            words += (rng.choice(_PHRASES) + rng.choice([",", ".", " and", "; also", "!"])).split()
        words = words[: target_words - 1] + [rng.choice(_CLOSERS)]
        texts.append(" ".join(words))
    return texts


def cut_batches(lengths: Sequence[int], batch_size: int, policy: Policy, window: int = 256) -> list[list[int]]:
    """Indices of items grouped into batches, window by window (every batch lies inside one window).

    ``fifo`` keeps arrival order; ``sorted`` sorts each window by length first (stable, so ties keep order).
    """
    batches = []
    for start in range(0, len(lengths), window):
        indices = list(range(start, min(start + window, len(lengths))))
        if policy == "sorted":
            indices.sort(key=lambda i: lengths[i])
        batches += [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
    return batches


@dataclass(frozen=True)
class Measurement:
    policy: str
    batch_size: int
    num_records: int
    elapsed_s: float
    records_per_s: float
    num_real_tokens: int
    num_padded_tokens: int  # batch size x longest item, summed: what the model really computes


def time_batches(engine: Any, items: Sequence[Any], batch_size: int, policy: Policy, *, window: int = 256,
                 budget_s: float = math.inf, min_windows: int = 1) -> Measurement:
    """Run ``engine.infer`` over ``items`` in the given batch order; stop at a window boundary past ``budget_s``
    (and past ``min_windows`` windows)."""
    return time_interleaved({"": engine}, items, batch_size, policy, window=window, budget_s=budget_s,
                            min_windows=min_windows)[""]  # fmt: skip


def time_interleaved(engines: dict[str, Any], items: Sequence[Any], batch_size: int, policy: Policy, *,
                     window: int = 256, budget_s: float = math.inf, min_windows: int = 1) -> dict[str, Measurement]:
    """:func:`time_batches` for several engines at once, window by window in turn: every engine runs the same
    records in the same seconds, so a slow spell of a shared machine falls on all of them alike. Stops at a
    window boundary once the engines have spent ``budget_s`` each on average (after ``min_windows``)."""
    lengths = [next(iter(engines.values())).item_length(item) for item in items]
    batches = cut_batches(lengths, batch_size, policy, window)
    per_window = math.ceil(window / batch_size)
    spent = dict.fromkeys(engines, 0.0)
    num_records = num_real = num_padded = 0
    for done, start in enumerate(range(0, len(batches), per_window), start=1):
        group = batches[start : start + per_window]
        for mode, engine in engines.items():
            began = time.perf_counter()
            for batch in group:
                engine.infer([items[i] for i in batch])
            spent[mode] += time.perf_counter() - began
        num_records += sum(len(b) for b in group)
        num_real += sum(lengths[i] for b in group for i in b)
        num_padded += sum(len(b) * max(lengths[i] for i in b) for b in group)
        if done >= min_windows and sum(spent.values()) > budget_s * len(engines):
            break
    return {mode: Measurement(policy, batch_size, num_records, s, num_records / s, num_real, num_padded)
            for mode, s in spent.items()}  # fmt: skip


def _build_engine(model: str, threads: int, quantize: str = "none") -> Any:
    from sluice.engines.engine_contract import EngineContext
    from sluice.engines.onnx.onnx_engine import ENGINE_TYPE, OnnxOptions

    # quantize only when asked: bench/embed_baseline.py runs this script against revisions without it
    extra = {} if quantize == "none" else {"quantize": quantize}
    options = OnnxOptions(model=model, providers=["cuda", "cpu"], intra_op_num_threads=threads,
                          inter_op_num_threads=1, **extra)
    engine = ENGINE_TYPE.factory(options, EngineContext(max_batch_size=64))
    engine.start()
    return engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm-l6", help="known model name or path (default minilm-l6)")
    parser.add_argument("--num-texts", type=int, default=2000)
    parser.add_argument("--batch-sizes", default="1,8,32,64")
    parser.add_argument("--window", type=int, default=256, help="sorting window of the length-aware order")
    parser.add_argument("--budget-s", type=float, default=12.0, help="time budget per configuration")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    parser.add_argument("--quantize", default="none,int8", help="engine quantize modes to compare")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "embed_engine.json")
    args = parser.parse_args(argv)

    from sluice.model_store import fetch

    if args.model == "minilm-l6":
        fetch("minilm-l6")
    modes = args.quantize.split(",")
    engines = {mode: _build_engine(args.model, args.threads, mode) for mode in modes}
    engine = engines[modes[0]]  # every mode tokenises alike: its items feed them all
    texts = review_texts(args.num_texts)
    tokenize_start_s = time.perf_counter()
    items = [engine.prepare([text])[0] for text in texts]  # one record at a time, as the operator does
    tokenize_s = time.perf_counter() - tokenize_start_s
    lengths = sorted(engine.item_length(item) for item in items)
    print(f"{len(texts)} texts, tokens per text: median {lengths[len(lengths) // 2]}, "
          f"p90 {lengths[int(len(lengths) * 0.9)]}, max {lengths[-1]}; tokenised at "
          f"{len(texts) / tokenize_s:.0f} records/s; providers {engine.providers_used}", file=sys.stderr)

    rows = []
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        fifos = time_interleaved(engines, items, batch_size, "fifo", window=args.window, budget_s=args.budget_s)
        # At batch 1 both orders run the very same batches; measure once.
        sorts = fifos if batch_size == 1 else time_interleaved(engines, items, batch_size, "sorted",
                                                               window=args.window, budget_s=args.budget_s)
        for mode in engines:
            fifo, ordered = fifos[mode], sorts[mode]
            rows.append({"quantize": mode, "batch_size": batch_size, "fifo": asdict(fifo), "sorted": asdict(ordered),
                         "ratio_sorted_over_fifo": ordered.records_per_s / fifo.records_per_s})  # fmt: skip
    base = {r["batch_size"]: r for r in rows if r["quantize"] == modes[0]}
    for row in rows:
        first = base[row["batch_size"]]
        row[f"sorted_vs_{modes[0]}"] = row["sorted"]["records_per_s"] / first["sorted"]["records_per_s"]
        row[f"fifo_vs_{modes[0]}"] = row["fifo"]["records_per_s"] / first["fifo"]["records_per_s"]

    print(f"{'quantize':>8}  {'batch':>5}  {'fifo rec/s':>10}  {'sorted rec/s':>12}  {'sorted/fifo':>11}  "
          f"{'fifo pad eff':>12}  {'sorted pad eff':>14}  {'sorted vs ' + modes[0]:>16}")
    for row in rows:
        fifo_row, sorted_row = row["fifo"], row["sorted"]
        print(f"{row['quantize']:>8}  {row['batch_size']:>5}  {fifo_row['records_per_s']:>10.1f}  "
              f"{sorted_row['records_per_s']:>12.1f}  {row['ratio_sorted_over_fifo']:>10.2f}x  "
              f"{fifo_row['num_real_tokens'] / fifo_row['num_padded_tokens']:>12.0%}  "
              f"{sorted_row['num_real_tokens'] / sorted_row['num_padded_tokens']:>14.0%}  "
              f"{row[f'sorted_vs_{modes[0]}']:>15.2f}x")
    agreement = _agreement(engines) if "none" in engines and "int8" in engines else None
    if agreement is not None:
        print(f"int8 vs float32 cosine on 200 varied texts: min {agreement['min']:.4f}, mean {agreement['mean']:.4f}; "
              f"logged at start on the probe texts: {engines['int8'].int8_agreement}")

    import onnxruntime

    result = {
        "bench": "embed_engine", "model": args.model, "num_texts": len(texts), "window": args.window,
        "budget_s_per_config": args.budget_s, "intra_op_num_threads": args.threads,
        "providers": engine.providers_used, "onnxruntime": onnxruntime.__version__, "quantize": modes,
        "int8_cosine_to_float32": agreement,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "load_average_1m": os.getloadavg()[0]},
        "tokens_per_text": {"median": lengths[len(lengths) // 2], "p90": lengths[int(len(lengths) * 0.9)],
                            "max": lengths[-1]},
        "tokenize_records_per_s": len(texts) / tokenize_s,
        "rows": rows,
    }
    write_result(args.out, result)
    for eng in engines.values():
        eng.close()
    return 0


def write_result(path: Path, result: dict[str, Any]) -> None:
    """The benchmark's JSON, and where it went (stderr)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


def _agreement(engines: dict[str, Any]) -> dict[str, float]:
    """Cosine of the int8 engine's vectors to the float32 engine's on 200 varied texts (batches of 32)."""
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.texts import varied_texts

    texts = varied_texts(200)
    vectors = {}
    for mode in ("none", "int8"):
        items = engines[mode].prepare(texts)
        vectors[mode] = np.asarray([v for i in range(0, 200, 32) for v in engines[mode].infer(items[i : i + 32])])
    cosines = (vectors["none"] * vectors["int8"]).sum(axis=1)
    return {"min": float(cosines.min()), "mean": float(cosines.mean())}


if __name__ == "__main__":
    sys.exit(main())
