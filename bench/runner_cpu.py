"""The operator's own CPU per record, without a broker: the real runner over records in memory, beside
another commit of Sluice in the same run.

A Kafka benchmark (``bench/operator_overhead.py``) spends most of this machine's two cores in the broker and
librdkafka, and moves by tens of percent from one run to the next; this one runs the runner -- intake,
ledger, batcher, engine thread, emitter, delivery -- over the in-memory source and sink that the operator
tests use (``tests/operator/memory.py``), with a no-op engine, so a change to the record path shows in
microseconds of CPU per record. Each run is its own process; the two commits alternate, round by round.

    .venv/bin/python bench/runner_cpu.py --baseline-ref HEAD~1 [--records 60000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from baseline import baseline_checkout, import_sluice_from  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def child(root: str, num_records: int, batch_size: int) -> dict[str, float]:
    """One run with Sluice imported from ``root``: CPU and wall microseconds per record."""
    import_sluice_from(root)
    os.chdir(root)
    try:
        from sluice.engines.engine_contract import BatchEngine
    except ImportError:  # a commit from before the engine contract's rename
        from sluice.engines.base import BatchEngine  # type: ignore[no-redef]
    from tests.operator.memory import pipeline, run

    class Noop(BatchEngine):  # type: ignore[misc]
        def infer(self, items: list[object]) -> list[object]:
            return list(items)

    records = [(json.dumps({"text": f"t{i}"}).encode(), f"k{i}".encode(), []) for i in range(num_records)]
    loaded = pipeline(extra=f"batching: {{max_batch_size: {batch_size}, max_queue_delay_ms: 1}}\n")
    wall, cpu = time.perf_counter(), time.process_time()
    summary, _, _ = run(records, Noop(), loaded)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if summary.num_out != num_records:
        raise RuntimeError(f"{summary.num_out} outputs for {num_records} records")
    return {"cpu_us": cpu / num_records * 1e6, "wall_us": wall / num_records * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-ref", required=True, help="the commit to compare against (a git ref)")
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5, help="rounds; each runs both commits, alternating order")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.records, args.batch_size)))
        return
    sides = {"this checkout": str(ROOT), f"@{args.baseline_ref}": baseline_checkout(args.baseline_ref)}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for round_ in range(args.repeats):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for name in order:
            out = subprocess.run([sys.executable, __file__, "--baseline-ref", args.baseline_ref, "--child", sides[name],
                                  "--records", str(args.records), "--batch-size", str(args.batch_size)],
                                 check=True, capture_output=True, text=True).stdout  # fmt: skip
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
            print(f"round {round_ + 1}  {name:<20}{runs[name][-1]['cpu_us']:6.2f} µs CPU / record", flush=True)
    base = f"@{args.baseline_ref}"
    ratios = [h["cpu_us"] / b["cpu_us"] for h, b in zip(runs["this checkout"], runs[base], strict=True)]
    rows = [f"| {name} | {statistics.median(r['cpu_us'] for r in runs[name]):.2f} | "
            f"{statistics.median(r['wall_us'] for r in runs[name]):.2f} |" for name in sides]
    table = "\n".join(["| Sluice | CPU µs / record (median) | wall µs / record (median) |", "|---|---:|---:|", *rows])
    summary = (f"this checkout / {base}, CPU per record, per round: {', '.join(f'{r:.2f}x' for r in ratios)}; "
               f"median {statistics.median(ratios):.2f}x")
    command = " ".join(["python", "bench/runner_cpu.py", *sys.argv[1:]])
    facts = f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end"
    text = (f"{args.records:,} JSON records through the runner in memory, a no-op engine, batches of "
            f"{args.batch_size}; {facts}\n\n`{command}`\n\n{table}\n\n{summary}\n")
    print("\n" + text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "runner_cpu.md").write_text(text)
    (RESULTS / "runner_cpu.json").write_text(json.dumps({"command": command, "runs": runs, "ratios": ratios},
                                                        indent=2))


if __name__ == "__main__":
    main()
