"""MiniLM embedding throughput of this checkout against another revision, in the same run, interleaved.

    .venv/bin/python bench/embed_baseline.py --baseline HEAD~1 [--repeats 3] [--min-ratio 0.97] \\
        [--num-texts 512 --batch-sizes 1,8,32,64 --budget-s 4 --threads 2]

The baseline's ``sluice`` package is taken out of git (``git archive REV sluice``) into a temporary folder;
nothing in the checkout changes. Each repeat runs this checkout's ``bench/embed_engine.py`` twice in child
processes -- once importing the baseline's ``sluice``, once this checkout's, the order alternating from
repeat to repeat so a drifting machine favours neither -- with the same texts, model and settings. Per row
(batch size, FIFO / length-sorted order) the ratio is median(this) / median(baseline) records/s.

Prints a table, writes ``bench/results/embed_baseline.json``; exits 1 when a ratio is under
``--min-ratio``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "embed_engine.py"


def extract(revision: str, into: Path) -> Path:
    """The ``sluice`` package of ``revision`` under ``into``; SystemExit naming a revision git lacks."""
    archive = into / "baseline.tar"
    proc = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), revision,
                           "sluice"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"embed_baseline: cannot read {revision!r} from git: {proc.stderr.strip()}")
    root = into / "baseline"
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return root


def measure(sluice_root: Path, bench_args: list[str], out: Path) -> dict[tuple[int, str], float]:
    """One run of embed_engine.py importing ``sluice`` from ``sluice_root``: (batch size, order) -> records/s."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(sluice_root), str(ROOT)])}
    proc = subprocess.run([sys.executable, str(SCRIPT), *bench_args, "--out", str(out)], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"embed_baseline: the run with {sluice_root} failed:\n{proc.stderr[-2000:]}")
    rows = json.loads(out.read_text())["rows"]
    return {(row["batch_size"], order): row[order]["records_per_s"] for row in rows for order in ("fifo", "sorted")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against (e.g. HEAD~1, main)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, interleaved")
    parser.add_argument("--min-ratio", type=float, default=0.97)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "embed_baseline.json")
    args, bench_args = parser.parse_known_args(argv)
    if not any(arg.startswith("--quantize") for arg in bench_args):
        bench_args += ["--quantize", "none"]  # float32 only: older revisions have no quantize option

    with tempfile.TemporaryDirectory(prefix="sluice-embed-baseline-") as tmp:
        sides = {"baseline": extract(args.baseline, Path(tmp)), "this": ROOT}
        runs: dict[str, list[dict[tuple[int, str], float]]] = {"baseline": [], "this": []}
        for repeat in range(args.repeats):
            order = ["baseline", "this"] if repeat % 2 == 0 else ["this", "baseline"]
            for side in order:
                print(f"embed_baseline: repeat {repeat + 1}/{args.repeats}: {side}", file=sys.stderr, flush=True)
                runs[side].append(measure(sides[side], bench_args, Path(tmp) / f"{side}-{repeat}.json"))

    rows: list[dict[str, Any]] = []
    for key in sorted(runs["this"][0]):
        old = statistics.median(run[key] for run in runs["baseline"])
        new = statistics.median(run[key] for run in runs["this"])
        rows.append({"batch_size": key[0], "order": key[1], "baseline_records_per_s": old,
                     "this_records_per_s": new, "ratio": new / old})
    print(f"{'batch':>5}  {'order':>6}  {args.baseline + ' rec/s':>16}  {'this rec/s':>10}  {'ratio':>6}")
    for row in rows:
        print(f"{row['batch_size']:>5}  {row['order']:>6}  {row['baseline_records_per_s']:>16.1f}  "
              f"{row['this_records_per_s']:>10.1f}  {row['ratio']:>6.3f}")
    worst = min(row["ratio"] for row in rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"bench": "embed_baseline", "baseline": args.baseline, "repeats": args.repeats,
                                    "bench_args": bench_args, "load_average_1m": os.getloadavg()[0],
                                    "worst_ratio": worst, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"worst ratio {worst:.3f} (minimum {args.min_ratio}); wrote {args.out}", file=sys.stderr)
    return 0 if worst >= args.min_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
