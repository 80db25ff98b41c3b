"""What flushing denormal floats to zero buys the ONNX embedding engine: ``flush_denormals`` on and off, float32
and ``quantize: int8``, side by side in one run.

    .venv/bin/python bench/denormals.py [--num-texts 1024] [--budget-s 8] [--batch-sizes 1,32]

Each of the four engines runs on a thread of its own (a thread keeps its floating-point mode, and a new one
inherits its creator's), and they take turns window by window on the same length-sorted review-like batches
(:func:`bench.embed_engine.time_interleaved`), so the ratios come from the same records in the same seconds.
Prints a table and writes ``bench/results/denormals.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from embed_engine import review_texts, time_interleaved, write_result  # noqa: E402


class OnItsThread:
    """An engine whose every call runs on one thread of its own, made before any flushing happens."""

    def __init__(self, build: Any) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1)
        self.engine = self._thread.submit(build).result()

    def infer(self, items: list[Any]) -> list[Any]:
        return self._thread.submit(self.engine.infer, items).result()

    def item_length(self, item: Any) -> int:
        return int(self.engine.item_length(item))

    def close(self) -> None:
        self._thread.submit(self.engine.close).result()
        self._thread.shutdown()


def _build(quantize: str, flush: bool, threads: int) -> Any:
    from sluice.engines.engine_contract import EngineContext
    from sluice.engines.onnx.onnx_engine import ENGINE_TYPE, OnnxOptions

    options = OnnxOptions(model="minilm-l6", providers=["cpu"], intra_op_num_threads=threads,
                          inter_op_num_threads=1, quantize=quantize, flush_denormals=flush)
    engine = ENGINE_TYPE.factory(options, EngineContext(max_batch_size=64))
    engine.start()
    return engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-texts", type=int, default=1024)
    parser.add_argument("--batch-sizes", default="1,32")
    parser.add_argument("--budget-s", type=float, default=8.0, help="time budget per engine and batch size")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "denormals.json")
    args = parser.parse_args(argv)

    from sluice.model_store import fetch

    fetch("minilm-l6")
    configs = {f"{q}/{'flush' if f else 'keep'}": (q, f) for q in ("none", "int8") for f in (True, False)}
    engines = {name: OnItsThread(lambda q=q, f=f: _build(q, f, args.threads)) for name, (q, f) in configs.items()}
    first = next(iter(engines.values())).engine
    items = [first.prepare([text])[0] for text in review_texts(args.num_texts)]
    rows = []
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        measured = time_interleaved(engines, items, batch_size, "sorted", budget_s=args.budget_s)
        for name, (quantize, flush) in configs.items():
            m = measured[name]
            keep = measured[f"{quantize}/keep"]
            rows.append({"quantize": quantize, "flush_denormals": flush, "batch_size": batch_size,
                         "records_per_s": m.records_per_s, "num_records": m.num_records,
                         "vs_keep": m.records_per_s / keep.records_per_s,
                         "vs_float32_same_flush": m.records_per_s / measured[f"none/{name.split('/')[1]}"].records_per_s})
    print(f"{'quantize':>8}  {'flush':>5}  {'batch':>5}  {'records/s':>9}  {'vs keep':>7}  {'vs float32':>10}")
    for r in rows:
        print(f"{r['quantize']:>8}  {str(r['flush_denormals']).lower():>5}  {r['batch_size']:>5}  "
              f"{r['records_per_s']:>9.1f}  {r['vs_keep']:>6.2f}x  {r['vs_float32_same_flush']:>9.2f}x")
    result = {"bench": "denormals", "model": "minilm-l6", "num_texts": args.num_texts, "order": "sorted",
              "budget_s": args.budget_s, "intra_op_num_threads": args.threads,
              "machine": {"cpu_count": os.cpu_count(), "load_average_1m": os.getloadavg()[0]}, "rows": rows}
    write_result(args.out, result)
    for engine in engines.values():
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
